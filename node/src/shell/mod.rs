//! The running node (`metatopia run`): a validator (or observer) of one sim, with its data directory, on the
//! validators' mesh; several in one process with `--also`. Setting a node up is `crate::shell::setup`;
//! when a sim stalls and when a node asked to stop after a tick stops, `crate::core::finish`.

mod locate;
pub mod persist;
pub mod setup;
pub mod threads;
pub mod timing;
pub mod watch;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::api::gateway::{Feed, Hub};
use crate::api::http::object_view;
use crate::api::http::{Query, Service, Status};
use crate::config::NodeConfig;
use crate::core::epochs::Epochs;
use crate::core::finish::Finish;
use crate::core::locate::{Locator, MAX_LOCATE_SIMS};
use crate::core::{Agreement as _, CoreOutput, NodeCore};
use crate::net::wire::NodeMsg;
use crate::net::{Mesh, MeshEvent, PeerAddr};
use crate::shell::persist::{Persister, Restored};
use crate::shell::timing::{StageTimes, TimedHost, TimedPhysics};
use crate::store::DataDir;
use crate::world::AnyPhysics;
use anyhow::Context;
use locate::{FIND_WAIT, Finding, MAX_FINDING, neighbour_squares, reach};
use metatopia_consensus::Config;
use metatopia_scripting::RhaiHost;
use metatopia_sim::genesis::EventGen;
use metatopia_sim::{Snapshot, Tick};
pub use setup::{DirArgs, InitArgs, RunArgs};

fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

/// `metatopia run`.
///
/// Each data directory's node runs on its own thread and runtime (two workers, as when it is the
/// only one); they share the process, its metrics (labelled by sim) and Ctrl-C. When one stops
/// with an error the others stop cleanly too, and the process says which one failed.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut dirs = vec![args.dir.data_dir.clone()];
    dirs.extend(args.also.iter().cloned());
    for (i, d) in dirs.iter().enumerate() {
        anyhow::ensure!(
            !dirs[..i].contains(d),
            "{} is given twice: each sim this process replicates needs its own data directory",
            d.display()
        );
    }
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<&'static str>);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let several = dirs.len() > 1;
    let mut threads = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        let mut a = args.clone();
        a.dir.data_dir = dir.clone();
        a.also.clear();
        if i > 0 {
            (a.listen, a.quic, a.http, a.join, a.bots) = (None, None, None, None, None);
        }
        let (prometheus, stop) = (prometheus.clone(), stop_rx.clone());
        let done = done_tx.clone();
        let thread = std::thread::Builder::new()
            .name(format!("node-{i}"))
            .spawn(move || {
                // A panic is this node's error too: the others are told to stop.
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let clients = threads::client_runtime(i, a.client_nice)?;
                    let ctx = Shared { prometheus, stop, several, clients: clients.handle().clone() };
                    let result = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .thread_name(format!("node-{i}-worker"))
                        .enable_all()
                        .build()
                        .map_err(anyhow::Error::from)
                        .and_then(|rt| rt.block_on(node(a, ctx)));
                    // Sessions still open are cut (their clients move to another node).
                    clients.shutdown_timeout(Duration::from_secs(1));
                    result
                }))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("its thread panicked (the message is above)")));
                let _ = done.send((i, result));
            })
            .context("starting a thread for a node")?;
        threads.push(thread);
    }
    drop(done_tx);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut results: Vec<Option<anyhow::Result<()>>> = dirs.iter().map(|_| None).collect();
    rt.block_on(async {
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        let mut interrupted = false;
        loop {
            tokio::select! {
                _ = &mut ctrl_c, if !interrupted => {
                    interrupted = true;
                    stop_tx.send_replace(Some("by Ctrl-C"));
                }
                d = done_rx.recv() => match d {
                    Some((i, r)) => {
                        if r.is_err() && stop_tx.borrow().is_none() {
                            stop_tx.send_replace(Some("because another node of this process stopped with an error"));
                        }
                        results[i] = Some(r);
                    }
                    None => break,
                },
            }
        }
    });
    for t in threads {
        let _ = t.join();
    }
    let mut errors = Vec::new();
    for (dir, r) in dirs.iter().zip(results) {
        match r {
            Some(Ok(())) => {}
            Some(Err(e)) if !several => return Err(e),
            Some(Err(e)) => errors.push(format!("the node of {}: {e:#}", dir.display())),
            None => errors.push(format!("the node of {} stopped without a word", dir.display())),
        }
    }
    anyhow::ensure!(errors.is_empty(), "{}", errors.join("; "));
    Ok(())
}

/// What the nodes of one process share.
struct Shared {
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
    /// Set (with the reason) when every node of the process is to stop.
    stop: tokio::sync::watch::Receiver<Option<&'static str>>,
    /// Whether the process runs several nodes (each line then says whose it is).
    several: bool,
    /// The runtime the node's client service runs on ([`threads::client_runtime`]).
    clients: tokio::runtime::Handle,
}

pub(crate) type Core = NodeCore<Epochs, TimedHost<RhaiHost>, TimedPhysics<AnyPhysics>>;

/// Figures for `stats` and `/metrics` the loop keeps between status updates.
#[derive(Debug, Default)]
struct Meter {
    /// Recent commit latencies (BFT time of the block to its commit here), ms.
    latencies: std::collections::VecDeque<f64>,
    /// Wall time of the core calls that executed ticks, ns, and the ticks they executed.
    exec_ns: u64,
    /// At the last status line: ticks executed, exec, script and physics ns.
    last: (Tick, u64, u64, u64),
    status: Status,
    /// The `sim` label of this node's metrics (a process may run nodes of several sims).
    sim: String,
}

