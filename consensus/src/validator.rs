//! One validator's Simplex state machine (see the crate docs for the rules, cited as `R1`…).
//!
//! Sans-IO, quinn-proto style: feed it [`Validator::handle_message`],
//! [`Validator::handle_timeout`] and [`Validator::submit_event`] with the caller's `now`, then
//! drain [`Validator::poll_output`] and arm a timer for [`Validator::poll_timeout`]. Before
//! sending the outputs of a step, a crash-safe caller writes [`Validator::persist`] durably.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::pool::{Batch, Pool, Source};
use crate::types::{
    Block, Certificate, Digest, EventBytes, Logged, Mac, Message, Micros, Parent, Piece, RootReport, Signed,
    ValidatorIndex, View, Vote, VoteKind, event_ids, pair_key,
};

/// Tuning. Times are in microseconds of the caller's clock.
#[derive(Clone, Debug)]
pub struct Config {
    /// A leader proposes no sooner than the parent's BFT time plus this (one tick period).
    pub period_us: Micros,
    /// Nullify a view whose proposal has not arrived this long after entering it.
    pub leader_timeout_us: Micros,
    /// Nullify a view not notarized this long after entering it.
    pub notarize_timeout_us: Micros,
    /// While stuck, re-send own votes and the latest certificates this often.
    pub retry_us: Micros,
    /// A proposal's BFT time may be at most this far ahead of the voter's clock.
    pub max_drift_ms: u64,
    pub max_batch_events: usize,
    pub max_batch_bytes: usize,
    pub max_event_bytes: usize,
    pub max_pool_events: usize,
    /// Committed event ids remembered (for dedup) this many ticks.
    pub dedup_window_ticks: u64,
    /// Finalized blocks kept to answer fetches from laggards: the newest `keep_blocks`...
    pub keep_blocks: u64,
    /// ... and of those no more than `keep_bytes` of blocks (their events, ids and headers),
    /// dropping the oldest first; the newest `keep_blocks_min` are kept whatever their size.
    /// A laggard further behind takes a snapshot (the node's catch-up), not every block. A
    /// restarted validator gets the blocks it handed out back ([`Validator::recall`]).
    pub keep_bytes: u64,
    /// The newest finalized blocks kept whatever `keep_bytes` says: a laggard a few ticks
    /// behind (a lost message, a short stall) catches up by fetching them.
    pub keep_blocks_min: u64,
    /// BFT time of genesis, in milliseconds.
    pub genesis_time_ms: u64,
    /// Distinguishes chains (a sim id): part of the genesis digest.
    pub chain_id: u64,
    /// Signature verdicts, shareable (a simulated cluster shares one; a node keeps its own).
    pub sig_cache: std::sync::Arc<crate::types::SigCache>,
    /// Backpressure from execution: a leader proposes tick t only once its application has
    /// reported the root of tick t - 1 - `max_exec_lag` ([`Validator::report_root`]). When
    /// execution is slow, ticks come later (time dilation) instead of execution falling ever
    /// further behind agreement. `None`: no backpressure (an application that never reports).
    pub max_exec_lag: Option<u64>,
    /// The last tick this instance decides (an epoch's end): it never proposes or votes for a
    /// block beyond it, and goes quiet once that block is finalized. `None`: no end.
    pub last_tick: Option<u64>,
    /// Start after a previous epoch's last block instead of at genesis.
    pub anchor: Option<Anchor>,
    /// A leader sends its proposal compact, its events named as runs of the gossip batches
    /// they came in ([`Message::ProposeRefs`]), rather than the events themselves (`false`: full
    /// blocks, as before; kept for comparison).
    pub compact_proposals: bool,
    /// Votes and proposals go out with an authenticator (a MAC per validator, from pairwise
    /// keys; [`Message::Authenticated`]): a receiver counts them on the MAC and checks their
    /// signatures `period_us / 16` later, off the commit's path (`false`: every vote's signature
    /// is checked before it counts, as before; kept for comparison).
    pub vote_macs: bool,
    /// Test-only planted bug: accept 2f votes as a quorum. The Byzantine suite must catch it.
    #[cfg(feature = "mocks")]
    pub planted_bug_weak_quorum: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            period_us: 33_333,
            leader_timeout_us: 200_000,
            notarize_timeout_us: 400_000,
            retry_us: 200_000,
            max_drift_ms: 500,
            max_batch_events: 4_096,
            max_batch_bytes: 4 << 20,
            max_event_bytes: 96 * 1024,
            max_pool_events: 100_000,
            dedup_window_ticks: 300,
            keep_blocks: 2_048,
            keep_bytes: 256 << 20,
            keep_blocks_min: 64,
            genesis_time_ms: 0,
            chain_id: 0,
            sig_cache: Default::default(),
            max_exec_lag: None,
            last_tick: None,
            anchor: None,
            compact_proposals: true,
            vote_macs: true,
            #[cfg(feature = "mocks")]
            planted_bug_weak_quorum: false,
        }
    }
}

/// A committed block, ready to execute.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Commit {
    pub block: Block,
    pub digest: Digest,
    /// The block's notarization as embedded in its committed child: unique in the chain.
    pub certificate: Certificate,
    /// The seed of the tick's canonical order: blake3(digest ‖ certificate hash).
    pub seed: Digest,
    /// The finalization of the block (or of a descendant) that committed it.
    pub finalization: Certificate,
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
        tick: u64,
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
    output_tick: Option<u64>,
    blocks: Vec<Block>,
    notarized: Vec<Certificate>,
    nullified: Vec<Certificate>,
    finalized: Vec<Certificate>,
}

/// Where an epoch starts: the previous epoch's last block, finalized there, with a notarization
/// of it by the previous validator set (the new epoch's first block carries it, and its hash
/// seeds that last block's canonical order).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Anchor {
    pub epoch: u64,
    pub block: Block,
    pub notarization: Certificate,
    pub prev_keys: Vec<[u8; 32]>,
    /// The previous epoch's chain digest (its votes are signed under it).
    pub prev_chain: Digest,
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
    #[error("tick {got} does not follow the parent's ({expected})")]
    BadTick { expected: u64, got: u64 },
    #[error("BFT time {got} ms is not after the parent's {parent} ms or is more than the drift ahead of {now} ms")]
    BadTime { got: u64, parent: u64, now: u64 },
    #[error("batch over its limits or with duplicate events")]
    BadBatch,
    #[error("tick {0} is beyond this epoch's last tick")]
    BeyondEpoch(u64),
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
    settle_later: Vec<(u64, Digest, std::sync::Arc<Vec<Digest>>)>,
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
    schedule: Option<(u64, Micros)>,
    views: BTreeMap<View, ViewState>,
    blocks: Blocks,
    notarized: BTreeMap<View, Certificate>,
    nullified: BTreeMap<View, Certificate>,
    finalized: BTreeMap<View, Certificate>,
    /// The highest finalized block.
    tip: (View, Digest),
    /// The tick of the last block output as committed.
    output_tick: Option<u64>,
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
    /// The batch of this validator's next proposal, built while its events arrive.
    prepared: Option<Prepared>,
    /// Room for the next compact proposal's ids and events, its memory touched ahead of time.
    spare: Spare,
    /// About how many events the recent blocks held: the room `spare` is made for.
    recent_events: usize,
    root: Option<RootReport>,
    my_roots: BTreeMap<u64, Digest>,
    peer_roots: BTreeMap<u64, BTreeMap<ValidatorIndex, Digest>>,
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

/// Room for the ids and events of a compact proposal, made in idle time: a follower rebuilding
/// one wrote its 1,000 ids and events into memory fresh from the allocator, and the first
/// touch of each page (a fault, the page cleared) was about half of the rebuild (~30 of ~60
/// µs at 1,000 events a tick, most of it on the commit's path). A block keeps what it is
/// given, so this is made again for every proposal.
#[derive(Debug, Default)]
struct Spare {
    ids: Vec<Digest>,
    events: Vec<EventBytes>,
}

impl Spare {
    /// Room for `n` of each, every page of it written once (zeros into the unused capacity:
    /// filling the events' room with clones of one value, and dropping them, cost two atomic
    /// operations an event).
    fn with_room(n: usize) -> Spare {
        let mut spare = Spare { ids: Vec::with_capacity(n), events: Vec::with_capacity(n) };
        touch(spare.ids.spare_capacity_mut());
        touch(spare.events.spare_capacity_mut());
        spare
    }
}

/// Write zeros over memory not yet in use, one value in each 4 KiB page, so that its pages
/// are faulted in now.
fn touch<T>(room: &mut [std::mem::MaybeUninit<T>]) {
    let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for slot in room.iter_mut().step_by(step) {
        *slot = std::mem::MaybeUninit::zeroed();
    }
    std::hint::black_box(room);
}

/// A compact proposal waiting for events its validator's pool lacks.
#[derive(Clone, Debug)]
struct Incomplete {
    header: Block,
    pieces: Vec<Piece>,
    /// The gossip batches not held, and the events named by id not pooled (piece, position),
    /// when last looked for.
    batches: Vec<Digest>,
    ids: Vec<(u32, u32)>,
    vote: Vote,
    nulls: Vec<Certificate>,
}

/// What a compact proposal's pieces give.
enum Resolved {
    /// The events and their ids.
    Complete(Vec<Digest>, Vec<EventBytes>),
    Missing {
        batches: Vec<Digest>,
        ids: Vec<(u32, u32)>,
    },
    /// More events than a block holds, or a run beyond its batch: no vote.
    Invalid,
}

/// The batch of the next proposal of this validator, started as soon as it leads a view whose
/// parent is known and joined by each event pooled after, so that proposing takes it whole:
/// walking the pool for 1,000 events cost the commit's path 120 µs. It is taken only if the
/// parent and the uncommitted blocks before it (whose events it excludes) are still the same.
#[derive(Clone, Debug)]
struct Prepared {
    parent: Parent,
    /// The blocks from the parent back to the last output one, whose events are excluded.
    ancestors: Vec<Digest>,
    batch: Batch,
}

impl Prepared {
    /// Whether this batch is the one for `parent` with these uncommitted blocks behind it. A
    /// block committed since is left out of them (its events have left the pool), so the
    /// blocks the batch excludes need only begin with them.
    fn fits(&self, parent: &Parent, ancestors: &[Digest]) -> bool {
        self.parent == *parent && self.ancestors.starts_with(ancestors)
    }
}

/// A known block with what is derived from it once: shared, never copied per use.
#[derive(Clone, Debug)]
struct Stored {
    block: std::sync::Arc<Block>,
    ids: std::sync::Arc<Vec<Digest>>,
    /// What holding it costs, about: its events' bytes, 64 for each event (its id, its pointer and
    /// the pointer's count) and 512 for the header and certificate.
    bytes: u64,
}

impl Stored {
    /// `ids[i]` is `event_id(&block.events[i])`.
    fn with_ids(block: Block, ids: Vec<Digest>) -> Stored {
        let bytes = block.events.iter().map(|e| e.len() as u64 + 64).sum::<u64>() + 512;
        Stored { block: std::sync::Arc::new(block), ids: std::sync::Arc::new(ids), bytes }
    }
}

/// The known blocks by digest (read through `Deref`), and by tick, so dropping the ones
/// below a tick costs what is dropped. (Pruning by scanning every block read each block's
/// tick behind its `Arc`: 2,048 scattered reads per commit once `keep_blocks` were held.)
#[derive(Debug, Default)]
struct Blocks {
    by_digest: BTreeMap<Digest, Stored>,
    by_tick: BTreeSet<(u64, Digest)>,
    /// The sum of the blocks' `Stored::bytes`.
    bytes: u64,
}

impl std::ops::Deref for Blocks {
    type Target = BTreeMap<Digest, Stored>;

    fn deref(&self) -> &Self::Target {
        &self.by_digest
    }
}

impl Blocks {
    /// (A digest covers its block's tick, so a digest inserted again keeps its index entry.)
    fn insert(&mut self, digest: Digest, stored: Stored) {
        self.by_tick.insert((stored.block.tick, digest));
        self.bytes += stored.bytes;
        if let Some(old) = self.by_digest.insert(digest, stored) {
            self.bytes -= old.bytes;
        }
    }

    /// The highest tick of a known block.
    fn newest_tick(&self) -> Option<u64> {
        self.by_tick.last().map(|(t, _)| *t)
    }

    /// Forget the blocks of ticks below `tick`.
    fn prune_below(&mut self, tick: u64) {
        let kept = self.by_tick.split_off(&(tick, Digest::default()));
        for (_, d) in std::mem::replace(&mut self.by_tick, kept) {
            self.remove(&d);
        }
    }

    /// Forget the oldest blocks, of ticks below `below` only, while they hold more than
    /// `budget` bytes.
    fn prune_to_budget(&mut self, budget: u64, below: u64) {
        while self.bytes > budget
            && let Some(&(tick, d)) = self.by_tick.first()
            && tick < below
        {
            self.by_tick.pop_first();
            self.remove(&d);
        }
    }

    fn remove(&mut self, digest: &Digest) {
        if let Some(old) = self.by_digest.remove(digest) {
            self.bytes -= old.bytes;
        }
    }
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
            schedule: None,
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

