//! `metatopia devnet`: several validators of one sim on loopback, each a real `metatopia run`
//! process with its own data directory, bots on the first; or a world of several sims, where
//! process p runs node p of every sim (`run --also`). Ctrl-C stops them all cleanly.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::{BotsConfig, NodeConfig, RaynetConfig, SimEntry, SimValidator, ValidatorEntry, WorldConfig};
use crate::store::{DataDir, write_atomic, write_key};
use anyhow::Context;

#[derive(Debug, clap::Args)]
pub struct DevnetArgs {
    /// Validators (n = 3f + 1 tolerates f faulty).
    #[arg(long, default_value_t = 4)]
    nodes: u16,
    /// Where the nodes' data directories go (reused: a second devnet resumes the first).
    #[arg(long, default_value_os_t = std::env::temp_dir().join("metatopia-devnet"))]
    dir: PathBuf,
    /// Start from genesis: delete the nodes' data first.
    #[arg(long)]
    fresh: bool,
    /// First port; node i listens on port + i.
    #[arg(long, default_value_t = 7400)]
    port: u16,
    /// Bots' signed events per tick, submitted through node 0 (with `--single`: its world has
    /// the bot players).
    #[arg(long, default_value_t = 20)]
    bots: u32,
    /// Client bots: real clients over QUIC, spread over the nodes, that log in, wander and chat.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Tick rate.
    #[arg(long, default_value_t = 20)]
    rate: u32,
    /// Stop after this many ticks (default: until Ctrl-C).
    #[arg(long)]
    ticks: Option<u64>,
    /// The world, as a scenario file (its objects, scripts, accounts and settings; faults and
    /// steps are ignored). Default: the built-in 2×2 world of four sims
    /// (scenarios/catalogue/devnet-world.toml), `--nodes` validators per sim, process i running
    /// node i of every sim (`run --also`).
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// One sim instead of the 2×2 world: the built-in single-sim world
    /// (scenarios/catalogue/devnet.toml: 300 prims, bot players signing events through node 0).
    #[arg(long, conflicts_with = "scenario")]
    single: bool,
    /// With several sims, one process per node instead of one process per node index hosting
    /// that node of every sim (more processes, more isolation, more CPU).
    #[arg(long)]
    process_per_node: bool,
    /// Print every node's status line (once a second each) instead of one line per sim.
    #[arg(long)]
    each_node: bool,
    /// Measurement only (`bench nodes`): the nodes send votes before they are on disk.
    #[arg(long, hide = true)]
    unsafe_no_sync: bool,
    /// Tests and measurements only: the nodes' frames to each other wait this many
    /// milliseconds (one way), as across the internet (`run --test-link-delay-ms`).
    #[arg(long, hide = true, default_value_t = 0)]
    test_link_delay_ms: u64,
    /// With `--test-link-delay-ms`: each frame's delay varies by up to this percent of it.
    #[arg(long, hide = true, default_value_t = 0)]
    test_link_jitter_percent: u32,
}

/// The built-in world of one sim (`--single`).
const DEVNET_SCENARIO: &str = include_str!("../../../scenarios/catalogue/devnet.toml");
/// The built-in default world: four sims side by side.
const GRID_SCENARIO: &str = include_str!("../../../scenarios/catalogue/devnet-world.toml");

