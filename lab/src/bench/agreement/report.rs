//! What `bench agreement` prints: latencies beside the round trip, where they go, and bytes.

use super::*;

pub(super) fn report(shared: &Shared, args: &AgreementArgs, rtt: Duration) {
    let proposed = shared.proposed.lock().expect("not poisoned").clone();
    let committed = shared.committed.lock().expect("not poisoned").clone();
    let warmup = Duration::from_micros(warmup_ticks(args) * 1_000_000 / u64::from(args.rate_hz));
    let mut lat: Vec<f64> = shared
        .finalized
        .lock()
        .expect("not poisoned")
        .iter()
        .filter_map(|(_, d, at)| {
            proposed.get(d).filter(|(p, _)| *p > warmup).map(|(p, _)| at.saturating_sub(*p).as_secs_f64() * 1e3)
        })
        .collect();
    lat.sort_by(f64::total_cmp);
    let pct = |v: &[f64], p: f64| v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN);
    let ticks = committed.iter().filter(|(v, ..)| *v == 0).count();
    let events: usize = committed.iter().filter(|(v, ..)| *v == 0).map(|c| c.3).sum();
    let rtt_ms = rtt.as_secs_f64() * 1e3;
    println!("ticks committed (validator 0): {ticks}, events committed: {events}");
    println!(
        "commit latency (proposal -> finalization, every validator, {} samples): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        lat.len(),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
    // The targets: on the node's mesh (what nodes run) p50 0.8 ms; on the lab's reactor 0.5 ms.
    let p50_target = if args.transport == "libp2p" { 0.8 } else { 0.5 };
    println!(
        "ratio to the loopback round trip: p50 {:.1}x, p99 {:.1}x (targets: p50 <= {p50_target} ms, p99 <= 2 ms at {} Hz with {} events/tick)",
        pct(&lat, 0.5) / rtt_ms,
        pct(&lat, 0.99) / rtt_ms,
        args.rate_hz,
        args.events_per_tick
    );
    finalizing_votes(shared, &proposed, warmup, args.validators);
    let bounds = [0.25, 0.5, 1.0, 2.0, 5.0, 10.0, f64::INFINITY];
    let mut below = 0;
    let buckets: Vec<String> = bounds
        .iter()
        .map(|b| {
            let n = lat.partition_point(|x| x <= b) - below;
            below += n;
            if b.is_finite() { format!("<= {b} ms: {n}") } else { format!("more: {n}") }
        })
        .collect();
    println!("  distribution: {}", buckets.join(", "));
    for (kind, (count, total, max)) in shared.handling.lock().expect("not poisoned").iter() {
        println!(
            "  handling {kind:<12} {count:>7} times, mean {:>8.1} µs, max {:>8.1} µs",
            total.as_secs_f64() * 1e6 / *count as f64,
            max.as_secs_f64() * 1e6
        );
    }
    let cpu = shared.cpu.lock().expect("not poisoned");
    let (used, wall) = cpu.iter().fold((0.0, 0.0), |(u, w), (c, t)| (u + c.as_secs_f64(), w + t.as_secs_f64()));
    let handled: f64 = shared.handling.lock().expect("not poisoned").values().map(|(_, t, _)| t.as_secs_f64()).sum();
    if wall > 0.0 {
        println!(
            "validator threads: {:.1}% of their time on a core ({}), {:.1}% handling inputs",
            100.0 * used / wall,
            match args.idle {
                Idle::Spin => "busy-polling: the rest is spent polling, and yielded to any other thread",
                Idle::Block => "asleep the rest",
            },
            100.0 * handled / wall
        );
    }
    let all_ticks = committed.iter().filter(|(v, ..)| *v == 0).count().max(1) as f64;
    let sent = shared.sent.lock().expect("not poisoned");
    let line: Vec<String> = sent
        .iter()
        .map(|(kind, (frames, bytes))| {
            format!("{kind} {:.1} KB in {:.1} frames", *bytes as f64 / all_ticks / 1e3, *frames as f64 / all_ticks)
        })
        .collect();
    println!("sent per tick (all validators): {}", line.join(", "));
    println!(
        "(a tick's batch is handed to the sim one period later: its order seed is the certificate its child embeds)"
    );
    if args.timeline > 0 {
        timeline(shared, &proposed, args.timeline, args.validators);
    }
}

