//! Incremental Merkle trees for the state root (DESIGN §4 step 7).
//!
//! A [`SlotTree`] is a complete binary tree over numbered slots (an object's slot, an account's
//! slot). Its capacity is the next power of two of the slot high-water mark, which is part of
//! the state, so the root is a pure function of the state. Changing a leaf marks it dirty;
//! [`SlotTree::root`] rehashes only the dirty leaves' paths, so the cost of a tick's root grows
//! with the number of slots it changed, not with the world.
//!
//! Hashing is blake3 in keyed mode with one key per role (leaf, node, subsystem, root), so a
//! leaf can never be confused with an inner node (second-preimage safety).

use crate::ids::Hash32;
use crate::wide;

/// Domain keys: blake3 keyed mode, one per role. Derived once from readable contexts.
pub mod keys {
    pub const LEAF: [u8; 32] = *b"metatopia/merkle/leaf/v1________";
    pub const NODE: [u8; 32] = *b"metatopia/merkle/node/v1________";
    pub const SUBSYSTEM: [u8; 32] = *b"metatopia/state/subsystem/v1____";
    pub const ROOT: [u8; 32] = *b"metatopia/state/root/v1_________";
    pub const ORDER: [u8; 32] = *b"metatopia/order/key/v1__________";
    pub const EVENT_ID: [u8; 32] = *b"metatopia/event/id/v1___________";
    pub const SCRIPT_ID: [u8; 32] = *b"metatopia/script/id/v1__________";
    pub const QUEUED_ID: [u8; 32] = *b"metatopia/queued/id/v1__________";
    pub const RNG: [u8; 32] = *b"metatopia/rng/seed/v1___________";
    pub const MAIL: [u8; 32] = *b"metatopia/mail/digest/v1________";
}

/// An inner node: a blake3 parent-node compression in keyed mode (one compression, and the
/// PARENT flag separates it from every leaf, which is a keyed root hash under another key).
fn node_hash(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    blake3::hazmat::merge_subtrees_non_root(left, right, blake3::hazmat::Mode::KeyedHash(&keys::NODE))
}

/// The value of an empty slot.
pub const EMPTY: [u8; 32] = [0; 32];

/// A complete binary Merkle tree over slots, updated incrementally.
#[derive(Clone, Debug, Default)]
pub struct SlotTree {
    /// Heap layout: node 1 is the root, node i has children 2i and 2i+1, leaves at
    /// `cap..2*cap`. Index 0 is unused.
    nodes: Vec<[u8; 32]>,
    cap: u32,
    /// Leaves changed since the last `root()`, unsorted, may repeat.
    dirty: Vec<u32>,
}

impl SlotTree {
    /// The capacity a tree must have for a slot high-water mark.
    pub fn capacity_for(slots: u32) -> u32 {
        slots.max(1).next_power_of_two()
    }

    /// Grow (or build) the tree so it holds `slots` slots. Existing leaves are kept; growth
    /// rehashes the whole tree once, which amortises over the doublings.
    pub fn ensure_slots(&mut self, slots: u32) {
        let want = Self::capacity_for(slots);
        if want == self.cap {
            return;
        }
        assert!(want > self.cap, "slot high-water marks never shrink");
        let old_cap = self.cap as usize;
        let mut nodes = vec![EMPTY; 2 * want as usize];
        for i in 0..old_cap {
            nodes[want as usize + i] = self.nodes[old_cap + i];
        }
        self.nodes = nodes;
        self.cap = want;
        self.dirty.clear();
        self.rehash_all_from(want as usize / 2);
    }

    /// Rehash every node of the level of width `width` and of every level above it.
    fn rehash_all_from(&mut self, mut width: usize) {
        while width >= 1 {
            let nodes = &self.nodes;
            let level =
                wide::parents_many(&keys::NODE, width, |i| (&nodes[2 * (width + i)], &nodes[2 * (width + i) + 1]));
            self.nodes[width..2 * width].copy_from_slice(&level);
            width /= 2;
        }
    }

    /// Set a slot's leaf value (`EMPTY` clears it). The slot must be below the capacity.
    pub fn set(&mut self, slot: u32, leaf: Hash32) {
        assert!(slot < self.cap, "slot {slot} beyond capacity {}", self.cap);
        let i = (self.cap + slot) as usize;
        if self.nodes[i] != leaf.0 {
            self.nodes[i] = leaf.0;
            self.dirty.push(slot);
        }
    }

    pub fn get(&self, slot: u32) -> Option<Hash32> {
        (slot < self.cap).then(|| Hash32(self.nodes[(self.cap + slot) as usize]))
    }