pub fn run(args: DevnetArgs) -> anyhow::Result<()> {
    anyhow::ensure!((4..=31).contains(&args.nodes), "--nodes must be 4..=31 (n = 3f + 1 with f >= 1)");
    // The world: the given scenario file, or the built-in one with the example scripts, both
    // written into the devnet's directory so the nodes read them from there.
    std::fs::create_dir_all(&args.dir).with_context(|| format!("creating {}", args.dir.display()))?;
    let (scenario, scripts) = match &args.scenario {
        Some(f) => {
            let f = std::fs::canonicalize(f).with_context(|| format!("the scenario {}", f.display()))?;
            let scripts = f.parent().unwrap_or(std::path::Path::new(".")).join("../scripts");
            (f, scripts)
        }
        None => {
            let f = args.dir.join("scenario.toml");
            write_atomic(&f, if args.single { DEVNET_SCENARIO } else { GRID_SCENARIO }.as_bytes())?;
            let scripts = args.dir.join("scripts");
            std::fs::create_dir_all(&scripts)?;
            for (name, src) in crate::world::EXAMPLE_SCRIPTS {
                write_atomic(&scripts.join(format!("{name}.rhai")), src.as_bytes())?;
            }
            (std::fs::canonicalize(f)?, std::fs::canonicalize(scripts)?)
        }
    };
    let (spec, text) = crate::world::load(&scenario)?;
    // Another world than the last devnet in this directory ran: its nodes' data is of no use.
    let stamp = args.dir.join("world.stamp");
    let this_world =
        format!("{}\n{}\n", scenario.display(), metatopia_sim::ids::hex(blake3::hash(text.as_bytes()).as_bytes()));
    let other_world = std::fs::read_to_string(&stamp).is_ok_and(|w| w != this_world);
    if other_world && !args.fresh {
        println!("{} held a devnet of another world: starting fresh", args.dir.display());
    }
    // Sim k's validators are nodes (k-1)·n … k·n-1.
    let sims = spec.world.sims.max(1) as usize;
    let per = usize::from(args.nodes);
    let total = per * sims;
    anyhow::ensure!(total <= 64, "{sims} sims × {per} nodes is more than the 64 processes a devnet runs");
    // A devnet is disposable: data from an older version of this program starts over.
    let stale = (0..total).any(|i| DataDir::incompatible(&args.dir.join(format!("node-{i}"))));
    if stale && !args.fresh {
        println!("{} holds devnet data from an older version of metatopia: starting fresh", args.dir.display());
    }
    if args.fresh || stale || other_world {
        for i in 0.. {
            let d = args.dir.join(format!("node-{i}"));
            if !d.exists() {
                break;
            }
            std::fs::remove_dir_all(&d).with_context(|| format!("removing {}", d.display()))?;
        }
    }
    write_atomic(&stamp, this_world.as_bytes())?;
    let dirs: Vec<DataDir> =
        (0..total).map(|i| DataDir::open(&args.dir.join(format!("node-{i}")))).collect::<Result<_, _>>()?;
    let mut validators = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let key = d.key()?;
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], args.port + i as u16));
        validators.push(ValidatorEntry {
            key: metatopia_sim::ids::hex(key.verifying_key().as_bytes()),
            address,
            quic: Some(std::net::SocketAddr::from(([127, 0, 0, 1], args.port + 2000 + i as u16))),
            http: None,
            observer: false,
        });
    }
    let of_sim = |k: usize| validators[k * per..(k + 1) * per].to_vec();
    let seed = if sims > 1 { vec![format!("{}@{}", validators[0].key, validators[0].address)] } else { Vec::new() };
    // The demo sims' genesis time: now (a node builds its genesis from this at its first start,
    // and keeps it after; a devnet resumed keeps its genesis).
    let genesis_ms = crate::unix_ms();
    for (i, d) in dirs.iter().enumerate() {
        let k = i / per;
        let world = WorldConfig {
            sim_id: k as u32 + 1,
            seed: spec.seed,
            time_scale: spec.world.time_scale,
            scenario: Some(scenario.clone()),
            scripts: Some(scripts.clone()),
            ..WorldConfig::demo(genesis_ms)
        };
        let cfg = NodeConfig {
            listen: validators[i].address,
            quic: validators[i].quic,
            http: None,
            tick_rate_hz: args.rate,
            snapshot_every: 640,
            genesis_hash: None,
            world,
            bots: BotsConfig { events_per_tick: if i == 0 && sims == 1 { args.bots } else { 0 } },
            validators: of_sim(k),
            join: None,
            sims: (0..sims)
                .filter(|j| *j != k)
                .map(|j| SimEntry {
                    sim_id: j as u32 + 1,
                    validators: of_sim(j).iter().map(SimValidator::key_of).collect(),
                })
                .collect(),
            // The other sims' nodes are found through Raynet, starting from the first node.
            raynet: RaynetConfig { bootstrap: seed.clone(), ..RaynetConfig::default() },
            network: Default::default(),
            // The nodes share this machine's cores: one node's parallel stages on more
            // threads than its share only wake threads that find the cores busy (on 2 cores, 4
            // nodes of 2 workers each switched threads ~3,400 times a second each, idle).
            sim_workers: Some(share_of_cores(total)),
            block_history_mib: None,
        };
        write_atomic(&d.config_path(), cfg.commented().as_bytes())?;
    }
    let (cols, rows) = spec.world.layout();
    if sims == 1 {
        println!(
            "devnet: {per} validators of one sim ({}) on 127.0.0.1:{}..{}, {} Hz, {} bot events per tick; data in {}",
            scenario.display(),
            args.port,
            args.port + args.nodes - 1,
            args.rate,
            args.bots,
            args.dir.display()
        );
    } else {
        println!(
            "devnet: a {cols}×{rows} world of {sims} sims of {} m ({}), {per} validators each on 127.0.0.1:{}..{} (sim k: the k-th {per}), {} Hz; data in {}",
            spec.world.region_size,
            scenario.display(),
            args.port,
            args.port + total as u16 - 1,
            args.rate,
            args.dir.display()
        );
    }
    // The admin's key, so the devnet can be governed with `metatopia admin`.
    let admin = match spec.accounts.iter().find(|a| a.get_ref().admin) {
        Some(a) => crate::world::account_key(&a.get_ref().name),
        None => metatopia_sim::genesis::demo_key(spec.seed, 0),
    };
    let admin_key = args.dir.join("admin.key");
    write_key(&admin_key, &admin)?;
    let http = |i: usize| std::net::SocketAddr::new(validators[i].address.ip(), validators[i].address.port() + 1000);
    let http0 = http(0);
    // What a person needs to use the devnet: printed now, again on Enter, and at the end.
    let mut info = vec![
        format!("join address: {}@{}", validators[0].key, validators[0].address),
        format!(
            "node http: http://{http0} .. port {} (/healthz /readyz /metrics); `metatopia stats --node {http0}`",
            http0.port() + total as u16 - 1
        ),
        format!(
            "admin (a demo key: devnets only): `metatopia admin --node {http0} --key {} status`",
            admin_key.display()
        ),
    ];
    if sims == 1 {
        info.push(format!("web viewer: http://{http0}/  (any node's http port serves it)"));
    } else {
        let urls: Vec<String> = (0..sims).map(|k| format!("sim {}: http://{}/", k + 1, http(k * per))).collect();
        info.push(format!("web viewer, one per sim (a node shows its own sim): {}", urls.join("  ")));
    }
    info.push(format!(
        "terminal client: `metatopia client --join {}@{} --name you`",
        validators[0].key, validators[0].address
    ));
    info.push(format!(
        "another node: `metatopia run --data-dir <new dir> --join {}@{} --listen 127.0.0.1:{}`",
        validators[0].key,
        validators[0].address,
        args.port + 100
    ));
    let info = info.join("\n");
    println!("{info}");
    println!(
        "one status line per sim every {} s; Enter prints the addresses again; Ctrl-C stops the devnet",
        BOARD_EVERY.as_secs()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;
    let exe = std::env::current_exe().context("finding this program")?;
    // Which nodes each process runs: node i alone, or node p of every sim (sim k's node p is
    // node k·per + p), so a 2×2 world is 4 processes, not 16.
    let processes: Vec<Vec<usize>> = if sims == 1 || args.process_per_node {
        (0..total).map(|i| vec![i]).collect()
    } else {
        (0..per).map(|p| (0..sims).map(|k| k * per + p).collect()).collect()
    };
    if sims > 1 {
        println!(
            "{} processes{}",
            processes.len(),
            if args.process_per_node { ", one per node" } else { ", process p running node p of every sim" }
        );
    }
    let mut children: Vec<(String, Child)> = Vec::new();
    let mut printers = Vec::new();
    let board = Arc::new(Board::new(sims, per));
    for nodes in processes {
        let mut cmd = Command::new(&exe);
        cmd.arg("run").arg("--data-dir").arg(dirs[nodes[0]].root());
        // The nodes' logs: warnings and errors, unless RUST_LOG asks for more.
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "warn");
        }
        for &i in &nodes[1..] {
            cmd.arg("--also").arg(dirs[i].root());
        }
        if let Some(t) = args.ticks {
            cmd.arg("--ticks").arg(t.to_string());
        }
        if args.unsafe_no_sync {
            cmd.arg("--unsafe-no-sync");
        }
        if args.test_link_delay_ms > 0 {
            cmd.arg("--test-link-delay-ms").arg(args.test_link_delay_ms.to_string());
            cmd.arg("--test-link-jitter-percent").arg(args.test_link_jitter_percent.to_string());
        }
        let name = if nodes.len() == 1 { format!("node {}", nodes[0]) } else { format!("process {}", nodes[0]) };
        let mut child = cmd.stdout(Stdio::piped()).spawn().with_context(|| format!("starting {name}"))?;
        let out = child.stdout.take().expect("piped");
        let (board, each_node) = (board.clone(), args.each_node);
        printers.push(std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                // A process of several nodes tags each line with its sim: say which node it is.
                let node = line
                    .strip_prefix("[sim ")
                    .and_then(|r| r.split_once("] "))
                    .and_then(|(k, rest)| Some((k.parse::<usize>().ok()?.checked_sub(1)?, rest)))
                    .and_then(|(k, rest)| Some((*nodes.get(k)?, rest)));
                let of_node = node.or_else(|| (nodes.len() == 1).then_some((nodes[0], line.as_str())));
                // A node's status line goes to the board (one line per sim, below).
                if let Some((i, rest)) = of_node
                    && !each_node
                    && let Some(status) = StatusLine::parse(rest)
                {
                    board.note(i, status);
                    continue;
                }
                // What every node says as it starts (its ports, its peer id) is in the lines
                // above; `--each-node` shows it all.
                if !each_node && of_node.is_some_and(|(_, rest)| routine(rest)) {
                    continue;
                }
                match of_node {
                    Some((i, rest)) => println!("[node {i}] {rest}"),
                    None => println!("[process {}] {line}", nodes[0]),
                }
            }
        }));
        children.push((name, child));
    }
    if args.clients > 0 {
        let joins: Vec<metatopia_client::proto::NodeAddr> =
            validators.iter().map(|v| metatopia_client::proto::NodeAddr::at(v.key.clone(), v.address)).collect();
        println!("client bots: {} over QUIC, spread over the nodes (`--clients 0` for none)", args.clients);
        std::thread::spawn(move || client_bots(joins, args.clients));
    }
    {
        let (board, stop) = (board.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(BOARD_EVERY);
                for line in board.lines() {
                    println!("{line}");
                }
            }
        });
        let info = info.clone();
        std::thread::spawn(move || {
            for _ in std::io::stdin().lines().map_while(Result::ok) {
                println!("{info}");
            }
        });
    }
    // Wait for the nodes to finish, or for Ctrl-C (which the terminal also sends them).
    let mut interrupted = false;
    loop {
        if stop.load(Ordering::SeqCst) && !interrupted {
            // Once, and only to those still running (`kill` complained of the others).
            interrupted = true;
            for (_, c) in &mut children {
                if c.try_wait()?.is_none() {
                    interrupt(c);
                }
            }
        }
        let mut running = 0;
        for (i, c) in &mut children {
            match c.try_wait()? {
                Some(status) if !status.success() && !stop.load(Ordering::SeqCst) => {
                    eprintln!("{i} exited with {status}");
                }
                Some(_) => {}
                None => running += 1,
            }
        }
        if running == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for p in printers {
        let _ = p.join();
    }
    for line in board.lines() {
        println!("{line}");
    }
    if stop.load(Ordering::SeqCst) {
        println!("devnet stopped cleanly by Ctrl-C; run it again to resume from {}", args.dir.display());
    } else {
        println!("devnet finished");
    }
    println!("{info}");
    Ok(())
}

