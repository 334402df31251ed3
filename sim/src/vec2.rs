//! `Vec2`: a 2-D vector of [`Fx`], with exact length and normalisation.

use core::ops::{Add, AddAssign, Neg, Sub, SubAssign};

use serde::{Deserialize, Serialize};

use crate::fx::{FRAC_BITS, Fx};

/// A point or displacement in the world plane, in metres.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug, Serialize, Deserialize)]
pub struct Vec2 {
    pub x: Fx,
    pub y: Fx,
}

impl Vec2 {
    pub const ZERO: Vec2 = Vec2 { x: Fx::ZERO, y: Fx::ZERO };

    pub const fn new(x: Fx, y: Fx) -> Vec2 {
        Vec2 { x, y }
    }

    /// From whole metres.
    pub const fn from_ints(x: i64, y: i64) -> Vec2 {
        Vec2 { x: Fx::from_int(x), y: Fx::from_int(y) }
    }

    /// The unit vector at `angle` radians.
    pub fn from_angle(angle: Fx) -> Vec2 {
        let (s, c) = angle.sin_cos();
        Vec2 { x: c, y: s }
    }

    pub fn is_zero(self) -> bool {
        self.x.is_zero() && self.y.is_zero()
    }

    pub fn scale(self, k: Fx) -> Vec2 {
        Vec2 { x: self.x * k, y: self.y * k }
    }

    /// Dot product (saturating).
    pub fn dot(self, o: Vec2) -> Fx {
        self.x * o.x + self.y * o.y
    }

    /// Squared length, computed exactly then saturated.
    pub fn length_squared(self) -> Fx {
        let s = self.wide_len_sq() >> FRAC_BITS;
        Fx::from_bits(s.min(i64::MAX as u128) as i64)
    }

    /// Exact length: the floor of the true Euclidean length of the represented vector,
    /// computed in 128-bit integers, so it never overflows for any pair of `Fx`.
    pub fn length(self) -> Fx {
        let r = self.wide_len_sq().isqrt();
        Fx::from_bits(r.min(i64::MAX as u128) as i64)
    }

    /// Unit vector in the same direction (length within 2 ULP of one); zero stays zero.
    pub fn normalize(self) -> Vec2 {
        let len = self.length();
        if len.is_zero() {
            return Vec2::ZERO;
        }
        Vec2 { x: self.x / len, y: self.y / len }
    }

    /// This vector shortened to at most `max` (direction kept).
    pub fn clamp_length(self, max: Fx) -> Vec2 {
        let len = self.length();
        if len <= max { self } else { self.normalize().scale(max) }
    }

    pub fn distance(self, o: Vec2) -> Fx {
        (self - o).length()
    }

    /// `true` if `o` is within `radius` of this point (exact, no overflow).
    pub fn within(self, o: Vec2, radius: Fx) -> bool {
        let d = (self - o).wide_len_sq();
        let r = radius.abs().to_bits() as u128;
        d <= r * r
    }

    /// Angle of the vector in (-π, π].
    pub fn angle(self) -> Fx {
        Fx::atan2(self.y, self.x)
    }

    /// x² + y² in raw bits at scale 2^32, exact.
    fn wide_len_sq(self) -> u128 {
        let x = (self.x.to_bits() as i128).unsigned_abs();
        let y = (self.y.to_bits() as i128).unsigned_abs();
        // Each square is < 2^126, so the sum fits in u128.
        x * x + y * y
    }
}

impl Add for Vec2 {
    type Output = Vec2;
    fn add(self, o: Vec2) -> Vec2 {
        Vec2 { x: self.x + o.x, y: self.y + o.y }
    }
}

impl Sub for Vec2 {
    type Output = Vec2;
    fn sub(self, o: Vec2) -> Vec2 {
        Vec2 { x: self.x - o.x, y: self.y - o.y }
    }
}

impl Neg for Vec2 {
    type Output = Vec2;
    fn neg(self) -> Vec2 {
        Vec2 { x: -self.x, y: -self.y }
    }
}

impl AddAssign for Vec2 {
    fn add_assign(&mut self, o: Vec2) {
        *self = *self + o;
    }
}

impl SubAssign for Vec2 {
    fn sub_assign(&mut self, o: Vec2) {
        *self = *self - o;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_is_exact_and_never_overflows() {
        assert_eq!(Vec2::from_ints(3, 4).length(), Fx::from_int(5));
        assert_eq!(Vec2::new(Fx::MAX, Fx::MAX).length(), Fx::MAX);
        let big = Vec2::from_ints(100_000_000, 100_000_000);
        assert!(big.length() > Fx::from_int(141_421_356));
        assert!(big.length() < Fx::from_int(141_421_357));
    }

    #[test]
    fn normalize_gives_unit_length() {
        for v in [Vec2::from_ints(3, 4), Vec2::from_ints(-1000, 7), Vec2::new(Fx::DELTA, Fx::ZERO)] {
            let n = v.normalize();
            let err = (n.length() - Fx::ONE).abs();
            assert!(err <= Fx::from_bits(2), "{v:?} -> {n:?}");
        }
        assert_eq!(Vec2::ZERO.normalize(), Vec2::ZERO);
    }

    #[test]
    fn within_is_inclusive() {
        let a = Vec2::from_ints(0, 0);
        assert!(a.within(Vec2::from_ints(6, 8), Fx::from_int(10)));
        assert!(!a.within(Vec2::from_ints(6, 8), Fx::from_int(10) - Fx::DELTA));
    }
}
