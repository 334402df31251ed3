//! The sim crate's integration tests: one binary, a module per area.

mod common;
mod decode;
mod determinism;
mod fx_accuracy;
mod golden;
mod governance;
mod pipeline;