/// A node's start-up line the devnet's own lines already cover.
fn routine(line: &str) -> bool {
    const STARTS: [&str; 6] = ["peer id ", "http on ", "clients: QUIC", "neighbour sims:", "a demo sim (", "node "];
    STARTS.iter().any(|s| line.starts_with(s)) && !line.contains("warning") && !line.contains("error")
}

/// How often the devnet prints its sims' status.
const BOARD_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// A node's share of this machine's cores when `nodes` run on it (at least one).
fn share_of_cores(nodes: usize) -> u32 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / nodes.max(1)).clamp(1, 8) as u32
}

/// What a node's status line says (`tick T root R ... validators A of B connected dilation D`).
#[derive(Clone, Debug, PartialEq)]
struct StatusLine {
    tick: u64,
    root: String,
    connected: String,
    dilation: String,
}

impl StatusLine {
    fn parse(line: &str) -> Option<StatusLine> {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() < 4 || w[0] != "tick" || w[2] != "root" {
            return None;
        }
        let after = |word: &str| w.iter().position(|x| *x == word).and_then(|i| w.get(i + 1)).copied();
        let connected = match w.iter().position(|x| *x == "validators") {
            Some(i) if w.len() > i + 3 => format!("{} of {}", w[i + 1], w[i + 3]),
            _ => "?".to_owned(),
        };
        Some(StatusLine {
            tick: w[1].parse().ok()?,
            root: w[3].to_owned(),
            connected,
            dilation: after("dilation").unwrap_or("?").to_owned(),
        })
    }
}

