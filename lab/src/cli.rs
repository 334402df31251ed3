//! `metatopia-lab`: every `metatopia` command (so the lab's runs start real nodes of its own
//! build), and the lab's tools.

use clap::Subcommand;

use crate::{bench, raynet_sim, scenario};

#[derive(Debug, Subcommand)]
pub enum Command {
    #[command(flatten)]
    Node(metatopia_node::cli::Command),
    /// Scenario files: a world, faults, client steps and expectations (scenarios/README.md).
    #[command(subcommand)]
    Scenario(ScenarioCmd),
    /// Run a scenario, then re-simulate every tick from the snapshot before it; roots must match.
    Synctest(scenario::cmd::SyncArgs),
    /// Recorded inputs: check they replay to the recorded roots.
    #[command(subcommand)]
    Replay(ReplayCmd),
    /// Simulate the Raynet overlay with N peers and measure it against exact Delaunay.
    Raynet(raynet_sim::RaynetArgs),
    /// Whole-system benchmarks (run by hand; figures go in docs/benchmarks.md).
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Debug, Subcommand)]
pub enum ScenarioCmd {
    /// Run a scenario in the deterministic cluster (or `--real`: on real node processes); a
    /// summary table; non-zero exit on failure.
    Run(scenario::cmd::RunArgs),
}

#[derive(Debug, Subcommand)]
pub enum ReplayCmd {
    /// Re-execute a recording from genesis and compare every root.
    Verify(scenario::cmd::ReplayArgs),
}

#[derive(Debug, Subcommand)]
pub enum Bench {
    /// Per-tick agreement: commit latency against the transport's own round trip.
    Agreement(bench::agreement::AgreementArgs),
    /// A devnet of real node processes at a tick rate, sampled every second: missed ticks,
    /// dilation, commit latency, CPU and memory per node.
    Nodes(bench::nodes::NodesArgs),
}

/// Run one command.
pub fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Node(c) => metatopia_node::cli::dispatch(c),
        Command::Scenario(ScenarioCmd::Run(args)) => scenario::cmd::run(args),
        Command::Synctest(args) => scenario::cmd::synctest(args),
        Command::Replay(ReplayCmd::Verify(args)) => scenario::cmd::replay_verify(args),
        Command::Raynet(args) => raynet_sim::run(args),
        Command::Bench(Bench::Agreement(args)) => bench::agreement::run(args),
        Command::Bench(Bench::Nodes(args)) => bench::nodes::run(args),
    }
}
