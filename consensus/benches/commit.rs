//! `cargo bench -p metatopia-consensus`
//!
//! The commit path of one tick at 1,000 events, piece by piece, on four validators driven by
//! hand in one thread (no network, no scheduler: what each step costs a validator's core).
//! Messages go through their wire encoding, as between machines.
//!
//! - `commit_path/ingest_1000`: one validator taking in a tick's 1,000 events (its own 250 from
//!   clients, 3 × 250 gossiped by the others, decoded from the wire).
//! - `commit_path/propose_1000`: the leader building, signing and encoding its proposal.
//! - `commit_path/rebuild_1000`: a follower decoding the compact proposal, rebuilding the block
//!   from its pool, checking it and voting.
//! - `commit_path/finish_1000`: everything else of the tick, all four validators together
//!   (votes, certificates, commit, signature checks).
//! - `raw/blake3_ids_1000`: the `blake3` crate hashing the 1,000 events one call each (the ids
//!   every validator computes at ingestion): the raw-library baseline.
//! - `raw/ed25519_verify_strict`, `raw/ed25519_sign`: `ed25519-dalek` checking one signature
//!   (as votes were checked), and making one; `strict/verify_from_key_table`: the same check
//!   as the validators make it now, with the same verdicts, from a table kept per key. A tick's critical path holds two checks and two
//!   signatures per validator (the notarization's other votes, before finalizing on it; its
//!   own notarize and finalize votes).

// Benchmarks measure wall time; the no-clock rule is for the simulation itself.
#![allow(clippy::disallowed_methods)]

/// The node binary's allocator, so the figures are the node's.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use metatopia_consensus::strict::KeyTable;
use metatopia_consensus::{
    Config, Message, Output, Piece, SigCache, Signed, SigningKey, Validator, ValidatorIndex, event_id,
};

const N: usize = 4;
const EVENTS: usize = 1_000;
const PERIOD: u64 = 16_666;

/// Time spent in each piece of one tick.
#[derive(Default, Clone, Copy)]
struct Pieces {
    ingest: Duration,
    propose: Duration,
    rebuild: Duration,
    finish: Duration,
}

struct Cluster {
    vs: Vec<Validator>,
    now: u64,
    next_event: u64,
    committed: u64,
}

fn key(i: usize) -> SigningKey {
    SigningKey::from_bytes(&[i as u8 + 1; 32])
}

impl Cluster {
    fn new() -> Cluster {
        let keys: Vec<_> = (0..N).map(|i| key(i).verifying_key()).collect();
        let vs = (0..N)
            .map(|i| {
                let cfg = Config {
                    period_us: PERIOD,
                    leader_timeout_us: 10_000_000,
                    notarize_timeout_us: 20_000_000,
                    retry_us: 10_000_000,
                    max_batch_events: 2 * EVENTS,
                    // Each validator checks signatures itself, as on separate machines.
                    sig_cache: Arc::new(SigCache::new()),
                    ..Config::default()
                };
                Validator::new(cfg, key(i), keys.clone(), 0)
            })
            .collect();
        Cluster { vs, now: 0, next_event: 0, committed: 0 }
    }

