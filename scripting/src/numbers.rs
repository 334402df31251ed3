//! Numbers at the script boundary. Scripts have integers (`i64`) and decimals (`1.5` is a
//! `rust_decimal::Decimal`: a 96-bit integer mantissa and a scale, so every operation is
//! integer arithmetic and the same on every machine). The sim's numbers are `Fx` (I48F16).
//! Conversions are exact from `Fx` to decimal (2⁻¹⁶ = 0.0000152587890625 has 16 decimals)
//! and round to nearest from decimal to `Fx`.

use metatopia_sim::{Fx, Vec2};
use rhai::{Dynamic, EvalAltResult, INT, Map};
use rust_decimal::Decimal;

/// 10^16 / 2^16: one Fx unit in units of 10^-16.
const FX_UNIT_E16: i128 = 152_587_890_625;

/// `Fx` to a decimal, exactly (or rounded to fewer decimals for huge magnitudes).
pub fn fx_to_decimal(x: Fx) -> Decimal {
    let scaled = i128::from(x.to_bits()) * FX_UNIT_E16;
    if let Ok(d) = Decimal::try_from_i128_with_scale(scaled, 16) {
        return d.normalize();
    }
    // Beyond 96 bits of mantissa: drop decimals until it fits (|x| > 7.9e12 m).
    let mut v = scaled;
    let mut scale = 16;
    while scale > 0 {
        v /= 10;
        scale -= 1;
        if let Ok(d) = Decimal::try_from_i128_with_scale(v, scale) {
            return d.normalize();
        }
    }
    Decimal::from_i128_with_scale(v.clamp(-(1i128 << 95), 1i128 << 95), 0)
}

/// A decimal to the nearest `Fx` (halves away from zero), saturating.
pub fn decimal_to_fx(d: Decimal) -> Fx {
    let m = d.mantissa(); // < 2^96
    let scale = d.scale();
    let den = 10i128.pow(scale.min(28));
    let num = m << 16; // < 2^112
    let q = num / den;
    let r = num % den;
    let rounded = if 2 * r.abs() >= den { q + num.signum() } else { q };
    Fx::from_bits(rounded.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64)
}

pub type RhaiResult<T> = Result<T, Box<EvalAltResult>>;

fn not_a_number(what: &str, v: &Dynamic) -> Box<EvalAltResult> {
    format!("{what} must be a number, got {}", v.type_name()).into()
}

/// An integer or decimal script value as `Fx`.
pub fn to_fx(what: &str, v: &Dynamic) -> RhaiResult<Fx> {
    if let Ok(i) = v.as_int() {
        return Ok(Fx::from_int(i));
    }
    if let Some(d) = v.clone().try_cast::<Decimal>() {
        return Ok(decimal_to_fx(d));
    }
    Err(not_a_number(what, v))
}

/// An integer script value (decimals are truncated toward zero).
pub fn to_int(what: &str, v: &Dynamic) -> RhaiResult<INT> {
    if let Ok(i) = v.as_int() {
        return Ok(i);
    }
    if let Some(d) = v.clone().try_cast::<Decimal>() {
        return Ok(decimal_to_fx(d).to_bits() >> 16);
    }
    Err(not_a_number(what, v))
}

pub fn fx_dyn(x: Fx) -> Dynamic {
    Dynamic::from(fx_to_decimal(x))
}

/// `#{x, y}` with decimal coordinates.
pub fn vec_map(v: Vec2) -> Map {
    let mut m = Map::new();
    m.insert("x".into(), fx_dyn(v.x));
    m.insert("y".into(), fx_dyn(v.y));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fx_decimal_round_trip_is_exact() {
        for bits in [0i64, 1, -1, 65_536, 98_304, -3_276_800, i64::from(i32::MAX), 1 << 40] {
            let x = Fx::from_bits(bits);
            assert_eq!(decimal_to_fx(fx_to_decimal(x)), x, "bits {bits}");
        }
        assert_eq!(fx_to_decimal(Fx::from_bits(98_304)).to_string(), "1.5");
        assert_eq!(decimal_to_fx(Decimal::new(15, 1)), "1.5".parse::<Fx>().unwrap());
        // 0.1 is not representable in Fx: it rounds to the nearest 2^-16.
        assert_eq!(decimal_to_fx(Decimal::new(1, 1)).to_bits(), 6_554);
        // Huge values saturate instead of wrapping.
        assert_eq!(decimal_to_fx(Decimal::MAX), Fx::MAX);
        assert_eq!(decimal_to_fx(Decimal::MIN), Fx::MIN);
        let _ = fx_to_decimal(Fx::MAX);
    }
}
