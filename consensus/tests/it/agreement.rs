//! The agreement suite (DESIGN §6, §13): the Simplex core on the deterministic cluster, with
//! every Byzantine kind, twins, crashes, partitions, loss, duplication, reordering and clock
//! skew. Invariants at every step: honest validators commit the same block at every tick, the
//! commits form a chain, every commit carries valid certificates; after the network heals,
//! commits resume within a bound.
use crate::common;

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::common::{Checker, MS, Role, SEC, Setup, build, random_schedule, run_schedule, submit};
use metatopia_consensus::mocks::Behaviour;
use metatopia_consensus::{Message, SigCache};
use metatopia_scenarios::{Fault, NetConfig, NodeId, Partition, Time};

/// Commits resume within this much virtual time after faults end.
const RESUME_BOUND: u64 = 2 * SEC;

fn lan() -> NetConfig {
    NetConfig { delay_min_us: 300, delay_max_us: 2_000, loss_ppm: 0, duplicate_ppm: 0 }
}

fn run_setup(setup: &Setup, seed: u64, secs: u64) -> (Checker, metatopia_scenarios::Cluster<common::Node>) {
    let cache = Arc::new(SigCache::new());
    let mut cluster = build(setup, seed, lan(), &cache);
    let mut checker = Checker::new(setup.n, &cache);
    for step in 0..secs * 50 {
        let who = (step % u64::from(setup.n)) as NodeId;
        submit(&mut cluster, who, format!("e{step}").into_bytes());
        cluster.run_until((step + 1) * 20 * MS, |c| checker.check(c));
    }
    (checker, cluster)
}

#[test]
fn honest_validators_commit_one_tick_per_period() {
    for n in [4u16, 7] {
        let (checker, cluster) = run_setup(&Setup::honest(n), 1, 3);
        assert!(checker.violations.is_empty(), "{:?}", checker.violations);
        // 3 s at a 50 ms period: about 60 ticks (minus the one-tick seed lag and start-up).
        let ticks = checker.highest_tick().unwrap();
        assert!((50..=60).contains(&ticks), "n={n}: {ticks} ticks");
        // Every event submitted in the first two seconds was committed, exactly once.
        let node = cluster.node(0).unwrap();
        let events: Vec<&[u8]> = node.commits.iter().flat_map(|(_, c)| c.block.events.iter().map(|e| &e[..])).collect();
        for step in 0..100u64 {
            let e = format!("e{step}").into_bytes();
            assert_eq!(events.iter().filter(|x| **x == e.as_slice()).count(), 1, "n={n}: event {step}");
        }
        // Good-case latency: proposal to commit within a few network delays plus the seed lag.
        assert_eq!(node.evidence, 0);
    }
}

#[test]
fn every_byzantine_kind_with_f_faulty_keeps_safety_and_liveness() {
    for n in [4u16, 7] {
        for b in Behaviour::ALL {
            let mut setup = Setup::honest(n);
            let f = setup.f();
            for i in 0..f {
                setup.roles[(1 + 2 * i) as usize] = Role::Byzantine(b);
            }
            let (checker, cluster) = run_setup(&setup, 7, 4);
            assert!(checker.violations.is_empty(), "n={n} {b:?}: {:?}", checker.violations);
            let ticks = checker.highest_tick().unwrap_or(0);
            assert!(ticks >= 25, "n={n} {b:?}: only {ticks} ticks in 4 s");
            let evidence: u32 =
                (0..n as NodeId).filter_map(|i| cluster.node(i)).filter(|x| x.honest()).map(|x| x.evidence).sum();
            if matches!(b, Behaviour::DoubleVote | Behaviour::Equivocate) {
                assert!(evidence > 0, "n={n} {b:?}: conflicting votes must be reported as evidence");
            }
        }
    }
}

#[test]
fn twins_keep_safety() {
    for n in [4u16, 7] {
        for twin in [0u16, 2] {
            let mut setup = Setup::honest(n);
            setup.twin_of = Some(twin);
            let (checker, _) = run_setup(&setup, 11 + u64::from(twin), 4);
            assert!(checker.violations.is_empty(), "n={n} twin of {twin}: {:?}", checker.violations);
            assert!(checker.highest_tick().unwrap_or(0) >= 20, "n={n}: twins stalled the chain");
        }
    }
}

#[test]
fn a_crashed_leader_costs_at_most_one_timeout_per_view() {
    let cache = Arc::new(SigCache::new());
    let setup = Setup::honest(4);
    let mut cluster = build(&setup, 3, lan(), &cache);
    let mut checker = Checker::new(4, &cache);
    cluster.schedule_fault(SEC, Fault::Crash(2));
    cluster.run_until(4 * SEC, |c| checker.check(c));
    assert!(checker.violations.is_empty(), "{:?}", checker.violations);
    let commits: Vec<u64> = cluster.node(0).unwrap().commits.iter().map(|(t, _)| *t).collect();
    let worst_gap = commits.windows(2).filter(|w| w[0] > SEC).map(|w| w[1] - w[0]).max().unwrap();
    let cfg = common::config(&cache);
    // A dead leader's view is skipped after one leader timeout (plus a period and delays).
    assert!(worst_gap <= cfg.leader_timeout_us + cfg.period_us + 20 * MS, "gap {} ms", worst_gap / MS);
    // One view in four waits a leader timeout: about 3 ticks per 400 ms after the crash.
    assert!(checker.highest_tick().unwrap() >= 35, "{:?}", checker.highest_tick());
}

/// Runs 4 honest validators at 60 Hz for 10 s of virtual time on a network with these one-way
/// delays, an event submitted every 50 ms, and `crash` (if any) crashed at 2 s. Returns the
/// ticks node 0 committed from 3 s to 10 s, and the longest an event took from its submission
/// to its commit there.
fn rate_at(min_ms: u64, max_ms: u64, max_span_us: Option<u64>, crash: Option<NodeId>) -> (usize, u64) {
    let (ticks, _, worst) = rate_and_time(min_ms, max_ms, max_span_us, crash, 0);
    (ticks, worst)
}