    /// Continue after a crash from what [`Validator::persist`] returned.
    pub fn restore(
        cfg: Config,
        key: SigningKey,
        keys: Vec<VerifyingKey>,
        now: Micros,
        saved: &[u8],
    ) -> Result<Validator, crate::types::DecodeError> {
        let p: Persisted =
            postcard::from_bytes(saved).map_err(|e| crate::types::DecodeError::Malformed(e.to_string()))?;
        let mut v = Validator::new(cfg, key, keys, now);
        v.view = p.view;
        for (view, (n, x, f)) in p.votes {
            let lead = Some(v.leader(view)) == v.me;
            let s = v.views.entry(view).or_default();
            // Its own votes count in its tallies, as when they were cast: a validator that
            // counted only its peers' after a restart needed one vote more than there could be
            // with f validators down (three restored with their nullify votes of one view, the
            // fourth down, each saw two and that view never ended).
            for vote in [&n, &x, &f].into_iter().flatten() {
                s.tally_mut(vote.kind, vote.digest).insert(vote.signer, vote.clone());
                s.first.insert((vote.kind, vote.signer), vote.clone());
            }
            s.my_notarize = n;
            s.my_nullify = x;
            s.my_finalize = f;
            s.proposed = s.my_notarize.is_some() && lead;
        }
        v.tip = p.tip;
        v.output_tick = p.output_tick;
        for b in p.blocks {
            let ids = event_ids(&b.events);
            v.blocks.insert(b.digest_with_ids(&ids), Stored::with_ids(b, ids));
        }
        for c in p.notarized {
            v.notarized.insert(c.view, c);
        }
        for c in p.nullified {
            v.nullified.insert(c.view, c);
        }
        for c in p.finalized {
            v.finalized.insert(c.view, c);
        }
        // A certificate formed on its votes' MACs is saved only once their signatures are
        // checked, a few milliseconds later. When every validator stopped inside that window
        // (a whole sim stopped at once), nobody has it, and nobody sent its votes of a past view
        // again: no later view could be built on, and every view timed out from then on. So
        // this validator's votes whose certificate it lacks are sent again while it is stuck
        // (as `resend` does for certificates that lost a vote), until the certificate forms.
        let holes: Vec<(VoteKind, View)> = v
            .views
            .iter()
            .flat_map(|(view, s)| {
                [
                    (VoteKind::Notarize, s.my_notarize.is_some()),
                    (VoteKind::Nullify, s.my_nullify.is_some()),
                    (VoteKind::Finalize, s.my_finalize.is_some()),
                ]
                .into_iter()
                .filter(|(_, mine)| *mine)
                .map(move |(kind, _)| (kind, *view))
            })
            .filter(|(kind, view)| !v.certified(*kind).contains_key(view))
            .collect();
        v.repair.extend(holes);
        Ok(v)
    }

    /// Blocks this validator handed out as committed before a restart, oldest first, from the
    /// application's commit log: kept again (as if never pruned) to answer peers' fetches.
    /// [`Validator::persist`] keeps only the blocks not yet handed out, so without this, once
    /// a whole sim had stopped, no validator would hold the blocks that one down at the time
    /// still needs, and it could never commit again.
    ///
    /// Each block is rebuilt from its record and the notarization of the block before it (an
    /// epoch's first block, from the genesis or the anchor), and kept only when its digest and
    /// view are its notarization's. Records of ticks not handed out yet, before this epoch, or
    /// more than `keep_blocks` below the committed tick are skipped, and the byte budget
    /// applies as to any finalized block. Returns how many blocks were kept.
    pub fn recall(&mut self, logged: impl IntoIterator<Item = Logged>) -> usize {
        let Some(out) = self.output_tick else { return 0 };
        let first_tick = self.cfg.anchor.as_ref().map_or(0, |a| a.block.tick + 1);
        let keep_from = out.saturating_sub(self.cfg.keep_blocks).max(first_tick);
        let mut prev: Option<(u64, Certificate)> = None;
        let mut kept = 0;
        for rec in logged {
            let parent = if rec.tick == first_tick {
                let anchor = self.cfg.anchor.as_ref().map(|a| a.notarization.clone());
                Some((Parent { view: View(0), digest: self.root_parent() }, anchor))
            } else {
                prev.take()
                    .filter(|(tick, _)| tick + 1 == rec.tick)
                    .map(|(_, c)| (Parent { view: c.view, digest: c.digest }, Some(c)))
            };
            let n = rec.notarization;
            if let Some((parent, parent_certificate)) = parent
                && (keep_from..=out).contains(&rec.tick)
                && n.kind == VoteKind::Notarize
                && !self.blocks.contains_key(&n.digest)
            {
                let block = Block {
                    view: n.view,
                    leader: self.leader(n.view),
                    parent,
                    tick: rec.tick,
                    time_ms: rec.time_ms,
                    events: rec.events,
                    parent_certificate,
                };
                let ids = event_ids(&block.events);
                if block.digest_with_ids(&ids) == n.digest {
                    self.blocks.insert(n.digest, Stored::with_ids(block, ids));
                    kept += 1;
                }
            }
            prev = Some((rec.tick, n));
        }
        self.prune();
        kept
    }

    /// The state that must be durable before this step's outputs are sent.
    pub fn persist(&self) -> Vec<u8> {
        let from = self.tip.0;
        let p = Persisted {
            view: self.view,
            votes: self
                .views
                .range(from..)
                .map(|(v, s)| (*v, (s.my_notarize.clone(), s.my_nullify.clone(), s.my_finalize.clone())))
                .collect(),
            tip: self.tip,
            output_tick: self.output_tick,
            blocks: self.unoutput_chain_blocks(),
            // (Certificates with unchecked votes are formed again after a restart.)
            notarized: self.checked(&self.notarized, from),
            nullified: self.checked(&self.nullified, from),
            finalized: self.checked(&self.finalized, from),
        };
        postcard::to_allocvec(&p).expect("encoding into a Vec cannot fail")
    }

    fn checked(&self, certs: &BTreeMap<View, Certificate>, from: View) -> Vec<Certificate> {
        certs.range(from..).map(|(_, c)| c).filter(|c| !self.has_unchecked(c)).cloned().collect()
    }

