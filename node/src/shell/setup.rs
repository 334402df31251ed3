//! A node's setup: `metatopia init` and `config check`, the sim's genesis installed into a data
//! directory and checked against its config, where a node starts from (its genesis, or for a
//! demo config the demo world), and `run --join` fetching a running sim's config and genesis.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{NodeConfig, ValidatorEntry};
use crate::net::wire::NodeMsg;
use crate::net::{Mesh, MeshEvent, PeerAddr};
use crate::store::DataDir;
use crate::world::genesis::{Genesis, GenesisHash};
use anyhow::Context;
use metatopia_sim::genesis::DemoWorld;

#[derive(Clone, Debug, clap::Args)]
pub struct DirArgs {
    /// The node's data directory.
    #[arg(long, env = "METATOPIA_HOME", default_value = "metatopia-data")]
    pub data_dir: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Address to listen on for peers.
    #[arg(long, env = "METATOPIA_LISTEN", default_value = "127.0.0.1:7100")]
    pub listen: std::net::SocketAddr,
    /// Address to listen on for peers over QUIC (UDP; default: the listen port + 2000).
    #[arg(long, env = "METATOPIA_QUIC")]
    pub quic: Option<std::net::SocketAddr>,
    /// Install this sim's genesis (a `genesis.bin` that `metatopia sim new` wrote, as its
    /// operator sends it): the node starts as one of its validators (or follows, if its key is
    /// not among them). Without it, the node waits for `sim new --data-dir` or `run --join`.
    #[arg(long, value_name = "FILE")]
    pub genesis: Option<PathBuf>,
}

#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Also run, in this process, the node of this data directory (repeatable): one process
    /// replicating several sims, as a validator or an observer of each, with one node (key,
    /// config, log, ports) per sim. `--listen`, `--quic`, `--http`, `--join` and `--bots` apply
    /// to the first directory only.
    #[arg(long, value_name = "DIR")]
    pub also: Vec<PathBuf>,
    /// Listen here instead of the config's `listen` (with --join and no config yet: default
    /// 127.0.0.1:7100).
    #[arg(long, env = "METATOPIA_LISTEN")]
    pub listen: Option<std::net::SocketAddr>,
    /// Listen for peers over QUIC here instead of the config's `quic` (with --join and no config
    /// yet: default the listen port + 2000).
    #[arg(long, env = "METATOPIA_QUIC")]
    pub quic: Option<std::net::SocketAddr>,
    /// Join a running sim through the node at KEY@HOST:PORT (its join address, as `init` and
    /// `devnet` print it): with no config yet, fetch the sim's config (and scenario files) from
    /// it; with no state yet, start from a snapshot that 2f+1 validators certify, then follow.
    /// The node follows (and serves clients) until the admin admits its key as a validator.
    #[arg(long, env = "METATOPIA_JOIN", value_name = "KEY@HOST:PORT")]
    pub join: Option<String>,
    /// Serve HTTP (health, metrics, the API of `stats` and `admin`) here instead of the config's
    /// `http` (default: the peers' port + 1000).
    #[arg(long, env = "METATOPIA_HTTP")]
    pub http: Option<std::net::SocketAddr>,
    /// Bots' signed events per tick, instead of the config's `bots.events_per_tick`.
    #[arg(long, env = "METATOPIA_BOTS")]
    pub bots: Option<u32>,
    /// Run the client service's threads (HTTP, the WebSocket and QUIC sessions) N nice steps
    /// below the node's own: on a machine short of cores a vote or a block then waits less behind
    /// a crowd's deltas, and clients get what the agreement leaves. 0: the same priority.
    #[arg(long, env = "METATOPIA_CLIENT_NICE", value_name = "N", default_value_t = 0,
          value_parser = clap::value_parser!(i32).range(0..=19))]
    pub client_nice: i32,
    /// Threads for a tick's parallel stages, instead of the config's `sim_workers` (default:
    /// one per core, at most 8); for every directory of the process.
    #[arg(long, env = "METATOPIA_SIM_WORKERS", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub sim_workers: Option<u32>,
    /// Stop once the sim is at tick N (tick N-1 executed; one tick more if it started there
    /// already). The node executes nothing further but stays up, agreeing and answering
    /// fetches, until every validator of the sim has executed that tick too (at most 30 s), so
    /// a sim stopped whole leaves no slower node stranded. Commits that arrive meanwhile are
    /// logged and executed at the next start.
    #[arg(long, value_name = "N")]
    pub ticks: Option<u64>,
    /// Print a status line every this many ticks (default: once a second).
    #[arg(long)]
    pub report_every: Option<u64>,
    /// Measurement only, never for a real node: send votes without syncing the journal and the
    /// log first (what durability costs is the difference). A power cut can then make a
    /// restarted validator vote twice.
    #[arg(long, hide = true)]
    pub unsafe_no_sync: bool,
    /// Tests and measurements only: every frame this node sends its peers waits this many
    /// milliseconds first (one way), as across the internet (the delay stage of `net`); for
    /// every directory of the process.
    #[arg(long, hide = true, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub test_link_delay_ms: u64,
    /// With `--test-link-delay-ms`: each frame's delay varies by up to this percent of it.
    #[arg(long, hide = true, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub test_link_jitter_percent: u32,
}

