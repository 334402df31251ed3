//! The node core as a process of `scenarios`' deterministic cluster: the same code as on the
//! real network, with the network and the clock simulated (DESIGN §3, §13).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use metatopia_consensus::mocks::Byzantine;
use metatopia_consensus::{Digest, Message, Micros, Output, Validator, ValidatorIndex};
use metatopia_scenarios::{DiskFault, NodeId, Outbox, Process, Time};
use metatopia_sim::host::{PhysicsStage, ScriptHost};
use metatopia_sim::{Hash32, Tick};

use metatopia_node::core::{Agreement, CoreOutput, NodeCore};
use metatopia_node::net::wire::NodeMsg;
use metatopia_node::shell::persist::{Persister, holds_votes};
use metatopia_node::store::{Disk, LogRecord, SimDisk};

/// An honest validator or a Byzantine mock, behind the node's agreement trait.
#[derive(Debug)]
pub enum Actor {
    Honest(Box<Validator>),
    /// Honest, with the validator set following governance epoch by epoch.
    Epochs(Box<metatopia_node::core::epochs::Epochs>),
    /// A mock and the size of the validator set.
    Byz(Box<Byzantine>, usize),
}

impl Agreement for Actor {
    fn handle_message(&mut self, now: Micros, from: ValidatorIndex, msg: Message) {
        match self {
            Actor::Honest(v) => v.handle_message(now, from, msg),
            Actor::Epochs(e) => e.handle_message(now, from, msg),
            Actor::Byz(b, _) => b.handle_message(now, from, msg),
        }
    }
    fn handle_timeout(&mut self, now: Micros) {
        match self {
            Actor::Honest(v) => v.handle_timeout(now),
            Actor::Epochs(e) => e.handle_timeout(now),
            Actor::Byz(b, _) => b.handle_timeout(now),
        }
    }
    fn submit_events(&mut self, now: Micros, events: Vec<Vec<u8>>) {
        match self {
            Actor::Honest(v) => v.submit_events(now, events),
            Actor::Epochs(e) => e.submit_events(now, events),
            Actor::Byz(b, _) => events.into_iter().for_each(|e| b.submit_event(now, e)),
        }
    }
    fn poll_output(&mut self) -> Option<Output> {
        match self {
            Actor::Honest(v) => v.poll_output(),
            Actor::Epochs(e) => e.poll_output(),
            Actor::Byz(b, _) => b.poll_output(),
        }
    }
    fn poll_timeout(&self) -> Option<Micros> {
        match self {
            Actor::Honest(v) => v.poll_timeout(),
            Actor::Epochs(e) => e.poll_timeout(),
            Actor::Byz(b, _) => b.poll_timeout(),
        }
    }
    fn report_root(&mut self, tick: Tick, root: Digest) {
        match self {
            Actor::Honest(v) => v.report_root(tick, root),
            Actor::Epochs(e) => e.report_root(tick, root),
            Actor::Byz(..) => {}
        }
    }
    fn validators(&self) -> usize {
        match self {
            Actor::Honest(v) => v.keys().len(),
            Actor::Epochs(e) => e.validators(),
            Actor::Byz(_, n) => *n,
        }
    }
    fn persist(&self) -> Option<Vec<u8>> {
        match self {
            Actor::Honest(v) => Some(v.persist()),
            Actor::Epochs(e) => e.persist(),
            Actor::Byz(..) => None,
        }
    }
    fn pool_len(&self) -> usize {
        match self {
            Actor::Honest(v) => v.pool_len(),
            Actor::Epochs(e) => e.pool_len(),
            Actor::Byz(..) => 0,
        }
    }
    fn peer_roots(&self, tick: Tick) -> Vec<(ValidatorIndex, Digest)> {
        match self {
            Actor::Honest(v) => Agreement::peer_roots(v.as_ref(), tick),
            Actor::Epochs(e) => e.peer_roots(tick),
            Actor::Byz(..) => Vec::new(),
        }
    }
    fn handle_epoch_message(&mut self, now: Micros, from: ValidatorIndex, epoch: u64, msg: Message) {
        match self {
            Actor::Epochs(e) => e.handle_epoch_message(now, from, epoch, msg),
            other if epoch == 0 => other.handle_message(now, from, msg),
            _ => {}
        }
    }
    fn poll_epoch_output(&mut self) -> Option<(u64, Output)> {
        match self {
            Actor::Epochs(e) => e.poll_epoch_output(),
            other => other.poll_output().map(|o| (0, o)),
        }
    }
    fn on_executed(&mut self, now: Micros, tick: Tick, world: &metatopia_sim::World) {
        if let Actor::Epochs(e) = self {
            e.on_executed(now, tick, world);
        }
    }
    // Joining is what epochs do (a joining node starts from a peer's epoch and view).
    fn learn_peer(&mut self, index: u16, key: metatopia_consensus::VerifyingKey) {
        if let Actor::Epochs(e) = self {
            e.learn_peer(index, key);
        }
    }
    fn join_state(&self) -> Option<Vec<u8>> {
        match self {
            Actor::Epochs(e) => e.join_state(),
            _ => None,
        }
    }
    fn join_from(&mut self, now: Micros, state: &[u8]) -> bool {
        match self {
            Actor::Epochs(e) => e.join_from(now, state),
            _ => false,
        }
    }
    fn commit_from(&mut self, now: Micros, tick: Tick) {
        match self {
            Actor::Honest(v) => Agreement::commit_from(v.as_mut(), now, tick),
            Actor::Epochs(e) => e.commit_from(now, tick),
            Actor::Byz(..) => {}
        }
    }
    fn hold(&mut self, now: Micros) {
        match self {
            Actor::Honest(v) => Agreement::hold(v.as_mut(), now),
            Actor::Epochs(e) => e.hold(now),
            Actor::Byz(..) => {}
        }
    }
    fn recall(&mut self, logged: Vec<metatopia_consensus::Logged>) -> usize {
        match self {
            Actor::Honest(v) => v.recall(logged),
            Actor::Epochs(e) => e.recall(logged),
            Actor::Byz(..) => 0,
        }
    }
    fn position(&self) -> (u64, u64, Option<Tick>) {
        match self {
            Actor::Honest(v) => Agreement::position(v.as_ref()),
            Actor::Epochs(e) => e.position(),
            Actor::Byz(..) => (0, 0, None),
        }
    }
    fn describe(&self) -> String {
        match self {
            Actor::Honest(v) => v.describe(),
            Actor::Epochs(e) => e.describe(),
            Actor::Byz(..) => String::new(),
        }
    }
    fn behind_epoch(&self) -> bool {
        matches!(self, Actor::Epochs(e) if e.behind_epoch())
    }
    fn rejoin(&mut self, now: Micros) {
        match self {
            Actor::Epochs(e) => e.rejoin(now),
            other => other.hold(now),
        }
    }
    fn peers_executed(&self) -> Option<Tick> {
        match self {
            Actor::Honest(v) => v.peers_executed(),
            Actor::Epochs(e) => e.peers_executed(),
            Actor::Byz(..) => None,
        }
    }
}

