//! Seeded scenes for the physics tests.
#![allow(dead_code)]

use metatopia_physics::{Region, RegionConfig, RegionId};
use metatopia_sim::rng::DetRng;
use metatopia_sim::state::BodyKind;
use metatopia_sim::state::{Region as Square, Shape};
use metatopia_sim::{Fx, ObjectId, Vec2};

/// One 60 Hz tick.
pub fn dt() -> Fx {
    Fx::from_ratio(1, 60)
}

pub fn hex(h: metatopia_sim::Hash32) -> String {
    metatopia_sim::ids::hex(&h.0)
}

/// A random body: a circle or a box, 0.25–0.75 m, moving at up to `speed` m/s.
pub fn random_body(rng: &mut DetRng, lo: Vec2, size: Fx, speed: i64) -> (Shape, Vec2, Vec2) {
    let shape = if rng.chance(1, 2) {
        Shape::Circle { radius: Fx::from_ratio(rng.range_i64(25, 75), 100) }
    } else {
        Shape::Box {
            half_width: Fx::from_ratio(rng.range_i64(25, 75), 100),
            half_height: Fx::from_ratio(rng.range_i64(25, 75), 100),
        }
    };
    let span = size.to_bits();
    let p = Vec2::new(
        lo.x + Fx::from_bits(rng.range_i64(span / 50, span - span / 50)),
        lo.y + Fx::from_bits(rng.range_i64(span / 50, span - span / 50)),
    );
    let v = Vec2::new(
        Fx::from_ratio(rng.range_i64(-speed * 100, speed * 100), 100),
        Fx::from_ratio(rng.range_i64(-speed * 100, speed * 100), 100),
    );
    (shape, p, v)
}

/// `n` bodies on a jittered lattice (so none start overlapping) in one walled region.
pub fn lattice_scene(n: u32, seed: u64) -> Region {
    let side = (f64_free_isqrt(u64::from(n)) + 1) as i64;
    let size = Fx::from_int(side * 2 + 4);
    let mut region = Region::new(RegionConfig::single(RegionId(0), Square { origin: Vec2::ZERO, size })).unwrap();
    let mut rng = DetRng::from_u64(seed);
    for i in 0..i64::from(n) {
        let (x, y) = (i % side, i / side);
        let shape = if i % 2 == 0 {
            Shape::Circle { radius: Fx::from_ratio(rng.range_i64(30, 70), 100) }
        } else {
            Shape::Box {
                half_width: Fx::from_ratio(rng.range_i64(30, 70), 100),
                half_height: Fx::from_ratio(rng.range_i64(30, 70), 100),
            }
        };
        let p = Vec2::new(Fx::from_int(3 + 2 * x), Fx::from_int(3 + 2 * y));
        let v = Vec2::new(Fx::from_ratio(rng.range_i64(-300, 300), 100), Fx::from_ratio(rng.range_i64(-300, 300), 100));
        region.spawn(ObjectId(i as u64 + 1), shape, p, Fx::ZERO, v, BodyKind::Dynamic, None);
    }
    region
}

fn f64_free_isqrt(n: u64) -> u64 {
    let mut r = 0u64;
    while (r + 1) * (r + 1) <= n {
        r += 1;
    }
    r
}
