//! The deterministic cluster: processes on a simulated network, in virtual time, with one
//! seeded RNG for every decision (turmoil's rule) and faults.
//!
//! - **Time** is virtual microseconds; nothing waits. Each node sees `now + skew` (clock skew).
//! - **Network**: per message, loss, duplication and a delay drawn from `[min, max]` (so
//!   messages reorder); partitions cut links between groups for a time window.
//! - **Crashes** drop a node and everything in flight to it; a restart builds the node again
//!   from what it had persisted.
//! - **Trace hash**: every delivery and wake-up is hashed in order, so the same seed gives the
//!   same hash and different seeds give different runs (checked by tests).

use std::collections::{BTreeMap, BTreeSet};

use metatopia_sim::rng::DetRng;

/// A node of the cluster.
pub type NodeId = u32;
/// Virtual time in microseconds.
pub type Time = u64;

/// Where a message goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dest {
    Node(NodeId),
    /// Every other node.
    All,
}

/// Messages a process wants sent.
#[derive(Debug)]
pub struct Outbox<M> {
    sends: Vec<(Dest, M)>,
}

impl<M> Default for Outbox<M> {
    fn default() -> Self {
        Outbox { sends: Vec::new() }
    }
}

impl<M> Outbox<M> {
    pub fn send(&mut self, to: NodeId, msg: M) {
        self.sends.push((Dest::Node(to), msg));
    }
    pub fn broadcast(&mut self, msg: M) {
        self.sends.push((Dest::All, msg));
    }
}

/// A sans-IO process the cluster can run: a consensus validator, a whole node core, a mock.
pub trait Process {
    type Msg: Clone;
    /// A message arrived (at the process's local time `now`).
    fn on_message(&mut self, now: Time, from: NodeId, msg: Self::Msg, out: &mut Outbox<Self::Msg>);
    /// A timer the process asked for has come.
    fn on_timer(&mut self, now: Time, out: &mut Outbox<Self::Msg>);
    /// The local time the process next wants `on_timer`, if any.
    fn next_timer(&self) -> Option<Time>;
    /// What survives a crash (written before the step's messages left).
    fn persisted(&self) -> Option<Vec<u8>> {
        None
    }
    /// The power of the process's machine is cut (a crash follows): its disk keeps what was
    /// synced, and of writes in flight what `seed` chooses. Processes without a disk ignore it.
    fn power_cut(&self, _seed: u64) {}
    /// Something happens to the process's disk (`seed` chooses where, for a flipped bit).
    /// Processes without a disk ignore it.
    fn disk_fault(&mut self, _fault: DiskFault, _seed: u64) {}
    /// A digest of a message, for the trace hash.
    fn fingerprint(msg: &Self::Msg) -> [u8; 32];
}

/// Network behaviour; probabilities in parts per million.
#[derive(Clone, Copy, Debug)]
pub struct NetConfig {
    pub delay_min_us: Time,
    pub delay_max_us: Time,
    pub loss_ppm: u32,
    pub duplicate_ppm: u32,
}

impl Default for NetConfig {
    fn default() -> NetConfig {
        NetConfig { delay_min_us: 500, delay_max_us: 5_000, loss_ppm: 0, duplicate_ppm: 0 }
    }
}

/// A time window during which links between different groups are cut.
#[derive(Clone, Debug)]
pub struct Partition {
    pub from: Time,
    pub until: Time,
    pub groups: Vec<BTreeSet<NodeId>>,
}

impl Partition {
    fn cuts(&self, at: Time, a: NodeId, b: NodeId) -> bool {
        if at < self.from || at >= self.until {
            return false;
        }
        let group = |n: NodeId| self.groups.iter().position(|g| g.contains(&n));
        group(a) != group(b)
    }
}

/// What can happen to a node's disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskFault {
    /// It is full: writes fail (a write takes what fits first).
    Full,
    /// Room again.
    Room,
    /// A bit flips in the middle of a commit-log segment (the oldest of several).
    FlipLog,
    /// A bit flips in the middle of the newest snapshot.
    FlipSnapshot,
}

/// A fault at a time.
#[derive(Clone, Debug)]
pub enum Fault {
    Crash(NodeId),
    /// A crash by a power cut: what the node's disk had not synced is lost.
    PowerLoss(NodeId),
    /// Something happens to the node's disk while it runs.
    Disk(NodeId, DiskFault),
    Restart(NodeId),
}

#[derive(Debug)]
enum Event<M> {
    Deliver { to: NodeId, from: NodeId, msg: M },
    Wake { node: NodeId },
    Fault(Fault),
}

struct Slot<P> {
    proc: Option<P>,
    skew_us: i64,
    wake: Option<Time>,
    saved: Option<Vec<u8>>,
}

/// Builds a node again after a crash, from its persisted bytes.
pub type Restarter<P> = Box<dyn FnMut(NodeId, Time, Option<Vec<u8>>) -> P>;

/// Counters of what the network did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub cut: u64,
    pub duplicated: u64,
    pub to_crashed: u64,
}

