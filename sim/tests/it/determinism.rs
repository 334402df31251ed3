//! Determinism properties (DESIGN §5): arrival order and worker count never change the state
//! root; a snapshot encoded, decoded and continued matches the uninterrupted run every tick.
use crate::common;

use crate::common::TestSim;
use metatopia_sim::genesis::{DemoSpec, EventGen, demo_world};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::rules::RuleHost;
use metatopia_sim::snapshot::MAX_SNAPSHOT_BYTES;
use metatopia_sim::{Batch, Sim, Snapshot, VerifiedBatch};
use proptest::prelude::*;

fn restore(bytes: &[u8], workers: u32) -> TestSim {
    let snap = Snapshot::decode(bytes, MAX_SNAPSHOT_BYTES).expect("our own snapshot decodes");
    Sim::restore(snap, RuleHost::default(), KinematicPhysics::default(), workers).expect("our own snapshot restores")
}

/// A warmed-up world and the next three batches it will see.
fn fixture(seed: u64) -> (Vec<u8>, Vec<Batch>) {
    let demo = demo_world(DemoSpec { seed, objects: 300, players: 20, ..DemoSpec::default() });
    let mut sim = common::sim_of(&demo, 2);
    let mut events = EventGen::new(&demo, seed);
    common::run(&mut sim, &mut events, 20, 10);
    let snap = sim.snapshot().encode();
    // Generate the batches against the world they will be applied to.
    let mut probe = restore(&snap, 1);
    let mut batches = Vec::new();
    for _ in 0..3 {
        let t = probe.world().tick();
        let b = events.batch(probe.world(), t, 60);
        probe.step(&VerifiedBatch::new(b.clone(), 1)).unwrap();
        batches.push(b);
    }
    (snap, batches)
}

fn run_batches(snap: &[u8], batches: &[Batch], workers: u32) -> Vec<metatopia_sim::Hash32> {
    let mut sim = restore(snap, workers);
    batches.iter().map(|b| sim.step(&VerifiedBatch::new(b.clone(), workers)).unwrap().root).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn any_arrival_order_and_worker_count_gives_the_same_root(
        seed in 0u64..4,
        shuffles in proptest::collection::vec(any::<u64>(), 3),
        workers in prop_oneof![Just(1u32), Just(8u32)],
    ) {
        let (snap, batches) = fixture(seed);
        let reference = run_batches(&snap, &batches, 1);
        let permuted: Vec<Batch> = batches
            .iter()
            .zip(&shuffles)
            .map(|(b, s)| {
                let mut b = b.clone();
                // Fisher-Yates driven by the proptest value: a real permutation of arrival.
                let mut x = *s | 1;
                for i in (1..b.events.len()).rev() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    b.events.swap(i, (x % (i as u64 + 1)) as usize);
                }
                b
            })
            .collect();
        prop_assert_eq!(run_batches(&snap, &permuted, workers), reference);
    }

    #[test]
    fn snapshot_and_continue_matches_the_uninterrupted_run(seed in 0u64..1_000, cut in 1u64..40) {
        let demo = demo_world(DemoSpec { seed, objects: 150, players: 10, ..DemoSpec::default() });
        let mut straight = common::sim_of(&demo, 2);
        let mut events = EventGen::new(&demo, seed);
        let mut batches = Vec::new();
        for _ in 0..50 {
            let t = straight.world().tick();
            let b = events.batch(straight.world(), t, 8);
            batches.push(b.clone());
            straight.step(&VerifiedBatch::new(b, 2)).unwrap();
        }
        let mut a = common::sim_of(&demo, 2);
        let mut roots_a = Vec::new();
        for b in &batches {
            roots_a.push(a.step(&VerifiedBatch::new(b.clone(), 2)).unwrap().root);
        }
        let mut b_sim = common::sim_of(&demo, 2);
        for b in &batches[..cut as usize] {
            b_sim.step(&VerifiedBatch::new(b.clone(), 2)).unwrap();
        }
        let bytes = b_sim.snapshot().encode();
        let mut resumed = restore(&bytes, 8);
        prop_assert_eq!(resumed.root(), roots_a[cut as usize - 1]);
        for (i, b) in batches.iter().enumerate().skip(cut as usize) {
            let r = resumed.step(&VerifiedBatch::new(b.clone(), 8)).unwrap();
            prop_assert_eq!(r.root, roots_a[i], "diverged at tick {}", i);
        }
    }
}

