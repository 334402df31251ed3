//! ed25519 strict verification, the same verdicts as `ed25519_dalek::VerifyingKey::verify_strict`,
//! in two thirds of the time for a key seen again and again (a validator checks the same few
//! keys' votes every tick).
//!
//! `verify_strict(A, M, (R, s))` accepts exactly when
//! 1. `s` is a canonical scalar (below ℓ),
//! 2. `R` decompresses to a point, and neither `R` nor `A` is of small order,
//! 3. `compress([k](−A) + [s]B) == R`, with `k = SHA-512(R ‖ A ‖ M) mod ℓ`.
//!
//! The library computes (3) with a variable-time double-base multiplication, whose 253
//! doublings are most of its cost (27 of its 38 µs here), and decompresses `R` only for the
//! small-order check of (2). Here:
//! - `[s]B` and `[k](−A)` come from fixed-base tables (`B`'s, built into the curve crate, and one
//!   table of `−A` kept per key): 64 additions each and no doublings, ~10 µs each. It is the
//!   same group element, so the same encoding.
//! - `R` is not decompressed. If `compress(R') == R` for the point `R'` computed in (3), then
//!   `R` is the canonical encoding of `R'`, so it decompresses, to `R'`, and `R` is of small
//!   order exactly when `R'` is; if the encodings differ, `verify_strict` rejects too (at the
//!   decompression, or at the final comparison). So checking `R'` instead of `R` changes no
//!   verdict.
//! - Whether `A` is of small order is decided once, with its table.
//!
//! The equivalence is tested against the library on valid signatures, tampered ones, keys and
//! nonces with torsion components, small-order points and non-canonical encodings.

use curve25519_dalek::constants::ED25519_BASEPOINT_TABLE;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsBasepointTable};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::BasepointTable;
use ed25519_dalek::VerifyingKey;
use sha2::{Digest as _, Sha512};

/// What checking a key's signatures needs: its encoding, a table of the multiples of `−A`, and
/// whether `A` is of small order (then nothing verifies).
pub struct KeyTable {
    compressed: [u8; 32],
    minus_a: Option<Box<EdwardsBasepointTable>>,
}

impl std::fmt::Debug for KeyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyTable").field("weak", &self.minus_a.is_none()).finish()
    }
}

impl KeyTable {
    /// About 40 µs: 256 points of the table.
    pub fn new(key: &VerifyingKey) -> KeyTable {
        let compressed = key.to_bytes();
        let minus_a = CompressedEdwardsY(compressed)
            .decompress()
            .filter(|a| !a.is_small_order())
            .map(|a| Box::new(EdwardsBasepointTable::create(&-a)));
        KeyTable { compressed, minus_a }
    }

    /// `verify_strict(message, (r, s))` of this key.
    pub fn verify(&self, message: &[u8], r: &[u8; 32], s: &[u8; 32]) -> bool {
        let Some(minus_a) = &self.minus_a else { return false };
        let Some(s) = Option::<Scalar>::from(Scalar::from_canonical_bytes(*s)) else { return false };
        let mut h = Sha512::new();
        h.update(r);
        h.update(self.compressed);
        h.update(message);
        let k = Scalar::from_bytes_mod_order_wide(&h.finalize().into());
        let expected = ED25519_BASEPOINT_TABLE * &s + &**minus_a * &k;
        expected.compress().as_bytes() == r && !expected.is_small_order()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use curve25519_dalek::constants::{ED25519_BASEPOINT_POINT, EIGHT_TORSION};
    use curve25519_dalek::edwards::EdwardsPoint;
    use ed25519_dalek::{Signature, Signer, SigningKey};
    use proptest::prelude::*;

    fn library(key: &VerifyingKey, m: &[u8], r: &[u8; 32], s: &[u8; 32]) -> bool {
        let mut b = [0u8; 64];
        b[..32].copy_from_slice(r);
        b[32..].copy_from_slice(s);
        key.verify_strict(m, &Signature::from_bytes(&b)).is_ok()
    }

    fn agree(key: &VerifyingKey, m: &[u8], r: &[u8; 32], s: &[u8; 32]) -> bool {
        let ours = KeyTable::new(key).verify(m, r, s);
        assert_eq!(ours, library(key, m, r, s), "key {:?} message {m:?} r {r:?} s {s:?}", key.to_bytes());
        ours
    }

    fn split(sig: &Signature) -> ([u8; 32], [u8; 32]) {
        (*sig.r_bytes(), *sig.s_bytes())
    }

    /// k = SHA-512(R ‖ A ‖ M) mod ℓ, as the scheme defines it.
    fn challenge(r: &[u8; 32], a: &[u8; 32], m: &[u8]) -> Scalar {
        let mut h = Sha512::new();
        h.update(r);
        h.update(a);
        h.update(m);
        Scalar::from_bytes_mod_order_wide(&h.finalize().into())
    }

    /// A signature by secret scalar `a` under the public point `big_a` (which may carry a
    /// torsion component `a` knows nothing of), with nonce point `[r]B + t`.
    fn forge(a: Scalar, big_a: EdwardsPoint, r: Scalar, t: EdwardsPoint, m: &[u8]) -> ([u8; 32], [u8; 32]) {
        let big_r = (ED25519_BASEPOINT_POINT * r + t).compress().to_bytes();
        let k = challenge(&big_r, &big_a.compress().to_bytes(), m);
        (big_r, (r + k * a).to_bytes())
    }

    fn scalar(seed: u8) -> Scalar {
        Scalar::from_bytes_mod_order_wide(&[seed; 64])
    }

    #[test]
    fn valid_signatures_verify_and_tampered_ones_do_not() {
        for i in 0..32u8 {
            let key = SigningKey::from_bytes(&[i; 32]);
            let vk = key.verifying_key();
            let m = vec![i; i as usize * 7];
            let (r, s) = split(&key.sign(&m));
            assert!(agree(&vk, &m, &r, &s));
            let mut other = m.clone();
            other.push(1);
            assert!(!agree(&vk, &other, &r, &s));
            let (mut r2, mut s2) = (r, s);
            r2[usize::from(i)] ^= 1 << (i % 8);
            s2[usize::from(i) % 31] ^= 1 << (i % 8);
            assert!(!agree(&vk, &m, &r2, &s));
            assert!(!agree(&vk, &m, &r, &s2));
            // Another key's signature.
            let (r3, s3) = split(&SigningKey::from_bytes(&[i ^ 0x80; 32]).sign(&m));
            assert!(!agree(&vk, &m, &r3, &s3));
        }
    }

    #[test]
    fn a_non_canonical_s_is_refused() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let m = b"vote";
        let (r, s) = split(&key.sign(m));
        // s + ℓ: the same scalar mod ℓ, a different encoding (it still fits in 253 bits).
        let l: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut sum = [0u8; 32];
        let mut carry = 0u16;
        for i in 0..32 {
            let v = u16::from(s[i]) + u16::from(l[i]) + carry;
            sum[i] = v as u8;
            carry = v >> 8;
        }
        assert_eq!(carry, 0);
        assert!(!agree(&key.verifying_key(), m, &r, &sum));
        assert!(agree(&key.verifying_key(), m, &r, &s));
    }

