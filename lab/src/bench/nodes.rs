//! `metatopia-lab bench nodes`: a devnet of real node processes at a tick rate for a while, sampled
//! once a second. Per node: missed ticks (the ticks the rate asked for and the node did not
//! execute), time dilation, commit latency p50/p99 (as the node measures it), CPU and memory.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use metatopia_client::proto::Status;
use metatopia_node::api::http::Client;

#[derive(Debug, clap::Args)]
pub struct NodesArgs {
    /// Validators.
    #[arg(long, default_value_t = 4)]
    nodes: u16,
    /// Tick rate.
    #[arg(long, default_value_t = 60)]
    rate: u32,
    /// How long to measure, after a warm-up of `--warmup` seconds.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Bots' signed events per tick (through node 0). They rez about one object a tick, so the
    /// world grows through the run (the table says by how much).
    #[arg(long, default_value_t = 0)]
    bots: u32,
    /// Client bots over QUIC (they log in, wander and chat: a load that keeps the world's size).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// First port (node i: port + i, its HTTP: port + 1000 + i).
    #[arg(long, default_value_t = 7600)]
    port: u16,
    /// The devnet's data (deleted first).
    #[arg(long, default_value_os_t = std::env::temp_dir().join("metatopia-bench-nodes"))]
    dir: PathBuf,
    /// Nodes send votes without syncing them to disk first (`run --unsafe-no-sync`): run it
    /// alternately with the default to see what durability costs.
    #[arg(long)]
    unsafe_no_sync: bool,
}

/// One node's samples.
#[derive(Debug, Default)]
struct Samples {
    pid: Option<u32>,
    first: Option<(Instant, u64, u64)>, // when, tick, cpu jiffies
    last: Option<(Instant, u64, u64)>,
    /// Objects and scripts in the world at the first and the last sample.
    world: Option<((u64, u64), (u64, u64))>,
    dilation: Vec<f64>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    /// Proposal to commit, microseconds (the node's own measure of its agreement).
    p2c50: Vec<f64>,
    p2c99: Vec<f64>,
    /// An event taken in to its execution, microseconds (the nodes bots submit through).
    in50: Vec<f64>,
    in99: Vec<f64>,
    rss_kib: Vec<u64>,
}

fn proc_stat(pid: u32) -> Option<(u32, u64)> {
    // (ppid, utime + stime) from /proc/PID/stat; the command name may hold spaces: skip past ')'.
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    Some((f.get(1)?.parse().ok()?, f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?))
}

/// A process's resident memory, KiB (`VmRSS` of `/proc/PID/status`).
pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// The devnet's node processes (its children), in start order.
fn node_pids(devnet: u32) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| proc_stat(*pid).is_some_and(|(ppid, _)| ppid == devnet))
        .collect();
    pids.sort();
    pids
}

fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[((s.len() - 1) as f64 * q).round() as usize]
}

struct Devnet(Child);

impl Drop for Devnet {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg("-INT").arg(self.0.id().to_string()).status();
        let _ = self.0.wait();
    }
}

