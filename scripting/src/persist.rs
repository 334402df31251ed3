//! A script's persisted state (`this` in handlers): a map of plain values, encoded
//! deterministically (maps are ordered) and bounded on decode.

use rhai::{Array, Dynamic, INT, ImmutableString, Map};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};

/// The values a script may keep between events.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
enum Value {
    Unit,
    Bool(bool),
    Int(INT),
    /// `Decimal::serialize()`: 16 bytes, exact.
    Dec([u8; 16]),
    Str(String),
    Char(char),
    Array(Vec<Value>),
    /// Sorted by key (rhai maps are `BTreeMap`s).
    Map(Vec<(String, Value)>),
}

/// Nesting limit for persisted values.
const MAX_DEPTH: u32 = 32;

fn to_value(d: &Dynamic, depth: u32) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err("state is nested too deeply".into());
    }
    if d.is_unit() {
        return Ok(Value::Unit);
    }
    if let Ok(b) = d.as_bool() {
        return Ok(Value::Bool(b));
    }
    if let Ok(i) = d.as_int() {
        return Ok(Value::Int(i));
    }
    if let Ok(c) = d.as_char() {
        return Ok(Value::Char(c));
    }
    if let Some(x) = d.clone().try_cast::<Decimal>() {
        return Ok(Value::Dec(x.serialize()));
    }
    if let Some(s) = d.clone().try_cast::<ImmutableString>() {
        return Ok(Value::Str(s.to_string()));
    }
    if let Some(a) = d.clone().try_cast::<Array>() {
        return a.iter().map(|v| to_value(v, depth + 1)).collect::<Result<_, _>>().map(Value::Array);
    }
    if let Some(m) = d.clone().try_cast::<Map>() {
        return m
            .iter()
            .map(|(k, v)| to_value(v, depth + 1).map(|v| (k.to_string(), v)))
            .collect::<Result<_, _>>()
            .map(Value::Map);
    }
    Err(format!("a {} cannot be kept in the script's state", d.type_name()))
}

fn from_value(v: Value) -> Dynamic {
    match v {
        Value::Unit => Dynamic::UNIT,
        Value::Bool(b) => b.into(),
        Value::Int(i) => i.into(),
        Value::Dec(b) => Dynamic::from(Decimal::deserialize(b)),
        Value::Str(s) => s.into(),
        Value::Char(c) => c.into(),
        Value::Array(a) => Dynamic::from_array(a.into_iter().map(from_value).collect()),
        Value::Map(m) => Dynamic::from_map(m.into_iter().map(|(k, v)| (k.into(), from_value(v))).collect()),
    }
}

/// Encode the state map; empty state encodes to no bytes.
pub fn encode(state: &Map) -> Result<Vec<u8>, String> {
    if state.is_empty() {
        return Ok(Vec::new());
    }
    let v =
        Value::Map(state.iter().map(|(k, v)| to_value(v, 1).map(|v| (k.to_string(), v))).collect::<Result<_, _>>()?);
    postcard::to_allocvec(&v).map_err(|e| e.to_string())
}

/// Decode a state map (bytes come from world state, which peers may have sent).
pub fn decode(bytes: &[u8], max_bytes: usize) -> Result<Map, String> {
    if bytes.is_empty() {
        return Ok(Map::new());
    }
    if bytes.len() > max_bytes {
        return Err(format!("state is {} bytes, the limit is {max_bytes}", bytes.len()));
    }
    // Depth-bounded like encoding: a derived decoder would recurse as deep as the bytes say
    // (5,500 nested arrays in 11 KB overflowed the stack).
    let mut de = postcard::Deserializer::from_bytes(bytes);
    let v = serde::de::DeserializeSeed::deserialize(ValueSeed(0), &mut de)
        .map_err(|e| format!("state does not decode: {e}"))?;
    if !de.finalize().map_err(|e| format!("state does not decode: {e}"))?.is_empty() {
        return Err("state has trailing bytes".into());
    }
    match from_value(v).try_cast::<Map>() {
        Some(m) => Ok(m),
        None => Err("state is not a map".into()),
    }
}

/// Decodes a [`Value`] as its derived `Deserialize` would, refusing nesting past [`MAX_DEPTH`].
struct ValueSeed(u32);

impl<'de> serde::de::DeserializeSeed<'de> for ValueSeed {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.0 > MAX_DEPTH {
            return Err(serde::de::Error::custom("state is nested too deeply"));
        }
        const VARIANTS: &[&str] = &["Unit", "Bool", "Int", "Dec", "Str", "Char", "Array", "Map"];
        d.deserialize_enum("Value", VARIANTS, self)
    }
}

