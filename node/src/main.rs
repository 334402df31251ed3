//! `metatopia`: the node's command line (the commands are in [`metatopia_node::cli`]).

use clap::Parser;

/// jemalloc: a tick allocates and frees many small values (events, parts, script state) and a
/// few large vectors; with the system allocator the large ones came back as fresh pages every
/// tick (page faults), and its freed pages stayed with the process after clients left. jemalloc
/// keeps the tick as fast as mimalloc did (`sim local --unpaced`) and gives back the pages a
/// thousand clients used within a minute or two of their leaving (its dirty pages decay), where
/// mimalloc held about twice as much (docs/benchmarks.md).
///
/// Its background threads purge the freed pages: without them an arena purges only when a
/// thread that uses it allocates again, so the arenas of the client service's threads, idle
/// once the clients have left, kept their pages for good.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(name = "metatopia", version, about = "A peer-to-peer, lockstep virtual-world node")]
struct Cli {
    #[command(subcommand)]
    command: metatopia_node::cli::Command,
}

fn main() {
    metatopia_node::cli::init_logging();
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::debug!(%e, "jemalloc's background threads not started: freed pages are returned more slowly");
    }
    metatopia_node::cli::exit_on_error(metatopia_node::cli::dispatch(Cli::parse().command));
}
