//! The Metatopia node: the I/O shell around the pure crates (DESIGN §11).
//!
//! - [`core`]: agreement and the sim in lockstep, sans-IO: the node's logic without sockets
//!   or clocks ([`core::epochs`]: the agreement whose validator set follows governance;
//!   [`core::verify`]: client events' signatures checked ahead of their tick);
//! - [`shell`]: the running node: the clock, the mesh, the store and the client services
//!   around the core ([`shell::setup`]: what a node starts from);
//! - [`net`]: the validators' mesh ([`net::wire`]: what nodes say to each other);
//! - [`overlay`]: the node's Raynet peer and signed cards: how sims find each other, and
//!   [`overlay::reach`], the overlay on the mesh;
//! - [`api`]: health, readiness, metrics and the JSON API of `stats` and `admin`
//!   ([`api::http`]), and the WebSocket gateway the web viewer speaks ([`api::gateway`]);
//! - [`store`]: the data directory (node key, commit log, snapshots, consensus state);
//! - [`world`]: worlds from files, genesis files, the demo sims;
//! - [`cli`]: the `metatopia` commands;
//! - [`config`]: a node's `config.toml`; [`when`]: times for people; [`fuzzing`]: the
//!   decoders the fuzz targets drive.
//!
//! The lab (the deterministic cluster's node processes, scenario runners, benchmarks) is the
//! `metatopia-lab` crate.

pub mod api;
pub mod cli;
pub mod config;
pub mod core;
pub mod fuzzing;
pub mod net;
pub mod overlay;
pub mod shell;
pub mod store;
pub mod when;
pub mod world;

/// Milliseconds since the UNIX epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
