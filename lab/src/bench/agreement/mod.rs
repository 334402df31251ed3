//! `metatopia bench agreement`: 4 validators in this process, connected over real loopback TCP
//! (tokio, length-prefixed frames, `TCP_NODELAY`), UDP (`--transport udp`: a socket per
//! validator, frames in pieces when longer than a datagram), or with `--transport libp2p` over the node's
//! own mesh (`node::net`: libp2p, QUIC), committing one tick per period with a load of signed
//! sim events. Reports the commit latency per tick (leader proposes → each validator holds the
//! finalization) and its ratio to the round trip measured on the same connections in the same
//! run. Over TCP the validators placed on a core by default share one thread, which busy-polls
//! their sockets and hands them their inputs in the order they came (`--threads reactor`: see
//! `reactor`); or each validator has its own thread and single-threaded runtime, busy-polling
//! (`--idle spin`: see `frames::busy`) or sleeping between messages (`--idle block`). The report
//! says how much of their time the validator threads were on a core.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use metatopia_consensus::{Config, Digest, Message, Output, SigningKey, Validator, ValidatorIndex, VerifyingKey};
use metatopia_sim::genesis::demo_key;
use metatopia_sim::{Payload, SignedEvent, SimId};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

mod reactor;

#[derive(Debug, clap::Args)]
pub struct AgreementArgs {
    /// Validators (n = 3f+1).
    #[arg(long, default_value_t = 4)]
    validators: u16,
    /// Tick rate.
    #[arg(long, default_value_t = 60)]
    rate_hz: u32,
    /// Ticks to measure (after the warm-up).
    #[arg(long, default_value_t = 600)]
    ticks: u64,
    /// Ticks run before measuring (default: one second's worth).
    #[arg(long)]
    warmup_ticks: Option<u64>,
    /// Signed events submitted per tick.
    #[arg(long, default_value_t = 1_000)]
    events_per_tick: usize,
    /// `tcp`: plain TCP between the validators (the agreement alone); `udp`: a UDP socket per
    /// validator, frames longer than a datagram in pieces (on the reactor only); `libp2p`: the
    /// node's mesh (QUIC, encrypted, multiplexed), what real nodes use.
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "udp", "libp2p"])]
    transport: String,
    /// Leaders send full proposals (every event's bytes) instead of compact ones (the events'
    /// ids; the events were disseminated before): for comparison.
    #[arg(long)]
    full_proposals: bool,
    /// Each validator's share of a tick's events arrives in this many batches spread over the
    /// period (1: all at once, a burst at every period, the harsher case).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    load_batches: u32,
    /// Where in each period a tick's events arrive (with `--load-batches 1`): `random`, at a
    /// point drawn afresh for each tick (seeded: the same points every run), so that one run
    /// covers every phase against the leaders' proposals; or `fixed`, at the same point of
    /// every period, which falls wherever the run's start puts it against the proposals (the
    /// median moved by ±0.3 ms from run to run with it).
    #[arg(long, default_value = "random", value_parser = ["random", "fixed"])]
    load_phase: String,
    /// Print what every validator handled, and when, from this many ticks' proposals to their
    /// finalization (ticks spread over the run): where the commit latency goes.
    #[arg(long, default_value_t = 0)]
    timeline: usize,
    /// Leave the validator threads wherever the OS schedules them, instead of pinning each to
    /// a core (the validators shared out over the cores in order: with 4 on 2 cores, 0 and 1
    /// on the first, 2 and 3 on the second). TCP transport only.
    #[arg(long)]
    no_pin: bool,
    /// What a validator's thread does with nothing to handle: `spin`, poll its links and
    /// timers without sleeping, yielding its core to any other thread that wants it at every
    /// turn (a busy-polling runtime, for machines whose cores are their validator's: it uses
    /// them whole); `block`, sleep until a message or timer wakes it (the wake-up of an idle
    /// core is then paid on every hop of the commit). The round trip is measured the same way.
    /// TCP transport only.
    #[arg(long, value_enum, default_value_t = Idle::Spin)]
    idle: Idle,
    /// `reactor` (the default with `--idle spin`): one thread to a core, running the
    /// validators placed there on one event loop that polls their sockets at every turn and
    /// hands them their inputs in the order they arrived; `validator` (the default with
    /// `--idle block`): each validator on a thread of its own with its own runtime (two
    /// threads to a core, shared by the OS's scheduler); `core`: one thread to a core, running
    /// the validators placed there as tasks of its runtime, which take turns input by input.
    /// TCP transport only.
    #[arg(long, value_enum)]
    threads: Option<Threads>,
}

