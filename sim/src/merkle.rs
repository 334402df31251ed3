//! Incremental Merkle trees for the state root (DESIGN §4 step 7).
//!
//! A [`SlotTree`] is a complete 4-ary tree over numbered slots (an object's slot, an account's
//! slot). Its capacity is the next power of four of the slot high-water mark (at least 4),
//! which is part of the state, so the root is a pure function of the state. Changing a leaf marks it dirty;
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
    pub const OBJECT_FIXED: [u8; 32] = *b"metatopia/object/fixed/v1_______";
}

/// An inner node: the keyed hash of its four children side by side (128 bytes, two blocks).
/// Leaves are keyed hashes under another key, so a leaf can never pass for a node.
fn node_hash(children: &[[u8; 32]; 4]) -> [u8; 32] {
    *blake3::keyed_hash(&keys::NODE, children.as_flattened()).as_bytes()
}

/// The value of an empty slot.
pub const EMPTY: [u8; 32] = [0; 32];

/// How many children an inner node has.
pub const ARITY: u32 = 4;

/// A complete 4-ary Merkle tree over slots, updated incrementally.
///
/// Four children a node, not two: a node costs two compressions instead of one, but there are
/// a third as many of them, and half as many levels to walk. With 1,430 of 16,384 slots
/// changed, a binary tree rehashes about 5,300 nodes (5,300 compressions), this one about
/// 2,300 (4,600 compressions): where the changed leaves are dense (the upper levels) one
/// 4-ary node replaces three binary ones, and where they are sparse it costs the same.
#[derive(Clone, Debug, Default)]
pub struct SlotTree {
    /// Every level, leaves first: level `j` holds `cap / 4^j` nodes, and node `i` of level
    /// `j + 1` hashes nodes `4i..4i+4` of level `j`. The root is the last node.
    nodes: Vec<[u8; 32]>,
    cap: u32,
    /// Leaves changed since the last `root()`, unsorted, may repeat.
    dirty: Vec<u32>,
}

/// The levels of a tree of capacity `cap`, leaves first, as mutable slices of `nodes`.
fn levels_mut(nodes: &mut [[u8; 32]], cap: usize) -> Vec<&mut [[u8; 32]]> {
    let mut levels = Vec::new();
    let mut rest = nodes;
    let mut width = cap;
    while width >= 1 {
        let (level, tail) = rest.split_at_mut(width);
        levels.push(level);
        rest = tail;
        width /= ARITY as usize;
    }
    levels
}

/// Rehash the paths above `changed` (sorted, distinct indices into `levels[0]`), level by
/// level up to `levels.last()`. A level's changed nodes are independent of one another, so
/// they are hashed side by side in SIMD lanes ([`wide`]).
fn rehash_paths(levels: &mut [&mut [[u8; 32]]], mut changed: Vec<u32>) {
    for up in 1..levels.len() {
        if changed.is_empty() {
            return;
        }
        // The parents, in order and distinct (the children are in order), kept without a
        // branch whose outcome the data decides: `dedup`'s mispredicted often enough to cost
        // 9 µs of a 100 µs root (1,430 leaves, 2,300 parents over six levels).
        let mut kept = 0;
        let mut last = u32::MAX;
        for i in 0..changed.len() {
            let parent = changed[i] / ARITY;
            changed[kept] = parent;
            kept += usize::from(parent != last);
            last = parent;
        }
        changed.truncate(kept);
        let (lower, upper) = levels.split_at_mut(up);
        wide::nodes4_at(&keys::NODE, lower[up - 1], &changed, upper[0]);
    }
}

/// Write the leaves of `items` (sorted by slot; the last of a slot wins) into `levels[0]`,
/// whose first node is slot `base`, and rehash their paths up to `levels.last()`.
fn write_and_rehash<T, S, L>(levels: &mut [&mut [[u8; 32]]], base: u32, items: &[T], slot: &S, leaves: &L)
where
    S: Fn(&T) -> u32,
    L: Fn(&[T], &mut [[u8; 32]], u32),
{
    if items.is_empty() {
        return;
    }
    leaves(items, levels[0], base);
    let mut changed: Vec<u32> = items.iter().map(|item| slot(item) - base).collect();
    changed.dedup();
    rehash_paths(levels, changed);
}

/// Rehash every node of the levels above `levels[0]`.
fn rehash_all(levels: &mut [&mut [[u8; 32]]]) {
    for up in 1..levels.len() {
        let (lower, upper) = levels.split_at_mut(up);
        let all: Vec<u32> = (0..upper[0].len() as u32).collect();
        wide::nodes4_at(&keys::NODE, lower[up - 1], &all, upper[0]);
    }
}

