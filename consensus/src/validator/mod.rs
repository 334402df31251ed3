//! One validator's Simplex state machine (see the crate docs for the rules, cited as `R1`…).
//!
//! Sans-IO, quinn-proto style: feed it [`Validator::handle_message`],
//! [`Validator::handle_timeout`] and [`Validator::submit_event`] with the caller's `now`, then
//! drain [`Validator::poll_output`] and arm a timer for [`Validator::poll_timeout`]. Before
//! sending the outputs of a step, a crash-safe caller writes [`Validator::persist`] durably.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

mod auth;
mod compact;
mod config;
mod intake;
mod leaders;
mod persist;
mod roots;
mod simplex;
mod store;

use crate::pool::{Batch, Pool, Source};
use crate::types::{
    Block, Certificate, Digest, EventBytes, Logged, Mac, Message, Micros, Opener, Parent, Piece, RootReport, Signed,
    Tick, ValidatorIndex, View, Vote, VoteKind, event_ids, pair_key,
};
use compact::{Incomplete, Prepared, Spare};
use leaders::Leaders;
use store::{Blocks, Stored};

pub use config::{Anchor, Config};

/// A committed tick, ready to execute: a committed block, or one of the empty ticks of its span
/// before its own (`filler`: the block's header with no events, the tick and a BFT time of its
/// own, [`span_seed`]; the digest and certificates are the block's).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Commit {
    pub block: Block,
    pub filler: bool,
    pub digest: Digest,
    /// The block's notarization as embedded in its committed child: unique in the chain.
    pub certificate: Certificate,
    /// The seed of the tick's canonical order: blake3(digest ‖ certificate hash).
    pub seed: Digest,
    /// The finalization of the block (or of a descendant) that committed it.
    pub finalization: Certificate,
    /// The empty block that opened the tick, when `block` fills it (R1 fills; `None` for a
    /// filler): committed with it, its tick handed out once, as `block`'s.
    pub opener: Option<Opener>,
}

/// Proof that a validator signed two conflicting votes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Evidence {
    pub first: Vote,
    pub second: Vote,
}

/// What the caller must do.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Output {
    Broadcast(Message),
    Send(ValidatorIndex, Message),
    Committed(Box<Commit>),
    /// A block was finalized (its commit is handed out once its child is committed too).
    Finalized {
        view: View,
        digest: Digest,
    },
    /// A peer's state root for a tick differs from ours: we or they diverged.
    RootMismatch {
        tick: Tick,
        mine: Digest,
        theirs: Digest,
        validator: ValidatorIndex,
    },
    Evidence(Box<Evidence>),
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ViewState {
    proposal: Option<Digest>,
    notarize: BTreeMap<Digest, BTreeMap<ValidatorIndex, Vote>>,
    nullify: BTreeMap<ValidatorIndex, Vote>,
    finalize: BTreeMap<Digest, BTreeMap<ValidatorIndex, Vote>>,
    /// First vote of each kind per signer, for equivocation evidence.
    first: BTreeMap<(VoteKind, ValidatorIndex), Vote>,
    my_notarize: Option<Vote>,
    my_nullify: Option<Vote>,
    my_finalize: Option<Vote>,
    proposed: bool,
}

impl ViewState {
    /// The tally a vote of `kind` for `digest` counts in.
    fn tally_mut(&mut self, kind: VoteKind, digest: Digest) -> &mut BTreeMap<ValidatorIndex, Vote> {
        match kind {
            VoteKind::Notarize => self.notarize.entry(digest).or_default(),
            VoteKind::Nullify => &mut self.nullify,
            VoteKind::Finalize => self.finalize.entry(digest).or_default(),
        }
    }
}

/// A validator's own notarize, nullify and finalize votes in one view.
type MyVotes = (Option<Vote>, Option<Vote>, Option<Vote>);

/// What survives a crash: every vote cast (so none is ever cast differently) and the chain.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Persisted {
    view: View,
    votes: BTreeMap<View, MyVotes>,
    tip: (View, Digest),
    output_tick: Option<Tick>,
    blocks: Vec<Block>,
    notarized: Vec<Certificate>,
    nullified: Vec<Certificate>,
    finalized: Vec<Certificate>,
}