/// What a simulated node keeps on its "disk": its consensus state and its commit log.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Saved {
    pub consensus: Option<Vec<u8>>,
    pub log: Vec<LogRecord>,
}

/// Where the other sims of a world of several sims are, for one node.
#[derive(Clone, Debug)]
pub struct WorldPlace {
    /// This node's cluster id.
    pub me: NodeId,
    /// Every cluster node of this node's sim (broadcasts stay inside the sim).
    pub sim_nodes: Arc<Vec<NodeId>>,
    /// The validators' cluster nodes of each neighbour sim: this node sends its signed copy of
    /// the mail for a neighbour to one of them (chosen by `me`, so copies spread).
    pub neighbours: Arc<BTreeMap<metatopia_sim::SimId, Vec<NodeId>>>,
}

/// Each node's outputs so far, kept across its crashes (what it did before one is still what it
/// did; the verdicts read it), by cluster node.
pub type Histories = Arc<Mutex<BTreeMap<NodeId, Vec<CoreOutput>>>>;

/// A node's data directory on a simulated disk, written through the node's own [`Persister`]
/// (the order of writes and syncs of the real node's loop).
#[derive(Debug)]
pub struct DiskStore {
    pub id: NodeId,
    pub disk: Arc<SimDisk>,
    pub persister: Persister,
    pub histories: Histories,
    /// Where a node that stopped on a disk error says why (the run's report shows it).
    pub stops: Arc<Mutex<Vec<String>>>,
}

/// Snapshots every this many ticks in the simulated cluster (the node's default is larger; the
/// scenarios are short and should restart from snapshots too). A multiple of the physics'
/// full-hash interval, as a node's `snapshot_every` must be.
pub const SIM_SNAPSHOT_EVERY: u64 = 2 * metatopia_physics::region::FULL_ROOT_EVERY;

