//! The boundary between rapier's `f32` and the sim's `Fx` (DESIGN §5, §7).
//!
//! Both directions are exact functions of their input bits: `Fx` → `f32` rounds the 64-bit raw
//! value to nearest-even once and divides by a power of two (exact); `f32` → `Fx` multiplies by
//! a power of two (exact), rounds ties to even and saturates. No transcendental function runs
//! at the boundary: rotations are read back with the sim's own CORDIC `atan2`.

use metatopia_sim::{Fx, Vec2};
use rapier2d::math::{Rotation, Vector};

const SCALE: f32 = (1u32 << metatopia_sim::fx::FRAC_BITS) as f32;

pub fn to_f32(x: Fx) -> f32 {
    x.to_bits() as f32 / SCALE
}

/// Non-finite values (rapier quarantines such bodies) read back as zero.
pub fn from_f32(x: f32) -> Fx {
    if !x.is_finite() {
        return Fx::ZERO;
    }
    Fx::from_bits(round_ties_even(x * SCALE))
}

/// Round to the nearest integer, ties to even, saturating; with basic operations only (the
/// library call `roundevenf` is slow on x86-64 without SSE4.1, and this is on the hot path).
/// No branch depends on the value's fraction (a position's fraction is noise to a branch
/// predictor): below 2^23 adding 2^23 leaves no fractional bit, so the addition itself rounds
/// to nearest with ties to even (IEEE's default); from 2^23 on every `f32` is an integer.
fn round_ties_even(y: f32) -> i64 {
    const BIG: f32 = 4_611_686_018_427_387_904.0; // 2^62
    const TWO_23: f32 = 8_388_608.0;
    if y >= BIG {
        return i64::MAX;
    }
    if y <= -BIG {
        return i64::MIN;
    }
    let a = y.abs();
    let rounded = (a + TWO_23) - TWO_23;
    let r = if a < TWO_23 { rounded } else { a };
    r.copysign(y) as i64
}

pub fn to_vector(v: Vec2) -> Vector {
    Vector::new(to_f32(v.x), to_f32(v.y))
}

pub fn from_vector(v: Vector) -> Vec2 {
    Vec2::new(from_f32(v.x), from_f32(v.y))
}

/// A rotation from an `Fx` angle, through the sim's deterministic sin/cos.
pub fn to_rotation(angle: Fx) -> Rotation {
    let (s, c) = angle.sin_cos();
    let (s, c) = (to_f32(s), to_f32(c));
    let n = (s * s + c * c).sqrt();
    if n > 0.0 { Rotation::from_cos_sin_unchecked(c / n, s / n) } else { Rotation::IDENTITY }
}

/// A rotation's angle in `(-π, π]`, by `libm`'s `atan2f`: pure Rust on basic IEEE operations,
/// so the same bits on every machine (rapier's `enhanced-determinism` relies on the same
/// library). The sim's CORDIC `atan2` gave the same angles within 1 ULP of `Fx` but cost a
/// quarter of a 4,000-body step.
pub fn from_rotation(r: &Rotation) -> Fx {
    from_f32(libm::atan2f(r.sin(), r.cos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fx_round_trips_through_f32_where_f32_is_exact() {
        // 24 bits of mantissa: every Fx below 256 m round-trips exactly.
        for bits in [0i64, 1, -1, 65_536, -65_536, 12_345_678, -(1 << 23), (1 << 24) - 1] {
            let x = Fx::from_bits(bits);
            assert_eq!(from_f32(to_f32(x)), x, "bits {bits}");
        }
    }

    #[test]
    fn non_finite_reads_back_as_zero_and_huge_saturates() {
        assert_eq!(from_f32(f32::NAN), Fx::ZERO);
        assert_eq!(from_f32(f32::INFINITY), Fx::ZERO);
        assert_eq!(from_f32(1e30), Fx::MAX);
        assert_eq!(from_f32(-1e30), Fx::MIN);
    }

    #[test]
    fn rounding_is_to_nearest_with_ties_to_even() {
        let cases = [
            (0.5f32, 0i64),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (-2.5, -2),
            (0.49999997, 0),
            (0.50000006, 1),
            (-0.50000006, -1),
            (4_194_304.5, 4_194_304),
            (4_194_305.5, 4_194_306),
            (8_388_609.0, 8_388_609),
            (1.0e12, 999_999_995_904), // the nearest f32 to 10^12
            (-1.0e12, -999_999_995_904),
            (1.0e30, i64::MAX),
            (-1.0e30, i64::MIN),
        ];
        for (y, want) in cases {
            assert_eq!(round_ties_even(y), want, "{y}");
        }
        // Against the library rounding on a sweep of values, including every half.
        for i in -100_000i32..100_000 {
            let y = i as f32 * 0.25 + 0.003 * (i % 7) as f32;
            assert_eq!(round_ties_even(y), y.round_ties_even() as i64, "{y}");
        }
    }

    /// The rule as plainly written (the function before it lost its branches): the same
    /// integer for every input.
    fn round_ties_even_plainly(y: f32) -> i64 {
        const BIG: f32 = 4_611_686_018_427_387_904.0;
        if y >= BIG {
            return i64::MAX;
        }
        if y <= -BIG {
            return i64::MIN;
        }
        let t = y as i64;
        let f = y - t as f32;
        let odd = t & 1 != 0;
        if f > 0.5 || (f == 0.5 && odd) {
            t + 1
        } else if f < -0.5 || (f == -0.5 && odd) {
            t - 1
        } else {
            t
        }
    }

    #[test]
    fn rounding_without_branches_agrees_with_the_plain_rule() {
        // Every finite f32 of every 4,099th bit pattern (a million values over the whole
        // range, both signs), and every value around 2^23 and 2^24 where the rounding changes.
        let mut bits = 0u32;
        loop {
            let y = f32::from_bits(bits);
            if y.is_finite() {
                assert_eq!(round_ties_even(y), round_ties_even_plainly(y), "{y} ({bits:#x})");
            }
            match bits.checked_add(4_099) {
                Some(b) => bits = b,
                None => break,
            }
        }
        for edge in [8_388_608.0f32, 16_777_216.0, 4_194_304.0, 0.5, 1.0] {
            let mid = edge.to_bits();
            for b in mid - 5_000..mid + 5_000 {
                for y in [f32::from_bits(b), -f32::from_bits(b)] {
                    assert_eq!(round_ties_even(y), round_ties_even_plainly(y), "{y}");
                }
            }
        }
    }

    #[test]
    fn rotation_round_trip_is_close() {
        for deg in [-179i64, -90, -45, 0, 1, 30, 90, 179] {
            let a = Fx::PI.mul_sat(Fx::from_ratio(deg, 180));
            let back = from_rotation(&to_rotation(a));
            assert!((back - a).abs() <= Fx::from_ratio(1, 1000), "{deg}°: {a} -> {back}");
        }
    }
}