/// As [`rate_at`], and the ticks whose BFT time is from 3 s to 10 s.
fn rate_and_time(
    min_ms: u64,
    max_ms: u64,
    max_span_us: Option<u64>,
    crash: Option<NodeId>,
    skew_us: i64,
) -> (usize, usize, u64) {
    let cache = Arc::new(SigCache::new());
    let setup = Setup { period_us: Some(16_667), max_span_us, ..Setup::honest(4) };
    let net = NetConfig { delay_min_us: min_ms * MS, delay_max_us: max_ms * MS, loss_ppm: 0, duplicate_ppm: 0 };
    let mut cluster = build(&setup, 7, net, &cache);
    let mut checker = Checker::new(4, &cache);
    if let Some(node) = crash {
        cluster.schedule_fault(2 * SEC, Fault::Crash(node));
    }
    if skew_us != 0 {
        cluster.set_skew(2, skew_us);
    }
    let mut submitted = Vec::new();
    for step in 0..200u64 {
        let who = [0, 1, 3][(step % 3) as usize];
        let e = format!("e{step}").into_bytes();
        submit(&mut cluster, who, e.clone());
        submitted.push((step * 50 * MS, e));
        cluster.run_until((step + 1) * 50 * MS, |c| checker.check(c));
    }
    cluster.run_until(12 * SEC, |c| checker.check(c));
    assert!(checker.violations.is_empty(), "{:?}", checker.violations);
    let commits = &cluster.node(0).unwrap().commits;
    let ticks = commits.iter().filter(|(at, _)| (3 * SEC..10 * SEC).contains(at)).count();
    let timed = commits.iter().filter(|(_, c)| (3_000..10_000).contains(&c.block.time_ms)).count();
    let mut took = Vec::new();
    for (at, e) in &submitted {
        let found: Vec<Time> =
            commits.iter().filter(|(_, c)| c.block.events.iter().any(|x| x[..] == e[..])).map(|(t, _)| *t).collect();
        assert_eq!(found.len(), 1, "event {:?} committed {} times", String::from_utf8_lossy(e), found.len());
        took.push(found[0] - at);
    }
    took.sort_unstable();
    let q = |p: usize| took[(took.len() - 1) * p / 100] / MS;
    eprintln!(
        "{min_ms}-{max_ms} ms one-way, span {max_span_us:?}, crash {crash:?}, skew {} ms: {ticks} ticks in 7 s; input to hand-out p50 {} ms, p99 {} ms",
        skew_us / 1_000,
        q(50),
        q(99)
    );
    (ticks, timed, took[took.len() - 1])
}

/// Ticks are not bound to agreement rounds (R1 spans): at one-way delays of 20 to 120 ms, where
/// a round trip takes up to 14 periods of 60 Hz, the sim commits its ticks at its rate, and
/// every event once, within a few round trips. With one tick a block the same network gives
/// a tick a round trip.
#[test]
fn a_sim_keeps_its_tick_rate_at_internet_latency() {
    let expected = 7 * 60; // 3 s to 10 s at 60 Hz
    for (min_ms, max_ms) in [(20, 30), (40, 60), (80, 120)] {
        let (ticks, timed, worst) = rate_and_time(min_ms, max_ms, None, None, 0);
        assert!(ticks * 100 >= expected * 97, "{min_ms}-{max_ms} ms: {ticks} ticks of {expected}");
        // Never faster than the rate in agreed time (a block's ticks are committed together).
        assert!(timed <= expected + 1, "{min_ms}-{max_ms} ms: {timed} ticks in 7 s of BFT time");
        // Proposed in the next block, committed once its child is: about five one-way delays.
        assert!(worst <= 8 * max_ms * MS, "{min_ms}-{max_ms} ms: an event took {} ms", worst / MS);
        eprintln!("{min_ms}-{max_ms} ms one-way: {ticks} ticks of {expected}, slowest event {} ms", worst / MS);
    }
    let (one_a_block, _) = rate_at(40, 60, Some(0), None);
    assert!(one_a_block * 2 < expected, "one tick a block: {one_a_block} ticks of {expected}");
}

/// Input to hand-out on a quick network at 60 Hz, 4 validators: the ticks handed out from 3 s
/// to 10 s, every event's submission to its hand-out on node 0 (sorted), and the most blocks
/// one tick took.
fn input_latency(fill_lead_us: Option<u64>, min_us: u64, max_us: u64) -> (usize, Vec<u64>, usize) {
    let cache = Arc::new(SigCache::new());
    let setup = Setup { period_us: Some(16_667), fill_lead_us, ..Setup::honest(4) };
    let net = NetConfig { delay_min_us: min_us, delay_max_us: max_us, loss_ppm: 0, duplicate_ppm: 0 };
    let mut cluster = build(&setup, 5, net, &cache);
    let mut checker = Checker::new(4, &cache);
    let mut submitted = Vec::new();
    // An event every 7 ms (out of step with the period), from three of the validators.
    for step in 0..1_500u64 {
        let who = [0, 1, 3][(step % 3) as usize];
        let e = format!("e{step}").into_bytes();
        submit(&mut cluster, who, e.clone());
        submitted.push((step * 7 * MS, e));
        cluster.run_until((step + 1) * 7 * MS, |c| checker.check(c));
    }
    cluster.run_until(11 * SEC, |c| checker.check(c));
    assert!(checker.violations.is_empty(), "{:?}", checker.violations);
    let node = cluster.node(0).unwrap();
    let ticks = node.commits.iter().filter(|(at, _)| (3 * SEC..10 * SEC).contains(at)).count();
    let mut at_of = std::collections::BTreeMap::new();
    for (at, c) in &node.commits {
        for e in &c.block.events {
            assert!(at_of.insert(e.to_vec(), *at).is_none(), "an event handed out twice");
        }
    }
    // From 1 s on (the start waits for a schedule and a round-trip estimate).
    let mut took: Vec<u64> = submitted.iter().filter(|(at, _)| *at >= SEC).map(|(at, e)| at_of[e] - at).collect();
    took.sort_unstable();
    // Blocks a tick: the fills' openers are in the chain behind them.
    let most = node.commits.iter().map(|(_, c)| 1 + usize::from(c.opener.is_some())).max().unwrap_or(0);
    (ticks, took, most)
}