/// `metatopia init`: a key and a commented config; with `--genesis`, the sim it belongs to.
pub fn init(args: InitArgs) -> anyhow::Result<()> {
    let dir = DataDir::open(&args.dir.data_dir)?;
    let key = dir.key()?;
    let public = metatopia_sim::ids::hex(key.verifying_key().as_bytes());
    let path = dir.config_path();
    let quic = match args.quic {
        Some(q) => q,
        None => std::net::SocketAddr::new(
            args.listen.ip(),
            args.listen.port().checked_add(2000).context("--listen's port + 2000 is not a port: give --quic")?,
        ),
    };
    if path.exists() && args.genesis.is_none() {
        println!("{} exists; left as it is", path.display());
    } else {
        let mut cfg = match NodeConfig::load(&path) {
            Ok(c) => c,
            Err(_) if !path.exists() => NodeConfig {
                listen: args.listen,
                quic: Some(quic),
                http: None,
                tick_rate_hz: 20,
                snapshot_every: 640,
                genesis_hash: None,
                world: crate::config::WorldConfig { objects: 0, players: 1, ..Default::default() },
                bots: Default::default(),
                validators: Vec::new(),
                join: None,
                sims: Vec::new(),
                raynet: Default::default(),
                network: Default::default(),
                sim_workers: None,
                block_history_mib: None,
            },
            Err(e) => return Err(e.into()),
        };
        if let Some(file) = &args.genesis {
            let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let g = Genesis::decode(&bytes).with_context(|| format!("reading {}", file.display()))?;
            install_genesis(&dir, &mut cfg, &g)?;
            println!("installed the genesis of {}", g.describe());
        }
        crate::store::write_atomic(&path, cfg.commented().as_bytes())?;
        if cfg.genesis_hash.is_some() {
            println!(
                "wrote {}: start the node with `metatopia run --data-dir {}`",
                path.display(),
                dir.root().display()
            );
        } else {
            println!(
                "wrote {}; next, one of:\n  a new sim: `metatopia sim new --out DIR --data-dir {} --data-dir ...` (four nodes or more: you hold its admin key)\n  a running sim: `metatopia run --data-dir {} --join KEY@HOST:PORT` (its join address)",
                path.display(),
                dir.root().display(),
                dir.root().display()
            );
        }
    }
    println!("peer id (public key): {public}");
    println!("join address: {public}@{}", args.listen);
    Ok(())
}

