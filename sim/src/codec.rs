//! Bounded postcard encoding for everything that crosses a trust boundary.
//!
//! Decoding untrusted bytes is bounded three ways: the input length is capped before any work;
//! postcard reads every length prefix against the bytes actually present, so a claimed length
//! cannot make it allocate more than the input; and trailing bytes are an error, so every value
//! has exactly one accepted encoding length. Callers then validate semantic limits.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Why bytes did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("input is {len} bytes, the limit is {max}")]
    TooLarge { len: u64, max: u32 },
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    #[error("{extra} trailing bytes after the {what}")]
    Trailing { what: &'static str, extra: u64 },
}

/// Encode a value (infallible for our types: they contain no maps with non-string keys
/// that postcard rejects, and a `Vec` sink cannot fail).
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("postcard encoding into a Vec cannot fail")
}

/// Decode a value from at most `max_bytes` untrusted bytes.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], max_bytes: u32) -> Result<T, DecodeError> {
    let what = short_type_name::<T>();
    if bytes.len() as u64 > u64::from(max_bytes) {
        return Err(DecodeError::TooLarge { len: bytes.len() as u64, max: max_bytes });
    }
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|e| DecodeError::Malformed { what, reason: e.to_string() })?;
    if !rest.is_empty() {
        return Err(DecodeError::Trailing { what, extra: rest.len() as u64 });
    }
    Ok(value)
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_oversized_truncated_and_trailing_input() {
        let bytes = encode(&(1u32, String::from("hello")));
        assert_eq!(decode::<(u32, String)>(&bytes, 64), Ok((1, "hello".into())));
        assert!(matches!(decode::<(u32, String)>(&bytes, 3), Err(DecodeError::TooLarge { .. })));
        assert!(matches!(decode::<(u32, String)>(&bytes[..4], 64), Err(DecodeError::Malformed { .. })));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(decode::<(u32, String)>(&longer, 64), Err(DecodeError::Trailing { extra: 1, .. })));
    }

    #[test]
    fn a_huge_claimed_length_does_not_allocate() {
        // A Vec<u64> claiming 2^60 elements, followed by nothing.
        let mut bytes = Vec::new();
        let mut n: u64 = 1 << 60;
        while n >= 0x80 {
            bytes.push((n as u8) | 0x80);
            n >>= 7;
        }
        bytes.push(n as u8);
        assert!(decode::<Vec<u64>>(&bytes, 1024).is_err());
    }
}