/// Why a proposal was not voted for.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum ProposalError {
    #[error("not from the leader of its view")]
    WrongLeader,
    #[error("the leader's vote does not match or does not verify")]
    BadVote,
    #[error("parent is not notarized, or a view between parent and block is not nullified")]
    BadParent,
    #[error("parent block not known yet")]
    UnknownParent,
    #[error(
        "tick {got} does not follow the parent's ({expected} is the first it may be) within the span its BFT time allows"
    )]
    BadTick { expected: Tick, got: Tick },
    #[error("BFT time {got} ms is not after the parent's {parent} ms or is more than the drift ahead of {now} ms")]
    BadTime { got: u64, parent: u64, now: u64 },
    #[error("batch over its limits or with duplicate events")]
    BadBatch,
    #[error("tick {0} is beyond this epoch's last tick")]
    BeyondEpoch(Tick),
}

/// A validator.
#[derive(Debug)]
pub struct Validator {
    cfg: Config,
    key: SigningKey,
    /// This validator's index; `None`: an observer (follows and commits, never votes).
    me: Option<ValidatorIndex>,
    keys: Vec<VerifyingKey>,
    quorum: usize,
    genesis: Digest,
    /// The anchor block's digest (an epoch after the first), computed once.
    anchor_digest: Option<Digest>,
    /// Committed blocks' events the pool has yet to forget: done with the held bulk work (at
    /// the next input, or once the view in flight is finalized) rather than before the commit
    /// is output (it costs ~0.3 ms for 1,000 events).
    settle_later: Vec<(Tick, Digest, std::sync::Arc<Vec<Digest>>)>,
    /// Bulk work held back while a view of this validator's is in flight (see [`Validator::busy`]):
    /// peers' gossiped events and clients' events, pooled in arrival order at `bulk_due`.
    bulk: Vec<Bulk>,
    /// The events in `bulk`.
    bulk_events: usize,
    /// When the held bulk work (and the pool's settling) is done: soon after the view in
    /// flight is finalized, and at the latest [`Validator::max_hold`] after it was first held.
    bulk_due: Option<Micros>,
    /// When this validator last learned of a finalization (see `schedule_bulk`).
    finalized_at: Micros,
    /// Work for a view this validator voted in, done as soon as its vote has gone out (at the
    /// next timer, due at once), while it waits for the others': its finalize vote signed
    /// ahead, and the leader's vote's signature checked, which a notarization needs before it
    /// is finalized on (`Validator::work_ahead`).
    ahead: Option<(Micros, View, Digest)>,
    /// This validator's finalize vote signed ahead (taken by `sign` if it is the one wanted).
    presigned: Option<Vote>,
    view: View,
    view_started: Micros,
    /// Patience: the view timeouts are `1 + patience` times the configured ones. Raised each
    /// time a view is nullified with more than f views since the last finalized one (so at
    /// least one honest leader's view failed too: the quorum is slower than the timeouts
    /// assume), lowered after [`CALM_VIEWS`] finalized views in a row.
    patience: u64,
    /// Views finalized since patience last changed.
    calm: u64,
    /// This validator's schedule of ticks: a tick and the time it was due (see `due`).
    schedule: Option<(Tick, Micros)>,
    /// How long notarizations take here after their blocks' BFT times, recently (smoothed):
    /// whether a fill would come in time (R1 fills).
    round_us: Micros,
    /// The view in which this leader found no events to fill its parent's tick with (it
    /// proposes the next tick's block when due instead).
    no_fill: Option<View>,
    views: BTreeMap<View, ViewState>,
    blocks: Blocks,
    notarized: BTreeMap<View, Certificate>,
    nullified: BTreeMap<View, Certificate>,
    finalized: BTreeMap<View, Certificate>,
    /// The highest finalized block.
    tip: (View, Digest),
    /// The tick of the last block output as committed.
    output_tick: Option<Tick>,
    /// A joining node outputs no commits until it has the state they apply to.
    held: bool,
    buffered: BTreeMap<View, (Block, Vote, Vec<Certificate>)>,
    /// Compact proposals with events missing from the pool, by digest: taken up when the
    /// missing gossip arrives, or else their block is fetched. Bounded by `INCOMPLETE_MAX`.
    incomplete: BTreeMap<Digest, Incomplete>,
    /// Peers that had to fetch a recent compact proposal (their pool missed an event: lost
    /// gossip, or an observer that gets none), and the view until which they are also sent
    /// full proposals.
    full_for: BTreeMap<ValidatorIndex, View>,
    /// Blocks asked for (or to ask for): digest -> when to ask (again). A block notarized
    /// before its proposal arrived is asked for only a little later (see `fetch_soon`).
    fetching: BTreeMap<Digest, Micros>,
    /// Votes that arrived after their (view, kind, digest) was certified here, not yet verified:
    /// they only carry root reports and evidence, so they are checked off the commit's path, at
    /// `late_due` (or at once when [`LATE_MAX`] are waiting).
    late: Vec<Vote>,
    late_due: Option<Micros>,
    /// Pairwise keys for vote authenticators, by validator index (empty: an observer, or
    /// `vote_macs` off).
    mac_keys: Vec<[u8; 32]>,
    /// Votes counted on their authenticator whose signatures are not checked yet, by (view,
    /// kind, signer): checked at `unchecked_due`, before any certificate holding them leaves
    /// this validator or commits a block.
    unchecked: BTreeMap<(View, VoteKind, ValidatorIndex), Vote>,
    unchecked_due: Option<Micros>,
    /// Certificates formed with unchecked votes, by (kind, view): passed on (and, for a
    /// finalization, committed) once those are checked.
    provisional: Vec<(VoteKind, View)>,
    /// Signers caught with a good MAC on a bad signature: their votes are verified before they
    /// count from then on.
    mac_banned: BTreeSet<ValidatorIndex>,
    /// Certificates this validator acted on and then had to drop (a vote in them had a bad
    /// signature, and the others were not enough): its own vote for each is sent again, now
    /// and on every retry, until the certificate is formed again.
    repair: BTreeSet<(VoteKind, View)>,
    pool: Pool,
    /// Who leads each view (leader reputation).
    leaders: Leaders,
    /// The batch of this validator's next proposal, built while its events arrive.
    prepared: Option<Prepared>,
    /// Room for the next compact proposal's ids and events, its memory touched ahead of time.
    spare: Spare,
    /// About how many events the recent blocks held: the room `spare` is made for.
    recent_events: usize,
    root: Option<RootReport>,
    my_roots: BTreeMap<Tick, Digest>,
    peer_roots: BTreeMap<Tick, BTreeMap<ValidatorIndex, Digest>>,
    last_retry: Micros,
    out: VecDeque<Output>,
}