/// The nodes' latest status lines, summed up as one line per sim.
struct Board {
    sims: usize,
    per: usize,
    /// node -> its recent status lines (the newest last; a few, to find a tick all reported).
    lines: std::sync::Mutex<std::collections::BTreeMap<usize, std::collections::VecDeque<StatusLine>>>,
}

impl Board {
    fn new(sims: usize, per: usize) -> Board {
        Board { sims, per, lines: Default::default() }
    }

    fn note(&self, node: usize, s: StatusLine) {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let q = lines.entry(node).or_default();
        q.push_back(s);
        if q.len() > 16 {
            q.pop_front();
        }
    }

    /// For each sim that reported: the newest tick all its reporting nodes printed, how many
    /// agree on its root, and the first node's dilation and validators connected.
    fn lines(&self) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for k in 0..self.sims {
            let nodes: Vec<&std::collections::VecDeque<StatusLine>> =
                (k * self.per..(k + 1) * self.per).filter_map(|i| lines.get(&i)).collect();
            let Some(newest) = nodes.iter().filter_map(|q| q.back()).max_by_key(|s| s.tick) else { continue };
            let common = nodes
                .iter()
                .filter_map(|q| q.back().map(|s| s.tick))
                .min()
                .and_then(|t| nodes[0].iter().rev().map(|s| s.tick).find(|x| *x <= t));
            let agreement = match common {
                Some(t) => {
                    let roots: Vec<&str> =
                        nodes.iter().filter_map(|q| q.iter().find(|s| s.tick == t)).map(|s| s.root.as_str()).collect();
                    let same = roots.iter().filter(|r| **r == roots[0]).count();
                    let root = roots[0].get(..12).unwrap_or(roots[0]);
                    if same == roots.len() {
                        format!("{same} of {} nodes on root {root}… at tick {t}", self.per)
                    } else {
                        format!("NODES DISAGREE at tick {t}: {same} of {} on root {root}…", roots.len())
                    }
                }
                None => "waiting for the nodes".to_owned(),
            };
            out.push(format!(
                "sim {}: tick {}, {agreement}, dilation {}, validators {} connected",
                k + 1,
                newest.tick,
                newest.dilation,
                newest.connected
            ));
        }
        out
    }
}

