//! The traits the tick pipeline calls: a script host (DESIGN §8) and a physics stage (§7).
//!
//! Both are pure: they get the immutable `World_t`, the tick, its BFT time and seeds as
//! arguments, and return values. `scripting` (rhai) and `physics` (rapier2d) implement them;
//! `sim` carries small real ones ([`crate::rules`], [`crate::kinematic`]) for its own tests.

use serde::{Deserialize, Serialize};

use crate::event::ChatRange;
use crate::fx::Fx;
use crate::ids::{AccountId, Hash32, ObjectId, SimId, Tick};
use crate::state::{BodyKind, Limits, Object, ScriptInstance, ScriptSource, Shape, Surface, World};
use crate::vec2::Vec2;

/// One thing a script reacts to, in the order it must see them.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ScriptInput {
    /// The script was just deployed.
    Init,
    /// Every tick, for scripts with a tick handler (always first).
    Tick,
    /// The script's timer fired (right after `Tick`).
    Timer,
    Touch {
        who: AccountId,
    },
    Chat {
        channel: i32,
        speaker: String,
        text: String,
    },
    Message {
        from: ObjectId,
        data: String,
    },
    Collision {
        other: ObjectId,
    },
}

/// What a script may read while it runs.
#[derive(Debug)]
pub struct ScriptCtx<'a> {
    /// `World_t`: read-only, shared by every unit of the tick.
    pub world: &'a World,
    pub object: &'a Object,
    pub instance: &'a ScriptInstance,
    pub source: &'a ScriptSource,
    pub tick: Tick,
    pub time_ms: u64,
    /// The tick's order seed (from the commit certificate); see [`ScriptCtx::rng_seed`].
    pub tick_seed: Hash32,
    pub limits: &'a Limits,
    /// Script operations this object may still use this tick: its share of its owner's
    /// budget, at most `limits.operations_per_object_tick` (decided by the pipeline, the same
    /// on every node). The inputs that come after it is spent are not run.
    pub operations: u64,
    /// Objects near a point in `world`, for `nearby` (one grid for every unit of the tick).
    pub near: &'a crate::state::near::Near,
}

impl ScriptCtx<'_> {
    /// Seed of this script's deterministic RNG for this tick: blake3(tick seed ‖ object).
    /// Computed on demand: most scripts never draw a random number.
    pub fn rng_seed(&self) -> Hash32 {
        script_seed(&self.tick_seed, self.object.id)
    }
}

/// What a script asks for. Only its own object changes; the rest are messages and commands.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum ScriptAction {
    SetColor(u32),
    SetText(String),
    SetVelocity(Vec2),
    SetTarget {
        target: Vec2,
        speed: Fx,
    },
    Impulse(Vec2),
    Say {
        channel: i32,
        range: ChatRange,
        text: String,
    },
    Send {
        to: ObjectId,
        data: String,
    },
    Listen {
        channel: i32,
        on: bool,
    },
    /// `every_ticks == 0` stops the timer.
    SetTimer {
        every_ticks: u32,
    },
}

/// Kinds of script failure, so owners and tests can tell them apart.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum ScriptErrorKind {
    /// The per-event operation budget ran out.
    OutOfBudget,
    /// Call or expression depth limit.
    TooDeep,
    /// A string, array, map or the persisted state exceeded its limit.
    TooLarge,
    /// Used something the sandbox does not offer (floats, time, eval, import, …).
    Forbidden,
    /// Emitted more messages, chat or commands in one tick than allowed.
    TooManyOutputs,
    /// Any other runtime error raised by the script.
    Runtime,
}

/// A script error, sent to the owner's debug channel.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct ScriptError {
    pub kind: ScriptErrorKind,
    pub message: String,
}

/// The result of running one object's script for one tick.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ScriptOutput {
    /// The persisted state after the tick (host-defined encoding).
    pub state: Vec<u8>,
    /// Actions in the order the script made them.
    pub actions: Vec<ScriptAction>,
    /// Set when a handler failed (its tick's actions and state are then dropped).
    pub error: Option<ScriptError>,
    /// Inputs not run this tick because the object had spent its operation budget for the tick
    /// (`ScriptCtx::operations`, the same on every node); the others' effects stand.
    pub dropped: u32,
    /// Operations the handlers used (the host's count; 0 for hosts that do not count).
    pub operations: u64,
}

/// What compiling a script tells the pipeline.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Compiled {
    /// The script has a tick handler: it runs every tick.
    pub wants_tick: bool,
}

