//! The main command: `metatopia devnet` starts its nodes as real processes, they tick in
//! lockstep (the same root at the same tick on every node of a sim) and it stops cleanly after
//! the requested ticks; by default four sims side by side, with `--single` one.
use crate::support;

use std::collections::BTreeMap;

/// A base port P such that P.., P+1000.. (TCP) and P.., P+2000.. (UDP) are free for `n` nodes.
/// The tests of this file run at once in one process: each starts from its own place (`name`),
/// or both would find the same ports free before either binds them.
fn free_base(name: &str, n: u16) -> u16 {
    let pid = std::process::id() as u16;
    let salt = name.bytes().fold(0u16, |h, b| h.wrapping_mul(31).wrapping_add(u16::from(b)));
    for attempt in 0..200u16 {
        let base =
            20_000 + (pid.wrapping_mul(7).wrapping_add(salt.wrapping_mul(331)).wrapping_add(attempt * 97)) % 9_000;
        let free = (0..n).all(|i| {
            std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()
                && std::net::TcpListener::bind(("127.0.0.1", base + 1000 + i)).is_ok()
                && std::net::UdpSocket::bind(("127.0.0.1", base + i)).is_ok()
                && std::net::UdpSocket::bind(("127.0.0.1", base + 2000 + i)).is_ok()
        });
        if free {
            return base;
        }
    }
    panic!("no free ports");
}

/// The root each node printed for each tick it reported: node -> (tick -> root).
fn roots(out: &str) -> BTreeMap<u32, BTreeMap<u64, String>> {
    let mut r: BTreeMap<u32, BTreeMap<u64, String>> = BTreeMap::new();
    for line in out.lines() {
        let Some(rest) = line.strip_prefix("[node ") else { continue };
        let Some((node, rest)) = rest.split_once("] tick ") else { continue };
        let mut words = rest.split_whitespace();
        let (Some(tick), Some("root"), Some(root)) = (words.next(), words.next(), words.next()) else { continue };
        if let (Ok(node), Ok(tick)) = (node.parse(), tick.parse()) {
            r.entry(node).or_default().insert(tick, root.to_owned());
        }
    }
    r
}

fn run_devnet(name: &str, nodes: u16, extra: &[&str]) -> (String, String) {
    let dir = std::env::temp_dir().join(format!("metatopia-devnet-{name}-{}", std::process::id()));
    let port = free_base(name, nodes).to_string();
    let mut args = vec!["devnet", "--dir", dir.to_str().unwrap(), "--port", &port, "--clients", "0", "--fresh"];
    args.extend(extra);
    let (ok, out, err) = support::cli(&args);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("devnet finished"), "{out}");
    (out, err)
}

#[test]
fn devnet_single_runs_four_nodes_in_lockstep_and_stops_after_the_ticks() {
    let (out, _) = run_devnet("one", 4, &["--single", "--ticks", "60", "--bots", "5"]);
    assert!(out.contains("web viewer: http://127.0.0.1:"), "{out}");
    // One status line per sim, not one per node: the devnet compares the nodes' roots itself.
    assert!(roots(&out).is_empty(), "no node's own status line: {out}");
    let last = out.lines().rfind(|l| l.starts_with("sim 1: tick ")).expect("a status line for the sim");
    let at = last.split(" at tick ").nth(1).and_then(|r| r.split(',').next()).and_then(|t| t.parse::<u64>().ok());
    assert!(last.contains(", 4 of 4 nodes on root ") && at >= Some(39), "{last}");
    assert!(last.contains("validators 4 of 4 connected"), "{last}");
    // The addresses and commands again at the end.
    let end = out.split("devnet finished").nth(1).unwrap();
    assert!(end.contains("join address: ") && end.contains("metatopia admin --node"), "{end}");
}

