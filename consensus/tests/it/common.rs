//! The agreement suite's harness: validators (honest, Byzantine mocks, twins) as processes of
//! the deterministic cluster, random fault schedules, and the invariants checked every step.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use metatopia_consensus::mocks::{Behaviour, Byzantine};
use metatopia_consensus::{
    Commit, Config, Digest, Logged, Message, Micros, Output, SigCache, SigningKey, Validator, ValidatorIndex,
    VerifyingKey,
};
use metatopia_scenarios::{Cluster, Fault, NetConfig, NodeId, Outbox, Partition, Process, Time};
use metatopia_sim::rng::DetRng;

pub const MS: Time = 1_000;
pub const SEC: Time = 1_000_000;

pub fn key(i: u16) -> SigningKey {
    let mut b = [7u8; 32];
    b[..2].copy_from_slice(&i.to_le_bytes());
    SigningKey::from_bytes(&b)
}

/// The cluster's roles.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    Honest,
    Byzantine(Behaviour),
    /// Shares its key (and index) with another node; both count as the one faulty validator.
    Twin,
}

pub enum Actor {
    Honest(Box<Validator>),
    Byz(Box<Byzantine>),
}

/// One validator process.
pub struct Node {
    pub actor: Actor,
    pub index: ValidatorIndex,
    pub role: Role,
    /// Node ids per validator index (twins share an index).
    pub nodes_of: Arc<BTreeMap<u16, Vec<NodeId>>>,
    pub commits: Vec<(Time, Commit)>,
    pub evidence: u32,
    pub mismatches: u32,
    pub incarnation: u32,
    /// State root stand-in: a hash chain over committed digests, reported back to consensus.
    pub app_root: Digest,
    /// The agreement's persisted state, written at every step.
    saved: Vec<u8>,
    /// The commit log an application keeps (its newest `LOG_KEEP` records): given back to a
    /// restarted validator ([`Validator::recall`]) as a node does from its log on disk.
    log: VecDeque<Logged>,
}

/// Records a validator's commit log keeps.
const LOG_KEEP: usize = 4_096;

/// What survives a crash: the agreement's state and the commit log.
#[derive(serde::Serialize, serde::Deserialize)]
struct Disk {
    state: Vec<u8>,
    log: VecDeque<Logged>,
}

pub fn config(sig_cache: &Arc<SigCache>) -> Config {
    Config {
        period_us: 50 * MS,
        leader_timeout_us: 250 * MS,
        notarize_timeout_us: 500 * MS,
        retry_us: 250 * MS,
        max_drift_ms: 500,
        sig_cache: sig_cache.clone(),
        // As a node runs: a block covers up to two seconds of ticks.
        max_span_us: 2 * SEC,
        ..Config::default()
    }
}

impl Node {
    fn drain(&mut self, now: Micros, out: &mut Outbox<Message>) {
        loop {
            let o = match &mut self.actor {
                Actor::Honest(v) => v.poll_output(),
                Actor::Byz(b) => b.poll_output(),
            };
            let Some(o) = o else { break };
            match o {
                Output::Broadcast(m) => out.broadcast(m),
                Output::Send(to, m) => {
                    for n in self.nodes_of.get(&to.0).into_iter().flatten() {
                        out.send(*n, m.clone());
                    }
                }
                Output::Committed(c) => {
                    let mut h = blake3::Hasher::new();
                    h.update(&self.app_root.0);
                    h.update(&c.digest.0);
                    self.app_root = Digest(*h.finalize().as_bytes());
                    let (tick, root) = (c.block.tick, self.app_root);
                    if self.log.len() == LOG_KEEP {
                        self.log.pop_front();
                    }
                    self.log.push_back(Logged {
                        tick,
                        time_ms: c.block.time_ms,
                        events: c.block.events.clone(),
                        notarization: c.certificate.clone(),
                        opener: c.opener.clone(),
                    });
                    self.commits.push((now, *c));
                    if let Actor::Honest(v) = &mut self.actor {
                        v.report_root(tick, root);
                    }
                }
                Output::Evidence(_) => self.evidence += 1,
                Output::Finalized { .. } => {}
                Output::RootMismatch { .. } => self.mismatches += 1,
            }
        }
        if let Actor::Honest(v) = &self.actor {
            self.saved = v.persist();
        }
    }

