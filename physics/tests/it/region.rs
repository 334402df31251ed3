//! One region: determinism, snapshots, commands, events, bad input.

use crate::common::{dt, hex, lattice_scene};
use metatopia_physics::{Msg, Region, RegionConfig, RegionError, RegionId};
use metatopia_sim::host::{PhysicsCommand, PhysicsEvent};
use metatopia_sim::state::BodyKind;
use metatopia_sim::state::{Region as Square, Shape};
use metatopia_sim::{Fx, ObjectId, Vec2};

fn run(region: &mut Region, ticks: u32) {
    for _ in 0..ticks {
        region.step(&[], dt());
    }
}

#[test]
fn the_same_scene_twice_gives_the_same_roots_every_tick() {
    let mut a = lattice_scene(300, 7);
    let mut b = lattice_scene(300, 7);
    for t in 0..200 {
        let (oa, ob) = (a.step(&[], dt()), b.step(&[], dt()));
        assert_eq!(oa.bodies, ob.bodies, "tick {t}");
        assert_eq!(oa.events, ob.events, "tick {t}");
        assert_eq!(a.root(), b.root(), "tick {t}");
    }
    // And the scene did something: bodies moved and collided.
    assert_ne!(a.root(), lattice_scene(300, 7).root());
}

#[test]
fn snapshot_and_restore_in_the_middle_continues_bit_identically() {
    let mut straight = lattice_scene(400, 11);
    let mut restored = lattice_scene(400, 11);
    run(&mut straight, 150);
    run(&mut restored, 150);
    let bytes = restored.save();
    let config = restored.config().clone();
    let mut restored = Region::restore(&config, &bytes).unwrap();
    assert_eq!(restored.root(), straight.root());
    for t in 150..400 {
        let (a, b) = (straight.step(&[], dt()), restored.step(&[], dt()));
        assert_eq!(a.bodies, b.bodies, "tick {t}");
        assert_eq!(a.events, b.events, "tick {t}");
    }
    assert_eq!(restored.root(), straight.root());
}

/// DESIGN §5: a golden root after 600 ticks of a 2,000-body scene. The test command runs this
/// unoptimised and optimised; both must give these bits.
#[test]
fn golden_root_after_600_ticks_of_2000_bodies() {
    let mut region = lattice_scene(2_000, 2026);
    let mut collisions = 0;
    for _ in 0..600 {
        collisions += region.step(&[], dt()).events.len();
    }
    assert!(collisions > 1_000, "a scene this dense collides: {collisions}");
    assert_eq!(hex(region.root()), "cdf171540f163afafc9252989c82fba7b0c1d296054dbd78c0028b361ec0460d");
    // The whole carried state too (contacts, islands, broad phase), not only the bodies.
    assert_eq!(hex(region.full_hash()), "8b7b0781f9471acc1f8944e35aad4b82af5fb7df4edd38cceb08bcf63f70baf5");
}

#[test]
fn commands_spawn_steer_push_and_despawn() {
    let area = Square { origin: Vec2::ZERO, size: Fx::from_int(64) };
    let mut r = Region::new(RegionConfig::single(RegionId(0), area)).unwrap();
    let (a, b) = (ObjectId(1), ObjectId(2));
    let circle = Shape::Circle { radius: Fx::HALF };
    let spawn = [
        PhysicsCommand::Spawn {
            object: a,
            position: Vec2::from_ints(10, 10),
            velocity: Vec2::ZERO,
            shape: circle,
            body: BodyKind::Dynamic,
            surface: None,
        },
        PhysicsCommand::Spawn {
            object: b,
            position: Vec2::from_ints(40, 40),
            velocity: Vec2::ZERO,
            shape: circle,
            body: BodyKind::Dynamic,
            surface: None,
        },
    ];
    r.step(&spawn, dt());
    assert_eq!(r.owned().collect::<Vec<_>>(), vec![a, b]);
    // Walk a to (20, 10) at 4 m/s: 2.5 s, then it stops there.
    let target = Vec2::from_ints(20, 10);
    r.step(&[PhysicsCommand::SetTarget { object: a, target, speed: Fx::from_int(4) }], dt());
    for _ in 0..200 {
        r.step(&[], dt());
    }
    let s = r.body_state(a).unwrap();
    assert!((s.position - target).length() < Fx::from_ratio(1, 100), "{:?}", s.position);
    assert!(s.velocity.length() < Fx::from_ratio(1, 100), "{:?}", s.velocity);
    // Push b east: velocity 3 m/s, so one second later it is about 3 m further.
    r.step(&[PhysicsCommand::Impulse { object: b, impulse: Vec2::from_ints(3, 0) }], dt());
    for _ in 0..59 {
        r.step(&[], dt());
    }
    let s = r.body_state(b).unwrap();
    assert!((s.position.x - Fx::from_int(43)).abs() < Fx::from_ratio(1, 10), "{:?}", s.position);
    r.step(&[PhysicsCommand::Despawn { object: b }], dt());
    assert_eq!(r.owned().collect::<Vec<_>>(), vec![a]);
    assert!(r.body_state(b).is_none());
}