impl Meter {
    fn latency(&mut self, ms: f64) {
        metrics::histogram!("metatopia_commit_latency_seconds", "sim" => self.sim.clone()).record(ms / 1000.0);
        self.latencies.push_back(ms);
        if self.latencies.len() > 512 {
            self.latencies.pop_front();
        }
    }

    fn quantile(&self, q: f64) -> f64 {
        let mut v: Vec<f64> = self.latencies.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0)
    }
}

async fn node(args: RunArgs, shared: Shared) -> anyhow::Result<()> {
    let Shared { prometheus, mut stop, several, clients } = shared;
    let dir = DataDir::open(&args.dir.data_dir)?;
    let existing = if dir.config_path().exists() { Some(NodeConfig::load(&dir.config_path())?) } else { None };
    // A node with no sim yet (no config, or `init`'s alone) joins one through --join.
    let awaiting = existing.as_ref().is_none_or(|c| {
        c.genesis_hash.is_none() && !c.world.demo && !dir.root().join(crate::world::genesis::FILE).exists()
    });
    match (&args.join, awaiting, &existing) {
        (Some(join), true, _) => crate::shell::setup::fetch_config(&dir, &args, join, existing.as_ref()).await?,
        (None, true, None) => anyhow::bail!(
            "{} has no config.toml: run `metatopia init` first, or give --join KEY@HOST:PORT to join a running sim",
            dir.root().display()
        ),
        _ => {}
    }
    let mut cfg = NodeConfig::load(&dir.config_path())?;
    let tag = if several { format!("[sim {}] ", cfg.world.sim_id) } else { String::new() };
    if let Some(l) = args.listen {
        cfg.listen = l;
    }
    if let Some(q) = args.quic {
        cfg.quic = Some(q);
    }
    if let Some(j) = &args.join {
        crate::config::parse_join(j).context("--join")?;
        cfg.join = Some(j.clone());
    }
    if let Some(b) = args.bots {
        cfg.bots.events_per_tick = b;
    }
    if let Some(w) = args.sim_workers {
        cfg.sim_workers = Some(w);
    }
    // The sim: its genesis first (a node with none says how to get one).
    let crate::shell::setup::Start { genesis, demo } = crate::shell::setup::start_of(&dir, &cfg, &tag)?;
    let key = dir.key()?;
    let keys = cfg.keys()?;
    let me = match keys.iter().position(|k| *k == key.verifying_key()) {
        Some(i) => i,
        // A node in no list follows through the node it joined (and the listed ones).
        None if cfg.join.is_some() => keys.len(),
        None => anyhow::bail!(
            "this node's key is not among the config's [[validators]] entries (validators and observers): add it there, or start with --join KEY@HOST:PORT to follow the sim through a node of it"
        ),
    };
    let unlisted = me == keys.len();
    let genesis_validators = cfg.genesis_validators()?;
    // The sim's rate is its genesis's (then its governance's), whatever a demo config said.
    cfg.tick_rate_hz = genesis.world().settings().tick_rate_hz;
    let physics_kind = genesis.physics.clone();
    let consensus = Config {
        period_us: 1_000_000 / u64::from(cfg.tick_rate_hz),
        genesis_time_ms: genesis.time_ms(),
        leader_timeout_us: crate::config::LEADER_TIMEOUT_US,
        notarize_timeout_us: 2 * crate::config::LEADER_TIMEOUT_US,
        retry_us: 300_000,
        chain_id: u64::from(cfg.world.sim_id),
        // Execution may trail agreement by at most this many blocks; then ticks slow down.
        max_exec_lag: Some(4),
        max_span_us: crate::config::MAX_SPAN_US,
        fill_lead_us: crate::config::FILL_LEAD_US,
        max_event_bytes: crate::core::MAX_BLOCK_EVENT_BYTES as usize,
        keep_bytes: cfg.block_history_bytes(),
        ..Config::default()
    };

    // Recover: the newest snapshot that loads, then the log since.
    // The log from the oldest snapshot kept on (what a restart may replay): not the sim's
    // whole history, which the log no longer holds. Written before every vote leaves.
    let durable = !args.unsafe_no_sync;
    let (mut store, Restored { recovery, consensus: saved_state }) = Persister::open(dir.clone(), durable)?;
    if recovery.truncated > 0 {
        eprintln!(
            "{tag}warning: cut {} bytes off the commit log's torn tail ({}); what it held comes again from the peers",
            recovery.truncated,
            recovery.reason.as_deref().unwrap_or("")
        );
    }
    for d in &recovery.damaged {
        eprintln!("{tag}error: the commit log is damaged: {d}; what it lacks comes from the peers");
    }
    let times = StageTimes::default();
    let host = || TimedHost::new(RhaiHost::default(), &times);
    let physics = || TimedPhysics::new(AnyPhysics::of(&physics_kind), &times);
    let mut sim = None;
    for (tick, bytes) in store.snapshots()? {
        let loaded =
            bytes.and_then(|b: Vec<u8>| Snapshot::decode(&b, 1 << 30).map_err(anyhow::Error::from)).and_then(|s| {
                metatopia_sim::Sim::restore(s, host(), physics(), cfg.sim_workers()).map_err(anyhow::Error::from)
            });
        match loaded {
            Ok(s) => {
                sim = Some(s);
                break;
            }
            Err(e) => eprintln!("{tag}warning: the snapshot of tick {tick} is refused: {e:#}"),
        }
    }
    let sim = match sim {
        Some(s) => s,
        None => metatopia_sim::Sim::restore(genesis.snapshot.clone(), host(), physics(), cfg.sim_workers())
            .context("loading the genesis")?,
    };
    let anchor_ms = consensus.genesis_time_ms;
    // The validator set follows the sim's governance epoch by epoch (admit-validator,
    // remove-validator), and so does the tick rate (the `settings` act).
    let validator = match &saved_state {
        Some(b) => Epochs::restore(consensus.clone(), key.clone(), keys.clone(), now_us(), b)
            .context("the agreement's state (consensus.journal) does not load: move it away to start this validator's votes afresh")?,
        None => Epochs::new(
            consensus,
            key.clone(),
            keys.clone(),
            genesis_validators.clone(),
            genesis.world().settings().epoch_ticks,
            now_us(),
        ),
    }
    .following_tick_rate();
    let mut core: Core = NodeCore::new(validator, sim, cfg.sim_workers())
        .with_time_scale(genesis.time_scale, anchor_ms)
        .defer_execution()
        .snapshots_every(cfg.snapshot_every)
        .verify_ahead()
        .with_mail_key(key.clone());
    if !durable {
        eprintln!(
            "{tag}warning: --unsafe-no-sync: votes are sent before they are on stable storage (measurement only)"
        );
    }
    let from = core.sim().world().tick();
    // A node that joined and has no state of its own yet starts from a certified snapshot.
    let fresh = from == Tick::ZERO && recovery.records.is_empty() && saved_state.is_none();
    if cfg.join.is_some() && fresh {
        core = core.joining();
    }
    let mut replayed = 0;
    for rec in recovery.records.iter().filter(|r| r.tick >= from) {
        // A gap (a segment lost or damaged) ends the replay: the node takes the rest from its
        // peers, from a snapshot they certify if they no longer hold the blocks.
        if let Err(e) = core.replay(rec) {
            eprintln!("{tag}warning: the log replays no further ({e}); the rest comes from the peers");
            break;
        }
        replayed += 1;
    }
    // The blocks committed before, for peers that fetch them (the agreement's own state keeps
    // only those not handed out yet).
    let recalled = core.recall(&recovery.records);
    tracing::info!(recalled, "blocks from the commit log kept to answer peers' fetches");
    // From where the log left it: a node already at or past the requested tick executes one.
    core = core.execute_until(args.ticks.map(|n| Tick(n.saturating_sub(1))));
    let root = core.root();
    println!(
        "{tag}node {me} of {} ({}): {} ({} objects); snapshot at tick {from}, {replayed} ticks replayed from the log; now at tick {} root {root}; sim workers {}",
        keys.len(),
        if core.agreement().index().is_some() {
            "a validator"
        } else if unlisted {
            "joined through another node, in no list: it follows until admitted"
        } else {
            "an observer: it follows until admitted"
        },
        core.sim().world().sim(),
        core.sim().world().objects().len(),
        core.sim().world().tick(),
        core.sim().workers()
    );

    let mut peers: Vec<PeerAddr> =
        cfg.validators.iter().zip(&keys).map(|(v, k)| PeerAddr::direct(*k, Some(v.address), v.quic)).collect();
    if let Some(j) = &cfg.join {
        let (k, addr) = crate::config::parse_join(j)?;
        if !keys.contains(&k) {
            peers.push(PeerAddr::direct(k, Some(addr), None));
        }
    }
    if core.is_joining() {
        println!("{tag}joining: asking the sim's nodes for a snapshot that 2f+1 validators certify");
    }
    let sim_info = crate::core::join::sim_info(&cfg, &genesis)?;
    let contacts = peers.clone();
    let delay = crate::net::LinkDelay {
        one_way: Duration::from_millis(args.test_link_delay_ms),
        jitter_percent: args.test_link_jitter_percent,
    };
    if delay != crate::net::LinkDelay::NONE {
        println!(
            "{tag}test link delay: {} ms one way (± {} %) on every frame to peers",
            args.test_link_delay_ms, delay.jitter_percent
        );
    }
    let (mesh, mut inbox) = Mesh::start_with(&key, cfg.listen, cfg.quic, peers, cfg.network.mesh_options(delay))
        .await
        .with_context(|| format!("listening for peers on tcp {} and quic {:?}", cfg.listen, cfg.quic))?;
    println!(
        "{tag}peer id {}; listening on {}",
        mesh.local_peer_id(),
        mesh.listening().iter().map(ToString::to_string).collect::<Vec<_>>().join(" ")
    );

    // The HTTP service: health, metrics and the API, answered by this loop through `queries`.
    let mut meter = Meter {
        sim: cfg.world.sim_id.to_string(),
        status: Status {
            sim: cfg.world.sim_id,
            node: me as u32,
            validators: crate::core::Agreement::validators(core.agreement()) as u32,
            voting: core.agreement().index().is_some(),
            tick_rate_hz: cfg.tick_rate_hz,
            region_origin: [
                core.sim().world().region().origin.x.floor_int(),
                core.sim().world().region().origin.y.floor_int(),
            ],
            region_size: core.sim().world().region().size.floor_int(),
            tick: core.sim().world().tick(),
            root: root.to_string(),
            genesis: genesis.hash.to_string(),
            ..Status::default()
        },
        ..Meter::default()
    };
    let (status_tx, status_rx) = tokio::sync::watch::channel(meter.status.clone());
    let (query_tx, mut queries) = tokio::sync::mpsc::channel::<Query>(1024);
    let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
    // The client service: the nodes of this sim clients may use (QUIC on each one's listen port;
    // the viewer's HTTP where its `[[validators]]` entry says, by default its port + 1000).
    let own_key = metatopia_sim::ids::hex(key.verifying_key().as_bytes());
    let own_http = cfg.http_addr().to_string();
    let node_addrs = |vs: &[crate::config::ValidatorEntry]| -> Vec<metatopia_client::proto::NodeAddr> {
        vs.iter()
            .map(|v| {
                let mut n = metatopia_client::proto::NodeAddr::at(v.key.to_ascii_lowercase(), v.address);
                if n.key == own_key {
                    n.http = Some(own_http.clone());
                } else if let Some(h) = v.http {
                    n.http = Some(h.to_string());
                }
                n
            })
            .collect()
    };
    let hub = std::sync::Arc::new(Hub::new(cfg.world.sim_id, node_addrs(&cfg.validators)));
    let mut reach = reach(&cfg, &key, &mesh, core.sim().world(), &contacts, hub.clone())?;
    if let Some(n) = Some(reach.neighbour_counts()).filter(|n| !n.is_empty()) {
        let names: Vec<String> = n.keys().map(ToString::to_string).collect();
        println!(
            "{tag}neighbour sims: {} (their validators are found through Raynet; their mail counts with f+1 of their signatures)",
            names.join(", ")
        );
    }
    let mut rounds = tokio::time::interval(Duration::from_millis(u64::from(cfg.raynet.round_ms)));
    rounds.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let g = core.sim().world().governance();
    let mut removed = Removed { kicked: g.kicked_until_ms.clone(), banned: g.banned.clone() };
    let service = Service {
        status: status_rx,
        queries: query_tx,
        metrics: Some(prometheus),
        started: std::time::Instant::now(),
        hub: Some(hub.clone()),
    };
    let http_addr = args.http.unwrap_or_else(|| cfg.http_addr());
    let (http_bound, http_task) = crate::api::serve(&clients, http_addr, service.clone(), async move {
        let _ = http_stopped.await;
    })
    .with_context(|| format!("serving HTTP on {http_addr} (set `http` in the config or --http)"))?;
    println!("{tag}http on http://{http_bound} (/healthz /readyz /metrics /v1/status)");
    let (quic, quic_task) = crate::api::gateway::serve_quic(&clients, cfg.listen, &key, service.clone())
        .with_context(|| format!("serving clients over QUIC on udp {}", cfg.listen))?;
    println!(
        "{tag}clients: QUIC on udp {} (join address {}@{}/{})",
        cfg.listen,
        metatopia_sim::ids::hex(key.verifying_key().as_bytes()),
        cfg.listen,
        genesis.hash
    );
    let examples: Vec<&str> = crate::world::EXAMPLE_SCRIPTS.iter().map(|(_, s)| *s).collect();
    let mut bots = demo
        .as_ref()
        .filter(|_| cfg.bots.events_per_tick > 0)
        .map(|demo| EventGen::new(demo, cfg.world.seed ^ 0xb075).with_scripts(&examples));
    let mut last_bot_tick = 0;
    let mut bot_timer = tokio::time::interval(Duration::from_micros(1_000_000 / u64::from(cfg.tick_rate_hz)));
    let report_every = args.report_every.unwrap_or(u64::from(cfg.tick_rate_hz)).max(1);
    let mut last_root = core.root();
    // Sampled at the status lines.
    let mut dilation = crate::core::dilation::Dilation::new(core.sim().world().time_ms(), core.sim().world().tick());
    // Clients' route questions waiting for a neighbour's answer, or for a Raynet lookup's.
    let mut locator: Locator<tokio::sync::oneshot::Sender<Option<u32>>> = Locator::default();
    let mut finding: Vec<Finding> = Vec::new();
    let mut watch = crate::shell::watch::ValidatorWatch::default();
    let outcome: anyhow::Result<&str> = loop {
        let deadline = core.poll_timeout().unwrap_or(u64::MAX);
        let wait = Duration::from_micros(deadline.saturating_sub(now_us()).min(1_000_000));
        let started = std::time::Instant::now();
        tokio::select! {
            q = queries.recv() => match q {
                // Where is an avatar that is not here? Ask two nodes of each other sim (one may
                // be a tick behind the login, or unreachable); the first "here" answers.
                Some(crate::api::http::Query::Locate(account, tx)) => {
                    let mut nodes = std::collections::BTreeSet::new();
                    for pick in [me, me + 1] {
                        nodes.extend(reach.one_node_of_each(pick, MAX_LOCATE_SIMS));
                    }
                    match locator.ask(now_us(), account, nodes, tx) {
                        Ok(ask) => {
                            for node in ask {
                                mesh.send(node, &NodeMsg::Locate { account: account.0 });
                            }
                        }
                        Err((tx, _)) => {
                            let _ = tx.send(None);
                        }
                    }
                }
                // Which sim holds a point? The Raynet lookup's answer comes below.
                Some(crate::api::http::Query::Nearest(point, tx)) => {
                    if finding.len() < MAX_FINDING {
                        let query = reach.lookup(point);
                        finding.push((query, tx, std::time::Instant::now() + FIND_WAIT));
                    } else {
                        let _ = tx.send(None);
                    }
                }
                Some(q) => crate::api::http::answer(&mut core, now_us(), q),
                None => {}
            },
            m = inbox.recv() => {
                // Raynet and cards, from any node of the world.
                let m = match m {
                    None => break Err(anyhow::anyhow!("the mesh stopped")),
                    Some(MeshEvent::Message(from, msg)) => reach.handle(from.0, msg).map(|msg| MeshEvent::Message(from, msg)),
                    other => other,
                };
                match m {
                    // Another sim's node: a neighbour's mail, and where avatars are.
                    Some(MeshEvent::Message(from, msg)) if mesh.is_outsider(from.0) => match msg {
                        NodeMsg::Mail(_) => core.handle_message(now_us(), from, msg),
                        NodeMsg::Locate { account } => {
                            let a = core.sim().world().account(&metatopia_sim::AccountId(account));
                            let here = a.is_some_and(|a| a.avatar.is_some());
                            mesh.send(from.0, &NodeMsg::Located { account, here });
                        }
                        NodeMsg::Located { account, here } => {
                            // The sim is the sender's, whatever it says.
                            if let Some(sim) = reach.sim_of(from.0) {
                                let account = metatopia_sim::AccountId(account);
                                for (tx, at) in locator.located(sim, from.0, account, here) {
                                    let _ = tx.send(at.map(|s| s.0));
                                }
                            }
                        }
                        _ => {}
                    },
                    Some(MeshEvent::Message(from, NodeMsg::SimInfoRequest)) => {
                        if let Some(k) = mesh.key_of(from.0) {
                            println!("{tag}a node outside the config asks to join: {} (peer {})", metatopia_sim::ids::hex(k.as_bytes()), from.0);
                        }
                        mesh.send(from.0, &sim_info);
                    }
                    Some(MeshEvent::Message(from, msg)) => core.handle_message(now_us(), from, msg),
                    Some(MeshEvent::Joined { index, key }) => {
                        // A joining node of this sim, or another sim's node that found this one
                        // through Raynet (its card makes it an outsider).
                        tracing::debug!(index, key = %metatopia_sim::ids::hex(key.as_bytes()), "a node outside the config connected");
                        core.agreement_mut().learn_peer(index, key);
                    }
                    None => {}
                }
            }
            // A timer due now (the agreement's work ahead, once a vote has gone out) fires now:
            // tokio's timers round up to the next millisecond.
            _ = tokio::time::sleep(wait), if !wait.is_zero() => core.handle_timeout(now_us()),
            _ = std::future::ready(()), if wait.is_zero() => core.handle_timeout(now_us()),
            _ = rounds.tick() => {
                reach.refresh_card(&key, crate::unix_ms());
                meter.status.card_relayed.clone_from(&reach.overlay().card().body.relayed);
                reach.round();
                watch_validators(&mut watch, &mut meter, &core, &mesh, &key, &tag);
                // No tick for 2 s: the sim is paused, whatever the last second's rate was, and
                // executes nothing that would send its status: clients (the viewer's banner)
                // learn from this that it is paused, and why.
                let paused = crate::unix_ms().saturating_sub(meter.status.last_executed_unix_ms) > 2_000;
                if paused {
                    meter.status.dilation = 0.0;
                }
                if paused && hub.listened() {
                    hub.publish(Feed::Status(Box::new(meter.status.clone())));
                    // The area index is kept only while someone listens, and refilled at the
                    // next tick: a client that came while the sim is paused sees the world now.
                    let w = core.sim().world();
                    let mut index = hub.index.write().unwrap_or_else(|e| e.into_inner());
                    if index.is_empty() && !w.objects().is_empty() {
                        let tick = w.tick();
                        index.update_world(tick, w, |o| object_view(w, o, false));
                        drop(index);
                        hub.publish_tick(tick);
                    }
                }
            }
            // Commits execute once the votes that committed them have gone out (below).
            _ = std::future::ready(()), if core.has_deferred() => core.execute_deferred(now_us()),
            _ = bot_timer.tick(), if bots.is_some() => {
                // One batch per executed tick: when time dilates, the bots slow down with the
                // sim instead of piling events up faster than it executes them.
                let w = core.sim().world();
                if let Some(g) = bots.as_mut().filter(|_| w.tick().0 > last_bot_tick) {
                    last_bot_tick = w.tick().0;
                    let batch = g.batch(w, w.tick(), cfg.bots.events_per_tick as usize);
                    let bytes = batch.events.iter().map(metatopia_sim::codec::encode).collect();
                    core.submit_events(now_us(), bytes);
                }
            }
            why = stop.wait_for(Option::is_some) => break Ok(why.map_or(None, |w| *w).unwrap_or("on request")),
        }
        while let Some(line) = reach.said.pop_front() {
            println!("{tag}{line}");
        }
        while let Some(found) = reach.poll_found() {
            let (query, answer) = match found {
                crate::overlay::OverlayEvent::Found { query, card } => {
                    let node =
                        metatopia_client::proto::NodeAddr::at(metatopia_sim::ids::hex(&card.body.key), card.body.addr);
                    (query, Some((card.body.sim, node)))
                }
                crate::overlay::OverlayEvent::Lost { query } => (query, None),
                crate::overlay::OverlayEvent::SimNode { .. } => continue,
            };
            for (_, tx, _) in finding.extract_if(.., |(q, _, _)| *q == query) {
                let _ = tx.send(answer.clone());
            }
        }
        let now = std::time::Instant::now();
        finding.retain(|(_, tx, deadline)| *deadline > now && !tx.is_closed());
        // No sim said "here" within the second.
        for (tx, at) in locator.expire(now_us()) {
            let _ = tx.send(at.map(|s| s.0));
        }
        // Log commits first, then make the votes durable, then send (a restarted node must never
        // vote differently, nor have voted for what it has not logged).
        let mut sends = Vec::new();
        let mut stop = None;
        let work_ns = started.elapsed().as_nanos() as u64;
        let mut exec_charged = false;
        // Ticks executed this turn (several when a block's span or a backlog executes at once):
        // the clients' view follows once, after the votes left, at the newest.
        let mut executed = false;
        let mut said = std::collections::VecDeque::new();
        while let Some(o) = core.poll_output() {
            match o {
                CoreOutput::Committed(rec) => {
                    store.committed(&rec)?;
                    meter.latency(crate::unix_ms().saturating_sub(rec.time_ms) as f64);
                }
                CoreOutput::Executed {
                    tick,
                    root,
                    accepted,
                    rejected,
                    chat: lines,
                    avatars_left,
                    script_operations,
                    ..
                } => {
                    meter.status.script_operations = script_operations;
                    for (account, sim) in avatars_left {
                        hub.avatar_moved(account.to_string(), sim.0);
                    }
                    // Sessions hear a line where the area index puts their avatars: it goes out
                    // once the index is at this tick (below).
                    for l in lines {
                        let line = crate::api::http::ChatView {
                            tick,
                            name: l.name,
                            channel: l.channel,
                            text: l.text,
                            position: [l.position.x.floor_int(), l.position.y.floor_int()],
                            range_m: l.range.metres().floor_int() as u32,
                            to: l.to.map(|a| a.to_string()),
                        };
                        let shared = std::sync::Arc::new(line);
                        if hub.listened() {
                            said.push_back(shared.clone());
                            if said.len() > 1024 {
                                said.pop_front();
                            }
                        }
                        hub.said(shared);
                    }
                    last_root = root;
                    if !exec_charged {
                        // The call that executed ticks: its wall time is execution time.
                        meter.exec_ns += work_ns;
                        exec_charged = true;
                    }
                    publish(&mut meter, &core, tick, &root, mesh.connected() as u32);
                    hub.resolve(|id| core.outcome(id).cloned());
                    executed = true;
                    metrics::counter!("metatopia_events_accepted_total", "sim" => meter.sim.clone())
                        .increment(u64::from(accepted));
                    metrics::counter!("metatopia_events_rejected_total", "sim" => meter.sim.clone())
                        .increment(u64::from(rejected));
                    if (tick.0 + 1).is_multiple_of(report_every) {
                        let s = core.stats();
                        let dilation =
                            dilation.sample(core.sim().world().time_ms(), tick.next(), meter.status.tick_rate_hz);
                        per_second(&mut meter, &times, dilation);
                        meter.status.filled_ticks = s.filled;
                        if let Some((p50, p99)) = core.commit_latency_us() {
                            meter.status.proposal_to_commit_p50_us = p50;
                            meter.status.proposal_to_commit_p99_us = p99;
                        }
                        if let Some((p50, p99)) = core.input_latency_us() {
                            meter.status.input_to_execution_p50_us = p50;
                            meter.status.input_to_execution_p99_us = p99;
                        }
                        meter.status.clients = hub.clients.load(std::sync::atomic::Ordering::Relaxed);
                        reach.update_neighbours(neighbour_squares(core.sim().world()));
                        meter.status.raynet_known = reach.overlay().known() as u32;
                        meter.status.raynet_neighbours = reach.overlay().neighbours().len() as u32;
                        let found = reach.neighbour_counts();
                        meter.status.neighbour_validators_found =
                            meter.status.neighbours.iter().map(|s| found.get(s).copied().unwrap_or(0) as u32).collect();
                        metrics::gauge!("metatopia_raynet_known", "sim" => meter.sim.clone())
                            .set(meter.status.raynet_known as f64);
                        if hub.listened() {
                            hub.publish(Feed::Status(Box::new(meter.status.clone())));
                        }
                        println!(
                            "{tag}tick {} root {} accepted {} rejected {} (total {} / {}) validators {} of {} connected dilation {:.2}",
                            tick.0,
                            root,
                            accepted,
                            rejected,
                            s.accepted,
                            s.rejected,
                            meter.status.validators_connected,
                            meter.status.validators,
                            dilation
                        );
                    }
                }
                CoreOutput::PeerDiverged { tick, validator } => {
                    tracing::warn!(%tick, validator = validator.0, "a peer reported a different state root");
                }
                CoreOutput::Desync(report) => {
                    meter.status.desynced = Some(report.tick);
                    let path = persist::write_desync_report(dir.root(), &report)?;
                    eprintln!(
                        "{tag}error: this node diverged at tick {}; report in {}; resyncing from a snapshot its peers certify",
                        report.tick,
                        path.display()
                    );
                }
                CoreOutput::Snapshot { tick, bytes } => store.snapshot(tick, &bytes)?,
                CoreOutput::Stalled { quiet_us, agreement } => eprintln!(
                    "{tag}warning: no tick committed for {} s ({} of {} validators of this sim connected): {agreement}",
                    quiet_us / 1_000_000,
                    meter.status.validators_connected,
                    crate::core::Agreement::validators(core.agreement()),
                ),
                CoreOutput::Finishing(Finish::Waiting { tick }) => {
                    println!("{tag}executed tick {tick}: waiting for the sim's other validators to execute it too")
                }
                CoreOutput::Finishing(Finish::Short { tick, seen, of }) => eprintln!(
                    "{tag}warning: stopping after tick {tick} although only {seen} of the sim's {of} validators were seen to execute it (waited {} s)",
                    crate::core::finish::FINISH_WAIT_US / 1_000_000
                ),
                CoreOutput::Finishing(Finish::Done) => stop = Some(Ok("after the requested ticks")),
                CoreOutput::Resynced { tick, certified_by, snapshot, joined } => {
                    meter.status.desynced = None;
                    // Dilation counts ticks executed from here, not the ones the snapshot skipped.
                    let w = core.sim().world();
                    dilation.restart(w.time_ms(), w.tick().max(tick));
                    // The state the log replays on top of after a restart.
                    store.resynced(tick, &snapshot)?;
                    if joined {
                        println!(
                            "{tag}joined: took the state of tick {tick} that {certified_by} validators certify; following"
                        );
                    } else {
                        println!(
                            "{tag}resynced: took the state of tick {tick} that {certified_by} validators certify; executing again"
                        );
                    }
                }
                other => sends.push(other),
            }
        }
        // Our own votes and proposals must be durable before they leave (a restarted node must
        // never vote differently); commits move the restart point. Nothing else needs a write.
        store.before_sending(persist::holds_votes(&sends), || {
            crate::core::Agreement::persist(core.agreement()).unwrap_or_default()
        })?;
        for o in sends {
            match o {
                CoreOutput::Broadcast(m) => mesh.broadcast(&m),
                CoreOutput::Send(to, m) => mesh.send(to.0, &m),
                // Each validator sends its copy to a different node of the neighbour (by index),
                // so one node down there costs one copy, not the mail.
                CoreOutput::Mail { to, event, .. } => {
                    let nodes = reach.neighbour_nodes(to);
                    if !nodes.is_empty() {
                        mesh.send(nodes[me % nodes.len()], &NodeMsg::Mail(event));
                    }
                }
                _ => {}
            }
        }
        if executed {
            let w = core.sim().world();
            // Kicked and banned accounts lose their sessions.
            let g = w.governance();
            for (a, until) in &g.kicked_until_ms {
                if removed.kicked.get(a) != Some(until) && *until > w.time_ms() {
                    hub.publish(Feed::Removed { account: a.to_string(), why: "kicked" });
                }
            }
            for a in g.banned.difference(&removed.banned) {
                hub.publish(Feed::Removed { account: a.to_string(), why: "banned" });
            }
            if removed.kicked != g.kicked_until_ms || removed.banned != g.banned {
                removed = Removed { kicked: g.kicked_until_ms.clone(), banned: g.banned.clone() };
            }
            let tick = w.tick().saturating_sub(1);
            let mut index = hub.index.write().unwrap_or_else(|e| e.into_inner());
            index.radius_m = w.settings().aoi_radius_m;
            index.rate_hz = meter.status.tick_rate_hz;
            if hub.listened() {
                index.update_world(tick, w, |o| object_view(w, o, false));
                drop(index);
                for line in said {
                    hub.publish(Feed::Chat(line));
                }
                hub.publish_tick(tick);
            } else if !index.is_empty() {
                // Nobody looks: building views every tick would be wasted.
                index.clear();
            }
        }
        let (epoch, view, agreed) = crate::core::Agreement::position(core.agreement());
        (meter.status.epoch, meter.status.view, meter.status.agreed_tick) = (epoch, view, agreed);
        if status_tx.send_if_modified(|s| {
            let changed = *s != meter.status;
            if changed {
                s.clone_from(&meter.status);
            }
            changed
        }) {
            metrics::gauge!("metatopia_peers", "sim" => meter.sim.clone()).set(f64::from(meter.status.peers));
        }
        if let Some(s) = stop {
            break s;
        }
    };
    // The peers learn at once that this node stopped (not by a missed ping seconds later).
    mesh.stop();
    quic.close(0u32.into(), b"the node is stopping");
    quic_task.abort();
    let _ = http_stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(2), http_task).await;
    store.sync()?;
    let how = outcome?;
    println!("{tag}stopped {how} at tick {}; final root {last_root}", core.sim().world().tick());
    Ok(())
}

