//! The node's integration tests: real `metatopia` processes, their CLI, the mesh, the store and
//! the clients. One binary, a module per area; `tests/support` is shared with the lab's tests.

#[path = "../support/mod.rs"]
mod support;

mod build;
mod clients;
mod config;
mod delay;
mod devnet;
mod fuzz_corpus;
mod homes;
mod house;
mod ownership;
mod processes;
mod sim_command;
mod sims;
mod viewer;