/// Runs scripts. Called from several threads at once on the same `World_t`; must give the same
/// output for the same inputs on every machine.
pub trait ScriptHost: Sync {
    /// Check a script before it is deployed. The error is recorded as the refusal's reason.
    fn compile(&self, source: &ScriptSource, limits: &Limits) -> Result<Compiled, String>;
    /// Run the handlers for one object's inputs, in order.
    fn run(&self, ctx: &ScriptCtx<'_>, inputs: &[ScriptInput]) -> ScriptOutput;
}

/// A command from the tick to the physics stage.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum PhysicsCommand {
    /// Put a body into the world, or place an existing one afresh (replacing its body).
    Spawn {
        object: ObjectId,
        position: Vec2,
        velocity: Vec2,
        shape: Shape,
        body: BodyKind,
        surface: Option<Surface>,
    },
    Despawn {
        object: ObjectId,
    },
    SetVelocity {
        object: ObjectId,
        velocity: Vec2,
    },
    /// An avatar's walking velocity (its owner's input): held at every step until the next, so
    /// a bump moves it for a moment but never carries it off, and zero stops it.
    Drive {
        object: ObjectId,
        velocity: Vec2,
    },
    Impulse {
        object: ObjectId,
        impulse: Vec2,
    },
    /// Move toward `target` at `speed` m/s, then stop.
    SetTarget {
        object: ObjectId,
        target: Vec2,
        speed: Fx,
    },
}

/// A body's state read back into `Fx` at the tick boundary.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BodyState {
    pub object: ObjectId,
    pub position: Vec2,
    pub rotation: Fx,
    pub velocity: Vec2,
}

/// Events the physics stage emits, only for bodies it owns.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PhysicsEvent {
    /// `object` (owned here) was hit by `other`.
    Collision { object: ObjectId, other: ObjectId },
}

/// A body crossing a border between sims, as the physics stage saw it this step.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Border {
    /// Authority over `object` (ours) moved to the neighbour `to`: the world hands the object's
    /// record over and keeps a copy until the crossing settles.
    Left { object: ObjectId, to: SimId },
    /// The neighbour `to` confirmed it holds `object`: the handoff is over.
    Settled { object: ObjectId, to: SimId },
    /// We took authority over the body the neighbour `from` called `origin`. The stage names it
    /// `object` until the world gives it a local id ([`PhysicsStage::rename`], same tick).
    Arrived { object: ObjectId, from: SimId, origin: ObjectId },
}

/// The result of one physics step.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct PhysicsOutput {
    /// Bodies that changed, in object-id order.
    pub bodies: Vec<BodyState>,
    pub events: Vec<PhysicsEvent>,
    /// Border crossings, in a deterministic order.
    pub borders: Vec<Border>,
    /// Messages for neighbour sims (the stage's encoding), one per neighbour, in sim order.
    pub mail: Vec<(SimId, Vec<u8>)>,
}

/// Why a physics stage could not load its saved state.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
#[error("physics state: {0}")]
pub struct PhysicsError(pub String);

/// The physics of one region. Carried state (everything that influences the next step) is
/// saved into snapshots and hashed into the state root.
pub trait PhysicsStage: Send {
    /// Load from a world at genesis (`saved = None`) or from a snapshot's saved state.
    fn load(&mut self, world: &World, saved: Option<&[u8]>) -> Result<(), PhysicsError>;
    /// Apply the tick's commands in order, then advance `dt` seconds.
    fn step(&mut self, world: &World, commands: &[PhysicsCommand], dt: Fx) -> PhysicsOutput;
    /// The carried state, for snapshots.
    fn save(&self) -> Vec<u8>;
    /// The digest of the carried state.
    fn root(&self) -> Hash32;
    /// Certified mail from the neighbour sim `from` for the next step. A stage without
    /// neighbours ignores it. (No default for these three: a wrapper must pass them on.)
    fn deliver(&mut self, from: SimId, mail: &[u8]);
    /// Give an arrived body (see [`Border::Arrived`]) the world's id for it.
    fn rename(&mut self, from: ObjectId, to: ObjectId);
    /// Drop a body at once (an arrival the world cannot take).
    fn despawn(&mut self, object: ObjectId);
}

/// Seed of a script's RNG for this tick: blake3(tick seed ‖ object).
pub fn script_seed(seed: &Hash32, object: ObjectId) -> Hash32 {
    let mut h = blake3::Hasher::new_keyed(&crate::merkle::keys::RNG);
    h.update(&seed.0);
    h.update(&object.0.to_le_bytes());
    Hash32(*h.finalize().as_bytes())
}
