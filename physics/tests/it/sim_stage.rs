//! The region as the sim's physics stage: whole ticks of the demo world with rapier physics.

use metatopia_physics::RegionStage;
use metatopia_sim::genesis::{DemoSpec, EventGen, demo_world};
use metatopia_sim::rules::RuleHost;
use metatopia_sim::state::Queued;
use metatopia_sim::{Hash32, Sim, Snapshot, VerifiedBatch};

type PhysSim = Sim<RuleHost, RegionStage>;

fn run(sim: &mut PhysSim, gen_: &mut EventGen, ticks: u64) -> (Vec<Hash32>, u32, u32) {
    let (mut roots, mut moved, mut collisions) = (Vec::new(), 0, 0);
    for _ in 0..ticks {
        let tick = sim.world().tick();
        let batch = gen_.batch(sim.world(), tick, 20);
        let report = sim.step(&VerifiedBatch::new(batch, 2)).unwrap();
        moved += report.bodies_moved;
        collisions += sim.world().queue().iter().filter(|q| matches!(q, Queued::Collision { .. })).count() as u32;
        roots.push(report.root);
    }
    (roots, moved, collisions)
}

#[test]
fn a_sim_with_rapier_physics_is_deterministic_across_runs_workers_and_snapshots() {
    let demo = demo_world(DemoSpec { seed: 5, objects: 300, players: 8, moving_per_mille: 600, ..DemoSpec::default() });
    let mut a = Sim::new(demo.world.clone(), RuleHost::default(), RegionStage::single(), 1).unwrap();
    let mut b = Sim::new(demo.world.clone(), RuleHost::default(), RegionStage::single(), 2).unwrap();
    let (ra, moved, collisions) = run(&mut a, &mut EventGen::new(&demo, 9), 240);
    let (rb, _, _) = run(&mut b, &mut EventGen::new(&demo, 9), 240);
    assert_eq!(ra, rb, "1 and 2 workers");
    assert!(moved > 1_000, "bodies move: {moved}");
    assert!(collisions > 0, "collisions reach the scripts' queue");

    // Snapshot at tick 120 through bytes, restore into a fresh sim, continue: same roots.
    let mut c = Sim::new(demo.world.clone(), RuleHost::default(), RegionStage::single(), 2).unwrap();
    let mut gen_c = EventGen::new(&demo, 9);
    let (first, _, _) = run(&mut c, &mut gen_c, 120);
    let bytes = c.snapshot().encode();
    let snap = Snapshot::decode(&bytes, 1 << 30).unwrap();
    let mut d = Sim::restore(snap, RuleHost::default(), RegionStage::single(), 2).unwrap();
    let (rest, _, _) = run(&mut d, &mut gen_c, 120);
    assert_eq!([first, rest].concat(), ra);
}

#[test]
fn a_snapshot_whose_physics_does_not_match_its_world_is_refused() {
    let demo = demo_world(DemoSpec { seed: 6, objects: 40, players: 2, ..DemoSpec::default() });
    let mut a = Sim::new(demo.world.clone(), RuleHost::default(), RegionStage::single(), 1).unwrap();
    let snap = a.snapshot();
    // Physics saved for another world (a bigger region) does not load into this one.
    let other = demo_world(DemoSpec { seed: 6, objects: 40, players: 2, region_size: 512, ..DemoSpec::default() });
    let mut b = Sim::new(other.world.clone(), RuleHost::default(), RegionStage::single(), 1).unwrap();
    let foreign = Snapshot::new(snap.world.clone(), b.snapshot().physics, snap.root);
    let Err(e) = Sim::restore(foreign, RuleHost::default(), RegionStage::single(), 1) else {
        panic!("physics of another world was accepted")
    };
    assert!(e.to_string().contains("configured as"), "{e}");
}