/// Make `cfg` a node of the sim of genesis `g` and put the genesis file in `dir`: its hash, its
/// sim, its validators (from the genesis's contacts, keeping this node's own addresses), its rate.
pub fn install_genesis(dir: &DataDir, cfg: &mut NodeConfig, g: &Genesis) -> anyhow::Result<()> {
    if let Some(old) = Genesis::read(dir.root())? {
        anyhow::ensure!(
            old.hash == g.hash,
            "{} already holds the genesis of another sim ({}): a data directory holds one sim",
            dir.root().display(),
            old.hash
        );
    }
    let me = dir.key()?.verifying_key().to_bytes();
    cfg.genesis_hash = Some(g.hash.to_string());
    cfg.world = crate::config::WorldConfig { sim_id: g.world().sim().0, objects: 0, players: 1, ..Default::default() };
    cfg.tick_rate_hz = g.world().settings().tick_rate_hz;
    cfg.validators = g
        .contacts
        .iter()
        .map(|c| {
            let own = c.key == me;
            ValidatorEntry {
                key: metatopia_sim::ids::hex(&c.key),
                address: if own { cfg.listen } else { c.address },
                quic: if own { cfg.quic } else { c.quic },
                http: None,
                observer: false,
            }
        })
        .collect();
    g.write(dir.root())?;
    Ok(())
}

/// `metatopia config check`.
pub fn config_check(args: DirArgs) -> anyhow::Result<()> {
    let dir = DataDir::open(&args.data_dir)?;
    let cfg = NodeConfig::load(&dir.config_path())?;
    let key = dir.key()?;
    let me = cfg.keys()?.iter().position(|k| *k == key.verifying_key());
    let sim = match Genesis::read(dir.root())? {
        Some(g) => {
            check_genesis(&cfg, &g)?;
            g.describe()
        }
        None if cfg.world.demo => format!(
            "a demo sim (seed {}, {}; demo keys: devnets and tests only), built at its first start",
            cfg.world.seed,
            cfg.world.scenario.as_ref().map_or("the seeded demo world".to_owned(), |p| p.display().to_string())
        ),
        None => "no genesis yet (`metatopia sim new --data-dir`, `init --genesis FILE` or `run --join`)".to_owned(),
    };
    println!(
        "{}: ok. listen {}, http {}, snapshot every {} ticks, {} validators; this node is {}; sim: {sim}",
        dir.config_path().display(),
        cfg.listen,
        cfg.http_addr(),
        cfg.snapshot_every,
        cfg.validators.len(),
        me.map_or("not a validator".to_owned(), |i| format!("validator {i}"))
    );
    Ok(())
}

/// A genesis and the config that names it agree: hash, sim, validators.
fn check_genesis(cfg: &NodeConfig, g: &Genesis) -> anyhow::Result<()> {
    if let Some(h) = &cfg.genesis_hash {
        let want: GenesisHash = h.parse().context("the config's genesis_hash")?;
        anyhow::ensure!(
            want == g.hash,
            "the data directory's genesis has hash {}, but the config names {want}: this is another sim's genesis",
            g.hash
        );
    }
    anyhow::ensure!(
        g.world().sim().0 == cfg.world.sim_id,
        "the genesis is of {}, the config says world.sim_id = {}",
        g.world().sim(),
        cfg.world.sim_id
    );
    let listed: std::collections::BTreeSet<metatopia_sim::AccountId> =
        cfg.genesis_validators()?.iter().map(|k| metatopia_sim::AccountId(k.to_bytes())).collect();
    let named = &g.world().governance().validators;
    if listed != *named {
        let missing: Vec<String> = named.difference(&listed).map(|a| a.short()).collect();
        let extra: Vec<String> = listed.difference(named).map(|a| a.short()).collect();
        anyhow::bail!(
            "the config's [[validators]] (not observers) must be the genesis's validators: missing {missing:?}, not in the genesis {extra:?}"
        );
    }
    Ok(())
}

/// Where a node's sim starts: its genesis, and for a demo sim the demo world (its bots' keys).
#[derive(Debug)]
pub struct Start {
    pub genesis: Genesis,
    pub demo: Option<DemoWorld>,
}

