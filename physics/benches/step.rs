//! `cargo bench -p metatopia-physics`
//!
//! - `region/4000_awake_60_steps`: 60 steps (one second) of a region with 4,000 awake bodies
//!   (circles and boxes on a lattice, moving, colliding, restitution 1 so they stay awake),
//!   from the same start every iteration, beside `raw_rapier/4000_awake_60_steps`: rapier2d
//!   alone stepping the same bodies from the same start with the same features (enhanced
//!   determinism, zero gravity, collision events collected). Divide by 60 for one step; the
//!   ratio is what the region adds (ownership, readback into `Fx`, events, handoff checks).
//! - `region/4000_root`: the region's carried state encoded and hashed (the physics root).
//! - `grid9/4000_bodies`: nine regions (3×3) sharing 4,000 bodies, with ghosts and handoffs,
//!   beside `grid9_isolated/4000_bodies`: the same nine regions walled off from each other (no
//!   ghosts, no handoffs). The difference, over nine, is the per-region cost of ghosts and handoff.

// Benchmarks measure wall time; the no-clock rule is for the simulation itself.
#![allow(clippy::disallowed_methods)]

/// The node binary's allocator, so the figures are the node's.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use metatopia_sim::state::BodyKind;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use metatopia_physics::convert::to_f32;
use metatopia_physics::grid::Grid;
use metatopia_physics::{Region, RegionConfig, RegionId};
use metatopia_sim::rng::DetRng;
use metatopia_sim::state::{Region as Square, Shape};
use metatopia_sim::{Fx, ObjectId, Vec2};
use rapier2d::prelude::*;

const N: u32 = 4_000;

fn dt() -> Fx {
    Fx::from_ratio(1, 60)
}

fn bouncy(c: &mut RegionConfig) {
    c.material.restitution = Fx::ONE;
    c.material.friction = Fx::ZERO;
    c.material.angular_damping = Fx::ZERO;
}

/// Bodies on a jittered lattice over `[0, side*2+4)²`.
fn scene(n: u32, seed: u64) -> (Fx, Vec<(ObjectId, Shape, Vec2, Vec2)>) {
    let side = (1..).find(|s: &i64| s * s >= i64::from(n)).unwrap();
    let size = Fx::from_int(side * 2 + 4);
    let mut rng = DetRng::from_u64(seed);
    let bodies = (0..i64::from(n))
        .map(|i| {
            let shape = if i % 2 == 0 {
                Shape::Circle { radius: Fx::from_ratio(rng.range_i64(30, 60), 100) }
            } else {
                Shape::Box {
                    half_width: Fx::from_ratio(rng.range_i64(30, 60), 100),
                    half_height: Fx::from_ratio(rng.range_i64(30, 60), 100),
                }
            };
            let p = Vec2::new(Fx::from_int(3 + 2 * (i % side)), Fx::from_int(3 + 2 * (i / side)));
            let v =
                Vec2::new(Fx::from_ratio(rng.range_i64(-300, 300), 100), Fx::from_ratio(rng.range_i64(-300, 300), 100));
            (ObjectId(i as u64 + 1), shape, p, v)
        })
        .collect();
    (size, bodies)
}

fn region_of(n: u32) -> Region {
    let (size, bodies) = scene(n, 1);
    let mut cfg = RegionConfig::single(RegionId(0), Square { origin: Vec2::ZERO, size });
    bouncy(&mut cfg);
    let mut r = Region::new(cfg).unwrap();
    for (id, shape, p, v) in bodies {
        r.spawn(id, shape, p, Fx::ZERO, v, BodyKind::Dynamic, None);
    }
    r
}

#[derive(Default)]
struct Collect(Mutex<Vec<(ColliderHandle, ColliderHandle)>>);

impl EventHandler for Collect {
    fn handle_collision_event(&self, _: &RigidBodySet, _: &ColliderSet, e: CollisionEvent, _: Option<&ContactPair>) {
        if let CollisionEvent::Started(a, b, _) = e {
            self.0.lock().unwrap().push((a, b));
        }
    }
    fn handle_contact_force_event(&self, _: f32, _: &RigidBodySet, _: &ColliderSet, _: &ContactPair, _: f32) {}
    fn handle_soft_body_tear_event(&self, _: &SoftBodySet, _: &SoftBodyTearEvent) {}
}

