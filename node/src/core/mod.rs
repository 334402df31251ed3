//! The node core: agreement and the sim in lockstep, sans-IO.
//!
//! Everything a node does between its sockets and its clock happens here, so the same code runs
//! on the real network and inside `scenarios`' deterministic cluster (`metatopia-lab`'s `simnet`):
//!
//! 1. events from clients go into the consensus pool ([`NodeCore::submit_event`]);
//! 2. consensus commits the batch of tick t ([`Output::Committed`]);
//! 3. the sim executes it (signatures checked ahead on the worker threads, DESIGN §4);
//! 4. the state root of tick t is reported back and travels in this validator's later votes;
//! 5. when f+1 validators report a different root for a tick (so at least one honest one
//!    disagrees), this node has diverged: it stops executing and hands out a
//!    [`DesyncReport`] (its snapshot, the peers' roots, its per-subsystem roots and the last
//!    inputs) for the I/O shell to write as `desync-report-<tick>/`. Fewer disagreements mean a
//!    faulty peer: counted, never obeyed.

pub mod agreement;
pub mod dilation;
pub mod epochs;
pub mod finish;
pub mod join;
pub mod latency;
pub mod limits;
pub mod locate;
mod output;
#[cfg(test)]
mod tests;
pub mod verify;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use metatopia_consensus::{Commit, Digest, Message, Micros, Output, Signed, ValidatorIndex};
use metatopia_sim::host::{PhysicsStage, ScriptHost};
use metatopia_sim::state::SubsystemRoots;
use metatopia_sim::{Batch, EventId, Hash32, SignedEvent, Sim, Snapshot, Tick, VerifiedBatch};

use crate::net::wire::NodeMsg;
pub use agreement::Agreement;
pub use limits::{MAX_BLOCK_EVENT_BYTES, MAX_EVENT_BYTES};
pub use output::{CoreOutput, CoreStats, DesyncReport, SubmitError};

/// Committed inputs kept for a desync report.
const KEEP_INPUTS: usize = 8;
/// Outcomes of executed events remembered for `GET /v1/events/<id>`.
const KEEP_OUTCOMES: usize = 1 << 16;

pub use metatopia_client::proto::Outcome;

/// Log records handed back to the agreement after a restart ([`NodeCore::recall`]): twice
/// the blocks it keeps by default (`keep_blocks`, 2,048; a node does not change it).
const RECALL_RECORDS: usize = 4_096;
/// A node this many ticks behind what f+1 other validators report having executed...
const STRANDED_TICKS: u64 = 64;
/// ...for this long takes a snapshot they certify: the blocks it lacks may be pruned from
/// every peer (they keep 2,048 ticks), so fetching them could go on for ever. A node that
/// catches up by fetching a few hundred blocks does so well within this.
const STRANDED_US: Micros = 10_000_000;
/// Ask again for snapshots this often while resyncing.
const RESYNC_RETRY_US: Micros = 1_000_000;
/// Serve a peer at most one snapshot this often: a little less than [`RESYNC_RETRY_US`], so a
/// peer that asks once a second is answered each time. (At two seconds, the ask two seconds
/// after a served one came a hair early and was refused: the asking node waited three seconds
/// for a newer snapshot, while the one it had could not be certified, as the roots its peers
/// reported for that tick came before it restarted.)
const SERVE_EVERY_US: Micros = RESYNC_RETRY_US * 9 / 10;
/// Commits kept while resyncing (older ones are dropped; a newer snapshot is then needed).
const RESYNC_BUFFER: usize = 8_192;
/// Largest snapshot taken from a peer.
pub const MAX_SNAPSHOT_BYTES: usize = 1 << 30;

