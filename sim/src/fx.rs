//! `Fx`: the sim's number. Fixed point, 48 integer bits and 16 fraction bits (I48F16, the
//! format of Photon Quantum's Q48.16), so every node computes the same bits.
//!
//! Rules (DESIGN §5):
//! - Arithmetic is done on the raw `i64` bits with `i128` intermediates; the operators
//!   **saturate** (never wrap, never panic), the `checked_*` methods return `None` instead.
//!   Division by zero saturates to `MAX`/`MIN` by the sign of the dividend (`0 / 0 = 0`).
//! - Multiplication and division truncate toward negative infinity and zero respectively,
//!   the same way on every machine.
//! - `sqrt` is exact: the floor of the true square root of the represented value.
//! - `sin`, `cos` and `atan2` use CORDIC (the `cordic` crate) in a 56-fraction-bit type and
//!   round to the nearest `Fx`. Measured against a 64-bit floating-point reference over the whole range
//!   (`sim/tests/fx_accuracy.rs`): **max error 0.5 ULP measured, 1 ULP asserted**
//!   (1 ULP = 2⁻¹⁶ ≈ 1.53e-5) for angles within ±2²⁰ rad; larger angles add at most
//!   |angle|·2⁻⁵⁶ from range reduction. `Vec2::length` is exact (floor), `normalize` within 2 ULP.
//!
//! Conversions from decimal text (`"1.5".parse::<Fx>()`) round to nearest; no float ever
//! enters the type.

use core::fmt;
use core::ops::{Add, AddAssign, Div, Mul, Neg, Sub, SubAssign};
use core::str::FromStr;

use fixed::types::{I8F56, I48F16};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Number of fraction bits.
pub const FRAC_BITS: u32 = 16;
/// Wide-precision fraction bits used inside trig.
const WIDE_BITS: u32 = 56;
/// 2π at scale 2⁵⁶ (rounded to nearest).
const TAU_WIDE: i128 = 452_751_216_129_820_178;
/// π at scale 2⁵⁶.
const PI_WIDE: i128 = 226_375_608_064_910_089;
/// π/2 at scale 2⁵⁶.
const FRAC_PI_2_WIDE: i128 = 113_187_804_032_455_044;

/// A deterministic fixed-point number (I48F16). See the module docs for its rules.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Fx(i64);

impl Fx {
    pub const ZERO: Fx = Fx(0);
    pub const ONE: Fx = Fx(1 << FRAC_BITS);
    pub const HALF: Fx = Fx(1 << (FRAC_BITS - 1));
    pub const TWO: Fx = Fx(2 << FRAC_BITS);
    /// The smallest positive value, 2⁻¹⁶.
    pub const DELTA: Fx = Fx(1);
    pub const MAX: Fx = Fx(i64::MAX);
    pub const MIN: Fx = Fx(i64::MIN);
    /// π rounded to nearest.
    pub const PI: Fx = Fx(205_887);
    /// 2π rounded to nearest.
    pub const TAU: Fx = Fx(411_775);
    /// π/2 rounded to nearest.
    pub const FRAC_PI_2: Fx = Fx(102_944);

    /// From raw bits (value = bits / 2¹⁶).
    pub const fn from_bits(bits: i64) -> Fx {
        Fx(bits)
    }

    /// The raw bits (value = bits / 2¹⁶).
    pub const fn to_bits(self) -> i64 {
        self.0
    }

    /// From an integer, saturating at the range (±2⁴⁷).
    pub const fn from_int(n: i64) -> Fx {
        Fx(saturate(n as i128 * (1 << FRAC_BITS)))
    }

    /// `num / den` rounded toward zero; `den == 0` saturates like division.
    pub const fn from_ratio(num: i64, den: i64) -> Fx {
        Fx::from_int(num).div_sat(Fx::from_int(den))
    }

    /// The integer part, rounded toward negative infinity.
    pub const fn floor_int(self) -> i64 {
        self.0 >> FRAC_BITS
    }

