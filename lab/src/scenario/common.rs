//! What the scenario runners share: the cluster's node, verdicts and reports, recordings, the
//! network and fault plumbing, and steps' payloads.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use metatopia_consensus::{Config, SigCache};
use metatopia_scenarios::judge::StepOutcome;
use metatopia_scenarios::spec::{Action, Scenario};
use metatopia_scenarios::{Cluster, DiskFault, Fault, NetConfig, NetStats, NodeId, Partition, Time};
use metatopia_scripting::RhaiHost;
use metatopia_sim::event::account_of;
use metatopia_sim::{AccountId, AdminAct, ChatRange, Hash32, ObjectId, Payload, Sim, Tick, World};
use serde::{Deserialize, Serialize};

use crate::simnet::{Actor, CoreProcess, DiskStore, Histories};
use metatopia_node::core::{CoreOutput, Outcome};
use metatopia_node::shell::persist::{Persister, Restored};
use metatopia_node::store::{DataDir, LogRecord, SimDisk};
use metatopia_node::world::{AnyPhysics, Options, account_key, v2, validator_key};

pub(crate) type Node = CoreProcess<Actor, RhaiHost, AnyPhysics>;

pub(crate) const MS: Time = 1_000;

pub use metatopia_scenarios::judge::Verdict;

/// What a run did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    pub name: String,
    pub seed: u64,
    /// Ticks each cluster node executed (None: down at the end).
    pub ticks: Vec<Option<u64>>,
    pub honest: Vec<NodeId>,
    pub steps_submitted: usize,
    pub trace: String,
    pub verdicts: Vec<Verdict>,
    #[serde(skip)]
    pub net: NetStats,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|v| v.ok)
    }

    /// The summary table.
    pub fn table(&self) -> String {
        let mut out = format!("scenario {} (seed {})\n", self.name, self.seed);
        let ticks: Vec<String> = self.ticks.iter().map(|t| t.map_or("down".to_owned(), |t| t.to_string())).collect();
        let net = if self.net.sent > 0 {
            format!(" · messages sent {} lost {} cut {}", self.net.sent, self.net.lost, self.net.cut)
        } else {
            String::new()
        };
        out += &format!(
            "  nodes: ticks executed {} · honest {:?} · steps submitted {}{net}\n",
            ticks.join("/"),
            self.honest,
            self.steps_submitted,
        );
        out += &format!("  trace {}\n", self.trace.get(..16).filter(|_| self.trace.len() == 64).unwrap_or(&self.trace));
        for v in &self.verdicts {
            out +=
                &format!("  {} line {:<4} {:<40} {}\n", if v.ok { "PASS" } else { "FAIL" }, v.line, v.what, v.detail);
        }
        out
    }
}

/// Committed inputs of a run and the roots they gave, for `replay verify` and `synctest`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Recording {
    pub physics: String,
    pub time_scale: u64,
    /// The genesis world, as a snapshot.
    pub genesis: Vec<u8>,
    pub ticks: Vec<(LogRecord, Hash32)>,
}

/// A signer with its nonce and its last event (for `replay`).
/// Agreement timing for the deterministic cluster at a tick period.
pub(crate) fn consensus_config(period_us: u64, genesis_time_ms: u64) -> Config {
    Config {
        period_us,
        genesis_time_ms,
        leader_timeout_us: 250 * MS,
        notarize_timeout_us: 500 * MS,
        retry_us: 250 * MS,
        sig_cache: Arc::new(SigCache::default()),
        max_exec_lag: Some(4),
        max_span_us: metatopia_node::config::MAX_SPAN_US,
        fill_lead_us: metatopia_node::config::FILL_LEAD_US,
        max_event_bytes: metatopia_node::core::MAX_BLOCK_EVENT_BYTES as usize,
        ..Config::default()
    }
}