    /// The honest validator this node runs, if it runs one.
    pub fn validator(&self) -> Option<&Validator> {
        match &self.actor {
            Actor::Honest(v) => Some(v),
            Actor::Byz(_) => None,
        }
    }

    pub fn honest(&self) -> bool {
        self.role == Role::Honest
    }

    pub fn submit(&mut self, now: Micros, event: Vec<u8>, out: &mut Outbox<Message>) {
        match &mut self.actor {
            Actor::Honest(v) => v.submit_event(now, event),
            Actor::Byz(b) => b.submit_event(now, event),
        }
        self.drain(now, out);
    }
}

impl Process for Node {
    type Msg = Message;

    fn on_message(&mut self, now: Time, from: NodeId, msg: Message, out: &mut Outbox<Message>) {
        let from_index = self.nodes_of.iter().find(|(_, ns)| ns.contains(&from)).map(|(i, _)| ValidatorIndex(*i));
        let Some(from) = from_index else { return };
        match &mut self.actor {
            Actor::Honest(v) => v.handle_message(now, from, msg),
            Actor::Byz(b) => b.handle_message(now, from, msg),
        }
        self.drain(now, out);
    }

    fn on_timer(&mut self, now: Time, out: &mut Outbox<Message>) {
        match &mut self.actor {
            Actor::Honest(v) => v.handle_timeout(now),
            Actor::Byz(b) => b.handle_timeout(now),
        }
        self.drain(now, out);
    }

    fn next_timer(&self) -> Option<Time> {
        match &self.actor {
            Actor::Honest(v) => v.poll_timeout(),
            Actor::Byz(b) => b.poll_timeout(),
        }
    }

    fn persisted(&self) -> Option<Vec<u8>> {
        let disk = Disk { state: self.saved.clone(), log: self.log.clone() };
        (!self.saved.is_empty()).then(|| postcard::to_allocvec(&disk).expect("encoding into a Vec"))
    }

    fn fingerprint(msg: &Message) -> [u8; 32] {
        *blake3::hash(&msg.encode()).as_bytes()
    }
}

/// A cluster to build: roles per node id (the twin, if any, is the last node and shares the
/// key of validator `twin_of`).
#[derive(Clone, Debug)]
pub struct Setup {
    pub n: u16,
    pub roles: Vec<Role>,
    pub twin_of: Option<u16>,
    pub planted_bug: bool,
    /// Finalized blocks each validator keeps (`Config::keep_blocks`), when not the default.
    pub keep_blocks: Option<u64>,
    /// A one-byte `Config::keep_bytes`, so the validators keep only their newest this many
    /// finalized blocks (`Config::keep_blocks_min`).
    pub keep_bytes_min_blocks: Option<u64>,
    /// A restarted validator gets its committed blocks back from its commit log
    /// ([`Validator::recall`]), as a node does; `false` shows what goes wrong without.
    pub recall: bool,
    /// The tick period (`Config::period_us`), when not the default 50 ms.
    pub period_us: Option<Micros>,
    /// `Config::max_span_us`, when not the node's second (0: one tick a block).
    pub max_span_us: Option<Micros>,
    /// `Config::last_tick`: the epoch's last tick.
    pub last_tick: Option<u64>,
    /// Plain round robin (`Config::leader_reputation` off): what a crashed leader cost before.
    pub round_robin: bool,
    /// `Config::fill_lead_us` (R1 fills), when not off.
    pub fill_lead_us: Option<Micros>,
}

impl Setup {
    pub fn honest(n: u16) -> Setup {
        Setup {
            n,
            roles: vec![Role::Honest; n as usize],
            twin_of: None,
            planted_bug: false,
            keep_blocks: None,
            keep_bytes_min_blocks: None,
            recall: true,
            period_us: None,
            max_span_us: None,
            last_tick: None,
            round_robin: false,
            fill_lead_us: None,
        }
    }

    pub fn f(&self) -> u16 {
        (self.n - 1) / 3
    }
}

