//! The scenario catalogue in the deterministic cluster, reproducibility, synctest and replay.

use crate::support::{Scratch, cli};

use std::path::{Path, PathBuf};

use metatopia_lab::scenario::{self, Options, Recording};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("scenarios")
}

fn catalogue() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("catalogue"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

fn run(path: &Path, seed: Option<u64>) -> (scenario::Report, Recording) {
    let (spec, text) = scenario::load(path).unwrap();
    let opts = Options { seed: seed.unwrap_or(spec.seed), scripts_dir: root().join("scripts"), timeline: false };
    scenario::run(&spec, &text, &opts, &mut |_, _| {}).unwrap()
}

/// Every other scenario of the catalogue, from the `half`th (0 or 1): two tests, so the two
/// halves run side by side.
fn every_other_catalogue_scenario_passes_in_simulation(half: usize) {
    let files = catalogue();
    assert!(files.len() >= 15, "the catalogue has {} scenarios", files.len());
    let mut failed = Vec::new();
    for f in files.iter().skip(half).step_by(2) {
        let (report, _) = run(f, None);
        // Every scenario checks something beyond the built-in agreement verdict.
        assert!(report.verdicts.len() >= 2, "{}: no expectations", f.display());
        if !report.passed() {
            failed.push(report.table());
        }
    }
    assert!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
}

#[test]
fn every_catalogue_scenario_passes_in_simulation_first_half() {
    every_other_catalogue_scenario_passes_in_simulation(0);
}

#[test]
fn every_catalogue_scenario_passes_in_simulation_second_half() {
    every_other_catalogue_scenario_passes_in_simulation(1);
}

/// The worlds kept for measuring by hand (`scenarios/worlds/`, too big to run here) still load
/// as `devnet --scenario` loads them.
#[test]
fn every_world_for_measuring_by_hand_loads() {
    let mut n = 0;
    for e in std::fs::read_dir(root().join("worlds")).unwrap() {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let (spec, _) = scenario::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(spec.world.random_objects > 0, "{}", path.display());
            n += 1;
        }
    }
    assert!(n >= 1, "no world in scenarios/worlds");
}

#[test]
fn the_same_seed_gives_the_same_run_and_another_seed_another() {
    let f = root().join("catalogue").join("lossy-network.toml");
    let (a, ra) = run(&f, Some(5));
    let (b, rb) = run(&f, Some(5));
    assert_eq!(a, b);
    assert_eq!(ra.ticks, rb.ticks);
    let (c, _) = run(&f, Some(6));
    assert_ne!(a.trace, c.trace);
}

#[test]
fn a_failing_scenario_prints_a_command_that_reproduces_the_failure_exactly() {
    let dir = Scratch::made("scenario-fail");
    let text = std::fs::read_to_string(root().join("catalogue").join("lossy-network.toml")).unwrap()
        + "\n[[expect]]\nkind = \"min_ticks\"\nticks = 100000\n";
    let file = dir.join("impossible.toml");
    std::fs::write(&file, text).unwrap();
    let scripts = root().join("scripts");
    let (ok, out, err) =
        cli(&["scenario", "run", file.to_str().unwrap(), "--seed", "77", "--scripts", scripts.to_str().unwrap()]);
    assert!(!ok, "{out}");
    assert!(out.contains("FAIL") && err.contains("seed 77"), "{out}{err}");
    let replay = err.split("replay exactly with: ").nth(1).expect("a replay command").trim();
    let words: Vec<&str> = replay.split_whitespace().collect();
    assert_eq!(words[0], "metatopia-lab");
    let mut args: Vec<&str> = words[1..].to_vec();
    args.extend(["--scripts", scripts.to_str().unwrap()]);
    let (ok2, out2, _) = cli(&args);
    assert!(!ok2);
    assert_eq!(out, out2, "the replay reproduces the run exactly (same table, same trace)");
}

