//! The golden state root (DESIGN §5, rapier's `snapshot_portability` style): a fixed seeded
//! world of 1,200 prims and 40 players runs 1,000 ticks with 12 signed events a tick (12,000
//! events, 2% deliberately bad), on the built-in rules host and kinematic physics. The root
//! must be the pinned one with 1 and with 8 worker threads, in debug (`cargo test`) and in
//! release (`cargo test --release`; both run in CI). If a change moves it on purpose (a state
//! format or rule change), re-pin it and say why in the commit.
use crate::common;

use metatopia_sim::genesis::{DemoSpec, EventGen, demo_world};

const GOLDEN_ROOT_1000: &str = "c0622f1e80e2a0fed304a33d3790c4a56684ee4be19a60548ca7e38d30ad7b92";

fn run(workers: u32) -> String {
    let demo = demo_world(DemoSpec { seed: 2026, objects: 1_200, players: 40, ..DemoSpec::default() });
    let mut sim = common::sim_of(&demo, workers);
    let mut events = EventGen::new(&demo, 2026);
    let roots = common::run(&mut sim, &mut events, 1_000, 12);
    let world = sim.world();
    assert!(world.objects().len() >= 1_000, "{} objects", world.objects().len());
    assert_eq!(world.tick().0, 1_000);
    roots.last().unwrap().to_string()
}

#[test]
fn golden_root_after_1000_ticks_one_worker() {
    assert_eq!(run(1), GOLDEN_ROOT_1000, "the golden root moved: determinism broke, or the state format changed");
}

#[test]
fn golden_root_after_1000_ticks_eight_workers() {
    assert_eq!(run(8), GOLDEN_ROOT_1000, "the golden root moved: determinism broke, or the state format changed");
}