/// R1 fills: with each tick opened empty and its events proposed a lead before the next tick
/// is due, an event is handed out about half a period after it came plus the lead and a round,
/// not a period and a half: at 60 Hz on a quick network, p50 within a period + 2 ms (the
/// target for a real node on loopback) where one block a tick takes about 1.5 periods. The
/// rate, the chain and every event handed out once are kept; never more than two blocks a tick.
#[test]
fn fills_hand_events_out_half_a_period_sooner() {
    let period = 16_667;
    let q = |t: &[u64], p: usize| t[(t.len() - 1) * p / 100];
    let (ticks_off, off, most_off) = input_latency(None, 200, 600);
    let (ticks_on, on, most_on) = input_latency(Some(2 * MS), 200, 600);
    eprintln!(
        "one block a tick: {ticks_off} ticks, p50 {} µs, p99 {} µs; fills: {ticks_on} ticks, p50 {} µs, p99 {} µs",
        q(&off, 50),
        q(&off, 99),
        q(&on, 50),
        q(&on, 99)
    );
    let expected = 7 * 60;
    for ticks in [ticks_off, ticks_on] {
        assert!(ticks * 100 >= expected * 99 && ticks <= expected + 2, "{ticks} ticks of {expected}");
    }
    assert_eq!((most_off, most_on), (1, 2));
    assert!(q(&off, 50) > period + 2 * MS, "one block a tick: p50 {} µs", q(&off, 50));
    assert!(q(&on, 50) <= period + 2 * MS, "fills: p50 {} µs", q(&on, 50));
    // An event that just missed a fill waits a period for the next, and the lead and a round
    // more: never the period and a half one block a tick averages.
    assert!(q(&on, 100) < period * 3 / 2, "fills: slowest {} µs", q(&on, 100));
    // Slower rounds (1-2 ms one way, as between busy node processes): the lead grows with them.
    let (_, off, _) = input_latency(None, 1_000, 2_000);
    let (ticks, on, most) = input_latency(Some(2 * MS), 1_000, 2_000);
    eprintln!(
        "1-2 ms one way: one block a tick p50 {} µs; fills p50 {} µs, p99 {} µs",
        q(&off, 50),
        q(&on, 50),
        q(&on, 99)
    );
    assert!(ticks * 100 >= expected * 99 && most == 2, "{ticks} ticks, {most} blocks a tick");
    assert!(q(&on, 50) + period / 2 < q(&off, 50), "fills p50 {} µs, one block a tick {} µs", q(&on, 50), q(&off, 50));
}

/// An epoch's last tick is decided in a block of its own, whatever the spans before it: so the
/// epoch hands out every tick before it (the next epoch, anchored on that block, hands it out),
/// and no block goes beyond it.
#[test]
fn an_epoch_ends_on_its_last_tick_alone_at_internet_latency() {
    let cache = Arc::new(SigCache::new());
    let setup = Setup { period_us: Some(16_667), last_tick: Some(300), ..Setup::honest(4) };
    let net = NetConfig { delay_min_us: 40 * MS, delay_max_us: 60 * MS, loss_ppm: 0, duplicate_ppm: 0 };
    let mut cluster = build(&setup, 11, net, &cache);
    let mut checker = Checker::new(4, &cache);
    cluster.run_until(10 * SEC, |c| checker.check(c));
    assert!(checker.violations.is_empty(), "{:?}", checker.violations);
    for i in 0..4 {
        let node = cluster.node(i).unwrap();
        let (_, last) = node.commits.last().unwrap();
        assert_eq!((last.block.tick.0, last.filler), (299, false), "node {i}: the last tick handed out");
        let v = node.validator().unwrap();
        assert!(v.finished(), "node {i}");
        let (end, _) = v.final_block().unwrap();
        assert_eq!((end.tick.0, end.parent.digest), (300, last.digest), "node {i}: the epoch's last block");
    }
    // Spans were taken before the end (a round trip is six periods here).
    let spans = cluster.node(0).unwrap().commits.iter().filter(|(_, c)| c.filler).count();
    assert!(spans > 100, "{spans} empty ticks of spans");
}

/// A validator whose clock runs ahead within the allowed drift (0.5 s) stamps its blocks ahead,
/// and the honest leaders after it wait for their clocks to pass those times; with one tick a
/// block that cost a sim most of its ticks. The blocks after a wait cover the ticks due, so it
/// costs almost none; a clock beyond the drift (its proposals refused) costs a timed-out view in
/// four, also covered.
#[test]
fn a_validator_with_a_skewed_clock_costs_almost_no_ticks() {
    let expected = 7 * 60;
    for skew_ms in [450i64, -450, 5_000, -5_000] {
        let (ticks, timed, worst) = rate_and_time(1, 3, None, None, skew_ms * 1_000);
        eprintln!("clock {skew_ms} ms off: {ticks} ticks of {expected}, slowest event {} ms", worst / MS);
        assert!(ticks * 100 >= expected * 95, "clock {skew_ms} ms off: {ticks} ticks of {expected}");
        assert!(timed <= expected + 1, "clock {skew_ms} ms off: {timed} ticks in 7 s of BFT time");
        assert!(worst <= 700 * MS, "clock {skew_ms} ms off: an event took {} ms", worst / MS);
    }
    let (one_a_block, _, _) = rate_and_time(1, 3, Some(0), None, 450_000);
    eprintln!("one tick a block, clock 450 ms ahead: {one_a_block} ticks of {expected}");
    assert!(one_a_block * 100 < expected * 90, "one tick a block: {one_a_block} ticks of {expected}");
}

/// A crashed validator's views time out, but the blocks after them cover the ticks due
/// meanwhile: at 20-30 ms one-way the sim keeps its rate with one validator of four dead.
#[test]
fn a_crashed_validator_costs_almost_no_ticks() {
    let expected = 7 * 60;
    let (ticks, worst) = rate_at(20, 30, None, Some(2));
    assert!(ticks * 100 >= expected * 97, "{ticks} ticks of {expected}");
    // An event sent to the dead leader's view waits out its timeout.
    assert!(worst <= 600 * MS, "an event took {} ms", worst / MS);
}

