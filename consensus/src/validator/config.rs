//! The validator's tuning, and where an epoch starts.

use ed25519_dalek::VerifyingKey;
use serde::{Deserialize, Serialize};

use crate::types::{Block, Certificate, Digest, Micros, Tick};

/// Tuning. Times are in microseconds of the caller's clock.
#[derive(Clone, Debug)]
pub struct Config {
    /// A leader proposes no sooner than the parent's BFT time plus this (one tick period).
    pub period_us: Micros,
    /// Nullify a view whose proposal has not arrived this long after entering it.
    pub leader_timeout_us: Micros,
    /// Nullify a view not notarized this long after entering it.
    pub notarize_timeout_us: Micros,
    /// While stuck, re-send own votes and the latest certificates this often.
    pub retry_us: Micros,
    /// A proposal's BFT time may be at most this far ahead of the voter's clock.
    pub max_drift_ms: u64,
    pub max_batch_events: usize,
    pub max_batch_bytes: usize,
    pub max_event_bytes: usize,
    pub max_pool_events: usize,
    /// Committed event ids remembered (for dedup) this many ticks.
    pub dedup_window_ticks: u64,
    /// Finalized blocks kept to answer fetches from laggards: the newest `keep_blocks`...
    pub keep_blocks: u64,
    /// ... and of those no more than `keep_bytes` of blocks (their events, ids and headers),
    /// dropping the oldest first; the newest `keep_blocks_min` are kept whatever their size.
    /// A laggard further behind takes a snapshot (the node's catch-up), not every block. A
    /// restarted validator gets the blocks it handed out back ([`Validator::recall`](crate::Validator::recall)).
    pub keep_bytes: u64,
    /// The newest finalized blocks kept whatever `keep_bytes` says: a laggard a few ticks
    /// behind (a lost message, a short stall) catches up by fetching them.
    pub keep_blocks_min: u64,
    /// BFT time of genesis, in milliseconds.
    pub genesis_time_ms: u64,
    /// Distinguishes chains (a sim id): part of the genesis digest.
    pub chain_id: u64,
    /// Signature verdicts, shareable (a simulated cluster shares one; a node keeps its own).
    pub sig_cache: std::sync::Arc<crate::types::SigCache>,
    /// Backpressure from execution: a leader proposes only while at most `max_exec_lag` of the
    /// blocks it extends were handed out for execution and wait for their roots
    /// ([`Validator::report_root`](crate::Validator::report_root)); blocks not handed out yet (waiting for a child to commit)
    /// do not count, or agreement and execution could wait for each other. When execution is
    /// slow, ticks come later (time dilation) instead of execution falling ever further behind
    /// agreement. `None`: no backpressure (an application that never reports).
    pub max_exec_lag: Option<u64>,
    /// The last tick this instance decides (an epoch's end): it never proposes or votes for a
    /// block beyond it, and goes quiet once that block is finalized. `None`: no end.
    pub last_tick: Option<Tick>,
    /// Start after a previous epoch's last block instead of at genesis.
    pub anchor: Option<Anchor>,
    /// A leader sends its proposal compact, its events named as runs of the gossip batches
    /// they came in ([`Message::ProposeRefs`](crate::Message::ProposeRefs)), rather than the events themselves (`false`: full
    /// blocks, as before; kept for comparison).
    pub compact_proposals: bool,
    /// Votes and proposals go out with an authenticator (a MAC per validator, from pairwise
    /// keys; [`Message::Authenticated`](crate::Message::Authenticated)): a receiver counts them on the MAC and checks their
    /// signatures `period_us / 16` later, off the commit's path (`false`: every vote's signature
    /// is checked before it counts, as before; kept for comparison).
    pub vote_macs: bool,
    /// A block may cover this much time of ticks (R1 spans): a leader whose proposal comes
    /// later than one period after its parent (a network round trip longer than a period, a
    /// view that timed out) claims every tick due by then, up to this, so the sim keeps its
    /// rate whatever the latency; the ticks before the block's own are handed out empty. Below
    /// one period (the default, 0): one tick per block.
    pub max_span_us: Micros,
    /// R1 fills: a leader whose notarizations come within half a period opens each tick with
    /// an empty block, and the tick's events follow in a second block, a *fill*, this long
    /// before the next tick is due (or a round and a half when rounds are slower; at most half
    /// a period), so the tick is handed out soon after: an event waits about half a period for
    /// its block and this lead and a round for the next, not a whole period more. 0 (the
    /// default): off.
    pub fill_lead_us: Micros,
    /// Leaders are chosen among the validators the committed chain shows alive and not
    /// failing (`leaders`: a crashed validator stops leading); `false`: plain round robin.
    pub leader_reputation: bool,
    /// Validators that start this instance demoted (they lead once the chain shows them
    /// alive): the previous epoch's, from [`Validator::demoted`](crate::Validator::demoted).
    pub demoted: Vec<VerifyingKey>,
    /// Test-only planted bug: accept 2f votes as a quorum. The Byzantine suite must catch it.
    #[cfg(feature = "mocks")]
    pub planted_bug_weak_quorum: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            period_us: 33_333,
            leader_timeout_us: 200_000,
            notarize_timeout_us: 400_000,
            retry_us: 200_000,
            max_drift_ms: 500,
            max_batch_events: 4_096,
            max_batch_bytes: 4 << 20,
            max_event_bytes: 96 * 1024,
            max_pool_events: 100_000,
            dedup_window_ticks: 300,
            keep_blocks: 2_048,
            keep_bytes: 256 << 20,
            keep_blocks_min: 64,
            genesis_time_ms: 0,
            chain_id: 0,
            sig_cache: Default::default(),
            max_exec_lag: None,
            last_tick: None,
            anchor: None,
            compact_proposals: true,
            vote_macs: true,
            max_span_us: 0,
            fill_lead_us: 0,
            leader_reputation: true,
            demoted: Vec::new(),
            #[cfg(feature = "mocks")]
            planted_bug_weak_quorum: false,
        }
    }
}

/// Where an epoch starts: the previous epoch's last block, finalized there, with a notarization
/// of it by the previous validator set (the new epoch's first block carries it, and its hash
/// seeds that last block's canonical order).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Anchor {
    pub epoch: u64,
    pub block: Block,
    pub notarization: Certificate,
    pub prev_keys: Vec<[u8; 32]>,
    /// The previous epoch's chain digest (its votes are signed under it).
    pub prev_chain: Digest,
}