    /// The nearest integer (halves away from zero).
    pub const fn round_int(self) -> i64 {
        let half = 1i128 << (FRAC_BITS - 1);
        let b = self.0 as i128;
        let r = if b >= 0 { (b + half) >> FRAC_BITS } else { -((-b + half) >> FRAC_BITS) };
        r as i64
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// Absolute value, saturating (`|MIN| = MAX`).
    pub const fn abs(self) -> Fx {
        Fx(self.0.saturating_abs())
    }

    pub const fn signum(self) -> Fx {
        Fx::from_int(self.0.signum())
    }

    pub fn min(self, other: Fx) -> Fx {
        Ord::min(self, other)
    }

    pub fn max(self, other: Fx) -> Fx {
        Ord::max(self, other)
    }

    pub fn clamp(self, lo: Fx, hi: Fx) -> Fx {
        Ord::clamp(self, lo, hi)
    }

    pub const fn checked_add(self, rhs: Fx) -> Option<Fx> {
        match self.0.checked_add(rhs.0) {
            Some(b) => Some(Fx(b)),
            None => None,
        }
    }

    pub const fn checked_sub(self, rhs: Fx) -> Option<Fx> {
        match self.0.checked_sub(rhs.0) {
            Some(b) => Some(Fx(b)),
            None => None,
        }
    }

    /// Product, or `None` when it does not fit.
    pub const fn checked_mul(self, rhs: Fx) -> Option<Fx> {
        let wide = (self.0 as i128 * rhs.0 as i128) >> FRAC_BITS;
        if wide > i64::MAX as i128 || wide < i64::MIN as i128 { None } else { Some(Fx(wide as i64)) }
    }

    /// Quotient, or `None` on division by zero or when it does not fit.
    pub const fn checked_div(self, rhs: Fx) -> Option<Fx> {
        if rhs.0 == 0 {
            return None;
        }
        let wide = ((self.0 as i128) << FRAC_BITS) / rhs.0 as i128;
        if wide > i64::MAX as i128 || wide < i64::MIN as i128 { None } else { Some(Fx(wide as i64)) }
    }

    pub const fn add_sat(self, rhs: Fx) -> Fx {
        Fx(self.0.saturating_add(rhs.0))
    }

    pub const fn sub_sat(self, rhs: Fx) -> Fx {
        Fx(self.0.saturating_sub(rhs.0))
    }

    pub const fn mul_sat(self, rhs: Fx) -> Fx {
        Fx(saturate((self.0 as i128 * rhs.0 as i128) >> FRAC_BITS))
    }

    /// Saturating division; `x / 0` is `MAX` or `MIN` by the sign of `x`, and `0 / 0 = 0`.
    pub const fn div_sat(self, rhs: Fx) -> Fx {
        if rhs.0 == 0 {
            return if self.0 > 0 {
                Fx::MAX
            } else if self.0 < 0 {
                Fx::MIN
            } else {
                Fx::ZERO
            };
        }
        Fx(saturate(((self.0 as i128) << FRAC_BITS) / rhs.0 as i128))
    }

    /// The floor of the exact square root; `None` for negative values.
    pub fn checked_sqrt(self) -> Option<Fx> {
        if self.0 < 0 {
            return None;
        }
        // sqrt(b / 2^16) = sqrt(b * 2^16) / 2^16
        let r = ((self.0 as u128) << FRAC_BITS).isqrt();
        Some(Fx(r as i64))
    }

    /// The floor of the exact square root; negative values give zero.
    pub fn sqrt(self) -> Fx {
        self.checked_sqrt().unwrap_or(Fx::ZERO)
    }

    /// Sine and cosine of an angle in radians, max error 1 ULP (see module docs).
    pub fn sin_cos(self) -> (Fx, Fx) {
        // Reduce to [-π, π) at scale 2^56 so cordic's own reduction loops never run long.
        let wide = (self.0 as i128) << (WIDE_BITS - FRAC_BITS);
        let reduced = (wide + PI_WIDE).rem_euclid(TAU_WIDE) - PI_WIDE;
        let angle = I8F56::from_bits(reduced as i64);
        let (s, c) = cordic::sin_cos(angle);
        (from_wide(s.to_bits() as i128), from_wide(c.to_bits() as i128))
    }

    pub fn sin(self) -> Fx {
        self.sin_cos().0
    }

    pub fn cos(self) -> Fx {
        self.sin_cos().1
    }

    /// The angle of the point `(x, y)` in (-π, π]; `atan2(0, 0) = 0`. Max error 1 ULP.
    pub fn atan2(y: Fx, x: Fx) -> Fx {
        if x.0 == 0 && y.0 == 0 {
            return Fx::ZERO;
        }
        let ax = (x.0 as i128).abs();
        let ay = (y.0 as i128).abs();
        // Octant reduction: the ratio handed to CORDIC is always in [0, 1], computed exactly.
        let first_octant = if ay <= ax {
            atan_unit((ay << WIDE_BITS) / ax)
        } else {
            FRAC_PI_2_WIDE - atan_unit((ax << WIDE_BITS) / ay)
        };
        let half_plane = if x.0 < 0 { PI_WIDE - first_octant } else { first_octant };
        let signed = if y.0 < 0 { -half_plane } else { half_plane };
        from_wide(signed)
    }
}

/// atan of a ratio in [0, 1] at scale 2^56, result at scale 2^56.
fn atan_unit(ratio_wide: i128) -> i128 {
    debug_assert!((0..=1i128 << WIDE_BITS).contains(&ratio_wide));
    cordic::atan(I8F56::from_bits(ratio_wide as i64)).to_bits() as i128
}

/// Round a scale-2^56 value to the nearest `Fx` (halves away from zero).
fn from_wide(wide: i128) -> Fx {
    let shift = WIDE_BITS - FRAC_BITS;
    let half = 1i128 << (shift - 1);
    let r = if wide >= 0 { (wide + half) >> shift } else { -((-wide + half) >> shift) };
    Fx(saturate(r))
}

const fn saturate(v: i128) -> i64 {
    if v > i64::MAX as i128 {
        i64::MAX
    } else if v < i64::MIN as i128 {
        i64::MIN
    } else {
        v as i64
    }
}

impl Add for Fx {
    type Output = Fx;
    fn add(self, rhs: Fx) -> Fx {
        self.add_sat(rhs)
    }
}

impl Sub for Fx {
    type Output = Fx;
    fn sub(self, rhs: Fx) -> Fx {
        self.sub_sat(rhs)
    }
}

impl Mul for Fx {
    type Output = Fx;
    fn mul(self, rhs: Fx) -> Fx {
        self.mul_sat(rhs)
    }
}

impl Div for Fx {
    type Output = Fx;
    fn div(self, rhs: Fx) -> Fx {
        self.div_sat(rhs)
    }
}

impl Neg for Fx {
    type Output = Fx;
    fn neg(self) -> Fx {
        Fx(self.0.saturating_neg())
    }
}

impl AddAssign for Fx {
    fn add_assign(&mut self, rhs: Fx) {
        *self = *self + rhs;
    }
}

impl SubAssign for Fx {
    fn sub_assign(&mut self, rhs: Fx) {
        *self = *self - rhs;
    }
}

impl fmt::Display for Fx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&I48F16::from_bits(self.0), f)
    }
}

