//! Metatopia's simulation core: pure and deterministic (DESIGN §3, §4, §5, §10).
//!
//! No tokio, clocks, files, OS randomness or floats here. Time enters as the batch's BFT
//! time, randomness as seeds; parallel stages merge in canonical order. Every node that runs
//! the same batches on the same world computes the same state root, bit for bit.
//!
//! - [`fx`], [`vec2`]: fixed-point numbers (I48F16) with deterministic sqrt and trig.
//! - [`ids`], [`state`]: typed ids and the world state in ordered collections.
//! - [`event`]: signed event envelopes and payloads; [`codec`]: bounded decoding.
//! - [`pipeline`]: the tick (verify, route, order, run, merge, physics, hash); [`Sim`].
//! - [`host`]: the script-host and physics-stage traits, with small real implementations in
//!   [`rules`] and [`kinematic`].
//! - [`merkle`]: the incremental state root, hashed in SIMD lanes by [`wide`]; [`snapshot`]:
//!   versioned, validated snapshots.
//! - [`governance`]: roles, the temp-admin rule and admin acts.
//! - [`links`]: neighbour sims, the certified mail between them, objects crossing borders.
//! - [`genesis`]: seeded demo worlds and event streams.
#![forbid(unsafe_code)]

pub mod codec;
pub mod date;
pub mod event;
pub mod fx;
pub mod genesis;
pub mod governance;
pub mod host;
pub mod ids;
pub mod kinematic;
pub mod links;
pub mod merkle;
pub mod objects;
pub mod par;
pub mod pipeline;
pub mod rng;
pub mod rules;
pub mod snapshot;
pub mod state;
pub mod vec2;
pub mod wide;

pub use event::{AdminAct, Batch, ChatRange, EventBody, ObjectEdit, Payload, SignedEvent, VerifiedBatch};
pub use fx::Fx;
pub use ids::{AccountId, EventId, Hash32, ObjectId, ScriptId, SimId, Tick};
pub use pipeline::{ChatLine, Sim, StepError, TickReport};
pub use snapshot::{Snapshot, SnapshotError};
pub use state::{Object, RejectReason, Settings, SubsystemRoots, World};
pub use vec2::Vec2;

/// Re-exported so users of `sim` sign with the same ed25519 as the sim verifies with.
pub use ed25519_dalek::SigningKey;