/// Client bots over QUIC for as long as the devnet runs, a line about them every 30 seconds.
fn client_bots(nodes: Vec<metatopia_client::proto::NodeAddr>, count: usize) {
    use metatopia_client::bots::{BotPlan, BotReport};
    let Ok(rt) = tokio::runtime::Runtime::new() else { return };
    rt.block_on(async move {
        // Let the nodes start listening first.
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let report = Arc::new(BotReport::default());
        let mut first_number = 0;
        for (i, node) in nodes.iter().enumerate() {
            let n = count / nodes.len() + usize::from(i < count % nodes.len());
            if n == 0 {
                continue;
            }
            let plan = BotPlan {
                count: n,
                run_for: std::time::Duration::from_secs(365 * 24 * 3600),
                chat_every: std::time::Duration::from_secs(20),
                seed: 1000 + i as u64,
                // One walk in two heads up to half a sim past the border (into a neighbour sim,
                // where there is one).
                roam_one_in: 2,
                first_number,
                ..BotPlan::default()
            };
            first_number += n;
            tokio::spawn(metatopia_client::bots::run(node.clone(), plan, report.clone()));
        }
        let g = BotReport::get;
        let mut last = (0, 0);
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            let (ticks, bytes) = (g(&report.ticks), g(&report.bytes));
            let n = g(&report.logged_in).max(1);
            println!(
                "[bots] {} of {count} in; per bot {:.1} deltas/s, {:.1} KB/s; {} ticks missed; {} acts executed, {} refused; {} border crossings followed",
                g(&report.logged_in),
                (ticks - last.0) as f64 / 30.0 / n as f64,
                (bytes - last.1) as f64 / 1024.0 / 30.0 / n as f64,
                g(&report.missed_ticks),
                g(&report.executed),
                g(&report.refused),
                g(&report.crossings),
            );
            last = (ticks, bytes);
        }
    });
}