#[test]
fn the_incremental_root_equals_a_full_recomputation() {
    let demo = demo_world(DemoSpec { seed: 3, objects: 500, players: 20, ..DemoSpec::default() });
    let mut sim = common::sim_of(&demo, 4);
    let mut events = EventGen::new(&demo, 3);
    let roots = common::run(&mut sim, &mut events, 40, 20);
    let bytes = sim.snapshot().encode();
    // Restoring rebuilds every Merkle cache from scratch.
    let mut fresh = restore(&bytes, 1);
    assert_eq!(fresh.root(), *roots.last().unwrap());
}

/// At every tick, the roots kept incrementally (only the changed slots' leaves and digests
/// rehashed) equal the roots of the same world with every cache dropped: a change that
/// skipped its mark (an object's text changed without its fixed part's digest) would show
/// here as the first tick they differ, rather than as a snapshot refused on a joining node.
#[test]
fn the_incremental_roots_equal_a_full_recomputation_at_every_tick() {
    let demo = demo_world(DemoSpec { seed: 5, objects: 400, players: 24, ..DemoSpec::default() });
    for workers in [1, 3] {
        let mut sim = common::sim_of(&demo, workers);
        let mut events = EventGen::new(&demo, 5);
        let (mut texts, mut moves) = (0, 0);
        for _ in 0..60 {
            let before = sim.world().clone();
            common::run(&mut sim, &mut events, 1, 25);
            let kept = sim.roots();
            let mut fresh = sim.world().clone();
            fresh.invalidate_caches();
            let tick = sim.world().tick();
            assert_eq!(fresh.subsystem_roots(kept.physics, 1), kept, "tick {tick}, {workers} workers");
            for o in sim.world().objects().values() {
                if let Some(b) = before.object(o.id) {
                    texts += u32::from(b.text != o.text || b.name != o.name);
                    moves += u32::from(b.position != o.position);
                }
            }
        }
        // The run changed both kinds of field, so both kinds of mark were checked.
        assert!(texts > 0 && moves > 0, "texts changed {texts} times, positions {moves}");
    }
}

#[test]
fn different_seeds_give_different_roots() {
    let run = |seed| {
        let demo = demo_world(DemoSpec { seed, objects: 100, players: 5, ..DemoSpec::default() });
        let mut sim = common::sim_of(&demo, 1);
        let mut events = EventGen::new(&demo, seed);
        *common::run(&mut sim, &mut events, 10, 5).last().unwrap()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn a_generator_started_again_on_a_world_that_ran_on_is_not_refused_for_stale_nonces() {
    use metatopia_sim::state::RejectReason;
    let demo = demo_world(DemoSpec { seed: 3, objects: 100, players: 6, ..DemoSpec::default() });
    let mut sim = common::sim_of(&demo, 1);
    let mut first = EventGen::new(&demo, 3);
    first.bad_per_mille = 0;
    common::run(&mut sim, &mut first, 20, 12);
    // A node restarted on its log: its bots start again with the same seed.
    let mut again = EventGen::new(&demo, 3);
    again.bad_per_mille = 0;
    let mut stale = 0;
    let mut accepted = 0;
    for _ in 0..10 {
        let t = sim.world().tick();
        let b = again.batch(sim.world(), t, 12);
        let r = sim.step(&VerifiedBatch::new(b, 1)).unwrap();
        accepted += r.accepted;
        stale += r.rejected.iter().filter(|x| matches!(x.reason, RejectReason::StaleNonce { .. })).count();
    }
    assert_eq!(stale, 0, "events refused for stale nonces after a restart");
    assert!(accepted > 60, "{accepted} of 120 events accepted");
}