pub fn build(setup: &Setup, seed: u64, net: NetConfig, cache: &Arc<SigCache>) -> Cluster<Node> {
    let keys: Vec<VerifyingKey> = (0..setup.n).map(|i| key(i).verifying_key()).collect();
    let mut nodes_of: BTreeMap<u16, Vec<NodeId>> = (0..setup.n).map(|i| (i, vec![u32::from(i)])).collect();
    if let Some(t) = setup.twin_of {
        nodes_of.get_mut(&t).expect("twin of a validator").push(u32::from(setup.n));
    }
    let nodes_of = Arc::new(nodes_of);
    let mut cfg = config(cache);
    cfg.planted_bug_weak_quorum = setup.planted_bug;
    if let Some(keep) = setup.keep_blocks {
        cfg.keep_blocks = keep;
    }
    if let Some(period) = setup.period_us {
        cfg.period_us = period;
    }
    if let Some(span) = setup.max_span_us {
        cfg.max_span_us = span;
    }
    if let Some(lead) = setup.fill_lead_us {
        cfg.fill_lead_us = lead;
    }
    cfg.last_tick = setup.last_tick.map(metatopia_consensus::Tick);
    cfg.leader_reputation = !setup.round_robin;
    if let Some(min) = setup.keep_bytes_min_blocks {
        cfg.keep_bytes = 1;
        cfg.keep_blocks_min = min;
    }
    let (n, twin_of, recall) = (setup.n, setup.twin_of, setup.recall);
    let make = move |id: NodeId, role: Role, now: Time, saved: Option<Vec<u8>>| -> Node {
        let index = if id == u32::from(n) { twin_of.expect("twin") } else { id as u16 };
        let k = key(index);
        let disk: Option<Disk> = saved.map(|b| postcard::from_bytes(&b).expect("own disk"));
        let log = disk.as_ref().map(|d| d.log.clone()).unwrap_or_default();
        let actor = match (role, disk) {
            (Role::Byzantine(b), _) => Actor::Byz(Box::new(Byzantine::new(cfg.clone(), k, keys.clone(), now, b))),
            (_, Some(disk)) => {
                let mut v =
                    Validator::restore(cfg.clone(), k, keys.clone(), now, &disk.state).expect("own persisted state");
                if recall {
                    v.recall(disk.log);
                }
                Actor::Honest(Box::new(v))
            }
            (_, None) => Actor::Honest(Box::new(Validator::new(cfg.clone(), k, keys.clone(), now))),
        };
        // What a crash would leave on disk right now: the state the node starts from (a node
        // that crashes again before its first step must not fall back to genesis).
        let saved = match &actor {
            Actor::Honest(v) => v.persist(),
            Actor::Byz(_) => Vec::new(),
        };
        Node {
            actor,
            index: ValidatorIndex(index),
            role,
            nodes_of: nodes_of.clone(),
            commits: Vec::new(),
            evidence: 0,
            mismatches: 0,
            incarnation: 0,
            app_root: Digest::default(),
            saved,
            log,
        }
    };
    let mut roles = setup.roles.clone();
    if setup.twin_of.is_some() {
        roles.push(Role::Twin);
        if let Some(t) = setup.twin_of {
            roles[t as usize] = Role::Twin;
        }
    }
    let make = Arc::new(make);
    let nodes: Vec<Node> = roles.iter().enumerate().map(|(i, r)| make(i as NodeId, *r, 0, None)).collect();
    let mut cluster = Cluster::new(seed, net, nodes);
    let roles_for_restart = roles.clone();
    let mut incarnations: BTreeMap<NodeId, u32> = BTreeMap::new();
    cluster.set_restarter(Box::new(move |id, now, saved| {
        let mut node = make(id, roles_for_restart[id as usize], now, saved);
        let inc = incarnations.entry(id).or_insert(0);
        *inc += 1;
        node.incarnation = *inc;
        node
    }));
    cluster
}

/// Submit a client event at a node (by hand, outside the network).
pub fn submit(cluster: &mut Cluster<Node>, node: NodeId, event: Vec<u8>) {
    cluster.with_node(node, |n, now, out| n.submit(now, event, out));
}