const FUTURE_VIEWS: u64 = 1_000;

/// The most time, in tick periods, a leader's schedule asks back of a chain that fell behind it
/// (proposing as soon as half a period after the parent until it is made up); beyond that the
/// schedule moves (see `Validator::due`).
const MAX_DEBT_PERIODS: u64 = 2;

/// Votes counted on their authenticators and not yet checked, at most (then they are verified
/// before they count).
const UNCHECKED_MAX: usize = 256;

/// Unverified late votes held at most (then they are verified at once).
const LATE_MAX: usize = 64;

/// Compact proposals waiting for their block, at most.
const INCOMPLETE_MAX: usize = 16;

/// The most patience (view timeouts at most `1 + MAX_PATIENCE` times the configured ones).
///
/// Fixed timeouts lose liveness whenever the quorum is slower than they assume: a sim whose
/// nodes were starved of CPU (debug builds of a dozen nodes on two busy cores) nullified view
/// after view with proposals arriving and being notarized too late to finalize, while its
/// neighbours' mail piled up in its pool and made each next block bigger; it never came back.
/// Partial synchrony needs timeouts that grow until they exceed the actual delays.
const MAX_PATIENCE: u64 = 7;

/// Finalized views in a row after which patience is lowered by one.
const CALM_VIEWS: u64 = 32;

/// Views for which a peer that had to fetch a compact proposal gets full proposals.
const FULL_VIEWS: u64 = 64;

/// Bulk work held back while a view is in flight ([`Validator::busy`]).
#[derive(Clone, Debug)]
enum Bulk {
    /// Events gossiped by a peer.
    Gossiped(Vec<EventBytes>),
    /// Clients' events submitted here (passed on to the others once pooled).
    Submitted(Vec<EventBytes>),
}