/// A crashed validator stops leading once the committed chain shows it failed and silent
/// (leader reputation): its views no longer wait out the leader timeout, so after the first
/// seconds no view fails and an event waits for no timeout. With plain round robin every
/// fourth view fails for as long as it is down.
#[test]
fn a_crashed_validator_stops_leading() {
    let run = |round_robin: bool| {
        let cache = Arc::new(SigCache::new());
        let setup = Setup { period_us: Some(16_667), round_robin, ..Setup::honest(4) };
        let net = NetConfig { delay_min_us: 20 * MS, delay_max_us: 30 * MS, loss_ppm: 0, duplicate_ppm: 0 };
        let mut cluster = build(&setup, 7, net, &cache);
        let mut checker = Checker::new(4, &cache);
        cluster.schedule_fault(2 * SEC, Fault::Crash(2));
        let mut submitted = Vec::new();
        for step in 0..200u64 {
            let e = format!("e{step}").into_bytes();
            submit(&mut cluster, [0, 1, 3][(step % 3) as usize], e.clone());
            submitted.push((step * 50 * MS, e));
            cluster.run_until((step + 1) * 50 * MS, |c| checker.check(c));
        }
        cluster.run_until(12 * SEC, |c| checker.check(c));
        assert!(checker.violations.is_empty(), "{:?}", checker.violations);
        let commits = &cluster.node(0).unwrap().commits;
        // Views nullified between the blocks committed from 5 s on, and those led by node 2.
        let late = || commits.iter().filter(|(at, c)| *at >= 5 * SEC && !c.filler);
        let failed: u64 = late().map(|(_, c)| c.block.view.0 - c.block.parent.view.0 - 1).sum();
        let led_by_dead = late().filter(|(_, c)| c.block.leader.0 == 2).count();
        let worst = submitted
            .iter()
            .filter(|(at, _)| *at >= 5 * SEC)
            .map(|(at, e)| {
                let (t, _) = commits.iter().find(|(_, c)| c.block.events.iter().any(|x| x[..] == e[..])).unwrap();
                t - at
            })
            .max()
            .unwrap();
        let ticks = commits.iter().filter(|(at, _)| (5 * SEC..10 * SEC).contains(at)).count();
        eprintln!(
            "round robin {round_robin}: {failed} views failed from 5 s, slowest event {} ms, {ticks} ticks",
            worst / MS
        );
        (failed, led_by_dead, worst, ticks)
    };
    let (failed, led_by_dead, worst, ticks) = run(false);
    assert_eq!((failed, led_by_dead), (0, 0), "no view failed and none led by the dead validator from 5 s");
    // Proposed within a period or two and committed with its child: about five one-way delays.
    assert!(worst <= 250 * MS, "an event took {} ms", worst / MS);
    assert!(ticks * 100 >= 5 * 60 * 97, "{ticks} ticks of 300");
    let (failed, _, worst_rr, _) = run(true);
    assert!(failed >= 5, "round robin: {failed} views failed");
    assert!(worst_rr > worst, "round robin: the slowest event took {} ms", worst_rr / MS);
}

/// A network slower than the view timeouts assume (one-way delays above the leader timeout):
/// with fixed timeouts every view was nullified before its proposal arrived and nothing was
/// ever committed again. Views failing more than f in a row make validators more patient, so
/// ticks commit on the slow network; back on a fast one, patience falls to nothing and the
/// cluster commits a tick per period again.
#[test]
fn validators_grow_patient_on_a_network_slower_than_their_timeouts_and_recover_after() {
    let cache = Arc::new(SigCache::new());
    let setup = Setup::honest(4);
    let mut cluster = build(&setup, 5, lan(), &cache);
    let mut checker = Checker::new(4, &cache);
    let cfg = common::config(&cache);
    let patience = |c: &metatopia_scenarios::Cluster<common::Node>| -> Vec<u64> {
        (0..4)
            .map(|i| match &c.node(i).unwrap().actor {
                common::Actor::Honest(v) => v.patience(),
                common::Actor::Byz(_) => unreachable!("all honest"),
            })
            .collect()
    };
    cluster.run_until(SEC, |c| checker.check(c));
    let fast = checker.highest_tick().unwrap();
    assert_eq!(patience(&cluster), [1, 1, 1, 1], "no patience needed on a LAN");
    // One-way delays of 1.1 to 1.3 leader timeouts: a proposal arrives after its view timed out.
    let slow = cfg.leader_timeout_us * 11 / 10;
    cluster.set_net(NetConfig { delay_min_us: slow, delay_max_us: slow * 13 / 11, loss_ppm: 0, duplicate_ppm: 0 });
    cluster.run_until(21 * SEC, |c| checker.check(c));
    assert!(checker.violations.is_empty(), "{:?}", checker.violations);
    let on_slow = checker.highest_tick().unwrap() - fast;
    assert!(on_slow >= 20, "{on_slow} ticks in 20 s on the slow network");
    assert!(patience(&cluster).iter().all(|p| (2..=8).contains(p)), "{:?}", patience(&cluster));
    // Fast again: patience decays, and ticks come one per period.
    cluster.set_net(lan());
    let before = checker.highest_tick().unwrap();
    cluster.run_until(31 * SEC, |c| checker.check(c));
    assert!(checker.violations.is_empty(), "{:?}", checker.violations);
    assert_eq!(patience(&cluster), [1, 1, 1, 1], "patience back to none");
    let at = checker.highest_tick().unwrap();
    cluster.run_until(33 * SEC, |c| checker.check(c));
    let last_two_secs = checker.highest_tick().unwrap() - at;
    assert!(at > before + 100, "{} ticks in the first 10 s back on the LAN", at - before);
    assert!(last_two_secs >= 36, "{last_two_secs} ticks in 2 s at a 50 ms period");
}

