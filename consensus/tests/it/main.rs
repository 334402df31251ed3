//! The consensus crate's integration tests: one binary, a module per area.

mod agreement;
mod backpressure;
mod common;
mod paths;