impl Validator {
    /// A validator at genesis. `keys` is the validator set, `me` this validator's index in it.
    /// A key that is not in the set makes an observer: it follows the chain and outputs its
    /// commits, and never votes or proposes.
    pub fn new(cfg: Config, key: SigningKey, keys: Vec<VerifyingKey>, now: Micros) -> Validator {
        assert!(keys.len() >= 4, "BFT needs n = 3f+1 >= 4 validators, got {}", keys.len());
        let me = keys.iter().position(|k| *k == key.verifying_key()).map(|i| ValidatorIndex(i as u16));
        let f = (keys.len() - 1) / 3;
        #[allow(unused_mut)]
        let mut quorum = 2 * f + 1;
        #[cfg(feature = "mocks")]
        if cfg.planted_bug_weak_quorum {
            quorum = 2 * f;
        }
        let anchor_digest = cfg.anchor.as_ref().map(|a| a.block.digest());
        let genesis = match (&cfg.anchor, anchor_digest) {
            (Some(a), Some(d)) => epoch_digest(cfg.chain_id, a.epoch, &keys, &d),
            _ => genesis_digest(cfg.chain_id, &keys),
        };
        // An epoch after the first goes on with the tick schedule from its anchor (the previous
        // epoch's last block), or from the previous epoch's own if the caller hands it on
        // ([`Validator::continue_schedule`]): a fresh one started from its first block, and lost
        // the ticks due while the epochs changed hands.
        let schedule = cfg.anchor.as_ref().map(|a| (a.block.tick, a.block.time_ms.saturating_mul(1_000)));
        let mut blocks = Blocks::default();
        let mut output_tick = None;
        if let (Some(a), Some(d)) = (&cfg.anchor, anchor_digest) {
            // The anchor is output by this epoch (its seed is in this epoch's first block).
            let ids = event_ids(&a.block.events);
            blocks.insert(d, Stored::with_ids(a.block.clone(), ids));
            output_tick = a.block.tick.checked_sub(1);
        }
        // Gossip batches kept for four blocks' worth of events (a leader names those within two).
        let pool = Pool::with_batches(
            &blake3::derive_key("metatopia consensus pool hasher v1", &key.to_bytes()),
            4 * cfg.max_batch_events,
            4 * cfg.max_batch_bytes,
        );
        let demoted = keys.iter().map(|k| cfg.demoted.contains(k)).collect();
        let mut leaders = Leaders::new(keys.len(), quorum, cfg.leader_reputation, demoted);
        leaders.fix(View(1));
        let mac_keys = match me {
            Some(me) if cfg.vote_macs => keys
                .iter()
                .enumerate()
                .map(|(i, k)| pair_key(&genesis, &key, me, k, ValidatorIndex(i as u16)))
                .collect(),
            _ => Vec::new(),
        };
        Validator {
            cfg,
            key,
            me,
            keys,
            quorum,
            genesis,
            anchor_digest,
            settle_later: Vec::new(),
            bulk: Vec::new(),
            bulk_events: 0,
            bulk_due: None,
            finalized_at: 0,
            ahead: None,
            presigned: None,
            view: View(1),
            view_started: now,
            patience: 0,
            calm: 0,
            schedule,
            round_us: 0,
            no_fill: None,
            views: BTreeMap::new(),
            blocks,
            notarized: BTreeMap::new(),
            nullified: BTreeMap::new(),
            finalized: BTreeMap::new(),
            tip: (View(0), genesis),
            output_tick,
            held: false,
            buffered: BTreeMap::new(),
            incomplete: BTreeMap::new(),
            full_for: BTreeMap::new(),
            fetching: BTreeMap::new(),
            late: Vec::new(),
            late_due: None,
            mac_keys,
            unchecked: BTreeMap::new(),
            unchecked_due: None,
            provisional: Vec::new(),
            mac_banned: BTreeSet::new(),
            repair: BTreeSet::new(),
            pool,
            leaders,
            prepared: None,
            spare: Spare::default(),
            recent_events: 0,
            root: None,
            my_roots: BTreeMap::new(),
            peer_roots: BTreeMap::new(),
            last_retry: now,
            out: VecDeque::new(),
        }
    }

    /// This validator's index in the set; `None` for an observer.
    pub fn index(&self) -> Option<ValidatorIndex> {
        self.me
    }

    /// The block an epoch ends with, once finalized here (with a notarization of it): what the
    /// next epoch is anchored on.
    pub fn final_block(&self) -> Option<(Block, Certificate)> {
        let last = self.cfg.last_tick?;
        let (view, digest) = self.tip;
        let s = self.blocks.get(&digest)?;
        if s.block.tick != last {
            return None;
        }
        let n = self.notarized.get(&view).filter(|c| c.digest == digest)?;
        Some(((*s.block).clone(), n.clone()))
    }

    /// The blocks this validator is fetching (or waits a little before it asks for).
    pub fn fetching(&self) -> Vec<Digest> {
        self.fetching.keys().copied().collect()
    }

    /// Whether this validator holds the block with this digest (and answers fetches of it).
    pub fn holds_block(&self, digest: &Digest) -> bool {
        self.blocks.contains_key(digest)
    }

    /// Whether this epoch's last block is finalized: nothing more to decide here.
    pub fn finished(&self) -> bool {
        self.cfg.last_tick.is_some_and(|last| self.blocks.get(&self.tip.1).is_some_and(|s| s.block.tick >= last))
    }

    /// Where this epoch started, if not at genesis.
    pub fn anchor(&self) -> Option<&Anchor> {
        self.cfg.anchor.as_ref()
    }

