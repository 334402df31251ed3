//! The pool of client events waiting to be proposed: deduplicated, bounded, FIFO.
//!
//! Hash maps here are lookup-only (never iterated: the arrival order is the `order` queue), as
//! DESIGN §5 allows, hence the one exception to the workspace's ban on them.
#![allow(clippy::disallowed_types)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use crate::types::{Digest, EventBytes, Micros, Tick, event_ids};

/// Events waiting for a block, and the ids recently committed (so a late copy is dropped).
///
/// Keys are the first 128 bits of the event id: a blake3 output, so uniform (finding a 128-bit
/// prefix collision takes ~2^64 work; an honest collision, ~2^-64 per pair, would only delay one
/// event). The maps are hash maps, used only for lookups (DESIGN §5: arrival order lives in
/// `order`), with a hasher keyed by a secret of this validator, so nobody can grind event ids
/// into one bucket. They replaced `BTreeMap`s that took 35% of a validator's time at 1,000
/// events a tick (300,000 remembered ids: a cache miss per level).
#[derive(Clone, Debug, Default)]
pub(crate) struct Pool {
    /// Arrival order.
    order: VecDeque<u128>,
    /// Pooled events by id, with their full id, when they were pooled, and the gossip batch
    /// they came in.
    events: HashMap<u128, (Digest, EventBytes, Micros, Option<Source>), IdHasher>,
    /// Ids committed recently, in two generations of `window` ticks each: an id is
    /// remembered for at least `window` ticks and at most `2 * window`. Dropping the older
    /// generation whole replaced forgetting each id on its own tick (two more cache misses per
    /// event in a table of 300,000: 13 % of a validator's time at 1,000 events a tick).
    committed: IdSet,
    committed_old: IdSet,
    /// The first tick of the `committed` generation.
    generation_from: Option<Tick>,
    /// The gossip batches the events came in, which compact proposals name runs of.
    pub batches: Batches,
}

/// Where a pooled event came from: its place in a gossip batch (the batch's sequence number
/// here, and the event's position in it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Source {
    pub seq: u64,
    pub index: u32,
}

/// A gossip batch: the events of one `Message::Events` as they came (or as this validator sent
/// them, for its own clients' events), with their ids.
#[derive(Debug)]
pub(crate) struct Gossip {
    pub digest: Digest,
    pub seq: u64,
    pub ids: Vec<Digest>,
    pub events: Vec<EventBytes>,
}

/// The gossip batches received and sent, newest last, by the digest of their events' ids
/// ([`batch_digest`]), up to `max_events` events and `max_bytes` of them in all. Every validator gets the same batches
/// (each is sent to all), so a leader names its proposal's events as runs of them, a few dozen
/// bytes instead of 32 bytes an event, and a follower finds them with a lookup per run instead
/// of one per event (`Message::ProposeRefs`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Batches {
    held: HashMap<u128, Arc<Gossip>, IdHasher>,
    /// By sequence number from `first`: each batch's digest and the counts of events and of
    /// their bytes stored up to it (for `referable`).
    seqs: VecDeque<(Digest, u64, u64)>,
    first: u64,
    /// Events and bytes stored, all told, and held now.
    total: u64,
    total_bytes: u64,
    held_events: usize,
    held_bytes: usize,
    max_events: usize,
    max_bytes: usize,
}

/// A gossip batch's name: the blake3 hash of its events' ids, one after the other.
pub(crate) fn batch_digest(ids: &[Digest]) -> Digest {
    let mut bytes = Vec::with_capacity(ids.len() * 32);
    for id in ids {
        bytes.extend_from_slice(&id.0);
    }
    let mut h = blake3::Hasher::new_derive_key("metatopia consensus gossip batch v1");
    h.update(&bytes);
    Digest(*h.finalize().as_bytes())
}

impl Batches {
    pub fn new(hasher: IdHasher, max_events: usize, max_bytes: usize) -> Batches {
        Batches { held: HashMap::with_hasher(hasher), max_events, max_bytes, ..Batches::default() }
    }

    /// The sequence number the next batch stored gets.
    pub fn next_seq(&self) -> u64 {
        self.first + self.seqs.len() as u64
    }

