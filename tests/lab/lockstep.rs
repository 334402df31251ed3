//! Whole nodes (agreement + sim) in lockstep on the deterministic simulated network: honest
//! runs with faults, the Byzantine kinds of the agreement suite against whole nodes, and a node
//! whose state diverges detecting it and writing its report.

use std::collections::BTreeMap;
use std::sync::Arc;

use metatopia_consensus::mocks::{Behaviour, Byzantine};
use metatopia_consensus::{Config, SigCache, SigningKey, Validator, ValidatorIndex};
use metatopia_lab::simnet::{Actor, CoreProcess, Saved};
use metatopia_node::core::{CoreOutput, NodeCore};
use metatopia_scenarios::{Cluster, Fault, NetConfig, NodeId, Partition, Time};
use metatopia_sim::genesis::{DemoSpec, DemoWorld, EventGen, demo_world};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::rules::RuleHost;
use metatopia_sim::{Hash32, Sim, Snapshot, Tick};

const MS: Time = 1_000;
const SEC: Time = 1_000_000;

type Node = CoreProcess<Actor, RuleHost, KinematicPhysics>;

fn key(i: u16) -> SigningKey {
    let mut b = [9u8; 32];
    b[..2].copy_from_slice(&i.to_le_bytes());
    SigningKey::from_bytes(&b)
}

fn demo(seed: u64) -> DemoWorld {
    demo_world(DemoSpec { seed, objects: 150, players: 10, ..DemoSpec::default() })
}

/// `n` nodes; `byzantine` maps a node to its behaviour; `world_of` gives each node its genesis.
fn cluster(
    n: u16,
    seed: u64,
    net: NetConfig,
    byzantine: &BTreeMap<u16, Behaviour>,
    world_of: impl Fn(u16) -> DemoWorld + 'static,
) -> Cluster<Node> {
    cluster_with(n, seed, net, byzantine, world_of, |_| {})
}

/// [`cluster`] with the agreement's configuration changed by `tune`.
fn cluster_with(
    n: u16,
    seed: u64,
    net: NetConfig,
    byzantine: &BTreeMap<u16, Behaviour>,
    world_of: impl Fn(u16) -> DemoWorld + 'static,
    tune: impl Fn(&mut Config),
) -> Cluster<Node> {
    let keys: Vec<_> = (0..n).map(|i| key(i).verifying_key()).collect();
    let nodes_of: Arc<BTreeMap<u16, Vec<NodeId>>> = Arc::new((0..n).map(|i| (i, vec![u32::from(i)])).collect());
    let cache = Arc::new(SigCache::default());
    let mut cfg = Config {
        period_us: 50 * MS,
        leader_timeout_us: 250 * MS,
        notarize_timeout_us: 500 * MS,
        retry_us: 250 * MS,
        sig_cache: cache,
        max_exec_lag: Some(4),
        ..Config::default()
    };
    tune(&mut cfg);
    let nodes = (0..n)
        .map(|i| {
            let actor = match byzantine.get(&i) {
                // The mock gets no roots to report: no execution backpressure for it.
                Some(b) => {
                    let byz_cfg = Config { max_exec_lag: None, ..cfg.clone() };
                    Actor::Byz(Box::new(Byzantine::new(byz_cfg, key(i), keys.clone(), 0, *b)), n as usize)
                }
                None => Actor::Honest(Box::new(Validator::new(cfg.clone(), key(i), keys.clone(), 0))),
            };
            let sim = Sim::new(world_of(i).world, RuleHost::default(), KinematicPhysics::default(), 1).unwrap();
            CoreProcess::new(NodeCore::new(actor, sim, 1), nodes_of.clone())
        })
        .collect();
    let mut c = Cluster::new(seed, net, nodes);
    // An honest node restarts from its saved agreement state and its commit log, as a real one.
    c.set_restarter(Box::new(move |id, now, saved| {
        let i = id as u16;
        let saved: Saved = saved.and_then(|b| postcard::from_bytes(&b).ok()).unwrap_or_default();
        let v = match &saved.consensus {
            Some(b) => Validator::restore(cfg.clone(), key(i), keys.clone(), now, b).expect("its own saved state"),
            None => Validator::new(cfg.clone(), key(i), keys.clone(), now),
        };
        let sim = Sim::new(world_of(i).world, RuleHost::default(), KinematicPhysics::default(), 1).unwrap();
        let mut core = NodeCore::new(Actor::Honest(Box::new(v)), sim, 1);
        for rec in &saved.log {
            core.replay(rec).expect("its own log replays");
        }
        core.recall(&saved.log);
        CoreProcess::new(core, nodes_of.clone())
    }));
    c
}