#[test]
fn walls_keep_bodies_inside_a_lone_region() {
    let area = Square { origin: Vec2::ZERO, size: Fx::from_int(16) };
    let mut r = Region::new(RegionConfig::single(RegionId(0), area)).unwrap();
    let circle = Shape::Circle { radius: Fx::HALF };
    r.spawn(ObjectId(1), circle, Vec2::from_ints(8, 8), Fx::ZERO, Vec2::from_ints(25, 17), BodyKind::Dynamic, None);
    for _ in 0..600 {
        let out = r.step(&[], dt());
        for b in out.bodies {
            assert!(area.contains(b.position), "{:?} left the region", b.position);
        }
    }
}

#[test]
fn two_bodies_colliding_give_one_event_each() {
    let area = Square { origin: Vec2::ZERO, size: Fx::from_int(32) };
    let mut r = Region::new(RegionConfig::single(RegionId(0), area)).unwrap();
    let circle = Shape::Circle { radius: Fx::HALF };
    let (a, b) = (ObjectId(1), ObjectId(2));
    r.spawn(a, circle, Vec2::from_ints(10, 16), Fx::ZERO, Vec2::from_ints(2, 0), BodyKind::Dynamic, None);
    r.spawn(b, circle, Vec2::from_ints(20, 16), Fx::ZERO, Vec2::from_ints(-2, 0), BodyKind::Dynamic, None);
    let mut events = Vec::new();
    for _ in 0..240 {
        events.extend(r.step(&[], dt()).events);
    }
    assert_eq!(
        events,
        vec![PhysicsEvent::Collision { object: a, other: b }, PhysicsEvent::Collision { object: b, other: a }]
    );
}

#[test]
fn a_tampered_or_foreign_save_is_refused_with_a_reason() {
    let mut r = lattice_scene(50, 3);
    run(&mut r, 10);
    let bytes = r.save();
    let config = r.config().clone();
    // Truncated.
    let e = Region::restore(&config, &bytes[..bytes.len() / 2]).unwrap_err();
    assert!(matches!(e, RegionError::Decode(_)), "{e}");
    // Trailing garbage.
    let mut long = bytes.clone();
    long.push(0);
    assert!(matches!(Region::restore(&config, &long).unwrap_err(), RegionError::Decode(_)));
    // Another region's config.
    let mut other = config.clone();
    other.id = RegionId(9);
    let e = Region::restore(&other, &bytes).unwrap_err();
    assert!(matches!(e, RegionError::ConfigMismatch { .. }), "{e}");
    assert!(e.to_string().contains("r9"), "{e}");
    // Random byte flips: an error or a region, never a panic.
    for i in (0..bytes.len()).step_by(bytes.len() / 97 + 1) {
        let mut t = bytes.clone();
        t[i] ^= 0x5a;
        let _ = Region::restore(&config, &t);
    }
}