    fn root_parent(&self) -> Digest {
        self.anchor_digest.unwrap_or(self.genesis)
    }
    pub fn view(&self) -> View {
        self.view
    }
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The faults tolerated: f of n = 3f + 1.
    fn f(&self) -> usize {
        (self.keys.len() - 1) / 3
    }

    /// How long the current view waits for its proposal (`has_proposal` false) or for its
    /// notarization, with this validator's patience (see [`MAX_PATIENCE`]).
    fn view_timeout(&self, has_proposal: bool) -> Micros {
        let base = if has_proposal { self.cfg.notarize_timeout_us } else { self.cfg.leader_timeout_us };
        base.saturating_mul(1 + self.patience)
    }

    /// Whether `view`'s leader was heard from: its proposal came, or a compact one whose events
    /// are being fetched (its leader is alive, so the view waits as long as for a notarization:
    /// on a long lossy path a gossip batch a proposal names may have been lost, and its fetch,
    /// a round trip, came after the leader timeout, failing the view of a live leader).
    fn heard_leader(&self, view: View) -> bool {
        self.views.get(&view).is_some_and(|s| s.proposal.is_some())
            || self.incomplete.values().any(|x| x.header.view == view)
    }

    /// How many times the configured view timeouts this validator waits now (1 unless views
    /// failed in a row lately).
    pub fn patience(&self) -> u64 {
        1 + self.patience
    }
    pub fn keys(&self) -> &[VerifyingKey] {
        &self.keys
    }
    pub fn genesis(&self) -> Digest {
        self.genesis
    }
    /// Go on with `previous`'s tick schedule (the epoch before this one, at its end), so the
    /// ticks due while the epochs change hands are covered by this epoch's first block.
    pub fn continue_schedule(&mut self, previous: &Validator) {
        if previous.schedule.is_some() {
            self.schedule = previous.schedule;
        }
    }
    /// Events waiting in the pool (those of a block committed by the latest input still count
    /// until the next input).
    pub fn pool_len(&self) -> usize {
        self.pool.len()
    }
    /// One line on where agreement stands, for an operator whose sim has stopped committing:
    /// the view and its leader, the finalized tip, and for each view from the tip on this
    /// validator's votes (`N`otarize, nu`X`lify, `F`inalize), the certificates it holds
    /// (`n`, `x`, `f`) and the votes it has counted (notarize per digest, nullify, finalize).
    pub fn describe(&self) -> String {
        use std::fmt::Write as _;
        let tip_tick = self.blocks.get(&self.tip.1).map(|s| s.block.tick);
        let mut s = format!(
            "view {} (leader {}, chosen {}), finalized view {} (tick {}), committed tick {}, pool {}",
            self.view.0,
            self.leader(self.view).0,
            self.leaders.describe(self.view),
            self.tip.0.0,
            tip_tick.map_or("-".to_owned(), |t| t.to_string()),
            self.output_tick.map_or("-".to_owned(), |t| t.to_string()),
            self.pool.len()
        );
        if let Some(due) = tip_tick.and_then(|t| self.due(t.next())) {
            let _ = write!(s, ", next tick due at {} ms", due / 1_000);
        }
        if self.patience > 0 {
            let _ = write!(s, ", view timeouts ×{}", 1 + self.patience);
        }
        if let Some(why) = self.not_proposing() {
            let _ = write!(s, ", leading but not proposing: {why}");
        }
        let flag = |b: bool, c: char| if b { c } else { '.' };
        // The newest views only: views that keep timing out pile up behind a stall.
        const SHOWN: usize = 8;
        let open = self.views.range(self.tip.0..).count();
        if open > SHOWN {
            let _ = write!(s, "; {} earlier views not shown", open - SHOWN);
        }
        for (view, v) in self.views.range(self.tip.0..).skip(open.saturating_sub(SHOWN)) {
            let notarize: Vec<usize> = v.notarize.values().map(BTreeMap::len).collect();
            let finalize: usize = v.finalize.values().map(BTreeMap::len).sum();
            let _ = write!(
                s,
                "; view {}: mine {}{}{}, certs {}{}{}, proposal {}, votes n{notarize:?} x{} f{finalize}",
                view.0,
                flag(v.my_notarize.is_some(), 'N'),
                flag(v.my_nullify.is_some(), 'X'),
                flag(v.my_finalize.is_some(), 'F'),
                flag(self.notarized.contains_key(view), 'n'),
                flag(self.nullified.contains_key(view), 'x'),
                flag(self.finalized.contains_key(view), 'f'),
                if v.proposal.is_some() { "yes" } else { "no" },
                v.nullify.len(),
            );
        }
        if !self.repair.is_empty() {
            let _ = write!(s, "; repairing {:?}", self.repair.iter().map(|(k, v)| (k, v.0)).collect::<Vec<_>>());
        }
        if !self.fetching.is_empty() {
            let which: Vec<String> = self.fetching.keys().map(|d| format!("{d:?}")).collect();
            let _ = write!(s, "; fetching {} blocks ({})", self.fetching.len(), which.join(", "));
        }
        s
    }