    fn unoutput_chain_blocks(&self) -> Vec<Block> {
        let after = self.output_tick;
        self.blocks.values().filter(|s| after.is_none_or(|t| s.block.tick >= t)).map(|s| (*s.block).clone()).collect()
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

    /// The ids of a block held here (the Byzantine mocks rewrite this validator's proposals).
    #[cfg(feature = "mocks")]
    pub(crate) fn block_ids(&self, digest: &Digest) -> Option<Vec<Digest>> {
        self.blocks.get(digest).map(|s| (*s.ids).clone())
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

    /// Take the client events still waiting in the pool (an epoch hands them to the next).
    pub fn drain_pool(&mut self) -> Vec<EventBytes> {
        self.settle();
        for b in std::mem::take(&mut self.bulk) {
            let (Bulk::Gossiped(events) | Bulk::Submitted(events)) = b;
            self.pool_events(0, events, true);
        }
        (self.bulk_due, self.bulk_events) = (None, 0);
        self.pool.take(usize::MAX, usize::MAX, &[])
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
    /// Events waiting in the pool (those of a block committed by the latest input still count
    /// until the next input).
    pub fn pool_len(&self) -> usize {
        self.pool.len()
    }
    /// The state roots other validators reported for `tick` in their votes (recent ticks).
    pub fn peer_roots(&self, tick: u64) -> Option<&BTreeMap<ValidatorIndex, Digest>> {
        self.peer_roots.get(&tick)
    }

    /// The newest tick that f+1 other validators (at least one honest) report having executed,
    /// in their votes' root reports: how far the sim is, as seen from a node that lags.
    pub fn peers_executed(&self) -> Option<u64> {
        let f = self.f();
        self.peer_roots
            .iter()
            .rev()
            .find(|(_, by)| by.keys().filter(|v| Some(**v) != self.me).count() > f)
            .map(|(t, _)| *t)
    }

    /// One line on where agreement stands, for an operator whose sim has stopped committing:
    /// the view and its leader, the finalized tip, and for each view from the tip on this
    /// validator's votes (`N`otarize, nu`X`lify, `F`inalize), the certificates it holds
    /// (`n`, `x`, `f`) and the votes it has counted (notarize per digest, nullify, finalize).
    pub fn describe(&self) -> String {
        use std::fmt::Write as _;
        let tip_tick = self.blocks.get(&self.tip.1).map(|s| s.block.tick);
        let mut s = format!(
            "view {} (leader {}), finalized view {} (tick {}), committed tick {}, pool {}",
            self.view.0,
            self.leader(self.view).0,
            self.tip.0.0,
            tip_tick.map_or("-".to_owned(), |t| t.to_string()),
            self.output_tick.map_or("-".to_owned(), |t| t.to_string()),
            self.pool.len()
        );
        if self.patience > 0 {
            let _ = write!(s, ", view timeouts ×{}", 1 + self.patience);
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
    pub fn committed_tick(&self) -> Option<u64> {
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
    pub fn commit_from(&mut self, now: Micros, tick: u64) {
        if !self.held {
            return;
        }
        self.held = false;
        self.output_tick = tick.checked_sub(1);
        self.advance_commits(now);
    }

    /// The leader of a view: round robin.
    pub fn leader(&self, view: View) -> ValidatorIndex {
        ValidatorIndex((view.0 % self.keys.len() as u64) as u16)
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

    /// This validator's own vote or proposal with an authenticator: the vote's MAC under the
    /// pairwise key of each validator, by index. Anything else as it is.
    pub fn authenticate(&self, m: Message) -> Message {
        if self.mac_keys.is_empty() || m.vote().is_none_or(|v| Some(v.signer) != self.me) {
            return m;
        }
        match Signed::from_message(m) {
            Ok(inner) => {
                let macs = inner.vote().macs(&self.genesis, &self.mac_keys);
                Message::Authenticated { inner: Box::new(inner), macs }
            }
            Err(m) => *m,
        }
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
            let has_proposal = s.is_some_and(|s| s.proposal.is_some());
            self.view_started + self.view_timeout(has_proposal)
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

    /// A client event for the pool; disseminated to the other validators when new.
    pub fn submit_event(&mut self, now: Micros, event: impl Into<EventBytes>) {
        self.submit_events(now, vec![event]);
    }

    /// Client events for the pool, disseminated together (one message) to the others.
    pub fn submit_events<E: Into<EventBytes>>(&mut self, now: Micros, events: Vec<E>) {
        self.bulk_if_due(now);
        let events = events.into_iter().map(Into::into).collect();
        if self.holding() {
            self.hold(now, Bulk::Submitted(events));
        } else {
            self.submitted(now, events);
        }
        self.schedule_bulk(now);
        self.try_propose(now);
    }

    /// Pool clients' events and pass the new ones on to the other validators.
    fn submitted(&mut self, now: Micros, mut events: Vec<EventBytes>) {
        // A message carries at most a batch's worth (the others cut longer ones short, and
        // each message is a gossip batch, named as it came).
        while !events.is_empty() {
            let rest = events.split_off(events.len().min(self.cfg.max_batch_events));
            let new = self.pool_events(now, events, false);
            if !new.is_empty() {
                self.out.push_back(Output::Broadcast(Message::Events(new)));
                if !self.incomplete.is_empty() {
                    self.retry_incomplete(now);
                }
            }
            events = rest;
        }
        self.make_room();
    }

    /// Pool peers' gossiped events.
    fn gossiped(&mut self, now: Micros, events: Vec<EventBytes>) {
        self.pool_events(now, events, true);
        if !self.incomplete.is_empty() {
            self.retry_incomplete(now);
        }
        self.make_room();
    }

    /// Make the spare room for the next proposal's ids and events, if it is missing or too
    /// small for the recent blocks (with an eighth to spare). Done where events are pooled:
    /// off the commit's path, and whenever there are events to propose.
    fn make_room(&mut self) {
        let n = (self.recent_events + self.recent_events / 8).min(self.cfg.max_batch_events);
        if n > 0 && self.spare.ids.capacity() < n {
            self.spare = Spare::with_room(n);
        }
    }

    /// A block of `n` events was taken in: about how many the recent blocks held (the largest
    /// lately, forgotten by an eighth a block).
    fn note_events(&mut self, n: usize) {
        self.recent_events = n.max(self.recent_events - self.recent_events / 8);
    }

    /// Whether a view of this validator's is in flight: it voted to notarize it (or proposed
    /// it), did not nullify it, and no finalization has reached it yet. Until one does, its
    /// votes are on the commit's path, and the bulk work of taking in client events (hashing
    /// a thousand, looking each up in the tables of committed ids) and of forgetting the
    /// committed ones waits: done in the middle of a view, it held back this validator's next
    /// vote, or, on a shared core, another validator's (`bench agreement`: ~0.3 ms a tick
    /// each). It waits at most [`Validator::max_hold`].
    pub fn busy(&self) -> bool {
        self.me.is_some()
            && self.views.range(self.tip.0.next()..).any(|(_, s)| s.my_notarize.is_some() && s.my_nullify.is_none())
    }

    /// Whether new bulk work waits: a view is in flight, or work held before it is not done
    /// (events are pooled in the order they came).
    fn holding(&self) -> bool {
        !self.bulk.is_empty() || self.busy()
    }

    /// How long an event must have been pooled before this validator proposes it: a
    /// sixteenth of a period (1 ms at 60 Hz), time for its gossip to reach the others. Only
    /// for compact proposals (a full proposal carries the events).
    fn fresh_us(&self) -> Micros {
        if self.cfg.compact_proposals { self.cfg.period_us / 16 } else { 0 }
    }

    /// The longest bulk work is held back: an eighth of a tick period (2 ms at 60 Hz), far
    /// below the period after which the events held are proposed.
    fn max_hold(&self) -> Micros {
        self.cfg.period_us / 8
    }

    /// How long after learning of a finalization the held bulk work waits: a thirty-second of
    /// a period (~0.5 ms at 60 Hz). The first validators to learn of it would otherwise start
    /// on their bulk work (~0.4 ms at 1,000 events a tick) while the others still wait for
    /// its last votes, and a validator sharing their core waited behind it (`bench
    /// agreement`, 4 validators on 2 cores: p99 0.78-0.88 ms with it, 1.05-1.10 ms without).
    fn after_final(&self) -> Micros {
        self.cfg.period_us / 32
    }

    /// After an input: when the held bulk work is due. While a view is in flight, at most
    /// [`Validator::max_hold`] after it was first held; otherwise now (at the next input or
    /// timer: after this input's outputs have gone out), but not before
    /// [`Validator::after_final`] has passed since the last finalization.
    fn schedule_bulk(&mut self, now: Micros) {
        if self.bulk.is_empty() && self.settle_later.is_empty() {
            self.bulk_due = None;
            return;
        }
        let at = if self.busy() {
            now + self.max_hold()
        } else {
            now.max(self.finalized_at.saturating_add(self.after_final()))
        };
        self.bulk_due = Some(self.bulk_due.map_or(at, |due| due.min(at)));
    }

    /// Hold back events, unless more are held than the pool takes: then the pool takes them
    /// now (it bounds what a validator keeps, whoever sends it events).
    fn hold(&mut self, now: Micros, b: Bulk) {
        let (Bulk::Gossiped(events) | Bulk::Submitted(events)) = &b;
        self.bulk_events += events.len();
        self.bulk.push(b);
        if self.bulk_events > self.cfg.max_pool_events {
            self.do_bulk(now);
        }
    }

    /// Before an input: do the held bulk work if it is due.
    fn bulk_if_due(&mut self, now: Micros) {
        if self.bulk_due.is_some_and(|due| now >= due) {
            self.do_bulk(now);
        }
    }

    /// The held bulk work: the pool forgets the committed events, then takes the held ones in
    /// the order they came.
    fn do_bulk(&mut self, now: Micros) {
        self.bulk_due = None;
        self.bulk_events = 0;
        self.settle();
        for b in std::mem::take(&mut self.bulk) {
            match b {
                Bulk::Gossiped(events) => self.gossiped(now, events),
                Bulk::Submitted(events) => self.submitted(now, events),
            }
        }
    }

    /// The application executed `tick` and reached `root`; carried in later votes.
    pub fn report_root(&mut self, tick: u64, root: Digest) {
        self.root = Some(RootReport { tick, root });
        self.my_roots.insert(tick, root);
        if let Some(peers) = self.peer_roots.get(&tick) {
            for (v, r) in peers {
                if *r != root {
                    self.out.push_back(Output::RootMismatch { tick, mine: root, theirs: *r, validator: *v });
                }
            }
        }
        while self.my_roots.len() > 256 {
            self.my_roots.pop_first();
        }
        let horizon = tick.saturating_sub(256);
        self.peer_roots.retain(|t, _| *t >= horizon);
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
        let deadline = self.view_timeout(self.views.get(&view).is_some_and(|s| s.proposal.is_some()));
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

    /// A vote whose MAC for this validator checks is its signer's: it counts at once, and its
    /// signature is checked at `unchecked_due` (see [`Validator::check_unchecked`]).
    fn note_authenticated(&mut self, now: Micros, vote: &Vote, macs: &[Mac]) {
        let (Some(me), Some(key)) = (self.me, self.mac_keys.get(vote.signer.0 as usize)) else { return };
        if vote.signer == me
            || self.mac_banned.contains(&vote.signer)
            || macs.len() != self.keys.len()
            || macs.get(me.0 as usize) != Some(&vote.mac(&self.genesis, key))
            || self.unchecked.len() >= UNCHECKED_MAX
        {
            return;
        }
        // A second, different vote of the signer's for the same (view, kind) is not taken on its
        // MAC: it is verified before it counts (it is evidence), and it never replaces the first
        // here, which may be in a tally already and must still have its signature checked.
        self.unchecked.entry((vote.view, vote.kind, vote.signer)).or_insert_with(|| vote.clone());
        self.unchecked_due.get_or_insert(now + self.cfg.period_us / 16);
    }

    /// Whether a vote counts: it came with a valid authenticator (its signature is checked
    /// later), or its signature verifies.
    fn vote_ok(&self, v: &Vote) -> bool {
        self.unchecked.get(&(v.view, v.kind, v.signer)).is_some_and(|u| u == v)
            || v.verify(&self.genesis, &self.keys, &self.cfg.sig_cache)
    }

    /// The certificates of a kind held here, by view.
    fn certified(&self, kind: VoteKind) -> &BTreeMap<View, Certificate> {
        match kind {
            VoteKind::Notarize => &self.notarized,
            VoteKind::Nullify => &self.nullified,
            VoteKind::Finalize => &self.finalized,
        }
    }

    fn certified_mut(&mut self, kind: VoteKind) -> &mut BTreeMap<View, Certificate> {
        match kind {
            VoteKind::Notarize => &mut self.notarized,
            VoteKind::Nullify => &mut self.nullified,
            VoteKind::Finalize => &mut self.finalized,
        }
    }

    fn has_unchecked(&self, c: &Certificate) -> bool {
        !self.unchecked.is_empty() && c.votes.iter().any(|v| self.unchecked.contains_key(&(v.view, v.kind, v.signer)))
    }

    /// Check the signatures of the votes counted on their authenticators. A signer whose MAC
    /// was good and signature bad is Byzantine: its vote is taken out of the tallies and of the
    /// certificates that held it (each is rebuilt from the other votes, or waits for one more).
    /// Then the certificates formed meanwhile are passed on, and commits advance.
    fn check_unchecked(&mut self, now: Micros) {
        self.unchecked_due = None;
        let votes = std::mem::take(&mut self.unchecked);
        for v in votes.into_values() {
            if !v.verify(&self.genesis, &self.keys, &self.cfg.sig_cache) {
                self.mac_banned.insert(v.signer);
                self.discard_vote(&v);
            }
        }
        for (kind, view) in std::mem::take(&mut self.provisional) {
            if let Some(c) = self.certified(kind).get(&view) {
                self.out.push_back(Output::Broadcast(Message::Certificate(c.clone())));
            }
        }
        self.advance_commits(now);
    }

    /// Take a vote with a bad signature out of its tally and out of the certificate holding it.
    fn discard_vote(&mut self, v: &Vote) {
        let quorum = self.quorum;
        let Some(s) = self.views.get_mut(&v.view) else { return };
        if s.first.get(&(v.kind, v.signer)) == Some(v) {
            s.first.remove(&(v.kind, v.signer));
        }
        let tally = match v.kind {
            VoteKind::Notarize => s.notarize.get_mut(&v.digest),
            VoteKind::Nullify => Some(&mut s.nullify),
            VoteKind::Finalize => s.finalize.get_mut(&v.digest),
        };
        let Some(tally) = tally else { return };
        if tally.get(&v.signer) == Some(v) {
            tally.remove(&v.signer);
        }
        let rest: Vec<Vote> = tally.values().take(quorum).cloned().collect();
        let certs = self.certified_mut(v.kind);
        if certs.get(&v.view).is_some_and(|c| c.votes.contains(v)) {
            if rest.len() >= quorum {
                certs.entry(v.view).and_modify(|c| c.votes = rest);
            } else {
                // Formed again when one more vote comes (it is not "late" meanwhile). The others
                // may lack the same votes: send ours again.
                certs.remove(&v.view);
                self.repair.insert((v.kind, v.view));
                self.resend_own(v.kind, v.view);
            }
        }
    }

    /// Broadcast this validator's own vote of a kind in a view again, if it cast one.
    fn resend_own(&mut self, kind: VoteKind, view: View) {
        let Some(s) = self.views.get(&view) else { return };
        let mine = match kind {
            VoteKind::Notarize => &s.my_notarize,
            VoteKind::Nullify => &s.my_nullify,
            VoteKind::Finalize => &s.my_finalize,
        };
        if let Some(v) = mine.clone() {
            self.out.push_back(Output::Broadcast(Message::Vote(v)));
        }
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

    // ---- proposals (R1, R2) ----

    /// The parent a proposal for `view` must extend: the highest notarized view below it with
    /// every view in between nullified (R1). `None` if a certificate is missing.
    fn parent_for(&self, view: View) -> Option<Parent> {
        let mut w = view.0;
        while w > 0 {
            w -= 1;
            if w == 0 {
                return Some(Parent { view: View(0), digest: self.root_parent() });
            }
            if let Some(c) = self.notarized.get(&View(w)) {
                return Some(Parent { view: View(w), digest: c.digest });
            }
            if !self.nullified.contains_key(&View(w)) {
                return None;
            }
        }
        Some(Parent { view: View(0), digest: self.root_parent() })
    }

    fn parent_time_tick(&self, parent: &Parent) -> Option<(u64, u64)> {
        if parent.view == View(0) {
            return Some(match &self.cfg.anchor {
                Some(a) => (a.block.time_ms, a.block.tick + 1),
                None => (self.cfg.genesis_time_ms, 0),
            });
        }
        self.blocks.get(&parent.digest).map(|s| (s.block.time_ms, s.block.tick + 1))
    }

    /// When this validator, as leader of the current view, may propose.
    fn propose_at(&self) -> Option<Micros> {
        if Some(self.leader(self.view)) != self.me
            || self.views.get(&self.view).is_some_and(|s| s.proposed || s.my_nullify.is_some())
        {
            return None;
        }
        let parent = self.parent_for(self.view)?;
        let (time_ms, tick) = self.parent_time_tick(&parent)?;
        if self.cfg.last_tick.is_some_and(|last| tick > last) {
            return None; // the epoch is over
        }
        if let Some(lag) = self.cfg.max_exec_lag {
            let executed = self.root.map_or(0, |r| r.tick + 1);
            if tick > executed + lag {
                return None; // wait for execution; the application's next report retries
            }
        }
        let after_parent = time_ms * 1_000;
        let due = self.due(tick).unwrap_or(after_parent + self.cfg.period_us);
        Some(due.max(after_parent + self.cfg.period_us / 2).max(self.view_started))
    }

    /// When tick `tick` is due on this validator's schedule: one period after the tick before.
    ///
    /// A leader proposes when its tick is due rather than a period after its parent's BFT time:
    /// a proposal is never sent at the very microsecond it was due (the timer, the wake-up),
    /// and counting each period from the last proposal added those delays up, tick after tick
    /// (a devnet with no load ran at 0.97 of its rate). The schedule is local (voters check
    /// only R1's bounds), follows the chain (`note_schedule`), and never asks for more than
    /// [`MAX_DEBT_PERIODS`] of lost time back, nor a proposal sooner than half a period
    /// after its parent.
    fn due(&self, tick: u64) -> Option<Micros> {
        let (at_tick, at) = self.schedule?;
        let period = self.cfg.period_us;
        Some(if tick >= at_tick {
            at.saturating_add((tick - at_tick).saturating_mul(period))
        } else {
            at.saturating_sub((at_tick - tick).saturating_mul(period))
        })
    }

    /// A valid block of `tick` with BFT time `time_ms`, seen at `now`: keep the schedule on the
    /// chain. A block earlier than its tick was due here (by more than the millisecond a BFT
    /// time is rounded down by) moves the schedule back to it; one later than that by more than [`MAX_DEBT_PERIODS`] moves it forward
    /// (the time lost, in a view change say, is not made up). Blocks timed ahead of this
    /// validator's clock are not followed.
    fn note_schedule(&mut self, now: Micros, tick: u64, time_ms: u64) {
        let at = time_ms * 1_000;
        if at > now + 1_000 {
            return;
        }
        // A BFT time is in whole milliseconds, rounded down: up to 1 ms early is on time.
        let behind = MAX_DEBT_PERIODS * self.cfg.period_us;
        match self.due(tick) {
            Some(due) if at + 1_000 > due && at <= due + behind => {}
            _ => self.schedule = Some((tick, at)),
        }
    }

    fn try_propose(&mut self, now: Micros) {
        let Some(at) = self.propose_at() else { return };
        if now < at {
            self.prepare(now);
            return;
        }
        if !self.unchecked.is_empty() {
            // The block embeds certificates: they must verify (this is rare: the checks are due
            // long before the next proposal).
            self.check_unchecked(now);
            if self.propose_at().is_none_or(|at| now < at) {
                return;
            }
        }
        // A batch must not repeat events committed in this same input.
        self.settle();
        let view = self.view;
        let parent = self.parent_for(view).expect("propose_at checked");
        let (parent_time, tick) = self.parent_time_tick(&parent).expect("propose_at checked");
        let (ancestors, exclude) = self.uncommitted(&parent);
        let mut batch = match self.prepared.take() {
            Some(p) if p.fits(&parent, &ancestors) => p.batch,
            _ => {
                let exclude: Vec<&[Digest]> = exclude.iter().map(|ids| ids.as_slice()).collect();
                self.pool.batch(self.cfg.max_batch_events, self.cfg.max_batch_bytes, &exclude)
            }
        };
        // The events pooled in the last moments wait for the next block: their gossip may not
        // have reached the others yet, who would then have to wait for it before they could
        // rebuild this compact proposal and vote (at 1,000 events a tick arriving just before
        // each proposal, every proposal did, ~0.2 ms on the commit's path).
        batch.pooled_by(now.saturating_sub(self.fresh_us()));
        let Batch { events, ids, sources, .. } = batch;
        let Some(me) = self.me else { return };
        let mut block = Block {
            view,
            leader: me,
            parent,
            tick,
            time_ms: (now / 1_000).max(parent_time + 1),
            events: Vec::new(),
            parent_certificate: if parent.view > View(0) {
                self.notarized.get(&parent.view).cloned()
            } else {
                self.cfg.anchor.as_ref().map(|a| a.notarization.clone())
            },
        };
        self.note_schedule(now, tick, block.time_ms);
        let digest = block.header_digest(&ids);
        let nullifications: Vec<Certificate> =
            self.nullified.range(parent.view.next()..view).map(|(_, c)| c.clone()).collect();
        let vote = self.sign(me, VoteKind::Notarize, view, digest);
        let s = self.views.entry(view).or_default();
        s.proposed = true;
        s.proposal = Some(digest);
        s.my_notarize = Some(vote.clone());
        let header = block.clone();
        block.events = events;
        self.full_for.retain(|_, until| *until > view);
        let full = |block: &Block| Message::Propose {
            block: block.clone(),
            vote: vote.clone(),
            nullifications: nullifications.clone(),
        };
        if !self.cfg.compact_proposals {
            self.out.push_back(Output::Broadcast(full(&block)));
        } else {
            let compact = Message::ProposeRefs {
                block: header,
                pieces: self.pieces(&ids, &sources),
                vote: vote.clone(),
                nullifications: nullifications.clone(),
            };
            // To everyone (observers too), and in full to the peers that could not rebuild a
            // recent one (they take whichever comes first).
            self.out.push_back(Output::Broadcast(compact));
            for &peer in self.full_for.keys() {
                self.out.push_back(Output::Send(peer, full(&block)));
            }
        }
        self.note_events(ids.len());
        self.blocks.insert(digest, Stored::with_ids(block, ids));
        self.on_vote(now, vote);
        self.ahead = Some((now, view, digest));
    }

    /// As the leader of the current view before its proposal is due: start (or restart, if its
    /// parent changed) the batch of that proposal ([`Prepared`]). Not before the parent is
    /// finalized here (or half a period has passed): until then this validator's votes for
    /// the parent are on the commit's path, and starting a batch takes ~50-100 µs. Nor in the
    /// first eighth of the view: the others are still finalizing the parent then, and on a
    /// machine shared with one of them it held that one back.
    fn prepare(&mut self, now: Micros) {
        let Some(parent) = self.parent_for(self.view) else { return };
        if now < self.view_started + self.cfg.period_us / 8
            || !self.finalized.contains_key(&parent.view) && now < self.view_started + self.cfg.period_us / 2
        {
            return;
        }
        // Events committed in this input must not be in it.
        self.settle();
        let (ancestors, exclude) = self.uncommitted(&parent);
        if self.prepared.as_ref().is_some_and(|p| p.fits(&parent, &ancestors)) {
            return;
        }
        let exclude: Vec<&[Digest]> = exclude.iter().map(|ids| ids.as_slice()).collect();
        let batch = self.pool.batch(self.cfg.max_batch_events, self.cfg.max_batch_bytes, &exclude);
        self.prepared = Some(Prepared { parent, ancestors, batch });
    }

    /// Add client events to the pool (and to the prepared batch), in their order; the new ones.
    /// `gossip`: a peer's batch, kept whole; else this validator's clients' events, of which the
    /// new ones are the batch it sends.
    fn pool_events(&mut self, now: Micros, mut events: Vec<EventBytes>, gossip: bool) -> Vec<EventBytes> {
        let max = self.cfg.max_event_bytes;
        events.retain(|e| e.len() <= max);
        let ids = if gossip {
            self.pool.insert_gossip(&events, self.cfg.max_pool_events, now)
        } else {
            self.pool.insert_submitted(&events, self.cfg.max_pool_events, now)
        };
        let mut new = Vec::with_capacity(events.len());
        for (e, id) in events.into_iter().zip(ids) {
            let Some((id, source)) = id else { continue };
            if let Some(p) = &mut self.prepared {
                p.batch.offer(&id, &e, now, source);
            }
            new.push(e);
        }
        new
    }

    /// A proposal's events named as runs of the gossip batches they came in, where a batch is
    /// held and recent enough for the others to hold it too, and by id elsewhere.
    fn pieces(&self, ids: &[Digest], sources: &[Option<Source>]) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        for (id, source) in ids.iter().zip(sources) {
            let run = source.and_then(|s| Some((self.pool.batches.referable(s.seq)?, s.index)));
            match (run, out.last_mut()) {
                (Some((d, i)), Some(Piece::Run { batch, start, len })) if *batch == d && *start + *len == i => {
                    *len += 1
                }
                (Some((d, i)), _) => out.push(Piece::Run { batch: d, start: i, len: 1 }),
                (None, Some(Piece::Ids(v))) => v.push(*id),
                (None, _) => out.push(Piece::Ids(vec![*id])),
            }
        }
        out
    }

    /// The notarized-but-not-yet-output blocks from `parent` back, and their events' id lists
    /// (shared, not copied into a set: that cost a leader 100 µs at 1,000 events), which a new
    /// batch must not repeat.
    fn uncommitted(&self, parent: &Parent) -> (Vec<Digest>, Vec<std::sync::Arc<Vec<Digest>>>) {
        let (mut blocks, mut lists) = (Vec::new(), Vec::new());
        let mut d = parent.digest;
        for _ in 0..64 {
            let Some(s) = self.blocks.get(&d) else { break };
            if self.output_tick.is_some_and(|t| s.block.tick <= t) {
                break;
            }
            blocks.push(d);
            lists.push(s.ids.clone());
            d = s.block.parent.digest;
        }
        (blocks, lists)
    }

    fn on_proposal(&mut self, now: Micros, from: ValidatorIndex, block: Block, vote: Vote, nulls: Vec<Certificate>) {
        let view = block.view;
        if from != block.leader || block.leader != self.leader(view) {
            return;
        }
        let ids = event_ids(&block.events);
        self.on_full_proposal(now, block, ids, vote, nulls);
    }

    /// A compact proposal: the block is rebuilt from the gossip batches and the pool, or
    /// fetched when an event is missing (and then taken as the proposal, in `on_fetched`).
    fn on_proposal_pieces(
        &mut self,
        now: Micros,
        from: ValidatorIndex,
        mut block: Block,
        pieces: Vec<Piece>,
        vote: Vote,
        nulls: Vec<Certificate>,
    ) {
        let view = block.view;
        if from != block.leader || block.leader != self.leader(view) || !block.events.is_empty() {
            return;
        }
        let mut resolved = self.resolve(&pieces);
        if matches!(resolved, Resolved::Missing { .. }) && self.bulk.iter().any(|b| matches!(b, Bulk::Gossiped(_))) {
            // The missing events may be among those held back: taken in now.
            self.do_bulk(now);
            resolved = self.resolve(&pieces);
        }
        let (batches, ids) = match resolved {
            Resolved::Complete(ids, events) => {
                block.events = events;
                return self.on_full_proposal(now, block, ids, vote, nulls);
            }
            Resolved::Invalid => return,
            Resolved::Missing { batches, ids } => (batches, ids),
        };
        // The digest the leader signed; over the ids when they are all named (it is checked
        // against them once the events are in).
        let digest = match pieces.as_slice() {
            [Piece::Ids(all)] => block.header_digest(all),
            _ => vote.digest,
        };
        if let Some(known) = self.blocks.get(&digest) {
            // Fetched already (its notarization came first).
            let (block, ids) = ((*known.block).clone(), (*known.ids).clone());
            return self.on_full_proposal(now, block, ids, vote, nulls);
        }
        if view.0 > self.view.0 + FUTURE_VIEWS || view < self.tip.0 || !self.leader_vote_ok(&block, digest, &vote) {
            return;
        }
        let missing = Incomplete { header: block, pieces, batches, ids, vote, nulls };
        self.incomplete.insert(digest, missing);
        while self.incomplete.len() > INCOMPLETE_MAX {
            // Keep the newest views.
            let oldest = self.incomplete.iter().min_by_key(|(_, x)| x.header.view).map(|(d, _)| *d);
            oldest.map(|d| self.incomplete.remove(&d));
        }
        // The missing gossip is usually on its way (it left its sender before the proposal,
        // on another link): the block is asked for only if it has not come in a quarter period.
        // Then it is asked of everyone: whoever rebuilt it answers, and every future leader
        // learns to send this validator full proposals.
        self.fetching.entry(digest).or_insert(now + self.cfg.period_us / 4);
    }

    /// A compact proposal's events (and their ids), from the gossip batches held and the pool;
    /// written into the spare room when it is large enough (and it is left as it was if the
    /// proposal is not complete).
    fn resolve(&mut self, pieces: &[Piece]) -> Resolved {
        let mut total = 0usize;
        for p in pieces {
            total = total.saturating_add(p.len());
        }
        if total > self.cfg.max_batch_events {
            return Resolved::Invalid;
        }
        let mut room = if self.spare.ids.capacity() >= total && self.spare.events.capacity() >= total {
            std::mem::take(&mut self.spare)
        } else {
            Spare { ids: Vec::with_capacity(total), events: Vec::with_capacity(total) }
        };
        let resolved = self.resolve_into(pieces, &mut room);
        if !matches!(resolved, Resolved::Complete(..)) && room.ids.capacity() > self.spare.ids.capacity() {
            room.ids.clear();
            room.events.clear();
            self.spare = room;
        }
        resolved
    }

    /// (`resolve`, writing into `room`: taken from it when complete.)
    fn resolve_into(&self, pieces: &[Piece], room: &mut Spare) -> Resolved {
        let Spare { ids, events } = room;
        let (mut no_batch, mut no_id) = (Vec::new(), Vec::new());
        for (p, piece) in pieces.iter().enumerate() {
            match piece {
                Piece::Run { batch, start, len } => {
                    let Some(g) = self.pool.batches.get(batch) else {
                        no_batch.push(*batch);
                        continue;
                    };
                    let (from, to) = (*start as usize, *start as usize + *len as usize);
                    if to > g.ids.len() {
                        return Resolved::Invalid;
                    }
                    ids.extend_from_slice(&g.ids[from..to]);
                    // Read before shared (as below).
                    let run = &g.events[from..to];
                    std::hint::black_box(run.iter().fold(0u8, |a, e| a ^ e.first().copied().unwrap_or(0)));
                    events.extend_from_slice(run);
                }
                Piece::Ids(named) => {
                    let found: Vec<Option<&EventBytes>> = named.iter().map(|id| self.pool.get(id)).collect();
                    // Each event's first byte is read before any is shared: sharing one is an
                    // atomic increment of its count, which waits for the cache line and holds
                    // back every load behind it, so a thousand misses came one at a time.
                    std::hint::black_box(found.iter().flatten().fold(0u8, |a, e| a ^ e.first().copied().unwrap_or(0)));
                    for (i, (id, e)) in named.iter().zip(found).enumerate() {
                        match e {
                            Some(e) => {
                                ids.push(*id);
                                events.push(e.clone());
                            }
                            None => no_id.push((p as u32, i as u32)),
                        }
                    }
                }
            }
        }
        if no_batch.is_empty() && no_id.is_empty() {
            Resolved::Complete(std::mem::take(ids), std::mem::take(events))
        } else {
            Resolved::Missing { batches: no_batch, ids: no_id }
        }
    }

    /// Take up the compact proposals whose missing events have arrived. Only what was missing
    /// is looked up again: the gossip a proposal waits for usually left its leader just before
    /// it (its clients' latest events), and is taken in right after it, since proposals are
    /// handled first. Looking the whole block up at each gossip message cost a follower a
    /// second rebuild on the commit's path.
    fn retry_incomplete(&mut self, now: Micros) {
        let pool = &self.pool;
        let complete: Vec<Digest> = self
            .incomplete
            .iter_mut()
            .filter_map(|(d, x)| {
                x.batches.retain(|b| pool.batches.get(b).is_none());
                let pieces = &x.pieces;
                x.ids.retain(|&(p, i)| match &pieces[p as usize] {
                    Piece::Ids(named) => pool.get(&named[i as usize]).is_none(),
                    Piece::Run { .. } => false,
                });
                (x.batches.is_empty() && x.ids.is_empty()).then_some(*d)
            })
            .collect();
        for d in complete {
            let Some(mut x) = self.incomplete.remove(&d) else { continue };
            match self.resolve(&x.pieces) {
                Resolved::Complete(ids, events) => {
                    self.fetching.remove(&d);
                    x.header.events = events;
                    self.on_full_proposal(now, x.header, ids, x.vote, x.nulls);
                }
                Resolved::Missing { batches, ids } => {
                    // An event left the pool meanwhile (committed in another block), or a batch
                    // was dropped: the fetch already due takes over.
                    (x.batches, x.ids) = (batches, ids);
                    self.incomplete.insert(d, x);
                }
                Resolved::Invalid => {}
            }
        }
    }

    /// The leader's own notarize vote, sent with its proposal, is for this block.
    fn leader_vote_ok(&self, block: &Block, digest: Digest, vote: &Vote) -> bool {
        vote.kind == VoteKind::Notarize
            && vote.view == block.view
            && vote.digest == digest
            && vote.signer == block.leader
            && self.vote_ok(vote)
    }

    /// A proposal with its events (`ids[i]` is the id of `block.events[i]`).
    fn on_full_proposal(&mut self, now: Micros, block: Block, ids: Vec<Digest>, vote: Vote, nulls: Vec<Certificate>) {
        let view = block.view;
        let digest = block.digest_with_ids(&ids);
        if !self.leader_vote_ok(&block, digest, &vote) {
            return;
        }
        for c in nulls {
            self.on_certificate(now, c);
        }
        if view > self.view {
            if view.0 <= self.view.0 + FUTURE_VIEWS {
                self.buffered.insert(view, (block, vote, Vec::new()));
            }
            return;
        }
        let stored = Stored::with_ids(block, ids);
        match self.check_block_ids(now, &stored.block, &stored.ids) {
            Ok(()) => {}
            Err(ProposalError::UnknownParent) => {
                self.fetch(now, stored.block.parent.digest);
                self.buffered.insert(view, ((*stored.block).clone(), vote, Vec::new()));
                return;
            }
            Err(_) => return,
        }
        self.note_schedule(now, stored.block.tick, stored.block.time_ms);
        self.note_events(stored.ids.len());
        self.blocks.insert(digest, stored);
        if view <= self.tip.0 {
            // Finalized before its proposal arrived: it may be the block a commit waits for.
            self.advance_commits(now);
        }
        let s = self.views.entry(view).or_default();
        match s.proposal {
            Some(d) if d != digest => return, // the leader equivocated; its votes are evidence
            _ => s.proposal = Some(digest),
        }
        // R2: notarize the first valid proposal of the current view, unless it timed out.
        if let Some(me) = self.me
            && view == self.view
            && s.my_notarize.is_none()
            && s.my_nullify.is_none()
        {
            let mine = self.sign(me, VoteKind::Notarize, view, digest);
            let s = self.views.entry(view).or_default();
            s.my_notarize = Some(mine.clone());
            self.out.push_back(Output::Broadcast(Message::Vote(mine.clone())));
            self.on_vote(now, mine);
            self.ahead = Some((now, view, digest));
        }
        self.on_vote(now, vote);
    }

    /// R1: the block extends a notarized parent over nullified views, with the next tick, a
    /// bounded BFT time and a bounded batch.
    pub fn check_block(&self, now: Micros, b: &Block) -> Result<(), ProposalError> {
        let ids = event_ids(&b.events);
        self.check_block_ids(now, b, &ids)
    }

    fn check_block_ids(&self, now: Micros, b: &Block, ids: &[Digest]) -> Result<(), ProposalError> {
        let p = b.parent;
        if p.view >= b.view {
            return Err(ProposalError::BadParent);
        }
        if let Some(last) = self.cfg.last_tick
            && b.tick > last
        {
            return Err(ProposalError::BeyondEpoch(b.tick));
        }
        if p.view == View(0) {
            if p.digest != self.root_parent() {
                return Err(ProposalError::BadParent);
            }
            let ok = match (&self.cfg.anchor, &b.parent_certificate) {
                (None, None) => true,
                // An epoch's first block carries a notarization of the anchor by the previous set.
                (Some(a), Some(c)) => {
                    let prev: Vec<VerifyingKey> =
                        a.prev_keys.iter().filter_map(|k| VerifyingKey::from_bytes(k).ok()).collect();
                    let quorum = 2 * (prev.len().saturating_sub(1) / 3) + 1;
                    c.kind == VoteKind::Notarize
                        && c.digest == p.digest
                        && prev.len() == a.prev_keys.len()
                        && c.verify(&a.prev_chain, &prev, quorum, &self.cfg.sig_cache).is_ok()
                }
                _ => false,
            };
            if !ok {
                return Err(ProposalError::BadParent);
            }
        } else {
            let cert_ok = match &b.parent_certificate {
                Some(c) => {
                    c.kind == VoteKind::Notarize
                        && c.view == p.view
                        && c.digest == p.digest
                        && (self.holds_checked(c)
                            || c.verify(&self.genesis, &self.keys, self.quorum, &self.cfg.sig_cache).is_ok())
                }
                None => false,
            };
            if !cert_ok {
                return Err(ProposalError::BadParent);
            }
        }
        if (p.view.0 + 1..b.view.0).any(|w| !self.nullified.contains_key(&View(w))) {
            return Err(ProposalError::BadParent);
        }
        let Some((parent_time, tick)) = self.parent_time_tick(&p) else {
            return Err(ProposalError::UnknownParent);
        };
        if b.tick != tick {
            return Err(ProposalError::BadTick { expected: tick, got: b.tick });
        }
        let now_ms = now / 1_000;
        if b.time_ms <= parent_time || b.time_ms > now_ms + self.cfg.max_drift_ms {
            return Err(ProposalError::BadTime { got: b.time_ms, parent: parent_time, now: now_ms });
        }
        let bytes: usize = b.events.iter().map(|e| e.len()).sum();
        if b.events.len() > self.cfg.max_batch_events
            || bytes > self.cfg.max_batch_bytes
            || ids.len() != b.events.len()
            || !all_distinct(ids)
            || b.events.iter().any(|e| e.len() > self.cfg.max_event_bytes)
        {
            return Err(ProposalError::BadBatch);
        }
        Ok(())
    }

    // ---- votes and certificates (R3–R5) ----

    /// Whether a certificate is made of a quorum of votes this validator counted and checked
    /// (each in its tally and not waiting for its signature check: verified, or its own), which
    /// makes it valid without a signature lookup. A leader's proposal embeds the parent's
    /// notarization, usually of votes every follower counted itself; looking its three
    /// signatures up in the cache cost a follower ~20 µs of its proposal handling.
    fn holds_checked(&self, c: &Certificate) -> bool {
        let Some(s) = self.views.get(&c.view) else { return false };
        let tally = match c.kind {
            VoteKind::Notarize => s.notarize.get(&c.digest),
            VoteKind::Nullify => Some(&s.nullify),
            VoteKind::Finalize => s.finalize.get(&c.digest),
        };
        let Some(tally) = tally else { return false };
        let mut signers = BTreeSet::new();
        c.votes.iter().all(|v| {
            v.kind == c.kind
                && v.view == c.view
                && v.digest == c.digest
                && tally.get(&v.signer) == Some(v)
                && !self.unchecked.contains_key(&(v.view, v.kind, v.signer))
                && signers.insert(v.signer)
        }) && signers.len() >= self.quorum
    }

    fn on_vote(&mut self, now: Micros, vote: Vote) {
        let view = vote.view;
        if view.0 > self.view.0 + FUTURE_VIEWS || view < self.tip.0 {
            return;
        }
        if let Some(r) = vote.root {
            self.note_root(vote.signer, r);
        }
        if self.conflicts(&vote) {
            return;
        }
        let (kind, digest) = (vote.kind, vote.digest);
        if kind == VoteKind::Notarize
            && view == self.view
            && self.views.get(&view).is_none_or(|s| s.proposal.is_none() && s.my_nullify.is_none())
            && !self.incomplete.contains_key(&digest)
        {
            // A vote for a proposal of this view that has not come here: it may have been lost
            // on the way. Asked for if it has not come in a quarter period (the answer carries
            // the leader's vote, and the block is then taken as the proposal: `on_fetched`). On a
            // lossy network a view whose proposal one honest validator missed otherwise timed
            // out whenever every honest vote was needed (the seed sweeps' schedules with f
            // Byzantine validators and 10-15 % loss, after heal).
            self.fetch_soon(now, digest);
        }
        let tally = self.views.entry(view).or_default().tally_mut(kind, digest);
        tally.insert(vote.signer, vote);
        if tally.len() >= self.quorum {
            let cert = Certificate { kind, view, digest, votes: tally.values().take(self.quorum).cloned().collect() };
            self.on_certified(now, cert);
        }
    }

    /// Sign a vote of this validator's; its signature is remembered as valid, so a certificate
    /// that carries it back is not verified again here.
    fn sign(&mut self, me: ValidatorIndex, kind: VoteKind, view: View, digest: Digest) -> Vote {
        let root = self.root;
        let ahead =
            |p: &mut Vote| p.signer == me && p.kind == kind && p.view == view && p.digest == digest && p.root == root;
        if let Some(vote) = self.presigned.take_if(ahead) {
            return vote;
        }
        let vote = Vote::sign(&self.key, &self.genesis, me, kind, view, digest, self.root);
        vote.remember_valid(&self.genesis, &self.keys, &self.cfg.sig_cache);
        vote
    }

    /// The work for a view this validator voted to notarize that can be done while the others'
    /// votes are on their way (~40 µs of the ~70 a notarization took to finalize on): its
    /// finalize vote signed (the same bytes as signed later: ed25519 is deterministic, and the
    /// vote is used only if its root report is still the latest), and the leader's vote,
    /// counted on its MAC, checked (the verdict is cached: the check before finalizing finds
    /// it). Nothing is sent or decided here.
    fn work_ahead(&mut self) {
        let Some((_, view, digest)) = self.ahead.take() else { return };
        let Some(me) = self.me else { return };
        if self.notarized.contains_key(&view) {
            return; // finalized on already (or not to be)
        }
        let leader = self.leader(view);
        if let Some(v) = self.unchecked.get(&(view, VoteKind::Notarize, leader)) {
            let _ = v.verify(&self.genesis, &self.keys, &self.cfg.sig_cache);
        }
        let s = self.views.get(&view);
        if s.is_some_and(|s| s.my_nullify.is_none() && s.my_finalize.is_none()) {
            let vote = Vote::sign(&self.key, &self.genesis, me, VoteKind::Finalize, view, digest, self.root);
            vote.remember_valid(&self.genesis, &self.keys, &self.cfg.sig_cache);
            self.presigned = Some(vote);
        }
    }

    /// A vote for a (view, kind, digest) already certified here, from a signer with no other
    /// vote of that kind in the view: it cannot change what this validator does (only its root
    /// report and a later equivocation need it), so verifying it can wait.
    fn is_late(&self, v: &Vote) -> bool {
        self.certified(v.kind).get(&v.view).is_some_and(|c| c.digest == v.digest)
            && self
                .views
                .get(&v.view)
                .and_then(|s| s.first.get(&(v.kind, v.signer)))
                .is_none_or(|first| first.digest == v.digest)
    }

    /// Verify the late votes and take in the valid ones (root reports, evidence).
    fn verify_late(&mut self, now: Micros) {
        self.late_due = None;
        for v in std::mem::take(&mut self.late) {
            if self.vote_ok(&v) {
                self.on_vote(now, v);
            }
        }
    }

    /// Remember a signer's first vote of each kind in a view; a second, different one is
    /// evidence of equivocation (reported, and not counted).
    fn conflicts(&mut self, vote: &Vote) -> bool {
        let s = self.views.entry(vote.view).or_default();
        match s.first.get(&(vote.kind, vote.signer)) {
            Some(first) if first.digest != vote.digest => {
                let e = Evidence { first: first.clone(), second: vote.clone() };
                self.out.push_back(Output::Evidence(Box::new(e)));
                true
            }
            Some(_) => false,
            None => {
                s.first.insert((vote.kind, vote.signer), vote.clone());
                false
            }
        }
    }

    fn note_root(&mut self, from: ValidatorIndex, r: RootReport) {
        if let Some(mine) = self.my_roots.get(&r.tick)
            && *mine != r.root
        {
            self.out.push_back(Output::RootMismatch { tick: r.tick, mine: *mine, theirs: r.root, validator: from });
        }
        let oldest = self.my_roots.first_key_value().map_or(0, |(t, _)| *t);
        if r.tick >= oldest {
            self.peer_roots.entry(r.tick).or_default().insert(from, r.root);
            while self.peer_roots.len() > 512 {
                self.peer_roots.pop_first();
            }
        }
    }

    fn on_certificate(&mut self, now: Micros, c: Certificate) {
        let known = self.certified(c.kind).contains_key(&c.view);
        if c.view.0 > self.view.0 + FUTURE_VIEWS || c.view < self.tip.0 {
            return;
        }
        if known {
            // Already certified here: only a vote that contradicts one we hold needs checking,
            // as evidence (a leader's other proposal shows up this way).
            for v in &c.votes {
                let differs = self
                    .views
                    .get(&v.view)
                    .and_then(|s| s.first.get(&(v.kind, v.signer)))
                    .is_some_and(|first| first.digest != v.digest);
                if differs && v.verify(&self.genesis, &self.keys, &self.cfg.sig_cache) {
                    let _ = self.conflicts(v);
                }
            }
            return;
        }
        let c = self.with_own_vote(c);
        if !self.holds_checked(&c) && c.verify(&self.genesis, &self.keys, self.quorum, &self.cfg.sig_cache).is_err() {
            return;
        }
        for v in &c.votes {
            let _ = self.conflicts(v);
        }
        self.on_certified(now, c);
    }

    /// A certificate without this validator's vote, when it cast the same one: its own vote
    /// takes the place of one of the others, one signature fewer to check (a validator behind
    /// its peers gets their certificate before it has its own quorum, and checked all three
    /// signatures of it).
    fn with_own_vote(&self, mut c: Certificate) -> Certificate {
        let Some(me) = self.me else { return c };
        let Some(s) = self.views.get(&c.view) else { return c };
        let mine = match c.kind {
            VoteKind::Notarize => &s.my_notarize,
            VoteKind::Nullify => &s.my_nullify,
            VoteKind::Finalize => &s.my_finalize,
        };
        let Some(mine) = mine.as_ref().filter(|v| v.digest == c.digest) else { return c };
        if c.votes.iter().any(|v| v.signer == me) || c.votes.len() < self.quorum {
            return c;
        }
        c.votes.truncate(self.quorum - 1);
        c.votes.insert(0, mine.clone());
        c
    }

    /// A certificate is new and valid: record it, pass it on, and act (R3–R5).
    fn on_certified(&mut self, now: Micros, c: Certificate) {
        let view = c.view;
        match c.kind {
            VoteKind::Notarize => {
                if self.notarized.contains_key(&view) {
                    return;
                }
                self.notarized.insert(view, c.clone());
                self.pass_on(&c);
                if self.has_unchecked(&c) {
                    // R3 finalizes on a notarization, and a validator that finalized a view never
                    // nullifies it: on one counted on a forged vote's MAC, the view could then be
                    // neither notarized (the forger withholds a good vote, an honest validator
                    // refused its proposal) nor nullified, and no later view could be built on
                    // (found by the seed sweep, seed 1001817). So its signatures are checked now.
                    self.check_unchecked(now);
                    if self.notarized.get(&view).is_none_or(|n| n.digest != c.digest) {
                        return; // it fell apart: formed again when a good vote comes
                    }
                }
                if !self.blocks.contains_key(&c.digest) {
                    self.fetch_soon(now, c.digest);
                }
                // R3: seeing the notarization, finalize unless this view timed out, and move on.
                let s = self.views.entry(view).or_default();
                // (Safe for any view: finalize and nullify quorums would meet in an honest
                // validator that did both, which never happens.)
                if let Some(me) = self.me
                    && s.my_nullify.is_none()
                    && s.my_finalize.is_none()
                {
                    let fin = self.sign(me, VoteKind::Finalize, view, c.digest);
                    let s = self.views.entry(view).or_default();
                    s.my_finalize = Some(fin.clone());
                    self.out.push_back(Output::Broadcast(Message::Vote(fin.clone())));
                    self.on_vote(now, fin);
                }
                self.enter_view(now, view.next());
            }
            VoteKind::Nullify => {
                if self.nullified.contains_key(&view) {
                    return;
                }
                self.nullified.insert(view, c.clone());
                self.pass_on(&c);
                // More than f views in a row without a finalization: not only faulty leaders'.
                if view.0.saturating_sub(self.tip.0.0) > self.f() as u64 && self.patience < MAX_PATIENCE {
                    self.patience += 1;
                    self.calm = 0;
                }
                self.enter_view(now, view.next());
            }
            VoteKind::Finalize => {
                if self.finalized.contains_key(&view) {
                    return;
                }
                self.finalized.insert(view, c.clone());
                self.finalized_at = now;
                self.out.push_back(Output::Finalized { view, digest: c.digest });
                self.pass_on(&c);
                if view > self.tip.0 {
                    self.tip = (view, c.digest);
                    self.calm += 1;
                    if self.calm >= CALM_VIEWS && self.patience > 0 {
                        self.patience -= 1;
                        self.calm = 0;
                    }
                }
                if !self.blocks.contains_key(&c.digest) {
                    self.fetch_soon(now, c.digest);
                }
                self.enter_view(now, view.next());
                self.advance_commits(now);
            }
        }
    }

    /// Pass a new certificate on to the others, or, if it holds votes whose signatures are
    /// not checked yet, once they are (a certificate that leaves is always verifiable).
    fn pass_on(&mut self, c: &Certificate) {
        if self.has_unchecked(c) {
            self.provisional.push((c.kind, c.view));
        } else {
            self.out.push_back(Output::Broadcast(Message::Certificate(c.clone())));
        }
    }

    fn enter_view(&mut self, now: Micros, view: View) {
        if view <= self.view {
            return;
        }
        self.view = view;
        self.view_started = now;
        self.last_retry = now;
        if let Some((b, v, n)) = self.buffered.remove(&view) {
            self.on_proposal(now, b.leader, b, v, n);
        }
        self.buffered.retain(|w, _| *w > view);
        self.try_propose(now);
    }

    // ---- fetching and committing ----

    /// A block neither known, nor asked for, nor the root.
    fn wanted(&self, d: &Digest) -> bool {
        *d != self.genesis && *d != self.root_parent() && !self.blocks.contains_key(d) && !self.fetching.contains_key(d)
    }

    fn fetch(&mut self, now: Micros, d: Digest) {
        if !self.wanted(&d) {
            return;
        }
        self.fetching.insert(d, now + self.cfg.retry_us);
        self.out.push_back(Output::Broadcast(Message::Fetch(d)));
    }

    /// Ask for a block certified here before its proposal arrived, unless the proposal comes
    /// within a quarter period: the leader's proposal is sent before anyone votes for it, but
    /// a big one can arrive after the votes, and asking at once would send it twice.
    fn fetch_soon(&mut self, now: Micros, d: Digest) {
        if !self.wanted(&d) {
            return;
        }
        self.fetching.insert(d, now + self.cfg.period_us / 4);
    }

    fn on_fetched(
        &mut self,
        now: Micros,
        block: Block,
        notarization: Option<Certificate>,
        leader_vote: Option<Box<Vote>>,
    ) {
        let ids = event_ids(&block.events);
        let d = block.digest_with_ids(&ids);

        if self.fetching.remove(&d).is_none() {
            return; // unsolicited
        }
        if let Some(c) = notarization {
            self.on_certificate(now, c);
        }
        if block.parent.view != View(0) && d != self.root_parent() && !self.blocks.contains_key(&block.parent.digest) {
            self.fetch(now, block.parent.digest);
        }
        let stored = Stored::with_ids(block, ids);
        self.blocks.insert(d, stored.clone());
        let leader = stored.block.leader;
        if let Some(Incomplete { vote, nulls, .. }) = self.incomplete.remove(&d) {
            // The block of a compact proposal this validator could not rebuild.
            self.on_proposal(now, leader, (*stored.block).clone(), vote, nulls);
        } else if let Some(vote) = leader_vote
            .filter(|v| v.kind == VoteKind::Notarize && v.view == self.view && v.digest == d && v.signer == leader)
            && self.views.get(&self.view).is_none_or(|s| s.proposal.is_none())
        {
            // A proposal of the current view whose copy to this validator was lost (others'
            // votes for it named it, see `on_vote`): taken as it came, with its leader's vote.
            self.on_proposal(now, leader, (*stored.block).clone(), *vote, Vec::new());
        }
        if let Some((view, _)) =
            self.buffered.iter().find(|(_, (b, _, _))| b.parent.digest == d).map(|(v, x)| (*v, x.0.view))
            && view == self.view
            && let Some((b, v, n)) = self.buffered.remove(&view)
        {
            self.on_proposal(now, b.leader, b, v, n);
        }
        self.advance_commits(now);
    }

    /// Output every block whose committed child is known, in tick order (R5). A block is
    /// committed when it or a descendant is finalized; its seed comes from the certificate
    /// its child embeds, so the newest finalized block waits for its child.
    fn advance_commits(&mut self, now: Micros) {
        if self.held {
            self.prune();
            return;
        }
        let (tip_view, tip) = self.tip;
        if tip_view == View(0) {
            return;
        }
        let Some(fin) = self.finalized.get(&tip_view).cloned() else { return };
        if self.has_unchecked(&fin) {
            // Committed once its votes' signatures are checked (`check_unchecked`).
            return;
        }
        // Walk back from the tip to the last output block, collecting the chain.
        let mut chain = Vec::new();
        let mut d = tip;
        loop {
            let Some(s) = self.blocks.get(&d) else {
                self.fetch(now, d);
                return;
            };
            if self.output_tick.is_some_and(|t| s.block.tick <= t) {
                break;
            }
            chain.push((d, s.clone()));
            let anchored = self.cfg.anchor.is_some();
            if (anchored && d == self.root_parent()) || (!anchored && s.block.parent.view == View(0)) {
                break;
            }
            d = s.block.parent.digest;
        }
        chain.reverse();
        for pair in chain.windows(2) {
            let ((digest, stored), (_, child)) = (&pair[0], &pair[1]);
            let Some(certificate) = child.block.parent_certificate.clone() else { return };
            let seed = seed_of(digest, &certificate);
            let block = &stored.block;
            // The pool forgets these events with the held bulk work: at the next input, or
            // once the view in flight is finalized (see `schedule_bulk`).
            self.settle_later.push((block.tick, *digest, stored.ids.clone()));
            self.output_tick = Some(block.tick);
            self.out.push_back(Output::Committed(Box::new(Commit {
                block: (**block).clone(),
                digest: *digest,
                certificate,
                seed,
                finalization: fin.clone(),
            })));
        }
        if chain.is_empty() {
            self.prune();
        }
        // Otherwise pruned with the held bulk work (`settle`): once `keep_bytes` are held, each
        // commit drops the oldest block and frees its thousand events, cold in memory, and in
        // the input that finalized that cost ~13 µs on average and stalls of milliseconds
        // (`bench agreement` at 1,000 events a tick, from ~26 s into a run: steady-state p50
        // 0.56-0.59 ms and p99 2.6-2.7 ms with it there, 0.48-0.50 and 0.88-1.10 without).
    }

    /// Let the pool forget the events of blocks committed since the last input, and drop the
    /// blocks beyond what is kept (see `advance_commits`). Whoever settles prunes: with the
    /// held bulk work, or a leader's batch that must leave out what was just committed.
    fn settle(&mut self) {
        let committed = !self.settle_later.is_empty();
        for (tick, digest, ids) in std::mem::take(&mut self.settle_later) {
            if self.prepared.as_ref().is_some_and(|p| !p.ancestors.contains(&digest)) {
                // Committed off the prepared batch's chain (or a block it did not know of):
                // the batch may hold these events.
                self.prepared = None;
            }
            self.pool.committed(tick, &ids, self.cfg.dedup_window_ticks);
        }
        if committed {
            self.prune();
        }
    }

    fn prune(&mut self) {
        // (A joining node that outputs nothing yet keeps the newest blocks only.)
        let newest = || self.held.then(|| self.blocks.newest_tick()).flatten();
        let Some(out) = self.output_tick.or_else(newest) else { return };
        let keep_from = out.saturating_sub(self.cfg.keep_blocks);
        self.blocks.prune_below(keep_from);
        self.blocks.prune_to_budget(self.cfg.keep_bytes, out.saturating_sub(self.cfg.keep_blocks_min));
        let tip_view = self.tip.0;
        let horizon = View(tip_view.0.saturating_sub(64));
        self.views.retain(|v, _| *v >= horizon);
        self.notarized.retain(|v, _| *v >= horizon);
        self.nullified.retain(|v, _| *v >= horizon);
        self.finalized.retain(|v, _| *v >= horizon);
        self.incomplete.retain(|_, x| x.header.view >= horizon);
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
mod tests {
    use super::*;
    use crate::types::event_id;

    const PERIOD: Micros = 50_000;

    fn four() -> Vec<Validator> {
        let keys: Vec<SigningKey> = (0..4u8).map(|i| SigningKey::from_bytes(&[i + 1; 32])).collect();
        let vks: Vec<VerifyingKey> = keys.iter().map(|k| k.verifying_key()).collect();
        let cfg = Config {
            period_us: PERIOD,
            leader_timeout_us: 10_000_000,
            notarize_timeout_us: 20_000_000,
            retry_us: 10_000_000,
            ..Config::default()
        };
        keys.into_iter().map(|k| Validator::new(cfg.clone(), k, vks.clone(), 0)).collect()
    }

    /// Deliver every message until quiet (firing timers due at `now` first); the proposals seen.
    fn run(vs: &mut [Validator], now: Micros) -> Vec<(Block, Vec<Digest>)> {
        for v in vs.iter_mut() {
            if v.poll_timeout().is_some_and(|t| t <= now) {
                v.handle_timeout(now);
            }
        }
        let mut proposals = Vec::new();
        loop {
            let mut mail = Vec::new();
            for (i, v) in vs.iter_mut().enumerate() {
                while let Some(o) = v.poll_output() {
                    match o {
                        Output::Broadcast(m) => mail.extend((0..4).filter(|j| *j != i).map(|j| (i, j, m.clone()))),
                        Output::Send(to, m) => mail.push((i, to.0 as usize, m)),
                        _ => {}
                    }
                }
            }
            if mail.is_empty() {
                return proposals;
            }
            for (from, to, m) in mail {
                if to == (from + 1) % 4
                    && let Some(p) = compact(&vs[from], &m)
                {
                    proposals.push(p);
                }
                vs[to].handle_message(now, ValidatorIndex(from as u16), m);
            }
        }
    }

    /// A compact proposal's header and ids (those of a proposal by runs, from its leader `v`).
    fn compact(v: &Validator, m: &Message) -> Option<(Block, Vec<Digest>)> {
        let Message::Authenticated { inner, .. } = m else { return None };
        match &**inner {
            Signed::ProposeIds { block, ids, .. } => Some((block.clone(), ids.clone())),
            Signed::ProposeRefs { block, vote, .. } => {
                Some((block.clone(), (*v.blocks.get(&vote.digest)?.ids).clone()))
            }
            _ => None,
        }
    }

    /// Everything a validator sent since last asked: (broadcast?, recipient, message).
    fn sent(v: &mut Validator) -> Vec<Message> {
        let mut out = Vec::new();
        while let Some(o) = v.poll_output() {
            if let Output::Broadcast(m) | Output::Send(_, m) = o {
                out.push(m);
            }
        }
        out
    }

    fn gossip_in(ms: &[Message]) -> Vec<EventBytes> {
        ms.iter().filter_map(|m| if let Message::Events(es) = m { Some(es.clone()) } else { None }).flatten().collect()
    }

    /// Four validators with view 1 proposed and voted for by one follower only, `f`, for whom it
    /// is then in flight: (validators, leader, f, another follower, the proposal, f's vote).
    fn in_flight_at_one() -> (Vec<Validator>, usize, usize, usize, Message, Vec<Message>) {
        let mut vs = four();
        run(&mut vs, 0);
        let lead = vs[0].leader(View(1)).0 as usize;
        let (f, g) = ((lead + 1) % 4, (lead + 2) % 4);
        vs[lead].handle_timeout(PERIOD);
        let proposal = sent(&mut vs[lead]);
        assert_eq!(proposal.len(), 1, "view 1 proposed");
        assert!(!vs[f].busy());
        vs[f].handle_message(PERIOD, ValidatorIndex(lead as u16), proposal[0].clone());
        let vote = sent(&mut vs[f]);
        assert!(vs[f].busy(), "voted for view 1, not finalized");
        (vs, lead, f, g, proposal[0].clone(), vote)
    }

    /// While a view it voted for is in flight, a validator holds back taking in events (a
    /// peer's gossip, its clients'): they are pooled, and its clients' passed on, a
    /// thirty-second of a period after the view is finalized, or at the latest an eighth of a
    /// period after they came.
    #[test]
    fn events_wait_while_a_view_is_in_flight_and_are_pooled_after_it_is_finalized_or_after_max_hold() {
        let ev = |s: &str| -> EventBytes { s.as_bytes().into() };
        for finalize in [true, false] {
            let (mut vs, lead, f, g, proposal, vote) = in_flight_at_one();
            let before = vs[f].pool_len();
            vs[f].handle_message(PERIOD + 1, ValidatorIndex(g as u16), Message::Events(vec![ev("gossiped")]));
            vs[f].submit_events(PERIOD + 2, vec![ev("client")]);
            assert_eq!(vs[f].pool_len(), before, "held");
            assert!(gossip_in(&sent(&mut vs[f])).is_empty(), "not passed on yet");
            let max_hold = PERIOD / 8;
            assert_eq!(vs[f].bulk_due, Some(PERIOD + 1 + max_hold), "due at the latest max_hold after");
            assert!(vs[f].poll_timeout().is_some_and(|t| t <= PERIOD + 1 + max_hold));
            if finalize {
                // The others get the proposal and f's vote: view 1 is finalized everywhere.
                let now = PERIOD + 3;
                for (_, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != lead && *i != f) {
                    v.handle_message(now, ValidatorIndex(lead as u16), proposal.clone());
                }
                for (_, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != f) {
                    for m in &vote {
                        v.handle_message(now, ValidatorIndex(f as u16), m.clone());
                    }
                }
                run(&mut vs, now);
                assert!(vs[f].finalized.contains_key(&View(1)) && !vs[f].busy());
                // Done after_final later (the others may still be finalizing), its client's
                // event passed on.
                let after_final = PERIOD / 32;
                assert_eq!(vs[f].bulk_due, Some(now + after_final), "due after_final after the finalization");
                run(&mut vs, now + after_final - 1);
                assert_eq!(vs[f].pool_len(), before, "not yet");
                run(&mut vs, now + after_final);
                assert!(vs[g].pool.get(&event_id(b"client")).is_some(), "passed on once pooled");
            } else {
                vs[f].handle_timeout(PERIOD + 1 + max_hold - 1);
                assert_eq!(vs[f].pool_len(), before, "not yet");
                vs[f].handle_timeout(PERIOD + 1 + max_hold);
                assert!(vs[f].busy(), "view 1 still in flight");
                assert_eq!(gossip_in(&sent(&mut vs[f])), vec![ev("client")]);
            }
            assert_eq!(vs[f].pool_len(), before + 2, "both pooled");
            assert!(vs[f].bulk.is_empty() && vs[f].bulk_due.is_none());
        }
    }

    /// A validator holds back no more events than its pool takes: a peer flooding it with
    /// gossip while a view is in flight has them pooled (and bounded) at once.
    #[test]
    fn held_events_beyond_what_the_pool_takes_are_pooled_at_once() {
        let (mut vs, _, f, g, ..) = in_flight_at_one();
        vs[f].cfg.max_pool_events = 5;
        let batch = |k: u32| Message::Events((0..3).map(|i| format!("flood {k} {i}").into_bytes().into()).collect());
        vs[f].handle_message(PERIOD + 1, ValidatorIndex(g as u16), batch(0));
        assert_eq!((vs[f].bulk.len(), vs[f].pool_len()), (1, 0), "3 held");
        vs[f].handle_message(PERIOD + 2, ValidatorIndex(g as u16), batch(1));
        assert!(vs[f].bulk.is_empty(), "6 held would be more than the pool takes");
        assert_eq!(vs[f].pool_len(), 5, "pooled up to its bound");
        assert!(vs[f].busy());
    }

    /// [`run`] with every message to `skip` kept back (and returned) instead of delivered.
    fn run_but(vs: &mut [Validator], now: Micros, skip: usize) -> Vec<Message> {
        for (i, v) in vs.iter_mut().enumerate() {
            if i != skip && v.poll_timeout().is_some_and(|t| t <= now) {
                v.handle_timeout(now);
            }
        }
        let mut kept = Vec::new();
        loop {
            let mut mail = Vec::new();
            for (i, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != skip) {
                for m in sent(v) {
                    mail.extend((0..4).filter(|j| *j != i).map(|j| (i, j, m.clone())));
                }
            }
            if mail.is_empty() {
                return kept;
            }
            for (from, to, m) in mail {
                if to == skip {
                    kept.push(m);
                } else {
                    vs[to].handle_message(now, ValidatorIndex(from as u16), m);
                }
            }
        }
    }

    /// A compact proposal naming events this validator holds back (gossip that came while its
    /// last view was in flight) is rebuilt at once: the held events are pooled first, and it
    /// votes without waiting for a fetch.
    #[test]
    fn a_compact_proposal_of_held_events_takes_them_in_and_is_voted_for_at_once() {
        let mut vs = four();
        run(&mut vs, 0);
        let lead1 = vs[0].leader(View(1)).0 as usize;
        let lead2 = vs[0].leader(View(2)).0 as usize;
        let f = (0..4).find(|i| *i != lead1 && *i != lead2).expect("a follower of both");
        let g = (0..4).find(|i| *i != lead1 && *i != lead2 && *i != f).expect("another");
        // f votes for view 1; the event a client gives g reaches f while that view is in flight.
        vs[lead1].handle_timeout(PERIOD);
        let p1 = sent(&mut vs[lead1]);
        vs[f].handle_message(PERIOD, ValidatorIndex(lead1 as u16), p1[0].clone());
        let f_vote = sent(&mut vs[f]);
        vs[g].submit_events(PERIOD + 1, vec![b"held".to_vec()]);
        let gossip = sent(&mut vs[g]);
        vs[f].handle_message(PERIOD + 1, ValidatorIndex(g as u16), gossip[0].clone());
        assert_eq!(vs[f].bulk.len(), 1, "held");
        for (i, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != f && *i != g) {
            v.handle_message(PERIOD + 1, ValidatorIndex(g as u16), gossip[0].clone());
            if i != lead1 {
                v.handle_message(PERIOD + 1, ValidatorIndex(lead1 as u16), p1[0].clone());
            }
        }
        vs[g].handle_message(PERIOD + 1, ValidatorIndex(lead1 as u16), p1[0].clone());
        for (_, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != f) {
            v.handle_message(PERIOD + 1, ValidatorIndex(f as u16), f_vote[0].clone());
        }
        // The others finalize view 1; f sees its notarization only, and enters view 2 with view
        // 1 still in flight.
        let to_f = run_but(&mut vs, PERIOD + 1, f);
        for m in to_f.iter().filter(|m| m.vote().is_some_and(|v| v.kind == VoteKind::Notarize && v.view == View(1))) {
            let from = m.vote().expect("a vote").signer;
            vs[f].handle_message(PERIOD + 2, from, m.clone());
        }
        assert_eq!(vs[f].view(), View(2));
        assert!(vs[f].busy() && !vs[f].bulk.is_empty());
        let _ = sent(&mut vs[f]);
        // View 2's leader proposes the held event (pooled there a period before).
        let to_f = run_but(&mut vs, 2 * PERIOD, f);
        let lead2 = vs[0].leader(View(2)).0 as usize;
        let p2 = to_f.iter().find(|m| compact(&vs[lead2], m).is_some()).expect("view 2 proposed");
        let (_, ids) = compact(&vs[lead2], p2).expect("compact");
        assert_eq!(ids, vec![event_id(b"held")]);
        // Named as a run of the gossip batch it came in, which f holds back.
        let Message::Authenticated { inner, .. } = p2 else { unreachable!() };
        assert!(
            matches!(&**inner, Signed::ProposeRefs { pieces, .. } if matches!(pieces[..], [Piece::Run { len: 1, .. }]))
        );
        // f takes it before the held work is due.
        assert!(vs[f].bulk_due.is_some_and(|due| PERIOD + 3 < due));
        vs[f].handle_message(PERIOD + 3, ValidatorIndex(lead2 as u16), p2.clone());
        assert!(vs[f].bulk.is_empty() && vs[f].incomplete.is_empty() && vs[f].fetching.is_empty());
        let votes: Vec<Vote> = sent(&mut vs[f]).iter().filter_map(|m| m.vote().cloned()).collect();
        assert!(votes.iter().any(|v| v.kind == VoteKind::Notarize && v.view == View(2)), "voted for view 2");
    }

    /// A leader proposes the events pooled at least a sixteenth of a period before: later ones
    /// wait for the next block, so that the others have their gossip when its compact
    /// proposal comes and need not wait for it to vote.
    #[test]
    fn a_leader_leaves_events_pooled_in_the_last_sixteenth_of_a_period_to_the_next_block() {
        let ev = |s: &str| s.as_bytes().to_vec();
        let mut vs = four();
        run(&mut vs, 0);
        let lead = vs[0].leader(View(1)).0 as usize;
        let fresh_by = PERIOD - PERIOD / 16;
        vs[lead].submit_events(fresh_by, vec![ev("old enough")]);
        vs[lead].submit_events(fresh_by + 1, vec![ev("fresh")]);
        run(&mut vs, fresh_by + 1);
        let p1 = run(&mut vs, PERIOD);
        assert_eq!(p1.len(), 1, "view 1 proposed");
        assert_eq!(p1[0].1, vec![event_id(b"old enough")]);
        let p2 = run(&mut vs, 2 * PERIOD);
        assert_eq!(p2.len(), 1, "view 2 proposed, by another leader");
        assert_ne!(p2[0].0.leader.0 as usize, lead);
        assert_eq!(p2[0].1, vec![event_id(b"fresh")]);
    }

    /// A validator that timed out its view alone (no peer heard it) and was restored counts its
    /// own nullify vote again: with one validator down, the view needs it and both others'.
    #[test]
    fn a_restored_validator_counts_its_own_votes_and_describes_where_it_stands() {
        let mut vs = four();
        let v = &mut vs[2]; // not view 1's leader
        let view = v.view;
        v.handle_timeout(10_000_001);
        while v.poll_output().is_some() {}
        let mine = format!("view {}: mine .X., certs ..., proposal no, votes n[] x1 f0", view.0);
        let said = v.describe();
        assert!(said.starts_with(&format!("view {} (leader {})", view.0, v.leader(view).0)), "{said}");
        assert!(said.contains(&mine), "{said}");
        let restored = Validator::restore(v.cfg.clone(), v.key.clone(), v.keys.clone(), 20_000_000, &v.persist())
            .expect("its own state");
        let said = restored.describe();
        assert!(said.contains(&mine), "restored without its own vote counted: {said}");
        assert_eq!(restored.views[&view].nullify.keys().copied().collect::<Vec<_>>(), vec![ValidatorIndex(2)]);
    }

    #[test]
    fn a_leader_builds_its_next_batch_as_events_arrive_and_proposes_it_without_its_parents_events() {
        let mut vs = four();
        let ev = |s: &str| s.as_bytes().to_vec();
        let first: Vec<Vec<u8>> = (0..3).map(|i| ev(&format!("first {i}"))).collect();
        vs[1].submit_events(0, first.clone());
        run(&mut vs, 0);
        // View 1 is proposed and notarized: view 2's leader knows its parent and starts its batch
        // at its next input, without view 1's events (pooled, not committed yet).
        let p1 = run(&mut vs, PERIOD);
        assert_eq!(p1.len(), 1, "view 1 proposed");
        assert_eq!(p1[0].1, first.iter().map(|e| event_id(e)).collect::<Vec<_>>());
        let lead2 = vs[0].leader(View(2)).0 as usize;
        let second: Vec<Vec<u8>> = (0..5).map(|i| ev(&format!("second {i}"))).collect();
        // Not in the first eighth of the view (the others are still finalizing view 1 then).
        let later = PERIOD + PERIOD / 8;
        vs[lead2].submit_events(PERIOD + 1, Vec::<Vec<u8>>::new());
        assert!(vs[lead2].prepared.is_none(), "no batch started while view 1 is being finalized");
        // Two events arrive at another validator (gossiped to the leader), then three more and a
        // late copy of one of view 1's events at the leader itself.
        vs[(lead2 + 1) % 4].submit_events(later, second[..2].to_vec());
        run(&mut vs, later);
        let prepared = vs[lead2].prepared.as_ref().expect("the leader started its next batch");
        assert_eq!(prepared.batch.events.len(), 2);
        let mut more = second[2..].to_vec();
        more.push(first[1].clone());
        vs[lead2].submit_events(later + 1, more);
        assert_eq!(vs[lead2].prepared.as_ref().expect("still").batch.events.len(), 5);
        // The proposal is the prepared batch, taken whole.
        let p2 = run(&mut vs, 2 * PERIOD);
        assert!(vs[lead2].prepared.is_none(), "taken by the proposal");
        assert_eq!(p2.len(), 1, "view 2 proposed");
        assert_eq!(p2[0].0.view, View(2));
        assert_eq!(p2[0].1, second.iter().map(|e| event_id(e)).collect::<Vec<_>>());
        // And what the pool would give for that parent is the same.
        let (_, exclude) = vs[lead2].uncommitted(&p2[0].0.parent);
        let exclude: Vec<&[Digest]> = exclude.iter().map(|l| l.as_slice()).collect();
        assert_eq!(vs[lead2].pool.batch(1_000, 1 << 20, &exclude).ids, p2[0].1);
    }

    /// A leader names its events as runs of the gossip batches they came in while those are
    /// recent, and by id once a batch is older than the newest half of what it keeps (the
    /// others may have dropped it); the others rebuild the block either way.
    #[test]
    fn a_leader_names_events_of_old_batches_by_id_and_of_recent_ones_by_runs() {
        let mut vs = four();
        for v in &mut vs {
            // Blocks of 4 events; batches kept up to 16 events, named while within the newest 8.
            v.cfg.max_batch_events = 4;
            v.pool = Pool::with_batches(&[9; 32], 16, 1 << 20);
        }
        let lead = vs[0].leader(View(1)).0 as usize;
        let ev = |s: String| s.into_bytes();
        // Batch A (3 events), then three batches of 3 after it: 9 events stored after A, so A
        // is no longer recent; 6 or fewer after each of the others.
        vs[lead].submit_events(0, (0..3).map(|i| ev(format!("a {i}"))).collect());
        for k in 0..3 {
            vs[(lead + 1 + k % 3) % 4].submit_events(0, (0..3).map(|i| ev(format!("b{k} {i}"))).collect());
        }
        run(&mut vs, 0);
        // The leader's proposal, as sent.
        vs[lead].handle_timeout(PERIOD);
        let out = sent(&mut vs[lead]);
        let proposal = out.iter().find(|m| m.kind() == "propose").expect("view 1 proposed").clone();
        let Message::Authenticated { inner, .. } = &proposal else { panic!("authenticated") };
        let Signed::ProposeRefs { pieces, vote, .. } = &**inner else { panic!("by refs: {inner:?}") };
        let a: Vec<Digest> = (0..3).map(|i| event_id(format!("a {i}").as_bytes())).collect();
        assert!(matches!(&pieces[..], [Piece::Ids(ids), Piece::Run { len: 1, .. }] if *ids == a), "{pieces:?}");
        for m in out {
            for j in (0..4).filter(|j| *j != lead) {
                vs[j].handle_message(PERIOD, ValidatorIndex(lead as u16), m.clone());
            }
        }
        run(&mut vs, PERIOD);
        for (i, v) in vs.iter().enumerate() {
            assert!(v.finalized.values().any(|c| c.digest == vote.digest), "validator {i} finalized it");
        }
    }

    /// Where a validator pools events (off the commit's path) it makes room for the next
    /// proposal's ids and events, as many as the recent blocks held and an eighth more, and a
    /// follower rebuilds the compact proposal into it; a proposal larger than the room gets
    /// memory of its own, and the room stays.
    #[test]
    fn a_follower_rebuilds_a_compact_proposal_into_room_made_before_it_came() {
        let mut vs = four();
        let ev = |s: String| s.into_bytes();
        // Tick 1: 16 events, four batches of four.
        for (k, v) in vs.iter_mut().enumerate() {
            v.submit_events(0, (0..4).map(|i| ev(format!("one {k} {i}"))).collect());
        }
        run(&mut vs, 0);
        assert!(vs.iter().all(|v| v.spare.ids.capacity() == 0), "no room before a block held events");
        let mut proposed = run(&mut vs, PERIOD);
        assert_eq!(proposed.pop().map(|(_, ids)| ids.len()), Some(16));
        // Tick 2's events: pooled, and the room made.
        for (k, v) in vs.iter_mut().enumerate() {
            v.submit_events(PERIOD + 10, (0..4).map(|i| ev(format!("two {k} {i}"))).collect());
        }
        run(&mut vs, PERIOD + 10);
        for v in &vs {
            assert_eq!((v.spare.ids.capacity(), v.spare.events.capacity()), (18, 18), "16 and an eighth");
        }
        let lead = vs[0].leader(vs[0].view()).0 as usize;
        vs[lead].handle_timeout(2 * PERIOD);
        let out = sent(&mut vs[lead]);
        let proposal = out.iter().find(|m| m.kind() == "propose").expect("view 2 proposed").clone();
        let digest = proposal.vote().expect("the leader's vote").digest;
        let f = (lead + 1) % 4;
        vs[f].handle_message(2 * PERIOD, ValidatorIndex(lead as u16), proposal.clone());
        let stored = vs[f].blocks.get(&digest).expect("rebuilt");
        assert_eq!(stored.ids.len(), 16);
        assert_eq!((stored.ids.capacity(), stored.block.events.capacity()), (18, 18), "in the room");
        assert_eq!(vs[f].spare.ids.capacity(), 0, "taken");
        // A proposal larger than the room: rebuilt all the same, and the next room is made.
        let g = (lead + 2) % 4;
        vs[g].spare = Spare::with_room(8);
        vs[g].handle_message(2 * PERIOD, ValidatorIndex(lead as u16), proposal.clone());
        let stored = vs[g].blocks.get(&digest).expect("rebuilt");
        assert_eq!(stored.ids.len(), 16);
        assert_eq!(vs[g].spare.ids.capacity(), 8, "the room stays");
        // f's next events wait while its view is in flight, and are pooled (the room made) once
        // the view is finalized.
        vs[f].submit_events(2 * PERIOD + 10, vec![ev("three".to_string())]);
        assert_eq!(vs[f].spare.ids.capacity(), 0, "not while the view is in flight");
        for j in (0..4).filter(|j| *j != lead && *j != f && *j != g) {
            vs[j].handle_message(2 * PERIOD + 10, ValidatorIndex(lead as u16), proposal.clone());
        }
        run(&mut vs, 2 * PERIOD + 10);
        assert!(vs[f].finalized.values().any(|c| c.digest == digest));
        run(&mut vs, 2 * PERIOD + 10 + PERIOD / 32);
        assert_eq!(vs[f].spare.ids.capacity(), 18, "made again");
    }

    #[test]
    fn committed_blocks_are_kept_for_keep_blocks_ticks_then_dropped() {
        const KEEP: u64 = 8;
        let mut vs = four();
        for v in &mut vs {
            v.cfg.keep_blocks = KEEP;
        }
        let mut proposed = 0;
        for k in 0..40u64 {
            vs[(k % 4) as usize].submit_events(k * PERIOD, vec![format!("event {k}").into_bytes()]);
            proposed += run(&mut vs, k * PERIOD).len();
        }
        assert!(proposed >= 38, "the chain went on: {proposed} proposals");
        for v in &vs {
            let out = v.output_tick.expect("ticks were output");
            assert!(out >= 30, "output up to tick {out}");
            let ticks: Vec<u64> = v.blocks.values().map(|s| s.block.tick).collect();
            let index: Vec<u64> = v.blocks.by_tick.iter().map(|(t, _)| *t).collect();
            assert_eq!(v.blocks.by_tick.len(), v.blocks.len(), "one index entry per block");
            assert!(v.blocks.by_tick.iter().all(|(t, d)| v.blocks[d].block.tick == *t));
            // Every block from `keep_blocks` below the output tick up is kept; none older.
            let oldest = *index.first().expect("blocks are kept");
            assert_eq!(oldest, out - KEEP, "{ticks:?}");
            assert!((oldest..=out).all(|t| ticks.contains(&t)), "{ticks:?}");
            assert!(v.blocks.len() as u64 <= KEEP + 4, "{} blocks held", v.blocks.len());
        }
    }

    #[test]
    fn a_restored_validator_recalls_the_blocks_it_handed_out_from_its_commit_log() {
        let mut vs = four();
        for k in 0..30u64 {
            vs[(k % 4) as usize].submit_events(k * PERIOD, vec![format!("event {k}").into_bytes()]);
            run(&mut vs, k * PERIOD);
        }
        let v = &vs[0];
        let out = v.output_tick.expect("ticks were output");
        assert!(out >= 20, "output up to tick {out}");
        // The chain as a commit log holds it: each block with the notarization its child carries.
        let at = |t: u64| {
            let (_, d) = v.blocks.by_tick.iter().find(|(tick, _)| *tick == t).expect("one block a tick");
            (*v.blocks[d].block).clone()
        };
        let chain: Vec<Block> = (0..=out + 1).map(at).collect();
        let log: Vec<Logged> = chain
            .windows(2)
            .map(|w| Logged {
                tick: w[0].tick,
                time_ms: w[0].time_ms,
                events: w[0].events.clone(),
                notarization: w[1].parent_certificate.clone().expect("a notarized parent"),
            })
            .collect();
        let key = SigningKey::from_bytes(&[1; 32]);
        let restore = || Validator::restore(v.cfg.clone(), key.clone(), v.keys.clone(), 0, &v.persist()).unwrap();

        let mut r = restore();
        // Restored, it holds only the blocks not handed out before (from the output tick on).
        assert!(chain[..out as usize].iter().all(|b| !r.blocks.contains_key(&b.digest())));
        assert_eq!(r.recall(log.clone()), out as usize, "every block below the output tick");
        for b in &chain {
            assert_eq!(r.blocks.get(&b.digest()).map(|s| &*s.block), Some(b), "tick {}", b.tick);
        }
        // It answers a fetch of the oldest, as before the restart.
        r.handle_message(0, ValidatorIndex(1), Message::Fetch(chain[0].digest()));
        let answer = std::iter::from_fn(|| r.poll_output()).find_map(|o| match o {
            Output::Send(ValidatorIndex(1), Message::Block { block, .. }) => Some(block),
            _ => None,
        });
        assert_eq!(answer.as_ref(), Some(&chain[0]));

        // A record that does not hash to its notarization is not kept, nor one whose parent's
        // record is missing (its parent's notarization is unknown); the others are.
        let mut r = restore();
        let mut bad = log.clone();
        bad[5].events.push(EventBytes::from(&b"not what was committed"[..]));
        bad.remove(10);
        assert_eq!(r.recall(bad), out as usize - 3);
        let has = |t: usize| r.blocks.contains_key(&chain[t].digest());
        assert!(!has(5) && !has(10) && !has(11), "a forged record, a missing one and the one after it");
        assert!(has(4) && has(6) && has(9) && has(12));
        // Only the newest `keep_blocks` are kept.
        let mut r = restore();
        r.cfg.keep_blocks = 8;
        assert_eq!(r.recall(log), 8);
        assert!((out - 8..=out).all(|t| r.blocks.contains_key(&chain[t as usize].digest())));
    }

    #[test]
    fn committed_blocks_are_dropped_oldest_first_beyond_keep_bytes_but_the_newest_are_kept() {
        const KEEP: u64 = 120;
        const MIN: u64 = 40;
        // A tight budget holds the newest `keep_blocks_min` whatever their size; a looser one
        // as many of the newest as fit.
        for budget in [1, 100 * 1_600] {
            let mut vs = four();
            for v in &mut vs {
                v.cfg.keep_blocks = KEEP;
                v.cfg.keep_bytes = budget;
                v.cfg.keep_blocks_min = MIN;
            }
            for k in 0..160u64 {
                vs[(k % 4) as usize].submit_events(k * PERIOD, vec![vec![k as u8; 1_000]]);
                run(&mut vs, k * PERIOD);
            }
            for v in &vs {
                let out = v.output_tick.expect("ticks were output");
                assert!(out >= 150, "output up to tick {out}");
                let held: u64 = v.blocks.values().map(|s| s.bytes).sum();
                assert_eq!(v.blocks.bytes, held, "the running total is the blocks' sum");
                let ticks: Vec<u64> = v.blocks.values().map(|s| s.block.tick).collect();
                let oldest = v.blocks.by_tick.first().expect("blocks are kept").0;
                assert!((oldest..=out).all(|t| ticks.contains(&t)), "the newest are kept without gaps: {ticks:?}");
                assert!(oldest <= out - MIN, "the newest {MIN} are kept: {oldest}..{out}");
                assert!(oldest > out - KEEP, "the budget dropped blocks that keep_blocks would keep: {oldest}..{out}");
                if budget == 1 {
                    assert_eq!(oldest, out - MIN);
                } else {
                    // Within the budget, and short of it by less than one more block's size.
                    let up_to_out: u64 = v.blocks.values().filter(|s| s.block.tick <= out).map(|s| s.bytes).sum();
                    assert!(up_to_out <= budget, "{up_to_out} bytes held up to the output tick");
                    assert!(v.blocks.bytes + 4 * 1_064 + 512 > budget, "{} bytes held, more fit", v.blocks.bytes);
                }
            }
        }
    }

    /// The blocks beyond the budget are dropped with the held bulk work, not by the input
    /// that commits (freeing a big block's events is slow, and that input can be on the
    /// commit's path: the one that finalizes).
    #[test]
    fn blocks_beyond_the_budget_are_dropped_with_the_bulk_work_not_by_the_committing_input() {
        const MIN: u64 = 3;
        let mut vs = four();
        for v in &mut vs {
            (v.cfg.keep_bytes, v.cfg.keep_blocks_min) = (1, MIN);
        }
        let mut now = 0;
        for k in 0..12u64 {
            now = k * PERIOD;
            vs[(k % 4) as usize].submit_events(now, vec![vec![k as u8; 1_000]]);
            run(&mut vs, now);
        }
        let oldest = |v: &Validator| v.blocks.by_tick.first().expect("blocks are kept").0;
        for v in &mut vs {
            let out = v.output_tick.expect("ticks were output");
            assert!(out >= 8, "output up to tick {out}");
            assert_eq!(oldest(v), out - MIN, "pruned to the budget");
            // The last finalization commits once its votes' signatures are checked (a timer).
            let mut at = now;
            while v.output_tick == Some(out) {
                at = v.poll_timeout().expect("the last finalization's commit is due");
                assert!(at < now + PERIOD, "committed before the next view");
                v.handle_timeout(at);
            }
            let committed = v.output_tick.expect("output");
            assert!(committed > out);
            assert_eq!(oldest(v), out - MIN, "the committing input drops nothing");
            assert_eq!(v.bulk_due, Some(at), "the bulk work is due at once");
            v.handle_timeout(at);
            assert_eq!(oldest(v), committed - MIN, "dropped with the bulk work");
            assert!(v.bulk_due.is_none() && v.settle_later.is_empty());
        }
    }

    #[test]
    fn distinct_ids_are_told_from_repeats_also_when_their_first_bytes_agree() {
        let id = |head: u8, tail: u8| {
            let mut d = [tail; 32];
            d[..8].fill(head);
            Digest(d)
        };
        let many: Vec<Digest> = (0..200u8).map(|i| id(i, i)).collect();
        assert!(all_distinct(&many));
        assert!(all_distinct(&[]));
        // Same first 8 bytes, different rest: distinct (the slow path).
        assert!(all_distinct(&[id(1, 2), id(1, 3), id(4, 4)]));
        // A true repeat, found on either path.
        assert!(!all_distinct(&[id(1, 2), id(5, 5), id(1, 2)]));
        let mut repeat = many.clone();
        repeat.push(many[77]);
        assert!(!all_distinct(&repeat));
        // Ids ground to crowd one bucket (distinct first 8 bytes that the table's multiplier
        // maps to one slot): the probes run out, and sorting decides.
        let c = 0x9E37_79B9_7F4A_7C15_u64;
        let inverse = (0..6).fold(c, |x: u64, _| x.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(x))));
        assert_eq!(c.wrapping_mul(inverse), 1);
        let crowd = |k: u8| {
            let mut d = [k; 32];
            d[..8].copy_from_slice(&(2 * u64::from(k)).wrapping_mul(inverse).to_le_bytes());
            Digest(d)
        };
        let crowded: Vec<Digest> = (0..100u8).map(crowd).collect();
        assert!(all_distinct(&crowded));
        let mut crowded_repeat = crowded.clone();
        crowded_repeat.insert(40, crowded[90]);
        assert!(!all_distinct(&crowded_repeat));
        // Many random ids, distinct, and with one repeated.
        let random: Vec<Digest> = (0..2_000u32).map(|i| event_id(&i.to_le_bytes())).collect();
        assert!(all_distinct(&random));
        let mut random_repeat = random.clone();
        random_repeat.push(random[1_234]);
        assert!(!all_distinct(&random_repeat));
    }
}
