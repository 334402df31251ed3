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

/// A ball rolling into a static wall and a kinematic post bounces off both; neither moves
/// (rapier's fixed and kinematic bodies), and the collisions reach the scripts' queue.
#[test]
fn a_ball_bounces_off_static_and_kinematic_bodies_that_stay_put() {
    use metatopia_sim::state::{BodyKind, ObjectKind, Shape};
    use metatopia_sim::{Fx, Vec2};
    let mut demo = demo_world(DemoSpec { seed: 8, objects: 0, players: 0, ..DemoSpec::default() });
    let c = demo.world.region().centre();
    let owner = metatopia_sim::event::account_of(&demo.admin);
    let mut add = |name: &str, at: Vec2, velocity: Vec2, body: BodyKind| {
        let shape = Shape::Box { half_width: Fx::ONE, half_height: Fx::from_int(3) };
        demo.world.add_genesis_object(
            ObjectKind::Prim,
            owner,
            name.into(),
            shape,
            c + at,
            velocity,
            0xff,
            String::new(),
            body,
        )
    };
    let wall = add("wall", Vec2::from_ints(8, 0), Vec2::ZERO, BodyKind::Static);
    let post = add("post", Vec2::from_ints(-8, 0), Vec2::ZERO, BodyKind::Kinematic);
    let ball = add("ball", Vec2::ZERO, Vec2::from_ints(6, 0), BodyKind::Dynamic);
    let mut sim = Sim::new(demo.world.clone(), RuleHost::default(), RegionStage::single(), 1).unwrap();
    let (w0, p0) = (sim.world().object(wall).unwrap().position, sim.world().object(post).unwrap().position);
    let mut hits = std::collections::BTreeSet::new();
    let mut turned = 0;
    let mut last_vx = Fx::from_int(6);
    for _ in 0..150 {
        let tick = sim.world().tick();
        let batch = EventGen::new(&demo, 1).batch(sim.world(), tick, 0);
        sim.step(&VerifiedBatch::new(batch, 1)).unwrap();
        for q in sim.world().queue() {
            if let Queued::Collision { object, other } = q {
                hits.insert((*object, *other));
            }
        }
        let vx = sim.world().object(ball).unwrap().velocity.x;
        if (vx > Fx::ZERO) != (last_vx > Fx::ZERO) && vx != Fx::ZERO {
            turned += 1;
        }
        last_vx = vx;
    }
    assert_eq!(sim.world().object(wall).unwrap().position, w0, "the static wall did not move");
    assert_eq!(sim.world().object(post).unwrap().position, p0, "the kinematic post was not pushed");
    assert!(turned >= 2, "the ball bounced off both: it turned {turned} times");
    assert!(hits.iter().any(|(a, b)| (*a, *b) == (ball, wall) || (*a, *b) == (wall, ball)), "{hits:?}");
}

/// An avatar holds its owner's walking velocity: one standing still (its last input was zero)
/// is hit by a ball, is moved by it for a moment, and stands still again at once.
#[test]
fn an_avatar_stops_when_its_input_stops_even_after_a_bump() {
    use metatopia_sim::state::{BodyKind, ObjectKind, Shape};
    use metatopia_sim::{Batch, Fx, Payload, SignedEvent, Vec2};
    let mut demo = demo_world(DemoSpec { seed: 9, objects: 0, players: 1, ..DemoSpec::default() });
    let owner = metatopia_sim::event::account_of(&demo.admin);
    let me = metatopia_sim::event::account_of(&demo.players[0]);
    let still = demo.world.account(&me).and_then(|a| a.avatar).unwrap();
    let at = demo.world.object(still).unwrap().position - Vec2::from_ints(6, 0);
    let shape = Shape::Circle { radius: Fx::HALF };
    let (v, white) = (Vec2::from_ints(8, 0), 0xffff_ffff);
    let ball = demo.world.add_genesis_object(
        ObjectKind::Prim,
        owner,
        "ball".into(),
        shape,
        at,
        v,
        white,
        String::new(),
        BodyKind::Dynamic,
    );
    let mut sim = Sim::new(demo.world.clone(), RuleHost::default(), RegionStage::single(), 1).unwrap();
    let s0 = sim.world().object(still).unwrap().position;
    let (sim_id, rate) = (sim.world().sim(), sim.world().settings().tick_rate_hz);
    let mut hit = false;
    for t in 0..90u64 {
        let tick = sim.world().tick();
        let events = match t {
            0 => vec![SignedEvent::new(
                &demo.players[0],
                sim_id,
                1,
                Payload::Move { object: still, velocity: Vec2::ZERO },
            )],
            _ => Vec::new(),
        };
        let (time_ms, seed) =
            (metatopia_sim::genesis::tick_time_ms(tick, rate), metatopia_sim::genesis::tick_seed(tick));
        let r = sim.step(&VerifiedBatch::new(Batch { tick, time_ms, seed, events }, 1)).unwrap();
        assert!(r.rejected.is_empty(), "{:?}", r.rejected);
        hit |= sim.world().queue().iter().any(|q| matches!(q, Queued::Collision { object, other } if [*object, *other] == [still, ball] || [*object, *other] == [ball, still]));
    }
    assert!(hit, "the ball hit the avatar");
    let s = sim.world().object(still).unwrap();
    assert_eq!(s.velocity, Vec2::ZERO, "the avatar whose input is zero stands still after the bump");
    assert!((s.position - s0).length() < Fx::ONE, "and was moved less than a metre: {:?}", s.position - s0);
    assert!(sim.world().object(ball).unwrap().velocity.x < Fx::ONE, "the ball gave up its speed to the avatar");
}