    /// A client event of a signed sim event's size (~108 bytes), unique.
    fn event(&mut self) -> Vec<u8> {
        self.next_event += 1;
        let mut e = vec![0u8; 108];
        e[..8].copy_from_slice(&self.next_event.to_le_bytes());
        e[8..16].copy_from_slice(&self.next_event.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
        e
    }

    /// Every validator's outputs as wire frames: (from, to, bytes).
    fn mail(&mut self) -> Vec<(usize, usize, Vec<u8>)> {
        let mut out = Vec::new();
        for (i, v) in self.vs.iter_mut().enumerate() {
            while let Some(o) = v.poll_output() {
                match o {
                    Output::Broadcast(m) => {
                        let bytes = m.encode();
                        out.extend((0..N).filter(|j| *j != i).map(|j| (i, j, bytes.clone())));
                    }
                    Output::Send(to, m) => out.push((i, to.0 as usize, m.encode())),
                    Output::Committed(_) => self.committed += 1,
                    _ => {}
                }
            }
        }
        out
    }

    fn deliver(&mut self, (from, to, bytes): (usize, usize, Vec<u8>)) {
        let m = Message::decode(&bytes, 1 << 24).expect("a good frame");
        self.vs[to].handle_message(self.now, ValidatorIndex(from as u16), m);
    }

    /// Fire every timer due by `now`, except the leader's own proposal.
    fn timers(&mut self) {
        for v in &mut self.vs {
            if v.poll_timeout().is_some_and(|t| t <= self.now) {
                v.handle_timeout(self.now);
            }
        }
    }

    fn quiet(&mut self) {
        loop {
            let mail = self.mail();
            if mail.is_empty() {
                return;
            }
            for m in mail {
                self.deliver(m);
            }
        }
    }

    /// One tick: its events come in, the leader proposes, everyone commits.
    fn tick(&mut self) -> Pieces {
        let mut p = Pieces::default();
        self.quiet();
        // The tick's events: 250 from clients at each validator, gossiped to the others.
        let shares: Vec<Vec<Vec<u8>>> = (0..N).map(|_| (0..EVENTS / N).map(|_| self.event()).collect()).collect();
        for (i, share) in shares.into_iter().enumerate() {
            let t = Instant::now();
            self.vs[i].submit_events(self.now, share);
            if i == 1 {
                p.ingest += t.elapsed();
            }
        }
        for (from, to, bytes) in self.mail() {
            let t = Instant::now();
            self.deliver((from, to, bytes));
            if to == 1 {
                p.ingest += t.elapsed();
            }
        }
        self.quiet();
        // The leader proposes when its tick is due on its own schedule (kept from the chain's
        // BFT times). The clock moves to the leader's next timer, every other timer firing on
        // the way, and each validator settles the last commit first (its pool forgets the
        // committed events at its next input), so only the proposal is timed; a timer of the
        // leader's that is not its proposal is handled and the clock moves on.
        let leader = self.vs[0].leader(self.vs[0].view()).0 as usize;
        let (proposal, inner) = loop {
            let due = self.vs[leader].poll_timeout().expect("the leader has a timer");
            assert!(due < self.now + 4 * PERIOD, "the leader's proposal is due within a few periods");
            while self.now + PERIOD / 16 < due {
                self.now += PERIOD / 16;
                self.timers();
                self.quiet();
            }
            self.now = self.now.max(due - 1);
            for v in &mut self.vs {
                v.submit_events(self.now, Vec::<Vec<u8>>::new());
            }
            self.quiet();
            self.now = self.now.max(due);
            let t = Instant::now();
            self.vs[leader].handle_timeout(self.now);
            let out = self.mail();
            p.propose = t.elapsed();
            match out.first().and_then(|(_, _, bytes)| Message::decode(bytes, 1 << 24).ok()) {
                Some(Message::Authenticated { inner, .. }) if matches!(*inner, Signed::ProposeRefs { .. }) => {
                    break (out, inner);
                }
                _ => {
                    for m in out {
                        self.deliver(m);
                    }
                    self.quiet();
                }
            }
        };
        let Signed::ProposeRefs { pieces, .. } = *inner else { panic!("a compact proposal") };
        assert_eq!(pieces.iter().map(|p| p.len()).sum::<usize>(), EVENTS, "the tick's events");
        assert!(pieces.iter().all(|p| matches!(p, Piece::Run { .. })), "named by runs of gossip batches");
        let follower = (leader + 1) % N;
        let mut rest = Vec::new();
        for m in proposal {
            if m.1 == follower {
                let t = Instant::now();
                self.deliver(m);
                p.rebuild = t.elapsed();
            } else {
                rest.push(m);
            }
        }
        let t = Instant::now();
        for m in rest {
            self.deliver(m);
        }
        self.quiet();
        // The signature checks fall due a sixteenth of a period later.
        self.now += PERIOD / 16;
        self.timers();
        self.quiet();
        p.finish = t.elapsed();
        p
    }
}

fn commit_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("commit_path");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    type Pick = fn(&Pieces) -> Duration;
    let pieces: [(&str, Pick); 4] = [
        ("ingest_1000", |p| p.ingest),
        ("propose_1000", |p| p.propose),
        ("rebuild_1000", |p| p.rebuild),
        ("finish_1000", |p| p.finish),
    ];
    for (name, pick) in pieces {
        let mut cluster = Cluster::new();
        for _ in 0..20 {
            cluster.tick(); // warm: blocks, pools and the dedup window in their steady state
        }
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let before = cluster.committed;
                let total = (0..iters).map(|_| pick(&cluster.tick())).sum();
                assert!(cluster.committed >= before + iters * N as u64 - N as u64, "ticks commit");
                total
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group("raw");
    let mut cluster = Cluster::new();
    let events: Vec<Vec<u8>> = (0..EVENTS).map(|_| cluster.event()).collect();
    g.bench_function("blake3_ids_1000", |b| b.iter(|| events.iter().map(|e| event_id(e)).collect::<Vec<_>>()));
    // A vote's signature, checked and made.
    let (k, msg) = (key(0), [7u8; 96]);
    let (vk, sig) = (k.verifying_key(), ed25519_dalek::Signer::sign(&k, &msg));
    g.bench_function("ed25519_verify_strict", |b| {
        b.iter(|| vk.verify_strict(std::hint::black_box(&msg), &sig).is_ok())
    });
    g.bench_function("ed25519_sign", |b| b.iter(|| ed25519_dalek::Signer::sign(&k, std::hint::black_box(&msg))));
    g.finish();
    // The same check as the validators make it: the same verdicts, from a table of the key.
    let mut g = c.benchmark_group("strict");
    let table = KeyTable::new(&vk);
    let (r, s) = (*sig.r_bytes(), *sig.s_bytes());
    g.bench_function("verify_from_key_table", |b| b.iter(|| table.verify(std::hint::black_box(&msg), &r, &s)));
    g.finish();
}

criterion_group!(benches, commit_path);
criterion_main!(benches);