/// The deterministic cluster.
pub struct Cluster<P: Process> {
    now: Time,
    /// What every node's clock read when the cluster started (a real-looking Unix time, in
    /// microseconds, so nodes run at the times they meet outside the lab); `now` counts from it.
    epoch_us: Time,
    rng: DetRng,
    net: NetConfig,
    nodes: Vec<Slot<P>>,
    queue: BTreeMap<(Time, u64), Event<P::Msg>>,
    seq: u64,
    partitions: Vec<Partition>,
    restarter: Option<Restarter<P>>,
    trace: blake3::Hasher,
    stats: NetStats,
}

impl<P: Process> std::fmt::Debug for Cluster<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("now", &self.now).field("nodes", &self.nodes.len()).finish()
    }
}

impl<P: Process> Cluster<P> {
    /// A cluster of `nodes` (ids are their positions) on a network, seeded; the nodes' clocks
    /// start at 0.
    pub fn new(seed: u64, net: NetConfig, nodes: Vec<P>) -> Cluster<P> {
        Cluster::starting_at(seed, net, nodes, 0)
    }

    /// A cluster whose nodes' clocks start at `epoch_us` (Unix microseconds): virtual time
    /// ([`Cluster::now`], faults, partitions) still counts from 0, and a node at virtual time t
    /// reads `epoch_us + t` (plus its skew).
    pub fn starting_at(seed: u64, net: NetConfig, nodes: Vec<P>, epoch_us: Time) -> Cluster<P> {
        let mut c = Cluster {
            now: 0,
            epoch_us,
            rng: DetRng::from_u64(seed),
            net,
            nodes: nodes.into_iter().map(|p| Slot { proc: Some(p), skew_us: 0, wake: None, saved: None }).collect(),
            queue: BTreeMap::new(),
            seq: 0,
            partitions: Vec::new(),
            restarter: None,
            trace: blake3::Hasher::new(),
            stats: NetStats::default(),
        };
        c.trace.update(&seed.to_le_bytes());
        for id in 0..c.nodes.len() as NodeId {
            c.schedule_wake(id);
        }
        c
    }

