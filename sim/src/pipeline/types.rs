//! What a tick reports (chat lines, script errors, refusals) and the values its units share.

use serde::{Deserialize, Serialize};

use crate::event::ChatRange;
use crate::host::ScriptError;
use crate::ids::{AccountId, Hash32, ObjectId, SimId, Tick};
use crate::links::OutMail;
use crate::state::{Rejection, SubsystemRoots};
use crate::vec2::Vec2;

/// The channel script errors go out on, addressed to the object's owner.
pub const DEBUG_CHANNEL: i32 = i32::MAX;

/// Who said something.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub enum Speaker {
    Account(AccountId),
    Object(ObjectId),
}

/// A line of chat produced by a tick.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ChatLine {
    pub speaker: Speaker,
    pub name: String,
    pub channel: i32,
    pub range: ChatRange,
    /// Where it was said; it carries `range` metres from here.
    pub position: Vec2,
    pub text: String,
    /// Set for private lines (the debug channel): only this account hears it.
    pub to: Option<AccountId>,
}

/// A script error, for the owner.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ScriptErrorReport {
    pub object: ObjectId,
    pub owner: AccountId,
    pub error: ScriptError,
    /// The script is now suspended until redeployed.
    pub suspended: bool,
}

/// What one tick did.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TickReport {
    /// The tick that was executed.
    pub tick: Tick,
    pub root: Hash32,
    pub roots: SubsystemRoots,
    pub accepted: u32,
    pub rejected: Vec<Rejection>,
    pub chat: Vec<ChatLine>,
    pub script_errors: Vec<ScriptErrorReport>,
    /// Object units run in parallel.
    pub units: u32,
    /// Script operations all units used (the host's count): the tick's script cost, the same
    /// on every node.
    pub script_operations: u64,
    /// Inputs queued for the next tick (messages, chat heard, collisions).
    pub queued: u32,
    pub bodies_moved: u32,
    /// Mail for neighbour sims: every validator of this sim signs and sends it.
    pub mail: Vec<OutMail>,
    /// Objects handed to a neighbour this tick: (our id, the neighbour).
    pub left: Vec<(ObjectId, SimId)>,
    /// Objects that arrived this tick: (our new id, the sender, the sender's id).
    pub arrived: Vec<(ObjectId, SimId, ObjectId)>,
}

/// Why a batch could not be executed at all (a bug upstream, never bad client input).
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum StepError {
    #[error("batch is for tick {got}, the sim is at tick {expected}")]
    WrongTick { expected: Tick, got: Tick },
    #[error("batch time {got} ms is before the last batch time {last} ms")]
    TimeWentBack { last: u64, got: u64 },
}

/// Per-tick values every unit sees.
#[derive(Clone, Debug)]
pub(crate) struct TickCtx {
    pub tick: Tick,
    pub time_ms: u64,
    pub seed: Hash32,
    pub script_failure_limit: u32,
    /// The tick's grid for scripts' `nearby` (built the first time one asks).
    pub near: crate::state::near::Near,
}
