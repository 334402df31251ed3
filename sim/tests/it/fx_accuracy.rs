//! Accuracy of `Fx` math against an f64 reference (floats live only here, under tests/, as
//! DESIGN §5 allows). f64 carries ~52 bits, far beyond Fx's 16 fraction bits, so it serves as
//! the high-precision reference. The maxima found are stated in `sim/src/fx.rs`.

use metatopia_sim::genesis::demo_key;
use metatopia_sim::rng::DetRng;
use metatopia_sim::{Fx, Vec2};

const ULP: f64 = 1.0 / 65_536.0;

fn f(x: Fx) -> f64 {
    x.to_bits() as f64 * ULP
}

/// Error in ULPs between an Fx result and a real reference value.
fn ulps(got: Fx, want: f64) -> f64 {
    (f(got) - want).abs() / ULP
}

#[test]
fn sin_cos_within_one_ulp() {
    let mut rng = DetRng::from_u64(1);
    let mut worst: f64 = 0.0;
    // Dense sweep of [-4π, 4π] plus random angles up to ±2^20 rad.
    let sweep = (-823_550i64..=823_550).step_by(23);
    let random = (0..20_000).map(|_| rng.range_i64(-(1 << 36), 1 << 36));
    for bits in sweep.chain(random) {
        let a = Fx::from_bits(bits);
        let (s, c) = a.sin_cos();
        worst = worst.max(ulps(s, f(a).sin())).max(ulps(c, f(a).cos()));
    }
    println!("sin/cos worst error: {worst:.3} ULP");
    assert!(worst <= 1.0, "sin/cos error {worst} ULP");
}

#[test]
fn atan2_within_one_ulp() {
    let mut rng = DetRng::from_u64(2);
    let mut worst: f64 = 0.0;
    for _ in 0..60_000 {
        // Mix tiny, unit and huge magnitudes.
        let scale = [8, 20, 32, 46][rng.below(4) as usize];
        let y = Fx::from_bits(rng.range_i64(-(1 << scale), 1 << scale));
        let x = Fx::from_bits(rng.range_i64(-(1 << scale), 1 << scale));
        if x.is_zero() && y.is_zero() {
            continue;
        }
        let got = Fx::atan2(y, x);
        let want = (y.to_bits() as f64).atan2(x.to_bits() as f64);
        worst = worst.max(ulps(got, want));
    }
    println!("atan2 worst error: {worst:.3} ULP");
    assert!(worst <= 1.0, "atan2 error {worst} ULP");
}

#[test]
fn sqrt_and_length_are_exact_floors() {
    let mut rng = DetRng::from_u64(3);
    for _ in 0..100_000 {
        let v = Fx::from_bits(rng.range_i64(0, i64::MAX));
        let r = v.sqrt().to_bits() as i128;
        let target = (v.to_bits() as i128) << 16;
        assert!(r * r <= target && (r + 1) * (r + 1) > target, "sqrt of {v}");
        let p = Vec2::new(
            Fx::from_bits(rng.range_i64(-(1 << 40), 1 << 40)),
            Fx::from_bits(rng.range_i64(-(1 << 40), 1 << 40)),
        );
        let want = (f(p.x).hypot(f(p.y))) / ULP;
        let got = p.length().to_bits() as f64;
        assert!((got - want).abs() <= 1.0, "length of {p:?}: {got} vs {want}");
    }
}

#[test]
fn vectors_round_trip_through_angles() {
    for i in 0..3600i64 {
        let a = Fx::from_ratio(i - 1800, 573); // about ±π in ~0.1° steps
        let back = Vec2::from_angle(a).angle();
        let diff = f(back) - f(a);
        // Wrap-around at ±π is the same direction.
        let wrapped = (diff + std::f64::consts::PI).rem_euclid(std::f64::consts::TAU) - std::f64::consts::PI;
        assert!(wrapped.abs() / ULP <= 3.0, "angle {a}: {back}");
    }
    // Keys are deterministic too (used by tests everywhere).
    assert_eq!(demo_key(1, 2).to_bytes(), demo_key(1, 2).to_bytes());
}