/// Which of the sim's validators this node reaches: into the status, and a warning naming a
/// validator out of reach for 10 s (and a line when it is back).
fn watch_validators(
    watch: &mut crate::shell::watch::ValidatorWatch,
    meter: &mut Meter,
    core: &Core,
    mesh: &Mesh,
    key: &metatopia_consensus::SigningKey,
    tag: &str,
) {
    let keys = core.agreement().keys();
    // The current validators (an admitted node too) may hold reservations on this node's relay.
    mesh.add_members(keys);
    let set: Vec<[u8; 32]> = keys.iter().map(|k| k.to_bytes()).collect();
    let me = key.verifying_key().to_bytes();
    let r = watch.look(crate::unix_ms(), &set, &me, &mesh.connected_keys());
    for (k, down_ms) in &r.warn {
        eprintln!(
            "{tag}warning: validator {} of this sim unreachable for {} ({} of {} validators connected{})",
            metatopia_sim::ids::hex(k),
            crate::when::duration(*down_ms),
            r.connected,
            r.total,
            if r.quorum() { "" } else { "; no quorum: the sim cannot commit" }
        );
    }
    for k in &r.back {
        println!("{tag}validator {} of this sim is reachable again", metatopia_sim::ids::hex(k));
    }
    meter.status.validators_connected = r.connected;
    meter.status.validators_missing = r.missing.iter().map(|k| metatopia_sim::ids::hex(k)).collect();
    let net = mesh.net_info();
    let st = &mut meter.status;
    st.reachability = net.reachability.as_str().to_owned();
    st.relays = net.relays;
    st.peer_paths = net.paths.into_iter().map(|(k, p)| (k, p.to_owned())).collect();
    st.hole_punched = net.hole_punched;
    st.hole_punch_failed = net.hole_punch_failed;
    st.relay_serving = [net.serving_reservations, net.serving_circuits];
    st.relay_refused = net.relay_refused;
    metrics::gauge!("metatopia_validators_connected", "sim" => meter.sim.clone()).set(f64::from(r.connected));
}

