//! The Metatopia node: the I/O shell around the pure crates (DESIGN §11).
//!
//! - [`core`]: agreement and the sim in lockstep, sans-IO: the node's logic without sockets
//!   or clocks;
//! - [`simnet`]: the core as a process of `scenarios`' deterministic cluster;
//! - [`store`]: the data directory (node key, commit log, snapshots, consensus state).
//!
//! The `metatopia` binary (`src/main.rs`) adds the clock, the network and the command line.

pub mod config;
pub mod core;
pub mod net;
pub mod simnet;
pub mod store;