    /// The tick of the last committed block handed out.
    pub fn committed_tick(&self) -> Option<Tick> {
        self.output_tick
    }

    /// For a node that joins a running sim: output no commits until [`Validator::commit_from`]
    /// (it has no state to apply them to, and the chain back to the epoch's start may be pruned
    /// everywhere), and start in `view` (a peer's), so the votes and certificates of the views
    /// under way count — their state roots certify the snapshot the node joins from.
    pub fn join_at(&mut self, now: Micros, view: View) {
        self.held = true;
        if view > self.view {
            self.view = view;
            self.view_started = now;
        }
    }

    /// The joining node has the state after tick `tick - 1`: output commits from `tick` on.
    pub fn commit_from(&mut self, now: Micros, tick: Tick) {
        if !self.held {
            return;
        }
        self.held = false;
        self.output_tick = tick.checked_sub(1);
        self.advance_commits(now);
    }

    /// The leader of a view: round robin over the validators the committed chain shows alive
    /// and not failing (see `leaders`).
    pub fn leader(&self, view: View) -> ValidatorIndex {
        self.leaders.leader(view)
    }

    /// The validators that would not lead now (the chain shows them failed, or no sign of
    /// life): what the next epoch starts demoted with ([`Config::demoted`]).
    pub fn demoted(&self) -> Vec<VerifyingKey> {
        let out = self.leaders.demoted_now();
        out.iter().filter_map(|i| self.keys.get(usize::from(i.0)).copied()).collect()
    }