#[test]
fn a_restarted_validator_catches_up_and_votes_again() {
    let cache = Arc::new(SigCache::new());
    let mut cluster = build(&Setup::honest(4), 5, lan(), &cache);
    let mut checker = Checker::new(4, &cache);
    cluster.schedule_fault(SEC, Fault::Crash(1));
    cluster.schedule_fault(2 * SEC, Fault::Restart(1));
    cluster.run_until(5 * SEC, |c| checker.check(c));
    assert!(checker.violations.is_empty(), "{:?}", checker.violations);
    let n1 = cluster.node(1).unwrap();
    assert_eq!(n1.incarnation, 1);
    let last = n1.commits.last().map(|(_, c)| c.block.tick.0).unwrap();
    assert!(
        last + 2 >= checker.highest_tick().unwrap(),
        "restarted node at {last}, cluster at {:?}",
        checker.highest_tick()
    );
}

/// A whole sim stopped at once (a devnet's Ctrl-C) and started again, at every millisecond of
/// a tick period: commits resume. Found on the devnet: stopped within the few milliseconds
/// between a certificate forming (counted on its votes' MACs) and its signatures being checked,
/// no validator had saved that certificate, and none sent the votes of a past view again, so
/// the views after it could never be built on (every view timed out, forever).
#[test]
fn every_validator_stopped_at_once_resumes_whenever_it_stopped() {
    let period = common::config(&Arc::new(SigCache::new())).period_us;
    for k in 0..period / MS {
        let cache = Arc::new(SigCache::new());
        let mut cluster = build(&Setup::honest(4), 300 + k, lan(), &cache);
        let mut checker = Checker::new(4, &cache);
        let stop = SEC + k * MS;
        let start = stop + 30 * SEC;
        for i in 0..4 {
            cluster.schedule_fault(stop, Fault::Crash(i));
            cluster.schedule_fault(start, Fault::Restart(i));
        }
        cluster.run_until(start, |c| checker.check(c));
        let before = checker.highest_tick().expect("committed before the stop");
        cluster.run_until(start + RESUME_BOUND, |c| checker.check(c));
        assert!(checker.violations.is_empty(), "stopped at +{k} ms: {:?}", checker.violations);
        let after = checker.highest_tick().unwrap();
        assert!(after >= before + 10, "stopped at +{k} ms: at tick {before} before, {after} after the restart");
    }
}

/// A whole sim stopped at once and started again without one of its validators (f = 1 down):
/// the other three must still commit. Found on real processes (a sim stopped with `run
/// --ticks`, restarted without node 0): the three had each cast their nullify vote of the view
/// they stopped in, none had seen the others' yet, and after the restart each counted only the
/// other two (its own restored vote was not in its tally), so that view could never be
/// nullified and nothing was ever committed again. Here the three are cut off from one another
/// while their view times out (each nullifies it alone), then stopped, and started again with
/// the network whole but validator 3 still down.
#[test]
fn a_sim_stopped_whole_resumes_without_one_validator_after_all_nullified_alone() {
    for seed in 700..704 {
        let cache = Arc::new(SigCache::new());
        let mut cluster = build(&Setup::honest(4), seed, lan(), &cache);
        let mut checker = Checker::new(4, &cache);
        let (cut, stop, start) = (SEC, 2 * SEC, 3 * SEC);
        cluster.schedule_fault(cut, Fault::Crash(3));
        cluster.add_partition(Partition {
            from: cut,
            until: stop,
            groups: (0..4).map(|i| BTreeSet::from([i])).collect(),
        });
        for i in 0..3 {
            cluster.schedule_fault(stop, Fault::Crash(i));
            cluster.schedule_fault(start, Fault::Restart(i));
        }
        cluster.run_until(start, |c| checker.check(c));
        let before = checker.highest_tick().expect("committed before the stop");
        cluster.run_until(start + 2 * RESUME_BOUND, |c| checker.check(c));
        assert!(checker.violations.is_empty(), "seed {seed}: {:?}", checker.violations);
        let after = checker.highest_tick().unwrap();
        assert!(after >= before + 10, "seed {seed}: at tick {before} before the stop, {after} after the restart");
    }
}

/// A validator that was down when the whole sim stopped catches up after the restart. A
/// restored validator's persisted state keeps only the blocks it has not yet handed out, so
/// once every validator had restarted, nobody held the blocks between the laggard's last
/// commit and the others': it fetched one for ever. Each restored validator now gets the
/// blocks it handed out back from its commit log (`Validator::recall`). The random
/// schedules with a whole stop added (`add_whole_stop`) found it in these two seeds; without
/// the recall they still fail (checked here too, so the test shows what it guards).
#[test]
fn a_laggard_catches_up_after_the_whole_sim_stopped() {
    let cache = Arc::new(SigCache::new());
    for (n, seed) in [(4u16, 106u64), (7, 10_025)] {
        let mut s = random_schedule(seed, n, false);
        common::add_whole_stop(&mut s, seed);
        let r = run_schedule(&s, seed, 2 * SEC, &cache);
        assert!(r.violations.is_empty(), "n={n} seed {seed}: {:?}", r.violations);
        assert!(
            r.resume_after_heal.is_some_and(|t| t <= RESUME_BOUND),
            "n={n} seed {seed}: commits did not resume on every honest validator\n{:?}\n{}",
            s,
            r.stuck.join("\n")
        );
        s.setup.recall = false;
        let without = run_schedule(&s, seed, 2 * SEC, &cache);
        assert!(without.violations.is_empty(), "n={n} seed {seed}: {:?}", without.violations);
        assert!(
            without.resume_after_heal.is_none_or(|t| t > RESUME_BOUND),
            "n={n} seed {seed}: the laggard caught up without its peers' logs too; the test no longer shows the gap"
        );
    }
}