/// The kicked and banned accounts as of the last tick (their sessions are closed when they change).
#[derive(Debug, Default)]
struct Removed {
    kicked: std::collections::BTreeMap<metatopia_sim::AccountId, u64>,
    banned: std::collections::BTreeSet<metatopia_sim::AccountId>,
}

/// After every executed tick: the status the HTTP service shows, and the gauges.
fn publish(meter: &mut Meter, core: &Core, tick: Tick, root: &metatopia_sim::Hash32, peers: u32) {
    let w = core.sim().world();
    let s = core.stats();
    let st = &mut meter.status;
    st.tick = tick;
    st.root = root.to_string();
    st.objects = w.objects().len() as u64;
    st.scripts = w.scripts().len() as u64;
    st.accounts = w.accounts().len() as u64;
    st.pool_events = crate::core::Agreement::pool_len(core.agreement()) as u64;
    st.accepted = s.accepted;
    st.rejected = s.rejected;
    st.refused_submissions = s.refused_submissions;
    st.peers = peers;
    st.validators = crate::core::Agreement::validators(core.agreement()) as u32;
    st.voting = core.agreement().index().is_some();
    st.tick_rate_hz = (1_000_000 / core.agreement().period_us().max(1)) as u32;
    st.last_executed_unix_ms = crate::unix_ms();
    st.neighbours = w.links().neighbours.keys().map(|s| s.0).collect();
    st.mail_sent = s.mail_sent;
    st.mail_received = s.mail_received;
    st.mail_late = s.mail_late;
    st.departures = s.departures;
    st.arrivals = s.arrivals;
    st.in_transit = w.links().departed().values().map(|d| d.record.object.name.clone()).collect();
    metrics::gauge!("metatopia_tick", "sim" => meter.sim.clone()).set(tick.0 as f64);
    metrics::gauge!("metatopia_objects", "sim" => meter.sim.clone()).set(st.objects as f64);
    metrics::gauge!("metatopia_scripts", "sim" => meter.sim.clone()).set(st.scripts as f64);
    metrics::gauge!("metatopia_accounts", "sim" => meter.sim.clone()).set(st.accounts as f64);
    metrics::gauge!("metatopia_pool_events", "sim" => meter.sim.clone()).set(st.pool_events as f64);
    if !st.neighbours.is_empty() {
        metrics::gauge!("metatopia_mail_signed", "sim" => meter.sim.clone()).set(st.mail_sent as f64);
        metrics::gauge!("metatopia_mail_received", "sim" => meter.sim.clone()).set(st.mail_received as f64);
        metrics::gauge!("metatopia_departures", "sim" => meter.sim.clone()).set(st.departures as f64);
        metrics::gauge!("metatopia_arrivals", "sim" => meter.sim.clone()).set(st.arrivals as f64);
        metrics::gauge!("metatopia_in_transit", "sim" => meter.sim.clone()).set(st.in_transit.len() as f64);
    }
}

