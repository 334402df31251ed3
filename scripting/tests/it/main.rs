//! The scripting crate's integration tests: one binary, a module per area.

mod common;
mod determinism;
mod examples;
mod properties;
mod reference;
mod sandbox;