/// Per node: incarnation, commits checked so far, and the last (tick, digest) seen.
type Cursor = (u32, usize, Option<(u64, Digest)>);

/// The invariants, checked after every step (DESIGN §13).
#[derive(Debug, Default)]
pub struct Checker {
    /// The digest every honest node committed at each tick.
    by_tick: BTreeMap<u64, Digest>,
    /// Per node id: (incarnation, commits checked, last (tick, digest)).
    cursor: BTreeMap<NodeId, Cursor>,
    pub violations: Vec<String>,
    pub quorum: usize,
    pub keys: Vec<VerifyingKey>,
    cache: Arc<SigCache>,
}

impl Checker {
    pub fn new(n: u16, cache: &Arc<SigCache>) -> Checker {
        let f = (n as usize - 1) / 3;
        Checker {
            quorum: 2 * f + 1,
            keys: (0..n).map(|i| key(i).verifying_key()).collect(),
            cache: cache.clone(),
            ..Checker::default()
        }
    }

    pub fn check(&mut self, cluster: &Cluster<Node>) {
        for id in 0..cluster.len() as NodeId {
            let Some(node) = cluster.node(id) else { continue };
            if !node.honest() {
                continue;
            }
            // The chain digest votes are signed under (chain id 0, this validator set).
            let chain = metatopia_consensus::genesis_digest(0, &self.keys);
            let entry = self.cursor.entry(id).or_insert((node.incarnation, 0, None));
            if entry.0 != node.incarnation {
                *entry = (node.incarnation, 0, entry.2);
            }
            while entry.1 < node.commits.len() {
                let c = &node.commits[entry.1].1;
                entry.1 += 1;
                let tick = c.block.tick.0;
                if let Some((t, d)) = entry.2 {
                    // The next tick: of the same block's span (its empty ticks share its
                    // digest), or of a block extending the one before, or filling the empty
                    // one that opened the tick (whose notarization the commit carries).
                    let fills = c.opener.as_ref().is_some_and(|o| {
                        c.block.parent.digest == o.notarization.digest
                            && o.notarization.verify(&chain, &self.keys, self.quorum, &self.cache).is_ok()
                    });
                    if tick != t + 1 || (c.digest != d && c.block.parent.digest != d && !fills) {
                        self.violations
                            .push(format!("node {id}: tick {tick} does not extend ({t}, {d:?}): not a chain"));
                    }
                } else if tick != 0 && node.incarnation == 0 {
                    self.violations.push(format!("node {id}: first commit is tick {tick}"));
                }
                entry.2 = Some((tick, c.digest));
                if c.certificate.digest != c.digest
                    || c.certificate.verify(&chain, &self.keys, self.quorum, &self.cache).is_err()
                    || c.finalization.verify(&chain, &self.keys, self.quorum, &self.cache).is_err()
                {
                    self.violations.push(format!("node {id}: tick {tick} committed without a valid certificate"));
                }
                match self.by_tick.get(&tick) {
                    Some(d) if *d != c.digest => self
                        .violations
                        .push(format!("SAFETY: tick {tick}: node {id} committed {:?}, another {d:?}", c.digest)),
                    Some(_) => {}
                    None => {
                        self.by_tick.insert(tick, c.digest);
                    }
                }
            }
        }
    }

    pub fn highest_tick(&self) -> Option<u64> {
        self.by_tick.last_key_value().map(|(t, _)| *t)
    }
}

/// A random fault schedule for one seed: network faults, partitions, crashes with restarts,
/// clock skew and up to f Byzantine validators (each kind, or twins). Faults end by `heal`.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub setup: Setup,
    pub net: NetConfig,
    pub partitions: Vec<Partition>,
    pub crashes: Vec<(Time, Time, NodeId)>,
    pub skews: Vec<(NodeId, i64)>,
    pub heal: Time,
    /// Every node stopped at once at this time (a sim stopped whole), and started again.
    pub whole_stop: Option<Time>,
}