    pub fn now(&self) -> Time {
        self.now
    }
    pub fn len(&self) -> usize {
        self.nodes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
    pub fn stats(&self) -> NetStats {
        self.stats
    }
    /// The RNG every decision uses, for callers that add their own (schedules, inputs).
    pub fn rng(&mut self) -> &mut DetRng {
        &mut self.rng
    }

    /// The node, unless crashed.
    pub fn node(&self, id: NodeId) -> Option<&P> {
        self.nodes.get(id as usize).and_then(|s| s.proc.as_ref())
    }
    pub fn node_mut(&mut self, id: NodeId) -> Option<&mut P> {
        self.nodes.get_mut(id as usize).and_then(|s| s.proc.as_mut())
    }
    pub fn is_up(&self, id: NodeId) -> bool {
        self.node(id).is_some()
    }
    /// The network from now on (messages already in flight keep their delivery times).
    pub fn set_net(&mut self, net: NetConfig) {
        self.net = net;
    }
    pub fn set_skew(&mut self, id: NodeId, skew_us: i64) {
        self.nodes[id as usize].skew_us = skew_us;
        self.schedule_wake(id);
    }
    pub fn add_partition(&mut self, p: Partition) {
        self.partitions.push(p);
    }
    pub fn set_restarter(&mut self, r: Restarter<P>) {
        self.restarter = Some(r);
    }
    pub fn schedule_fault(&mut self, at: Time, fault: Fault) {
        self.push(at, Event::Fault(fault));
    }

    /// Digest of everything that happened so far.
    pub fn trace_hash(&self) -> [u8; 32] {
        *self.trace.clone().finalize().as_bytes()
    }

    /// The local clock of a node.
    pub fn local_time(&self, id: NodeId) -> Time {
        local(self.now + self.epoch_us, self.nodes[id as usize].skew_us)
    }

    /// What the nodes' clocks read at virtual time 0.
    pub fn epoch_us(&self) -> Time {
        self.epoch_us
    }

    /// Run a step of one node's code by hand (to inject inputs such as client events).
    pub fn with_node(&mut self, id: NodeId, f: impl FnOnce(&mut P, Time, &mut Outbox<P::Msg>)) {
        let now = self.local_time(id);
        let mut out = Outbox::default();
        let Some(p) = self.nodes[id as usize].proc.as_mut() else { return };
        f(p, now, &mut out);
        self.after_step(id, out);
    }

    /// Run until virtual time `until`, calling `check` after every step.
    pub fn run_until(&mut self, until: Time, mut check: impl FnMut(&Cluster<P>)) {
        while let Some((&(at, seq), _)) = self.queue.first_key_value() {
            if at > until {
                break;
            }
            let ev = self.queue.remove(&(at, seq)).expect("peeked");
            self.now = at;
            self.dispatch(ev);
            check(self);
        }
        self.now = self.now.max(until);
    }

    fn push(&mut self, at: Time, ev: Event<P::Msg>) {
        self.seq += 1;
        self.queue.insert((at, self.seq), ev);
    }

    fn dispatch(&mut self, ev: Event<P::Msg>) {
        match ev {
            Event::Deliver { to, from, msg } => {
                let slot = &mut self.nodes[to as usize];
                let Some(p) = slot.proc.as_mut() else {
                    self.stats.to_crashed += 1;
                    return;
                };
                self.stats.delivered += 1;
                self.trace.update(&self.now.to_le_bytes());
                self.trace.update(&[0]);
                self.trace.update(&from.to_le_bytes());
                self.trace.update(&to.to_le_bytes());
                self.trace.update(&P::fingerprint(&msg));
                let mut out = Outbox::default();
                p.on_message(local(self.now + self.epoch_us, slot.skew_us), from, msg, &mut out);
                self.after_step(to, out);
            }
            Event::Wake { node } => {
                let slot = &mut self.nodes[node as usize];
                let Some(p) = slot.proc.as_mut() else { return };
                let due = p.next_timer().map(|t| global(t, slot.skew_us).saturating_sub(self.epoch_us));
                if slot.wake != Some(self.now) || due.is_none_or(|d| d > self.now) {
                    // Stale wake-up: a newer one is (or will be) scheduled.
                    if slot.wake == Some(self.now) {
                        slot.wake = None;
                        self.schedule_wake(node);
                    }
                    return;
                }
                slot.wake = None;
                self.trace.update(&self.now.to_le_bytes());
                self.trace.update(&[1]);
                self.trace.update(&node.to_le_bytes());
                let mut out = Outbox::default();
                p.on_timer(local(self.now + self.epoch_us, slot.skew_us), &mut out);
                self.after_step(node, out);
            }
            Event::Fault(Fault::Crash(id)) => {
                let slot = &mut self.nodes[id as usize];
                if let Some(p) = slot.proc.take() {
                    slot.saved = p.persisted();
                    slot.wake = None;
                }
                self.trace.update(&[2]);
                self.trace.update(&id.to_le_bytes());
            }
            Event::Fault(Fault::Disk(id, fault)) => {
                let seed = self.rng.next_u64();
                if let Some(p) = self.nodes[id as usize].proc.as_mut() {
                    p.disk_fault(fault, seed);
                }
                self.trace.update(&[5, fault as u8]);
                self.trace.update(&id.to_le_bytes());
            }
            Event::Fault(Fault::PowerLoss(id)) => {
                let seed = self.rng.next_u64();
                let slot = &mut self.nodes[id as usize];
                if let Some(p) = slot.proc.take() {
                    slot.saved = p.persisted();
                    p.power_cut(seed);
                    slot.wake = None;
                }
                self.trace.update(&[4]);
                self.trace.update(&id.to_le_bytes());
            }
            Event::Fault(Fault::Restart(id)) => {
                if self.nodes[id as usize].proc.is_some() {
                    return;
                }
                let saved = self.nodes[id as usize].saved.take();
                let now = self.local_time(id);
                let Some(r) = self.restarter.as_mut() else { return };
                let p = r(id, now, saved);
                self.nodes[id as usize].proc = Some(p);
                self.trace.update(&[3]);
                self.trace.update(&id.to_le_bytes());
                self.schedule_wake(id);
            }
        }
    }

    fn after_step(&mut self, id: NodeId, out: Outbox<P::Msg>) {
        for (dest, msg) in out.sends {
            match dest {
                Dest::Node(to) => self.transmit(id, to, msg),
                Dest::All => {
                    for to in 0..self.nodes.len() as NodeId {
                        if to != id {
                            self.transmit(id, to, msg.clone());
                        }
                    }
                }
            }
        }
        self.schedule_wake(id);
    }

    fn transmit(&mut self, from: NodeId, to: NodeId, msg: P::Msg) {
        if to as usize >= self.nodes.len() {
            return;
        }
        self.stats.sent += 1;
        if self.partitions.iter().any(|p| p.cuts(self.now, from, to)) {
            self.stats.cut += 1;
            return;
        }
        if self.rng.chance(u64::from(self.net.loss_ppm), 1_000_000) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(u64::from(self.net.duplicate_ppm), 1_000_000) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let span = self.net.delay_max_us.saturating_sub(self.net.delay_min_us);
            let delay = self.net.delay_min_us + self.rng.below(span + 1);
            self.push(self.now + delay, Event::Deliver { to, from, msg: msg.clone() });
        }
    }

    fn schedule_wake(&mut self, id: NodeId) {
        let slot = &self.nodes[id as usize];
        let Some(p) = slot.proc.as_ref() else { return };
        let Some(t) = p.next_timer() else { return };
        let at = global(t, slot.skew_us).saturating_sub(self.epoch_us).max(self.now);
        if slot.wake.is_some_and(|w| w <= at) {
            return;
        }
        self.nodes[id as usize].wake = Some(at);
        self.push(at, Event::Wake { node: id });
    }
}

fn local(now: Time, skew: i64) -> Time {
    (now as i128 + skew as i128).max(0) as Time
}

fn global(t: Time, skew: i64) -> Time {
    (t as i128 - skew as i128).max(0) as Time
}
