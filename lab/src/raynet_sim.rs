//! `metatopia-lab raynet`: run the Raynet simulator (N peers in this process, seeded) and print a
//! table per round: neighbour recall and precision against the exact Delaunay triangulation,
//! view sizes, lookup success and hops, plus wall time and memory per simulated peer.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use metatopia_raynet::sim::{Placement, SimConfig, Simulator};

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum PlacementArg {
    Uniform,
    /// Ten Gaussian clusters.
    Clustered,
}

#[derive(Debug, clap::Args)]
pub struct RaynetArgs {
    /// Peers.
    #[arg(long, default_value_t = 1_000)]
    peers: usize,
    /// Gossip rounds.
    #[arg(long, default_value_t = 20)]
    rounds: u32,
    /// How peers are placed.
    #[arg(long, value_enum, default_value_t = PlacementArg::Uniform)]
    placement: PlacementArg,
    /// Peers replaced per round, per mille (after the first `--churn-after` rounds).
    #[arg(long, default_value_t = 0)]
    churn: u32,
    #[arg(long, default_value_t = 10)]
    churn_after: u32,
    /// Messages lost, per mille.
    #[arg(long, default_value_t = 0)]
    loss: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Lookups measured per round.
    #[arg(long, default_value_t = 200)]
    lookups: usize,
    /// Also write the rows as CSV to this file.
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
}

/// Print above the progress bar (and also when there is no terminal, where the bar is hidden).
fn say(bar: &indicatif::ProgressBar, line: String) {
    bar.suspend(|| println!("{line}"));
}

fn rss_kib() -> Option<u64> {
    crate::bench::nodes::rss_kib(std::process::id())
}

pub fn run(args: RaynetArgs) -> anyhow::Result<()> {
    let placement = match args.placement {
        PlacementArg::Uniform => Placement::Uniform,
        PlacementArg::Clustered => Placement::Clustered,
    };
    anyhow::ensure!(args.peers >= 4, "--peers must be at least 4");
    anyhow::ensure!(args.churn <= 1000 && args.loss <= 1000, "--churn and --loss are per mille (0..=1000)");
    let mut csv = match &args.csv {
        Some(p) => {
            let mut f = std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            writeln!(f, "{},seconds", metatopia_raynet::sim::RoundStats::CSV_HEADER)?;
            Some(f)
        }
        None => None,
    };
    let mut cfg = SimConfig::new(args.peers, placement, args.seed);
    cfg.loss_per_mille = args.loss;
    cfg.route_samples = args.lookups;
    let rss0 = rss_kib().unwrap_or(0);
    let t0 = Instant::now();
    let bar = indicatif::ProgressBar::new(u64::from(args.rounds));
    bar.set_style(indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] round {pos}/{len} {msg}")?);
    bar.set_message("bootstrapping");
    let mut sim = Simulator::new(cfg);
    let boot = t0.elapsed();
    say(
        &bar,
        format!(
            "raynet: {} peers, {:?}, seed {}, churn {}‰ after round {}, loss {}‰ (bootstrap {:.1} s)",
            args.peers,
            placement,
            args.seed,
            args.churn,
            args.churn_after,
            args.loss,
            boot.as_secs_f64()
        ),
    );
    say(
        &bar,
        format!(
            "{:>5} {:>7} {:>7} {:>9} {:>6} {:>6} {:>8} {:>6} {:>4} {:>9} {:>8}",
            "round", "peers", "recall", "precision", "neigh", "known", "lookups", "hops", "p99", "msgs", "s/round"
        ),
    );
    for round in 1..=args.rounds {
        if round == args.churn_after + 1 {
            sim.set_churn(args.churn);
        }
        let t = Instant::now();
        let s = sim.round();
        let secs = t.elapsed().as_secs_f64();
        say(
            &bar,
            format!(
                "{:>5} {:>7} {:>7.4} {:>9.4} {:>6.2} {:>6.1} {:>8.4} {:>6.2} {:>4} {:>9} {:>8.2}",
                s.round,
                s.peers,
                s.recall,
                s.precision,
                s.mean_neighbours,
                s.mean_known,
                s.route_success,
                s.mean_hops,
                s.p99_hops,
                s.messages,
                secs
            ),
        );
        if let Some(f) = csv.as_mut() {
            writeln!(f, "{},{secs:.3}", s.csv())?;
        }
        bar.set_message(format!("recall {:.3}", s.recall));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let total = t0.elapsed().as_secs_f64();
    let rss = rss_kib().unwrap_or(0).saturating_sub(rss0);
    println!(
        "{} rounds in {total:.1} s: {:.1} µs of wall time per peer per round, {:.1} KiB of memory per peer",
        args.rounds,
        (total - boot.as_secs_f64()) * 1e6 / (args.peers as f64 * f64::from(args.rounds)),
        rss as f64 / args.peers as f64
    );
    Ok(())
}