impl SlotTree {
    /// The capacity a tree must have for a slot high-water mark: a power of four, at least 4.
    pub fn capacity_for(slots: u32) -> u32 {
        let mut cap = ARITY;
        while cap < slots {
            cap *= ARITY;
        }
        cap
    }

    /// Grow (or build) the tree so it holds `slots` slots. Existing leaves are kept; growth
    /// rehashes the whole tree once, which amortises over the growths.
    pub fn ensure_slots(&mut self, slots: u32) {
        let want = Self::capacity_for(slots);
        if want == self.cap {
            return;
        }
        assert!(want > self.cap, "slot high-water marks never shrink");
        let total = (want as usize * 4 - 1) / 3; // cap + cap/4 + ... + 1
        let mut nodes = vec![EMPTY; total];
        nodes[..self.cap as usize].copy_from_slice(&self.nodes[..self.cap as usize]);
        self.nodes = nodes;
        self.cap = want;
        self.dirty.clear();
        rehash_all(&mut levels_mut(&mut self.nodes, want as usize));
    }

    /// Set a slot's leaf value (`EMPTY` clears it). The slot must be below the capacity.
    pub fn set(&mut self, slot: u32, leaf: Hash32) {
        assert!(slot < self.cap, "slot {slot} beyond capacity {}", self.cap);
        let i = slot as usize;
        if self.nodes[i] != leaf.0 {
            self.nodes[i] = leaf.0;
            self.dirty.push(slot);
        }
    }

    /// How many slots the tree holds now (a power of four).
    pub fn capacity(&self) -> u32 {
        self.cap
    }

    pub fn get(&self, slot: u32) -> Option<Hash32> {
        (slot < self.cap).then(|| Hash32(self.nodes[slot as usize]))
    }

    fn top(&self) -> Hash32 {
        Hash32(*self.nodes.last().expect("a built tree has a root"))
    }

    /// The root, rehashing the paths of the leaves changed since the last call. This runs on
    /// one thread; [`SlotTree::update`] splits the work over subtrees.
    pub fn root(&mut self) -> Hash32 {
        if self.cap == 0 {
            self.ensure_slots(1);
        }
        if !self.dirty.is_empty() {
            let mut changed = std::mem::take(&mut self.dirty);
            changed.sort_unstable();
            changed.dedup();
            rehash_paths(&mut levels_mut(&mut self.nodes, self.cap as usize), changed);
        }
        self.top()
    }

    /// Write the leaves of `items` and return the root: the same as [`SlotTree::set`] for each
    /// item in order and then [`SlotTree::root`], with the work split over `workers` threads.
    ///
    /// `items` are sorted by `slot` (a slot may repeat; its last item wins), and
    /// `leaves(run, level, base)` writes the leaf of each item of a run of them into `level`,
    /// at its slot less `base` (straight from the hashing's output, with no list between).
    ///
    /// With at least [`SlotTree::MIN_SPLIT`] items, the tree below its top levels is `P`
    /// disjoint subtrees (`P` the power of four at or above `workers`); each item falls in one
    /// by its slot, so each subtree's share of `items` is a contiguous run, and one task per
    /// subtree computes its leaves and rehashes its own paths up to its top, writing only its
    /// own nodes. The few nodes above them are hashed last. One fork and join for the whole
    /// update (the levels one at a time were tried first: a fork per level cost more than it
    /// saved).
    pub fn update<T, S, L>(&mut self, items: &[T], workers: u32, slot: S, leaves: L) -> Hash32
    where
        T: Sync,
        S: Fn(&T) -> u32 + Sync,
        L: Fn(&[T], &mut [[u8; 32]], u32) + Sync,
    {
        self.update_split(items, workers, slot, leaves, Self::MIN_SPLIT)
    }

    /// Below this many items one thread does the whole update. Splitting it pays only when
    /// the work outweighs a second thread waking and finding none of the changed objects in
    /// its core's cache (the tick's merge wrote them on the first): on the 2-core VMs here,
    /// with 1,430 of 15,000 objects moved one thread took 93 µs and two 141 µs, with 4,300
    /// moved 213 against 241 µs, with 8,300 moved 369 against 368 µs
    /// (`cargo bench -p metatopia-sim --bench tick -- root/`).
    pub const MIN_SPLIT: usize = 8_192;

