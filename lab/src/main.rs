//! `metatopia-lab`: the node's commands and the lab's (scenarios, benchmarks, the overlay
//! simulator). See [`metatopia_lab::cli`].

use clap::Parser;

/// The node's allocator, so the lab measures what the node runs.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(name = "metatopia-lab", version, about = "Metatopia's lab: scenarios, benchmarks and every node command")]
struct Cli {
    #[command(subcommand)]
    command: metatopia_lab::cli::Command,
}

fn main() {
    metatopia_node::cli::init_logging();
    metatopia_node::cli::exit_on_error(metatopia_lab::cli::dispatch(Cli::parse().command));
}
