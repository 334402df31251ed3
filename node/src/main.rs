//! `metatopia`: the node's command line.
//!
//! `devnet` (several validators in lockstep on loopback, with bots) is the main command; `init`,
//! `run` and `config check` operate one node; `stats` and `admin` talk to a running node's HTTP
//! service; `sim`, `raynet` and `bench` are tools for measuring parts on their own.

mod admin;
mod bench_agreement;
mod bench_nodes;
mod client_cmd;
mod demo;
mod devnet;
mod finish;
mod local;
mod raynet_sim;
mod run;
mod scenario_cmd;
mod scenario_real;
mod setup;
mod sim_new;

use clap::{Parser, Subcommand};

/// mimalloc: a tick allocates and frees many small values (events, parts, script state) and a
/// few large vectors; with the system allocator the large ones came back as fresh pages every
/// tick (page faults). The scripts bench measured the tick 1.2x faster with it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "metatopia", version, about = "A peer-to-peer, lockstep virtual-world node")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A 2×2 world of four sims on loopback (four validators each, four processes), with client
    /// bots: the quickest way to see it run. `--single` for one sim.
    Devnet(devnet::DevnetArgs),
    /// Create a data directory: a node key and a commented config.
    Init(run::InitArgs),
    /// Run a validator of the sim its config describes.
    Run(run::RunArgs),
    /// A node's figures, like OpenSimulator's `show stats` (from its HTTP service).
    Stats(admin::StatsArgs),
    /// Govern a sim: signed admin acts submitted through any node, and `admin status`.
    Admin(admin::AdminArgs),
    /// Scenario files: a world, faults, client steps and expectations (scenarios/README.md).
    #[command(subcommand)]
    Scenario(ScenarioCmd),
    /// Run a scenario, then re-simulate every tick from the snapshot before it; roots must match.
    Synctest(scenario_cmd::SyncArgs),
    /// Recorded inputs: check they replay to the recorded roots.
    #[command(subcommand)]
    Replay(ReplayCmd),
    /// Configuration tools.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// The terminal client: walk an avatar, chat, touch things, read scripts (through any node).
    Client(client_cmd::ClientArgs),
    /// Headless clients that log in, wander and chat, for load; prints what they receive.
    Bot(client_cmd::BotArgs),
    /// Sims: make a new one you own (`sim new`), read a genesis (`sim show`), or run a seeded
    /// demo sim in this process with no network (`sim local`).
    #[command(subcommand)]
    Sim(SimCmd),
    /// Simulate the Raynet overlay with N peers and measure it against exact Delaunay.
    Raynet(raynet_sim::RaynetArgs),
    /// Whole-system benchmarks (run by hand; figures go in the issue notes).
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Debug, Subcommand)]
enum ScenarioCmd {
    /// Run a scenario in the deterministic cluster; a summary table; non-zero exit on failure.
    Run(scenario_cmd::RunArgs),
}

#[derive(Debug, Subcommand)]
enum SimCmd {
    /// The genesis of a new sim: your admin key, a world file, its validators, the time now.
    New(sim_new::NewArgs),
    /// What a genesis file (or a data directory's) holds, and its hash.
    Show(sim_new::ShowArgs),
    /// Run one sim locally on a seeded demo world, with bots, and print its progress.
    Local(local::SimArgs),
}

#[derive(Debug, Subcommand)]
enum ReplayCmd {
    /// Re-execute a recording from genesis and compare every root.
    Verify(scenario_cmd::ReplayArgs),
}

#[derive(Debug, Subcommand)]
enum ConfigCmd {
    /// Read and check the config (unknown keys and bad values are errors naming the line).
    Check(run::DirArgs),
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Per-tick agreement over real loopback TCP: commit latency vs the loopback round trip.
    Agreement(bench_agreement::AgreementArgs),
    /// A devnet of real node processes at a tick rate, sampled every second: missed ticks,
    /// dilation, commit latency, CPU and memory per node.
    Nodes(bench_nodes::NodesArgs),
}

fn main() {
    if let Err(e) = run() {
        // The chain of causes on one line; no backtrace for a user's mistake.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a log file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Devnet(args) => devnet::run(args),
        Command::Init(args) => setup::init(args),
        Command::Run(args) => run::run(args),
        Command::Stats(args) => admin::stats(args),
        Command::Admin(args) => admin::admin(args),
        Command::Scenario(ScenarioCmd::Run(args)) => scenario_cmd::run(args),
        Command::Synctest(args) => scenario_cmd::synctest(args),
        Command::Replay(ReplayCmd::Verify(args)) => scenario_cmd::replay_verify(args),
        Command::Config(ConfigCmd::Check(args)) => setup::config_check(args),
        Command::Client(args) => client_cmd::client(args),
        Command::Bot(args) => client_cmd::bot(args),
        Command::Sim(SimCmd::New(args)) => sim_new::new(args),
        Command::Sim(SimCmd::Show(args)) => sim_new::show(args),
        Command::Sim(SimCmd::Local(args)) => local::run(args),
        Command::Raynet(args) => raynet_sim::run(args),
        Command::Bench(Bench::Agreement(args)) => bench_agreement::run(args),
        Command::Bench(Bench::Nodes(args)) => bench_nodes::run(args),
    }
}
