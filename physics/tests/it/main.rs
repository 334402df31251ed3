//! The physics crate's integration tests: one binary, a module per area.

mod common;
mod cross_sim;
mod handoff;
mod region;
mod sim_stage;