pub fn run(args: NodesArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.seconds >= 5, "--seconds must be at least 5");
    let exe = std::env::current_exe().context("finding this program")?;
    let log = args.dir.with_extension("log");
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    println!(
        "bench nodes: {} node processes at {} Hz, {} bot events a tick, {} client bots; {} s warm-up, {} s measured (devnet output in {})",
        args.nodes,
        args.rate,
        args.bots,
        args.clients,
        args.warmup,
        args.seconds,
        log.display()
    );
    let child = Command::new(exe)
        .args(["devnet", "--single", "--fresh"])
        .arg("--dir")
        .arg(&args.dir)
        .args(["--nodes", &args.nodes.to_string(), "--rate", &args.rate.to_string()])
        .args(["--bots", &args.bots.to_string(), "--clients", &args.clients.to_string()])
        .args(["--port", &args.port.to_string()])
        .args(args.unsafe_no_sync.then_some("--unsafe-no-sync"))
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .spawn()
        .context("starting the devnet")?;
    let devnet = Devnet(child);
    let clients: Vec<Client> =
        (0..args.nodes).map(|i| Client::new(&format!("127.0.0.1:{}", args.port + 1000 + i))).collect();
    let status = |i: usize| clients[i].get::<Status>("/v1/status").ok().flatten();

    let t0 = Instant::now();
    while !(0..clients.len()).all(|i| status(i).is_some_and(|s| s.tick.0 > 0)) {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(120), "the nodes did not start ticking in 2 minutes");
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(args.warmup));
    let pids = node_pids(devnet.0.id());
    anyhow::ensure!(pids.len() == usize::from(args.nodes), "found {} node processes, not {}", pids.len(), args.nodes);
    let mut samples: Vec<Samples> = pids.iter().map(|p| Samples { pid: Some(*p), ..Samples::default() }).collect();
    let bar = indicatif::ProgressBar::new(args.seconds);
    let start = Instant::now();
    let mut next = start;
    while start.elapsed() < Duration::from_secs(args.seconds) {
        next += Duration::from_secs(1);
        for (i, s) in samples.iter_mut().enumerate() {
            let (Some(st), Some(pid)) = (status(i), s.pid) else { continue };
            let cpu = proc_stat(pid).map_or(0, |(_, j)| j);
            let now = (Instant::now(), st.tick.0, cpu);
            s.first.get_or_insert(now);
            s.last = Some(now);
            let size = (st.objects, st.scripts);
            s.world = Some((s.world.map_or(size, |w| w.0), size));
            s.dilation.push(st.dilation);
            s.p50.push(st.commit_latency_p50_ms);
            s.p99.push(st.commit_latency_p99_ms);
            s.p2c50.push(st.proposal_to_commit_p50_us as f64);
            s.p2c99.push(st.proposal_to_commit_p99_us as f64);
            if st.input_to_execution_p50_us > 0 {
                s.in50.push(st.input_to_execution_p50_us as f64);
                s.in99.push(st.input_to_execution_p99_us as f64);
            }
            s.rss_kib.extend(rss_kib(pid));
        }
        bar.set_position(start.elapsed().as_secs().min(args.seconds));
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    bar.finish_and_clear();
    drop(devnet);

    // Jiffies are 1/100 s on Linux (USER_HZ).
    const USER_HZ: f64 = 100.0;
    println!(
        "node  ticks   missed  dilation mean/min  commit p50  p99 (median/worst s)  proposal→commit p50 / p99  input→execution p50 / p99  cpu %  rss MiB (max)"
    );
    for (i, s) in samples.iter().enumerate() {
        let (Some((a, ta, ca)), Some((b, tb, cb))) = (s.first, s.last) else {
            println!("{i:>4}  no samples");
            continue;
        };
        let wall = (b - a).as_secs_f64().max(1e-9);
        let expected = wall * f64::from(args.rate);
        let done = tb - ta;
        let mean = s.dilation.iter().sum::<f64>() / s.dilation.len().max(1) as f64;
        println!(
            "{i:>4}  {done:>6}  {:>6.0}  {mean:>8.3} / {:<6.3}  {:>7.1} ms  {:>6.1} / {:>6.1} ms  {:>9.2} / {:>6.2} ms  {:>9.2} / {:>6.2} ms  {:>5.0}  {:>6.1} ({:.1})",
            (expected - done as f64).max(0.0),
            quantile(&s.dilation, 0.0),
            quantile(&s.p50, 0.5),
            quantile(&s.p99, 0.5),
            quantile(&s.p99, 1.0),
            quantile(&s.p2c50, 0.5) / 1000.0,
            quantile(&s.p2c99, 0.5) / 1000.0,
            quantile(&s.in50, 0.5) / 1000.0,
            quantile(&s.in99, 0.5) / 1000.0,
            (cb - ca) as f64 / USER_HZ / wall * 100.0,
            quantile(&s.rss_kib.iter().map(|k| *k as f64).collect::<Vec<_>>(), 0.5) / 1024.0,
            s.rss_kib.iter().max().copied().unwrap_or(0) as f64 / 1024.0,
        );
    }
    if let Some(((o0, s0), (o1, s1))) = samples.first().and_then(|s| s.world) {
        println!("world: {o0} -> {o1} objects, {s0} -> {s1} scripts");
    }
    Ok(())
}