#[test]
fn a_diverged_state_root_is_detected_by_peers_within_a_tick() {
    let cache = Arc::new(SigCache::new());
    let mut cluster = build(&Setup::honest(4), 9, lan(), &cache);
    let mut checker = Checker::new(4, &cache);
    cluster.run_until(SEC, |c| checker.check(c));
    assert_eq!(cluster.node(0).unwrap().mismatches, 0);
    // Node 3's application state diverges: its next reported root differs from everyone's.
    cluster.node_mut(3).unwrap().app_root.0[0] ^= 1;
    cluster.run_until(SEC + 200 * MS, |c| checker.check(c));
    let seen: u32 = (0..3).map(|i| cluster.node(i).unwrap().mismatches).sum();
    assert!(seen > 0, "peers must report the mismatch");
    assert!(cluster.node(3).unwrap().mismatches > 0, "the diverged node learns it too");
}

/// Found by the by-hand sweep (seed 1002941, n = 7): a validator restarted and crashed again
/// before its first step came back from genesis and re-committed tick 0. The harness now keeps
/// what the restarted node was restored from, as a disk would.
#[test]
fn issue_sweep_1002941_crash_right_after_restart_keeps_persisted_state() {
    let cache = Arc::new(SigCache::new());
    let s = random_schedule(1_002_941, 7, false);
    assert_eq!(s.crashes.len(), 2, "the schedule that found it: two crashes of node 4");
    let r = run_schedule(&s, 1_002_941, 2 * SEC, &cache);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(r.resume_after_heal.is_some_and(|t| t <= RESUME_BOUND));
}

#[test]
fn same_seed_same_trace_different_seed_different_trace() {
    let cache = Arc::new(SigCache::new());
    let s = random_schedule(42, 4, false);
    let a = run_schedule(&s, 42, SEC, &cache);
    let b = run_schedule(&s, 42, SEC, &cache);
    let c = run_schedule(&random_schedule(43, 4, false), 43, SEC, &cache);
    assert_eq!(a.trace, b.trace);
    assert_ne!(a.trace, c.trace);
}

