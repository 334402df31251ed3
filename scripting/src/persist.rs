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
    let v: Value = postcard::from_bytes(bytes).map_err(|e| format!("state does not decode: {e}"))?;
    match from_value(v).try_cast::<Map>() {
        Some(m) => Ok(m),
        None => Err("state is not a map".into()),
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
    }
}
