//! `cargo run --release -p metatopia-sim --example parallel`: what the worker pool costs and
//! gains on this machine, measured side by side in one process (these machines are noisy, so
//! only comparisons made in the same run mean anything).
//!
//! 1. Hand-over: one tiny parallel map from outside the pool (waking its threads).
//! 2. One tick of a 10,000-object world with 1,000 events, 1 and 2 workers, interleaved.

// A measuring tool: wall time is what it reports.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use metatopia_sim::genesis::{DemoSpec, EventGen, demo_world};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::par::map_chunks;
use metatopia_sim::rules::RuleHost;
use metatopia_sim::{Sim, VerifiedBatch};

fn percentiles(mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |p: usize| v[(v.len() - 1) * p / 100].as_secs_f64() * 1e6;
    format!("p10 {:.0} µs, p50 {:.0} µs, p90 {:.0} µs", at(10), at(50), at(90))
}

fn main() {
    let items = [1u64, 2];
    let mut handover = Vec::new();
    for _ in 0..2_000 {
        let t = Instant::now();
        let r = map_chunks(&items, 2, 1, |c| c.to_vec());
        handover.push(t.elapsed());
        assert_eq!(r, items);
        // Let the pool go back to sleep, as it does between ticks.
        std::thread::sleep(Duration::from_micros(300));
    }
    println!("hand-over to the pool from outside it: {}", percentiles(handover));

    let demo = demo_world(DemoSpec { seed: 42, objects: 10_000, players: 400, ..DemoSpec::default() });
    let mut events = EventGen::new(&demo, 42);
    events.bad_per_mille = 0;
    let batch = VerifiedBatch::new(events.batch(&demo.world, demo.world.tick(), 1_000), 2);
    let mut sims: Vec<_> = [1u32, 2]
        .into_iter()
        .map(|w| {
            let mut s = Sim::new(demo.world.clone(), RuleHost::default(), KinematicPhysics::default(), w).unwrap();
            let _ = s.root();
            s
        })
        .collect();
    let mut times = vec![Vec::new(), Vec::new()];
    let mut roots = Vec::new();
    for _ in 0..40 {
        for (i, sim) in sims.iter_mut().enumerate() {
            let mut s = sim.clone();
            let t = Instant::now();
            let report = s.step(&batch).unwrap();
            times[i].push(t.elapsed());
            roots.push(report.root);
        }
    }
    assert!(roots.windows(2).all(|w| w[0] == w[1]), "1 and 2 workers gave different roots");
    for (i, t) in times.into_iter().enumerate() {
        println!("one tick, 10,000 objects, 1,000 events, {} worker(s): {}", i + 1, percentiles(t));
    }
}
