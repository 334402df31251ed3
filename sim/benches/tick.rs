//! `cargo bench -p metatopia-sim`
//!
//! - `tick/10k_objects_1k_events/wN`: one tick of a 10,000-object world with 1,000 events
//!   (signatures verified ahead, as the node does while events arrive), N worker threads.
//! - `verify/1k_events/wN`: checking 1,000 ed25519 signatures ahead of the tick, beside
//!   `verify/raw_dalek_1k/w1` (ed25519-dalek alone checking as many signatures).
//! - `root/15k_objects_1500_{moved,recoloured,retexted}/wN`: the incremental state root after
//!   1,500 of 15,000 objects moved, changed colour, or changed text (N worker threads), beside
//!   the raw baselines: blake3 over the same 1,500 objects' bytes in
//!   one call (`baseline_blake3_concat`) and one call per object (`baseline_blake3_each`), and
//!   this design's floor (`floor_wide_hashes`: as many leaves and as many 4-ary nodes as
//!   their paths hold, hashed in lanes with no tree to walk).
//! - `wide/leaves_1434x110B`, `wide/nodes4_1300`: the state root's lane-parallel BLAKE3
//!   (`metatopia_sim::wide`) beside the `blake3` crate doing the same hashes one at a time.
//! - `near/15k_200_r{10,100}`: a tick's scripts' `nearby` (200 searches of radius 10 or 100 m,
//!   at most 64 found, in a 15,000-object world, the grid built once as in a tick) beside
//!   `near/walk_15k_200_r{10,100}`, the walk of every object each search did before.

// Benchmarks measure wall time; the no-clock rule is for the simulation itself.
#![allow(clippy::disallowed_methods)]

/// The node binary's allocator, so the figures are the node's.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use metatopia_sim::genesis::{DemoSpec, EventGen, demo_world};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::rng::DetRng;
use metatopia_sim::rules::RuleHost;
use metatopia_sim::{Hash32, ObjectId, Sim, VerifiedBatch};

fn tick(c: &mut Criterion) {
    let demo = demo_world(DemoSpec { seed: 42, objects: 10_000, players: 400, ..DemoSpec::default() });
    let mut events = EventGen::new(&demo, 42);
    events.bad_per_mille = 0;
    let batch = events.batch(&demo.world, demo.world.tick(), 1_000);
    let mut g = c.benchmark_group("tick");
    g.sample_size(30).measurement_time(Duration::from_secs(8));
    for workers in [1u32, 2] {
        let mut sim = Sim::new(demo.world.clone(), RuleHost::default(), KinematicPhysics::default(), workers).unwrap();
        let _ = sim.root(); // caches built, as in a running node
        let verified = VerifiedBatch::new(batch.clone(), 2);
        g.bench_function(format!("10k_objects_1k_events/w{workers}"), |b| {
            b.iter_batched(
                || sim.clone(),
                |mut s| {
                    let r = s.step(&verified).unwrap();
                    assert_eq!(r.accepted, 1_000);
                    s
                },
                BatchSize::LargeInput,
            )
        });
    }
    g.finish();
    let mut g = c.benchmark_group("verify");
    g.sample_size(20);
    for workers in [1u32, 2] {
        g.bench_function(format!("1k_events/w{workers}"), |b| b.iter(|| VerifiedBatch::new(batch.clone(), workers)));
    }
    // The raw library doing the same work: ed25519-dalek checking 1,000 signatures of messages
    // of the events' size by the same authors, one thread.
    let signed: Vec<(ed25519_dalek::VerifyingKey, Vec<u8>, ed25519_dalek::Signature)> = batch
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| {
            use ed25519_dalek::Signer;
            let key = &demo.players[i % demo.players.len()];
            let msg = metatopia_sim::codec::encode(&e.body);
            let sig = key.sign(&msg);
            (key.verifying_key(), msg, sig)
        })
        .collect();
    g.bench_function("raw_dalek_1k/w1", |b| {
        b.iter(|| signed.iter().filter(|(k, m, s)| k.verify_strict(m, s).is_ok()).count())
    });
    g.finish();
}

