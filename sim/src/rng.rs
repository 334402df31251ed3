//! A deterministic RNG: blake3's extendable output from a seed. Used for seeded worlds and
//! per-script randomness; never an OS source (DESIGN §5).

use crate::ids::Hash32;

/// A seeded stream of random numbers, the same on every machine.
#[derive(Clone)]
pub struct DetRng {
    reader: blake3::OutputReader,
}

impl core::fmt::Debug for DetRng {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("DetRng")
    }
}

impl DetRng {
    pub fn from_seed(seed: Hash32) -> DetRng {
        let mut h = blake3::Hasher::new_keyed(&crate::merkle::keys::RNG);
        h.update(&seed.0);
        DetRng { reader: h.finalize_xof() }
    }

    pub fn from_u64(seed: u64) -> DetRng {
        let mut s = [0u8; 32];
        s[..8].copy_from_slice(&seed.to_le_bytes());
        DetRng::from_seed(Hash32(s))
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.reader.fill(&mut b);
        u64::from_le_bytes(b)
    }

    pub fn bytes32(&mut self) -> [u8; 32] {
        let mut b = [0u8; 32];
        self.reader.fill(&mut b);
        b
    }

    /// Uniform in `0..n` (`n > 0`), without modulo bias (Lemire's method, exact by rejection).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range_i64(&mut self, lo: i64, hi: i64) -> i64 {
        assert!(lo <= hi);
        let span = (hi as i128 - lo as i128 + 1) as u128;
        if span > u128::from(u64::MAX) {
            return self.next_u64() as i64;
        }
        (lo as i128 + self.below(span as u64) as i128) as i64
    }

    /// `true` with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_different_seed_different_stream() {
        let a: Vec<u64> = (0..8)
            .map({
                let mut r = DetRng::from_u64(1);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..8)
            .map({
                let mut r = DetRng::from_u64(1);
                move |_| r.next_u64()
            })
            .collect();
        let c: Vec<u64> = (0..8)
            .map({
                let mut r = DetRng::from_u64(2);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = DetRng::from_u64(9);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let v = r.below(7);
            assert!(v < 7);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        for _ in 0..100 {
            let v = r.range_i64(-3, 3);
            assert!((-3..=3).contains(&v));
        }
    }
}