#[test]
fn mail_from_a_stranger_or_with_nonsense_numbers_is_refused() {
    let cfg = RegionConfig::grid(2, 1, Fx::from_int(32), 0, 0);
    let mut r = Region::new(cfg).unwrap();
    let bad_body = metatopia_physics::BodyMsg {
        object: ObjectId(5),
        shape: Shape::Circle { radius: Fx::HALF },
        position: [f32::NAN, 1.0],
        rotation: [1.0, 0.0],
        linvel: [0.0, 0.0],
        angvel: 0.0,
        kind: BodyKind::Dynamic,
        surface: None,
    };
    let good_body = metatopia_physics::BodyMsg { position: [33.0, 16.0], ..bad_body };
    r.deliver([
        // Not a neighbour.
        metatopia_physics::Envelope { from: RegionId(7), to: RegionId(0), tick: 1, msg: Msg::Ghosts(vec![good_body]) },
        // Not for us.
        metatopia_physics::Envelope { from: RegionId(1), to: RegionId(3), tick: 1, msg: Msg::Ghosts(vec![good_body]) },
        // NaN.
        metatopia_physics::Envelope {
            from: RegionId(1),
            to: RegionId(0),
            tick: 1,
            msg: Msg::Transfer { epoch: 1, nonce: 1, body: bad_body, target: None },
        },
    ]);
    let out = r.step(&[], dt());
    assert_eq!(out.refused, 3);
    assert_eq!(r.body_count(), 0);
    // A transfer nobody asked for is not an ownership.
    r.deliver([metatopia_physics::Envelope {
        from: RegionId(1),
        to: RegionId(0),
        tick: 2,
        msg: Msg::Transfer { epoch: 1, nonce: 1, body: good_body, target: None },
    }]);
    r.step(&[], dt());
    assert_eq!(r.owned().count(), 0);
}

#[test]
fn a_save_at_a_full_hash_tick_is_checked_byte_for_byte() {
    let mut r = lattice_scene(200, 9);
    run(&mut r, metatopia_physics::region::FULL_ROOT_EVERY as u32);
    let bytes = r.save();
    let config = r.config().clone();
    assert_eq!(Region::restore(&config, &bytes).unwrap().root(), r.root());
    // Flip bytes all over: each one is refused (or fails to decode), never accepted.
    let mut refused = 0;
    for i in (0..bytes.len()).step_by(bytes.len() / 50 + 1) {
        let mut t = bytes.clone();
        t[i] ^= 0x04;
        match Region::restore(&config, &t) {
            Ok(other) => panic!("byte {i} flipped and accepted (root {:?})", other.root()),
            Err(RegionError::Inconsistent(m)) if m.contains("full hash") => refused += 1,
            Err(_) => {}
        }
    }
    assert!(refused > 10, "most flips decode and are caught by the hash: {refused}");
}

/// A body the sim renames (an arrival from a neighbour gets its local id) or removes after the
/// step of a full-hash tick changes the carried state the full hash covers: a snapshot taken at
/// that tick still loads, and the restored region runs on bit-identically.
#[test]
fn a_save_at_a_full_hash_tick_after_a_rename_and_a_removal_loads_and_runs_on_identically() {
    let full = metatopia_physics::region::FULL_ROOT_EVERY as u32;
    let mut straight = lattice_scene(200, 13);
    run(&mut straight, full);
    let owned: Vec<ObjectId> = straight.owned().take(2).collect();
    let (a, b) = (owned[0], owned[1]);
    let before = straight.root();
    straight.rename(a, ObjectId(1_000_000));
    straight.despawn(b);
    assert_ne!(straight.root(), before, "the root covers the rename and the removal");
    let bytes = straight.save();
    let config = straight.config().clone();
    let mut restored = Region::restore(&config, &bytes).expect("a save at a full-hash tick after a rename loads");
    assert_eq!(restored.root(), straight.root());
    for t in full..full * 3 {
        let (x, y) = (straight.step(&[], dt()), restored.step(&[], dt()));
        assert_eq!(x.bodies, y.bodies, "tick {t}");
        assert_eq!(straight.root(), restored.root(), "tick {t}");
        // And every save on the way loads, full-hash ticks included.
        Region::restore(&config, &straight.save()).unwrap();
    }
}