impl AgreementArgs {
    /// `--threads`, or its default.
    fn threads(&self) -> Threads {
        self.threads.unwrap_or(if self.idle == Idle::Spin { Threads::Reactor } else { Threads::Validator })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Threads {
    Validator,
    Core,
    Reactor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Idle {
    Spin,
    Block,
}

use metatopia_node::net::frames::{MAX_FRAME, busy, read_frame, write_frames};

type Frame = Arc<Vec<u8>>;

struct Shared {
    start: Instant,
    /// Each proposal, by the block's digest: when its leader sent it, and which validator that was.
    proposed: Mutex<BTreeMap<Digest, (Duration, u16)>>,
    /// (validator, digest) -> when it learned of the finalization.
    finalized: Mutex<Vec<(u16, Digest, Duration)>>,
    committed: Mutex<Vec<(u16, u64, Duration, usize)>>,
    /// Time spent handling each kind of input: (count, total, max).
    handling: Mutex<BTreeMap<&'static str, (u64, Duration, Duration)>>,
    /// Bytes sent by all validators, per kind of message: (frames, bytes).
    sent: Mutex<BTreeMap<&'static str, (u64, u64)>>,
    /// Every input handled: (validator, start, end, kind), for `--timeline`.
    inputs: Mutex<Vec<(u16, Duration, Duration, &'static str)>>,
    /// Each validator thread's CPU time and wall time, from its start to its end.
    cpu: Mutex<Vec<(Duration, Duration)>>,
    /// (validator, digest) -> when it sent its finalize vote (queued it for its peers).
    finalize_sent: Mutex<Vec<(u16, Digest, Duration)>>,
    /// The core each validator is pinned to (empty when not pinned).
    cores: Mutex<Vec<usize>>,
}

pub fn run(args: AgreementArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.validators >= 4, "--validators must be at least 4");
    anyhow::ensure!(
        args.threads() != Threads::Reactor || args.idle == Idle::Spin,
        "--threads reactor busy-polls its sockets: it takes --idle spin only"
    );
    anyhow::ensure!(
        args.transport != "udp" || args.threads() == Threads::Reactor,
        "--transport udp runs on the reactor: it takes --threads reactor (the default) and --idle spin"
    );
    bench(args)
}

fn bench(args: AgreementArgs) -> anyhow::Result<()> {
    let n = args.validators;
    let keys: Vec<SigningKey> = (0..n).map(|i| demo_key(777, u64::from(i))).collect();
    let vks: Vec<VerifyingKey> = keys.iter().map(|k| k.verifying_key()).collect();
    let total_ticks = args.ticks + warmup_ticks(&args) + 5;
    println!(
        "bench agreement: {n} validators on loopback ({}), {} Hz, {} signed events per tick ({}), {} ticks measured, {} proposals",
        match args.transport.as_str() {
            "libp2p" => "the node's libp2p mesh",
            "udp" => "UDP",
            _ => "plain TCP",
        },
        args.rate_hz,
        args.events_per_tick,
        match (args.load_batches, args.load_phase.as_str()) {
            (1, "random") => "at once, at a random point of each period".to_string(),
            (1, _) => "at once, at the same point of each period".to_string(),
            (b, _) => format!("in {b} batches over each period"),
        },
        args.ticks,
        if args.full_proposals { "full" } else { "compact" }
    );
    print!("signing {} events ... ", total_ticks as usize * args.events_per_tick);
    let events = sign_events(total_ticks as usize * args.events_per_tick);
    println!("done ({} bytes each)", events.first().map_or(0, Vec::len));

    if args.transport == "libp2p" {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().worker_threads(2).build()?;
        return rt.block_on(bench_libp2p(args, keys, vks, events, total_ticks));
    }
    let (mut setups, rtt) = if args.transport == "udp" { udp_links(n)? } else { tcp_links(n, &args)? };

    let shared = new_shared();
    let cfg = config_for(&args);
    let period_us = cfg.period_us;
    // The validators placed on a core share its one thread: by default an event loop of their
    // sockets (`reactor`), with `--threads core` a single-threaded runtime. With `--threads
    // validator` each runs on its own thread with its own single-threaded runtime, its readers
    // and writers local to it (on a shared work-stealing pool, a message waited behind other
    // validators' tasks: 60-250 µs a hop under load). Two busy-polling threads on one core
    // took turns as the OS's scheduler chose, and a vote that came for one of them waited
    // while the other handled whatever it had (commit p50 ~0.06 ms higher than the reactor's,
    // and p99 0.1-0.3 ms: README).
    let mut inboxes = Vec::new();
    let mut event_txs = Vec::new();
    let mut threads = Vec::new();
    for _ in 0..n {
        let (etx, erx) = mpsc::unbounded_channel::<Vec<Vec<u8>>>();
        event_txs.push(etx);
        inboxes.push(Some(erx));
    }
    let cores = if args.no_pin { Vec::new() } else { allowed_cores() };
    // Validator i goes to slot i * slots / n (with 4 on 2 cores, 0 and 1 on the first): the
    // core it is pinned to, and with `--threads core` the thread it shares.
    let slots =
        if cores.is_empty() { std::thread::available_parallelism().map_or(1, usize::from) } else { cores.len() };
    let slot_of = |i: u16| usize::from(i) * slots / usize::from(n);
    if !cores.is_empty() {
        *shared.cores.lock().expect("not poisoned") = (0..n).map(|i| cores[slot_of(i)]).collect();
        let placed: Vec<String> = (0..n).map(|i| format!("v{i} -> core {}", cores[slot_of(i)])).collect();
        println!(
            "validator threads pinned: {} ({})",
            placed.join(", "),
            match args.threads() {
                Threads::Validator => "a thread per validator",
                Threads::Core => "a thread per core, shared by its validators",
                Threads::Reactor => "a thread per core, its validators on one event loop",
            }
        );
    }
    // The validators each thread runs, and the core it is pinned to.
    let mut groups: BTreeMap<usize, (Option<usize>, Vec<u16>)> = BTreeMap::new();
    for i in 0..n {
        let key = if args.threads() == Threads::Validator { usize::from(i) } else { slot_of(i) };
        groups.entry(key).or_insert((cores.get(slot_of(i)).copied(), Vec::new())).1.push(i);
    }
    for (core, members) in groups.into_values() {
        let mut bundles = Vec::new();
        for &i in &members {
            let evs = inboxes[i as usize].take().expect("once");
            let links = setups.remove(&i).context("a validator's links, once")?;
            // Each validator verifies signatures itself (its own cache), as separate machines would.
            let own = Config { sig_cache: Default::default(), ..cfg.clone() };
            let v = Validator::new(own, keys[i as usize].clone(), vks.clone(), 0);
            bundles.push((i, v, links, evs));
        }
        let shared = shared.clone();
        let (idle, threads_kind) = (args.idle, args.threads());
        let name = members.iter().map(|i| format!("-{i}")).collect::<String>();
        threads.push(std::thread::Builder::new().name(format!("validator{name}")).spawn(
            move || -> anyhow::Result<()> {
                if let Some(core) = core {
                    pin_to(core);
                }
                let (wall, cpu) = (Instant::now(), thread_cpu());
                let sh = shared.clone();
                if threads_kind == Threads::Reactor {
                    let members = bundles
                        .into_iter()
                        .map(|(_, v, net, events)| reactor::Member {
                            driver: Driver::new(v, shared.clone(), total_ticks, Links::Tcp(idle)),
                            net,
                            events,
                        })
                        .collect();
                    reactor::run(members, &shared)?;
                } else {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    rt.block_on(async move {
                        let runs = bundles.into_iter().map(|(i, v, links, evs)| {
                            run_validator(i, v, links, evs, shared.clone(), total_ticks, idle)
                        });
                        futures::future::try_join_all(runs).await
                    })?;
                }
                sh.cpu.lock().expect("not poisoned").push((thread_cpu().saturating_sub(cpu), wall.elapsed()));
                Ok(())
            },
        )?);
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(load(&args, event_txs, events, period_us, total_ticks));
    for t in threads {
        match t.join() {
            Ok(r) => r?,
            Err(_) => anyhow::bail!("a validator thread panicked"),
        }
    }
    report(&shared, &args, rtt);
    Ok(())
}

/// One validator on the calling thread's runtime: a reader and a writer task for each link, and
/// its loop.
async fn run_validator(
    i: u16,
    v: Validator,
    links: reactor::Setup,
    evs: mpsc::UnboundedReceiver<Vec<Vec<u8>>>,
    shared: Arc<Shared>,
    total_ticks: u64,
    idle: Idle,
) -> anyhow::Result<()> {
    let reactor::Setup::Tcp(links) = links else { anyhow::bail!("a validator on a runtime takes TCP links") };
    let (tx, inbox) = Inbox::new();
    let mut peers = BTreeMap::new();
    for (peer, stream) in links {
        let (r, w) = TcpStream::from_std(stream)?.into_split();
        // Buffered: a burst of frames (a vote, a certificate) is one read.
        let mut r = tokio::io::BufReader::with_capacity(1 << 16, r);
        let inbox = tx.clone();
        let sh = shared.clone();
        tokio::spawn(async move {
            while let Ok(frame) = read_frame(&mut r).await {
                let read = sh.start.elapsed();
                match Message::decode(&frame, MAX_FRAME as usize) {
                    Ok(m) => {
                        if m.kind() == "propose" {
                            // (For `--timeline`: the proposal read and decoded.)
                            let decoded = sh.start.elapsed();
                            sh.inputs.lock().expect("not poisoned").push((i, read, decoded, "read"));
                        }
                        if !inbox.send(ValidatorIndex(peer), m) {
                            break;
                        }
                    }
                    Err(e) => tracing::warn!(peer, "dropping a bad frame: {e}"),
                }
            }
        });
        let (wtx, wrx) = mpsc::unbounded_channel::<Frame>();
        peers.insert(peer, wtx);
        tokio::spawn(write_frames(w, wrx));
    }
    validator_loop(v, inbox, evs, peers, shared, total_ticks, Links::Tcp(idle)).await;
    Ok(())
}

/// Every pair of validators connected once over loopback TCP (each validator's end towards each
/// peer), and the round trip between two validators as they will run, printed.
fn tcp_links(n: u16, args: &AgreementArgs) -> anyhow::Result<(BTreeMap<u16, reactor::Setup>, Duration)> {
    // Full mesh: listeners first, then every pair connects once.
    let mut listeners = Vec::new();
    for _ in 0..n {
        listeners.push(std::net::TcpListener::bind("127.0.0.1:0")?);
    }
    let addrs: Vec<_> = listeners.iter().map(|l| l.local_addr()).collect::<Result<_, _>>()?;
    let mut streams: BTreeMap<(u16, u16), std::net::TcpStream> = BTreeMap::new();
    for (i, listener) in listeners.iter().enumerate() {
        for j in (i + 1)..n as usize {
            let out = std::net::TcpStream::connect(addrs[i])?;
            let (inc, _) = listener.accept()?;
            for s in [&out, &inc] {
                s.set_nodelay(true)?;
                // Room for a whole proposal in the send buffer (the default, 16 KiB, split a
                // 32 KiB compact proposal into writes that waited for the reader's thread).
                socket2::SockRef::from(s).set_send_buffer_size(1 << 20)?;
            }
            streams.insert((j as u16, i as u16), out); // j's end towards i
            streams.insert((i as u16, j as u16), inc); // i's end towards j
        }
    }
    let raw_rtt = measure_rtt(&mut streams)?;
    let reactor = args.threads() == Threads::Reactor;
    let rtt = if reactor {
        let a = streams.remove(&(0, 1)).context("stream")?;
        let b = streams.remove(&(1, 0)).context("stream")?;
        let (rtt, a, b) =
            reactor::round_trip((0, reactor::Setup::Tcp(vec![(1, a)])), (1, reactor::Setup::Tcp(vec![(0, b)])), 400)?;
        for (me, setup) in [(0, a), (1, b)] {
            if let reactor::Setup::Tcp(links) = setup {
                for (peer, s) in links {
                    streams.insert((me, peer), s);
                }
            }
        }
        rtt
    } else {
        measure_rtt_runtimes(&mut streams, args.idle)?
    };
    println!(
        "loopback round trip (64-byte frame there and back over the same TCP connections): p50 {:.1} µs between \
         two validators' {} (the path a vote takes; {}), {:.1} µs between blocking sockets",
        rtt.as_secs_f64() * 1e6,
        if reactor { "event loops" } else { "runtimes" },
        match args.idle {
            Idle::Spin => "busy-polling, as the validators here",
            Idle::Block => "sleeping until woken, as the validators here",
        },
        raw_rtt.as_secs_f64() * 1e6
    );
    let mut by_validator: BTreeMap<u16, Vec<(u16, std::net::TcpStream)>> = BTreeMap::new();
    for ((me, peer), stream) in streams {
        stream.set_nonblocking(true)?;
        by_validator.entry(me).or_default().push((peer, stream));
    }
    Ok((by_validator.into_iter().map(|(me, links)| (me, reactor::Setup::Tcp(links))).collect(), rtt))
}

/// A loopback UDP socket for each validator, with every peer's address, and the round trip
/// between two validators' event loops, printed.
fn udp_links(n: u16) -> anyhow::Result<(BTreeMap<u16, reactor::Setup>, Duration)> {
    let mut sockets = Vec::new();
    for _ in 0..n {
        let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
        // Room for a burst: every peer's share of a tick's events at once (the default, 208 KiB,
        // held three of them; what does not fit is lost, and asked for again by the protocol).
        let sock = socket2::SockRef::from(&s);
        sock.set_recv_buffer_size(8 << 20)?;
        sock.set_send_buffer_size(8 << 20)?;
        sockets.push(Some(s));
    }
    let addrs: Vec<std::net::SocketAddr> =
        sockets.iter().flatten().map(|s| s.local_addr()).collect::<Result<_, _>>()?;
    let peers_of = |i: u16, only: Option<u16>| -> BTreeMap<u16, std::net::SocketAddr> {
        (0..n).filter(|&j| j != i && only.is_none_or(|o| o == j)).map(|j| (j, addrs[usize::from(j)])).collect()
    };
    let a = sockets[0].take().context("socket")?;
    let b = sockets[1].take().context("socket")?;
    let (rtt, a, b) = reactor::round_trip(
        (0, reactor::Setup::Udp(a, peers_of(0, Some(1)))),
        (1, reactor::Setup::Udp(b, peers_of(1, Some(0)))),
        400,
    )?;
    for (i, setup) in [(0, a), (1, b)] {
        if let reactor::Setup::Udp(s, _) = setup {
            sockets[i] = Some(s);
        }
    }
    let rcvbuf = socket2::SockRef::from(sockets[0].as_ref().context("socket")?).recv_buffer_size()?;
    println!(
        "loopback round trip (64-byte datagram there and back between the same UDP sockets): p50 {:.1} µs between \
         two validators' event loops (the path a vote takes; busy-polling, as the validators here); receive \
         buffers {} KiB",
        rtt.as_secs_f64() * 1e6,
        rcvbuf / 1024
    );
    let mut setups = BTreeMap::new();
    for (i, s) in sockets.into_iter().enumerate() {
        let i = i as u16;
        setups.insert(i, reactor::Setup::Udp(s.context("socket")?, peers_of(i, None)));
    }
    Ok((setups, rtt))
}

/// CPU time of the calling thread so far (zero where the OS does not tell).
fn thread_cpu() -> Duration {
    #[cfg(target_os = "linux")]
    {
        use nix::sys::resource::{UsageWho, getrusage};
        if let Ok(u) = getrusage(UsageWho::RUSAGE_THREAD) {
            let t = |v: nix::sys::time::TimeVal| Duration::new(v.tv_sec() as u64, v.tv_usec() as u32 * 1_000);
            return t(u.user_time()) + t(u.system_time());
        }
    }
    Duration::ZERO
}

/// The cores this process may run on (empty where that is unknown: nothing is pinned).
fn allowed_cores() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        use nix::sched::{CpuSet, sched_getaffinity};
        if let Ok(set) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
            return (0..CpuSet::count()).filter(|c| set.is_set(*c).unwrap_or(false)).collect();
        }
    }
    Vec::new()
}

/// Pin the calling thread to one core. A validator's thread stands for its machine: pinned,
/// the OS does not move it, nor wake it on the core another validator is busy on (with the
/// threads free, p99 at 1,000 events a tick was ~0.3 ms higher here).
fn pin_to(core: usize) {
    #[cfg(target_os = "linux")]
    {
        use nix::sched::{CpuSet, sched_setaffinity};
        let mut set = CpuSet::new();
        if let Err(e) = set.set(core).and_then(|()| sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)) {
            tracing::warn!(core, "could not pin a validator thread: {e}");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = core;
}

/// Ticks before the measured ones.
fn warmup_ticks(args: &AgreementArgs) -> u64 {
    args.warmup_ticks.unwrap_or(u64::from(args.rate_hz))
}

fn config_for(args: &AgreementArgs) -> Config {
    Config {
        period_us: 1_000_000 / u64::from(args.rate_hz),
        leader_timeout_us: 200_000,
        notarize_timeout_us: 400_000,
        retry_us: 200_000,
        max_batch_events: args.events_per_tick * 2,
        compact_proposals: !args.full_proposals,
        ..Config::default()
    }
}

fn new_shared() -> Arc<Shared> {
    Arc::new(Shared {
        start: Instant::now(),
        proposed: Mutex::new(BTreeMap::new()),
        finalized: Mutex::new(Vec::new()),
        committed: Mutex::new(Vec::new()),
        handling: Mutex::new(BTreeMap::new()),
        sent: Mutex::new(BTreeMap::new()),
        inputs: Mutex::new(Vec::new()),
        cpu: Mutex::new(Vec::new()),
        finalize_sent: Mutex::new(Vec::new()),
        cores: Mutex::new(Vec::new()),
    })
}

/// The same bench over the node's libp2p mesh: each validator has its own swarm (QUIC on
/// loopback), and consensus messages travel as `NodeMsg::Consensus` frames, as between nodes.
async fn bench_libp2p(
    args: AgreementArgs,
    keys: Vec<SigningKey>,
    vks: Vec<VerifyingKey>,
    events: Vec<Vec<u8>>,
    total_ticks: u64,
) -> anyhow::Result<()> {
    use metatopia_node::net::wire::NodeMsg;
    use metatopia_node::net::{Mesh, MeshEvent, PeerAddr, free_udp_ports};
    let n = usize::from(args.validators);
    let tcp: Vec<std::net::SocketAddr> = {
        // Free ports: bound, read and let go.
        let ls: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
        ls.iter().map(|l| l.local_addr()).collect::<Result<_, _>>()?
    };
    let udp: Vec<std::net::SocketAddr> =
        free_udp_ports(n)?.into_iter().map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p))).collect();
    let peers: Vec<PeerAddr> =
        (0..n).map(|i| PeerAddr { key: vks[i], tcp: Some(tcp[i]), quic: Some(udp[i]) }).collect();
    let mut meshes = Vec::new();
    for i in 0..n {
        meshes.push(Mesh::start(&keys[i], tcp[i], Some(udp[i]), peers.clone()).await?);
    }
    let t0 = Instant::now();
    while meshes.iter().any(|(m, _)| m.connected() < n - 1) {
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(30), "the meshes did not connect within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let via: Vec<&str> = meshes[0].0.transports().values().copied().collect();
    // Round trip: a 64-byte message there and back, validator 0 and each other in turn.
    let mut samples = Vec::new();
    let ping = NodeMsg::Snapshot { tick: 0, bytes: vec![7; 64] };
    for j in 1..n {
        for _ in 0..200 {
            let t = Instant::now();
            meshes[0].0.send(j as u16, &ping);
            loop {
                if let Some(MeshEvent::Message(_, m)) = meshes[j].1.recv().await {
                    meshes[j].0.send(0, &m);
                    break;
                }
            }
            loop {
                if let Some(MeshEvent::Message(..)) = meshes[0].1.recv().await {
                    break;
                }
            }
            samples.push(t.elapsed());
        }
    }
    samples.sort();
    let rtt = samples[samples.len() / 2];
    println!(
        "libp2p round trip (64-byte message there and back over the mesh, via {via:?}): p50 {:.1} µs",
        rtt.as_secs_f64() * 1e6
    );
    let shared = new_shared();
    let cfg = config_for(&args);
    let mut tasks = Vec::new();
    let mut etx = Vec::new();
    for (i, (mesh, mut rx)) in meshes.into_iter().enumerate() {
        let (tx, inbox) = Inbox::new();
        tasks.push(tokio::spawn(async move {
            while let Some(e) = rx.recv().await {
                if let MeshEvent::Message(from, NodeMsg::Consensus { msg, .. }) = e
                    && !tx.send(from, msg)
                {
                    return;
                }
            }
        }));
        let mut writers = BTreeMap::new();
        for j in (0..n as u16).filter(|j| usize::from(*j) != i) {
            let (wtx, mut wrx) = mpsc::unbounded_channel::<Frame>();
            let mesh = mesh.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(f) = wrx.recv().await {
                    mesh.send_frame(j, f);
                }
            }));
            writers.insert(j, wtx);
        }
        let (e, erx) = mpsc::unbounded_channel::<Vec<Vec<u8>>>();
        etx.push(e);
        let own = Config { sig_cache: Default::default(), ..cfg.clone() };
        let v = Validator::new(own, keys[i].clone(), vks.clone(), 0);
        tasks.push(tokio::spawn(validator_loop(v, inbox, erx, writers, shared.clone(), total_ticks, Links::Mesh)));
        // (The mesh lives as long as its writer tasks hold it.)
        drop(mesh);
    }
    load(&args, etx, events, cfg.period_us, total_ticks).await;
    report(&shared, &args, rtt);
    for t in tasks {
        t.abort();
    }
    Ok(())
}

