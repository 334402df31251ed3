//! What the core hands the I/O shell ([`CoreOutput`]), and what it reports: a divergence
//! ([`DesyncReport`]), a refused submission ([`SubmitError`]), its counters ([`CoreStats`]).

use std::collections::BTreeMap;

use metatopia_consensus::ValidatorIndex;
use metatopia_sim::state::SubsystemRoots;
use metatopia_sim::{Batch, Hash32, Tick};

use crate::net::wire::NodeMsg;

/// What the I/O shell must do.
#[derive(Clone, Debug)]
pub enum CoreOutput {
    Broadcast(NodeMsg),
    Send(ValidatorIndex, NodeMsg),
    /// Tick `tick` was committed: log it (before its root is reported to peers).
    Committed(Box<crate::store::LogRecord>),
    /// Tick `tick` was executed and reached `root`.
    Executed {
        tick: Tick,
        root: Hash32,
        accepted: u32,
        rejected: u32,
        /// What was said this tick (by avatars and scripts).
        chat: Vec<metatopia_sim::ChatLine>,
        /// Avatars that crossed into a neighbour sim this tick: their accounts and that sim
        /// (clients following them move to a node of it).
        avatars_left: Vec<(metatopia_sim::AccountId, metatopia_sim::SimId)>,
        /// Script operations the tick ran and inputs it queued for the next (its cost, the
        /// same on every node).
        script_operations: u64,
        queued: u32,
    },
    /// A peer reported a different root for a tick, but fewer than f+1 did: the peer is faulty.
    PeerDiverged {
        tick: Tick,
        validator: ValidatorIndex,
    },
    /// This node diverged: it has stopped executing. Write the report; the core resyncs.
    Desync(Box<DesyncReport>),
    /// This validator's signed copy of its sim's mail of a tick for the neighbour sim `to`
    /// (an encoded [`SignedEvent`](metatopia_sim::event::SignedEvent)); send it to a validator of `to` as [`NodeMsg::Mail`].
    Mail {
        to: metatopia_sim::SimId,
        tick: Tick,
        event: Vec<u8>,
    },
    /// The sim's state as of tick `tick` (ticks below it executed), taken the moment tick
    /// `tick - 1` executed, every [`NodeCore::snapshots_every`](crate::core::NodeCore::snapshots_every)
    /// ticks: write it (the state a restart loads). Taken here rather than when the shell gets
    /// to it, as the core may have executed further ticks by then.
    Snapshot {
        tick: Tick,
        bytes: Vec<u8>,
    },
    /// No tick committed for `quiet_us` (said every [`STALL_WARN_US`](crate::core::finish::STALL_WARN_US)
    /// while it lasts): where agreement stands (`agreement`, its one-line description).
    Stalled {
        quiet_us: metatopia_consensus::Micros,
        agreement: String,
    },
    /// A node asked to stop after a tick ([`NodeCore::execute_until`](crate::core::NodeCore::execute_until))
    /// executed it: what it says while it waits for its peers, and when to stop.
    Finishing(crate::core::finish::Finish),
    /// This node took a snapshot of tick `tick` whose root `certified_by` other validators
    /// reported, replayed the commits since, and executes again.
    Resynced {
        tick: Tick,
        certified_by: usize,
        snapshot: Vec<u8>,
        /// The node was joining the sim (rather than recovering from a divergence).
        joined: bool,
    },
}

/// Everything needed to find out why a node diverged (DESIGN §4).
#[derive(Clone, Debug)]
pub struct DesyncReport {
    pub tick: Tick,
    pub mine: Hash32,
    /// The roots the peers reported for `tick`.
    pub theirs: BTreeMap<ValidatorIndex, Hash32>,
    /// This node's per-subsystem roots after executing `tick` (if still remembered).
    pub subsystems: Option<SubsystemRoots>,
    /// This node's snapshot after `tick`, encoded.
    pub snapshot: Vec<u8>,
    /// The last committed batches executed, oldest first.
    pub last_inputs: Vec<Batch>,
}

/// Why a client's event was not taken into the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubmitError {
    Undecodable(String),
    OtherSim {
        event: u32,
        here: u32,
    },
    BadSignature,
    /// What execution would refuse whatever the tick (size, fields, nonce, a ban).
    Refused(String),
    /// Not mail from a validator of a neighbour sim (on the neighbours' path).
    NotMail,
    /// A copy of neighbour mail the sim has already delivered.
    Late,
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::Undecodable(e) => write!(f, "not a signed event: {e}"),
            SubmitError::OtherSim { event, here } => {
                write!(f, "the event is for sim {event}; this node runs sim {here}")
            }
            SubmitError::BadSignature => f.write_str("the signature does not verify"),
            SubmitError::Refused(reason) => write!(f, "refused: {reason}"),
            SubmitError::NotMail => f.write_str("not mail signed by a validator of a neighbour sim"),
            SubmitError::Late => f.write_str("the sim already has this mail"),
        }
    }
}

impl std::error::Error for SubmitError {}

/// Counters for `stats` and `/metrics`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreStats {
    pub executed: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub undecodable: u64,
    pub refused_submissions: u64,
    pub peer_divergences: u64,
    /// Mail this node signed for neighbour sims, and neighbours' mail it took into its pool.
    pub mail_sent: u64,
    pub mail_received: u64,
    /// Copies of neighbours' mail dropped at the door because the sim already had it.
    pub mail_late: u64,
    /// Objects that left this sim for a neighbour, and that arrived from one.
    pub departures: u64,
    pub arrivals: u64,
    /// Times this node found itself stranded far behind its peers and took a snapshot.
    pub stranded: u64,
    /// Ticks handed out in two blocks (opened empty, then filled: the agreement's fills).
    pub filled: u64,
    /// Evidence of equivocation this node saw: a validator's two different votes of one kind in
    /// one view (an honest validator never makes it, also across its restarts).
    pub equivocations: u64,
}
