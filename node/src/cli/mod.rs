//! The `metatopia` command line: its commands and what each one runs.
//!
//! `devnet` (several validators in lockstep on loopback, with bots) is the main command; `init`,
//! `run` and `config check` operate one node; `stats` and `admin` talk to a running node's HTTP
//! service; `client` and `bot` are players; `sim` makes, reads or runs a sim on its own. The lab's
//! tools (scenarios, benchmarks, the overlay simulator) are the `metatopia-lab` command, which
//! has every command here too.

pub mod admin;
pub mod build;
pub mod client;
pub mod devnet;
pub mod local;
pub mod sim_new;

use clap::Subcommand;

use crate::shell::setup;

/// The node's commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// A 2×2 world of four sims on loopback (four validators each, four processes), with client
    /// bots: the quickest way to see it run. `--single` for one sim.
    Devnet(devnet::DevnetArgs),
    /// Create a data directory: a node key and a commented config.
    Init(setup::InitArgs),
    /// Run a validator of the sim its config describes.
    Run(setup::RunArgs),
    /// A node's figures, like OpenSimulator's `show stats` (from its HTTP service).
    Stats(admin::StatsArgs),
    /// Govern a sim: signed admin acts submitted through any node, and `admin status`.
    Admin(admin::AdminArgs),
    /// Configuration tools.
    #[command(subcommand)]
    Config(ConfigCmd),
    /// The terminal client: walk an avatar, chat, touch things, read scripts (through any node).
    Client(client::ClientArgs),
    /// Headless clients that log in, wander and chat, for load; prints what they receive.
    Bot(client::BotArgs),
    /// Build: rez, touch, show and derez objects (signed events through any node).
    #[command(subcommand)]
    Object(build::ObjectCmd),
    /// Scripts: deploy a file to your object, show any object's script, fork one to edit.
    #[command(subcommand)]
    Script(build::ScriptCmd),
    /// Sims: make a new one you own (`sim new`), read a genesis (`sim show`), or run a seeded
    /// demo sim in this process with no network (`sim local`).
    #[command(subcommand)]
    Sim(SimCmd),
}

#[derive(Debug, Subcommand)]
pub enum SimCmd {
    /// The genesis of a new sim: your admin key, a world file, its validators, the time now.
    New(sim_new::NewArgs),
    /// What a genesis file (or a data directory's) holds, and its hash.
    Show(sim_new::ShowArgs),
    /// Run one sim locally on a seeded demo world, with bots, and print its progress.
    Local(local::SimArgs),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCmd {
    /// Read and check the config (unknown keys and bad values are errors naming the line).
    Check(setup::DirArgs),
    /// Print the configuration reference: every key, its type, default and meaning (Markdown).
    Reference,
}

/// Run one command.
pub fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Devnet(args) => devnet::run(args),
        Command::Init(args) => setup::init(args),
        Command::Run(args) => crate::shell::run(args),
        Command::Stats(args) => admin::stats(args),
        Command::Admin(args) => admin::admin(args),
        Command::Config(ConfigCmd::Check(args)) => setup::config_check(args),
        Command::Config(ConfigCmd::Reference) => {
            print!("{}", crate::config::reference::markdown());
            Ok(())
        }
        Command::Client(args) => client::client(args),
        Command::Bot(args) => client::bot(args),
        Command::Object(cmd) => build::object(cmd),
        Command::Script(cmd) => build::script(cmd),
        Command::Sim(SimCmd::New(args)) => sim_new::new(args),
        Command::Sim(SimCmd::Show(args)) => sim_new::show(args),
        Command::Sim(SimCmd::Local(args)) => local::run(args),
    }
}

/// Log lines on standard error, filtered by `RUST_LOG` (default `info`), coloured on a terminal.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colours for a terminal only: a log file or a pipe gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Exit with the chain of causes on one line (no backtrace for a user's mistake).
pub fn exit_on_error(result: anyhow::Result<()>) {
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