/// Load: events_per_tick per period, spread round-robin over the validators.
async fn load(
    args: &AgreementArgs,
    etx: Vec<mpsc::UnboundedSender<Vec<Vec<u8>>>>,
    events: Vec<Vec<u8>>,
    period_us: u64,
    total_ticks: u64,
) {
    let parts = args.load_batches as usize;
    let step = Duration::from_micros(period_us) / args.load_batches;
    let mut next = Instant::now();
    let mut events = events.into_iter();
    let random = parts == 1 && args.load_phase == "random";
    // xorshift64*, seeded: the same phases every run.
    let mut rng = 0x9E37_79B9_7F4A_7C15_u64;
    let mut draw = move |below: u64| {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % below.max(1)
    };
    for _ in 0..total_ticks {
        let period_start = next;
        if random {
            next = period_start + Duration::from_micros(draw(period_us));
            tokio::time::sleep_until(next.into()).await;
        }
        // Each validator receives its share of the tick's events, as clients would send them,
        // in `parts` batches over the period.
        for part in 0..parts {
            for (i, tx) in etx.iter().enumerate() {
                let share = args.events_per_tick / etx.len() + usize::from(i < args.events_per_tick % etx.len());
                let size = share / parts + usize::from(part < share % parts);
                let batch: Vec<Vec<u8>> = events.by_ref().take(size).collect();
                let _ = tx.send(batch);
            }
            next = if random { period_start + step } else { next + step };
            tokio::time::sleep_until(next.into()).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Peers' messages in two queues: votes, proposals and certificates first, then gossiped
/// client events (a proposal queued behind a few hundred events waited 50-150 µs).
type Inboxes = (mpsc::UnboundedReceiver<(ValidatorIndex, Message)>, mpsc::UnboundedReceiver<(ValidatorIndex, Message)>);

/// The sending half of [`Inboxes`]: routes a peer's message to its queue.
#[derive(Clone)]
struct Inbox {
    first: mpsc::UnboundedSender<(ValidatorIndex, Message)>,
    gossip: mpsc::UnboundedSender<(ValidatorIndex, Message)>,
}

impl Inbox {
    fn new() -> (Inbox, Inboxes) {
        let (first, a) = mpsc::unbounded_channel();
        let (gossip, b) = mpsc::unbounded_channel();
        (Inbox { first, gossip }, (a, b))
    }

    /// `false` once the validator is gone.
    fn send(&self, from: ValidatorIndex, m: Message) -> bool {
        let queue = if matches!(m, Message::Events(_)) { &self.gossip } else { &self.first };
        queue.send((from, m)).is_ok()
    }
}

/// What a validator's links are: plain TCP, its thread busy-polling them or not; or the node's
/// mesh, whose frames are `NodeMsg::Consensus` rather than bare messages.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Links {
    Tcp(Idle),
    Mesh,
}

/// An input for a validator.
enum Input {
    Message(ValidatorIndex, Box<Message>),
    Events(Vec<Vec<u8>>),
    Timeout,
}

/// A validator and what the bench records of it, whatever runs it (a task of its own, or a
/// core's reactor): it handles one input at a time and hands each frame it sends to the caller.
struct Driver {
    v: Validator,
    shared: Arc<Shared>,
    me: u16,
    /// How many peers a broadcast goes to.
    peers: usize,
    until_tick: u64,
    mesh: bool,
}

impl Driver {
    fn new(v: Validator, shared: Arc<Shared>, until_tick: u64, links: Links) -> Driver {
        let me = v.index().expect("every bench node is a validator").0;
        let peers = v.keys().len().saturating_sub(1);
        Driver { v, shared, me, peers, until_tick, mesh: links == Links::Mesh }
    }

    fn micros(&self) -> u64 {
        self.shared.start.elapsed().as_micros() as u64
    }

    /// When the validator next wants a timeout input (µs on the bench's clock), if ever.
    fn deadline(&self) -> Option<u64> {
        self.v.poll_timeout()
    }

    fn encode(&self, m: Message) -> Frame {
        if self.mesh {
            Arc::new(metatopia_node::net::wire::NodeMsg::Consensus { epoch: 0, msg: m }.encode())
        } else {
            Arc::new(m.encode())
        }
    }

    /// Handle `input`, timing and recording it, then pass each frame the validator sends to
    /// `send` (for one peer, or for all with `None`). `false` once it has committed its last tick.
    fn step(&mut self, input: Input, send: &mut impl FnMut(Option<u16>, &Frame)) -> bool {
        let (me, shared) = (self.me, self.shared.clone());
        // Only the handling is timed (not the wait for the input).
        let t0 = Instant::now();
        let started = shared.start.elapsed();
        let kind = match input {
            Input::Message(from, msg) => {
                let kind = msg.kind();
                self.v.handle_message(self.micros(), from, *msg);
                kind
            }
            Input::Events(batch) => {
                self.v.submit_events(self.micros(), batch);
                "submit"
            }
            Input::Timeout => {
                self.v.handle_timeout(self.micros());
                "timeout"
            }
        };
        let took = t0.elapsed();
        shared.inputs.lock().expect("not poisoned").push((me, started, started + took, kind));
        {
            let mut h = shared.handling.lock().expect("not poisoned");
            let e = h.entry(kind).or_insert((0, Duration::ZERO, Duration::ZERO));
            e.0 += 1;
            e.1 += took;
            e.2 = e.2.max(took);
        }
        let count = |kind: &'static str, frames: usize, len: usize| {
            let mut sent = shared.sent.lock().expect("not poisoned");
            let e = sent.entry(kind).or_insert((0, 0));
            e.0 += frames as u64;
            e.1 += (frames * len) as u64;
        };
        let sending = shared.start.elapsed();
        let mut proposing = false;
        let mut more = true;
        while let Some(o) = self.v.poll_output() {
            let at = shared.start.elapsed();
            proposing |= matches!(&o, Output::Broadcast(m) if m.kind() == "propose");
            match o {
                Output::Broadcast(m) => {
                    if let Some(vote) = m.vote().filter(|_| m.kind() == "propose") {
                        // The leader's own notarize vote names the block's digest.
                        shared.proposed.lock().expect("not poisoned").insert(vote.digest, (at, vote.signer.0));
                    }
                    let kind = m.kind();
                    if let Some(vote) = m.vote().filter(|_| matches!(kind, "notarize" | "finalize")) {
                        // (For `--timeline`, and for finding the vote that finalizes.)
                        let sent = if kind == "finalize" { "finalize sent" } else { "notarize sent" };
                        shared.inputs.lock().expect("not poisoned").push((me, at, at, sent));
                        if kind == "finalize" {
                            shared.finalize_sent.lock().expect("not poisoned").push((me, vote.digest, at));
                        }
                    }
                    let frame = self.encode(m);
                    count(kind, self.peers, frame.len());
                    send(None, &frame);
                }
                Output::Send(to, m) => {
                    if let Some(vote) = m.vote().filter(|_| m.kind() == "propose") {
                        // (Full to some peers, compact to others: one proposal.)
                        shared.proposed.lock().expect("not poisoned").entry(vote.digest).or_insert((at, vote.signer.0));
                    }
                    let kind = m.kind();
                    let frame = self.encode(m);
                    count(kind, 1, frame.len());
                    send(Some(to.0), &frame);
                }
                Output::Finalized { digest, .. } => {
                    shared.finalized.lock().expect("not poisoned").push((me, digest, at))
                }
                Output::Committed(c) => {
                    shared.committed.lock().expect("not poisoned").push((me, c.block.tick, at, c.block.events.len()));
                    if c.block.tick >= self.until_tick {
                        more = false;
                        break;
                    }
                }
                Output::RootMismatch { .. } | Output::Evidence(_) => {}
            }
        }
        if proposing {
            // (For `--timeline`: the leader encoding and queueing its proposal.)
            shared.inputs.lock().expect("not poisoned").push((me, sending, shared.start.elapsed(), "send"));
        }
        more
    }
}

async fn validator_loop(
    v: Validator,
    (mut inbox, mut gossip): Inboxes,
    mut events: mpsc::UnboundedReceiver<Vec<Vec<u8>>>,
    peers: BTreeMap<u16, mpsc::UnboundedSender<Frame>>,
    shared: Arc<Shared>,
    until_tick: u64,
    links: Links,
) {
    let spin = links == Links::Tcp(Idle::Spin);
    let mut d = Driver::new(v, shared, until_tick, links);
    let mut send = |to: Option<u16>, frame: &Frame| match to {
        None => {
            for tx in peers.values() {
                let _ = tx.send(frame.clone());
            }
        }
        Some(to) => {
            if let Some(tx) = peers.get(&to) {
                let _ = tx.send(frame.clone());
            }
        }
    };
    loop {
        let deadline = d.deadline().unwrap_or(u64::MAX);
        let wait = Duration::from_micros(deadline.saturating_sub(d.micros()));
        let input = busy(
            async {
                tokio::select! {
                    biased;
                    m = inbox.recv() => m.map(|(from, msg)| Input::Message(from, Box::new(msg))),
                    m = gossip.recv() => m.map(|(from, msg)| Input::Message(from, Box::new(msg))),
                    e = events.recv() => e.map(Input::Events),
                    // (A timer due now fires now: tokio's timers round up to the next millisecond.)
                    _ = tokio::time::sleep(wait), if !wait.is_zero() => Some(Input::Timeout),
                    _ = tokio::task::yield_now(), if wait.is_zero() => Some(Input::Timeout),
                }
            },
            spin,
        )
        .await;
        let Some(input) = input else { return };
        if !d.step(input, &mut send) {
            return;
        }
        // Let the writers send what was just queued before the next input is handled (they
        // are tasks of this thread: a proposal otherwise waited behind queued events).
        tokio::task::yield_now().await;
    }
}

fn report(shared: &Shared, args: &AgreementArgs, rtt: Duration) {
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
    println!(
        "ratio to the loopback round trip: p50 {:.1}x, p99 {:.1}x (targets: p50 <= 0.5 ms, p99 <= 2 ms at {} Hz with {} events/tick)",
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

fn sign_events(count: usize) -> Vec<Vec<u8>> {
    let keys: Vec<SigningKey> = (0..64).map(|i| demo_key(4242, i)).collect();
    let chunk = count.div_ceil(2).max(1);
    let parts: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..count)
            .collect::<Vec<_>>()
            .chunks(chunk)
            .map(|c| {
                let keys = &keys;
                let c = c.to_vec();
                s.spawn(move || {
                    c.into_iter()
                        .map(|i| {
                            let k = &keys[i % keys.len()];
                            let payload = Payload::Chat {
                                channel: 0,
                                range: metatopia_sim::ChatRange::Say,
                                text: format!("load {i}"),
                            };
                            metatopia_sim::codec::encode(&SignedEvent::new(
                                k,
                                SimId(1),
                                (i / keys.len()) as u64 + 1,
                                payload,
                            ))
                        })
                        .collect()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("signing thread")).collect()
    });
    parts.into_iter().flatten().collect()
}

/// Median round trip of a 64-byte frame over each connection (pairs in turn), blocking.
fn measure_rtt(streams: &mut BTreeMap<(u16, u16), std::net::TcpStream>) -> anyhow::Result<Duration> {
    use std::io::{Read, Write};
    let pairs: Vec<(u16, u16)> = streams.keys().copied().filter(|(a, b)| a < b).collect();
    let mut samples = Vec::new();
    let mut frame = [7u8; 68];
    frame[..4].copy_from_slice(&64u32.to_le_bytes());
    let mut got = [0u8; 68];
    for (a, b) in pairs {
        for _ in 0..200 {
            let t = Instant::now();
            streams.get_mut(&(a, b)).context("stream")?.write_all(&frame)?;
            streams.get_mut(&(b, a)).context("stream")?.read_exact(&mut got)?;
            streams.get_mut(&(b, a)).context("stream")?.write_all(&got)?;
            streams.get_mut(&(a, b)).context("stream")?.read_exact(&mut got)?;
            samples.push(t.elapsed());
        }
    }
    samples.sort();
    Ok(samples[samples.len() / 2])
}

/// Median round trip of a 64-byte frame between two single-threaded runtimes on their own
/// threads (validators 0 and 1), through the same framing the validators use.
fn measure_rtt_runtimes(
    streams: &mut BTreeMap<(u16, u16), std::net::TcpStream>,
    idle: Idle,
) -> anyhow::Result<Duration> {
    const ROUNDS: usize = 400;
    let a = streams.remove(&(0, 1)).context("stream")?;
    let b = streams.remove(&(1, 0)).context("stream")?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    let echo = std::thread::spawn(move || -> anyhow::Result<std::net::TcpStream> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        rt.block_on(async move {
            let mut b = TcpStream::from_std(b)?;
            for _ in 0..ROUNDS {
                let f = busy(read_frame(&mut b), idle == Idle::Spin).await?;
                metatopia_node::net::frames::write_frame(&mut b, &f).await?;
            }
            Ok(b.into_std()?)
        })
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (a, mut samples) = rt.block_on(async move {
        let mut a = TcpStream::from_std(a)?;
        let mut samples = Vec::new();
        for _ in 0..ROUNDS {
            let t = Instant::now();
            metatopia_node::net::frames::write_frame(&mut a, &[7u8; 64]).await?;
            busy(read_frame(&mut a), idle == Idle::Spin).await?;
            samples.push(t.elapsed());
        }
        anyhow::Ok((a.into_std()?, samples))
    })?;
    let b = echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    a.set_nonblocking(false)?;
    b.set_nonblocking(false)?;
    streams.insert((0, 1), a);
    streams.insert((1, 0), b);
    samples.sort();
    Ok(samples[samples.len() / 2])
}