/// An owner's surface for an object: a ball given damping slows to a stop while its twin rolls
/// on; a new surface keeps the ball moving (only a new place, shape or body kind stops it).
#[test]
fn a_ball_with_its_own_damping_slows_to_a_stop_and_its_twin_rolls_on() {
    use metatopia_sim::state::{BodyKind, ObjectKind, Shape, Surface};
    use metatopia_sim::{Batch, Fx, ObjectEdit, Payload, SignedEvent, Vec2};
    let mut demo = demo_world(DemoSpec { seed: 10, objects: 0, players: 1, ..DemoSpec::default() });
    let me = metatopia_sim::event::account_of(&demo.players[0]);
    let c = demo.world.region().centre();
    let mut ball = |dy: i64| {
        let (shape, v) = (Shape::Circle { radius: Fx::HALF }, Vec2::from_ints(3, 0));
        let at = c + Vec2::from_ints(-20, dy);
        demo.world.add_genesis_object(
            ObjectKind::Prim,
            me,
            "ball".into(),
            shape,
            at,
            v,
            0xff,
            String::new(),
            BodyKind::Dynamic,
        )
    };
    let (damped, free) = (ball(10), ball(-10));
    let mut sim = Sim::new(demo.world.clone(), RuleHost::default(), RegionStage::single(), 1).unwrap();
    let (sim_id, rate) = (sim.world().sim(), sim.world().settings().tick_rate_hz);
    let surface =
        Surface { friction: Fx::from_ratio(2, 10), restitution: Fx::from_ratio(9, 10), damping: Fx::from_int(5) };
    let edit = ObjectEdit { surface: Some(surface), ..ObjectEdit::default() };
    for t in 0..60u64 {
        let tick = sim.world().tick();
        let events = match t {
            0 => vec![SignedEvent::new(
                &demo.players[0],
                sim_id,
                1,
                Payload::Edit { object: damped, edit: edit.clone() },
            )],
            _ => Vec::new(),
        };
        let (time_ms, seed) =
            (metatopia_sim::genesis::tick_time_ms(tick, rate), metatopia_sim::genesis::tick_seed(tick));
        let r = sim.step(&VerifiedBatch::new(Batch { tick, time_ms, seed, events }, 1)).unwrap();
        assert!(r.rejected.is_empty(), "{:?}", r.rejected);
        if t == 1 {
            assert!(sim.world().object(damped).unwrap().velocity.x > Fx::ONE, "a new surface keeps it moving");
        }
    }
    let (d, f) = (sim.world().object(damped).unwrap(), sim.world().object(free).unwrap());
    assert_eq!(d.surface, Some(surface));
    assert!(d.velocity.length() < Fx::from_ratio(1, 10), "the damped ball stopped: {:?}", d.velocity);
    assert_eq!(f.velocity, Vec2::from_ints(3, 0), "its twin rolls on");
}
