//! Typed ids: a newtype for every index and id, fixed-width on the wire.

use core::fmt;

use serde::{Deserialize, Serialize};

/// A step of a sim.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Tick(pub u64);

impl Tick {
    pub const ZERO: Tick = Tick(0);
    pub const fn next(self) -> Tick {
        Tick(self.0 + 1)
    }
    /// `n` ticks earlier, or tick 0.
    pub const fn saturating_sub(self, n: u64) -> Tick {
        Tick(self.0.saturating_sub(n))
    }
    /// `n` ticks earlier, if that is a tick.
    pub const fn checked_sub(self, n: u64) -> Option<Tick> {
        match self.0.checked_sub(n) {
            Some(t) => Some(Tick(t)),
            None => None,
        }
    }
    /// The ticks from `earlier` to this one (0 if `earlier` is later).
    pub const fn since(self, earlier: Tick) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// `n` ticks later.
impl core::ops::Add<u64> for Tick {
    type Output = Tick;
    fn add(self, n: u64) -> Tick {
        Tick(self.0 + n)
    }
}

impl fmt::Debug for Tick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tick({})", self.0)
    }
}

impl fmt::Display for Tick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A sim (one region and its replicated state machine).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Debug, Serialize, Deserialize)]
pub struct SimId(pub u32);

impl fmt::Display for SimId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sim-{}", self.0)
    }
}

/// An object: a generational index. The low 32 bits are the generation, the high 32 bits the
/// slot, so ids order by slot and a slot's reuse never aliases an old id. The slot is the
/// object's leaf in the objects Merkle tree.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectId(pub u64);

impl ObjectId {
    pub const fn new(slot: u32, generation: u32) -> ObjectId {
        ObjectId(((slot as u64) << 32) | generation as u64)
    }
    pub const fn slot(self) -> u32 {
        (self.0 >> 32) as u32
    }
    pub const fn generation(self) -> u32 {
        self.0 as u32
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({}v{})", self.slot(), self.generation())
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}v{}", self.slot(), self.generation())
    }
}

/// Thirty-two bytes as four big-endian words: compared, they order as the bytes do.
#[inline]
fn words(b: &[u8; 32]) -> [u64; 4] {
    let w = |i: usize| u64::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3], b[i + 4], b[i + 5], b[i + 6], b[i + 7]]);
    [w(0), w(8), w(16), w(24)]
}

macro_rules! hash_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
        pub struct $name(pub [u8; 32]);

        /// The bytes' lexicographic order, compared as four big-endian words (the same order:
        /// maps keyed by these ids iterate as before). The derived order called `memcmp` for
        /// every comparison, 7 % of a tick of 10,000 scripts (the owners' budgets).
        impl Ord for $name {
            fn cmp(&self, other: &Self) -> std::cmp::Ordering {
                words(&self.0).cmp(&words(&other.0))
            }
        }

        impl PartialOrd for $name {
            fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
                Some(self.cmp(other))
            }
        }

        impl $name {
            pub const fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }
            /// The first 8 hex digits, for logs.
            pub fn short(&self) -> String {
                hex(&self.0[..4])
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.short())
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&hex(&self.0))
            }
        }
    };
}

hash_id!(
    /// An account: an ed25519 public key.
    AccountId
);
hash_id!(
    /// An event: blake3 of its domain-separated body encoding.
    EventId
);
hash_id!(
    /// A script version: blake3 of its source, licence, author and provenance.
    ScriptId
);
hash_id!(
    /// A 32-byte blake3 digest (state roots, subsystem roots, seeds).
    Hash32
);

/// A `Hasher` for maps keyed by a digest id (`ScriptId`, `EventId`, ...): the first eight bytes
/// of a blake3 digest are already a good hash. For caches only: such maps are never iterated
/// in sim state (DESIGN §5).
#[derive(Clone, Copy, Default, Debug)]
pub struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for (i, b) in bytes.iter().take(8).enumerate() {
            self.0 ^= u64::from(*b) << (8 * i);
        }
    }
}

/// Lower-case hex of some bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_ids_order_by_slot_then_generation() {
        let a = ObjectId::new(1, 9);
        let b = ObjectId::new(2, 0);
        assert!(a < b);
        assert_eq!(a.slot(), 1);
        assert_eq!(a.generation(), 9);
        assert_eq!(a.to_string(), "1v9");
    }

    #[test]
    fn digest_ids_order_as_their_bytes_do() {
        let mut rng = crate::rng::DetRng::from_u64(3);
        let mut ids: Vec<[u8; 32]> = Vec::new();
        for i in 0..3_000u64 {
            let mut b = [0u8; 32];
            for x in b.iter_mut() {
                // Few distinct byte values, so long shared prefixes and equal ids are common.
                *x = (rng.next_u64() % 3) as u8 * 127;
            }
            if i % 7 == 0 {
                b = ids.last().copied().unwrap_or(b);
            }
            ids.push(b);
        }
        for pair in ids.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert_eq!(AccountId(a).cmp(&AccountId(b)), a.cmp(&b), "{a:?} {b:?}");
            assert_eq!(Hash32(a).partial_cmp(&Hash32(b)), Some(a.cmp(&b)));
        }
    }

    #[test]
    fn hex_prints_all_bytes() {
        assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
        assert_eq!(Hash32([0x12; 32]).short(), "12121212");
    }
}