    /// Keep a batch (its digest is [`batch_digest`] of its ids; the oldest go beyond
    /// `max_events` or `max_bytes`); its sequence number (the one it had, if it is held
    /// already: a batch sent twice).
    pub fn store(&mut self, digest: Digest, ids: Vec<Digest>, events: Vec<EventBytes>) -> u64 {
        debug_assert_eq!(ids.len(), events.len());
        debug_assert_eq!(digest, batch_digest(&ids));
        if let Some(g) = self.get(&digest) {
            return g.seq;
        }
        let seq = self.next_seq();
        let bytes: usize = events.iter().map(|e| e.len()).sum();
        self.total += ids.len() as u64;
        self.total_bytes += bytes as u64;
        self.held_events += ids.len();
        self.held_bytes += bytes;
        self.seqs.push_back((digest, self.total, self.total_bytes));
        self.held.insert(key(&digest), Arc::new(Gossip { digest, seq, ids, events }));
        while (self.held_events > self.max_events || self.held_bytes > self.max_bytes) && self.seqs.len() > 1 {
            let Some((old, ..)) = self.seqs.pop_front() else { break };
            if let Some(g) = self.held.remove(&key(&old)) {
                self.held_events -= g.ids.len();
                self.held_bytes -= g.events.iter().map(|e| e.len()).sum::<usize>();
            }
            self.first += 1;
        }
        seq
    }

    /// The batch with this digest, if held.
    pub fn get(&self, digest: &Digest) -> Option<&Arc<Gossip>> {
        self.held.get(&key(digest)).filter(|g| g.digest == *digest)
    }

    /// The digest of batch `seq`, if a leader may name its events by it: stored within the
    /// newest half of what is held, so that the others, who get the batches in another order,
    /// still hold it too.
    pub fn referable(&self, seq: u64) -> Option<Digest> {
        let i = seq.checked_sub(self.first)?;
        let &(digest, end, end_bytes) = self.seqs.get(usize::try_from(i).ok()?)?;
        let recent = self.total - end < (self.max_events / 2) as u64
            && self.total_bytes - end_bytes < (self.max_bytes / 2) as u64;
        recent.then_some(digest)
    }
}

/// A proposal's batch: pooled events in arrival order, less the excluded ones (the events of
/// the blocks it extends that are not committed yet), up to `max_events` and `max_bytes`. A
/// leader builds it while the events arrive ([`Batch::offer`]), so that proposing takes it
/// whole instead of walking the pool on the commit's path.
#[derive(Clone, Debug)]
pub(crate) struct Batch {
    /// Ids excluded or taken.
    skip: HashSet<u128, IdHasher>,
    pub events: Vec<EventBytes>,
    /// `ids[i]` is the id of `events[i]`, `pooled[i]` when it was pooled, `sources[i]` the
    /// gossip batch it came in.
    pub ids: Vec<Digest>,
    pub pooled: Vec<Micros>,
    pub sources: Vec<Option<Source>>,
    bytes: usize,
    max_events: usize,
    max_bytes: usize,
    /// A cap was reached: nothing joins any more (as `take` stops at the first event over).
    closed: bool,
}

impl Batch {
    /// A batch of nothing, closed (a block that opens its tick empty).
    pub fn empty() -> Batch {
        Batch {
            skip: HashSet::default(),
            events: Vec::new(),
            ids: Vec::new(),
            pooled: Vec::new(),
            sources: Vec::new(),
            bytes: 0,
            max_events: 0,
            max_bytes: 0,
            closed: true,
        }
    }

    /// An event just pooled joins the batch, unless excluded or over a cap.
    pub fn offer(&mut self, id: &Digest, e: &EventBytes, pooled: Micros, source: Option<Source>) {
        if !self.closed && self.skip.insert(key(id)) {
            self.push(id, e, pooled, source);
        }
    }

    fn push(&mut self, id: &Digest, e: &EventBytes, pooled: Micros, source: Option<Source>) {
        if self.events.len() >= self.max_events || self.bytes + e.len() > self.max_bytes {
            self.closed = true;
            return;
        }
        self.bytes += e.len();
        self.events.push(e.clone());
        self.ids.push(*id);
        self.pooled.push(pooled);
        self.sources.push(source);
    }