fn root(c: &mut Criterion) {
    let demo =
        demo_world(DemoSpec { seed: 43, objects: 15_000, players: 100, scripted_per_mille: 0, ..DemoSpec::default() });
    let mut world = demo.world;
    let _ = world.subsystem_roots(Hash32::default(), 1);
    let ids: Vec<ObjectId> = world.objects().keys().copied().collect();
    let mut rng = DetRng::from_u64(7);
    let mut pick = move || -> Vec<ObjectId> {
        let mut chosen: Vec<ObjectId> = (0..1_500).map(|_| ids[rng.below(ids.len() as u64) as usize]).collect();
        chosen.sort();
        chosen.dedup();
        chosen
    };
    let mut g = c.benchmark_group("root");
    g.sample_size(50);
    let mut counter = 0u32;
    // What a tick changes in 1,500 objects: their motion (the physics stage, `set_motion`),
    // their colour (a script's update, merged with `put_object`), or their text as well (a
    // change to the fixed part, whose digest is recomputed too).
    type Change = fn(&mut metatopia_sim::World, ObjectId, u32);
    let kinds: [(&str, Change); 3] = [
        ("moved", |w, id, k| {
            let o = w.object(id).unwrap();
            let (p, v) = (o.position, o.velocity);
            let step =
                metatopia_sim::Vec2::new(metatopia_sim::Fx::from_bits(i64::from(k % 64)), metatopia_sim::Fx::ZERO);
            w.set_motion(id, p + step, metatopia_sim::Fx::ZERO, v);
        }),
        ("recoloured", |w, id, k| {
            let mut o = w.object(id).unwrap().clone();
            o.color = k;
            w.put_object(o);
        }),
        ("retexted", |w, id, k| {
            let mut o = w.object(id).unwrap().clone();
            o.text = format!("touched {k}");
            w.put_object(o);
        }),
    ];
    for (kind, change) in kinds {
        for workers in [1u32, 2] {
            g.bench_function(format!("15k_objects_1500_{kind}/w{workers}"), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let chosen = pick();
                        // As in the node: the tick's merge changes the objects and the root
                        // follows on the same pool thread (`par::on_pool`), so the changed
                        // objects are in that core's cache. Only the root is timed.
                        total += metatopia_sim::par::on_pool(workers, || {
                            for id in chosen {
                                counter = counter.wrapping_add(1);
                                change(&mut world, id, counter);
                            }
                            let start = Instant::now();
                            std::hint::black_box(world.subsystem_roots(Hash32::default(), workers));
                            start.elapsed()
                        });
                    }
                    total
                })
            });
        }
    }
    let sample: Vec<Vec<u8>> =
        pick().iter().map(|id| postcard::to_allocvec(world.object(*id).unwrap()).unwrap()).collect();
    let concat: Vec<u8> = sample.concat();
    println!("root baseline: {} objects, {} bytes", sample.len(), concat.len());
    // The floor of this design: as many one-block leaves (a moved object's leaf: its motion
    // and colour, and the digest of its fixed part), and as many 4-ary nodes as their paths
    // up the slot tree hold, hashed side by side in lanes (`wide`), with no tree to walk, no
    // objects to look up and nothing to write back.
    let mut level: Vec<u32> = pick().iter().map(|id| id.slot()).collect();
    level.sort_unstable();
    level.dedup();
    let cap = metatopia_sim::merkle::SlotTree::capacity_for(world.objects().len() as u32);
    let mut nodes = 0;
    let mut width = cap;
    while width > 1 {
        for p in &mut level {
            *p /= 4;
        }
        level.dedup();
        nodes += level.len();
        width /= 4;
    }
    let leaf_bytes: Vec<Vec<u8>> = pick()
        .iter()
        .map(|id| {
            let mut b = Vec::new();
            world.object(*id).unwrap().leaf_bytes(&[9; 32], &mut b);
            b
        })
        .collect();
    let blocks: Vec<[u8; 64]> = leaf_bytes
        .iter()
        .map(|l| {
            let mut b = [0u8; 64];
            b[..l.len().min(64)].copy_from_slice(&l[..l.len().min(64)]);
            b
        })
        .collect();
    let lens: Vec<u8> = leaf_bytes.iter().map(|l| l.len().min(64) as u8).collect();
    let children: Vec<[u8; 32]> = (0..4 * nodes as u32).map(|i| [i as u8; 32]).collect();
    let at: Vec<u32> = (0..nodes as u32).collect();
    let mut parents = vec![[0u8; 32]; nodes];
    let leaf_at: Vec<u32> = (0..blocks.len() as u32).collect();
    let mut leaves = vec![[0u8; 32]; blocks.len()];
    println!(
        "root floor: {} leaves of {} bytes on average, {nodes} 4-ary nodes",
        blocks.len(),
        leaf_bytes.iter().map(Vec::len).sum::<usize>() / leaf_bytes.len().max(1)
    );
    g.bench_function("floor_wide_hashes", |b| {
        b.iter(|| {
            metatopia_sim::wide::keyed_hash_blocks_at(
                &[1; 32],
                std::hint::black_box(&blocks),
                &lens,
                &leaf_at,
                &mut leaves,
            );
            metatopia_sim::wide::nodes4_at(&[2; 32], &children, &at, &mut parents);
            (leaves[0][0], parents[0][0])
        })
    });
    g.bench_function("baseline_blake3_concat", |b| b.iter(|| blake3::hash(std::hint::black_box(&concat))));
    g.bench_function("baseline_blake3_each", |b| {
        b.iter(|| sample.iter().map(|s| blake3::hash(s).as_bytes()[0]).fold(0u8, |a, x| a ^ x))
    });
    g.bench_function("baseline_encode_and_blake3_each", |b| {
        b.iter_batched(
            &mut pick,
            |chosen| {
                let mut buf = Vec::new();
                let mut acc = 0u8;
                for id in chosen {
                    buf.clear();
                    buf = postcard::to_extend(world.object(id).unwrap(), buf).unwrap();
                    acc ^= blake3::hash(&buf).as_bytes()[0];
                }
                acc
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// The lane-parallel BLAKE3 of `metatopia_sim::wide` beside the `blake3` crate doing the same
/// hashes one at a time: 1,434 keyed hashes of 110-byte leaves, 1,300 4-ary nodes.
fn wide(c: &mut Criterion) {
    use metatopia_sim::wide;
    let key = [7u8; 32];
    let leaves: Vec<Vec<u8>> = (0..1_434u32).map(|i| (0..110u32).map(|j| (i * 31 + j) as u8).collect()).collect();
    let refs: Vec<&[u8]> = leaves.iter().map(Vec::as_slice).collect();
    let children: Vec<[u8; 32]> = (0..4 * 1_300u32).map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes()).collect();
    let at: Vec<u32> = (0..1_300).collect();
    let mut parents = vec![[0u8; 32]; 1_300];
    let mut g = c.benchmark_group("wide");
    g.bench_function("leaves_1434x110B", |b| b.iter(|| wide::keyed_hash_many(&key, std::hint::black_box(&refs))));
    g.bench_function("raw_blake3_leaves_1434x110B", |b| {
        b.iter(|| refs.iter().map(|r| *blake3::keyed_hash(&key, r).as_bytes()).collect::<Vec<_>>())
    });
    g.bench_function("nodes4_1300", |b| b.iter(|| wide::nodes4_at(&key, &children, &at, &mut parents)));
    g.bench_function("raw_blake3_nodes4_1300", |b| {
        b.iter(|| {
            children.chunks_exact(4).map(|c| *blake3::keyed_hash(&key, c.as_flattened()).as_bytes()).collect::<Vec<_>>()
        })
    });
    g.finish();
}

fn near(c: &mut Criterion) {
    use metatopia_sim::state::near::Near;
    use metatopia_sim::{Fx, Vec2};
    let world = demo_world(DemoSpec { seed: 6, objects: 15_000, players: 200, ..DemoSpec::default() }).world;
    let centres: Vec<(ObjectId, Vec2)> = world.objects().values().step_by(75).map(|o| (o.id, o.position)).collect();
    let mut g = c.benchmark_group("near");
    g.sample_size(20);
    for r in [10, 100] {
        let radius = Fx::from_int(r);
        g.bench_function(format!("15k_200_r{r}"), |b| {
            b.iter(|| {
                let near = Near::default();
                centres.iter().map(|&(me, at)| near.within(&world, at, radius, me, 64).len()).sum::<usize>()
            })
        });
        g.bench_function(format!("walk_15k_200_r{r}"), |b| {
            b.iter(|| {
                centres
                    .iter()
                    .map(|&(me, at)| world.objects_within(at, radius).filter(|o| o.id != me).take(64).count())
                    .sum::<usize>()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, tick, root, wide, near);
criterion_main!(benches);