/// Run for `secs` of virtual time with bots (on `bot_node`) submitting signed events every tick.
fn run_with_bots(c: &mut Cluster<Node>, bot_node: NodeId, secs: u64, events_per_tick: usize) {
    let world = demo(1);
    let mut bots = EventGen::new(&world, 3);
    let mut t = c.now();
    let end = t + secs * SEC;
    while t < end {
        t += 50 * MS;
        c.run_until(t, |_| {});
        if c.is_up(bot_node) {
            c.with_node(bot_node, |p, now, out| {
                let w = p.core.sim().world();
                let batch = bots.batch(w, w.tick(), events_per_tick);
                let bytes = batch.events.iter().map(metatopia_sim::codec::encode).collect();
                p.submit(now, bytes, out);
            });
        }
    }
}

/// Every tick's root, per node.
fn roots(c: &Cluster<Node>, n: u16) -> Vec<BTreeMap<Tick, Hash32>> {
    (0..u32::from(n)).map(|i| c.node(i).unwrap().executed_roots()).collect()
}

/// The honest nodes executed the same ticks with the same roots (each a prefix of the longest).
fn assert_lockstep(all: &[BTreeMap<Tick, Hash32>], honest: &[usize], at_least: usize) {
    let longest = honest.iter().map(|i| &all[*i]).max_by_key(|m| m.len()).unwrap();
    for i in honest {
        let mine = &all[*i];
        assert!(mine.len() >= at_least, "node {i} executed only {} ticks", mine.len());
        for (t, r) in mine {
            assert_eq!(longest.get(t), Some(r), "node {i} differs at {t}");
        }
        // Consecutive ticks from 0: nothing skipped.
        assert_eq!(mine.keys().next_back().map(|t| t.0 + 1), Some(mine.len() as u64), "node {i} skipped a tick");
    }
}

#[test]
fn four_nodes_run_in_lockstep_through_delay_loss_duplication_and_a_partition() {
    let net = NetConfig { delay_min_us: 300, delay_max_us: 8 * MS, loss_ppm: 20_000, duplicate_ppm: 20_000 };
    let mut c = cluster(4, 11, net, &BTreeMap::new(), |_| demo(1));
    c.add_partition(Partition {
        from: 3 * SEC,
        until: 5 * SEC,
        groups: vec![[0, 1].into_iter().collect(), [2, 3].into_iter().collect()],
    });
    run_with_bots(&mut c, 0, 12, 6);
    let all = roots(&c, 4);
    assert_lockstep(&all, &[0, 1, 2, 3], 80);
    for i in 0..4 {
        let p = c.node(i).unwrap();
        assert_eq!(p.core.desynced(), None);
        assert!(p.core.stats().accepted > 100, "node {i}: {:?}", p.core.stats());
        assert_eq!(p.core.stats().peer_divergences, 0);
    }
}