/// One node of a simulated sim.
pub struct CoreProcess<A, H, P> {
    pub core: NodeCore<A, H, P>,
    /// Cluster node ids per validator index (twins share an index).
    pub nodes_of: Arc<BTreeMap<u16, Vec<NodeId>>>,
    /// What the core handed out besides messages, in order (executed ticks, divergences).
    pub log: Vec<CoreOutput>,
    /// Set in a world of several sims.
    pub place: Option<WorldPlace>,
    /// When the commits waiting for execution run (a core built with
    /// [`NodeCore::defer_execution`], as real nodes are: their votes leave first).
    deferred_at: Option<Time>,
    /// Its store on a simulated disk (else it persists through [`Process::persisted`]).
    pub store: Option<DiskStore>,
    /// Why it stopped: its disk refused a write (full, read-only), as a real node stops.
    pub failed: Option<String>,
}

/// How long after its commit a deferred tick executes in the simulated cluster (a real node
/// executes at its loop's next turn, after sending the votes; a crash in between must lose
/// nothing that was committed).
pub const EXEC_DELAY_US: Time = 2_000;

impl<A, H: ScriptHost, P: PhysicsStage> std::fmt::Debug for CoreProcess<A, H, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreProcess").field("core", &self.core).field("log", &self.log.len()).finish()
    }
}

impl<A: Agreement, H: ScriptHost, P: PhysicsStage> CoreProcess<A, H, P> {
    pub fn new(core: NodeCore<A, H, P>, nodes_of: Arc<BTreeMap<u16, Vec<NodeId>>>) -> Self {
        CoreProcess { core, nodes_of, log: Vec::new(), place: None, deferred_at: None, store: None, failed: None }
    }

    /// Persist through the node's own store on `store`'s simulated disk.
    pub fn with_store(self, store: DiskStore) -> Self {
        CoreProcess { core: self.core.snapshots_every(SIM_SNAPSHOT_EVERY), store: Some(store), ..self }
    }

    /// A node of one sim of several in the same cluster.
    pub fn in_world(mut self, place: WorldPlace) -> Self {
        self.place = Some(place);
        self
    }

    /// Forward the core's outputs: messages to the network, the rest to the log.
    pub fn drain(&mut self, out: &mut Outbox<NodeMsg>) {
        let mut outs = Vec::new();
        while let Some(o) = self.core.poll_output() {
            outs.push(o);
        }
        // Written (and synced) before anything leaves, as the node's loop does.
        if let Some(s) = self.store.as_mut()
            && self.failed.is_none()
            && let Err(e) = persist(&mut s.persister, &mut self.core, &outs)
        {
            let why = format!("{e:#}");
            s.stops.lock().unwrap_or_else(|e| e.into_inner()).push(format!("node {} stopped: {why}", s.id));
            self.failed = Some(why);
        }
        if self.failed.is_some() {
            return;
        }
        for o in outs {
            match o {
                CoreOutput::Broadcast(m) => match &self.place {
                    Some(p) => {
                        for n in p.sim_nodes.iter().filter(|n| **n != p.me) {
                            out.send(*n, m.clone());
                        }
                    }
                    None => out.broadcast(m),
                },
                CoreOutput::Mail { to, tick, event } => {
                    if let Some(p) = &self.place
                        && let Some(nodes) = p.neighbours.get(&to).filter(|n| !n.is_empty())
                    {
                        out.send(nodes[p.me as usize % nodes.len()], NodeMsg::Mail(event));
                    }
                    // The log keeps where and when (the bytes left).
                    self.log.push(CoreOutput::Mail { to, tick, event: Vec::new() });
                }
                CoreOutput::Send(to, m) => {
                    for n in self.nodes_of.get(&to.0).into_iter().flatten() {
                        out.send(*n, m.clone());
                    }
                }
                // The log keeps the tick (the bytes are on the disk).
                CoreOutput::Snapshot { tick, .. } => self.log.push(CoreOutput::Snapshot { tick, bytes: Vec::new() }),
                other => self.log.push(other),
            }
        }
    }

    /// Client events arriving at this node.
    pub fn submit(&mut self, now: Time, events: Vec<Vec<u8>>, out: &mut Outbox<NodeMsg>) -> usize {
        let n = self.core.submit_events(now, events);
        self.drain(out);
        self.schedule(now);
        n
    }

    /// Deferred commits execute [`EXEC_DELAY_US`] after the first of them arrived.
    fn schedule(&mut self, now: Time) {
        if self.deferred_at.is_none() && self.core.has_deferred() {
            self.deferred_at = Some(now + EXEC_DELAY_US);
        }
    }