    /// The root, rehashing the paths of the leaves changed since the last call.
    ///
    /// A level's changed nodes are independent of one another, so they are hashed side by
    /// side in SIMD lanes ([`wide`]): about 4x faster than one at a time here. This runs on
    /// one thread; [`SlotTree::update`] splits the work over subtrees. (Splitting each level
    /// over threads instead, a fork per level, cost more than it saved on these 2-core
    /// machines: 338 µs against 285 µs.)
    pub fn root(&mut self) -> Hash32 {
        if self.cap == 0 {
            self.ensure_slots(1);
        }
        if !self.dirty.is_empty() {
            let mut level: Vec<u32> = self.dirty.drain(..).map(|s| self.cap + s).collect();
            level.sort_unstable();
            level.dedup();
            while level[0] > 1 {
                for p in level.iter_mut() {
                    *p /= 2;
                }
                level.dedup();
                let nodes = &self.nodes;
                let hashed = wide::parents_many(&keys::NODE, level.len(), |i| {
                    let p = level[i] as usize;
                    (&nodes[2 * p], &nodes[2 * p + 1])
                });
                for (&p, h) in level.iter().zip(hashed) {
                    self.nodes[p as usize] = h;
                }
            }
        }
        Hash32(self.nodes[1])
    }

    /// Write the leaves of `items` and return the root: the same as [`SlotTree::set`] for each
    /// item in order and then [`SlotTree::root`], with the work split over `workers` threads.
    ///
    /// `items` are sorted by `slot` (a slot may repeat; its last item wins), and `leaves`
    /// computes the leaf values of a run of them. The tree below its top `P` nodes (`P` the
    /// power of two at or above `workers`) is `P` disjoint subtrees; each item falls in one by
    /// its slot, so each subtree's share of `items` is a contiguous run, and one task per
    /// subtree computes its leaves and rehashes its own paths up to its top, writing only
    /// its own nodes. The `P - 1` nodes above them are hashed last. One fork and join for the
    /// whole update, so a tick's root is split over the cores that ran its merge (the
    /// levels one at a time were tried first: a fork per level cost more than it saved).
    pub fn update<T, S, L>(&mut self, items: &[T], workers: u32, slot: S, leaves: L) -> Hash32
    where
        T: Sync,
        S: Fn(&T) -> u32 + Sync,
        L: Fn(&[T]) -> Vec<Hash32> + Sync,
    {
        /// Below this many items one thread does it all (a fork costs more than it saves).
        const MIN_SPLIT: usize = 128;
        if self.cap == 0 {
            self.ensure_slots(1);
        }
        debug_assert!(items.windows(2).all(|w| slot(&w[0]) <= slot(&w[1])), "items sorted by slot");
        let parts = workers.max(1).next_power_of_two().min(self.cap) as usize;
        if parts == 1 || items.len() < MIN_SPLIT {
            for (item, leaf) in items.iter().zip(leaves(items)) {
                self.set(slot(item), leaf);
            }
            return self.root();
        }
        let _ = self.root(); // leaves set one by one before this call
        let cap = self.cap as usize;
        let span = cap / parts;
        // Each subtree's nodes, level by level from its top (one node) down to its leaves
        // (`span` of them): in the heap layout a level of width `w` is `nodes[w..2w]`, and
        // subtree `p` holds the `p`-th of its `parts` equal pieces.
        let mut levels: Vec<Vec<&mut [[u8; 32]]>> = (0..parts).map(|_| Vec::new()).collect();
        let mut rest = &mut self.nodes[parts..];
        let mut width = parts;
        while width <= cap {
            let (level, tail) = rest.split_at_mut(width);
            rest = tail;
            for (p, piece) in level.chunks_mut(width / parts).enumerate() {
                levels[p].push(piece);
            }
            width *= 2;
        }
        let mut jobs = Vec::with_capacity(parts);
        let mut start = 0;
        for (p, levels) in levels.into_iter().enumerate() {
            let end = start + items[start..].partition_point(|it| (slot(it) as usize) < (p + 1) * span);
            jobs.push((p * span, levels, &items[start..end]));
            start = end;
        }
        assert_eq!(start, items.len(), "every slot below the capacity");
        crate::par::for_each(jobs, workers, |(base, mut levels, part)| {
            if part.is_empty() {
                return;
            }
            let hashed = leaves(part);
            let Some(bottom) = levels.last_mut() else { return };
            let mut changed: Vec<u32> = Vec::with_capacity(part.len());
            for (item, leaf) in part.iter().zip(hashed) {
                let i = slot(item) as usize - base;
                if bottom[i] != leaf.0 {
                    bottom[i] = leaf.0;
                    changed.push(i as u32);
                }
            }
            changed.dedup();
            for below in (1..levels.len()).rev() {
                if changed.is_empty() {
                    break;
                }
                for c in changed.iter_mut() {
                    *c /= 2;
                }
                changed.dedup();
                let (upper, lower) = levels.split_at_mut(below);
                let (children, parents) = (&lower[0], &mut upper[below - 1]);
                let hashed = wide::parents_many(&keys::NODE, changed.len(), |i| {
                    let q = changed[i] as usize;
                    (&children[2 * q], &children[2 * q + 1])
                });
                for (&q, h) in changed.iter().zip(hashed) {
                    parents[q as usize] = h;
                }
            }
        });
        self.rehash_all_from(parts / 2);
        Hash32(self.nodes[1])
    }