#[test]
fn each_byzantine_kind_against_whole_nodes_leaves_the_honest_ones_in_lockstep() {
    for (k, behaviour) in Behaviour::ALL.into_iter().enumerate() {
        // n = 4, f = 1: node 1 is the Byzantine one (it leads every fourth view).
        let byz = BTreeMap::from([(1u16, behaviour)]);
        let net = NetConfig { delay_min_us: 300, delay_max_us: 5 * MS, loss_ppm: 0, duplicate_ppm: 0 };
        let mut c = cluster(4, 100 + k as u64, net, &byz, |_| demo(1));
        run_with_bots(&mut c, 0, 6, 4);
        let all = roots(&c, 4);
        assert_lockstep(&all, &[0, 2, 3], 40);
        for i in [0, 2, 3] {
            assert_eq!(c.node(i).unwrap().core.desynced(), None, "{behaviour:?}: node {i}");
        }
    }
}

#[test]
fn a_node_whose_state_diverges_detects_it_reports_and_resyncs_from_a_certified_snapshot() {
    // Node 3 starts from another world: its roots differ from the first tick.
    let net = NetConfig { delay_min_us: 300, delay_max_us: 5 * MS, loss_ppm: 0, duplicate_ppm: 0 };
    let mut c = cluster(4, 7, net, &BTreeMap::new(), |i| if i == 3 { demo(2) } else { demo(1) });
    run_with_bots(&mut c, 0, 5, 4);
    let all = roots(&c, 4);
    assert_lockstep(&all, &[0, 1, 2], 40);

    let bad = c.node(3).unwrap();
    let at = bad.log.iter().position(|o| matches!(o, CoreOutput::Desync(_))).expect("node 3 noticed it diverged");
    let CoreOutput::Desync(report) = &bad.log[at] else { unreachable!() };
    let tick = report.tick;
    assert!(tick.0 < 5, "within a few ticks: {tick}");
    assert!(report.theirs.len() >= 2, "f+1 = 2 peers disagreed: {:?}", report.theirs);
    for r in report.theirs.values() {
        assert_eq!(Some(r), all[0].get(&tick), "the peers' root is the honest one");
    }
    assert_ne!(Some(&report.mine), all[0].get(&tick));
    assert!(report.subsystems.is_some() && !report.last_inputs.is_empty());
    let snap = Snapshot::decode(&report.snapshot, 1 << 30).expect("the report's snapshot decodes");
    // The snapshot is of the state the node stopped in: its last executed tick.
    let last_before = bad.log[..at].iter().rev().find_map(|o| match o {
        CoreOutput::Executed { root, .. } => Some(root),
        _ => None,
    });
    assert_eq!(Some(&snap.root), last_before);
    // The honest nodes saw one faulty peer and did not stop.
    for i in 0..3 {
        let p = c.node(i).unwrap();
        assert_eq!(p.core.desynced(), None);
        assert!(p.core.disagreeing_peers().iter().all(|v| *v == ValidatorIndex(3)));
        assert!(p.core.stats().peer_divergences > 0, "node {i} noticed node 3");
    }
    // Node 3 took a snapshot its peers certified, replayed the commits since, and is back in
    // step: from the resync on, its roots are the honest ones.
    let resynced = bad
        .log
        .iter()
        .find_map(|o| match o {
            CoreOutput::Resynced { tick, certified_by, .. } => Some((*tick, *certified_by)),
            _ => None,
        })
        .expect("node 3 resynced");
    assert!(resynced.1 >= 2, "certified by f+1 = 2 others at least: {resynced:?}");
    assert!(!bad.core.resyncing() && bad.core.desynced().is_none());
    let after: Vec<_> = all[3].range(resynced.0..).collect();
    assert!(after.len() > 20, "node 3 executed {} ticks after its resync at {}", after.len(), resynced.0);
    for (t, r) in after {
        if let Some(honest) = all[0].get(t) {
            assert_eq!(r, honest, "node 3 after its resync, tick {t}");
        }
    }
}