#[test]
fn four_real_nodes_with_delayed_links_stay_in_lockstep() {
    // The test-only delay stage in every node's mesh: 30 ms one way (± 20 %), as between homes
    // across a country. Judged by roots, never by time.
    let (out, _) = run_devnet(
        "delayed",
        4,
        &["--single", "--ticks", "60", "--bots", "5", "--test-link-delay-ms", "30", "--test-link-jitter-percent", "20"],
    );
    let last = out.lines().rfind(|l| l.starts_with("sim 1: tick ")).expect("a status line for the sim");
    let at = last.split(" at tick ").nth(1).and_then(|r| r.split(',').next()).and_then(|t| t.parse::<u64>().ok());
    assert!(last.contains(", 4 of 4 nodes on root ") && at >= Some(29), "{last}");
}

#[test]
fn devnet_runs_four_sims_side_by_side_in_four_processes() {
    // The default world.
    let (out, _) = run_devnet("grid", 16, &["--ticks", "40", "--rate", "10", "--each-node"]);
    assert!(out.contains("a 2×2 world of 4 sims"), "{out}");
    assert!(out.matches("sim ").count() >= 4 && out.contains("one per sim"), "{out}");
    // Four processes (`run --also`), each a node of every sim; their lines named by node.
    assert!(out.contains("4 processes, process p running node p of every sim"), "{out}");
    assert!(!out.contains("[process "), "every line of a process is its node's: {out}");
    let r = roots(&out);
    assert_eq!(r.len(), 16, "every node reported: {out}");
    // Sim k is nodes 4(k-1)..4k-1: within a sim the same roots, between sims different ones.
    let mut per_sim = Vec::new();
    for k in 0..4u32 {
        let nodes: Vec<&BTreeMap<u64, String>> = (4 * k..4 * k + 4).map(|n| &r[&n]).collect();
        let t = *nodes[0].keys().find(|t| nodes.iter().all(|m| m.contains_key(t))).expect("a common tick");
        assert!(nodes.iter().all(|m| m[&t] == nodes[0][&t]), "sim {}: roots differ at tick {t}", k + 1);
        per_sim.push(nodes[0][&t].clone());
    }
    let distinct: std::collections::BTreeSet<&String> = per_sim.iter().collect();
    assert_eq!(distinct.len(), 4, "four different sims: {per_sim:?}");
}

#[test]
fn devnet_run_again_resumes_where_it_stopped() {
    let dir = std::env::temp_dir().join(format!("metatopia-devnet-resume-{}", std::process::id()));
    let port = free_base("resume", 4).to_string();
    let run = |extra: &[&str]| {
        let mut args = vec!["devnet", "--dir", dir.to_str().unwrap(), "--port", &port, "--clients", "0", "--single"];
        args.extend(extra);
        let (ok, out, err) = support::cli(&args);
        assert!(ok && out.contains("devnet finished"), "{out}\n{err}");
        out
    };
    let first = run(&["--fresh", "--ticks", "40", "--bots", "5", "--each-node"]);
    // Every node stopped after tick 39, all at once: the second run goes on from there (its own
    // snapshot and log) and agrees on more ticks.
    let second = run(&["--ticks", "80", "--bots", "5", "--each-node"]);
    let _ = std::fs::remove_dir_all(&dir);
    let resumed: Vec<u64> = second
        .lines()
        .filter_map(|l| l.split_once("; now at tick ").and_then(|(_, rest)| rest.split_whitespace().next()))
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(resumed.len(), 4, "each node said where it resumed: {second}");
    assert!(resumed.iter().all(|t| *t >= 39), "resumed at {resumed:?}, not from genesis: {second}");
    let (before, after) = (roots(&first), roots(&second));
    assert_eq!(after.len(), 4, "every node reported: {second}");
    for (node, ticks) in &after {
        let last = *ticks.keys().last().unwrap();
        assert!(last >= 60 && last > *before[node].keys().last().unwrap(), "node {node} reached {last}: {second}");
    }
}