    /// Leave out the events pooled after `before` (they go in a later batch). Events are
    /// offered in the order they are pooled, so these are the batch's last ones.
    pub fn pooled_by(&mut self, before: Micros) {
        let keep = self.pooled.partition_point(|at| *at <= before);
        self.pooled.truncate(keep);
        self.events.truncate(keep);
        self.ids.truncate(keep);
        self.sources.truncate(keep);
    }
}

/// Hashes uniform 128-bit ids with a secret key (a multiply-xorshift mix: the ids are already
/// cryptographic hashes, the key only keeps their bucket unpredictable to others).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher {
    key: [u64; 2],
}

impl IdHasher {
    pub fn new(secret: &[u8; 32]) -> IdHasher {
        let word = |i: usize| u64::from_le_bytes(secret[i..i + 8].try_into().expect("8 bytes"));
        IdHasher { key: [word(0), word(8)] }
    }
}

impl BuildHasher for IdHasher {
    type Hasher = IdHash;
    fn build_hasher(&self) -> IdHash {
        IdHash { key: self.key, state: 0 }
    }
}

#[derive(Debug)]
pub(crate) struct IdHash {
    key: [u64; 2],
    state: u64,
}

impl Hasher for IdHash {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let m = (self.state ^ x ^ self.key[0]).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.state = (m ^ (m >> 29) ^ self.key[1]).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    }

    fn write_u128(&mut self, x: u128) {
        self.write_u64(x as u64);
        self.write_u64((x >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.state ^ (self.state >> 31)
    }
}

/// A set of ids in 64 shards (by the ids' top bits, which are uniform). A hash table grows by
/// doubling and rehashing every entry at once: one table of the 300,000 ids a generation holds
/// at 1,000 events a tick stalled its validator for milliseconds at each of its last doublings
/// (the p99 commit latency). A shard's doubling moves a sixty-fourth of that.
#[derive(Clone, Debug)]
struct IdSet {
    shards: Vec<HashSet<u128, IdHasher>>,
}

impl Default for IdSet {
    fn default() -> IdSet {
        IdSet::new(IdHasher::default())
    }
}

impl IdSet {
    const SHARDS: usize = 64;

    fn new(h: IdHasher) -> IdSet {
        IdSet { shards: (0..Self::SHARDS).map(|_| HashSet::with_hasher(h)).collect() }
    }

    fn shard(id: u128) -> usize {
        (id >> 122) as usize % Self::SHARDS
    }

    fn contains(&self, id: &u128) -> bool {
        self.shards[Self::shard(*id)].contains(id)
    }

    fn insert(&mut self, id: u128) -> bool {
        self.shards[Self::shard(id)].insert(id)
    }

    /// Empty, keeping every shard's table (already at the size a generation needs).
    fn clear(&mut self) {
        for s in &mut self.shards {
            s.clear();
        }
    }
}

fn key(id: &Digest) -> u128 {
    let mut b = [0u8; 16];
    b.copy_from_slice(&id.0[..16]);
    u128::from_le_bytes(b)
}

impl Pool {
    /// An empty pool whose maps are keyed by `secret` (derive it from the validator's key).
    #[cfg(test)]
    pub fn new(secret: &[u8; 32]) -> Pool {
        Pool::with_batches(secret, 1 << 14, 1 << 24)
    }

    /// An empty pool that keeps gossip batches of up to `batch_events` events and
    /// `batch_bytes` of them in all.
    pub fn with_batches(secret: &[u8; 32], batch_events: usize, batch_bytes: usize) -> Pool {
        let h = IdHasher::new(secret);
        Pool {
            order: VecDeque::new(),
            events: HashMap::with_hasher(h),
            committed: IdSet::new(h),
            committed_old: IdSet::new(h),
            generation_from: None,
            batches: Batches::new(h, batch_events, batch_bytes),
        }
    }

    /// Add an event; its id if it is new, `None` if it was known, committed recently, or the
    /// pool is full. (One at a time: the reference [`Pool::insert_many`] is tested against.)
    #[cfg(test)]
    pub fn insert(&mut self, bytes: EventBytes, max_events: usize) -> Option<Digest> {
        let full = crate::types::event_id(&bytes);
        let id = key(&full);
        if !self.admits(id, max_events) {
            return None;
        }
        self.order.push_back(id);
        self.events.insert(id, (full, bytes, 0, None));
        Some(full)
    }

    /// [`Pool::insert`] of each event in turn, faster: the ids are hashed side by side, and the
    /// tables of committed ids are looked up for all the events before any is pooled. Those
    /// tables hold 300,000 ids a generation at 1,000 events a tick, out of cache, and one event
    /// at a time their misses came one after another (half of a validator's time taking in an
    /// event); in a loop that does nothing else, the CPU overlaps them.
    #[cfg(test)]
    pub fn insert_many(&mut self, events: &[EventBytes], max_events: usize, now: Micros) -> Vec<Option<Digest>> {
        let ids = event_ids(events);
        self.insert_ids(events, &ids, max_events, now, |_, _| None).into_iter().map(|n| n.map(|(d, _)| d)).collect()
    }

    /// Pool a gossip batch as it came ([`Pool::insert_many`]), and keep the batch whole: a
    /// leader may name any of its events as part of a run of it. The new events, with their
    /// ids and places in the batch.
    pub fn insert_gossip(
        &mut self,
        events: &[EventBytes],
        max_events: usize,
        now: Micros,
    ) -> Vec<Option<(Digest, Option<Source>)>> {
        let ids = event_ids(events);
        let digest = batch_digest(&ids);
        let known = self.batches.get(&digest).map(|g| g.seq);
        let seq = known.unwrap_or(self.batches.next_seq());
        let new = self.insert_ids(events, &ids, max_events, now, |i, _| Some(Source { seq, index: i as u32 }));
        if known.is_none() && !events.is_empty() {
            self.batches.store(digest, ids, events.to_vec());
        }
        new
    }

    /// Pool clients' events ([`Pool::insert_many`]): the new ones make the batch this validator
    /// sends the others, kept as they will keep it.
    pub fn insert_submitted(
        &mut self,
        events: &[EventBytes],
        max_events: usize,
        now: Micros,
    ) -> Vec<Option<(Digest, Option<Source>)>> {
        let ids = event_ids(events);
        let seq = self.batches.next_seq();
        let mut new = self.insert_ids(events, &ids, max_events, now, |_, n| Some(Source { seq, index: n as u32 }));
        let (new_ids, new_events): (Vec<Digest>, Vec<EventBytes>) =
            new.iter().zip(events).filter_map(|(n, e)| n.map(|(d, _)| (d, e.clone()))).unzip();
        if new_ids.is_empty() {
            return new;
        }
        let digest = batch_digest(&new_ids);
        let stored = self.batches.store(digest, new_ids, new_events);
        if stored != seq {
            // The same batch is held from before (events committed, forgotten after the dedup
            // window, and submitted again): its events are named by that batch.
            for (full, src) in new.iter_mut().flatten() {
                if let Some(src) = src {
                    src.seq = stored;
                }
                if let Some(entry) = self.events.get_mut(&key(full)) {
                    entry.3 = *src;
                }
            }
        }
        new
    }

    /// Pool `events` (`ids[i]` is the id of `events[i]`), the `i`th of which, the `n`th new one,
    /// came from `source(i, n)`.
    fn insert_ids(
        &mut self,
        events: &[EventBytes],
        ids: &[Digest],
        max_events: usize,
        now: Micros,
        source: impl Fn(usize, usize) -> Option<Source>,
    ) -> Vec<Option<(Digest, Option<Source>)>> {
        let recent: Vec<bool> = ids
            .iter()
            .map(|full| {
                let id = key(full);
                self.committed.contains(&id) || self.committed_old.contains(&id)
            })
            .collect();
        let mut out = Vec::with_capacity(events.len());
        let mut fresh = 0;
        for (i, ((full, recent), e)) in ids.iter().zip(recent).zip(events).enumerate() {
            let id = key(full);
            // As `admits`; the committed tables do not change while events are pooled.
            if recent || self.events.len() >= max_events || self.events.contains_key(&id) {
                out.push(None);
                continue;
            }
            let src = source(i, fresh);
            fresh += 1;
            self.order.push_back(id);
            self.events.insert(id, (*full, e.clone(), now, src));
            out.push(Some((*full, src)));
        }
        out
    }

    /// The pooled event with this id.
    pub fn get(&self, id: &Digest) -> Option<&EventBytes> {
        self.events.get(&key(id)).filter(|(full, ..)| full == id).map(|(_, bytes, ..)| bytes)
    }

    fn remove(&mut self, id: &u128) {
        self.events.remove(id);
    }

    #[cfg(test)]
    fn admits(&self, id: u128, max_events: usize) -> bool {
        !self.events.contains_key(&id)
            && !self.committed.contains(&id)
            && !self.committed_old.contains(&id)
            && self.events.len() < max_events
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Up to `max_events` / `max_bytes` of the oldest events not in `exclude` (lists of ids).
    pub fn take(&self, max_events: usize, max_bytes: usize, exclude: &[&[Digest]]) -> Vec<EventBytes> {
        self.batch(max_events, max_bytes, exclude).events
    }

    /// [`Pool::take`] as a [`Batch`] that events pooled later can join ([`Batch::offer`]).
    pub fn batch(&self, max_events: usize, max_bytes: usize, exclude: &[&[Digest]]) -> Batch {
        // Sized once: growing it by doubling while filling cost a leader more than the lookups.
        let taking = max_events.min(self.events.len());
        let excluded: usize = exclude.iter().map(|l| l.len()).sum();
        let mut b = Batch {
            skip: HashSet::with_capacity_and_hasher(excluded + taking, *self.events.hasher()),
            events: Vec::with_capacity(taking),
            ids: Vec::with_capacity(taking),
            pooled: Vec::with_capacity(taking),
            sources: Vec::with_capacity(taking),
            bytes: 0,
            max_events,
            max_bytes,
            closed: false,
        };
        b.skip.extend(exclude.iter().flat_map(|l| l.iter()).map(key));
        for id in &self.order {
            if b.closed {
                break;
            }
            // Excluded first (a smaller table than the pool's): the parent's events are at the
            // front of the queue. The queue may also hold a stale copy of an id that was
            // committed and re-submitted, hence the insert.
            if !b.skip.insert(*id) {
                continue;
            }
            let Some((full, e, at, source)) = self.events.get(id) else { continue };
            b.push(full, e, *at, *source);
        }
        b
    }

    /// Events of a finalized block leave the pool and are remembered for at least `window`
    /// ticks (and at most `2 * window`).
    pub fn committed(&mut self, tick: Tick, ids: &[Digest], window: u64) {
        let from = *self.generation_from.get_or_insert(tick);
        if tick >= from + window.max(1) {
            // The older generation is forgotten and its table reused, already at full size: a
            // fresh table grew by doubling while the generation filled, and rehashing its
            // last doublings (to 300,000 ids at 1,000 events a tick) stalled a validator for
            // milliseconds, twice a window.
            std::mem::swap(&mut self.committed, &mut self.committed_old);
            self.committed.clear();
            self.generation_from = Some(tick);
        }
        for id in ids.iter().map(key) {
            self.remove(&id);
            self.committed.insert(id);
        }
        // The committed events are usually the oldest: drop them from the queue's front now, so
        // that `batch` does not look each up again (a thousand misses for a leader).
        while self.order.front().is_some_and(|id| !self.events.contains_key(id)) {
            self.order.pop_front();
        }
        // `batch` skips ids no longer pooled; compact the order queue once it is mostly stale.
        if self.order.len() > 2 * self.events.len() + 1024 {
            self.order.retain(|id| self.events.contains_key(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::event_id;

    /// Pooling a batch at once answers as pooling its events one at a time: with duplicates
    /// inside the batch, events already pooled, events committed in either generation, and
    /// the pool filling up part way through.
    #[test]
    fn insert_many_is_insert_one_at_a_time() {
        let ev = |i: u32| -> EventBytes { format!("event {i}").into_bytes().into() };
        let mut many = Pool::new(&[8; 32]);
        for i in 0..50 {
            many.insert(ev(i), 1_000);
        }
        let older: Vec<Digest> = (0..10).map(|i| event_id(&ev(i))).collect();
        many.committed(Tick(1), &older, 5);
        let newer: Vec<Digest> = (10..20).map(|i| event_id(&ev(i))).collect();
        many.committed(Tick(7), &newer, 5);
        let mut one = many.clone();
        // 0..20 committed (older and newer generation), 20..50 pooled, then 40 new ones and
        // repeats of all of these; the cap (60 pooled) falls inside the batch.
        assert_eq!(many.len(), 30);
        let batch: Vec<EventBytes> = (0..120).map(|k| ev((k * 37) % 90)).collect();
        let got = many.insert_many(&batch, 60, 0);
        let want: Vec<Option<Digest>> = batch.iter().map(|e| one.insert(e.clone(), 60)).collect();
        assert_eq!(got, want);
        assert!(got.iter().any(Option::is_some) && got.iter().any(Option::is_none));
        assert_eq!(many.len(), 60, "filled to the cap");
        assert_eq!(many.take(1_000, 1 << 20, &[]), one.take(1_000, 1 << 20, &[]), "the same arrival order");
    }

    fn ev(b: &[u8]) -> EventBytes {
        b.into()
    }

    #[test]
    fn dedups_bounds_and_forgets_committed_after_the_window() {
        let mut p = Pool::new(&[7; 32]);
        assert!(p.insert(ev(b"a"), 2).is_some());
        assert!(p.insert(ev(b"a"), 2).is_none(), "duplicate");
        assert!(p.insert(ev(b"b"), 2).is_some());
        assert!(p.insert(ev(b"c"), 2).is_none(), "full");
        assert_eq!(p.take(10, 1 << 20, &[]), vec![ev(b"a"), ev(b"b")]);
        let a = event_id(b"a");
        assert_eq!(p.take(10, 1 << 20, &[&[a]]), vec![ev(b"b")]);
        p.committed(Tick(5), &[a], 10);
        assert_eq!(p.len(), 1);
        assert!(p.insert(ev(b"a"), 9).is_none(), "committed recently");
        p.committed(Tick(14), &[], 10);
        assert!(p.insert(ev(b"a"), 9).is_none(), "remembered for the window");
        p.committed(Tick(16), &[], 10);
        p.committed(Tick(25), &[], 10);
        assert!(p.insert(ev(b"a"), 9).is_none(), "remembered for less than twice the window");
        p.committed(Tick(26), &[], 10);
        assert!(p.insert(ev(b"a"), 9).is_some(), "forgotten after twice the window");
    }

    #[test]
    fn a_batch_that_events_join_as_they_come_is_what_take_gives_after() {
        let mut p = Pool::new(&[5; 32]);
        let evs: Vec<EventBytes> = (0..300u32).map(|i| format!("ev {i:03}").into_bytes().into()).collect();
        let ids: Vec<Digest> = evs.iter().map(|e| event_id(e)).collect();
        // Excluded (in a parent block): one pooled before the batch starts, two after.
        let excluded = [ids[3], ids[150], ids[299]];
        for e in &evs[..100] {
            assert!(p.insert(e.clone(), 1_000).is_some());
        }
        // No cap, a cap on events, a cap on bytes (6 bytes an event).
        for (max_events, max_bytes, expect) in [(1_000, 1 << 20, 297), (120, 1 << 20, 120), (1_000, 6 * 130 + 3, 130)] {
            let mut pool = p.clone();
            let mut b = pool.batch(max_events, max_bytes, &[&excluded]);
            for e in &evs[100..] {
                if let Some(id) = pool.insert(e.clone(), 1_000) {
                    b.offer(&id, e, 0, None);
                }
            }
            // An event offered twice joins once.
            b.offer(&ids[120], &evs[120], 0, None);
            let taken = pool.take(max_events, max_bytes, &[&excluded]);
            assert_eq!(b.events.len(), expect);
            assert_eq!(b.events, taken);
            assert_eq!(b.ids, taken.iter().map(|e| event_id(e)).collect::<Vec<_>>());
        }
    }

    /// A batch keeps when each event was pooled, whether it was taken from the pool or joined
    /// later, and can leave out those pooled after a time (the batch's last ones).
    #[test]
    fn a_batch_leaves_out_the_events_pooled_after_a_time() {
        let mut p = Pool::new(&[4; 32]);
        let evs: Vec<EventBytes> = (0..10u32).map(|i| format!("ev {i}").into_bytes().into()).collect();
        let got = p.insert_many(&evs[..4], 100, 10);
        assert!(got.iter().all(Option::is_some));
        let mut b = p.batch(100, 1 << 20, &[]);
        for (k, e) in evs[4..].iter().enumerate() {
            let at = 20 + 10 * k as Micros; // 20, 30, ... 70
            if let Some(id) = p.insert_many(std::slice::from_ref(e), 100, at)[0] {
                b.offer(&id, e, at, None);
            }
        }
        assert_eq!(b.pooled, vec![10, 10, 10, 10, 20, 30, 40, 50, 60, 70]);
        let mut early = b.clone();
        early.pooled_by(35);
        assert_eq!(early.events, evs[..6].to_vec());
        assert_eq!(early.ids, b.ids[..6].to_vec());
        assert_eq!(early.pooled, vec![10, 10, 10, 10, 20, 30]);
        let mut none = b.clone();
        none.pooled_by(9);
        assert!(none.events.is_empty() && none.ids.is_empty());
        b.pooled_by(70);
        assert_eq!(b.events, evs);
        // The pool's own batch has the same times.
        assert_eq!(p.batch(100, 1 << 20, &[]).pooled, b.pooled);
    }

    #[test]
    fn committed_events_leave_the_pool_and_the_rest_are_taken_in_order_with_their_ids() {
        let mut p = Pool::new(&[3; 32]);
        let pooled: Vec<EventBytes> = (0..50u32).map(|i| format!("event {i}").into_bytes().into()).collect();
        for e in &pooled {
            assert!(p.insert(e.clone(), 1_000).is_some());
        }
        let ids: Vec<Digest> = pooled.iter().map(|e| event_id(e)).collect();
        assert_eq!(p.get(&ids[7]), Some(&pooled[7]));
        // A digest sharing the pool's 128-bit key but not the rest is not taken for the event.
        let mut near = ids[7];
        near.0[31] ^= 1;
        assert_eq!(p.get(&near), None);
        p.committed(Tick(1), &ids[..10], 5);
        assert_eq!(p.len(), 40);
        assert_eq!(p.get(&ids[3]), None);
        let Batch { events: taken, ids: taken_ids, .. } = p.batch(100, 1 << 20, &[]);
        assert_eq!(taken, pooled[10..].to_vec());
        assert_eq!(taken_ids, ids[10..].to_vec());
    }

    #[test]
    fn committed_ids_in_every_shard_are_remembered_for_the_window_and_then_forgotten() {
        let mut p = Pool::new(&[9; 32]);
        let events: Vec<Vec<u8>> = (0..5_000u32).map(|i| i.to_le_bytes().to_vec()).collect();
        let ids: Vec<Digest> = events.iter().map(|e| event_id(e)).collect();
        let shards: HashSet<usize> = ids.iter().map(|id| IdSet::shard(key(id))).collect();
        assert_eq!(shards.len(), IdSet::SHARDS, "5,000 ids reach every shard");
        p.committed(Tick(1), &ids[..2_500], 10);
        p.committed(Tick(11), &ids[2_500..], 10); // a new generation: the first half is in the old one
        assert!(events.iter().all(|e| p.insert(e[..].into(), 100_000).is_none()), "all remembered");
        p.committed(Tick(21), &[], 10); // the first half is forgotten, its table reused
        assert!(events[..2_500].iter().all(|e| p.insert(e[..].into(), 100_000).is_some()));
        assert!(events[2_500..].iter().all(|e| p.insert(e[..].into(), 100_000).is_none()));
    }

    fn evs(tag: &str, n: u32) -> Vec<EventBytes> {
        (0..n).map(|i| format!("{tag} {i}").into_bytes().into()).collect()
    }

    /// A peer's batch is kept whole (duplicates and committed events too: a leader may have
    /// pooled any of them from it) and named by its ids; each new event remembers its place in
    /// it. A client batch's new events make the batch this validator sends, named likewise.
    #[test]
    fn events_remember_the_gossip_batch_they_came_in_and_its_place() {
        let mut p = Pool::new(&[1; 32]);
        let a = evs("a", 6);
        // a[1] pooled before, a[2] committed: both stay in the batch, neither is new.
        p.insert_many(&a[1..2], 100, 0);
        p.committed(Tick(1), &[event_id(&a[2])], 10);
        let got = p.insert_gossip(&a, 100, 5);
        let new: Vec<usize> = (0..6).filter(|i| got[*i].is_some()).collect();
        assert_eq!(new, vec![0, 3, 4, 5]);
        let ids: Vec<Digest> = a.iter().map(|e| event_id(e)).collect();
        let g = p.batches.get(&batch_digest(&ids)).expect("kept, named by its ids").clone();
        assert_eq!((g.ids.clone(), g.events.clone()), (ids.clone(), a.clone()));
        for i in new {
            let (id, source) = got[i].expect("new");
            assert_eq!(id, ids[i]);
            assert_eq!(source, Some(Source { seq: g.seq, index: i as u32 }), "event {i}");
        }
        // A batch sent again is one batch, the same number.
        assert!(p.insert_gossip(&a, 100, 6).iter().all(Option::is_none));
        assert_eq!(p.batches.next_seq(), g.seq + 1);
        // Clients' events: a[0] again and three new ones; the batch is the new ones.
        let mut b = evs("b", 3);
        b.insert(1, a[0].clone());
        let got = p.insert_submitted(&b, 100, 7);
        assert!(got[1].is_none());
        let sent: Vec<EventBytes> = vec![b[0].clone(), b[2].clone(), b[3].clone()];
        let sent_ids: Vec<Digest> = sent.iter().map(|e| event_id(e)).collect();
        let g = p.batches.get(&batch_digest(&sent_ids)).expect("the batch sent").clone();
        assert_eq!(g.events, sent);
        let places: Vec<u32> = got.iter().flatten().map(|(_, s)| s.expect("placed").index).collect();
        assert_eq!(places, vec![0, 1, 2]);
        // The leader's batch carries each event's place (a[1] was pooled with none).
        let taken = p.batch(100, 1 << 20, &[]);
        assert_eq!(taken.sources.len(), taken.events.len());
        for (e, source) in taken.events.iter().zip(&taken.sources) {
            assert_eq!(source.is_some(), *e != a[1]);
        }
    }

    /// Batches are dropped oldest first beyond the cap; a leader names only those stored within
    /// the newest half (the others hold them too, whatever order the batches reached them in).
    #[test]
    fn gossip_batches_are_dropped_oldest_first_and_named_while_recent() {
        let mut p = Pool::with_batches(&[2; 32], 40, 1 << 20);
        let mut seqs = Vec::new();
        let mut digests = Vec::new();
        for k in 0..10 {
            let b = evs(&format!("batch {k}"), 10);
            let got = p.insert_gossip(&b, 1_000, k);
            seqs.push(got[0].expect("new").1.expect("placed").seq);
            digests.push(batch_digest(&b.iter().map(|e| event_id(e)).collect::<Vec<_>>()));
        }
        // 40 events held: the newest four batches.
        for (k, d) in digests.iter().enumerate() {
            assert_eq!(p.batches.get(d).is_some(), k >= 6, "batch {k} held");
        }
        // Named by: the newest two (fewer than 20 events stored after them).
        for (k, (seq, d)) in seqs.iter().zip(&digests).enumerate() {
            assert_eq!(p.batches.referable(*seq), (k >= 8).then_some(*d), "batch {k} named");
        }
        assert_eq!(p.batches.referable(seqs[9] + 1), None, "not stored yet");
        // The same by bytes: ten batches of ten 9-byte events ("batch k i"), 400 bytes kept.
        let mut p = Pool::with_batches(&[2; 32], 1_000, 400);
        let mut digests = Vec::new();
        for k in 0..10 {
            let b = evs(&format!("batch {k}"), 10);
            assert_eq!(b.iter().map(|e| e.len()).sum::<usize>(), 90);
            p.insert_gossip(&b, 1_000, k);
            digests.push(batch_digest(&b.iter().map(|e| event_id(e)).collect::<Vec<_>>()));
        }
        for (k, d) in digests.iter().enumerate() {
            assert_eq!(p.batches.get(d).is_some(), k >= 6, "batch {k} held by bytes");
        }
    }

    #[test]
    fn the_hasher_depends_on_the_secret_and_spreads_ids() {
        let a = IdHasher::new(&[1; 32]);
        let b = IdHasher::new(&[2; 32]);
        let id = 0x1234_5678_9abc_def0_u128;
        assert_ne!(a.hash_one(id), b.hash_one(id));
        // Ids that differ only in their high half still land in different buckets.
        let buckets: HashSet<u64> = (0..1_000u128).map(|i| a.hash_one(i << 64) & 1023).collect();
        assert!(buckets.len() > 500, "{} buckets of 1,024 used by 1,000 ids", buckets.len());
    }
}