/// Every link of the simulated network, as the scenario's `[network]` says.
pub(crate) fn net_config(spec: &Scenario) -> NetConfig {
    NetConfig {
        delay_min_us: (spec.network.delay_min_ms * 1000.0) as Time,
        delay_max_us: (spec.network.delay_max_ms * 1000.0) as Time,
        loss_ppm: (spec.network.loss_percent * 10_000.0) as u32,
        duplicate_ppm: (spec.network.duplicate_percent * 10_000.0) as u32,
    }
}

/// Schedule a crash (and restart), partition or clock skew; false for other kinds.
pub(crate) fn schedule_network_fault(c: &mut Cluster<Node>, f: &metatopia_scenarios::spec::FaultSpec) -> bool {
    let at = (f.at_secs * 1e6) as Time;
    let until = f.until_secs.map(|u| (u * 1e6) as Time);
    let node = NodeId::from(f.node.unwrap_or_default());
    match f.kind.as_str() {
        "crash" => {
            c.schedule_fault(at, Fault::Crash(node));
            if let Some(u) = until {
                c.schedule_fault(u, Fault::Restart(node));
            }
        }
        "disk_full" => {
            c.schedule_fault(at, Fault::Disk(node, DiskFault::Full));
            if let Some(u) = until {
                // Room again; the operator starts the node again (it stopped on the full disk).
                c.schedule_fault(u, Fault::Disk(node, DiskFault::Room));
                c.schedule_fault(u, Fault::Crash(node));
                c.schedule_fault(u + 100 * MS, Fault::Restart(node));
            }
        }
        "bit_flip" => {
            let what = if f.file.as_deref() == Some("snapshot") { DiskFault::FlipSnapshot } else { DiskFault::FlipLog };
            c.schedule_fault(at, Fault::Disk(node, what));
        }
        "power_loss" => {
            let nodes = match f.node {
                Some(n) => vec![NodeId::from(n)],
                None => (0..c.len() as NodeId).collect(),
            };
            for n in nodes {
                c.schedule_fault(at, Fault::PowerLoss(n));
                if let Some(u) = until {
                    c.schedule_fault(u, Fault::Restart(n));
                }
            }
        }
        "partition" => c.add_partition(Partition {
            from: at,
            until: until.unwrap_or(Time::MAX),
            groups: f.groups.iter().flatten().map(|g| g.iter().map(|x| NodeId::from(*x)).collect()).collect(),
        }),
        "skew" => c.set_skew(node, f.skew_ms.unwrap_or_default() * 1000),
        _ => return false,
    }
    true
}

/// What a node committed and executed, from genesis, for `replay verify` and `synctest`.
pub(crate) fn recording(
    node: &Node,
    genesis: &World,
    w: &metatopia_scenarios::spec::WorldSpec,
) -> anyhow::Result<Recording> {
    let roots = node.executed_roots();
    // A tick committed again after a restart (its record was not yet synced) appears twice.
    let mut ticks = BTreeMap::new();
    for o in &node.log {
        if let CoreOutput::Committed(r) = o
            && let Some(root) = roots.get(&r.tick)
        {
            ticks.insert(r.tick, ((**r).clone(), *root));
        }
    }
    let ticks = ticks.into_values().collect();
    let genesis = Sim::new(genesis.clone(), RhaiHost::default(), AnyPhysics::of(&w.physics), 1)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .snapshot()
        .encode();
    Ok(Recording { physics: w.physics.clone(), time_scale: w.time_scale, genesis, ticks })
}