/// A diverged node getting back: committed batches since, and snapshots peers offered.
#[derive(Debug, Default)]
struct Resync {
    /// A node joining a running sim (it asks with `JoinRequest`, and starts its agreement from
    /// the first answer) rather than one that diverged.
    join: Option<JoinState>,
    /// The agreement outputs no commits until the snapshot is in (a node that joins, or one
    /// stranded behind blocks no peer keeps), then commits from the snapshot's tick on.
    held: bool,
    next_request: Micros,
    buffered: BTreeMap<Tick, Batch>,
    /// The newest snapshot each peer sent: the number of ticks it executed, and the snapshot.
    offers: BTreeMap<ValidatorIndex, (Tick, Snapshot)>,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum JoinState {
    /// No answer yet.
    #[default]
    Asking,
    /// The agreement follows a peer's epoch and view; waiting for a certified snapshot.
    Following,
}

/// A node's core for one sim.
pub struct NodeCore<A, H, P> {
    agreement: A,
    sim: Sim<H, P>,
    workers: u32,
    /// Roots this node computed, by tick (recent).
    roots: BTreeMap<Tick, (Hash32, SubsystemRoots)>,
    /// Peers' disagreeing roots, by tick.
    disagreements: BTreeMap<Tick, BTreeMap<ValidatorIndex, Hash32>>,
    /// Validators this node holds evidence of equivocation against (at most the set's size).
    equivocators: BTreeSet<ValidatorIndex>,
    /// Proposal-to-commit and input-to-execution latencies.
    latency: latency::Latencies,
    last_inputs: VecDeque<Batch>,
    desynced: Option<Tick>,
    stats: CoreStats,
    out: VecDeque<CoreOutput>,
    outcomes: BTreeMap<EventId, Outcome>,
    outcome_order: VecDeque<EventId>,
    /// Sim time = anchor + (BFT time - anchor) × scale (scenarios accelerate days).
    time_scale: u64,
    time_anchor_ms: u64,
    resync: Option<Resync>,
    /// The time of the input being handled (for agreement work triggered by execution).
    now: Micros,
    /// Root reports for ticks below this are history (before a resync): not judged again.
    judge_from: Tick,
    served: BTreeMap<ValidatorIndex, Micros>,
    /// Commits waiting for [`NodeCore::execute_deferred`] (when execution is deferred).
    deferred: Option<VecDeque<Box<Commit>>>,
    /// Deferred commits of ticks above this wait ([`NodeCore::execute_until`]).
    exec_limit: Option<Tick>,
    /// Signature verdicts: recorded at the door, computed ahead for gossiped and proposed events.
    verifier: crate::core::verify::Verifier,
    /// This node's key, to sign its sim's mail for neighbour sims while it is a validator.
    mail_key: Option<metatopia_sim::SigningKey>,
    /// Ticks below this have been handed to the log (or were in the state it started from).
    logged_to: Tick,
    /// Since when this node has been `STRANDED_TICKS` behind its peers.
    behind_since: Option<Micros>,
    /// Take a snapshot whenever the sim reaches a multiple of this tick ([`CoreOutput::Snapshot`]).
    snapshot_every: Option<u64>,
    /// Commits stopped: when to say so.
    stall: finish::Stall,
    /// The last tick to execute was executed: stopping once the sim's validators all have.
    finishing: Option<finish::Finishing>,
}

impl<A, H: ScriptHost, P: PhysicsStage> std::fmt::Debug for NodeCore<A, H, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCore")
            .field("tick", &self.sim.world().tick())
            .field("desynced", &self.desynced)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<A: Agreement, H: ScriptHost, P: PhysicsStage> NodeCore<A, H, P> {
    pub fn new(agreement: A, sim: Sim<H, P>, workers: u32) -> Self {
        NodeCore {
            agreement,
            sim,
            workers: workers.max(1),
            roots: BTreeMap::new(),
            disagreements: BTreeMap::new(),
            equivocators: BTreeSet::new(),
            latency: latency::Latencies::default(),
            last_inputs: VecDeque::new(),
            desynced: None,
            stats: CoreStats::default(),
            out: VecDeque::new(),
            outcomes: BTreeMap::new(),
            outcome_order: VecDeque::new(),
            time_scale: 1,
            time_anchor_ms: 0,
            resync: None,
            now: 0,
            judge_from: Tick::ZERO,
            served: BTreeMap::new(),
            deferred: None,
            exec_limit: None,
            verifier: crate::core::verify::Verifier::cache(),
            mail_key: None,
            logged_to: Tick::ZERO,
            behind_since: None,
            snapshot_every: None,
            stall: finish::Stall::default(),
            finishing: None,
        }
    }

    /// Sign this sim's mail for its neighbours with `key` (the node key) whenever the key is
    /// one of the sim's validators.
    pub fn with_mail_key(mut self, key: metatopia_sim::SigningKey) -> Self {
        self.mail_key = Some(key);
        self
    }

    /// Hand out a [`CoreOutput::Snapshot`] each time the sim reaches a multiple of `every` ticks
    /// while it runs (not while it replays its log): a multiple of the physics' full-hash
    /// interval, so that the root a restart checks the snapshot against covers every byte of it.
    pub fn snapshots_every(mut self, every: u64) -> Self {
        self.snapshot_every = Some(every.max(1));
        self
    }

    /// Check the signatures of events seen in peers' messages on a thread of their own, ahead
    /// of their tick (without it only the door's verdicts are remembered).
    pub fn verify_ahead(mut self) -> Self {
        self.verifier = crate::core::verify::Verifier::start();
        self
    }

    /// Defer executing commits to [`NodeCore::execute_deferred`], so that the votes a message
    /// produced leave before the ticks it committed are executed. Executing in line (the
    /// default, and what the deterministic cluster does) held every vote back by a tick's
    /// execution on every node: at 60 Hz a view took 25 ms instead of 16.7 (dilation 0.65).
    pub fn defer_execution(mut self) -> Self {
        self.deferred = Some(VecDeque::new());
        self
    }

    /// Execute deferred commits up to tick `last` and no further (a node asked to stop there):
    /// later commits are still logged as agreement hands them out, but wait. A node started at
    /// or past `last` executes one tick.
    pub fn execute_until(mut self, last: Option<Tick>) -> Self {
        self.exec_limit = last.map(|t| t.max(self.sim.world().tick()));
        self
    }

    /// Whether commits wait for [`NodeCore::execute_deferred`] (within the limit).
    pub fn has_deferred(&self) -> bool {
        self.next_deferred().is_some()
    }

    fn next_deferred(&self) -> Option<&Commit> {
        let c = self.deferred.as_ref()?.front()?;
        self.exec_limit.is_none_or(|last| c.block.tick <= last).then_some(&**c)
    }

    /// Execute the deferred commits, in order (up to the limit), then give agreement its turn
    /// (a leader held back by execution proposes now).
    pub fn execute_deferred(&mut self, now: Micros) {
        self.now = now;
        let mut executed = false;
        while self.next_deferred().is_some() {
            let Some(c) = self.deferred.as_mut().and_then(VecDeque::pop_front) else { break };
            self.execute(&c);
            executed = true;
        }
        if executed {
            self.agreement.handle_timeout(now);
            self.pump(now);
        }
    }

    /// Accelerated time: every BFT millisecond after `anchor_ms` counts as `scale` milliseconds
    /// of sim time (governance "days" in scenarios). Every node of a sim must use the same
    /// values; a node's log stores BFT time, so replay applies the same mapping.
    pub fn with_time_scale(mut self, scale: u64, anchor_ms: u64) -> Self {
        self.time_scale = scale.max(1);
        self.time_anchor_ms = anchor_ms;
        self
    }

    fn sim_time(&self, bft_ms: u64) -> u64 {
        let since = bft_ms.saturating_sub(self.time_anchor_ms);
        self.time_anchor_ms.saturating_add(since.saturating_mul(self.time_scale))
    }

    /// What became of an event this node executed recently (the last 65,536).
    pub fn outcome(&self, id: &EventId) -> Option<&Outcome> {
        self.outcomes.get(id)
    }

    pub fn sim(&self) -> &Sim<H, P> {
        &self.sim
    }

    pub fn agreement(&self) -> &A {
        &self.agreement
    }

    pub fn agreement_mut(&mut self) -> &mut A {
        &mut self.agreement
    }

    pub fn stats(&self) -> CoreStats {
        self.stats
    }

    /// The tick this node diverged at, if it did.
    pub fn desynced(&self) -> Option<Tick> {
        self.desynced
    }

    /// The root this node computed for `tick`, if still remembered.
    pub fn root_of(&self, tick: Tick) -> Option<Hash32> {
        self.roots.get(&tick).map(|r| r.0)
    }

    pub fn handle_message(&mut self, now: Micros, from: ValidatorIndex, msg: NodeMsg) {
        match msg {
            NodeMsg::Consensus { epoch, msg } => {
                match &msg {
                    Message::Events(events) => self.verifier.ahead(events),
                    Message::Propose { block, .. } | Message::Block { block, .. } => self.verifier.ahead(&block.events),
                    Message::Authenticated { inner, .. } => {
                        if let Signed::Propose { block, .. } = &**inner {
                            self.verifier.ahead(&block.events)
                        }
                    }
                    _ => {}
                }
                self.now = now;
                if let Some(view) = latency::proposal_view(&msg) {
                    self.latency.proposal_seen(view, now);
                }
                self.agreement.handle_epoch_message(now, from, epoch, msg)
            }
            NodeMsg::SnapshotRequest => self.serve_snapshot(now, from, false),
            NodeMsg::JoinRequest => self.serve_snapshot(now, from, true),
            NodeMsg::Snapshot { tick, bytes } => self.offered(from, tick, &bytes),
            NodeMsg::JoinSnapshot { tick, bytes, agreement } => {
                if let Some(r) = self.resync.as_mut()
                    && r.join == Some(JoinState::Asking)
                    && self.agreement.join_from(now, &agreement)
                {
                    r.join = Some(JoinState::Following);
                }
                self.offered(from, tick, &bytes);
            }
            // Answered by the node's shell (about files, or between sims' nodes).
            NodeMsg::SimInfoRequest
            | NodeMsg::SimInfo { .. }
            | NodeMsg::Locate { .. }
            | NodeMsg::Located { .. }
            | NodeMsg::Raynet { .. }
            | NodeMsg::Cards { .. }
            | NodeMsg::SimCards { .. } => {}
            NodeMsg::Mail(event) => {
                self.now = now;
                match self.check_mail(&event) {
                    Ok(_) => {
                        self.stats.mail_received += 1;
                        self.agreement.submit_events(now, vec![event]);
                    }
                    // A copy of mail the sim already has: it would cost a place in a batch and
                    // do nothing there.
                    Err(SubmitError::Late) => self.stats.mail_late += 1,
                    Err(_) => {}
                }
            }
        }
        self.pump(now);
    }

    /// A neighbour's signed mail, sent by one of its validators (from any peer: the sender need
    /// not be a node of this sim). Checked before it costs the validators anything: it must be
    /// mail for this sim, signed by a validator of the neighbour it claims to come from.
    pub fn check_mail(&mut self, bytes: &[u8]) -> Result<EventId, SubmitError> {
        let world = self.sim.world();
        let r = match SignedEvent::decode(bytes, MAX_BLOCK_EVENT_BYTES) {
            Err(e) => Err(SubmitError::Undecodable(e.to_string())),
            Ok(e) if e.body.sim != world.sim() => {
                Err(SubmitError::OtherSim { event: e.body.sim.0, here: world.sim().0 })
            }
            Ok(e) => match &e.body.payload {
                metatopia_sim::Payload::Mail { from, tick, .. } if world.links().is_delivered(*from, *tick) => {
                    return Err(SubmitError::Late);
                }
                metatopia_sim::Payload::Mail { from, .. }
                    if world.links().neighbours.get(from).is_some_and(|n| n.validators.contains(&e.body.author)) =>
                {
                    let ok = e.verify();
                    self.verifier.record(bytes, ok);
                    if ok { Ok(e.id()) } else { Err(SubmitError::BadSignature) }
                }
                _ => Err(SubmitError::NotMail),
            },
        };
        if r.is_err() {
            self.stats.refused_submissions += 1;
        }
        r
    }

    pub fn handle_timeout(&mut self, now: Micros) {
        self.now = now;
        self.agreement.handle_timeout(now);
        self.check_stranded(now);
        if let Some(r) = self.resync.as_mut()
            && now >= r.next_request
        {
            r.next_request = now + RESYNC_RETRY_US;
            let ask = if r.join.is_some() { NodeMsg::JoinRequest } else { NodeMsg::SnapshotRequest };
            self.out.push_back(CoreOutput::Broadcast(ask));
        }
        self.pump(now);
        if self.finishing.is_none()
            && let Some(quiet_us) = self.stall.due(now)
        {
            self.out.push_back(CoreOutput::Stalled { quiet_us, agreement: self.agreement.describe() });
        }
    }

    pub fn poll_timeout(&self) -> Option<Micros> {
        let stall = if self.finishing.is_none() { self.stall.next() } else { None };
        [
            self.agreement.poll_timeout(),
            self.resync.as_ref().map(|r| r.next_request),
            stall,
            self.finishing.as_ref().and_then(finish::Finishing::next),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// A node whose agreement is far behind its peers for long (`STRANDED_TICKS`,
    /// `STRANDED_US`) stops waiting for the blocks it lacks and takes a snapshot f+1 other
    /// validators certify: its agreement outputs nothing until then, and commits from the
    /// snapshot's tick on. (A validator down longer than its peers keep blocks: the blocks it
    /// lacks are gone everywhere.) A node whose agreement keeps up while its execution lags
    /// is not stranded: its commits are all here. A node left in a validator epoch that f+1 of
    /// its set have left (peers answer only for their current and previous epochs) joins
    /// theirs instead, as a new node does, from a snapshot 2f+1 certify; so does a node that is
    /// still getting a certified snapshot (joining or resyncing) when its set moves on to the
    /// next epoch (the roots that would certify it are reported in the epoch it cannot follow).
    fn check_stranded(&mut self, now: Micros) {
        let executed = self.sim.world().tick();
        let at = executed.max(self.agreement.position().2.map_or(Tick::ZERO, Tick::next));
        // (A node that executed all it was asked to, `execute_until`, is not behind: it waits.)
        let running =
            self.resync.is_none() && self.desynced.is_none() && self.exec_limit.is_none_or(|last| executed <= last);
        let behind_epoch = (running || self.resync.is_some()) && self.agreement.behind_epoch();
        let behind =
            behind_epoch || running && self.agreement.peers_executed().is_some_and(|t| t > at + STRANDED_TICKS);
        if !behind {
            self.behind_since = None;
            return;
        }
        let since = *self.behind_since.get_or_insert(now);
        if now.saturating_sub(since) < STRANDED_US {
            return;
        }
        self.behind_since = None;
        let peers = self.agreement.peers_executed().unwrap_or_default();
        self.stats.stranded += 1;
        if behind_epoch {
            // Its peers have left its validator epoch: it joins theirs, as a new node does.
            tracing::warn!(%at, "left behind in a past validator epoch for 10 s: joining the peers' epoch");
            self.agreement.rejoin(now);
            self.resync =
                Some(Resync { join: Some(JoinState::Asking), held: true, next_request: now, ..Default::default() });
            return;
        }
        tracing::warn!(%at, %peers, "far behind the peers for 10 s: taking a snapshot they certify");
        self.agreement.hold(now);
        self.resync = Some(Resync { held: true, next_request: now, ..Resync::default() });
    }

    /// Whether this node is getting a certified snapshot after diverging.
    pub fn resyncing(&self) -> bool {
        self.resync.is_some()
    }

    /// A peer asks for this node's state (it diverged, or joins). Served when this node is
    /// itself in step, at most once per peer every two seconds.
    fn serve_snapshot(&mut self, now: Micros, from: ValidatorIndex, join: bool) {
        if self.desynced.is_some()
            || self.resync.is_some()
            || self.served.get(&from).is_some_and(|t| now < t + SERVE_EVERY_US)
        {
            return;
        }
        self.served.insert(from, now);
        let tick = self.sim.world().tick();
        let bytes = self.sim.snapshot().encode();
        let msg = match join.then(|| self.agreement.join_state()).flatten() {
            Some(agreement) => NodeMsg::JoinSnapshot { tick, bytes, agreement },
            None => NodeMsg::Snapshot { tick, bytes },
        };
        self.out.push_back(CoreOutput::Send(from, msg));
    }

    /// A snapshot a peer sent: kept while this node looks for one its peers certify.
    fn offered(&mut self, from: ValidatorIndex, tick: Tick, bytes: &[u8]) {
        if let Some(r) = self.resync.as_mut()
            && bytes.len() <= MAX_SNAPSHOT_BYTES
            && let Ok(snap) = Snapshot::decode(bytes, MAX_SNAPSHOT_BYTES as u32)
            && snap.world.tick() == tick
        {
            r.offers.insert(from, (tick, snap));
        }
    }

    /// This node joins a running sim: it executes nothing until it has a snapshot that f+1 of
    /// the current validators certify (their votes report its root), then follows from there.
    /// Its agreement outputs no commits until then, and starts from the first peer's answer.
    pub fn joining(mut self) -> Self {
        self.agreement.hold(self.now);
        self.resync = Some(Resync { join: Some(JoinState::Asking), held: true, ..Resync::default() });
        self
    }

    /// Whether this node is still joining (no certified snapshot yet).
    pub fn is_joining(&self) -> bool {
        self.resync.as_ref().is_some_and(|r| r.join.is_some())
    }

    /// Install the newest offered snapshot whose root f+1 other validators reported (so at
    /// least one honest one computed it), then replay the commits buffered since.
    fn try_resync(&mut self) -> bool {
        let Some(r) = self.resync.as_mut() else { return false };
        let f = self.agreement.validators().saturating_sub(1) / 3;
        let mut offers: Vec<(Tick, ValidatorIndex)> = r.offers.iter().map(|(v, (t, _))| (*t, *v)).collect();
        offers.sort_unstable_by(|a, b| b.cmp(a));
        for (tick, from) in offers {
            let Some((_, snap)) = r.offers.get(&from) else { continue };
            let Some(last_executed) = tick.checked_sub(1) else { continue };
            let root = snap.root;
            let certified_by =
                self.agreement.peer_roots(last_executed).into_iter().filter(|(_, d)| d.0 == root.0).count();
            // A joining node (no validator of the set) waits for 2f+1 of them; one that diverged
            // takes f+1 others (at least one honest), as it may be a validator itself.
            let need = if r.join.is_some() { 2 * f + 1 } else { f + 1 };
            if certified_by < need {
                continue;
            }
            // The commits from `tick` on must all be here (or not committed yet).
            let newest = r.buffered.keys().next_back().copied().unwrap_or_default();
            if newest >= tick && r.buffered.range(tick..).count() as u64 != newest.since(tick) + 1 {
                continue;
            }
            let Some((_, snap)) = r.offers.remove(&from) else { continue };
            let bytes = snap.encode();
            if let Err(e) = self.sim.reset_to(snap) {
                tracing::warn!(%e, "a certified snapshot did not load; waiting for another");
                continue;
            }
            let r = self.resync.take().unwrap_or_default();
            if r.held {
                self.agreement.commit_from(self.now, tick);
            }
            self.desynced = None;
            self.judge_from = tick;
            self.roots.clear();
            self.disagreements.clear();
            self.out.push_back(CoreOutput::Resynced { tick, certified_by, snapshot: bytes, joined: r.join.is_some() });
            // A snapshot can bring a node past the last tick it was asked to execute.
            if self.finishing.is_none() && self.exec_limit.is_some_and(|last| tick > last) {
                self.finishing = Some(finish::Finishing::skipped(last_executed, self.now));
            }
            for (_, batch) in r.buffered.range(tick..) {
                self.run_batch(batch.clone(), true);
            }
            return true;
        }
        false
    }

    pub fn poll_output(&mut self) -> Option<CoreOutput> {
        self.out.pop_front()
    }

    /// Signed events from clients. Events that do not decode, are for another sim or do not
    /// verify are refused here (counted), before they cost the validators anything.
    pub fn submit_events(&mut self, now: Micros, events: Vec<Vec<u8>>) -> usize {
        self.now = now;
        let good: Vec<Vec<u8>> = events.into_iter().filter(|bytes| self.check_submission(bytes).is_ok()).collect();
        let n = good.len();
        if n > 0 {
            self.agreement.submit_events(now, good);
            self.pump(now);
        }
        n
    }

    /// One signed event from a client, with the reason when it is refused.
    pub fn submit_event(&mut self, now: Micros, bytes: Vec<u8>) -> Result<EventId, SubmitError> {
        self.now = now;
        let id = self.check_submission(&bytes)?;
        self.agreement.submit_events(now, vec![bytes]);
        self.pump(now);
        Ok(id)
    }

    fn check_submission(&mut self, bytes: &[u8]) -> Result<EventId, SubmitError> {
        let world = self.sim.world();
        let sim = world.sim();
        // The sim's own limit (a governance setting), so any event the sim takes can be submitted.
        let max = world.settings().limits.max_event_bytes.min(MAX_EVENT_BYTES);
        let r = match SignedEvent::decode(bytes, max) {
            Err(e) => Err(SubmitError::Undecodable(e.to_string())),
            Ok(e) if e.body.sim != sim => Err(SubmitError::OtherSim { event: e.body.sim.0, here: sim.0 }),
            Ok(e) => match metatopia_sim::pipeline::check_at_door(world, &e, bytes.len() as u32) {
                Err(reason) => Err(SubmitError::Refused(reason.to_string())),
                Ok(()) => {
                    let ok = e.verify();
                    self.verifier.record(bytes, ok);
                    if ok { Ok(e.id()) } else { Err(SubmitError::BadSignature) }
                }
            },
        };
        match r {
            Err(_) => self.stats.refused_submissions += 1,
            Ok(id) => self.latency.submitted(id, self.now),
        }
        r
    }

    /// Drain consensus: forward messages, execute commits, judge root mismatches. After an
    /// execution, agreement gets a turn at once: a leader held back by execution (consensus'
    /// `max_exec_lag`) proposes now rather than at its next timer.
    fn pump(&mut self, now: Micros) {
        self.now = now;
        self.pump_agreement(now);
        self.check_finishing(now);
    }

    /// A finishing node: whether the sim's validators all executed its last tick (their roots
    /// came with their votes), or the wait is over.
    fn check_finishing(&mut self, now: Micros) {
        let Some(f) = self.finishing.as_mut() else { return };
        let of = self.agreement.validators();
        let reported = self.agreement.peer_roots(f.tick()).len();
        if let Some(say) = f.step(now, reported, of) {
            self.out.push_back(CoreOutput::Finishing(say));
        }
    }

    fn pump_agreement(&mut self, now: Micros) {
        loop {
            let mut executed = false;
            while let Some((epoch, o)) = self.agreement.poll_epoch_output() {
                match o {
                    Output::Broadcast(msg) => {
                        if let Some(view) = latency::proposal_view(&msg) {
                            self.latency.proposal_seen(view, now);
                        }
                        self.out.push_back(CoreOutput::Broadcast(NodeMsg::Consensus { epoch, msg }))
                    }
                    Output::Send(to, msg) => {
                        self.out.push_back(CoreOutput::Send(to, NodeMsg::Consensus { epoch, msg }))
                    }
                    // Logged as soon as agreement hands it out, executed or not: the
                    // agreement's persisted state counts it as output from now on, so a restart
                    // must find it in the log even if it was never executed here.
                    Output::Committed(c) => match self.committed_at(&c, now).log_commit(&c).deferred.as_mut() {
                        Some(d) => d.push_back(c),
                        None => {
                            self.execute(&c);
                            executed = true;
                        }
                    },
                    Output::RootMismatch { tick, theirs, validator, .. } => {
                        self.mismatch(tick, validator, Hash32(theirs.0))
                    }
                    Output::Evidence(e) => {
                        self.stats.equivocations += 1;
                        self.equivocators.insert(e.first.signer);
                        tracing::warn!(validator = e.first.signer.0, view = e.first.view.0, "evidence of equivocation");
                    }
                    Output::Finalized { .. } => {}
                }
            }
            if self.resync.is_some() && self.try_resync() {
                // Commits from the snapshot's tick on may be waiting in the agreement.
                continue;
            }
            if !executed {
                return;
            }
            self.agreement.handle_timeout(now);
        }
    }

    /// The log record of a commit agreement just handed out ([`CoreOutput::Committed`]), unless
    /// it is one this node executed before (a restart) or the sim stopped on a desync. A commit
    /// past a gap is logged too (the log starts a new segment there) and execution repairs the
    /// gap from a snapshot the peers certify.
    fn log_commit(&mut self, c: &Commit) -> &mut Self {
        let resyncing = self.resync.is_some();
        let next = self.logged_to.max(self.sim.world().tick());
        if resyncing || (self.desynced.is_none() && c.block.tick >= next) {
            self.logged_to = c.block.tick.next();
            self.stats.filled += u64::from(c.opener.is_some());
            self.stall.committed(self.now);
            self.out.push_back(CoreOutput::Committed(Box::new(crate::store::LogRecord {
                tick: c.block.tick,
                time_ms: c.block.time_ms,
                seed: c.seed.0,
                events: c.block.events.iter().map(|e| e.to_vec()).collect(),
                certificate: postcard::to_allocvec(&c.certificate).unwrap_or_default(),
                opener: c
                    .opener
                    .as_ref()
                    .map(|o| (o.time_ms, postcard::to_allocvec(&o.notarization).unwrap_or_default())),
            })));
        }
        self
    }

    fn execute(&mut self, c: &Commit) {
        let tick = c.block.tick;
        let at = self.sim.world().tick();
        let resyncing = self.resync.is_some();
        if self.desynced.is_some() && !resyncing {
            return;
        }
        if tick < at && !resyncing {
            return; // already executed (a restart replays what it has)
        }
        if tick > at && !resyncing {
            // Agreement hands commits out in order, so a gap means this node's own state is
            // behind what its agreement restored (a log cut short, a snapshot lost): it repairs
            // itself from a snapshot its peers certify, then replays the commits from there.
            tracing::warn!(%tick, %at, "commits resume past this node's state: taking a snapshot its peers certify");
            self.stats.stranded += 1;
            self.agreement.hold(self.now);
            self.resync = Some(Resync { held: true, next_request: self.now, ..Resync::default() });
        }
        let mut events = Vec::with_capacity(c.block.events.len());
        for bytes in &c.block.events {
            match SignedEvent::decode(bytes, MAX_BLOCK_EVENT_BYTES) {
                Ok(e) => events.push(e),
                Err(_) => self.stats.undecodable += 1, // the same on every node: skipped
            }
        }
        let time_ms = self.sim_time(c.block.time_ms);
        let batch = Batch { tick, time_ms, seed: Hash32(c.seed.0), events };
        match self.resync.as_mut() {
            Some(r) => {
                r.buffered.insert(tick, batch);
                while r.buffered.len() > RESYNC_BUFFER {
                    r.buffered.pop_first();
                }
            }
            None => self.run_batch(batch, true),
        }
    }

    /// After a restart: hand the agreement the blocks it committed before, from the newest
    /// `RECALL_RECORDS` records of the commit log, so that it answers peers' fetches of them
    /// (after a whole sim stopped, a validator that was down then needs them from someone).
    /// Returns how many blocks the agreement kept; records whose certificate does not decode
    /// are skipped (the agreement rebuilds each block and checks it against its notarization).
    pub fn recall(&mut self, records: &[crate::store::LogRecord]) -> usize {
        let newest = &records[records.len().saturating_sub(RECALL_RECORDS)..];
        let logged = newest
            .iter()
            .filter_map(|r| {
                let notarization = postcard::from_bytes(&r.certificate).ok()?;
                let events = r.events.iter().map(|e| metatopia_consensus::EventBytes::from(e.as_slice())).collect();
                let opener = match &r.opener {
                    Some((time_ms, c)) => Some(metatopia_consensus::Opener {
                        time_ms: *time_ms,
                        notarization: postcard::from_bytes(c).ok()?,
                    }),
                    None => None,
                };
                Some(metatopia_consensus::Logged { tick: r.tick, time_ms: r.time_ms, events, notarization, opener })
            })
            .collect();
        self.agreement.recall(logged)
    }

    /// Re-execute a logged tick (after a restart, before consensus resumes). Returns the root.
    pub fn replay(&mut self, rec: &crate::store::LogRecord) -> Result<Hash32, String> {
        let at = self.sim.world().tick();
        if rec.tick != at {
            return Err(format!("the log's tick {} is not the sim's next tick {at}", rec.tick));
        }
        let events = rec.events.iter().filter_map(|b| SignedEvent::decode(b, MAX_BLOCK_EVENT_BYTES).ok()).collect();
        let time_ms = self.sim_time(rec.time_ms);
        self.run_batch(Batch { tick: at, time_ms, seed: Hash32(rec.seed), events }, false);
        if self.desynced.is_some() {
            return Err(format!("tick {} did not execute", rec.tick));
        }
        self.roots.get(&rec.tick).map(|r| r.0).ok_or_else(|| "no root".to_owned())
    }

    fn run_batch(&mut self, batch: Batch, live: bool) {
        let tick = batch.tick;
        let verifier = &self.verifier;
        let verified = VerifiedBatch::with_verdicts(batch.clone(), self.workers, |e| verifier.verdict(e));
        match self.sim.step(&verified) {
            Ok(report) => {
                self.stats.executed += 1;
                self.stats.accepted += u64::from(report.accepted);
                self.stats.rejected += report.rejected.len() as u64;
                self.roots.insert(tick, (report.root, report.roots));
                self.remember_outcomes(&batch, &report.rejected);
                while self.roots.len() > 512 {
                    self.roots.pop_first();
                }
                self.last_inputs.push_back(batch);
                while self.last_inputs.len() > KEEP_INPUTS {
                    self.last_inputs.pop_front();
                }
                self.agreement.report_root(tick, Digest(report.root.0));
                self.agreement.on_executed(self.now, tick, self.sim.world());
                self.stats.departures += report.left.len() as u64;
                self.stats.arrivals += report.arrived.len() as u64;
                if !live {
                    return;
                }
                self.sign_mail(&report.mail);
                let world = self.sim.world();
                let avatars_left = report
                    .left
                    .iter()
                    .filter_map(|(id, to)| world.links().departed().get(id).map(|d| (&d.record.object, *to)))
                    .filter(|(o, _)| o.kind == metatopia_sim::state::ObjectKind::Avatar)
                    .map(|(o, to)| (o.owner, to))
                    .collect();
                self.out.push_back(CoreOutput::Executed {
                    tick,
                    root: report.root,
                    accepted: report.accepted,
                    rejected: report.rejected.len() as u32,
                    chat: report.chat,
                    avatars_left,
                    script_operations: report.script_operations,
                    queued: report.queued,
                });
                if self.finishing.is_none() && self.exec_limit.is_some_and(|last| tick >= last) {
                    self.finishing = Some(finish::Finishing::new(tick, self.now));
                }
                let next = tick.next();
                if self.snapshot_every.is_some_and(|n| next.0.is_multiple_of(n)) {
                    let bytes = self.sim.snapshot().encode();
                    self.out.push_back(CoreOutput::Snapshot { tick: next, bytes });
                }
            }
            Err(e) => {
                tracing::error!(%tick, error = %e, "a committed batch did not execute; stopping this sim");
                self.desynced = Some(tick);
            }
        }
    }

    /// A validator signs the tick's mail for each neighbour (observers do not: their copies
    /// would not count).
    fn sign_mail(&mut self, mail: &[metatopia_sim::links::OutMail]) {
        let Some(key) = &self.mail_key else { return };
        let world = self.sim.world();
        if mail.is_empty() || !world.governance().validators.contains(&metatopia_sim::event::account_of(key)) {
            return;
        }
        for m in mail {
            let payload = metatopia_sim::Payload::Mail { from: world.sim(), tick: m.tick, body: m.body.clone() };
            let e = SignedEvent::new(key, m.to, m.tick.0, payload);
            self.out.push_back(CoreOutput::Mail { to: m.to, tick: m.tick, event: metatopia_sim::codec::encode(&e) });
            self.stats.mail_sent += 1;
        }
    }

    fn remember_outcomes(&mut self, batch: &Batch, rejected: &[metatopia_sim::state::Rejection]) {
        let tick = batch.tick;
        let refused: BTreeMap<EventId, String> = rejected.iter().map(|r| (r.event, r.reason.to_string())).collect();
        for e in &batch.events {
            let id = e.id();
            self.latency.executed(&id, self.now);
            let outcome = match refused.get(&id) {
                Some(reason) => Outcome::Refused { tick, reason: reason.clone() },
                None => Outcome::Executed { tick },
            };
            if self.outcomes.insert(id, outcome).is_none() {
                self.outcome_order.push_back(id);
            }
        }
        while self.outcome_order.len() > KEEP_OUTCOMES {
            if let Some(old) = self.outcome_order.pop_front() {
                self.outcomes.remove(&old);
            }
        }
    }

    fn mismatch(&mut self, tick: Tick, validator: ValidatorIndex, theirs: Hash32) {
        if self.desynced.is_some() || tick < self.judge_from {
            return;
        }
        let f = (self.agreement.validators().saturating_sub(1)) / 3;
        let against = self.disagreements.entry(tick).or_default();
        against.insert(validator, theirs);
        let count = against.len();
        self.stats.peer_divergences += 1;
        self.out.push_back(CoreOutput::PeerDiverged { tick, validator });
        let horizon = tick.saturating_sub(512);
        self.disagreements.retain(|t, _| *t >= horizon);
        if count > f {
            self.desync(tick);
        }
    }

    fn desync(&mut self, tick: Tick) {
        self.desynced = Some(tick);
        let (mine, subsystems) = match self.roots.get(&tick) {
            Some((root, subs)) => (*root, Some(*subs)),
            None => (self.sim.root(), None),
        };
        let theirs = self.disagreements.get(&tick).cloned().unwrap_or_default();
        tracing::error!(%tick, %mine, peers = theirs.len(), "this node diverged; it stops executing this sim");
        let snapshot = self.sim.snapshot().encode();
        self.out.push_back(CoreOutput::Desync(Box::new(DesyncReport {
            tick,
            mine,
            theirs,
            subsystems,
            snapshot,
            last_inputs: self.last_inputs.iter().cloned().collect(),
        })));
        // Get back in step: ask the peers for their state (again every second until a
        // certified one arrives); commits from now on are kept to replay on top of it.
        self.resync = Some(Resync::default());
    }

    /// Validators (by index) that reported roots different from this node's, over all ticks
    /// remembered.
    pub fn disagreeing_peers(&self) -> BTreeSet<ValidatorIndex> {
        self.disagreements.values().flat_map(|m| m.keys().copied()).collect()
    }

    /// A commit at `now`: its latency from the proposal's first sight, if it was seen here.
    fn committed_at(&mut self, c: &metatopia_consensus::Commit, now: Micros) -> &mut Self {
        self.latency.committed((c.block.tick.0, c.block.view.0), now);
        self
    }

    /// Recent commits' latency here (a block's proposal, as this node first saw it, to its
    /// commit: finalization and the commit rule), microseconds: the median and the 99th
    /// percentile, over the last [`latency::PROPOSALS_REMEMBERED`] commits.
    pub fn commit_latency_us(&self) -> Option<(u64, u64)> {
        self.latency.commit_us()
    }

    /// Recent clients' events' latency here: taken in by this node to executed by it (through
    /// dissemination, a proposal, agreement and the execution's turn), microseconds: the median
    /// and the 99th percentile. Only events submitted through this node count.
    pub fn input_latency_us(&self) -> Option<(u64, u64)> {
        self.latency.input_us()
    }

    /// Validators this node saw equivocate.
    pub fn equivocators(&self) -> &BTreeSet<ValidatorIndex> {
        &self.equivocators
    }

    /// The sim's state root now.
    pub fn root(&mut self) -> Hash32 {
        self.sim.root()
    }

    /// The snapshot of the sim now (for storage and joiners).
    pub fn snapshot(&mut self) -> Snapshot {
        self.sim.snapshot()
    }
}