    fn update_split<T, S, L>(&mut self, items: &[T], workers: u32, slot: S, leaves: L, min_split: usize) -> Hash32
    where
        T: Sync,
        S: Fn(&T) -> u32 + Sync,
        L: Fn(&[T], &mut [[u8; 32]], u32) + Sync,
    {
        if self.cap == 0 {
            self.ensure_slots(1);
        }
        debug_assert!(items.windows(2).all(|w| slot(&w[0]) <= slot(&w[1])), "items sorted by slot");
        let _ = self.root(); // leaves set one by one before this call
        let cap = self.cap as usize;
        if workers <= 1 || items.len() < min_split {
            write_and_rehash(&mut levels_mut(&mut self.nodes, cap), 0, items, &slot, &leaves);
            return self.top();
        }
        let parts = Self::capacity_for(workers).min(self.cap) as usize;
        let span = cap / parts;
        let mut levels = levels_mut(&mut self.nodes, cap);
        // The levels at least `parts` wide are split: subtree `p` holds the `p`-th of the
        // `parts` equal pieces of each, from its leaves up to its top (one node).
        let split = levels.iter().take_while(|l| l.len() >= parts).count();
        levels.truncate(split);
        let mut pieces: Vec<Vec<&mut [[u8; 32]]>> = (0..parts).map(|_| Vec::with_capacity(split)).collect();
        for level in levels {
            let width = level.len() / parts;
            for (p, piece) in level.chunks_mut(width).enumerate() {
                pieces[p].push(piece);
            }
        }
        let mut jobs = Vec::with_capacity(parts);
        let mut start = 0;
        for (p, levels) in pieces.into_iter().enumerate() {
            let end = start + items[start..].partition_point(|it| (slot(it) as usize) < (p + 1) * span);
            jobs.push(((p * span) as u32, levels, &items[start..end]));
            start = end;
        }
        assert_eq!(start, items.len(), "every slot below the capacity");
        crate::par::for_each(jobs, workers, |(base, mut levels, part)| {
            write_and_rehash(&mut levels, base, part, &slot, &leaves)
        });
        // The subtrees' tops, then the levels above them.
        rehash_all(&mut levels_mut(&mut self.nodes, cap).split_off(split - 1));
        self.top()
    }

    /// The siblings of a slot's path, bottom up, three a level: a proof that its leaf is
    /// under `root()`. Call `root()` first so the path is current.
    pub fn proof(&self, slot: u32) -> Vec<Hash32> {
        assert!(self.dirty.is_empty(), "call root() before proof()");
        let mut path = Vec::new();
        let mut offset = 0usize;
        let mut width = self.cap as usize;
        let mut i = slot as usize;
        while width > 1 {
            let first = i - i % 4;
            for s in first..first + 4 {
                if s != i {
                    path.push(Hash32(self.nodes[offset + s]));
                }
            }
            offset += width;
            width /= 4;
            i /= 4;
        }
        path
    }

    /// Check a proof produced by [`SlotTree::proof`].
    pub fn verify_proof(root: Hash32, slot: u32, leaf: Hash32, path: &[Hash32]) -> bool {
        if !path.len().is_multiple_of(3) {
            return false;
        }
        let mut acc = leaf.0;
        let mut index = slot as u64;
        for siblings in path.chunks_exact(3) {
            let at = (index % 4) as usize;
            let mut children = [EMPTY; 4];
            let mut rest = siblings.iter();
            for (k, c) in children.iter_mut().enumerate() {
                *c = if k == at { acc } else { rest.next().map_or(EMPTY, |h| h.0) };
            }
            acc = node_hash(&children);
            index /= 4;
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

    /// The root computed the plain way, one `blake3::keyed_hash` at a time, level by level:
    /// the reference the tree's lane-parallel hashing must equal.
    fn full_rebuild(leaves: &[[u8; 32]], slots: u32) -> Hash32 {
        let mut level: Vec<[u8; 32]> = leaves.to_vec();
        level.resize(SlotTree::capacity_for(slots) as usize, EMPTY);
        while level.len() > 1 {
            level = level.chunks(4).map(|c| node_hash(c.try_into().unwrap())).collect();
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
                let leaves = |part: &[(u32, u8)], level: &mut [[u8; 32]], base: u32| {
                    for &(slot, v) in part {
                        level[(slot - base) as usize] = [v; 32];
                    }
                };
                let root = split.update_split(&edits, workers, |e| e.0, leaves, 1);
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