/// The payload of a step (`avatar`: the signer's avatar, for `move`).
pub fn payload(
    s: &metatopia_scenarios::spec::StepSpec,
    objects: &BTreeMap<String, ObjectId>,
    avatar: Option<ObjectId>,
    opts: &Options,
    validators: &[metatopia_consensus::VerifyingKey],
) -> anyhow::Result<Payload> {
    let object = || s.object.as_ref().and_then(|o| objects.get(o)).copied().context("no such object");
    let account = || account_of(&account_key(s.account.as_deref().unwrap_or_default()));
    let validator = || -> AccountId {
        let i = s.validator.unwrap_or_default();
        match validators.get(usize::from(i)) {
            Some(k) => AccountId(k.to_bytes()),
            None => account_of(&validator_key(i)),
        }
    };
    Ok(match s.action {
        Action::Login => Payload::Login { name: s.by.clone() },
        Action::Logout => Payload::Logout,
        Action::Chat => Payload::Chat {
            channel: s.channel,
            range: match s.range.as_deref() {
                Some("whisper") => ChatRange::Whisper,
                Some("shout") => ChatRange::Shout,
                _ => ChatRange::Say,
            },
            text: s.text.clone().unwrap_or_default(),
        },
        Action::Touch => Payload::Touch { object: object()? },
        Action::Move => {
            let avatar = avatar.context("move: log in first (no avatar)")?;
            Payload::Move { object: avatar, velocity: v2(s.velocity.unwrap_or_default()) }
        }
        Action::Deploy => {
            let file = s.script.as_deref().unwrap_or_default();
            let path = opts.scripts_dir.join(file);
            let source = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
            Payload::DeployScript { object: object()?, source, licence: "AGPL-3.0-or-later".into(), derived_from: None }
        }
        Action::Kick => Payload::Admin(AdminAct::Kick { account: account() }),
        Action::Ban => Payload::Admin(AdminAct::Ban { account: account() }),
        Action::Unban => Payload::Admin(AdminAct::Unban { account: account() }),
        Action::TransferAdmin => Payload::Admin(AdminAct::TransferAdmin { to: account() }),
        Action::AdmitValidator => Payload::Admin(AdminAct::AdmitValidator { key: validator() }),
        Action::RemoveValidator => Payload::Admin(AdminAct::RemoveValidator { key: validator() }),
        Action::RemoveObject => Payload::Admin(AdminAct::RemoveObject { object: object()? }),
        Action::Replay => unreachable!("replays resend bytes"),
    })
}

/// A node's outcome of a step, as the judge reads it.
pub fn step_outcome(o: &Outcome) -> StepOutcome {
    match o {
        Outcome::Executed { .. } => StepOutcome::Executed,
        Outcome::Refused { reason, .. } => StepOutcome::Refused(reason.clone()),
    }
}

