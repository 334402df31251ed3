//! Metatopia's physics sims (DESIGN §7): a region is a rapier2d world (`enhanced-determinism`)
//! plus an ownership table. It owns the bodies whose centres are in its area, mirrors its
//! neighbours' bodies near the border as ghosts, emits events only for the bodies it
//! owns, and hands bodies to a neighbour by a two-phase handoff with hysteresis.
//!
//! Pure: no clocks, files, threads or OS randomness. Messages between regions are plain values
//! ([`msg::Envelope`]); the caller carries them (the node, over the overlay, with proof that the
//! sending sim committed them; tests and benches, in one process).
//!
//! Floats live only here, inside rapier: bodies are read back into `Fx` at every tick boundary
//! ([`convert`]), and rapier's carried state is part of snapshots and of the state root.
//!
//! - [`region::Region`]: one region; [`stage`]: the region as the sim's physics stage;
//! - [`grid::Grid`]: a grid of regions stepped together, with their mail delivered next tick.

pub mod convert;
pub mod grid;
pub mod msg;
pub mod region;
pub mod stage;

pub use msg::{BodyMsg, Envelope, Msg, RegionId};
pub use region::{Crossing, Material, Region, RegionConfig, RegionError, Role, StepOutput};
pub use stage::RegionStage;