    /// The sibling path of a slot, bottom up: a proof that its leaf is under `root()`.
    /// Call `root()` first so the path is current.
    pub fn proof(&self, slot: u32) -> Vec<Hash32> {
        assert!(self.dirty.is_empty(), "call root() before proof()");
        let mut i = (self.cap + slot) as usize;
        let mut path = Vec::new();
        while i > 1 {
            path.push(Hash32(self.nodes[i ^ 1]));
            i /= 2;
        }
        path
    }

    /// Check a proof produced by [`SlotTree::proof`].
    pub fn verify_proof(root: Hash32, slot: u32, leaf: Hash32, path: &[Hash32]) -> bool {
        let mut acc = leaf.0;
        let mut index = slot as u64;
        for sib in path {
            acc = if index & 1 == 0 { node_hash(&acc, &sib.0) } else { node_hash(&sib.0, &acc) };
            index >>= 1;
        }
        index == 0 && acc == root.0
    }
}

/// Combine named subsystem parts into one digest.
pub fn combine(key: &[u8; 32], parts: &[&[u8]]) -> Hash32 {
    let mut h = blake3::Hasher::new_keyed(key);
    for p in parts {
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    Hash32(*h.finalize().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The root computed the plain way, one `blake3` parent compression at a time, level by
    /// level: the reference the tree's lane-parallel hashing must equal.
    fn full_rebuild(leaves: &[[u8; 32]], slots: u32) -> Hash32 {
        let mut level: Vec<[u8; 32]> = leaves.to_vec();
        level.resize(SlotTree::capacity_for(slots) as usize, EMPTY);
        while level.len() > 1 {
            level = level.chunks(2).map(|pair| node_hash(&pair[0], &pair[1])).collect();
        }
        Hash32(level[0])
    }

    proptest! {
        #[test]
        fn incremental_equals_full_rebuild(
            n in 1u32..300,
            edits in proptest::collection::vec((0u32..300, any::<u8>()), 0..200),
        ) {
            let mut leaves = vec![EMPTY; n as usize];
            let mut inc = SlotTree::default();
            inc.ensure_slots(n);
            let _ = inc.root();
            for (i, (slot, v)) in edits.into_iter().enumerate() {
                let slot = slot % n;
                leaves[slot as usize] = [v; 32];
                inc.set(slot, Hash32([v; 32]));
                if i % 7 == 0 {
                    let _ = inc.root();
                }
            }
            prop_assert_eq!(inc.root(), full_rebuild(&leaves, n));
        }

        /// `update` split over subtrees is `set` for each item in order, then `root`: for
        /// any worker count, with repeated slots (the last wins), over several rounds.
        #[test]
        fn split_update_equals_set_then_root(
            n in 1u32..3_000,
            rounds in proptest::collection::vec(proptest::collection::vec((0u32..3_000, any::<u8>()), 0..600), 1..4),
            workers in 1u32..9,
        ) {
            let mut plain = SlotTree::default();
            let mut split = SlotTree::default();
            plain.ensure_slots(n);
            split.ensure_slots(n);
            for mut edits in rounds {
                for e in edits.iter_mut() {
                    e.0 %= n;
                }
                edits.sort_by_key(|e| e.0); // stable: a repeated slot keeps its order
                for &(slot, v) in &edits {
                    plain.set(slot, Hash32([v; 32]));
                }
                let leaves = |part: &[(u32, u8)]| part.iter().map(|&(_, v)| Hash32([v; 32])).collect::<Vec<_>>();
                let root = split.update(&edits, workers, |e| e.0, leaves);
                prop_assert_eq!(root, plain.root());
                prop_assert_eq!(split.proof(n - 1), plain.proof(n - 1));
            }
        }

        #[test]
        fn proofs_verify_and_reject_tampering(n in 1u32..200, pick in 0u32..200) {
            let leaves: Vec<[u8; 32]> = (0..n).map(|i| *blake3::hash(&i.to_le_bytes()).as_bytes()).collect();
            let mut t = SlotTree::default();
            t.ensure_slots(n);
            for (i, l) in leaves.iter().enumerate() {
                t.set(i as u32, Hash32(*l));
            }
            let root = t.root();
            let slot = pick % n;
            let path = t.proof(slot);
            prop_assert!(SlotTree::verify_proof(root, slot, Hash32(leaves[slot as usize]), &path));
            prop_assert!(!SlotTree::verify_proof(root, slot, Hash32([7; 32]), &path));
        }
    }

    #[test]
    fn growth_keeps_leaves_and_changes_root() {
        let mut t = SlotTree::default();
        t.ensure_slots(3);
        t.set(2, Hash32([1; 32]));
        let small = t.root();
        t.ensure_slots(5);
        assert_eq!(t.get(2), Some(Hash32([1; 32])));
        assert_ne!(t.root(), small, "depth is part of the commitment");
        assert_eq!(t.root(), full_rebuild(&[EMPTY, EMPTY, [1; 32]], 5));
    }
}