/// Once a second: dilation, latency quantiles and the time per tick in execution, scripts and
/// physics since the last time.
fn per_second(meter: &mut Meter, times: &StageTimes, dilation: f64) {
    let (script_ns, physics_ns) = times.totals();
    let executed = meter.status.tick.next();
    let (t0, e0, s0, p0) = meter.last;
    let ticks = executed.since(t0).max(1) as f64;
    let per_tick_ms = |now: u64, then: u64| now.saturating_sub(then) as f64 / ticks / 1e6;
    let (p50, p99) = (meter.quantile(0.5), meter.quantile(0.99));
    let st = &mut meter.status;
    st.dilation = dilation;
    st.execute_ms = per_tick_ms(meter.exec_ns, e0);
    st.script_ms = per_tick_ms(script_ns, s0);
    st.physics_ms = per_tick_ms(physics_ns, p0);
    st.commit_latency_p50_ms = p50;
    st.commit_latency_p99_ms = p99;
    meter.last = (executed, meter.exec_ns, script_ns, physics_ns);
    metrics::gauge!("metatopia_time_dilation", "sim" => meter.sim.clone()).set(dilation);
    metrics::gauge!("metatopia_tick_rate_hz", "sim" => meter.sim.clone()).set(f64::from(st.tick_rate_hz) * dilation);
    metrics::gauge!("metatopia_execute_seconds_per_tick", "sim" => meter.sim.clone()).set(st.execute_ms / 1000.0);
    metrics::gauge!("metatopia_script_seconds_per_tick", "sim" => meter.sim.clone()).set(st.script_ms / 1000.0);
    metrics::gauge!("metatopia_physics_seconds_per_tick", "sim" => meter.sim.clone()).set(st.physics_ms / 1000.0);
}