    /// Keys with a torsion component: a signature made without knowing it verifies (under
    /// the cofactorless equation strict verification uses) exactly when the challenge is a
    /// multiple of the torsion point's order; nonces with a torsion component likewise.
    #[test]
    fn torsion_in_the_key_or_the_nonce_gives_the_same_verdicts() {
        let (mut accepted, mut refused) = (0, 0);
        for (j, t) in EIGHT_TORSION.iter().enumerate() {
            let a = scalar(j as u8 + 1);
            let big_a = ED25519_BASEPOINT_POINT * a + t;
            let Ok(vk) = VerifyingKey::from_bytes(&big_a.compress().to_bytes()) else { continue };
            for n in 0..64u8 {
                let m = [n, j as u8];
                let (r, s) = forge(a, big_a, scalar(n.wrapping_add(100)), EdwardsPoint::default(), &m);
                if agree(&vk, &m, &r, &s) {
                    accepted += 1;
                } else {
                    refused += 1;
                }
                // The nonce point off the prime-order subgroup: never, with a key in it (the
                // first torsion point is the identity); with a key off it, when the torsion
                // parts happen to cancel.
                let (r, s) = forge(a, big_a, scalar(n.wrapping_add(7)), EIGHT_TORSION[1 + n as usize % 7], &m);
                let ok = agree(&vk, &m, &r, &s);
                assert!(!(ok && j == 0));
            }
        }
        assert!(accepted > 64 && refused > 64, "both verdicts seen: {accepted} accepted, {refused} refused");
    }

    #[test]
    fn small_order_keys_and_nonces_are_refused() {
        for (j, t) in EIGHT_TORSION.iter().enumerate() {
            let enc = t.compress().to_bytes();
            // A small-order key: [s]B = R then satisfies the equation for every message.
            if let Ok(vk) = VerifyingKey::from_bytes(&enc) {
                let s = scalar(j as u8);
                let r = (ED25519_BASEPOINT_POINT * s).compress().to_bytes();
                assert!(!agree(&vk, b"m", &r, &s.to_bytes()));
            }
            // A small-order nonce point with s = k·a: the equation holds only if R is the
            // identity, which strict verification refuses.
            let key = SigningKey::from_bytes(&[9; 32]);
            let vk = key.verifying_key();
            let a = Scalar::from_bytes_mod_order(key.to_scalar_bytes());
            let k = challenge(&enc, &vk.to_bytes(), b"m");
            assert!(!agree(&vk, b"m", &enc, &(k * a).to_bytes()));
        }
    }

    /// Encodings that are not canonical: y at or above p, and "negative zero" x.
    #[test]
    fn non_canonical_nonce_encodings_are_refused() {
        let key = SigningKey::from_bytes(&[5; 32]);
        let vk = key.verifying_key();
        let (_, s) = split(&key.sign(b"m"));
        for low in 0..19u8 {
            // y = p + low (p = 2^255 - 19), both signs.
            let mut y = [0xffu8; 32];
            y[0] = 0xed + low;
            y[31] = 0x7f;
            for sign in [0u8, 0x80] {
                let mut r = y;
                r[31] |= sign;
                agree(&vk, b"m", &r, &s);
            }
        }
        // The identity with the sign bit set.
        let mut r = [0u8; 32];
        r[0] = 1;
        r[31] = 0x80;
        assert!(!agree(&vk, b"m", &r, &s));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Random bytes for everything: whatever the key, nonce and scalar, the same verdict.
        #[test]
        fn arbitrary_inputs_get_the_library_verdict(
            key in proptest::array::uniform32(any::<u8>()),
            r in proptest::array::uniform32(any::<u8>()),
            s in proptest::array::uniform32(any::<u8>()),
            m in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            if let Ok(vk) = VerifyingKey::from_bytes(&key) {
                agree(&vk, &m, &r, &s);
            }
            // And a real signature over the same message with a key from those bytes.
            let sk = SigningKey::from_bytes(&key);
            let (r2, s2) = split(&sk.sign(&m));
            prop_assert!(agree(&sk.verifying_key(), &m, &r2, &s2));
        }
    }
}
