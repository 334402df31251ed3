//! Real `metatopia run` processes on loopback: lockstep, kill -9 and restart with a torn log.
use crate::support;

use crate::support::{Scratch, cli};

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metatopia_node::config::{BotsConfig, NodeConfig, ValidatorEntry, WorldConfig};
use metatopia_node::store::{DataDir, write_atomic};
use metatopia_sim::Tick;

/// (node, tick) -> (root, when its line was read).
type Roots = Arc<Mutex<BTreeMap<(usize, u64), (String, Instant)>>>;

struct Node {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Node {
    /// Everything the node printed so far: its standard output, then its standard error.
    fn said(&self) -> String {
        format!("{}\n{}", self.stdout.lock().unwrap(), self.stderr.lock().unwrap())
    }
}

/// Wait until what `nodes` printed satisfies `ok`, and return it; fail after `limit` with all
/// of it.
fn wait_for_output(what: &str, limit: Duration, nodes: &[&Node], ok: impl Fn(&[String]) -> bool) -> Vec<String> {
    let t0 = Instant::now();
    loop {
        let said: Vec<String> = nodes.iter().map(|n| n.said()).collect();
        if ok(&said) {
            return said;
        }
        assert!(t0.elapsed() < limit, "timed out waiting for {what}:\n{}", said.join("\n----\n"));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A failing test must not leave its nodes running.
impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_ports(n: usize) -> Vec<u16> {
    metatopia_node::net::free_ports(n).unwrap()
}

fn setup(name: &str, n: usize, rate: u32) -> (Scratch, Vec<PathBuf>) {
    setup_with(name, n, 0, rate)
}

/// `n` nodes, the last `observers` of them observers (in the mesh, not in the genesis set).
fn setup_with(name: &str, n: usize, observers: usize, rate: u32) -> (Scratch, Vec<PathBuf>) {
    let root = Scratch::new(name);
    let ports = free_ports(2 * n);
    let quic = metatopia_node::net::free_udp_ports(n).unwrap();
    let dirs: Vec<PathBuf> = (0..n).map(|i| root.join(format!("node-{i}"))).collect();
    let validators: Vec<ValidatorEntry> = dirs
        .iter()
        .zip(&ports)
        .enumerate()
        .map(|(i, (d, p))| {
            let key = DataDir::open(d).unwrap().key().unwrap();
            ValidatorEntry {
                key: metatopia_sim::ids::hex(key.verifying_key().as_bytes()),
                address: ([127, 0, 0, 1], *p).into(),
                quic: Some(([127, 0, 0, 1], quic[i]).into()),
                http: None,
                observer: i >= n - observers,
            }
        })
        .collect();
    // One genesis time for the sim's nodes: a real one, as an operator's sim has.
    let genesis_ms = metatopia_node::unix_ms();
    for (i, d) in dirs.iter().enumerate() {
        let cfg = NodeConfig {
            listen: validators[i].address,
            quic: validators[i].quic,
            http: Some(([127, 0, 0, 1], ports[n + i]).into()),
            tick_rate_hz: rate,
            snapshot_every: 128,
            genesis_hash: None,
            world: WorldConfig { objects: 120, players: 8, ..WorldConfig::demo(genesis_ms) },
            bots: BotsConfig { events_per_tick: if i == 0 { 8 } else { 0 } },
            validators: validators.clone(),
            join: None,
            sims: Vec::new(),
            raynet: Default::default(),
            network: Default::default(),
            sim_workers: None,
            block_history_mib: None,
        };
        write_atomic(&DataDir::open(d).unwrap().config_path(), cfg.commented().as_bytes()).unwrap();
    }
    (root, dirs)
}

fn start(i: usize, dir: &Path, roots: &Roots, extra: &[&str]) -> Node {
    let every: &[&str] = if extra.contains(&"--report-every") { &[] } else { &["--report-every", "10"] };
    let mut child = Command::new(env!("CARGO_BIN_EXE_metatopia"))
        .arg("run")
        .args(every)
        .arg("--data-dir")
        .arg(dir)
        .args(extra)
        // METATOPIA_TEST_LOG=debug (say) shows what the nodes log when a test fails.
        .env("RUST_LOG", std::env::var("METATOPIA_TEST_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let roots = roots.clone();
    let stdout = Arc::new(Mutex::new(String::new()));
    let lines = stdout.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            lines.lock().unwrap().push_str(&format!("{line}\n"));
            // "tick T root R ..."
            let w: Vec<&str> = line.split(' ').collect();
            if w.len() > 3 && w[0] == "tick" && w[2] == "root" {
                roots.lock().unwrap().insert((i, w[1].parse().unwrap()), (w[3].to_owned(), Instant::now()));
            }
        }
    });
    let err = child.stderr.take().unwrap();
    let stderr = Arc::new(Mutex::new(String::new()));
    let sink = stderr.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            sink.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    Node { child, stdout, stderr }
}

fn highest(roots: &Roots, i: usize) -> Option<u64> {
    roots.lock().unwrap().keys().filter(|(n, _)| *n == i).map(|(_, t)| *t).max()
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every tick reported by two nodes has the same root on both.
fn assert_same_roots(roots: &Roots) -> usize {
    let r = roots.lock().unwrap();
    let mut by_tick: BTreeMap<u64, Vec<(usize, &String)>> = BTreeMap::new();
    for ((n, t), (root, _)) in r.iter() {
        by_tick.entry(*t).or_default().push((*n, root));
    }
    let mut compared = 0;
    for (t, v) in &by_tick {
        for (n, root) in v {
            assert_eq!(*root, v[0].1, "tick {t}: node {n} differs from node {}", v[0].0);
        }
        compared += v.len().saturating_sub(1);
    }
    compared
}

fn interrupt(node: &mut Node) {
    let _ = Command::new("kill").arg("-INT").arg(node.child.id().to_string()).status();
    let status = node.child.wait().unwrap();
    assert!(status.success(), "exit {status}: {}", node.stderr.lock().unwrap());
}

#[test]
fn four_validators_and_an_observer_run_1000_ticks_with_identical_roots() {
    let (_scratch, dirs) = setup_with("thousand", 5, 1, 25);
    let roots: Roots = Arc::default();
    // Each node splits a tick's parallel stages over its own number of threads: the roots
    // must not care (DESIGN §5).
    let workers = ["1", "2", "3", "1", "4"];
    let mut nodes: Vec<Node> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| start(i, d, &roots, &["--ticks", "1000", "--sim-workers", workers[i]]))
        .collect();
    let t0 = Instant::now();
    for (i, n) in nodes.iter_mut().enumerate() {
        let status = loop {
            if let Some(s) = n.child.try_wait().unwrap() {
                break s;
            }
            if t0.elapsed() > Duration::from_secs(600) {
                let _ = n.child.kill();
                panic!("node {i} did not finish 1,000 ticks in 10 minutes: {}", n.stderr.lock().unwrap());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(status.success(), "node {i}: {status}: {}", n.stderr.lock().unwrap());
    }
    for i in 0..5 {
        assert_eq!(highest(&roots, i), Some(999), "node {i} reached tick 999");
    }
    assert_eq!(assert_same_roots(&roots), 4 * 100, "all 100 reports of all five nodes compared");
    for (i, n) in nodes.iter().enumerate() {
        let out = n.stdout.lock().unwrap();
        assert!(out.contains(&format!("; sim workers {}\n", workers[i])), "node {i}: {out}");
    }
    assert!(nodes[4].stdout.lock().unwrap().contains("an observer"), "node 4 follows without voting");
    assert!(nodes[0].stdout.lock().unwrap().contains("a validator"));
    // Snapshots were written along the way.
    assert!(DataDir::open(&dirs[0]).unwrap().snapshots().unwrap().iter().any(|(t, _)| *t == Tick(896)));
}

#[test]
fn a_validator_killed_and_restarted_with_a_torn_log_catches_up_and_agrees() {
    let (_scratch, dirs) = setup("kill", 4, 20);
    let roots: Roots = Arc::default();
    let mut nodes: Vec<Node> = dirs.iter().enumerate().map(|(i, d)| start(i, d, &roots, &[])).collect();
    wait_for("tick 100 everywhere", Duration::from_secs(300), || (0..4).all(|i| highest(&roots, i) >= Some(99)));

    // kill -9 node 2; the other three keep the sim ticking.
    nodes[2].child.kill().unwrap();
    nodes[2].child.wait().unwrap();
    let at_kill = highest(&roots, 0).unwrap();
    wait_for("progress without node 2", Duration::from_secs(300), || highest(&roots, 0) >= Some(at_kill + 60));

    // Tear its log's tail (the newest segment's), as a crash in the middle of a write would.
    let log = std::fs::read_dir(dirs[2].join("log"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .max()
        .unwrap();
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(&[200, 1, 0, 0, 1, 2, 3]);
    std::fs::write(&log, &bytes).unwrap();

    nodes[2] = start(2, &dirs[2], &roots, &[]);
    let target = highest(&roots, 0).unwrap() + 40;
    wait_for("node 2 to catch up", Duration::from_secs(300), || highest(&roots, 2) >= Some(target));
    for n in &mut nodes {
        interrupt(n);
    }
    let warned = nodes[2].stderr.lock().unwrap().clone();
    assert!(warned.contains("cut 7 bytes off the commit log's torn tail"), "{warned}");
    assert!(assert_same_roots(&roots) > 30);
}

#[test]
fn a_node_in_no_config_joins_through_a_join_address_from_a_certified_snapshot_and_follows() {
    let (_scratch, dirs) = setup("join", 4, 20);
    let roots: Roots = Arc::default();
    let mut nodes: Vec<Node> = dirs.iter().enumerate().map(|(i, d)| start(i, d, &roots, &[])).collect();
    wait_for("tick 200 on node 0", Duration::from_secs(300), || highest(&roots, 0) >= Some(199));

    // A new node with an empty data directory: only node 1's join address.
    let cfg = NodeConfig::load(&DataDir::open(&dirs[1]).unwrap().config_path()).unwrap();
    let join = format!("{}@{}", cfg.validators[1].key, cfg.validators[1].address);
    let joiner = dirs[0].parent().unwrap().join("joiner");
    let ports = free_ports(2);
    let quic = metatopia_node::net::free_udp_ports(1).unwrap();
    let (listen, quic, http) =
        (format!("127.0.0.1:{}", ports[0]), format!("127.0.0.1:{}", quic[0]), format!("127.0.0.1:{}", ports[1]));
    let args = ["--join", &join, "--listen", &listen, "--quic", &quic, "--http", &http];
    nodes.push(start(4, &joiner, &roots, &args));
    let joined = |out: &str| -> Option<u64> {
        out.split("joined: took the state of tick ").nth(1)?.split(' ').next()?.parse().ok()
    };
    wait_for("the new node to join", Duration::from_secs(120), || joined(&nodes[4].stdout.lock().unwrap()).is_some());
    let at = joined(&nodes[4].stdout.lock().unwrap()).unwrap();
    wait_for("the new node to follow 100 ticks", Duration::from_secs(300), || {
        highest(&roots, 4).is_some_and(|t| t >= at + 100)
    });
    let out = nodes[4].stdout.lock().unwrap().clone();
    assert!(out.contains("in no list"), "{out}");
    // It took a snapshot: it never executed the ticks before it.
    let first = roots.lock().unwrap().keys().filter(|(n, _)| *n == 4).map(|(_, t)| *t).min().unwrap();
    assert!(first >= at && at >= 199, "joined at {at}, first tick reported {first}");
    // Its config came from node 1, with this node's own addresses.
    let written = NodeConfig::load(&DataDir::open(&joiner).unwrap().config_path()).unwrap();
    assert_eq!(written.validators, cfg.validators);
    assert_eq!((written.listen.to_string(), written.join.as_deref()), (listen.clone(), Some(join.as_str())));
    for n in &mut nodes {
        interrupt(n);
    }
    assert!(assert_same_roots(&roots) > 4 * 6, "the joiner's roots were compared with the others'");

    // Restarted, it goes on from its own snapshot and log, without asking again.
    let mut again = start(4, &joiner, &roots, &[]);
    wait_for("the restarted joiner's first lines", Duration::from_secs(60), || {
        again.stdout.lock().unwrap().contains("listening on")
    });
    interrupt(&mut again);
    let out = again.stdout.lock().unwrap().clone();
    assert!(out.contains("in no list") && !out.contains("joining:"), "{out}");
    let now: u64 = out.split("now at tick ").nth(1).and_then(|s| s.split(' ').next()).unwrap().parse().unwrap();
    assert!(now >= at + 100, "{out}");
}

#[test]
fn a_killed_validator_costs_the_sim_almost_none_of_its_tick_rate() {
    use metatopia_node::api::http::{Client, GovernanceView, Status};
    // 20 Hz; leaders rotate every view, so a dead validator leads one view in four until the
    // chain shows it failed and silent, and each of its views waits out the leader timeout
    // (0.4 s, 8 periods). The blocks after cover the ticks due meanwhile (consensus' spans): the
    // sim's agreed time still advances a period a tick (with a block a tick it advanced ~200 ms
    // a tick). Then it no longer leads (leader reputation): no view fails, each block is a
    // view of its own and carries one tick (with plain round robin, about 29 views for 80
    // ticks). Counted in agreed time and views, not in the test's clock (a loaded machine can
    // stretch that).
    let (_scratch, dirs) = setup("leader", 4, 20);
    let roots: Roots = Arc::default();
    let mut nodes: Vec<Node> =
        dirs.iter().enumerate().map(|(i, d)| start(i, d, &roots, &["--report-every", "1"])).collect();
    wait_for("tick 60 everywhere", Duration::from_secs(300), || (0..4).all(|i| highest(&roots, i) >= Some(59)));
    nodes[1].child.kill().unwrap();
    nodes[1].child.wait().unwrap();
    let at_kill = highest(&roots, 0).unwrap();
    let node0 = Client::new(&http_of(&dirs[0]));
    let view = || node0.get::<Status>("/v1/status").unwrap().unwrap().view;
    let agreed = || {
        let g: GovernanceView = node0.get("/v1/governance").unwrap().unwrap();
        (g.tick, g.time_ms)
    };
    wait_for("5 ticks without node 1", Duration::from_secs(300), || highest(&roots, 0) >= Some(at_kill + 5));
    let ((tick0, ms0), view0) = (agreed(), view());
    wait_for("80 more ticks without node 1", Duration::from_secs(300), || agreed().0 >= tick0 + 80);
    let ((tick1, ms1), view1) = (agreed(), view());
    // The dead leader's views were among them (each costs 0.4 s of waiting)...
    assert!(view1 - view0 >= 8, "views {view0}..{view1}");
    // ...and cost next to no ticks: at most a tenth more agreed time a tick than the 50 ms.
    let per_tick = (ms1 - ms0) as f64 / tick1.since(tick0) as f64;
    assert!(per_tick <= 55.0, "{per_tick:.1} ms of agreed time a tick at 20 Hz (ticks {tick0}..{tick1})");
    // Then the dead validator leads no view: at least three views in four ticks.
    let ((tick0, _), view0) = (agreed(), view());
    wait_for("80 more ticks without node 1", Duration::from_secs(300), || agreed().0 >= tick0 + 80);
    let ((tick1, _), view1) = (agreed(), view());
    for (i, n) in nodes.iter_mut().enumerate() {
        if i != 1 {
            interrupt(n);
        }
    }
    assert!(4 * (view1 - view0) >= 3 * tick1.since(tick0), "views {view0}..{view1} for ticks {tick0}..{tick1}");
    assert!(assert_same_roots(&roots) > 3 * 60, "the three nodes' roots were compared");
}

/// The whole stdout of a run that stops by itself.
/// Wait for a started node to exit on its own (within `limit`), successfully: its stdout and stderr.
fn finish(i: usize, mut node: Node, limit: Duration) -> (String, String) {
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = node.child.try_wait().unwrap() {
            break s;
        }
        // A node that never stops must fail the test, not hang the suite.
        assert!(t0.elapsed() < limit, "node {i} did not stop within {limit:?}:\n{}", node.said());
        std::thread::sleep(Duration::from_millis(50));
    };
    // The readers see the pipes close just after the exit.
    std::thread::sleep(Duration::from_millis(100));
    let (o, e) = (node.stdout.lock().unwrap().clone(), node.stderr.lock().unwrap().clone());
    assert!(status.success(), "node {i}: {status}\n{o}\n{e}");
    (o, e)
}

/// Run node `i` until it has executed `ticks` ticks and stopped by itself.
fn run_to_end(i: usize, dir: &Path, ticks: u64) -> (String, String) {
    let node = start(i, dir, &Roots::default(), &["--report-every", "50", "--ticks", &ticks.to_string()]);
    finish(i, node, Duration::from_secs(300))
}

/// Run the nodes `which` of `dirs` at once until each has executed `ticks` ticks and stopped.
fn run_all_to_end(dirs: &[PathBuf], which: &[usize], ticks: u64) -> Vec<(String, String)> {
    let hs: Vec<_> = which
        .iter()
        .map(|&i| {
            let d = dirs[i].clone();
            std::thread::spawn(move || run_to_end(i, &d, ticks))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn final_root(stdout: &str) -> &str {
    stdout.lines().find_map(|l| l.split("final root ").nth(1)).expect("a final root")
}

#[test]
fn a_tampered_snapshot_is_refused_with_a_clear_error_and_the_log_rebuilds_the_state() {
    let (_scratch, dirs) = setup("tamper", 4, 50);
    let runs = |ticks: u64| run_all_to_end(&dirs, &[0, 1, 2, 3], ticks);
    let first = runs(200);
    let roots: Vec<&str> = first.iter().map(|(o, _)| final_root(o)).collect();
    assert!(roots.iter().all(|r| *r == roots[0]), "{roots:?}");
    let snaps = DataDir::open(&dirs[0]).unwrap().snapshots().unwrap();
    let (tick, path) = snaps.last().unwrap().clone();
    assert_eq!(tick, Tick(128));
    let mut bytes = std::fs::read(&path).unwrap();
    // The file holds the state as of the tick it is named for (taken the moment tick 127
    // executed, not when the node's loop got to its output), a multiple of 64 whose root covers
    // every byte of the physics: `core::tests` checks that any bit flipped in it is refused.
    let snap = metatopia_sim::Snapshot::decode(&bytes, 1 << 30).unwrap();
    assert_eq!(snap.world.tick().0, 128, "the snapshot named for tick 128 holds another tick");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();

    let second = runs(220);
    let (out, err) = &second[0];
    assert!(err.contains("snapshot") && err.contains("refused"), "{err}");
    // Without the snapshot node 0 replayed its whole log: the 200 ticks it executed and any
    // commits logged while it waited for its peers to finish (executed now).
    let start = out.lines().next().unwrap();
    let replayed = start
        .split_once("snapshot at tick 0, ")
        .and_then(|(_, rest)| rest.split_once(" ticks replayed from the log; now at tick "))
        .map(|(n, _)| n.parse::<u64>().unwrap())
        .unwrap_or_else(|| panic!("no replay from genesis: {start}"));
    assert!(replayed >= 200, "{start}");
    if replayed == 200 {
        assert!(start.contains(&format!("now at tick 200 root {}; ", roots[0])), "{start}");
    }
    // What the log rebuilt is what its peers have: their roots, checked in every vote, never
    // disagreed with node 0's, so it never had to resync.
    assert!(!err.contains("diverged") && !out.contains("resynced"), "{out}\n{err}");
    // The others started from their snapshot (tick 128) and the log since.
    let start1 = second[1].0.lines().next().unwrap();
    assert!(start1.contains("snapshot at tick 128, ") && start1.contains(" ticks replayed"), "{start1}");
    let again: Vec<&str> = second.iter().map(|(o, _)| final_root(o)).collect();
    assert!(again.iter().all(|r| *r == again[0]), "{again:?}");
    assert!(second.iter().all(|(o, _)| o.contains("stopped after the requested ticks at tick 220;")));
}

/// A sim stopped whole (`--ticks` on every node) must not strand its slowest node: here node 0
/// starts after its three peers have already executed every requested tick. They wait for it
/// (executing nothing more), it catches up from them, and all four stop at the same tick with
/// the same root. (Peers that stopped at once left it waiting forever for commits no quorum
/// could certify any more; and peers that only timed out views never sent it the finalization
/// it lacked: the CI hang of the tampered-snapshot test.) Before that, the three peers restart
/// without node 0, each with the votes it cast as the first run stopped: they commit only if
/// each counts its own restored votes (they did not, and in about one run in three all three
/// had nullified the view they stopped in and never committed again).
#[test]
fn a_node_started_after_its_peers_finished_is_not_stranded_when_the_sim_stops_whole() {
    let (_scratch, dirs) = setup("late", 4, 50);
    run_all_to_end(&dirs, &[0, 1, 2, 3], 40);
    let ticks = ["--report-every", "50", "--ticks", "80"];
    let roots = Roots::default();
    let peers: Vec<Node> = (1..4).map(|i| start(i, &dirs[i], &roots, &ticks)).collect();
    let waiting: Vec<&Node> = peers.iter().collect();
    wait_for_output("the peers to execute tick 79 and wait", Duration::from_secs(120), &waiting, |said| {
        said.iter().all(|s| s.contains("executed tick 79: waiting"))
    });
    let late = start(0, &dirs[0], &roots, &ticks);
    let mut outs = vec![finish(0, late, Duration::from_secs(120))];
    outs.extend(peers.into_iter().enumerate().map(|(i, n)| finish(i + 1, n, Duration::from_secs(120))));
    for (i, (o, e)) in outs.iter().enumerate() {
        assert!(o.contains("stopped after the requested ticks at tick 80;"), "node {i}: {o}\n{e}");
        assert!(!e.contains("warning: stopping after tick"), "node {i} gave up waiting: {o}\n{e}");
    }
    let finals: Vec<&str> = outs.iter().map(|(o, _)| final_root(o)).collect();
    assert!(finals.iter().all(|r| *r == finals[0]), "{finals:?}");
}

/// The agreement suite's `a_laggard_catches_up_after_the_whole_sim_stopped` on real
/// processes: node 1 is down while the others run past tick 120 and stop; then all four start
/// again. The agreement's saved state holds only the blocks not yet executed, so node 1 can
/// fetch the ticks it lacks only because its peers read them back from their commit logs
/// (`NodeCore::recall`); before, it stayed at its tick 43 for ever.
#[test]
fn a_validator_down_when_its_sim_stopped_whole_catches_up_after_the_restart() {
    let (_scratch, dirs) = setup("laggard", 4, 50);
    run_all_to_end(&dirs, &[0, 1, 2, 3], 40);
    // Without node 1, to tick 120 and a little past; then all three are stopped by Ctrl-C.
    let roots = Roots::default();
    let mut three: Vec<Node> = [0, 2, 3].iter().map(|&i| start(i, &dirs[i], &roots, &[])).collect();
    let running: Vec<&Node> = three.iter().collect();
    let newest =
        |said: &str| said.lines().filter_map(|l| l.strip_prefix("tick ")?.split(' ').next()?.parse::<u64>().ok()).max();
    wait_for_output("nodes 0, 2 and 3 to execute tick 120", Duration::from_secs(120), &running, |said| {
        said.iter().all(|s| newest(s).is_some_and(|t| t >= 120))
    });
    three.iter_mut().for_each(interrupt);
    drop(three);
    // (Well past where they stopped: a block after node 1's views covers the ticks they took,
    // so the three may have gone some tens of ticks past 120.)
    let ticks = ["--report-every", "50", "--ticks", "300"];
    let nodes: Vec<Node> = (0..4).map(|i| start(i, &dirs[i], &roots, &ticks)).collect();
    let outs: Vec<(String, String)> =
        nodes.into_iter().enumerate().map(|(i, n)| finish(i, n, Duration::from_secs(180))).collect();
    for (i, (o, e)) in outs.iter().enumerate() {
        assert!(o.contains("stopped after the requested ticks at tick 300;"), "node {i}: {o}\n{e}");
        assert!(!e.contains("warning: stopping after tick"), "node {i} gave up waiting: {o}\n{e}");
    }
    // By fetching the blocks: not from a snapshot, as a node stranded behind would.
    assert!(!outs[1].0.contains("resynced:"), "node 1 took a snapshot: {}", outs[1].0);
    let finals: Vec<&str> = outs.iter().map(|(o, _)| final_root(o)).collect();
    assert!(finals.iter().all(|r| *r == finals[0]), "{finals:?}");
}

/// A validator alone (its three peers never start) cannot commit: after 10 s it says so, and
/// where its agreement stands, instead of sitting silent.
#[test]
fn a_validator_without_a_quorum_says_where_its_agreement_stands() {
    let (_scratch, dirs) = setup("alone", 4, 50);
    let node = start(0, &dirs[0], &Roots::default(), &[]);
    let said = wait_for_output("the stall warning", Duration::from_secs(60), &[&node], |said| {
        said[0].contains("warning: no tick committed for 10 s")
            && said[0].matches("of this sim unreachable").count() == 3
    });
    let line = said[0].lines().find(|l| l.contains("no tick committed")).unwrap();
    assert!(line.contains("(1 of 4 validators of this sim connected): epoch 0: view "), "{line}");
    // ... and names each validator it cannot reach, once it has been 10 s.
    assert!(
        said[0].matches("of this sim unreachable for 10s (1 of 4 validators connected; no quorum").count() == 3,
        "{}",
        said[0]
    );
    // Alone, it timed out its view and nullified it, and counted only its own vote.
    assert!(line.contains(": mine .X.") && line.contains(" x1 "), "{line}");
}

fn http_of(dir: &Path) -> String {
    let cfg = metatopia_node::config::NodeConfig::load(&DataDir::open(dir).unwrap().config_path()).unwrap();
    cfg.http_addr().to_string()
}

#[test]
fn health_metrics_stats_and_signed_admin_acts_through_the_http_service() {
    use metatopia_node::api::http::{AccountView, Client, Status};
    let (_scratch, dirs) = setup("http", 4, 20);
    let roots: Roots = Arc::default();
    let mut nodes: Vec<Node> = dirs.iter().enumerate().map(|(i, d)| start(i, d, &roots, &[])).collect();
    let https: Vec<String> = dirs.iter().map(|d| http_of(d)).collect();
    let clients: Vec<Client> = https.iter().map(|h| Client::new(h)).collect();
    wait_for("tick 40 everywhere", Duration::from_secs(300), || (0..4).all(|i| highest(&roots, i) >= Some(39)));

    for (i, c) in clients.iter().enumerate() {
        assert_eq!(c.get_text("/healthz").unwrap(), (200, "ok\n".to_owned()), "node {i}");
        wait_for("ready", Duration::from_secs(60), || c.get_text("/readyz").unwrap().0 == 200);
    }
    let metrics = clients[1].get_text("/metrics").unwrap().1;
    // Labelled by sim: a process may run nodes of several sims.
    for name in [
        "metatopia_tick{sim=\"1\"} ",
        "metatopia_time_dilation{sim=\"1\"} ",
        "metatopia_commit_latency_seconds",
        "metatopia_peers{sim=\"1\"} 3",
        "metatopia_validators_connected{sim=\"1\"} 4",
    ] {
        assert!(metrics.contains(name), "{name} missing from /metrics:\n{metrics}");
    }
    let s: Status = clients[2].get("/v1/status").unwrap().unwrap();
    assert!(s.tick.0 >= 39 && s.validators == 4 && s.node == 2 && s.root.len() == 64, "{s:?}");

    let (ok, out, err) = cli(&["stats", "--node", &https[1]]);
    assert!(ok, "{err}");
    assert!(out.contains("time dilation") && out.contains("validators         4 of 4 connected\n"), "{out}");

    // The demo world's admin (seed 1, key 0) governs; another account may not.
    let root = dirs[0].parent().unwrap();
    let admin_key = root.join("admin.key");
    let player_key = root.join("player.key");
    metatopia_node::store::write_key(&admin_key, &metatopia_sim::genesis::demo_key(1, 0)).unwrap();
    metatopia_node::store::write_key(&player_key, &metatopia_sim::genesis::demo_key(77, 1)).unwrap();
    let admin = admin_key.to_str().unwrap();
    let (ok, out, err) = cli(&["admin", "--node", &https[0], "--key", admin, "login"]);
    assert!(ok && out.contains("executed at tick"), "{out}{err}");
    let (ok, out, _) = cli(&["admin", "--node", &https[3], "status"]);
    assert!(ok && out.contains("(present)") && out.contains("temp admin         none"), "{out}");

    let victim = metatopia_sim::event::account_of(&metatopia_sim::genesis::demo_key(1, 3)).to_string();
    let (ok, out, err) = cli(&["admin", "--node", &https[2], "--key", admin, "ban", &victim]);
    assert!(ok && out.contains("executed at tick"), "{out}{err}");
    wait_for("the ban on node 1", Duration::from_secs(30), || {
        clients[1].get::<AccountView>(&format!("/v1/accounts/{victim}")).unwrap().is_some_and(|a| a.banned)
    });
    let player = player_key.to_str().unwrap();
    let (ok, _, err) = cli(&["admin", "--node", &https[1], "--key", player, "unban", &victim]);
    assert!(!ok && err.contains("unknown account: log in first"), "{err}");
    let (ok, out, err) = cli(&["admin", "--node", &https[1], "--key", player, "login", "mallory"]);
    assert!(ok, "{out}{err}");
    let (ok, _, err) = cli(&["admin", "--node", &https[1], "--key", player, "unban", &victim]);
    assert!(!ok && err.contains("refused at tick") && err.contains("needs the admin"), "{err}");

    // The admin returns a prim to its owner: out of the world, into the owner's account.
    let objects: Vec<metatopia_node::api::http::ObjectView> = clients[0].get("/v1/objects").unwrap().unwrap();
    let prim = objects
        .iter()
        .find(|o| !o.avatar && clients[0].get::<AccountView>(&format!("/v1/accounts/{}", o.owner)).unwrap().is_some())
        .expect("a prim whose owner has an account");
    let (ok, out, err) = cli(&["admin", "--node", &https[3], "--key", admin, "return-object", &prim.id]);
    assert!(ok && out.contains("executed at tick"), "{out}{err}");
    wait_for("the return on node 2", Duration::from_secs(30), || {
        clients[2].get::<metatopia_node::api::http::ObjectView>(&format!("/v1/objects/{}", prim.id)).unwrap().is_none()
    });
    let owner: AccountView = clients[2].get(&format!("/v1/accounts/{}", prim.owner)).unwrap().unwrap();
    assert_eq!(owner.returned, vec![prim.name.clone()]);

    // Settings: the area-of-interest radius and script limits, the same on every node.
    let (ok, out, err) = cli(&[
        "admin",
        "--node",
        &https[1],
        "--key",
        admin,
        "settings",
        "--aoi-radius-m",
        "32",
        "--max-source-bytes",
        "5000",
        "--max-script-outputs",
        "7",
        "--script-failure-limit",
        "3",
    ]);
    assert!(ok && out.contains("executed at tick"), "{out}{err}");
    wait_for("the settings on every node", Duration::from_secs(30), || {
        clients.iter().all(|c| {
            let g: metatopia_node::api::http::GovernanceView = c.get("/v1/governance").unwrap().unwrap();
            let l = &g.settings.limits;
            g.settings.aoi_radius_m == 32
                && l.max_source_bytes == 5000
                && l.max_script_outputs == 7
                && l.script_failure_limit == 3
        })
    });

    // Bad input gets a clear error and changes nothing.
    let (ok, _, err) = cli(&["admin", "--node", &https[0], "--key", admin, "ban", "nobody"]);
    assert!(!ok && err.contains("not an account id"), "{err}");
    let e = Client::new(&https[0]).submit(b"garbage").unwrap_err().to_string();
    assert!(e.contains("not a signed event") && e.contains("HTTP 400"), "{e}");

    for n in &mut nodes {
        interrupt(n);
    }
    assert!(assert_same_roots(&roots) > 10);
}

/// Stop node `i` with Ctrl-C, restart it, kill it with -9, restart it: each time it must be
/// back in step (40 ticks past the others' tip when it restarted) from its own snapshot and
/// log, without cutting or repairing anything.
fn restart_twice_in_step(nodes: &mut [Node], dirs: &[PathBuf], roots: &Roots, i: usize) {
    for how in ["ctrl-c", "kill -9"] {
        if how == "ctrl-c" {
            interrupt(&mut nodes[i]);
        } else {
            nodes[i].child.kill().unwrap();
            nodes[i].child.wait().unwrap();
        }
        let other = (i + 1) % nodes.len();
        let target = highest(roots, other).unwrap() + 40;
        let restarted = Instant::now();
        nodes[i] = start(i, &dirs[i], roots, &[]);
        wait_for("the node back in step", Duration::from_secs(120), || highest(roots, i) >= Some(target));
        println!(
            "after {how}: node {i} reached the others' tip + 40 ticks {:?} after its restart",
            restarted.elapsed()
        );
        let said = nodes[i].said();
        let repairs = [
            "cut ",
            "damaged",
            "replays no further",
            "out of order",
            "resynced",
            "joined:",
            "snapshot its peers certify",
        ];
        for bad in repairs {
            assert!(!said.contains(bad), "after {how}, node {i} said {bad:?}: {said}");
        }
    }
}

#[test]
fn a_node_started_from_another_world_diverges_reports_and_resyncs_from_its_peers() {
    let (_scratch, dirs) = setup("resync", 4, 20);
    // Node 3's config describes another genesis world: its roots differ from tick 0.
    let path = DataDir::open(&dirs[3]).unwrap().config_path();
    let mut cfg = NodeConfig::load(&path).unwrap();
    cfg.world.seed = 99;
    write_atomic(&path, cfg.commented().as_bytes()).unwrap();
    let roots: Roots = Arc::default();
    let mut nodes: Vec<Node> = dirs.iter().enumerate().map(|(i, d)| start(i, d, &roots, &[])).collect();
    wait_for("node 3 to resync", Duration::from_secs(120), || nodes[3].stdout.lock().unwrap().contains("resynced"));
    let out = nodes[3].stdout.lock().unwrap().clone();
    let line = out.lines().find(|l| l.starts_with("resynced")).unwrap().to_owned();
    let from: u64 = line.split("state of tick ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    let err = nodes[3].stderr.lock().unwrap().clone();
    assert!(err.contains("diverged at tick") && err.contains("desync-report-"), "{err}");
    assert!(
        std::fs::read_dir(&dirs[3]).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("desync-report-"))
    );
    // From then on node 3 reports the others' roots.
    wait_for("40 ticks after the resync", Duration::from_secs(120), || highest(&roots, 3) >= Some(from + 40));
    // Stopped cleanly, then killed with -9, it restarts from its own snapshot and log and is
    // back in step each time, its log whole.
    restart_twice_in_step(&mut nodes, &dirs, &roots, 3);
    for n in &mut nodes {
        interrupt(n);
    }
    let r = roots.lock().unwrap();
    let mut compared = 0;
    for ((n, t), (root, _)) in r.iter().filter(|((n, t), _)| *n == 3 && *t >= from) {
        if let Some((other, _)) = r.get(&(0, *t)) {
            assert_eq!(root, other, "node {n} at tick {t} after resyncing at {from}");
            compared += 1;
        }
    }
    assert!(compared >= 3, "compared {compared} status lines");
}

#[test]
fn the_admins_tick_rate_takes_effect_at_the_next_epoch_boundary_on_every_node() {
    use metatopia_node::api::http::Status;
    // 20 Hz, epochs of 40 ticks; the admin is "ada".
    let cluster = support::Cluster::start("rate", "validator-admission.toml");
    let key = cluster.root.join("ada.key");
    metatopia_node::store::write_key(&key, &metatopia_node::world::account_key("ada")).unwrap();
    let key = key.to_str().unwrap();
    let (ok, out, err) = cli(&["admin", "--node", &cluster.http[1], "--key", key, "login", "ada"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli(&["admin", "--node", &cluster.http[2], "--key", key, "settings", "--tick-rate-hz", "10"]);
    assert!(ok && out.contains("executed at tick"), "{out}{err}");
    let rate = |i: usize| cluster.status(i).map(|s: Status| s.tick_rate_hz);
    wait_for("10 Hz on every node", Duration::from_secs(60), || (0..4).all(|i| rate(i) == Some(10)));
    // And the sim runs at it: its agreed time advances a tenth of a second a tick (the leaders
    // schedule ticks from the chain's own times; nothing here reads the test's clock). At 20 Hz
    // it would be half that; a loaded machine can only make it more.
    let gov = |i: usize| {
        let g: metatopia_node::api::http::GovernanceView =
            metatopia_node::api::http::Client::new(&cluster.http[i]).get("/v1/governance").unwrap().unwrap();
        (g.tick, g.time_ms)
    };
    let (t0, ms0) = gov(0);
    wait_for("20 more ticks", Duration::from_secs(120), || gov(0).0 >= t0 + 20);
    let (t1, ms1) = gov(0);
    let per_tick = (ms1 - ms0) / t1.since(t0);
    assert!(per_tick >= 90, "{per_tick} ms of agreed time a tick at 10 Hz (ticks {t0}..{t1})");
    // Every node agrees on every tick before and after the switch.
    let low = (0..4).map(|i| cluster.status(i).unwrap().tick).min().unwrap();
    for t in [low.saturating_sub(60), low.saturating_sub(10)] {
        let roots: Vec<String> = (0..4)
            .map(|i| {
                metatopia_node::api::http::Client::new(&cluster.http[i])
                    .get::<metatopia_node::api::http::RootView>(&format!("/v1/roots/{t}"))
                    .unwrap()
                    .unwrap()
                    .root
            })
            .collect();
        assert!(roots.iter().all(|r| *r == roots[0]), "tick {t}: {roots:?}");
    }
}

#[test]
fn a_joined_node_admitted_by_the_admin_votes_from_the_next_epoch_and_its_votes_count() {
    use metatopia_node::api::http::{Client, Status};
    // 20 Hz, epochs of 40 ticks; the admin is "ada".
    let mut cluster = support::Cluster::start("admit-joined", "validator-admission.toml");
    let ports = free_ports(2);
    let quic = metatopia_node::net::free_udp_ports(1).unwrap();
    let http = format!("127.0.0.1:{}", ports[1]);
    let joiner = cluster.root.join("joiner");
    let key = metatopia_sim::ids::hex(DataDir::open(&joiner).unwrap().key().unwrap().verifying_key().as_bytes());
    let _node = support::Kill(
        Command::new(env!("CARGO_BIN_EXE_metatopia"))
            .args(["run", "--join", &cluster.join[1], "--data-dir"])
            .arg(&joiner)
            .args(["--listen", &format!("127.0.0.1:{}", ports[0]), "--quic", &format!("127.0.0.1:{}", quic[0])])
            .args(["--http", &http])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let status = || Client::new(&http).get::<Status>("/v1/status").ok().flatten();
    wait_for("the new node to follow", Duration::from_secs(120), || status().is_some_and(|s| s.tick.0 > 0));
    assert!(!status().unwrap().voting);

    let admin = cluster.root.join("ada.key");
    metatopia_node::store::write_key(&admin, &metatopia_node::world::account_key("ada")).unwrap();
    let admin = admin.to_str().unwrap();
    let (ok, out, err) = cli(&["admin", "--node", &cluster.http[1], "--key", admin, "login", "ada"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli(&["admin", "--node", &cluster.http[2], "--key", admin, "admit-validator", &key]);
    assert!(ok && out.contains("executed at tick"), "{out}{err}");
    wait_for("the new node to vote", Duration::from_secs(60), || status().is_some_and(|s| s.voting));
    wait_for("five validators everywhere", Duration::from_secs(60), || {
        (0..4).all(|i| cluster.status(i).is_some_and(|s| s.validators == 5))
    });

    // Two of the five stop: 1, 2 and the new node are a quorum (3 of n = 5) only with its votes.
    cluster.nodes[0] = None;
    cluster.nodes[3] = None;
    let from = cluster.status(1).unwrap().tick;
    wait_for("40 more ticks without nodes 0 and 3", Duration::from_secs(120), || {
        cluster.status(1).is_some_and(|s| s.tick >= from + 40)
    });
    let (a, b) = (cluster.status(1).unwrap().tick, status().unwrap().tick);
    let t = a.min(b).saturating_sub(5);
    let root = |h: &str| {
        Client::new(h).get::<metatopia_node::api::http::RootView>(&format!("/v1/roots/{t}")).unwrap().unwrap().root
    };
    assert_eq!(root(&cluster.http[1]), root(&http), "tick {t}");
}

#[test]
fn a_process_of_several_nodes_refuses_a_directory_twice_and_stops_them_all_when_one_fails() {
    let (_scratch, dirs) = setup("also", 4, 20);
    let d0 = dirs[0].to_str().unwrap();
    let (ok, _, err) = cli(&["run", "--data-dir", d0, "--also", d0]);
    assert!(!ok && err.contains("is given twice"), "{err}");
    // Node 0 starts and waits for its peers; the second directory has no config: its node fails,
    // and node 0 stops cleanly (its log synced) instead of running on alone.
    let empty = dirs[0].parent().unwrap().join("empty");
    let (ok, out, err) = cli(&["run", "--data-dir", d0, "--also", empty.to_str().unwrap()]);
    assert!(!ok, "{out}\n{err}");
    assert!(err.contains(&format!("the node of {}", empty.display())) && err.contains("no config.toml"), "{err}");
    assert!(
        out.contains("[sim 1] stopped because another node of this process stopped with an error at tick 0"),
        "{out}\n{err}"
    );
}

/// The wedge a certified snapshot once caused (issue #46): a validator down longer than its
/// peers keep blocks takes a snapshot they certify, so its log jumps from the tick it stopped at
/// to the snapshot's. A restart read the jump as a torn tail, cut the log, and the node stopped
/// for good ("commit out of order"). Now the jump is a new log segment: stopped cleanly, then
/// killed with -9, it restarts and is back in step each time, with its log whole.
#[test]
fn a_validator_that_took_a_certified_snapshot_restarts_in_step_after_ctrl_c_and_kill_9() {
    let (_scratch, dirs) = setup("wedge", 4, 50);
    for d in &dirs {
        let path = DataDir::open(d).unwrap().config_path();
        let mut cfg = NodeConfig::load(&path).unwrap();
        // Peers keep only 4 MiB of blocks, about five seconds of them at this load: a node down
        // for a while cannot fetch them, one restarted at once can.
        cfg.block_history_mib = Some(4);
        cfg.bots.events_per_tick *= 8;
        write_atomic(&path, cfg.commented().as_bytes()).unwrap();
    }
    let roots: Roots = Arc::default();
    let mut nodes: Vec<Node> = dirs.iter().enumerate().map(|(i, d)| start(i, d, &roots, &[])).collect();
    wait_for("tick 100 everywhere", Duration::from_secs(300), || (0..4).all(|i| highest(&roots, i) >= Some(99)));
    interrupt(&mut nodes[3]);
    let stopped = highest(&roots, 3).unwrap();
    // The others go on past what they keep (64 bot events a tick: a megabyte is ~60 ticks; the
    // newest 64 blocks are kept whatever their size, and with a validator down a block in four
    // covers the ticks its dead leader's view took, ~20).
    wait_for("the others 900 ticks further", Duration::from_secs(300), || highest(&roots, 0) >= Some(stopped + 900));
    nodes[3] = start(3, &dirs[3], &roots, &[]);
    // (Past an epoch boundary too: the node left behind its peers' epoch joins it again.)
    let took = |s: &str| {
        s.lines().any(|l| (l.starts_with("resynced") || l.starts_with("joined:")) && l.contains("state of tick "))
    };
    wait_for("node 3 to take a certified snapshot", Duration::from_secs(120), || took(&nodes[3].said()));
    let target = highest(&roots, 0).unwrap() + 40;
    wait_for("node 3 in step", Duration::from_secs(120), || highest(&roots, 3) >= Some(target));
    let segments: Vec<_> = std::fs::read_dir(dirs[3].join("log"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".seg"))
        .collect();
    let said = nodes[3].said();
    let line = said.lines().find(|l| took(l)).unwrap();
    let at: u64 = line.split("state of tick ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(at > stopped + 100, "{line}");
    // The jump began a segment at the snapshot's tick (the one before it is pruned once the
    // snapshots kept no longer reach back to it).
    assert!(segments.contains(&format!("{at:012}.seg")), "the jump to tick {at} began a log segment: {segments:?}");
    restart_twice_in_step(&mut nodes, &dirs, &roots, 3);
    for n in &mut nodes {
        interrupt(n);
    }
    let r = roots.lock().unwrap();
    let mut compared = 0;
    for ((_, t), (root, _)) in r.iter().filter(|((n, _), _)| *n == 3) {
        if let Some((other, _)) = r.get(&(0, *t)) {
            assert_eq!(root, other, "node 3 at tick {t}");
            compared += 1;
        }
    }
    assert!(compared >= 10, "compared {compared} status lines");
}
