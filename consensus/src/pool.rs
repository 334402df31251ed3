//! The pool of client events waiting to be proposed: deduplicated, bounded, FIFO.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::types::{Digest, event_id};

/// Events waiting for a block, and the ids recently committed (so a late copy is dropped).
///
/// Maps are keyed by the first 128 bits of the event id: integer comparisons instead of 32-byte
/// `memcmp`s in maps of up to a million entries (finding a 128-bit prefix collision of blake3
/// takes ~2^64 work; an honest collision, ~2^-64 per pair, would only delay one event).
#[derive(Clone, Debug, Default)]
pub(crate) struct Pool {
    /// Arrival order.
    order: VecDeque<u128>,
    events: BTreeMap<u128, Vec<u8>>,
    /// Ids committed in the last `window` ticks, with their tick.
    committed: BTreeMap<u128, u64>,
    committed_by_tick: BTreeMap<u64, Vec<u128>>,
}

fn key(id: &Digest) -> u128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(&id.0[..16]);
    u128::from_le_bytes(b)
}

impl Pool {
    /// Add an event; `false` if it was known, committed recently, or the pool is full.
    pub fn insert(&mut self, bytes: Vec<u8>, max_events: usize) -> bool {
        let id = key(&event_id(&bytes));
        if !self.admits(id, max_events) {
            return false;
        }
        self.order.push_back(id);
        self.events.insert(id, bytes);
        true
    }

    /// Like `insert`, copying the bytes only when the event is new.
    pub fn insert_ref(&mut self, bytes: &[u8], max_events: usize) -> bool {
        let id = key(&event_id(bytes));
        if !self.admits(id, max_events) {
            return false;
        }
        self.order.push_back(id);
        self.events.insert(id, bytes.to_vec());
        true
    }

    fn admits(&self, id: u128, max_events: usize) -> bool {
        !self.events.contains_key(&id) && !self.committed.contains_key(&id) && self.events.len() < max_events
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Up to `max_events` / `max_bytes` of the oldest events not in `exclude`.
    pub fn take(&self, max_events: usize, max_bytes: usize, exclude: &BTreeSet<Digest>) -> Vec<Vec<u8>> {
        let exclude: BTreeSet<u128> = exclude.iter().map(key).collect();
        let mut out = Vec::new();
        let mut taken = BTreeSet::new();
        let mut bytes = 0usize;
        for id in &self.order {
            if out.len() >= max_events {
                break;
            }
            // The queue may hold a stale copy of an id that was committed and re-submitted.
            if exclude.contains(id) || !taken.insert(*id) {
                continue;
            }
            let Some(e) = self.events.get(id) else { continue };
            if bytes + e.len() > max_bytes {
                break;
            }
            bytes += e.len();
            out.push(e.clone());
        }
        out
    }

    /// Events of a finalized block leave the pool and are remembered for `window` ticks.
    pub fn committed(&mut self, tick: u64, ids: &[Digest], window: u64) {
        let ids: Vec<u128> = ids.iter().map(key).collect();
        for id in &ids {
            self.events.remove(id);
            self.committed.insert(*id, tick);
        }
        self.committed_by_tick.entry(tick).or_default().extend_from_slice(&ids);
        // `take` skips ids no longer pooled; compact the order queue once it is mostly stale.
        if self.order.len() > 2 * self.events.len() + 1024 {
            self.order.retain(|id| self.events.contains_key(id));
        }
        let horizon = tick.saturating_sub(window);
        while let Some((&t, _)) = self.committed_by_tick.first_key_value() {
            if t >= horizon {
                break;
            }
            if let Some((_, old)) = self.committed_by_tick.pop_first() {
                for id in old {
                    if self.committed.get(&id) == Some(&t) {
                        self.committed.remove(&id);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedups_bounds_and_forgets_committed_after_the_window() {
        let mut p = Pool::default();
        assert!(p.insert(b"a".to_vec(), 2));
        assert!(!p.insert(b"a".to_vec(), 2), "duplicate");
        assert!(p.insert(b"b".to_vec(), 2));
        assert!(!p.insert(b"c".to_vec(), 2), "full");
        assert_eq!(p.take(10, 1 << 20, &BTreeSet::new()), vec![b"a".to_vec(), b"b".to_vec()]);
        let a = event_id(b"a");
        assert_eq!(p.take(10, 1 << 20, &[a].into_iter().collect()), vec![b"b".to_vec()]);
        p.committed(5, &[a], 10);
        assert_eq!(p.len(), 1);
        assert!(!p.insert(b"a".to_vec(), 9), "committed recently");
        p.committed(16, &[], 10);
        assert!(p.insert(b"a".to_vec(), 9), "forgotten after the window");
    }
}