/// The sim's genesis: the data directory's `genesis.bin`; for a demo sim (`world.demo`) only, one
/// built from the config at the first start and written there.
pub fn start_of(dir: &DataDir, cfg: &NodeConfig, tag: &str) -> anyhow::Result<Start> {
    let existing = Genesis::read(dir.root())?;
    let need_demo = cfg.world.demo && (existing.is_none() || cfg.bots.events_per_tick > 0);
    let demo = if need_demo { Some(crate::world::demo::demo_of(cfg)?) } else { None };
    let genesis = match (existing, &demo) {
        (Some(g), _) => g,
        (None, Some((demo, physics))) => {
            let mut world = demo.world.clone();
            world.set_genesis_time(cfg.world.genesis_time_ms.context("world.genesis_time_ms")?);
            let keys = cfg.genesis_validators()?;
            let contacts = cfg
                .validators
                .iter()
                .filter(|v| !v.observer)
                .zip(&keys)
                .map(|(v, k)| crate::world::genesis::Contact { key: k.to_bytes(), address: v.address, quic: v.quic })
                .collect();
            let g = Genesis::of_world(world, physics, cfg.world.time_scale, contacts)?;
            let path = g.write(dir.root())?;
            println!("{tag}a demo sim (its keys are public: for devnets and tests only); wrote {}", path.display());
            g
        }
        (None, None) => anyhow::bail!(
            "{} has no genesis: create a sim you own with `metatopia sim new --out DIR --data-dir {}` (and its other nodes), install one with `metatopia init --genesis FILE`, or join a running sim with `metatopia run --join KEY@HOST:PORT`",
            dir.root().display(),
            dir.root().display()
        ),
    };
    check_genesis(cfg, &genesis)?;
    Ok(Start { genesis, demo: demo.map(|(d, _)| d) })
}

/// `run --join` on a node with no sim yet: ask the node at the join address for the sim's
/// config and genesis, check the genesis (against the hash the join address names, if it names
/// one), and write both into the data directory as this node's, with its own addresses.
pub async fn fetch_config(dir: &DataDir, args: &RunArgs, join: &str, had: Option<&NodeConfig>) -> anyhow::Result<()> {
    let (their_key, addr, want) = crate::config::parse_join_genesis(join).context("--join")?;
    let key = dir.key()?;
    let listen = args.listen.or(had.map(|c| c.listen)).unwrap_or_else(|| ([127, 0, 0, 1], 7100).into());
    let quic = match args.quic.or(had.and_then(|c| c.quic)) {
        Some(q) => q,
        None => std::net::SocketAddr::new(
            listen.ip(),
            listen.port().checked_add(2000).context("--listen's port + 2000 is not a port: give --quic")?,
        ),
    };
    println!("joining through {join}: asking it for the sim's config and genesis");
    // A throwaway mesh on an ephemeral port: the node's own starts once the config is written.
    let local = std::net::SocketAddr::new(listen.ip(), 0);
    let bootstrap = PeerAddr::direct(their_key, Some(addr), None);
    let (mesh, mut rx) = Mesh::start(&key, local, None, vec![bootstrap]).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut ask = tokio::time::interval(Duration::from_millis(500));
    let (config, genesis) = loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => anyhow::bail!(
                "no answer from {join} within 30 s: is a node of the sim running there, with that key?"
            ),
            _ = ask.tick() => if mesh.connected() > 0 {
                mesh.send(0, &NodeMsg::SimInfoRequest);
            },
            m = rx.recv() => match m {
                Some(MeshEvent::Message(from, NodeMsg::SimInfo { config, genesis })) if from.0 == 0 => break (config, genesis),
                Some(_) => {}
                None => anyhow::bail!("the mesh stopped"),
            },
        }
    };
    drop(mesh);
    let own = crate::core::join::Own { listen, quic, http: args.http.or(had.and_then(|c| c.http)), had: had.cloned() };
    let crate::core::join::Adopted { config: cfg, genesis: g, note } =
        crate::core::join::adopt(join, want, &config, &genesis, own)?;
    if let Some(note) = note {
        println!("{note}");
    }
    g.write(dir.root())?;
    crate::store::write_atomic(&dir.config_path(), cfg.commented().as_bytes())?;
    println!("wrote {} and the genesis of {}", dir.config_path().display(), g.describe());
    Ok(())
}