pub fn random_schedule(seed: u64, n: u16, planted_bug: bool) -> Schedule {
    let mut rng = DetRng::from_u64(seed ^ 0xfa17);
    let mut setup = Setup::honest(n);
    setup.planted_bug = planted_bug;
    // One seed in eight keeps only 32 finalized blocks (1.6 s of ticks; a run is 80), so old
    // blocks are dropped while laggards still catch up by fetching; another one in eight
    // prunes by `keep_bytes`: a budget of one byte keeps the newest `keep_blocks_min` (24).
    // Taken from the seed, not the RNG, so every other draw of a seed's schedule stays what
    // it was.
    match seed % 8 {
        3 => setup.keep_blocks = Some(32),
        7 => setup.keep_bytes_min_blocks = Some(24),
        _ => {}
    }
    // Even seeds open each tick empty and fill it (R1 fills) where the network is quick enough.
    if seed.is_multiple_of(2) {
        setup.fill_lead_us = Some(5 * MS);
    }
    let f = setup.f();
    let heal = 2 * SEC;
    // Byzantine validators: 0..=f of them, each a random kind; sometimes twins instead.
    let byz = rng.below(u64::from(f) + 1) as u16;
    let mut faulty: BTreeSet<u16> = BTreeSet::new();
    while faulty.len() < byz as usize {
        faulty.insert(rng.below(u64::from(n)) as u16);
    }
    for i in &faulty {
        let b = Behaviour::ALL[rng.below(5) as usize % 4];
        setup.roles[*i as usize] = Role::Byzantine(b);
    }
    if byz == 0 && rng.chance(1, 4) {
        setup.twin_of = Some(rng.below(u64::from(n)) as u16);
    }
    let net = NetConfig {
        delay_min_us: 200 + rng.below(2_000),
        delay_max_us: 3_000 + rng.below(20_000),
        loss_ppm: if rng.chance(1, 2) { rng.below(150_000) as u32 } else { 0 },
        duplicate_ppm: if rng.chance(1, 3) { rng.below(100_000) as u32 } else { 0 },
    };
    let mut partitions = Vec::new();
    if rng.chance(1, 2) {
        let from = rng.below(heal / 2);
        let until = from + 100 * MS + rng.below(heal / 2);
        let cut: BTreeSet<NodeId> = (0..u32::from(n)).filter(|_| rng.chance(1, 2)).collect();
        let rest: BTreeSet<NodeId> = (0..u32::from(n) + 1).filter(|i| !cut.contains(i)).collect();
        partitions.push(Partition { from, until: until.min(heal), groups: vec![cut, rest] });
    }
    // Crash (and restart) honest validators so that at most f are faulty at once.
    let mut crashes = Vec::new();
    let crashable: Vec<u16> = (0..n).filter(|i| !faulty.contains(i) && setup.twin_of != Some(*i)).collect();
    let spare = f - byz - u16::from(setup.twin_of.is_some()).min(f - byz);
    for _ in 0..spare {
        if rng.chance(1, 2) {
            let who = crashable[rng.below(crashable.len() as u64) as usize];
            let at = rng.below(heal / 2);
            let back = at + 50 * MS + rng.below(heal / 2);
            crashes.push((at, back.min(heal), u32::from(who)));
        }
    }
    let skews = (0..u32::from(n)).map(|i| (i, rng.range_i64(-100_000, 100_000))).collect();
    let mut s = Schedule { setup, net, partitions, crashes, skews, heal, whole_stop: None };
    // One seed in eight (by a hash of the seed, apart from the pruning above) also stops the
    // whole sim once; after the other draws, so they stay what they were.
    if seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 61 == 0 {
        add_whole_stop(&mut s, seed);
    }
    s
}

/// Also stop the whole sim at once (every node) and start it again 30-230 ms later, as an
/// operator would, at a time taken from the seed; a validator that a crash of the schedule has
/// down then stays down until it was due back, so the others resume without it.
pub fn add_whole_stop(s: &mut Schedule, seed: u64) {
    if s.whole_stop.is_some() {
        return;
    }
    let at = s.heal / 4 + seed.wrapping_mul(7_919) % (s.heal / 2);
    let back = at + 30 * MS + seed.wrapping_mul(104_729) % (200 * MS);
    let nodes = u32::from(s.setup.n) + u32::from(s.setup.twin_of.is_some());
    let down: BTreeSet<NodeId> = s.crashes.iter().filter(|(a, b, _)| *a <= at && at < *b).map(|c| c.2).collect();
    s.crashes.extend((0..nodes).filter(|i| !down.contains(i)).map(|i| (at, back, i)));
    s.whole_stop = Some(at);
}

