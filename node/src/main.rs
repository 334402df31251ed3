//! `metatopia`: the node's command line (the commands are in [`crate::cli`]).

use clap::Parser;

/// mimalloc: a tick allocates and frees many small values (events, parts, script state) and a
/// few large vectors; with the system allocator the large ones came back as fresh pages every
/// tick (page faults). The scripts bench measured the tick 1.2x faster with it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "metatopia", version, about = "A peer-to-peer, lockstep virtual-world node")]
struct Cli {
    #[command(subcommand)]
    command: metatopia_node::cli::Command,
}

fn main() {
    metatopia_node::cli::init_logging();
    metatopia_node::cli::exit_on_error(metatopia_node::cli::dispatch(Cli::parse().command));
}