    /// Next output to act on. Call until `None` after every input.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        Some(match self.out.pop_front()? {
            Output::Broadcast(m) => Output::Broadcast(self.authenticate(m)),
            Output::Send(to, m) => Output::Send(to, self.authenticate(m)),
            o => o,
        })
    }

    /// When to call [`Validator::handle_timeout`] next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Micros> {
        let fetch = self.fetching.values().min().copied();
        let ahead = self.ahead.map(|(at, ..)| at);
        let fetch = [fetch, self.late_due, self.unchecked_due, self.bulk_due, ahead].into_iter().flatten().min();
        if self.finished() {
            return fetch;
        }
        if self.me.is_none() {
            // An observer re-asks for what it misses and passes on what it has, now and then.
            let retry = self.last_retry + self.cfg.retry_us;
            return Some(fetch.map_or(retry, |f| f.min(retry)));
        }
        let s = self.views.get(&self.view);
        let timed_out = s.is_some_and(|s| s.my_nullify.is_some());
        let mut t = if timed_out {
            self.last_retry + self.cfg.retry_us
        } else {
            self.view_started + self.view_timeout(self.heard_leader(self.view))
        };
        if let Some(at) = self.propose_at() {
            t = t.min(at);
        }
        if let Some(at) = self.fetching.values().min() {
            t = t.min(*at);
        }
        if let Some(at) = self.late_due {
            t = t.min(at);
        }
        if let Some(at) = self.unchecked_due {
            t = t.min(at);
        }
        if let Some(at) = self.bulk_due {
            t = t.min(at);
        }
        if let Some(at) = ahead {
            t = t.min(at);
        }
        Some(t)
    }

    /// Timers: propose when due, nullify a stuck view (R4), re-send while stuck, re-fetch.
    pub fn handle_timeout(&mut self, now: Micros) {
        if self.ahead.is_some_and(|(at, ..)| now >= at) {
            self.work_ahead();
        }
        self.bulk_if_due(now);
        if self.late_due.is_some_and(|at| now >= at) {
            self.verify_late(now);
        }
        if self.unchecked_due.is_some_and(|at| now >= at) {
            self.check_unchecked(now);
        }
        self.try_propose(now);
        let view = self.view;
        let finished = self.finished();
        let deadline = self.view_timeout(self.heard_leader(view));
        let s = self.views.entry(view).or_default();
        if let (Some(me), false) = (self.me, finished)
            && s.my_nullify.is_none()
            && now >= self.view_started + deadline
        {
            let vote = self.sign(me, VoteKind::Nullify, view, Digest::default());
            let s = self.views.entry(view).or_default();
            s.my_nullify = Some(vote.clone());
            self.last_retry = now;
            self.out.push_back(Output::Broadcast(Message::Vote(vote.clone())));
            self.on_vote(now, vote);
            // Stuck: also the votes of certificates missing behind this view, and the latest
            // certificates (when the views time out together they never stay stuck long
            // enough for `resend`: a peer that missed the last finalization while the others
            // went on nullifying views, say one restarted while no leader could propose, would
            // never learn it).
            self.resend_certificates();
            self.resend_repair();
        } else if (s.my_nullify.is_some() || self.me.is_none())
            && !finished
            && now >= self.last_retry + self.cfg.retry_us
        {
            self.last_retry = now;
            self.resend(view);
        }
        let blocks = &self.blocks;
        self.fetching.retain(|d, _| !blocks.contains_key(d));
        let stale: Vec<Digest> = self.fetching.iter().filter(|(_, due)| now >= **due).map(|(d, _)| *d).collect();
        for d in stale {
            self.fetching.insert(d, now + self.cfg.retry_us);
            self.out.push_back(Output::Broadcast(Message::Fetch(d)));
        }
        self.schedule_bulk(now);
    }

    /// Re-send own votes of the stuck view and the latest certificates, so a peer that lost
    /// messages (or restarted) can catch up.
    fn resend(&mut self, view: View) {
        if let Some(s) = self.views.get(&view) {
            for v in [&s.my_notarize, &s.my_nullify].into_iter().flatten() {
                self.out.push_back(Output::Broadcast(Message::Vote(v.clone())));
            }
        }
        self.resend_certificates();
        self.resend_repair();
    }

    /// Broadcast the latest notarization, nullification and finalization held here (those
    /// whose signatures are checked), so a peer that missed them can catch up: it fetches the
    /// finalized block and its ancestors, and learns a parent to build on.
    fn resend_certificates(&mut self) {
        let latest = [
            self.notarized.last_key_value().map(|(_, c)| c),
            self.nullified.last_key_value().map(|(_, c)| c),
            self.finalized.last_key_value().map(|(_, c)| c),
        ];
        let send: Vec<Certificate> = latest.into_iter().flatten().filter(|c| !self.has_unchecked(c)).cloned().collect();
        for c in send {
            self.out.push_back(Output::Broadcast(Message::Certificate(c)));
        }
    }

    /// Re-send this validator's votes of the certificates it lost or never saved
    /// (`repair`), while they are still missing and wanted.
    fn resend_repair(&mut self) {
        let tip = self.tip.0;
        let wanted = |&(kind, view): &(VoteKind, View)| {
            !self.certified(kind).contains_key(&view)
                && (view >= tip || kind == VoteKind::Notarize && view.0 + 64 > tip.0)
        };
        self.repair = self.repair.iter().copied().filter(wanted).collect();
        for (kind, view) in self.repair.clone() {
            self.resend_own(kind, view);
        }
    }

    /// A message from validator `from` (authenticated by the transport as that peer).
    pub fn handle_message(&mut self, now: Micros, from: ValidatorIndex, msg: Message) {
        self.bulk_if_due(now);
        if let Message::Authenticated { inner, macs } = msg {
            self.note_authenticated(now, inner.vote(), &macs);
            self.receive(now, from, (*inner).into_message());
        } else {
            self.receive(now, from, msg);
        }
        self.schedule_bulk(now);
        self.try_propose(now);
    }

    fn receive(&mut self, now: Micros, from: ValidatorIndex, msg: Message) {
        match msg {
            Message::Propose { block, vote, nullifications } => {
                self.on_proposal(now, from, block, vote, nullifications)
            }
            Message::ProposeIds { block, ids, vote, nullifications } => {
                self.on_proposal_pieces(now, from, block, vec![Piece::Ids(ids)], vote, nullifications)
            }
            Message::ProposeRefs { block, pieces, vote, nullifications } => {
                self.on_proposal_pieces(now, from, block, pieces, vote, nullifications)
            }
            Message::Vote(v) => {
                if self.is_late(&v) && self.late.len() < LATE_MAX {
                    self.late_due.get_or_insert(now + self.cfg.period_us / 4);
                    self.late.push(v);
                } else if self.vote_ok(&v) {
                    self.on_vote(now, v);
                }
            }
            Message::Certificate(c) => self.on_certificate(now, c),
            Message::Events(mut es) => {
                es.truncate(self.cfg.max_batch_events);
                if self.holding() {
                    self.hold(now, Bulk::Gossiped(es));
                } else {
                    self.gossiped(now, es);
                }
            }
            Message::Fetch(d) => {
                if let Some(s) = self.blocks.get(&d) {
                    if s.block.view.0 + 1 >= self.view.0 && self.cfg.compact_proposals {
                        // A peer could not rebuild a fresh compact proposal (its pool misses
                        // gossip): when this validator leads, it sends that peer full ones.
                        self.full_for.insert(from, View(self.view.0 + FULL_VIEWS));
                    }
                    let notarization = self.notarized.get(&s.block.view).filter(|c| c.digest == d).cloned();
                    let leader_vote = self
                        .views
                        .get(&s.block.view)
                        .and_then(|v| v.notarize.get(&d))
                        .and_then(|t| t.get(&s.block.leader))
                        .map(|v| Box::new(v.clone()));
                    let block = (*s.block).clone();
                    self.out.push_back(Output::Send(from, Message::Block { block, notarization, leader_vote }));
                }
            }
            Message::Block { block, notarization, leader_vote } => {
                self.on_fetched(now, block, notarization, leader_vote)
            }
            // Unwrapped in `handle_message`.
            Message::Authenticated { .. } => {}
        }
    }
}