/// rapier2d alone, the same bodies, materials, walls and events.
fn raw_world(n: u32) -> PhysicsWorld {
    let (size, bodies) = scene(n, 1);
    let mut w = PhysicsWorld { gravity: Vector::ZERO, ..PhysicsWorld::default() };
    w.integration_parameters.dt = to_f32(dt());
    let s = to_f32(size);
    for (centre, half) in [
        (Vector::new(s / 2.0, -1.0), Vector::new(s / 2.0 + 2.0, 1.0)),
        (Vector::new(s / 2.0, s + 1.0), Vector::new(s / 2.0 + 2.0, 1.0)),
        (Vector::new(-1.0, s / 2.0), Vector::new(1.0, s / 2.0 + 2.0)),
        (Vector::new(s + 1.0, s / 2.0), Vector::new(1.0, s / 2.0 + 2.0)),
    ] {
        w.colliders.insert(ColliderBuilder::cuboid(half.x, half.y).translation(centre).restitution(1.0).build());
    }
    for (id, shape, p, v) in bodies {
        let rb = RigidBodyBuilder::dynamic()
            .translation(Vector::new(to_f32(p.x), to_f32(p.y)))
            .linvel(Vector::new(to_f32(v.x), to_f32(v.y)))
            .user_data(u128::from(id.0))
            .build();
        let h = w.bodies.insert(rb);
        let c = match shape {
            Shape::Circle { radius } => ColliderBuilder::ball(to_f32(radius)),
            Shape::Box { half_width, half_height } => ColliderBuilder::cuboid(to_f32(half_width), to_f32(half_height)),
        }
        .restitution(1.0)
        .friction(0.0)
        .density(1.0)
        .active_events(ActiveEvents::COLLISION_EVENTS)
        .user_data(u128::from(id.0))
        .build();
        let PhysicsWorld { colliders, bodies, .. } = &mut w;
        colliders.insert_with_parent(c, h, bodies);
    }
    w
}

fn single(c: &mut Criterion) {
    let mut g = c.benchmark_group("region");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("4000_awake_60_steps", |b| {
        b.iter_batched(
            || region_of(N),
            |mut region| {
                let mut awake = 0;
                for _ in 0..60 {
                    awake = region.step(&[], dt()).bodies.len();
                }
                assert!(awake > 3_500, "bodies stay awake: {awake}");
                region
            },
            BatchSize::LargeInput,
        )
    });
    let mut region = region_of(N);
    for _ in 0..60 {
        region.step(&[], dt());
    }
    g.bench_function("4000_root", |b| b.iter(|| region.root()));
    g.bench_function("4000_full_hash", |b| b.iter(|| region.full_hash()));
    println!("region: a 4,000-body region saves to {} bytes", region.save().len());
    g.finish();

    let mut g = c.benchmark_group("raw_rapier");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("4000_awake_60_steps", |b| {
        b.iter_batched(
            || raw_world(N),
            |mut world| {
                let mut events = 0;
                for _ in 0..60 {
                    let collect = Collect::default();
                    world.step_with_events(&(), &collect);
                    events += collect.0.into_inner().unwrap().len();
                }
                (world, events)
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn grid_of(n: u32, connected: bool) -> Grid {
    let (size, bodies) = scene(n, 1);
    let cell = size / Fx::from_int(3) + Fx::ONE;
    let mut grid = Grid::new(3, 3, cell, |c| {
        bouncy(c);
        if !connected {
            c.neighbours.clear();
            c.walls = Some((c.area.origin, c.area.origin + Vec2::new(c.area.size, c.area.size)));
        }
    })
    .unwrap();
    for (id, shape, p, v) in bodies {
        let r = grid.region_at(p).unwrap();
        grid.regions[r].spawn(id, shape, p, Fx::ZERO, v, BodyKind::Dynamic, None);
    }
    grid
}

fn nine(c: &mut Criterion) {
    let mut g = c.benchmark_group("grid9");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    let none = BTreeMap::new();
    let mut grid = grid_of(N, true);
    let mut handoffs = 0u64;
    g.bench_function("4000_bodies", |b| b.iter(|| handoffs += grid.step(&none, dt()).crossings.len() as u64));
    g.finish();
    println!("grid9: {handoffs} border crossings during the measurement");
    let mut g = c.benchmark_group("grid9_isolated");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    let mut grid = grid_of(N, false);
    g.bench_function("4000_bodies", |b| b.iter(|| grid.step(&none, dt())));
    g.finish();
}

criterion_group!(benches, single, nine);
criterion_main!(benches);