impl fmt::Debug for Fx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fx({self})")
    }
}

/// Error parsing decimal text into an `Fx`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a fixed-point number in range: {text:?}")]
pub struct ParseFxError {
    pub text: String,
}

impl FromStr for Fx {
    type Err = ParseFxError;
    /// Decimal text such as `-12.375`, rounded to the nearest `Fx`.
    fn from_str(s: &str) -> Result<Fx, ParseFxError> {
        I48F16::from_str(s.trim())
            .map(|v| Fx(v.to_bits()))
            .map_err(|_| ParseFxError { text: s.chars().take(64).collect() })
    }
}

impl Serialize for Fx {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(self.0)
    }
}

impl<'de> Deserialize<'de> for Fx {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fx, D::Error> {
        i64::deserialize(d).map(Fx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fx(s: &str) -> Fx {
        s.parse().unwrap()
    }

    #[test]
    fn arithmetic_saturates_instead_of_wrapping() {
        assert_eq!(Fx::MAX + Fx::ONE, Fx::MAX);
        assert_eq!(Fx::MIN - Fx::ONE, Fx::MIN);
        assert_eq!(Fx::MAX * Fx::TWO, Fx::MAX);
        assert_eq!(Fx::MIN * Fx::TWO, Fx::MIN);
        assert_eq!(-Fx::MIN, Fx::MAX);
        assert_eq!(Fx::ONE / Fx::ZERO, Fx::MAX);
        assert_eq!(-Fx::ONE / Fx::ZERO, Fx::MIN);
        assert_eq!(Fx::ZERO / Fx::ZERO, Fx::ZERO);
        assert_eq!(Fx::MAX.checked_mul(Fx::TWO), None);
        assert_eq!(Fx::ONE.checked_div(Fx::ZERO), None);
        assert_eq!(Fx::MAX.checked_add(Fx::DELTA), None);
    }

    #[test]
    fn arithmetic_is_exact_where_representable() {
        assert_eq!(fx("1.5") * fx("2.25"), fx("3.375"));
        assert_eq!(fx("-7.5") / fx("2.5"), fx("-3"));
        assert_eq!(fx("0.25") + fx("0.5"), fx("0.75"));
        assert_eq!(Fx::from_ratio(1, 4), fx("0.25"));
        assert_eq!(Fx::from_int(3).floor_int(), 3);
        assert_eq!(fx("-2.5").floor_int(), -3);
        assert_eq!(fx("-2.5").round_int(), -3);
        assert_eq!(fx("2.49").round_int(), 2);
    }

    #[test]
    fn sqrt_is_the_exact_floor() {
        assert_eq!(Fx::from_int(9).sqrt(), Fx::from_int(3));
        assert_eq!(fx("2.25").sqrt(), fx("1.5"));
        assert_eq!(Fx::from_int(-4).checked_sqrt(), None);
        let r = Fx::TWO.sqrt();
        assert!(r * r <= Fx::TWO);
        // Exactly: r² ≤ 2 < (r + δ)², in integers at scale 2^32.
        let (b, two) = (r.to_bits() as i128, 2i128 << 32);
        assert!(b * b <= two && (b + 1) * (b + 1) > two);
        // The whole range works without overflow.
        assert!(Fx::MAX.sqrt() > Fx::from_int(11_000_000));
    }

    #[test]
    fn trig_at_known_points() {
        assert_eq!(Fx::ZERO.sin_cos(), (Fx::ZERO, Fx::ONE));
        let (s, c) = Fx::FRAC_PI_2.sin_cos();
        assert!((s - Fx::ONE).abs() <= Fx::DELTA, "{s}");
        assert!(c.abs() <= Fx::DELTA, "{c}");
        assert_eq!(Fx::atan2(Fx::ZERO, Fx::ZERO), Fx::ZERO);
        assert_eq!(Fx::atan2(Fx::ONE, Fx::ZERO), Fx::FRAC_PI_2);
        assert_eq!(Fx::atan2(Fx::ZERO, -Fx::ONE), Fx::PI);
        assert_eq!(Fx::atan2(-Fx::ONE, Fx::ZERO), -Fx::FRAC_PI_2);
        // Huge inputs neither loop nor overflow.
        let _ = Fx::MAX.sin_cos();
        let _ = Fx::MIN.sin_cos();
        assert_eq!(Fx::atan2(Fx::MAX, Fx::DELTA), Fx::FRAC_PI_2);
    }

    #[test]
    fn parse_and_display_round_trip() {
        for s in ["0", "1.5", "-12.375", "140737488355327"] {
            assert_eq!(fx(s).to_string(), s);
        }
        assert_eq!(fx("1e2"), Fx::from_int(100));
        assert!("one".parse::<Fx>().is_err());
        assert!("999999999999999999".parse::<Fx>().is_err());
    }
}