/// Which validator's finalize vote finalized each measured tick (the quorum-th sent: each
/// validator finalizes once it has that one), and when it was sent: where the latency goes.
/// Validators share cores here, so whose vote it is tells which core's work holds the tick up.
fn finalizing_votes(shared: &Shared, proposed: &BTreeMap<Digest, (Duration, u16)>, warmup: Duration, n: u16) {
    let quorum = 2 * ((usize::from(n) - 1) / 3) + 1;
    let cores = shared.cores.lock().expect("not poisoned");
    let mut sent: BTreeMap<Digest, Vec<(Duration, u16)>> = BTreeMap::new();
    for (v, d, at) in shared.finalize_sent.lock().expect("not poisoned").iter() {
        sent.entry(*d).or_default().push((*at, *v));
    }
    // (the leader's, a follower's on the leader's core, a follower's elsewhere)
    let mut whose = [0usize; 3];
    let mut after = Vec::new();
    for (d, (proposed_at, leader)) in proposed.iter().filter(|(_, (p, _))| *p > warmup) {
        let Some(votes) = sent.get_mut(d) else { continue };
        votes.sort();
        let Some(&(at, v)) = votes.get(quorum - 1) else { continue };
        let core = |w: u16| cores.get(usize::from(w)).copied();
        let role = if v == *leader {
            0
        } else if core(v).is_some() && core(v) == core(*leader) {
            1
        } else {
            2
        };
        whose[role] += 1;
        after.push(at.saturating_sub(*proposed_at).as_secs_f64() * 1e3);
    }
    if after.is_empty() {
        return;
    }
    after.sort_by(f64::total_cmp);
    let share = |k: usize| 100.0 * whose[k] as f64 / after.len() as f64;
    let on_cores = if cores.is_empty() {
        format!("a follower's {:.0}%", share(1) + share(2))
    } else {
        format!("a follower's on the leader's core {:.0}%, on another core {:.0}%", share(1), share(2))
    };
    println!(
        "  the finalize vote that finalizes (the last of the first {quorum} sent, {} ticks): the leader's {:.0}%, {on_cores}; sent p50 {:.3} ms after the proposal",
        after.len(),
        share(0),
        after[(after.len() - 1) / 2]
    );
}

/// For a few ticks: every input each validator handled from the proposal to the last
/// finalization, in µs after the proposal (start-end kind); `send` is the leader encoding and
/// queueing its proposal, `read` a follower's reader decoding it off the socket, `notarize
/// sent` and `finalize sent` a validator queueing its votes.
fn timeline(shared: &Shared, proposed: &BTreeMap<Digest, (Duration, u16)>, count: usize, validators: u16) {
    let finalized = shared.finalized.lock().expect("not poisoned").clone();
    let inputs = shared.inputs.lock().expect("not poisoned");
    let mut props: Vec<(Duration, Digest)> = proposed.iter().map(|(d, (at, _))| (*at, *d)).collect();
    props.sort();
    let step = (props.len() / (count + 1)).max(1);
    for (at, digest) in props.iter().skip(step).step_by(step).take(count) {
        let done: Vec<(u16, Duration)> =
            finalized.iter().filter(|(_, d, _)| d == digest).map(|(v, _, t)| (*v, *t)).collect();
        let end = done.iter().map(|(_, t)| *t).max().unwrap_or(*at);
        let us = |t: Duration| t.as_micros() as i64 - at.as_micros() as i64;
        println!("timeline of a proposal (µs after it; the leader's proposing input ends at 0):");
        for v in 0..validators {
            let fin = done.iter().find(|(w, _)| *w == v).map_or(-1, |(_, t)| us(*t));
            let line: Vec<String> = inputs
                .iter()
                .filter(|(w, s, e, _)| *w == v && *e + Duration::from_micros(300) >= *at && *s <= end)
                .map(|(_, s, e, k)| format!("{}-{} {k}", us(*s), us(*e)))
                .collect();
            println!("  v{v} (finalized at {fin}): {}", line.join(", "));
        }
    }
}
