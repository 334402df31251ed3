//! `metatopia-lab bench agreement`: 4 validators in this process, connected over real loopback TCP
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
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use metatopia_consensus::{Config, Digest, Message, SigningKey, Validator, ValidatorIndex, VerifyingKey};
use metatopia_sim::genesis::demo_key;
use metatopia_sim::{Payload, SignedEvent, SimId};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

mod driver;
mod reactor;
pub use driver::Idle;
use driver::{Driver, Frame, Inbox, Inboxes, Input, Links, Shared, new_shared};
mod report;
use report::report;

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
    /// `libp2p`: the node's mesh (QUIC, encrypted, multiplexed), what real nodes use; lab
    /// variants the node does not run: `tcp`, plain TCP between the validators on a
    /// busy-polling reactor (the agreement alone), and `udp`, a UDP socket per validator, frames
    /// longer than a datagram in pieces (on the reactor only).
    #[arg(long, default_value = "libp2p", value_parser = ["libp2p", "tcp", "udp"])]
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

use metatopia_node::net::frames::{MAX_FRAME, busy, read_frame, write_frames};

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
    use metatopia_node::net::{Mesh, MeshEvent, PeerAddr, free_ports, free_udp_ports};
    let n = usize::from(args.validators);
    let tcp: Vec<std::net::SocketAddr> =
        free_ports(n)?.into_iter().map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p))).collect();
    let udp: Vec<std::net::SocketAddr> =
        free_udp_ports(n)?.into_iter().map(|p| std::net::SocketAddr::from(([127, 0, 0, 1], p))).collect();
    let peers: Vec<PeerAddr> = (0..n).map(|i| PeerAddr::direct(vks[i], Some(tcp[i]), Some(udp[i]))).collect();
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
    let ping = NodeMsg::Snapshot { tick: metatopia_sim::Tick(0), bytes: vec![7; 64] };
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
