//! `metatopia-lab bench agreement` as a user runs it, small: a real process with four validators
//! on the node's mesh (its default) or the lab's transports over loopback, its report read back. (What it measures is for the by-hand runs; this
//! checks that it runs, commits what it was given and reports it.)

use std::process::Command;

fn bench(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_metatopia-lab"))
        .args(["bench", "agreement", "--ticks", "30", "--events-per-tick", "40"])
        .args(extra)
        .output()
        .expect("metatopia runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

/// The number after `label` on the first line holding it.
fn number_after(stdout: &str, label: &str) -> f64 {
    let line = stdout.lines().find(|l| l.contains(label)).unwrap_or_else(|| panic!("no {label:?} in:\n{stdout}"));
    let rest = &line[line.find(label).unwrap() + label.len()..];
    let num: String = rest.trim_start().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    num.parse().unwrap_or_else(|_| panic!("no number after {label:?} in {line:?}"))
}

/// The share of their time the validator threads were on a core, from the report.
fn cpu_percent(stdout: &str) -> f64 {
    number_after(stdout, "validator threads:")
}

#[test]
fn bench_agreement_commits_the_load_and_reports_latency_pinned_or_not_spinning_or_not_on_each_kind_of_thread() {
    let mut cpu = Vec::new();
    // (pinned, spinning, `--threads`: None for its default, a reactor when spinning)
    let variants =
        [(true, true, None), (false, false, None), (true, true, Some("core")), (false, true, Some("validator"))];
    for (pin, spin, threads) in variants {
        let mut extra = vec!["--transport", "tcp", "--idle", if spin { "spin" } else { "block" }];
        if !pin {
            extra.push("--no-pin");
        }
        if let Some(t) = threads {
            extra.extend(["--threads", t]);
        }
        let reactor = spin && threads.is_none();
        let out = bench(&extra);
        // 30 measured ticks after a second's warm-up at 60 Hz, and 5 more: 95 ticks of 40 events.
        let submitted = 95.0 * 40.0;
        let committed = number_after(&out, "events committed:");
        assert!(committed >= 0.9 * submitted && committed <= submitted, "{committed} of {submitted}\n{out}");
        assert!(number_after(&out, "ticks committed (validator 0):") >= 90.0, "{out}");
        let samples = number_after(&out, "every validator,");
        assert!(samples >= 4.0 * 25.0, "a finalization per validator and measured tick:\n{out}");
        let latency = out.lines().find(|l| l.starts_with("commit latency")).expect("a latency line");
        let (p50, p99) = (number_after(latency, "p50"), number_after(latency, "p99"));
        assert!(p50 > 0.0 && p50 <= p99, "{out}");
        // Whose finalize vote finalized each measured tick, every tick counted once.
        let finalizing = out.lines().find(|l| l.contains("the finalize vote that finalizes")).expect("its line");
        let ticks = number_after(finalizing, "sent,");
        assert!(ticks >= 25.0, "{finalizing}");
        let shares = if finalizing.contains("on another core") {
            number_after(finalizing, "the leader's")
                + number_after(finalizing, "on the leader's core")
                + number_after(finalizing, "on another core")
        } else {
            number_after(finalizing, "the leader's") + number_after(finalizing, "a follower's")
        };
        assert!((shares - 100.0).abs() <= 2.0, "{finalizing}");
        // That vote is sent before any validator can finalize on it.
        let sent_p50 = number_after(finalizing, "sent p50");
        assert!(sent_p50 > 0.0 && sent_p50 <= p99, "{finalizing}\n{latency}");
        assert_eq!(finalizing.contains("on another core"), pin && cfg!(target_os = "linux"), "{finalizing}");
        if cfg!(target_os = "linux") {
            assert_eq!(out.contains("validator threads pinned: v0 -> core"), pin, "{out}");
            assert_eq!(out.contains("(a thread per core, shared by its validators)"), threads == Some("core"), "{out}");
            assert_eq!(out.contains("(a thread per core, its validators on one event loop)"), pin && reactor, "{out}");
        }
        // The round trip is measured the way the validators wait, on what they run on.
        let rtt = out.lines().find(|l| l.starts_with("loopback round trip")).expect("a round-trip line");
        assert_eq!(rtt.contains("busy-polling"), spin, "{rtt}");
        assert_eq!(rtt.contains("between two validators' event loops"), reactor, "{rtt}");
        cpu.push(cpu_percent(&out));
    }
    if cfg!(target_os = "linux") {
        // Busy-polling validators are on their cores far more of the time than sleeping ones
        // (at 40 events a tick these handle inputs a few per cent of it).
        assert!(cpu[0] > 2.0 * cpu[1] && cpu[1] > 0.0, "spinning {}% against sleeping {}%", cpu[0], cpu[1]);
        assert!(cpu[2] > 2.0 * cpu[1], "spinning a thread per core {}% against sleeping {}%", cpu[2], cpu[1]);
        assert!(cpu[3] > 2.0 * cpu[1], "spinning a thread per validator {}% against sleeping {}%", cpu[3], cpu[1]);
    }
}

/// Its default is what nodes run: the node's libp2p mesh (QUIC), the round trip measured on it.
#[test]
fn bench_agreement_runs_on_the_nodes_mesh_by_default() {
    let out = bench(&[]);
    assert!(out.starts_with("bench agreement: 4 validators on loopback (the node's libp2p mesh)"), "{out}");
    let submitted = 95.0 * 40.0;
    let committed = number_after(&out, "events committed:");
    assert!(committed >= 0.9 * submitted && committed <= submitted, "{committed} of {submitted}\n{out}");
    let rtt = out.lines().find(|l| l.starts_with("libp2p round trip")).expect("a round-trip line");
    assert!(rtt.contains("quic") && number_after(rtt, "p50") > 0.0, "{rtt}");
    let latency = out.lines().find(|l| l.starts_with("commit latency")).expect("a latency line");
    assert!(number_after(latency, "p50") <= number_after(latency, "p99"), "{latency}");
    assert!(out.contains("targets: p50 <= 0.8 ms"), "{out}");
}

#[test]
fn bench_agreement_over_udp_commits_the_load_and_reports_its_round_trip() {
    let out = bench(&["--transport", "udp"]);
    assert!(out.starts_with("bench agreement: 4 validators on loopback (UDP)"), "{out}");
    let submitted = 95.0 * 40.0;
    let committed = number_after(&out, "events committed:");
    assert!(committed >= 0.9 * submitted && committed <= submitted, "{committed} of {submitted}\n{out}");
    assert!(number_after(&out, "every validator,") >= 4.0 * 25.0, "{out}");
    let rtt = out.lines().find(|l| l.starts_with("loopback round trip")).expect("a round-trip line");
    assert!(rtt.contains("64-byte datagram there and back between the same UDP sockets"), "{rtt}");
    assert!(number_after(rtt, "p50") > 0.0, "{rtt}");
    let latency = out.lines().find(|l| l.starts_with("commit latency")).expect("a latency line");
    assert!(number_after(latency, "p50") <= number_after(latency, "p99"), "{latency}");
}

#[test]
fn bench_agreement_refuses_a_reactor_that_would_sleep_and_udp_off_the_reactor() {
    for (args, error) in [
        (
            ["--threads", "reactor", "--idle", "block"],
            "--threads reactor busy-polls its sockets: it takes --idle spin only",
        ),
        (["--transport", "udp", "--threads", "validator"], "--transport udp runs on the reactor"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_metatopia-lab"))
            .args(["bench", "agreement", "--ticks", "5"])
            .args(args)
            .output()
            .expect("metatopia runs");
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(error), "{args:?}: {stderr}");
    }
}