/// Whether no id repeats.
fn all_distinct(ids: &[Digest]) -> bool {
    // The ids' first 8 bytes go into an open-addressed table twice the batch's size: linear
    // time, where sorting them as integers took a follower ~10 µs of its ~70 at 1,000 ids
    // (and sorting the 32-byte ids, 35 µs). Ids are blake3 outputs, so their buckets spread; a
    // leader could grind events to crowd a few buckets, so a run of probes past `MAX_PROBES`
    // falls back to sorting. Two ids alike in their first 8 bytes (or in all but the lowest
    // bit, which marks a used slot) send it to sorting the whole ids too (an honest chance of
    // ~2^-45 per block).
    const MAX_PROBES: usize = 32;
    let head = |d: &Digest| u64::from_le_bytes(d.0[..8].try_into().expect("8 bytes")) | 1;
    if ids.len() < 2 {
        return true;
    }
    let bits = (2 * ids.len()).next_power_of_two().trailing_zeros();
    // A table of this thread's, kept (a fresh one was zeroed memory touched for the first time).
    thread_local! {
        static TABLE: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let mut table = TABLE.take();
    table.clear();
    table.resize(1 << bits, 0);
    let mask = table.len() - 1;
    let mut fast = true;
    'ids: for d in ids {
        let h = head(d);
        let mut i = (h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as usize;
        for _ in 0..MAX_PROBES {
            if table[i] == 0 {
                table[i] = h;
                continue 'ids;
            }
            if table[i] == h {
                break;
            }
            i = (i + 1) & mask;
        }
        fast = false;
        break;
    }
    if table.capacity() <= 1 << 16 {
        TABLE.set(table);
    }
    if fast {
        return true;
    }
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).all(|w| w[0] != w[1])
}

/// The seed of an empty tick of a block's span (a tick before the block's own): derived from
/// the block's seed, so just as unpredictable before the block is committed.
pub fn span_seed(block_seed: &Digest, tick: Tick) -> Digest {
    let mut h = blake3::Hasher::new_keyed(b"metatopia/consensus/span/v1_____");
    h.update(&block_seed.0);
    h.update(&tick.0.to_le_bytes());
    Digest(*h.finalize().as_bytes())
}

/// The seed of a committed tick's canonical order.
pub fn seed_of(digest: &Digest, certificate: &Certificate) -> Digest {
    let mut h = blake3::Hasher::new_keyed(b"metatopia/consensus/seed/v1_____");
    h.update(&digest.0);
    h.update(&certificate.hash().0);
    Digest(*h.finalize().as_bytes())
}

/// The digest standing for the start of an epoch: its chain, number, validator set and anchor.
pub fn epoch_digest(chain_id: u64, epoch: u64, keys: &[VerifyingKey], anchor: &Digest) -> Digest {
    let mut h = blake3::Hasher::new_keyed(b"metatopia/consensus/epoch/v1____");
    h.update(&chain_id.to_le_bytes());
    h.update(&epoch.to_le_bytes());
    h.update(&anchor.0);
    for k in keys {
        h.update(k.as_bytes());
    }
    Digest(*h.finalize().as_bytes())
}

/// The digest standing for the genesis block of a chain.
pub fn genesis_digest(chain_id: u64, keys: &[VerifyingKey]) -> Digest {
    let mut h = blake3::Hasher::new_keyed(b"metatopia/consensus/genesis/v1__");
    h.update(&chain_id.to_le_bytes());
    for k in keys {
        h.update(k.as_bytes());
    }
    Digest(*h.finalize().as_bytes())
}

#[cfg(test)]
mod tests;
