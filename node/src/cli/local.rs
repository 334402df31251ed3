//! `metatopia sim`: the tick loop of one sim in this process, at the sim's tick rate.
//!
//! This is the I/O shell's job in miniature: the clock is read here (never in `sim`), batches
//! get their BFT time and seed here (from the local clock and a hash chain, standing in for
//! consensus), signatures are verified ahead of the tick, and the pipeline runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::world::AnyPhysics;
use anyhow::Context;
use metatopia_sim::genesis::{DemoSpec, EventGen, demo_world, tick_time_ms};
use metatopia_sim::rules::RuleHost;
use metatopia_sim::{Batch, Hash32, Sim, VerifiedBatch};

#[derive(Debug, clap::Args)]
pub struct SimArgs {
    /// Seed of the default world and its bots.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Prims in the world (besides avatars).
    #[arg(long, default_value_t = 1_000)]
    objects: u32,
    /// Bot players, each with an avatar.
    #[arg(long, default_value_t = 50)]
    players: u32,
    /// Signed events the bots send per tick.
    #[arg(long, default_value_t = 10)]
    events_per_tick: usize,
    /// Stop after this many ticks (default: run until Ctrl-C).
    #[arg(long)]
    ticks: Option<u64>,
    /// Worker threads for the parallel stages.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Run as fast as possible instead of at the sim's tick rate, on virtual time (BFT time is
    /// tick × period, so two runs of the same world end on the same root).
    #[arg(long)]
    unpaced: bool,
    /// The physics stage: rapier2d (bodies collide) or kinematic (bodies pass through each
    /// other and bounce off the region's edges; cheaper).
    #[arg(long, value_enum, default_value_t = PhysicsKind::Rapier)]
    physics: PhysicsKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PhysicsKind {
    Rapier,
    Kinematic,
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.workers >= 1, "--workers must be at least 1");
    anyhow::ensure!(args.players >= 1, "--players must be at least 1 (the bots need avatars)");
    let demo =
        demo_world(DemoSpec { seed: args.seed, objects: args.objects, players: args.players, ..DemoSpec::default() });
    let mut bots = EventGen::new(&demo, args.seed);
    let rate_hz = demo.world.settings().tick_rate_hz;
    let physics = match args.physics {
        PhysicsKind::Rapier => AnyPhysics::of("rapier"),
        PhysicsKind::Kinematic => AnyPhysics::of("kinematic"),
    };
    let mut sim = Sim::new(demo.world, RuleHost::default(), physics, args.workers)
        .context("loading the default world's physics")?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;

    println!(
        "metatopia sim: {} on a {} m region, {} objects, {} bots, {} Hz, {} events/tick, {} workers, {:?} physics",
        sim.world().sim(),
        sim.world().region().size,
        sim.world().objects().len(),
        args.players,
        rate_hz,
        args.events_per_tick,
        args.workers,
        args.physics
    );
    println!("genesis root {}", sim.root());
    println!(
        "{:>8} {:>8} {:>8} {:>9} {:>9} {:>10}  root",
        "tick", "objects", "scripts", "accepted", "rejected", "tick ms"
    );

    let period = Duration::from_secs(1) / rate_hz.max(1);
    let started = Instant::now();
    let mut next = started;
    let mut seed = Hash32::default();
    let (mut accepted, mut rejected, mut busy) = (0u64, 0u64, Duration::ZERO);
    let mut last_root = sim.root();
    while !stop.load(Ordering::SeqCst) && args.ticks.is_none_or(|n| sim.world().tick().0 < n) {
        let tick = sim.world().tick();
        // Stand-ins for consensus: BFT time from the local clock, seed from a hash chain.
        seed = Hash32(*blake3::hash(&seed.0).as_bytes());
        let time_ms = if args.unpaced {
            tick_time_ms(tick, rate_hz)
        } else {
            u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
        };
        let mut batch: Batch = bots.batch(sim.world(), tick, args.events_per_tick);
        batch.time_ms = time_ms.max(sim.world().time_ms());
        batch.seed = seed;
        let t0 = Instant::now();
        let verified = VerifiedBatch::new(batch, args.workers);
        let report = sim.step(&verified).context("executing a tick")?;
        busy += t0.elapsed();
        accepted += u64::from(report.accepted);
        rejected += report.rejected.len() as u64;
        last_root = report.root;
        if (tick.0 + 1) % u64::from(rate_hz.max(1)) == 0 {
            let w = sim.world();
            println!(
                "{:>8} {:>8} {:>8} {:>9} {:>9} {:>10.3}  {}",
                tick.0 + 1,
                w.objects().len(),
                w.scripts().len(),
                accepted,
                rejected,
                busy.as_secs_f64() * 1e3 / f64::from(rate_hz.max(1)),
                report.root.short()
            );
            busy = Duration::ZERO;
        }
        if !args.unpaced {
            next += period;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            } else {
                next = now; // running late: do not try to catch up in a burst
            }
        }
    }
    let ticks = sim.world().tick().0;
    println!(
        "stopped{} after {ticks} ticks in {:.1} s: {accepted} events accepted, {rejected} rejected; final root {last_root}",
        if stop.load(Ordering::SeqCst) { " by Ctrl-C" } else { "" },
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
