//! The Metatopia node: the I/O shell around the pure crates (DESIGN §11).
//!
//! - [`core`]: agreement and the sim in lockstep, sans-IO: the node's logic without sockets
//!   or clocks;
//! - [`simnet`]: the core as a process of `scenarios`' deterministic cluster;
//! - [`store`]: the data directory (node key, commit log, snapshots, consensus state);
//! - [`net`]: the validators' mesh;
//! - [`overlay`]: the node's Raynet peer and signed cards: how sims find each other;
//! - [`reach`]: the overlay on the mesh, and the nodes of other sims found through it;
//! - [`scenario`]: scenario files run on whole node cores in the deterministic cluster;
//!   recordings, `replay verify` and `synctest`;
//! - [`http`]: health, readiness, Prometheus metrics and the JSON API of `stats` and `admin`;
//! - [`gateway`]: the WebSocket gateway the web viewer speaks;
//! - [`epochs`]: the agreement whose validator set follows governance, epoch by epoch;
//! - [`timing`]: wall-clock timers around the script host and physics stage;
//! - [`verify`]: client events' signatures checked ahead of their tick, on a thread of their own.
//!
//! The `metatopia` binary (`src/main.rs`) adds the clock, the network and the command line.

pub mod config;
pub mod core;
pub mod epochs;
pub mod frames;
pub mod fuzzing;
pub mod gateway;
pub mod genesis;
pub mod http;
pub mod net;
pub mod overlay;
pub mod reach;
pub mod scenario;
pub mod scenario_world;
pub mod simnet;
pub mod store;
pub mod timing;
pub mod verify;
pub mod watch;
pub mod when;
pub mod wire;

/// Milliseconds since the UNIX epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
