//! Execution backpressure (`Config::max_exec_lag`): agreement waits for the application instead
//! of running ahead of it, and resumes as soon as the application reports.

use std::sync::Arc;

use metatopia_consensus::{Config, Digest, Message, Output, SigCache, SigningKey, Validator, ValidatorIndex, VoteKind};

fn key(i: u16) -> SigningKey {
    let mut b = [3u8; 32];
    b[..2].copy_from_slice(&i.to_le_bytes());
    SigningKey::from_bytes(&b)
}

/// Four validators on an instant, lossless network; `now` advances 10 ms a round. Returns the
/// ticks each validator committed. `report` says whether the application reports roots.
fn run(vs: &mut [Validator], now: &mut u64, rounds: u32, report: bool, committed: &mut [Vec<u64>]) {
    run_dropping(vs, now, rounds, report, committed, |_| false);
}

/// [`run`], losing the messages `lost` picks.
fn run_dropping(
    vs: &mut [Validator],
    now: &mut u64,
    rounds: u32,
    report: bool,
    committed: &mut [Vec<u64>],
    lost: impl Fn(&Message) -> bool,
) {
    for _ in 0..rounds {
        *now += 10_000;
        for v in vs.iter_mut() {
            v.handle_timeout(*now);
        }
        // Deliver until quiet.
        loop {
            let mut mail: Vec<(usize, Option<ValidatorIndex>, Message)> = Vec::new();
            for (i, v) in vs.iter_mut().enumerate() {
                while let Some(o) = v.poll_output() {
                    match o {
                        Output::Broadcast(m) => mail.push((i, None, m)),
                        Output::Send(to, m) => mail.push((i, Some(to), m)),
                        Output::Committed(c) => {
                            committed[i].push(c.block.tick.0);
                            if report {
                                v.report_root(c.block.tick, Digest([c.block.tick.0 as u8; 32]));
                            }
                        }
                        _ => {}
                    }
                }
            }
            if mail.is_empty() {
                break;
            }
            for (from, to, m) in mail.into_iter().filter(|(_, _, m)| !lost(m)) {
                for (j, v) in vs.iter_mut().enumerate() {
                    if j != from && to.is_none_or(|t| t.0 as usize == j) {
                        v.handle_message(*now, ValidatorIndex(from as u16), m.clone());
                    }
                }
            }
        }
    }
}

#[test]
fn a_leader_waits_for_execution_and_resumes_when_it_reports() {
    let keys: Vec<_> = (0..4).map(|i| key(i).verifying_key()).collect();
    let cfg = Config {
        period_us: 50_000,
        leader_timeout_us: 10_000_000, // long: no view changes in this test
        notarize_timeout_us: 20_000_000,
        retry_us: 10_000_000,
        max_exec_lag: Some(2),
        sig_cache: Arc::new(SigCache::default()),
        ..Config::default()
    };
    let mut vs: Vec<Validator> = (0..4).map(|i| Validator::new(cfg.clone(), key(i), keys.clone(), 0)).collect();
    let mut now = 0;
    let mut committed = vec![Vec::new(); 4];
    // Nobody executes: agreement stops a few ticks ahead of execution (tick 0 executed by none).
    run(&mut vs, &mut now, 300, false, &mut committed);
    let stalled = committed[0].last().copied();
    assert!(stalled.is_some_and(|t| t <= 3), "agreement ran ahead of execution: {stalled:?}");
    // The applications catch up: report what was committed, then keep reporting.
    for (v, c) in vs.iter_mut().zip(&committed) {
        for t in c {
            v.report_root(metatopia_consensus::Tick(*t), Digest([*t as u8; 32]));
        }
    }
    run(&mut vs, &mut now, 300, true, &mut committed);
    let resumed = committed[0].last().copied().unwrap();
    assert!(resumed >= 40, "ticks resumed at the tick rate: {resumed}");
    for c in &committed {
        assert_eq!(c, &committed[0]);
    }

    // Control: without backpressure the same silent applications do not hold agreement back.
    let free = Config { max_exec_lag: None, ..cfg };
    let mut vs: Vec<Validator> = (0..4).map(|i| Validator::new(free.clone(), key(i), keys.clone(), 0)).collect();
    let (mut now, mut committed) = (0, vec![Vec::new(); 4]);
    run(&mut vs, &mut now, 300, false, &mut committed);
    assert!(committed[0].len() >= 40, "{}", committed[0].len());
}

/// Blocks notarized but not finalized (their finalize votes lost, as when their views also
/// time out under load) are not handed out, so they are not execution's to catch up with: the
/// leaders keep proposing on them, and once votes get through again the chain commits. When
/// they counted against `max_exec_lag`, every leader waited for an execution that waited for
/// the next block, and the sim stopped for good.
#[test]
fn blocks_waiting_for_finalization_do_not_hold_the_leaders_back() {
    let keys: Vec<_> = (0..4).map(|i| key(i).verifying_key()).collect();
    let cfg = Config {
        period_us: 50_000,
        leader_timeout_us: 1_000_000,
        notarize_timeout_us: 2_000_000,
        retry_us: 500_000,
        max_exec_lag: Some(2),
        sig_cache: Arc::new(SigCache::default()),
        ..Config::default()
    };
    let mut vs: Vec<Validator> = (0..4).map(|i| Validator::new(cfg.clone(), key(i), keys.clone(), 0)).collect();
    let (mut now, mut committed) = (0, vec![Vec::new(); 4]);
    let finalize = |m: &Message| {
        m.vote().is_some_and(|v| v.kind == VoteKind::Finalize)
            || matches!(m, Message::Certificate(c) if c.kind == VoteKind::Finalize)
    };
    // The applications execute at once; every finalize vote is lost for a while.
    run(&mut vs, &mut now, 100, true, &mut committed);
    let before = committed[0].len();
    assert!(before >= 10, "ticks commit at first: {before}");
    run_dropping(&mut vs, &mut now, 100, true, &mut committed, finalize);
    let notarized = vs[0].describe();
    run(&mut vs, &mut now, 300, true, &mut committed);
    let after = committed[0].len();
    assert!(after >= before + 40, "ticks resumed: {before} then {after} ({notarized}; now {})", vs[0].describe());
    for c in &committed {
        assert_eq!(c[..before], committed[0][..before]);
    }
}