/// A validator down longer than its peers keep blocks (32 ticks here) cannot fetch its way
/// back: the blocks it lacks are gone everywhere, and it would wait for them for ever. Once it
/// has been more than 64 ticks behind what f+1 peers report executing for 10 s, it takes a
/// snapshot that f+1 of them certify and runs in step from there.
#[test]
fn a_validator_down_longer_than_its_peers_keep_blocks_catches_up_from_a_certified_snapshot() {
    let net = NetConfig { delay_min_us: 300, delay_max_us: 5 * MS, loss_ppm: 0, duplicate_ppm: 0 };
    let mut c = cluster_with(4, 23, net, &BTreeMap::new(), |_| demo(1), |cfg| cfg.keep_blocks = 32);
    c.schedule_fault(SEC / 2, Fault::Crash(3));
    c.schedule_fault(4 * SEC + SEC / 2, Fault::Restart(3));
    run_with_bots(&mut c, 0, 30, 4);
    let all = roots(&c, 4);
    let p = c.node(3).unwrap();
    assert_lockstep(&all, &[0, 1, 2], 300);
    let (tick, certified_by, joined) = p
        .log
        .iter()
        .find_map(|o| match o {
            CoreOutput::Resynced { tick, certified_by, joined, .. } => Some((*tick, *certified_by, *joined)),
            _ => None,
        })
        .expect("node 3 took a snapshot");
    assert!(!joined && certified_by >= 2, "a validator's catch-up, certified by f+1 = 2 others: {certified_by}");
    assert_eq!(p.core.stats().stranded, 1);
    // Node 3 stopped at about tick 8; it waits until its peers are 64 ticks further, then 10 s.
    assert!(tick.0 > 72, "the snapshot of tick {tick}");
    let after: Vec<_> = all[3].range(tick..).collect();
    assert!(after.len() > 20, "node 3 executed {} ticks after taking tick {tick}", after.len());
    for (t, r) in &after {
        assert_eq!(all[0].get(t), Some(*r), "node 3 after its catch-up, tick {t}");
    }
    let newest = |m: &BTreeMap<Tick, Hash32>| m.keys().next_back().map_or(0, |t| t.0);
    assert!(
        newest(&all[3]) + 8 >= newest(&all[0]),
        "node 3 at {} keeps up with node 0 at {}",
        newest(&all[3]),
        newest(&all[0])
    );
}

/// The node's commit latency (a proposal, as a node first saw it, to its commit there) in
/// microseconds, against the network's one-way delay of exactly 20 ms: a follower sees the
/// proposal one delay after the leader and commits once the finalize votes have come, at least
/// two more delays later (the notarize votes cross, then the finalize votes).
#[test]
fn the_commit_latency_is_measured_from_the_proposal_in_microseconds() {
    let net = NetConfig { delay_min_us: 20 * MS, delay_max_us: 20 * MS, loss_ppm: 0, duplicate_ppm: 0 };
    let mut c = cluster(4, 5, net, &BTreeMap::new(), |_| demo(1));
    run_with_bots(&mut c, 0, 6, 2);
    for i in 0..4 {
        let (p50, p99) = c.node(i).unwrap().core.commit_latency_us().expect("commits measured");
        assert!(p50 >= 40_000 && p50 <= p99 && p99 < 400_000, "node {i}: p50 {p50} µs, p99 {p99} µs");
        eprintln!("node {i}: proposal to commit p50 {p50} µs, p99 {p99} µs (one-way delay 20 ms)");
    }
    // The bots' events go in at node 0: there, taken in to executed spans dissemination, a
    // proposal and the commit (at least the three delays of a commit); the others take in none.
    let (p50, p99) = c.node(0).unwrap().core.input_latency_us().expect("inputs measured at node 0");
    assert!(p50 >= 60_000 && p50 <= p99 && p99 < 1_000_000, "input p50 {p50} µs, p99 {p99} µs");
    eprintln!("node 0: input to execution p50 {p50} µs, p99 {p99} µs");
    assert!((1..4).all(|i| c.node(i).unwrap().core.input_latency_us().is_none()));
}
