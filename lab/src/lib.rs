//! The Metatopia lab: what measures and tries the node without being the node. Byzantine
//! validators and a planted protocol bug live only here and in tests, never in `metatopia`.
//!
//! - [`simnet`]: the node core as a process of `scenarios`' deterministic cluster (honest,
//!   Byzantine, twin and diverging validators);
//! - [`scenario`]: scenario files run on whole node cores in that cluster ([`scenario::single`],
//!   [`scenario::world`]) or on real node processes ([`scenario::real`]); recordings, `replay
//!   verify` and `synctest` ([`scenario::replay`]);
//! - [`bench`](mod@bench): whole-system benchmarks: agreement on the node's mesh (and on a bench-only
//!   reactor, named so), and real node processes at a tick rate;
//! - [`raynet_sim`]: the Raynet overlay simulated with N peers against exact Delaunay;
//! - [`cli`]: the `metatopia-lab` command (every `metatopia` command, and the lab's own).

pub mod bench;
pub mod cli;
pub mod raynet_sim;
pub mod scenario;
pub mod simnet;