    /// The root of every tick this node executed, from its log.
    pub fn executed_roots(&self) -> BTreeMap<Tick, Hash32> {
        self.log
            .iter()
            .filter_map(|o| match o {
                CoreOutput::Executed { tick, root, .. } => Some((*tick, *root)),
                _ => None,
            })
            .collect()
    }

    fn index_of(&self, node: NodeId) -> Option<ValidatorIndex> {
        self.nodes_of.iter().find(|(_, ns)| ns.contains(&node)).map(|(i, _)| ValidatorIndex(*i))
    }
}

/// The turn's outputs into the store, in the node's order.
fn persist<A: Agreement, H: ScriptHost, P: PhysicsStage>(
    store: &mut Persister,
    core: &mut NodeCore<A, H, P>,
    outs: &[CoreOutput],
) -> anyhow::Result<()> {
    for o in outs {
        match o {
            CoreOutput::Committed(r) => store.committed(r)?,
            CoreOutput::Snapshot { tick, bytes } => store.snapshot(*tick, bytes)?,
            CoreOutput::Resynced { tick, snapshot, .. } => store.resynced(*tick, snapshot)?,
            _ => {}
        }
    }
    store.before_sending(holds_votes(outs), || core.agreement().persist().unwrap_or_default())
}

impl<A: Agreement, H: ScriptHost, P: PhysicsStage> Process for CoreProcess<A, H, P> {
    type Msg = NodeMsg;

    fn on_message(&mut self, now: Time, from: NodeId, msg: NodeMsg, out: &mut Outbox<NodeMsg>) {
        if self.failed.is_some() {
            return;
        }
        if let NodeMsg::Mail(_) = msg {
            // From a neighbour sim's validator: not a peer of this sim.
            self.core.handle_message(now, ValidatorIndex(u16::MAX), msg);
            self.drain(out);
            self.schedule(now);
            return;
        }
        let Some(from) = self.index_of(from) else { return };
        self.core.handle_message(now, from, msg);
        self.drain(out);
        self.schedule(now);
    }

    fn on_timer(&mut self, now: Time, out: &mut Outbox<NodeMsg>) {
        if self.failed.is_some() {
            return;
        }
        if self.deferred_at.is_some_and(|t| t <= now) {
            self.deferred_at = None;
            self.core.execute_deferred(now);
        }
        self.core.handle_timeout(now);
        self.drain(out);
        self.schedule(now);
    }

    fn next_timer(&self) -> Option<Time> {
        if self.failed.is_some() {
            return None;
        }
        match (self.core.poll_timeout(), self.deferred_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn persisted(&self) -> Option<Vec<u8>> {
        if let Some(s) = &self.store {
            // Its disk is its disk; what it did waits for the restart in the histories.
            s.histories.lock().unwrap_or_else(|e| e.into_inner()).insert(s.id, self.log.clone());
            return None;
        }
        let log = self
            .log
            .iter()
            .filter_map(|o| match o {
                CoreOutput::Committed(r) => Some((**r).clone()),
                _ => None,
            })
            .collect();
        postcard::to_allocvec(&Saved { consensus: self.core.agreement().persist(), log }).ok()
    }

    fn power_cut(&self, seed: u64) {
        if let Some(s) = &self.store {
            s.disk.power_loss(seed);
        }
    }

    fn disk_fault(&mut self, fault: DiskFault, seed: u64) {
        let Some(s) = &self.store else { return };
        let disk = &s.disk;
        let file = |dir: &str, ext: &str, newest: bool| -> Option<std::path::PathBuf> {
            let mut files: Vec<_> = disk
                .list(&std::path::Path::new("/node").join(dir))
                .ok()?
                .into_iter()
                .filter(|p| p.extension().is_some_and(|x| x == ext))
                .collect();
            files.sort();
            if newest { files.pop() } else { files.into_iter().next() }
        };
        let flip = |path: Option<std::path::PathBuf>| {
            if let Some(p) = path
                && let Ok(len) = disk.len(&p)
                && len > 0
            {
                let _ = disk.flip_bit(&p, len / 2, (seed % 8) as u8);
            }
        };
        match fault {
            DiskFault::Full => disk.set_capacity(Some(disk.used())),
            DiskFault::Room => disk.set_capacity(None),
            DiskFault::FlipLog => flip(file("log", "seg", false)),
            DiskFault::FlipSnapshot => flip(file("snapshots", "snap", true)),
        }
    }

    fn fingerprint(msg: &NodeMsg) -> [u8; 32] {
        *blake3::hash(&msg.encode()).as_bytes()
    }
}
