//! `cargo bench -p metatopia-scripting`
//!
//! - `tick/10k_on_tick`: one sim tick in which 10,000 objects run an `on_tick` handler of a few
//!   operations (the whole pipeline: routing, units, merge, root).
//! - `raw/10k_call_fn`: the baseline: the same rhai function called 10,000 times from Rust with
//!   `Engine::call_fn`, on one engine and AST, nothing around it.

/// The node binary's allocator, so the figures are the node's.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use metatopia_scripting::RhaiHost;
use metatopia_sim::genesis::{DemoSpec, attach_script, demo_world, tick_seed};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::state::ObjectKind;
use metatopia_sim::{Batch, Sim, VerifiedBatch};
use rhai::{Dynamic, Scope};

const HANDLER: &str = "fn on_tick() { let x = 6 * 7; if x > 40 { x -= 1; } x }";

fn bench(c: &mut Criterion) {
    let mut demo = demo_world(DemoSpec {
        seed: 5,
        objects: 10_000,
        players: 10,
        scripted_per_mille: 0,
        moving_per_mille: 0,
        ..DemoSpec::default()
    });
    let host = RhaiHost::default();
    let prims: Vec<_> =
        demo.world.objects().values().filter(|o| o.kind == ObjectKind::Prim).map(|o| (o.id, o.owner)).collect();
    for (id, owner) in prims {
        attach_script(&mut demo.world, &host, id, owner, HANDLER, "AGPL-3.0-or-later").unwrap();
    }
    let mut g = c.benchmark_group("scripts");
    g.sample_size(20);
    for workers in [1u32, 2] {
        let mut sim = Sim::new(demo.world.clone(), RhaiHost::default(), KinematicPhysics::default(), workers).unwrap();
        // Run the init tick and warm the AST cache, as in a running node.
        let mut tick = sim.world().tick();
        let batch = |t: metatopia_sim::Tick| {
            VerifiedBatch::new(Batch { tick: t, time_ms: t.0 * 33, seed: tick_seed(t), events: vec![] }, 1)
        };
        sim.step(&batch(tick)).unwrap();
        let _ = sim.root();
        tick = sim.world().tick();
        let b = batch(tick);
        g.bench_function(format!("tick/10k_on_tick/w{workers}"), |bench| {
            bench.iter_batched(
                || sim.clone(),
                |mut s| {
                    let r = s.step(&b).unwrap();
                    assert_eq!(r.units, 10_000);
                    s
                },
                BatchSize::LargeInput,
            )
        });
    }
    let engine = host.engine();
    let ast = engine.compile(HANDLER).unwrap();
    g.bench_function("raw/10k_call_fn", |bench| {
        bench.iter(|| {
            let mut scope = Scope::new();
            for _ in 0..10_000 {
                let _: Dynamic = engine.call_fn(&mut scope, &ast, "on_tick", ()).unwrap();
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
