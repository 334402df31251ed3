//! `metatopia-lab scenario run`, `metatopia-lab synctest` and `metatopia-lab replay verify`.

use std::path::{Path, PathBuf};

use crate::scenario::{self, Options, Recording};
use anyhow::Context;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A scenario file (see scenarios/README.md; the catalogue is scenarios/catalogue/).
    file: PathBuf,
    /// The seed of every random choice (default: the file's `seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Where the files named by `script = ...` are (default: ../scripts next to the file).
    #[arg(long)]
    scripts: Option<PathBuf>,
    /// Write the committed inputs and their roots here (for `replay verify` and `synctest`).
    #[arg(long)]
    record: Option<PathBuf>,
    /// Run as real `metatopia run` processes on loopback (crash and diverge faults only).
    #[arg(long)]
    real: bool,
    /// With --real: where the nodes' data directories go (default: $TMP/metatopia-scenario-NAME).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Run this many seeds (from --seed, or the file's) and print how many passed, with the
    /// command that replays each failure (a sweep: in simulation only).
    #[arg(long, conflicts_with_all = ["real", "record"])]
    seeds: Option<u64>,
    /// Print every node's tick and where its agreement stands, once a second of the run (to
    /// stderr; one sim in simulation, one seed): to see when and where a failing seed falls
    /// behind.
    #[arg(long, conflicts_with_all = ["real", "seeds"])]
    timeline: bool,
}

#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    /// A scenario file: it is run in simulation, then every tick re-simulated from a snapshot.
    file: PathBuf,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    scripts: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// A recording written by `scenario run --record`.
    recording: PathBuf,
}

fn scripts_dir(file: &Path, given: Option<PathBuf>) -> PathBuf {
    given.unwrap_or_else(|| {
        let dir = file.parent().unwrap_or(Path::new("."));
        let sibling = dir.join("../scripts");
        if sibling.is_dir() { sibling } else { dir.join("scripts") }
    })
}

fn run_file(
    file: &Path,
    seed: Option<u64>,
    scripts: Option<PathBuf>,
    timeline: bool,
) -> anyhow::Result<(scenario::Report, Recording)> {
    let (spec, text) = scenario::load(file)?;
    anyhow::ensure!(!timeline || spec.world.sims <= 1, "--timeline shows the nodes of a one-sim scenario");
    let opts = Options { seed: seed.unwrap_or(spec.seed), scripts_dir: scripts_dir(file, scripts), timeline };
    // The timeline's lines go to stderr, where the bar would draw over them.
    let bar = if timeline { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(1000) };
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {percent}% ({elapsed})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(format!("{} (virtual {} s)", spec.name, spec.duration_secs));
    let out = scenario::run(&spec, &text, &opts, &mut |t, end| bar.set_position(t * 1000 / end.max(1)));
    bar.finish_and_clear();
    out
}

/// `metatopia-lab scenario run --seeds N`: seeds in a row, a line every tenth of the way.
fn sweep(args: &RunArgs, count: u64) -> anyhow::Result<()> {
    let (spec, text) = scenario::load(&args.file)?;
    let first = args.seed.unwrap_or(spec.seed);
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for (i, seed) in (first..first.saturating_add(count)).enumerate() {
        let opts = Options { seed, scripts_dir: scripts_dir(&args.file, args.scripts.clone()), timeline: false };
        let (report, _) = scenario::run(&spec, &text, &opts, &mut |_, _| {})?;
        if !report.passed() {
            eprint!("{}", report.table());
            failed.push(seed);
        }
        if (i as u64 + 1).is_multiple_of((count / 10).max(1)) {
            eprintln!(
                "{}: {} of {count} seeds run, {} failed ({:.0?})",
                spec.name,
                i + 1,
                failed.len(),
                started.elapsed()
            );
        }
    }
    println!(
        "{}: {} of {count} seeds passed (seeds {first}..{})",
        spec.name,
        count - failed.len() as u64,
        first + count
    );
    if failed.is_empty() {
        return Ok(());
    }
    for seed in &failed {
        println!("  failed: metatopia-lab scenario run {} --seed {seed}", args.file.display());
    }
    anyhow::bail!("{} of {count} seeds failed", failed.len())
}

/// `metatopia-lab scenario run`.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    if let Some(count) = args.seeds {
        return sweep(&args, count);
    }
    let (report, recording) = if args.real {
        anyhow::ensure!(args.record.is_none(), "--record works in simulation only");
        let (spec, text) = scenario::load(&args.file)?;
        let opts = Options {
            seed: args.seed.unwrap_or(spec.seed),
            scripts_dir: scripts_dir(&args.file, args.scripts.clone()),
            timeline: false,
        };
        let dir = args.dir.clone().unwrap_or_else(|| crate::scenario::real::default_dir(&spec.name));
        (crate::scenario::real::run(&args.file, &spec, &text, &opts, &dir)?, None)
    } else {
        let (r, rec) = run_file(&args.file, args.seed, args.scripts.clone(), args.timeline)?;
        (r, Some(rec))
    };
    print!("{}", report.table());
    if let (Some(path), Some(recording)) = (&args.record, recording) {
        std::fs::write(path, postcard::to_allocvec(&recording)?).with_context(|| path.display().to_string())?;
        println!("recorded {} ticks to {}", recording.ticks.len(), path.display());
    }
    if report.passed() {
        println!("passed");
        Ok(())
    } else {
        anyhow::bail!(
            "scenario {} failed with seed {}; replay exactly with: metatopia-lab scenario run {} --seed {}{}",
            report.name,
            report.seed,
            args.file.display(),
            report.seed,
            if args.real { " --real (real runs are not bit-for-bit reproducible)" } else { "" }
        )
    }
}

/// `metatopia-lab synctest`.
pub fn synctest(args: SyncArgs) -> anyhow::Result<()> {
    let (report, recording) = run_file(&args.file, args.seed, args.scripts, false)?;
    let n = scenario::synctest(&recording)?;
    println!("synctest {}: {n} ticks each executed twice (the second from a snapshot), every root equal", report.name);
    Ok(())
}

/// `metatopia-lab replay verify`.
pub fn replay_verify(args: ReplayArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.recording).with_context(|| args.recording.display().to_string())?;
    let rec: Recording =
        postcard::from_bytes(&bytes).context("not a recording (written by `scenario run --record`)")?;
    let n = scenario::replay_verify(&rec)?;
    println!("replayed {n} ticks from genesis: every root equals the recorded one");
    Ok(())
}
