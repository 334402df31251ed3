//! Running a scenario file (`scenarios/README.md`) on whole node cores in the deterministic
//! cluster: the world it describes, its validators (honest, Byzantine, twins, diverging), its
//! faults, accounts that sign steps at ticks, bots, and its expectations checked against what
//! every honest node did. Same file and seed, same run: the report carries the cluster's trace
//! hash.
//!
//! A run can be recorded (the committed inputs and the roots they gave), and a recording
//! checked two ways: [`replay_verify`] re-executes it from genesis; [`synctest`] re-simulates
//! every tick a second time from the snapshot before it (like GGRS's SyncTest), so any state
//! that escapes the snapshot or any nondeterminism shows up as a root mismatch at that tick.

pub mod cmd;
pub mod common;
pub mod real;
pub mod replay;
pub mod single;
pub mod world;

pub use common::{Recording, Report, Verdict, payload, step_outcome};
pub use metatopia_node::world::{Options, account_key, load, validator_key};
pub use replay::{replay_verify, synctest};

/// Run a scenario in the deterministic cluster (a world of several sims, or one sim).
pub fn run(
    spec: &metatopia_scenarios::spec::Scenario,
    text: &str,
    opts: &Options,
    progress: &mut dyn FnMut(metatopia_scenarios::Time, metatopia_scenarios::Time),
) -> anyhow::Result<(Report, Recording)> {
    if spec.world.sims > 1 { world::run(spec, text, opts, progress) } else { single::run(spec, text, opts, progress) }
}
