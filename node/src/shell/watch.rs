//! Which of its sim's validators a node reaches (DESIGN §11, honest operator signals): counted
//! for `stats`, `/readyz` and the status line, and a warning, naming the key, for a validator
//! unreachable for [`WARN_AFTER_MS`]. Sans-IO: the caller passes the time and who is connected.

use std::collections::{BTreeMap, BTreeSet};

/// A validator unreachable this long is named in a warning (once per outage).
pub const WARN_AFTER_MS: u64 = 10_000;

/// The watch's memory: since when each validator has been out of reach.
#[derive(Debug, Default)]
pub struct ValidatorWatch {
    down_since_ms: BTreeMap<[u8; 32], u64>,
    warned: BTreeSet<[u8; 32]>,
}

/// What one look found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// Validators of the set reached, this node included when it is one.
    pub connected: u32,
    pub total: u32,
    /// Keys of the validators not reached now, in key order.
    pub missing: Vec<[u8; 32]>,
    /// Validators now out of reach for [`WARN_AFTER_MS`], with how long (to warn of, once).
    pub warn: Vec<([u8; 32], u64)>,
    /// Validators reached again after a warning.
    pub back: Vec<[u8; 32]>,
}

impl Reach {
    /// Whether 2f + 1 of the set's 3f + 1 are reached (a quorum can form with this node).
    pub fn quorum(&self) -> bool {
        let f = self.total.saturating_sub(1) / 3;
        self.connected > 2 * f
    }
}

impl ValidatorWatch {
    /// Look at the set `validators` at `now_ms`: `me` is this node's key, `connected` the keys of
    /// the nodes it is connected to.
    pub fn look(
        &mut self,
        now_ms: u64,
        validators: &[[u8; 32]],
        me: &[u8; 32],
        connected: &BTreeSet<[u8; 32]>,
    ) -> Reach {
        let mut r = Reach { total: validators.len() as u32, ..Reach::default() };
        let set: BTreeSet<[u8; 32]> = validators.iter().copied().collect();
        // Validators that left the set are no longer watched.
        self.down_since_ms.retain(|k, _| set.contains(k));
        self.warned.retain(|k| set.contains(k));
        for k in &set {
            if k == me || connected.contains(k) {
                r.connected += 1;
                self.down_since_ms.remove(k);
                if self.warned.remove(k) {
                    r.back.push(*k);
                }
                continue;
            }
            r.missing.push(*k);
            let since = *self.down_since_ms.entry(*k).or_insert(now_ms);
            let down = now_ms.saturating_sub(since);
            if down >= WARN_AFTER_MS && self.warned.insert(*k) {
                r.warn.push((*k, down));
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_validator_out_of_reach_is_counted_at_once_and_named_after_ten_seconds_once() {
        let keys = [[1; 32], [2; 32], [3; 32], [4; 32]];
        let mut w = ValidatorWatch::default();
        let all: BTreeSet<_> = keys[1..].iter().copied().collect();
        let r = w.look(0, &keys, &keys[0], &all);
        assert_eq!((r.connected, r.total, r.quorum()), (4, 4, true));
        let three: BTreeSet<_> = keys[1..3].iter().copied().collect();
        let r = w.look(1_000, &keys, &keys[0], &three);
        assert_eq!((r.connected, r.missing.clone(), r.warn.clone()), (3, vec![[4; 32]], vec![]));
        assert!(r.quorum(), "3 of 4 is a quorum");
        let r = w.look(10_999, &keys, &keys[0], &three);
        assert!(r.warn.is_empty(), "not yet ten seconds");
        let r = w.look(11_000, &keys, &keys[0], &three);
        assert_eq!(r.warn, vec![([4; 32], 10_000)]);
        let r = w.look(30_000, &keys, &keys[0], &three);
        assert!(r.warn.is_empty(), "named once per outage");
        let two: BTreeSet<_> = keys[1..2].iter().copied().collect();
        let r = w.look(31_000, &keys, &keys[0], &two);
        assert_eq!((r.connected, r.quorum()), (2, false));
        let r = w.look(32_000, &keys, &keys[0], &all);
        assert_eq!((r.connected, r.back.clone()), (4, vec![[4; 32]]));
        // An observer (not in the set) counts only the validators.
        let r = w.look(33_000, &keys, &[9; 32], &three);
        assert_eq!((r.connected, r.total), (2, 4));
    }
}