/// Every node's simulated disk (by cluster node) and its outputs kept across crashes.
#[derive(Clone, Debug)]
pub(crate) struct Disks {
    pub disks: Arc<Vec<Arc<SimDisk>>>,
    pub histories: Histories,
    /// Restarts from a disk, and the commits they did not find there (lost with a power cut
    /// before they were synced, or cut off by damage; taken again from the peers).
    pub restarts: Arc<std::sync::Mutex<(u64, u64)>>,
    /// Nodes that stopped on a disk error, and why.
    pub stops: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Disks {
    pub fn new(nodes: usize) -> Disks {
        Disks {
            disks: Arc::new((0..nodes).map(|_| Arc::new(SimDisk::new())).collect()),
            histories: Histories::default(),
            restarts: Default::default(),
            stops: Default::default(),
        }
    }

    /// Node `id`'s data directory opened as a (re)start opens it: the store, and what it holds.
    pub fn open(&self, id: NodeId) -> anyhow::Result<(DiskStore, Restored)> {
        let disk = self.disks[id as usize].clone();
        let dir = DataDir::open_on(disk.clone(), std::path::Path::new("/node"))?;
        let (persister, restored) = Persister::open(dir, true)?;
        let stops = self.stops.clone();
        Ok((DiskStore { id, disk, persister, histories: self.histories.clone(), stops }, restored))
    }

    /// What node `id` did before it crashed, counted against what its disk gave back.
    pub fn history(&self, id: NodeId, recovered: &[LogRecord]) -> Vec<CoreOutput> {
        let history = self.histories.lock().unwrap_or_else(|e| e.into_inner()).remove(&id).unwrap_or_default();
        let logged = history.iter().filter_map(|o| match o {
            CoreOutput::Committed(r) => Some(r.tick),
            _ => None,
        });
        let back: std::collections::BTreeSet<Tick> = recovered.iter().map(|r| r.tick).collect();
        let from = recovered.first().map_or(Tick::ZERO, |r| r.tick);
        let lost = logged.filter(|t| *t >= from && !back.contains(t)).collect::<std::collections::BTreeSet<_>>().len();
        let mut r = self.restarts.lock().unwrap_or_else(|e| e.into_inner());
        r.0 += 1;
        r.1 += lost as u64;
        history
    }
}

/// The sim a restart starts from: the newest snapshot on the disk that loads, else `genesis`.
pub(crate) fn restored_sim(
    store: &DiskStore,
    genesis: &World,
    physics: &str,
) -> anyhow::Result<Sim<RhaiHost, AnyPhysics>> {
    for (_, bytes) in store.persister.snapshots()? {
        let loaded =
            bytes.and_then(|b| metatopia_sim::Snapshot::decode(&b, 1 << 30).map_err(anyhow::Error::from)).and_then(
                |s| Sim::restore(s, RhaiHost::default(), AnyPhysics::of(physics), 1).map_err(anyhow::Error::from),
            );
        if let Ok(sim) = loaded {
            return Ok(sim);
        }
    }
    Sim::new(genesis.clone(), RhaiHost::default(), AnyPhysics::of(physics), 1).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The log replayed onto a restarted core (from its snapshot's tick, up to a gap), and kept to
/// answer peers' fetches: as the node's restart does.
pub(crate) fn replay_log(
    core: &mut metatopia_node::core::NodeCore<Actor, RhaiHost, AnyPhysics>,
    records: &[LogRecord],
) {
    let from = core.sim().world().tick().0;
    for rec in records.iter().filter(|r| r.tick.0 >= from) {
        if core.replay(rec).is_err() {
            break;
        }
    }
    core.recall(records);
}

/// The always-checked verdict on restarts: no node executed a tick twice (before and after a
/// crash or a power cut) to different roots, none was left unable to start, and no node holds
/// evidence of an honest validator (by index: `honest`) voting twice.
pub(crate) fn restarts_verdict<'a>(
    disks: &Disks,
    nodes: impl IntoIterator<Item = (NodeId, &'a Node)>,
    honest: &dyn Fn(u16) -> bool,
) -> Verdict {
    let mut changed = Vec::new();
    let mut dead = Vec::new();
    let mut equivocations = 0;
    for (id, node) in nodes {
        equivocations += node.core.equivocators().iter().filter(|v| honest(v.0)).count();
        let mut seen: BTreeMap<Tick, Hash32> = BTreeMap::new();
        for o in &node.log {
            if let CoreOutput::Executed { tick, root, .. } = o
                && seen.insert(*tick, *root).is_some_and(|before| before != *root)
            {
                changed.push(format!("node {id} tick {}", tick.0));
            }
        }
        if let Some(why) = &node.failed {
            dead.push(format!("node {id}: {why}"));
        }
    }
    let ok = changed.is_empty() && dead.is_empty() && equivocations == 0;
    let (restarts, lost) = *disks.restarts.lock().unwrap_or_else(|e| e.into_inner());
    let stops = disks.stops.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let detail = if ok {
        format!(
            "{restarts} restarts from disk ({lost} commits their disks did not give back, taken again from peers){}; no tick re-executed to another root, no equivocation seen",
            stops.first().map(|s| format!("; {s} ({} stops)", stops.len())).unwrap_or_default()
        )
    } else {
        format!("changed: {changed:?}; stopped: {dead:?}; equivocations seen: {equivocations}")
    };
    Verdict { line: 0, what: "nothing committed changed by a restart (always checked)".into(), ok, detail }
}
