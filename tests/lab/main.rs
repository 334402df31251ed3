//! The lab's integration tests: catalogue scenarios in the deterministic cluster and on real
//! processes, and the benchmark commands. One binary, a module per area.

// The lab uses the support module's command runner only; its process helpers serve the node's tests.
#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod bench_command;
mod governance;
mod latency;
mod lockstep;
mod scenarios;