/// Ask a child to stop as Ctrl-C would (SIGINT), so it syncs its log.
fn interrupt(c: &mut Child) {
    let _ = Command::new("kill").arg("-INT").arg(c.id().to_string()).stderr(Stdio::null()).status();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_board_sums_up_the_nodes_status_lines_per_sim() {
        let line = |t: u64, root: &str| {
            StatusLine::parse(&format!(
                "tick {t} root {root} accepted 3 rejected 0 (total 9 / 0) validators 4 of 4 connected dilation 1.00"
            ))
            .unwrap()
        };
        assert_eq!(line(19, "ab").connected, "4 of 4");
        assert_eq!(StatusLine::parse("resynced: from tick 40"), None);
        let board = Board::new(2, 2);
        board.note(0, line(19, "aaaa"));
        board.note(0, line(39, "bbbb"));
        board.note(1, line(19, "aaaa"));
        board.note(2, line(19, "cccc"));
        board.note(3, line(19, "dddd"));
        let lines = board.lines();
        assert_eq!(
            lines[0],
            "sim 1: tick 39, 2 of 2 nodes on root aaaa… at tick 19, dilation 1.00, validators 4 of 4 connected"
        );
        assert!(lines[1].contains("NODES DISAGREE at tick 19: 1 of 2"), "{}", lines[1]);
    }
}
