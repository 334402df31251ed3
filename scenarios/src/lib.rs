//! Scenarios: the deterministic harness that runs processes on a simulated network (virtual
//! time, one seeded RNG, faults, invariant checks), generic over a sans-IO [`Process`]. It
//! never imports `node` or a protocol crate: protocols implement [`Process`] for their cores
//! (and their Byzantine mocks) in their own test suites.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod judge;
pub mod spec;

pub use cluster::{
    Cluster, Dest, DiskFault, Fault, NetConfig, NetStats, NodeId, Outbox, Partition, Process, Restarter, Time,
};
pub use spec::{Scenario, SpecError};
