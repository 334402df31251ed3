//! The latency sweep of whole worlds, by hand: the catalogue's `latency-*` scenarios drawn over
//! their dimensions (n = 4 or 7, 20 or 60 Hz, 25, 50 or 100 ms one way with ± 20 % and 1 %
//! loss, a validator crashed at 2 s or none), each in a 1,000-object world with bots, on whole
//! node cores in the deterministic cluster. Every run must keep its roots equal, see no
//! desync, and execute at least 0.99 of the ticks due on every honest node (less the start and
//! the time a tick takes to be handed out, as the catalogue's scenarios allow).

use std::path::Path;

use metatopia_lab::scenario::{self, Options};
use metatopia_scenarios::spec::Scenario;

/// One seed's draw: (n, Hz, one-way ms, crashed node).
fn draw(seed: u64) -> (u32, u32, u32, Option<u32>) {
    let h = blake3::hash(&seed.to_le_bytes());
    let b = h.as_bytes();
    let n = if b[0].is_multiple_of(2) { 4 } else { 7 };
    let hz = if b[1].is_multiple_of(2) { 20 } else { 60 };
    let delay = [25, 50, 100][usize::from(b[2] % 3)];
    let crash = b[3].is_multiple_of(2).then(|| u32::from(b[4]) % n);
    (n, hz, delay, crash)
}

/// The scenario of a draw, as a file would say it.
fn scenario_text(n: u32, hz: u32, delay: u32, crash: Option<u32>) -> String {
    const SECS: f64 = 15.0;
    // The start, and the ≤ 8 one-way delays (at their longest) a tick takes to be handed out.
    let allowance = 0.5 + 8.0 * f64::from(delay) * 1.2 / 1000.0;
    let min_ticks = (0.99 * f64::from(hz) * (SECS - allowance)).floor() as u64;
    let epochs = if hz == 60 { "epoch_ticks = 150\n" } else { "" };
    let fault = crash.map_or(String::new(), |c| format!("[[faults]]\nkind = \"crash\"\nnode = {c}\nat_secs = 2\n\n"));
    format!(
        "name = \"latency-sweep\"\nduration_secs = {SECS}\n\n[validators]\ncount = {n}\n\n\
         [network]\ndelay_min_ms = {}\ndelay_max_ms = {}\nloss_percent = 1\n\n\
         [world]\ntick_rate_hz = {hz}\n{epochs}random_objects = 1000\nrandom_players = 16\nmoving_per_mille = 100\n\n\
         [bots]\nevents_per_tick = 4\n\n{fault}\
         [[expect]]\nkind = \"min_ticks\"\nticks = {min_ticks}\n\n[[expect]]\nkind = \"roots_equal\"\n\n[[expect]]\nkind = \"no_desync\"\n",
        delay * 4 / 5,
        delay * 6 / 5,
    )
}

#[test]
#[ignore = "long: run by hand, SEEDS=1000 cargo test --release -p metatopia-lab --test lab -- --ignored latency::world_seeds_by_hand --nocapture"]
fn world_seeds_by_hand() {
    let count: u64 = std::env::var("SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let first: u64 = std::env::var("SEEDS_FROM").ok().and_then(|s| s.parse().ok()).unwrap_or(1);
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("scenarios").join("scripts");
    let seeds: Vec<u64> = (first..first + count).collect();
    let failed: Vec<String> = std::thread::scope(|s| {
        let half = seeds.len().div_ceil(2).max(1);
        let handles: Vec<_> = seeds
            .chunks(half)
            .map(|chunk| {
                let scripts = &scripts;
                s.spawn(move || {
                    let mut failed = Vec::new();
                    for &seed in chunk {
                        let (n, hz, delay, crash) = draw(seed);
                        let text = scenario_text(n, hz, delay, crash);
                        let spec = Scenario::parse(&text).unwrap();
                        let opts = Options { seed, scripts_dir: scripts.clone(), timeline: false };
                        let (report, _) = scenario::run(&spec, &text, &opts, &mut |_, _| {}).unwrap();
                        if !report.passed() {
                            failed.push(format!(
                                "seed {seed} (n={n}, {hz} Hz, {delay} ms, crash {crash:?}; again with SEEDS_FROM={seed} SEEDS=1):\n{}",
                                report.table()
                            ));
                        }
                        if seed % 50 == 0 {
                            eprintln!("seed {seed} done");
                        }
                    }
                    failed
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    eprintln!("{} seeds from {first}: {} failed", seeds.len(), failed.len());
    // One seed again: SEEDS_FROM=<seed> SEEDS=1 and the command in the `ignore` reason.
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
