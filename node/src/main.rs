//! `metatopia`: the node's command line.
//!
//! For now it runs a sim locally (`metatopia sim`): the real tick pipeline on a seeded default
//! world, fed by bots that sign real events, printing tick, objects and state root. `devnet`
//! (several nodes in lockstep over the network) replaces it as the main command once the
//! agreement and node layers land.

mod bench_agreement;
mod local;
mod raynet_sim;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "metatopia", version, about = "A peer-to-peer, lockstep virtual-world node")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one sim locally on a seeded default world, with bots, and print its progress.
    Sim(local::SimArgs),
    /// Simulate the Raynet overlay with N peers and measure it against exact Delaunay.
    Raynet(raynet_sim::RaynetArgs),
    /// Whole-system benchmarks (run by hand; figures go in the issue notes).
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Per-tick agreement over real loopback TCP: commit latency vs the loopback round trip.
    Agreement(bench_agreement::AgreementArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Sim(args) => local::run(args),
        Command::Raynet(args) => raynet_sim::run(args),
        Command::Bench(Bench::Agreement(args)) => bench_agreement::run(args),
    }
}
