//! `cargo bench -p metatopia-scripting`
//!
//! - `tick/10k_on_tick`: one sim tick in which 10,000 objects run an `on_tick` handler of a few
//!   operations (the whole pipeline: routing, units, merge, root).
//! - `tick/15k_200_greeters`: one tick of a 15,000-object world in which 200 prims run the
//!   example greeter (`nearby(10)` each tick: about 70 objects each), one worker.
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
    greeters(&mut g);
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

/// 200 greeters in a 15,000-object world: what `nearby` costs where it finds many objects.
fn greeters(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let greeter = include_str!("../../scenarios/scripts/greeter.rhai");
    let mut demo = demo_world(DemoSpec {
        seed: 6,
        objects: 15_000,
        players: 200,
        scripted_per_mille: 0,
        moving_per_mille: 0,
        ..DemoSpec::default()
    });
    let host = RhaiHost::default();
    let prims: Vec<_> = demo
        .world
        .objects()
        .values()
        .filter(|o| o.kind == ObjectKind::Prim)
        .step_by(75)
        .map(|o| (o.id, o.owner))
        .collect();
    for &(id, owner) in &prims {
        attach_script(&mut demo.world, &host, id, owner, greeter, "AGPL-3.0-or-later").unwrap();
    }
    let mut sim = Sim::new(demo.world, RhaiHost::default(), KinematicPhysics::default(), 1).unwrap();
    let batch = |t: metatopia_sim::Tick| {
        VerifiedBatch::new(Batch { tick: t, time_ms: t.0 * 33, seed: tick_seed(t), events: vec![] }, 1)
    };
    for _ in 0..2 {
        let t = sim.world().tick();
        sim.step(&batch(t)).unwrap();
    }
    let _ = sim.root();
    let b = batch(sim.world().tick());
    g.bench_function("tick/15k_200_greeters", |bench| {
        bench.iter_batched(
            || sim.clone(),
            |mut s| {
                let r = s.step(&b).unwrap();
                assert_eq!(r.units as usize, prims.len());
                s
            },
            BatchSize::LargeInput,
        )
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