impl<'de> serde::de::Visitor<'de> for ValueSeed {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a script state value")
    }
    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<Value, A::Error> {
        use serde::de::VariantAccess;
        let (index, v): (u32, _) = data.variant()?;
        Ok(match index {
            0 => v.unit_variant().map(|()| Value::Unit)?,
            1 => Value::Bool(v.newtype_variant()?),
            2 => Value::Int(v.newtype_variant()?),
            3 => Value::Dec(v.newtype_variant()?),
            4 => Value::Str(v.newtype_variant()?),
            5 => Value::Char(v.newtype_variant()?),
            6 => Value::Array(v.newtype_variant_seed(Nested { depth: self.0 + 1, pairs: false })?.0),
            7 => Value::Map(v.newtype_variant_seed(Nested { depth: self.0 + 1, pairs: true })?.1),
            n => return Err(serde::de::Error::custom(format!("no state value kind {n}"))),
        })
    }
}

/// An array's values, or a map's (key, value) pairs, one level deeper.
struct Nested {
    depth: u32,
    pairs: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for Nested {
    type Value = (Vec<Value>, Vec<(String, Value)>);
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Nested {
    type Value = (Vec<Value>, Vec<(String, Value)>);
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a sequence of state values")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let (mut values, mut pairs) = (Vec::new(), Vec::new());
        if self.pairs {
            while let Some(p) = seq.next_element_seed(Pair(self.depth))? {
                pairs.push(p);
            }
        } else {
            while let Some(v) = seq.next_element_seed(ValueSeed(self.depth))? {
                values.push(v);
            }
        }
        Ok((values, pairs))
    }
}

/// A map entry: its key, and its value at the map's depth.
struct Pair(u32);

impl<'de> serde::de::DeserializeSeed<'de> for Pair {
    type Value = (String, Value);
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_tuple(2, self)
    }
}

impl<'de> serde::de::Visitor<'de> for Pair {
    type Value = (String, Value);
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key and a state value")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let key: String = seq.next_element()?.ok_or_else(|| serde::de::Error::invalid_length(0, &self))?;
        let value =
            seq.next_element_seed(ValueSeed(self.0))?.ok_or_else(|| serde::de::Error::invalid_length(1, &self))?;
        Ok((key, value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_plain_values() {
        let mut m = Map::new();
        m.insert("n".into(), 42i64.into());
        m.insert("d".into(), Dynamic::from(Decimal::new(15, 1)));
        m.insert("s".into(), "hi".into());
        m.insert("a".into(), Dynamic::from_array(vec![1i64.into(), true.into(), 'c'.into()]));
        let bytes = encode(&m).unwrap();
        let back = decode(&bytes, 1 << 20).unwrap();
        assert_eq!(encode(&back).unwrap(), bytes);
        assert_eq!(back["n"].as_int().unwrap(), 42);
        assert!(decode(&bytes[..bytes.len() - 1], 1 << 20).is_err());
        assert!(decode(&bytes, 2).is_err());
        // The bounded decoder reads what the derived encoder writes, nested maps included.
        let mut inner = Map::new();
        inner.insert("x".into(), Dynamic::from_array(vec![Dynamic::UNIT, "y".into()]));
        let mut m = Map::new();
        m.insert("m".into(), Dynamic::from_map(inner));
        let bytes = encode(&m).unwrap();
        assert_eq!(postcard::from_bytes::<Value>(&bytes).unwrap(), to_value(&Dynamic::from_map(m.clone()), 1).unwrap());
        assert_eq!(encode(&decode(&bytes, 1 << 20).unwrap()).unwrap(), bytes);
    }

    /// 5,500 nested arrays in 11 KB once overflowed the stack on decode; now they are refused
    /// at the depth encoding refuses.
    #[test]
    fn deeply_nested_state_is_refused_not_a_stack_overflow() {
        let mut bytes = vec![7, 1, 1, b'a']; // Map, 1 entry, key "a"
        for _ in 0..5_500 {
            bytes.extend_from_slice(&[6, 1]); // Array of 1
        }
        bytes.push(0); // Unit
        let e = decode(&bytes, 1 << 20).unwrap_err();
        // (postcard keeps no custom message: "does not decode" is what reaches the owner.)
        assert!(e.contains("does not decode"), "{e}");
        // Nesting within the limit decodes.
        let mut ok = vec![7, 1, 1, b'a'];
        for _ in 0..(MAX_DEPTH - 1) {
            ok.extend_from_slice(&[6, 1]);
        }
        ok.push(0);
        assert!(decode(&ok, 1 << 20).is_ok());
    }
}