/// The result of one seed.
#[derive(Debug)]
pub struct RunResult {
    pub violations: Vec<String>,
    pub ticks_at_heal: Option<u64>,
    pub ticks_at_end: Option<u64>,
    /// Virtual time from heal to the first new commit by every honest node (None if some
    /// honest node never committed after heal).
    pub resume_after_heal: Option<Time>,
    pub trace: [u8; 32],
    pub evidence: u32,
    /// Where each honest validator's agreement stands at the end, when commits did not resume.
    pub stuck: Vec<String>,
    /// Ticks an honest validator handed out as filled (R1 fills), the most of any.
    pub filled: usize,
}

/// Run a schedule: faults until `heal`, then `after` more of a healthy network, with events
/// submitted throughout. Checks invariants at every step.
pub fn run_schedule(s: &Schedule, seed: u64, after: Time, cache: &Arc<SigCache>) -> RunResult {
    let mut cluster = build(&s.setup, seed, s.net, cache);
    for p in &s.partitions {
        cluster.add_partition(p.clone());
    }
    for (at, back, who) in &s.crashes {
        cluster.schedule_fault(*at, Fault::Crash(*who));
        cluster.schedule_fault(*back, Fault::Restart(*who));
    }
    for (who, skew) in &s.skews {
        cluster.set_skew(*who, *skew);
    }
    let mut checker = Checker::new(s.setup.n, cache);
    let end = s.heal + after;
    let mut next_event = 0u64;
    let mut t = 0;
    while t < end {
        t += 20 * MS;
        let len = cluster.len() as u64;
        let who = cluster.rng().below(len) as NodeId;
        next_event += 1;
        submit(&mut cluster, who, format!("event {seed}/{next_event}").into_bytes());
        cluster.run_until(t, |c| checker.check(c));
        if t == s.heal {
            checker.check(&cluster);
        }
    }
    let honest: Vec<&Node> =
        (0..cluster.len() as NodeId).filter_map(|i| cluster.node(i)).filter(|n| n.honest()).collect();
    let resume = honest
        .iter()
        .map(|n| n.commits.iter().find(|(at, _)| *at > s.heal).map(|(at, _)| at.saturating_sub(s.heal)))
        .collect::<Option<Vec<_>>>()
        .and_then(|v| v.into_iter().max());
    let ticks_at_heal = honest
        .iter()
        .filter_map(|n| n.commits.iter().rev().find(|(at, _)| *at <= s.heal).map(|(_, c)| c.block.tick.0))
        .max();
    let stuck = if resume.is_some() {
        Vec::new()
    } else {
        let mut said: Vec<String> = honest
            .iter()
            .filter_map(|n| match &n.actor {
                Actor::Honest(v) => Some(format!("validator {}: {}", n.index.0, v.describe())),
                Actor::Byz(_) => None,
            })
            .collect();
        let holders = |d: &Digest| -> Vec<u16> {
            honest
                .iter()
                .filter(|n| matches!(&n.actor, Actor::Honest(v) if v.holds_block(d)))
                .map(|n| n.index.0)
                .collect()
        };
        for n in &honest {
            if let Actor::Honest(v) = &n.actor {
                for d in v.fetching() {
                    said.push(format!("block {d:?}, fetched by {}, is held by {:?}", n.index.0, holders(&d)));
                }
            }
        }
        said
    };
    let filled = honest.iter().map(|n| n.commits.iter().filter(|(_, c)| c.opener.is_some()).count()).max();
    RunResult {
        filled: filled.unwrap_or(0),
        stuck,
        violations: checker.violations.clone(),
        ticks_at_heal,
        ticks_at_end: checker.highest_tick(),
        resume_after_heal: resume,
        trace: cluster.trace_hash(),
        evidence: honest.iter().map(|n| n.evidence).sum(),
    }
}