#[test]
fn synctest_and_replay_verify_pass_on_real_runs_and_catch_a_tampered_recording() {
    let scripts = root().join("scripts");
    let balls = root().join("catalogue").join("physics-balls.toml");
    let (ok, out, err) = cli(&["synctest", balls.to_str().unwrap(), "--scripts", scripts.to_str().unwrap()]);
    assert!(ok && out.contains("every root equal"), "{out}{err}");

    let dir = Scratch::made("recording");
    let rec = dir.join("door.rec");
    let door = root().join("catalogue").join("door.toml");
    let (ok, out, err) = cli(&["scenario", "run", door.to_str().unwrap(), "--record", rec.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli(&["replay", "verify", rec.to_str().unwrap()]);
    assert!(ok && out.contains("every root equals the recorded one"), "{out}{err}");

    // Change one committed input: the replay names the tick where the roots part.
    let mut r: Recording = postcard::from_bytes(&std::fs::read(&rec).unwrap()).unwrap();
    let t = r.ticks.iter().position(|(l, _)| !l.events.is_empty()).expect("a tick with events");
    r.ticks[t].0.events.clear();
    std::fs::write(&rec, postcard::to_allocvec(&r).unwrap()).unwrap();
    let (ok, _, err) = cli(&["replay", "verify", rec.to_str().unwrap()]);
    assert!(!ok && err.contains(&format!("tick {}", r.ticks[t].0.tick)) && err.contains("differs"), "{err}");
}

#[test]
fn a_bad_scenario_file_is_an_error_naming_the_line() {
    let dir = Scratch::made("scenario-bad");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "name = \"bad\"\nduration_secs = 1\n\n[[faults]]\nkind = \"byzantine\"\nnode = 9\n").unwrap();
    let (ok, _, err) = cli(&["scenario", "run", file.to_str().unwrap()]);
    assert!(!ok && err.contains("line 4") && err.contains("node"), "{err}");
    std::fs::write(&file, "name = \"bad\"\nduration_secs = 1\nwordl = 3\n").unwrap();
    let (ok, _, err) = cli(&["scenario", "run", file.to_str().unwrap()]);
    assert!(!ok && err.contains("line 3") && err.contains("wordl"), "{err}");
}

/// Two sims of four real nodes each (eight processes over libp2p): a scripted object and a
/// ball cross the border between them, each exactly once, the counter's state intact.
#[test]
fn two_sims_side_by_side_hand_bodies_over_as_real_processes() {
    let dir = Scratch::new("scenario-sims");
    let file = root().join("catalogue").join("border-crossing.toml");
    let (ok, out, err) = cli(&["scenario", "run", file.to_str().unwrap(), "--real", "--dir", dir.to_str().unwrap()]);
    assert!(ok && out.contains("passed") && !out.contains("FAIL"), "{out}\n{err}");
    assert!(out.contains("2 left, 2 arrived, 0 in transit"), "{out}");
}

#[test]
fn a_subset_of_the_catalogue_passes_as_real_processes_on_loopback() {
    let base = Scratch::new("scenario-real");
    // validator-admission: an observer process is admitted and votes from the epoch boundary,
    // a removed validator only follows, and the sim keeps its quorum through two crashes only
    // because the admitted node votes.
    for name in ["door", "echo-chat", "ban-and-replay", "crash-restart", "diverging-node", "validator-admission"] {
        let file = root().join("catalogue").join(format!("{name}.toml"));
        let dir = base.join(name);
        let (ok, out, err) =
            cli(&["scenario", "run", file.to_str().unwrap(), "--real", "--dir", dir.to_str().unwrap()]);
        assert!(ok && out.contains("passed") && !out.contains("FAIL"), "{name}:\n{out}\n{err}");
        assert!(out.contains("real run"), "{out}");
    }
    // Simulation-only faults are refused with the line, not ignored.
    let (ok, _, err) =
        cli(&["scenario", "run", root().join("catalogue").join("partition-heal.toml").to_str().unwrap(), "--real"]);
    assert!(!ok && err.contains("simulation-only") && err.contains("line"), "{err}");
}

#[test]
fn a_node_that_crashes_between_a_commit_and_its_execution_loses_no_committed_tick() {
    // Nodes execute a commit after their votes have left (in the cluster EXEC_DELAY_US later);
    // the agreement's persisted state counts the commit as handed out from the moment it is. A
    // crash in that window must still find the tick in the node's log when it restarts, or the
    // node stops at the gap ("commit out of order"). Crash times a fifth of the window apart,
    // over a tick period, put several crashes inside it. Each run stops 8 s in rather than the
    // catalogue's 12 (the node is back at 4.5 s), its tick floor scaled to match.
    let (mut spec, text) = scenario::load(&root().join("catalogue").join("crash-restart.toml")).unwrap();
    let (from, to) = (spec.duration_secs, 8.0);
    spec.duration_secs = to;
    for e in &mut spec.expect {
        if let metatopia_scenarios::spec::Expect::MinTicks { ticks } = e.get_mut() {
            *ticks = (*ticks as f64 * to / from) as u64;
        }
    }
    let floor = |e: &metatopia_scenarios::spec::Expect| matches!(e, metatopia_scenarios::spec::Expect::MinTicks { ticks } if *ticks >= 130);
    assert!(spec.expect.iter().any(|e| floor(e.get_ref())), "a tick floor is checked");
    let window = metatopia_lab::simnet::EXEC_DELAY_US as f64 / 1e6;
    let opts = Options { seed: spec.seed, scripts_dir: root().join("scripts"), timeline: false };
    let mut failed = Vec::new();
    for k in 0..30 {
        let at = 3.0 + f64::from(k) * window / 5.0 * 1.7;
        spec.faults[0].get_mut().at_secs = at;
        spec.faults[0].get_mut().until_secs = Some(4.5);
        let (report, _) = scenario::run(&spec, &text, &opts, &mut |_, _| {}).unwrap();
        if !report.passed() {
            failed.push(format!("crash at {at:.5} s:\n{}", report.table()));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The power of every node cut at once, over many seeds (the catalogue runs one): each restarts
/// from what its simulated disk synced, and nothing committed changes (the always-checked
/// verdict: no tick re-executed to another root, no honest validator voting twice). The full
/// sweep of 1,000 seeds is `metatopia-lab scenario run scenarios/catalogue/power-loss-all.toml
/// --seeds 1000`.
#[test]
fn a_power_loss_of_every_node_changes_nothing_committed_over_a_hundred_seeds() {
    let f = root().join("catalogue").join("power-loss-all.toml");
    let mut failed = Vec::new();
    for seed in 1..=100 {
        let (report, _) = run(&f, Some(seed));
        let restarts = &report.verdicts[1];
        assert!(restarts.what.contains("nothing committed changed"), "{}", restarts.what);
        assert!(restarts.detail.contains("4 restarts from disk") || !restarts.ok, "{}", restarts.detail);
        if !report.passed() {
            failed.push(report.table());
        }
    }
    assert!(failed.is_empty(), "failed:\n{}", failed.join("\n"));
}

/// Seed 307 of `restart-after-snapshot` (found by the 1,000-seed sweep): the joiner executed
/// the tick before its first epoch's last from blocks it fetched before its own agreement had
/// finalized the epoch's last block, so its epoch switch found no final block; the switch was
/// never tried again and the node stayed at tick 80 while its peers went on (until its 10-s
/// stranded rescue, which the scenario's restarts kept resetting). It now switches once the
/// block is final, and executes from there on like the others.
#[test]
fn a_joiner_that_executes_an_epochs_end_before_finalizing_it_switches_once_it_has() {
    let f = root().join("catalogue").join("restart-after-snapshot.toml");
    let (report, _) = run(&f, Some(307));
    assert!(report.passed(), "{}", report.table());
}

/// Seed 264 of `disk-full` (found by a 300-seed sweep): node 2, restarted 3 s after its disk
/// filled, came back in the view it had stopped in, where it led, and proposed there a block
/// stamped with its clock. The others, 60 ticks on, took that stale block's time into their
/// tick schedule: the next tick was due 3 s late, every leader waited for it, their views
/// timed out one after another, and the sim stood still for 3 s (177 of 240 ticks). The
/// schedule now follows only blocks that can still be on the chain.
#[test]
fn a_stale_proposal_from_a_restarted_leader_does_not_move_the_tick_schedule() {
    let f = root().join("catalogue").join("disk-full.toml");
    let (report, _) = run(&f, Some(264));
    assert!(report.passed(), "{}", report.table());
}

/// Seed 279 of `bit-flips` (found by a 300-seed sweep): node 1's log lost the ticks its
/// agreement had committed last, so it took a certified snapshot. The first snapshots its
/// peers sent could not be certified (the roots they reported for that tick came before it
/// restarted), and a peer served at most one snapshot every two seconds while the node asked
/// once a second: the ask two seconds after a served one came a hair early and was refused,
/// and the node was still at tick 256 when the run ended. Peers now answer each ask.
#[test]
fn a_node_repairing_a_damaged_log_gets_a_newer_snapshot_at_each_ask() {
    let f = root().join("catalogue").join("bit-flips.toml");
    let (report, _) = run(&f, Some(279));
    assert!(report.passed(), "{}", report.table());
}

/// Seed 260 of `bit-flips` (found by a 300-seed sweep): node 3 restarted from its commit log,
/// whose newest block its journal held already; recalling the log skipped that block, so the
/// history its leader choice reads had a hole and started over. Node 3 chose leaders by round
/// robin for the next 144 views while two peers chose by reputation, and with node 1 (its log
/// damaged) choosing by round robin too, the views split two against two: 309 of 320 ticks.
/// The held block is now recorded like the others.
#[test]
fn a_restarted_validator_recalls_its_whole_leader_history() {
    let f = root().join("catalogue").join("bit-flips.toml");
    let (report, _) = run(&f, Some(260));
    assert!(report.passed(), "{}", report.table());
}