fn random_seeds(n: u16, seeds: std::ops::Range<u64>, planted: bool) -> Vec<(u64, common::RunResult)> {
    let cache = Arc::new(SigCache::new());
    let list: Vec<u64> = seeds.collect();
    let run = |chunk: &[u64]| -> Vec<(u64, common::RunResult)> {
        chunk
            .iter()
            .map(|&seed| (seed, run_schedule(&random_schedule(seed, n, planted), seed, 2 * SEC, &cache)))
            .collect()
    };
    std::thread::scope(|s| {
        let half = list.len().div_ceil(2);
        let handles: Vec<_> = list.chunks(half.max(1)).map(|c| s.spawn(move || run(c))).collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

fn assert_all_safe_and_live(results: &[(u64, common::RunResult)], n: u16) {
    let schedules: Vec<_> = results.iter().map(|(seed, _)| random_schedule(*seed, n, false)).collect();
    let byz = schedules.iter().filter(|s| s.setup.roles.iter().any(|r| matches!(r, Role::Byzantine(_)))).count();
    let twins = schedules.iter().filter(|s| s.setup.twin_of.is_some()).count();
    let parts = schedules.iter().filter(|s| !s.partitions.is_empty()).count();
    let crashes = schedules.iter().filter(|s| !s.crashes.is_empty()).count();
    let lossy = schedules.iter().filter(|s| s.net.loss_ppm > 0).count();
    let pruning = schedules.iter().filter(|s| s.setup.keep_blocks.is_some()).count();
    let budget = schedules.iter().filter(|s| s.setup.keep_bytes_min_blocks.is_some()).count();
    let stops = schedules.iter().filter(|s| s.whole_stop.is_some()).count();
    let worst = results.iter().filter_map(|(_, r)| r.resume_after_heal).max().unwrap_or(0);
    let filling = results.iter().filter(|(_, r)| r.filled > 0).count();
    eprintln!(
        "n={n}: {} seeds: {byz} with Byzantine validators, {twins} with twins, {parts} with partitions, {crashes} with crashes, {lossy} lossy, {pruning} keeping 32 blocks, {budget} keeping 24 by bytes, {stops} stopped whole once, {filling} filling ticks; worst resume after heal {} ms",
        results.len(),
        worst / MS
    );
    for (seed, r) in results {
        assert!(
            r.violations.is_empty(),
            "n={n} seed {seed}: {:?}\n{:?}",
            r.violations,
            random_schedule(*seed, n, false)
        );
        let resume = r.resume_after_heal.unwrap_or(u64::MAX);
        assert!(
            resume <= RESUME_BOUND,
            "n={n} seed {seed}: commits resumed {} ms after heal\n{:?}\n{}",
            resume / MS,
            random_schedule(*seed, n, false),
            r.stuck.join("\n")
        );
    }
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "1,000 seeds take minutes in a debug build: they run in the optimised pass of the test command"
)]
fn random_fault_schedules_n4_700_seeds() {
    let results = random_seeds(4, 0..700, false);
    assert_eq!(results.len(), 700);
    assert_all_safe_and_live(&results, 4);
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "1,000 seeds take minutes in a debug build: they run in the optimised pass of the test command"
)]
fn random_fault_schedules_n7_300_seeds() {
    let results = random_seeds(7, 10_000..10_300, false);
    assert_eq!(results.len(), 300);
    assert_all_safe_and_live(&results, 7);
}

#[test]
fn the_suite_catches_a_planted_bug() {
    // With the planted bug, 2f votes make a quorum: an equivocating leader gets both of its
    // blocks notarized and finalized by different honest validators.
    let mut setup = Setup::honest(4);
    setup.planted_bug = true;
    setup.roles[1] = Role::Byzantine(Behaviour::Equivocate);
    let (checker, _) = run_setup(&setup, 1, 3);
    assert!(
        checker.violations.iter().any(|v| v.contains("SAFETY") || v.contains("certificate")),
        "the planted bug went unnoticed"
    );
    // And the random schedules find it too (a sample here; the optimised pass runs 200 seeds).
    let seeds = if cfg!(debug_assertions) { 0..20 } else { 0..200 };
    let results = random_seeds(4, seeds, true);
    let caught = results.iter().filter(|(_, r)| !r.violations.is_empty()).count();
    eprintln!("planted bug caught by {caught} of {} random seeds", results.len());
    assert!(caught > 0, "no seed caught the planted bug");
}

/// The four seeds of 20,000 (session 26's sweep) whose commits did not resume within the
/// bound after heal, nor at all in the 2 s after it: 10-15 % loss lasting past heal, f
/// Byzantine validators (so every honest vote is needed), and a proposal lost on its way to one
/// honest validator, view after view, each failed view making the timeouts longer. Now a
/// validator that sees votes for a proposal it lacks fetches it and votes (`on_vote`).
#[test]
fn lossy_schedules_that_needed_every_honest_vote_resume_after_heal() {
    for (n, seed) in [(7u16, 1_006_990u64), (7, 1_007_776), (4, 1_010_731), (4, 1_016_330)] {
        let results = random_seeds(n, seed..seed + 1, false);
        assert_all_safe_and_live(&results, n);
    }
}

/// One seed of the sweeps again, to look into: `SEED=1006990 N=7 cargo test --release -p
/// metatopia-consensus --test agreement one_seed_by_hand -- --ignored --nocapture`.
#[test]
#[ignore = "by hand: SEED=<seed> N=<4 or 7>"]
fn one_seed_by_hand() {
    let seed: u64 = std::env::var("SEED").ok().and_then(|s| s.parse().ok()).expect("SEED=<seed>");
    let n: u16 = std::env::var("N").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
    let results = random_seeds(n, seed..seed + 1, false);
    eprintln!("{:?}", random_schedule(seed, n, false));
    assert_all_safe_and_live(&results, n);
}

/// One seed of the latency sweep: n = 4 or 7, 20 or 60 Hz, one-way delays of 25, 50 or 100 ms
/// (± 20 %) with 1 % loss, an event every 50 ms, and one validator crashed in the first 2 s or f
/// of them cut off from 2 s to 4 s. Returns (n, rate, delay, fault, ticks whose BFT time is
/// from 4 s to 10 s, ticks due then, violations).
fn latency_seed(seed: u64, cache: &Arc<SigCache>) -> (u16, u64, u64, &'static str, usize, usize, Vec<String>) {
    let mut rng = metatopia_sim::rng::DetRng::from_u64(seed ^ 0x1a7e);
    let n: u16 = if rng.chance(1, 2) { 4 } else { 7 };
    let hz: u64 = if rng.chance(1, 2) { 60 } else { 20 };
    let delay = [25u64, 50, 100][rng.below(3) as usize];
    let setup = Setup { period_us: Some(1_000_000 / hz), ..Setup::honest(n) };
    let net = NetConfig { delay_min_us: delay * 800, delay_max_us: delay * 1_200, loss_ppm: 10_000, duplicate_ppm: 0 };
    let mut cluster = build(&setup, seed, net, cache);
    let mut checker = Checker::new(n, cache);
    let f = (n - 1) / 3;
    let (fault, hit): (&str, BTreeSet<NodeId>) = if rng.chance(1, 2) {
        let node = rng.below(u64::from(n)) as NodeId;
        cluster.schedule_fault(rng.below(2 * SEC), Fault::Crash(node));
        ("crash", [node].into())
    } else {
        let cut: BTreeSet<NodeId> = (0..NodeId::from(f)).map(|i| n as NodeId - 1 - i).collect();
        let rest: BTreeSet<NodeId> = (0..NodeId::from(n)).filter(|i| !cut.contains(i)).collect();
        cluster.add_partition(Partition { from: 2 * SEC, until: 4 * SEC, groups: vec![cut.clone(), rest] });
        ("partition", cut)
    };
    let live: Vec<NodeId> = (0..NodeId::from(n)).filter(|i| !hit.contains(i)).collect();
    for step in 0..200u64 {
        submit(&mut cluster, live[(step as usize) % live.len()], format!("e{step}").into_bytes());
        cluster.run_until((step + 1) * 50 * MS, |c| checker.check(c));
    }
    cluster.run_until(12 * SEC, |c| checker.check(c));
    let commits = &cluster.node(live[0]).unwrap().commits;
    let timed = commits.iter().filter(|(_, c)| (4_000..10_000).contains(&c.block.time_ms)).count();
    (n, hz, delay, fault, timed, 6 * hz as usize, checker.violations)
}

/// The latency sweep by hand: every seed keeps safety (the checker's invariants) and its tick
/// rate (≥ 0.99 of the ticks due, in agreed time, from 4 s to 10 s), whatever the latency and
/// the fault.
#[test]
#[ignore = "long: run by hand, SEEDS=1000 cargo test --release -p metatopia-consensus --test it -- --ignored agreement::latency_seeds_by_hand --nocapture"]
fn latency_seeds_by_hand() {
    let count: u64 = std::env::var("SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(100);
    let cache = Arc::new(SigCache::new());
    let list: Vec<u64> = (0..count).collect();
    let results: Vec<_> = std::thread::scope(|s| {
        let half = list.len().div_ceil(2).max(1);
        let handles: Vec<_> = list
            .chunks(half)
            .map(|chunk| {
                let cache = &cache;
                s.spawn(move || chunk.iter().map(|&seed| (seed, latency_seed(seed, cache))).collect::<Vec<_>>())
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let worst = results.iter().map(|(_, r)| r.4 as f64 / r.5 as f64).fold(f64::MAX, f64::min);
    eprintln!("{} seeds; the lowest share of ticks kept: {worst:.3}", results.len());
    for (seed, (n, hz, delay, fault, timed, due, violations)) in &results {
        assert!(violations.is_empty(), "seed {seed} (n={n}, {hz} Hz, {delay} ms, {fault}): {violations:?}");
        assert!(timed * 100 >= due * 99, "seed {seed} (n={n}, {hz} Hz, {delay} ms, {fault}): {timed} ticks of {due}");
    }
}

#[test]
#[ignore = "long: run by hand, SEEDS=100000 cargo test --release -p metatopia-consensus --test agreement -- --ignored"]
fn many_seeds_by_hand() {
    let total: u64 = std::env::var("SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} seeds ({per_sec}, eta {eta}) {msg}",
        )
        .unwrap(),
    );
    // The slowest resume after heal, and its (n, seed).
    let mut worst_resume = (0, 0u16, 0u64);
    let chunk = 200;
    let first: u64 = std::env::var("SEEDS_FROM").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let mut seed = first;
    // Every seed runs; those that fail are listed at the end (SEED=<seed> N=<n> and
    // `one_seed_by_hand` runs one again).
    let (mut unsafe_seeds, mut late_seeds) = (Vec::new(), Vec::new());
    while seed < first + total {
        let end = (seed + chunk).min(first + total);
        for n in [4u16, 7] {
            let range = if n == 4 { seed..seed + (end - seed) * 7 / 10 } else { seed + (end - seed) * 7 / 10..end };
            let results = random_seeds(n, range, false);
            for (seed, r) in &results {
                if !r.violations.is_empty() {
                    unsafe_seeds.push((n, *seed));
                } else if r.resume_after_heal.is_none_or(|t| t > RESUME_BOUND) {
                    late_seeds.push((n, *seed));
                }
            }
            for (seed, r) in &results {
                if let Some(t) = r.resume_after_heal.filter(|t| *t > worst_resume.0) {
                    worst_resume = (t, n, *seed);
                }
            }
        }
        bar.inc(end - seed);
        bar.set_message(format!(
            "{} safety violations, {} late to resume, worst resume after heal {} ms",
            unsafe_seeds.len(),
            late_seeds.len(),
            worst_resume.0 / MS
        ));
        seed = end;
    }
    bar.finish();
    eprintln!(
        "{total} seeds from {first}: {} with safety violations, {} late to resume; worst resume after heal {} ms \
         (N={} SEED={})",
        unsafe_seeds.len(),
        late_seeds.len(),
        worst_resume.0 / MS,
        worst_resume.1,
        worst_resume.2
    );
    assert!(
        unsafe_seeds.is_empty() && late_seeds.is_empty(),
        "(n, seed) with safety violations: {unsafe_seeds:?}; not resumed within {} ms of heal: {late_seeds:?}",
        RESUME_BOUND / MS
    );
}

#[test]
fn messages_from_untrusted_bytes_are_bounded() {
    use proptest::prelude::*;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    runner
        .run(&proptest::collection::vec(any::<u8>(), 0..4096), |bytes| {
            let _ = Message::decode(&bytes, 1 << 20);
            Ok(())
        })
        .unwrap();
    // Every message kind, from its tag on (compact proposals are tags 6 and 8), and a
    // proposal's pieces from theirs.
    for tag in 0..9u8 {
        runner
            .run(&proptest::collection::vec(any::<u8>(), 0..4096), |bytes| {
                let _ = Message::decode(&[&[tag][..], &bytes].concat(), 1 << 20);
                Ok(())
            })
            .unwrap();
    }
    let m = Message::Events(vec![vec![1, 2, 3].into()]);
    let bytes = m.encode();
    assert_eq!(Message::decode(&bytes, 64).unwrap(), m);
    assert!(Message::decode(&bytes, 2).is_err());
    for cut in 0..bytes.len() {
        assert!(Message::decode(&bytes[..cut], 64).is_err());
    }
    // A compact proposal round-trips, and every cut of it is an error.
    let key = common::key(0);
    let block = metatopia_consensus::Block {
        view: metatopia_consensus::View(3),
        leader: metatopia_consensus::ValidatorIndex(0),
        parent: metatopia_consensus::Parent {
            view: metatopia_consensus::View(2),
            digest: metatopia_consensus::Digest([4; 32]),
        },
        tick: metatopia_consensus::Tick(2),
        time_ms: 99,
        events: Vec::new(),
        parent_certificate: None,
    };
    let ids = vec![metatopia_consensus::Digest([1; 32]), metatopia_consensus::Digest([2; 32])];
    let vote = metatopia_consensus::Vote::sign(
        &key,
        &metatopia_consensus::Digest([5; 32]),
        metatopia_consensus::ValidatorIndex(0),
        metatopia_consensus::VoteKind::Notarize,
        metatopia_consensus::View(3),
        block.header_digest(&ids),
        None,
    );
    let pieces = vec![
        metatopia_consensus::Piece::Run { batch: metatopia_consensus::Digest([8; 32]), start: 1, len: 2 },
        metatopia_consensus::Piece::Ids(ids.clone()),
    ];
    let by_refs = Message::ProposeRefs { block: block.clone(), pieces, vote: vote.clone(), nullifications: Vec::new() };
    let m = Message::ProposeIds { block, ids, vote, nullifications: Vec::new() };
    for (m, tag) in [(m, 6), (by_refs, 8)] {
        let bytes = m.encode();
        assert_eq!(bytes[0], tag);
        assert_eq!(Message::decode(&bytes, 1 << 20).unwrap(), m);
        for cut in 0..bytes.len() {
            assert!(Message::decode(&bytes[..cut], 1 << 20).is_err());
        }
        // Any bytes after a valid proposal's header: bounded, never a panic.
        let at = bytes.len() / 2;
        runner
            .run(&proptest::collection::vec(any::<u8>(), 0..4096), |tail| {
                let _ = Message::decode(&[&bytes[..at], &tail].concat(), 1 << 20);
                Ok(())
            })
            .unwrap();
    }
}

/// Found by the by-hand sweep (seed 1001817, n = 4: a validator signing badly behind good MACs,
/// 10% loss, clock skew): its view-1 proposal was notarized and finalized by two honest
/// validators on its forged vote's MAC; the third refused it. Once the forged votes were caught,
/// view 1 could be neither notarized nor nullified (its finalizers never nullify it), and
/// nothing was ever committed. A notarization's signatures are now checked before finalizing.
#[test]
fn issue_sweep_1001817_a_forged_vote_never_makes_an_honest_validator_finalize() {
    let cache = Arc::new(SigCache::new());
    let s = random_schedule(1_001_817, 4, false);
    assert!(s.setup.roles.contains(&Role::Byzantine(Behaviour::InvalidSignatures)), "the schedule that found it");
    let r = run_schedule(&s, 1_001_817, 2 * SEC, &cache);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert!(r.resume_after_heal.is_some_and(|t| t <= RESUME_BOUND), "{:?}", r.resume_after_heal);
}
