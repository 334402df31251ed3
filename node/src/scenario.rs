//! Running a scenario file (`scenarios/README.md`) on whole node cores in the deterministic
//! cluster: the world it describes, its validators (honest, Byzantine, twins, diverging), its
//! faults, accounts that sign steps at ticks, bots, and its expectations checked against what
//! every honest node did. Same file and seed, same run: the report carries the cluster's trace
//! hash.
//!
//! A run can be recorded (the committed inputs and the roots they gave), and a recording
//! checked two ways: [`replay_verify`] re-executes it from genesis; [`synctest`] re-simulates
//! every tick a second time from the snapshot before it (like GGRS's SyncTest), so any state
//! that escapes the snapshot or any nondeterminism shows up as a root mismatch at that tick.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use metatopia_consensus::mocks::{Behaviour, Byzantine};
use metatopia_consensus::{Config, Digest, Message, Micros, Output, SigCache, SigningKey, ValidatorIndex};
use metatopia_physics::RegionStage;
use metatopia_scenarios::spec::{Action, Scenario};
use metatopia_scenarios::{Cluster, Fault, NetConfig, NetStats, NodeId, Partition, Time};
use metatopia_scripting::RhaiHost;
use metatopia_sim::event::account_of;
use metatopia_sim::genesis::{DemoSpec, DemoWorld, EventGen, attach_script, demo_world};
use metatopia_sim::governance::{Role, role_of};
use metatopia_sim::host::{PhysicsCommand, PhysicsError, PhysicsOutput, PhysicsStage};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::state::{DAY_MS, ObjectKind, Shape};
use metatopia_sim::{
    AccountId, AdminAct, ChatRange, EventId, Fx, Hash32, ObjectId, Payload, SignedEvent, Sim, SimId, Snapshot, Tick,
    Vec2, World,
};
use serde::{Deserialize, Serialize};

use crate::core::{Agreement, CoreOutput, NodeCore, Outcome};
use crate::epochs::Epochs;
use crate::simnet::{Actor, CoreProcess, Saved};
use crate::store::LogRecord;

/// Either physics stage behind one type (scenarios and `metatopia sim` choose at run time).
#[derive(Debug)]
pub enum AnyPhysics {
    Kinematic(KinematicPhysics),
    Rapier(Box<RegionStage>),
}

impl AnyPhysics {
    /// `rapier` or (anything else) `kinematic`.
    pub fn of(kind: &str) -> AnyPhysics {
        if kind == "rapier" {
            AnyPhysics::Rapier(Box::new(RegionStage::single()))
        } else {
            AnyPhysics::Kinematic(KinematicPhysics::default())
        }
    }
}

impl PhysicsStage for AnyPhysics {
    fn load(&mut self, world: &World, saved: Option<&[u8]>) -> Result<(), PhysicsError> {
        match self {
            AnyPhysics::Kinematic(p) => p.load(world, saved),
            AnyPhysics::Rapier(p) => p.load(world, saved),
        }
    }
    fn step(&mut self, world: &World, commands: &[PhysicsCommand], dt: Fx) -> PhysicsOutput {
        match self {
            AnyPhysics::Kinematic(p) => p.step(world, commands, dt),
            AnyPhysics::Rapier(p) => p.step(world, commands, dt),
        }
    }
    fn save(&self) -> Vec<u8> {
        match self {
            AnyPhysics::Kinematic(p) => p.save(),
            AnyPhysics::Rapier(p) => p.save(),
        }
    }
    fn root(&self) -> Hash32 {
        match self {
            AnyPhysics::Kinematic(p) => p.root(),
            AnyPhysics::Rapier(p) => p.root(),
        }
    }
    fn deliver(&mut self, from: SimId, mail: &[u8]) {
        match self {
            AnyPhysics::Kinematic(p) => p.deliver(from, mail),
            AnyPhysics::Rapier(p) => p.deliver(from, mail),
        }
    }
    fn rename(&mut self, from: ObjectId, to: ObjectId) {
        match self {
            AnyPhysics::Kinematic(p) => p.rename(from, to),
            AnyPhysics::Rapier(p) => p.rename(from, to),
        }
    }
    fn despawn(&mut self, object: ObjectId) {
        match self {
            AnyPhysics::Kinematic(p) => p.despawn(object),
            AnyPhysics::Rapier(p) => p.despawn(object),
        }
    }
}

pub(crate) type Node = CoreProcess<Actor, RhaiHost, AnyPhysics>;

pub(crate) const MS: Time = 1_000;

/// How to run a scenario.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Where `script = "…"` files are (`scenarios/scripts/`).
    pub scripts_dir: PathBuf,
}

/// One expectation's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub line: usize,
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

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

fn derived_key(domain: &str, name: &str) -> SigningKey {
    let mut h = blake3::Hasher::new();
    h.update(b"metatopia scenario key\0");
    h.update(domain.as_bytes());
    h.update(b"\0");
    h.update(name.as_bytes());
    SigningKey::from_bytes(h.finalize().as_bytes())
}

/// A scenario account's key (derived from its name; scenarios only).
pub fn account_key(name: &str) -> SigningKey {
    derived_key("account", name)
}

pub fn validator_key(i: u16) -> SigningKey {
    derived_key("validator", &i.to_string())
}

/// Exact-enough conversion of a file's decimal to fixed point: rounded to 1/65536, the same on
/// every machine (IEEE-754 parsing and power-of-two scaling are exact).
fn fx(x: f64) -> Fx {
    Fx::from_bits((x * 65_536.0).round() as i64)
}

fn v2(a: [f64; 2]) -> Vec2 {
    Vec2::new(fx(a[0]), fx(a[1]))
}

/// The genesis world of a scenario, the demo world it grew from (its players are the bots'
/// accounts) and the ids of its named objects.
#[derive(Debug)]
pub struct Genesis {
    pub world: World,
    pub demo: DemoWorld,
    pub objects: BTreeMap<String, ObjectId>,
}

/// Build a scenario's genesis world for these validators (a pure function of its arguments: every
/// node of a sim builds the same one).
pub fn genesis(spec: &Scenario, seed: u64, opts: &Options, validators: &[AccountId]) -> anyhow::Result<Genesis> {
    genesis_in(spec, seed, opts, validators, None)
}

/// Where one sim of a world of several sims is, and who its neighbours are.
#[derive(Clone, Debug)]
pub struct Place {
    pub sim: SimId,
    pub region: metatopia_sim::state::Region,
    pub neighbours: Vec<(SimId, metatopia_sim::links::Neighbour)>,
    /// The whole world's corners.
    pub bounds: (Vec2, Vec2),
}

/// Sim `k` (0-based; its id is k + 1) of a scenario's grid of sims, with the validator keys of
/// every sim (`validators[j]`: sim j's).
pub fn place_of(w: &metatopia_scenarios::spec::WorldSpec, k: u32, validators: &[Vec<AccountId>]) -> Place {
    let (cols, rows) = w.layout();
    let size = w.region_size;
    let square = |j: u32| metatopia_sim::state::Region {
        origin: Vec2::from_ints(i64::from(j % cols) * size, i64::from(j / cols) * size),
        size: Fx::from_int(size),
    };
    let (col, row) = (k % cols, k / cols);
    let mut neighbours = Vec::new();
    for r in row.saturating_sub(1)..=(row + 1).min(rows - 1) {
        for c in col.saturating_sub(1)..=(col + 1).min(cols - 1) {
            let j = r * cols + c;
            if j != k && j < w.sims {
                let validators = validators.get(j as usize).into_iter().flatten().copied().collect();
                neighbours.push((SimId(j + 1), metatopia_sim::links::Neighbour { region: square(j), validators }));
            }
        }
    }
    let hi = Vec2::from_ints(i64::from(cols) * size, i64::from(rows) * size);
    Place { sim: SimId(k + 1), region: square(k), neighbours, bounds: (Vec2::ZERO, hi) }
}

/// [`genesis`] for one sim of several (`place`), or the lone sim (`None`). A sim of several
/// starts with the scenario's objects whose `at` is in its region, and no demo accounts.
pub fn genesis_in(
    spec: &Scenario,
    seed: u64,
    opts: &Options,
    validators: &[AccountId],
    place: Option<&Place>,
) -> anyhow::Result<Genesis> {
    let w = &spec.world;
    let demo = demo_world(DemoSpec {
        seed,
        sim: SimId(1),
        objects: w.random_objects,
        players: w.random_players,
        scripted_per_mille: 0,
        moving_per_mille: w.moving_per_mille,
        region_size: w.region_size,
    });
    let mut world = match place {
        None => demo.world.clone(),
        Some(p) => {
            let mut world = World::new(metatopia_sim::state::Genesis {
                sim: p.sim,
                region: p.region,
                admin: account_of(&demo.admin),
                validators: Default::default(),
                settings: demo.world.settings().clone(),
                time_ms: 0,
            });
            world.set_genesis_neighbours(p.neighbours.clone(), p.bounds).map_err(|e| anyhow::anyhow!("{e}"))?;
            // The demo's random prims (seeded per sim), moved into this sim's square.
            let prims = demo_world(DemoSpec {
                seed: seed ^ u64::from(p.sim.0).wrapping_mul(0x9e37_79b9),
                sim: p.sim,
                objects: w.random_objects,
                players: 0,
                scripted_per_mille: 0,
                moving_per_mille: w.moving_per_mille,
                region_size: w.region_size,
            });
            for o in prims.world.objects().values().filter(|o| o.kind == ObjectKind::Prim) {
                let at = p.region.origin + o.position;
                let name = format!("sim{}-{}", p.sim.0, o.name);
                world.add_genesis_object(o.kind, o.owner, name, o.shape, at, o.velocity, o.color, o.text.clone());
            }
            world
        }
    };
    let admin = match spec.accounts.iter().find(|a| a.get_ref().admin) {
        Some(a) => account_key(&a.get_ref().name),
        None => demo.admin.clone(),
    };
    world.set_genesis_admin(account_of(&admin));
    world.set_genesis_validators(validators.iter().copied());
    let mut settings = world.settings().clone();
    settings.tick_rate_hz = w.tick_rate_hz;
    settings.admin_absent_days = w.admin_absent_days.unwrap_or(settings.admin_absent_days);
    settings.temp_admin_active_days = w.temp_admin_active_days.unwrap_or(settings.temp_admin_active_days);
    settings.epoch_ticks = w.epoch_ticks.unwrap_or(settings.epoch_ticks);
    settings.kick_cooldown_ms = w.kick_cooldown_secs.map_or(settings.kick_cooldown_ms, |s| s * 1000);
    settings.aoi_radius_m = w.aoi_radius_m.unwrap_or(settings.aoi_radius_m);
    world.set_genesis_settings(settings);
    let host = RhaiHost::default();
    let mut objects = BTreeMap::new();
    for o in &spec.objects {
        let v = o.get_ref();
        if place.is_some_and(|p| !p.region.contains(v2(v.at))) {
            continue; // another sim's
        }
        let owner = v.owner.as_deref().map_or(account_of(&admin), |n| account_of(&account_key(n)));
        let id = add_object(&mut world, &host, v, owner, &opts.scripts_dir)?;
        objects.insert(v.name.clone(), id);
    }
    world.set_genesis_time(w.start_unix_ms);
    world.validate().map_err(|e| anyhow::anyhow!("the scenario's world is not valid: {e}"))?;
    Ok(Genesis { world, demo, objects })
}

/// Put one `[[objects]]` entry of a scenario or world file into a world being built, owned by
/// `owner`, with its script (`script = "FILE"` under `scripts_dir`) attached.
pub fn add_object(
    world: &mut World,
    host: &RhaiHost,
    v: &metatopia_scenarios::spec::ObjectSpec,
    owner: AccountId,
    scripts_dir: &Path,
) -> anyhow::Result<ObjectId> {
    let shape = if v.shape == "circle" {
        Shape::Circle { radius: fx(v.size[0]) }
    } else {
        Shape::Box { half_width: fx(v.size[0]), half_height: fx(v.size[1]) }
    };
    let color = u32::from_str_radix(&v.color, 16).unwrap_or(0x808080ff);
    let velocity = v.velocity.map_or(Vec2::ZERO, v2);
    let id = world.add_genesis_object(
        ObjectKind::Prim,
        owner,
        v.name.clone(),
        shape,
        v2(v.at),
        velocity,
        color,
        v.text.clone(),
    );
    if let Some(file) = &v.script {
        let path = scripts_dir.join(file);
        let src = std::fs::read_to_string(&path).with_context(|| format!("object {:?}: {}", v.name, path.display()))?;
        attach_script(world, host, id, owner, &src, &v.licence)
            .map_err(|e| anyhow::anyhow!("object {:?}: script {file}: {e}", v.name))?;
    }
    Ok(id)
}

/// A signer with its nonce and its last event (for `replay`).
struct Account {
    key: SigningKey,
    nonce: u64,
    last: Option<SignedEvent>,
}

/// Run a scenario in the deterministic cluster.
pub fn run(
    spec: &Scenario,
    text: &str,
    opts: &Options,
    progress: &mut dyn FnMut(Time, Time),
) -> anyhow::Result<(Report, Recording)> {
    if spec.world.sims > 1 {
        return crate::scenario_world::run(spec, text, opts, progress);
    }
    let seed = opts.seed;
    let n = spec.validators.count;
    let w = &spec.world;
    anyhow::ensure!(
        spec.bots.events_per_tick == 0 || w.random_players > 0,
        "bots need players: set world.random_players"
    );
    // Every node's key (validators first, then observers); the genesis set is the validators'.
    let total = n + spec.validators.observers;
    let keys: Vec<SigningKey> = (0..total).map(validator_key).collect();
    let public: Vec<_> = keys.iter().map(|k| k.verifying_key()).collect();
    let genesis_set: Vec<_> = public[..usize::from(n)].to_vec();
    let accounts: Vec<AccountId> = keys[..usize::from(n)].iter().map(account_of).collect();
    let g = genesis(spec, seed, opts, &accounts)?;
    let faults: Vec<_> = spec.faults.iter().map(|f| f.get_ref().clone()).collect();
    let fault_of = |kind: &str| -> BTreeMap<u16, metatopia_scenarios::spec::FaultSpec> {
        faults.iter().filter(|f| f.kind == kind).filter_map(|f| f.node.map(|x| (x, f.clone()))).collect()
    };
    let (byzantine, twins, diverging) = (fault_of("byzantine"), fault_of("twin"), fault_of("diverge"));
    // Observers that start late, with nothing on disk, and join the running sim.
    let joiners: std::collections::BTreeSet<u16> = fault_of("join").into_keys().collect();

    let period_us = 1_000_000 / u64::from(w.tick_rate_hz);
    let cfg = consensus_config(period_us, w.start_unix_ms);
    // The nodes' clocks start at the scenario's real-looking time.
    let start_us = w.start_unix_ms.saturating_mul(1000);
    let epoch_ticks = g.world.settings().epoch_ticks;
    // Cluster nodes: the validators, the observers, then a twin per `twin` fault.
    let mut nodes_of: BTreeMap<u16, Vec<NodeId>> = (0..total).map(|i| (i, vec![u32::from(i)])).collect();
    let mut key_of_node: Vec<u16> = (0..total).collect();
    for t in twins.keys() {
        let id = key_of_node.len() as NodeId;
        nodes_of.entry(*t).or_default().push(id);
        key_of_node.push(*t);
    }
    let nodes_of = Arc::new(nodes_of);
    let other_world = || -> anyhow::Result<World> {
        let other = Scenario { seed: seed ^ 0xd1fe, ..spec.clone() };
        Ok(genesis(&other, seed ^ 0xd1fe, opts, &accounts)?.world)
    };
    let make = |node: usize, world: World, actor: Actor| -> anyhow::Result<Node> {
        let sim = Sim::new(world, RhaiHost::default(), AnyPhysics::of(&w.physics), 1)
            .map_err(|e| anyhow::anyhow!("node {node}: {e}"))?;
        let core = NodeCore::new(actor, sim, 1).with_time_scale(w.time_scale, w.start_unix_ms).defer_execution();
        Ok(CoreProcess::new(core, nodes_of.clone()))
    };
    let mut procs = Vec::new();
    for (node, k) in key_of_node.iter().enumerate() {
        let k = *k;
        let actor = match byzantine.get(&k) {
            Some(f) => {
                let behaviour = match f.behaviour.as_deref() {
                    Some("equivocate") => Behaviour::Equivocate,
                    Some("double_vote") => Behaviour::DoubleVote,
                    Some("invalid_signatures") => Behaviour::InvalidSignatures,
                    _ => Behaviour::Withhold,
                };
                let c = Config { max_exec_lag: None, ..cfg.clone() };
                Actor::Byz(
                    Box::new(Byzantine::new(c, keys[k as usize].clone(), genesis_set.clone(), start_us, behaviour)),
                    n as usize,
                )
            }
            None => Actor::Epochs(Box::new(Epochs::new(
                cfg.clone(),
                keys[k as usize].clone(),
                public.clone(),
                genesis_set.clone(),
                epoch_ticks,
                start_us,
            ))),
        };
        let world = if diverging.contains_key(&k) { other_world()? } else { g.world.clone() };
        procs.push(make(node, world, actor)?);
    }
    let mut c = Cluster::starting_at(seed, net_config(spec), procs, start_us);
    // A crashed node comes back from its "disk": consensus state and commit log.
    {
        let (cfg, keys, public, genesis_world) = (cfg.clone(), keys.clone(), public.clone(), g.world.clone());
        let (physics, scale, nodes_of) = (w.physics.clone(), w.time_scale, nodes_of.clone());
        let anchor_ms = w.start_unix_ms;
        let key_of_node = key_of_node.clone();
        let genesis_n = usize::from(n);
        let joiners = joiners.clone();
        c.set_restarter(Box::new(move |id, now, saved| {
            let k = key_of_node[id as usize] as usize;
            let saved: Saved = saved.and_then(|b| postcard::from_bytes(&b).ok()).unwrap_or_default();
            // A joiner's first start: nothing of its own yet.
            let join = joiners.contains(&(k as u16)) && saved.log.is_empty();
            let fresh = || {
                let set = public[..genesis_n].to_vec();
                Epochs::new(cfg.clone(), keys[k].clone(), public.clone(), set, epoch_ticks, now)
            };
            let e = match &saved.consensus {
                Some(b) if !join => {
                    Epochs::restore(cfg.clone(), keys[k].clone(), public.clone(), now, b).unwrap_or_else(fresh)
                }
                _ => fresh(),
            };
            let sim = Sim::new(genesis_world.clone(), RhaiHost::default(), AnyPhysics::of(&physics), 1)
                .expect("the genesis world loaded before");
            let mut core =
                NodeCore::new(Actor::Epochs(Box::new(e)), sim, 1).with_time_scale(scale, anchor_ms).defer_execution();
            if join {
                core = core.joining();
            }
            let mut log = Vec::new();
            for rec in &saved.log {
                if core.replay(rec).is_err() {
                    break;
                }
                log.push(CoreOutput::Committed(Box::new(rec.clone())));
            }
            core.recall(&saved.log);
            let mut p = CoreProcess::new(core, nodes_of.clone());
            p.log = log;
            p
        }));
    }
    for f in &faults {
        if !schedule_network_fault(&mut c, f) && f.kind == "join" {
            // Down from the start (before it has done anything), up at `at_secs`.
            let node = NodeId::from(f.node.unwrap_or_default());
            c.schedule_fault(0, Fault::Crash(node));
            c.schedule_fault(((f.at_secs * 1e6) as Time).max(1), Fault::Restart(node));
        }
    }
    let honest: Vec<NodeId> = (0..total)
        .filter(|k| !byzantine.contains_key(k) && !twins.contains_key(k) && !diverging.contains_key(k))
        .map(NodeId::from)
        .collect();

    // Drive: every tick period, submit the steps that are due and the bots' events.
    let mut accounts: BTreeMap<String, Account> = spec
        .accounts
        .iter()
        .map(|a| (a.get_ref().name.clone(), Account { key: account_key(&a.get_ref().name), nonce: 0, last: None }))
        .collect();
    let mut steps: Vec<(usize, &metatopia_scenarios::spec::StepSpec)> =
        spec.steps.iter().map(|s| (Scenario::line_of(text, s.span()), s.get_ref())).collect();
    steps.sort_by_key(|(_, s)| s.at_tick);
    let mut pending = std::collections::VecDeque::from(steps);
    let mut labelled: BTreeMap<String, EventId> = BTreeMap::new();
    // Steps a node refused at the door, with the reason.
    let mut at_door: BTreeMap<String, String> = BTreeMap::new();
    let mut submitted = 0;
    let mut bots = (spec.bots.events_per_tick > 0).then(|| EventGen::new(&g.demo, seed ^ 0xb075));
    let mut roles: BTreeMap<usize, Verdict> = BTreeMap::new();
    let end = (spec.duration_secs * 1e6) as Time;
    let mut t = 0;
    while t < end {
        t = (t + period_us).min(end);
        c.run_until(t, |_| {});
        progress(t, end);
        // Steps due at the `via` node's tick (it must be up).
        while let Some((line, s)) = pending.front().copied() {
            let via = NodeId::from(s.via);
            let Some(p) = c.node(via) else { break };
            if p.core.sim().world().tick().0 < s.at_tick {
                break;
            }
            pending.pop_front();
            let acc = accounts.get_mut(&s.by).expect("checked by the spec");
            let event = match s.action {
                Action::Replay => match acc.last.clone() {
                    Some(e) => e,
                    None => anyhow::bail!("line {line}: {} has nothing to replay yet", s.by),
                },
                _ => {
                    let avatar = p.core.sim().world().account(&account_of(&acc.key)).and_then(|a| a.avatar);
                    let payload =
                        payload(s, &g.objects, avatar, opts, &public).with_context(|| format!("line {line}"))?;
                    acc.nonce += 1;
                    SignedEvent::new(&acc.key, SimId(1), acc.nonce, payload)
                }
            };
            if let Some(l) = &s.label {
                labelled.insert(l.clone(), event.id());
            }
            acc.last = Some(event.clone());
            let bytes = metatopia_sim::codec::encode(&event);
            let size = bytes.len() as u32;
            let mut taken = 1;
            c.with_node(via, |p, now, out| {
                taken = p.submit(now, vec![bytes], out);
                // Refused at the door (what execution would refuse anyway): an outcome too.
                if taken == 0
                    && let Some(l) = &s.label
                {
                    let why = metatopia_sim::pipeline::check_at_door(p.core.sim().world(), &event, size)
                        .err()
                        .map_or_else(|| "refused at the door".to_owned(), |r| format!("refused at the door: {r}"));
                    at_door.insert(l.clone(), why);
                }
            });
            submitted += 1;
        }
        if let Some(b) = bots.as_mut() {
            let via = NodeId::from(spec.bots.node);
            c.with_node(via, |p, now, out| {
                let w = p.core.sim().world();
                let batch = b.batch(w, w.tick(), spec.bots.events_per_tick as usize);
                p.submit(now, batch.events.iter().map(metatopia_sim::codec::encode).collect(), out);
            });
        }
        // Roles at their tick, on the first honest node that is there.
        for e in &spec.expect {
            let v = e.get_ref();
            let line = Scenario::line_of(text, e.span());
            if v.kind != "role" || roles.contains_key(&line) {
                continue;
            }
            let at_tick = v.at_tick.unwrap_or_default();
            let Some(world) =
                honest.iter().filter_map(|h| c.node(*h)).map(|p| p.core.sim().world()).find(|w| w.tick().0 >= at_tick)
            else {
                continue;
            };
            let who = account_of(&account_key(v.account.as_deref().unwrap_or_default()));
            let role = match role_of(world, &who, world.time_ms()) {
                Role::Admin => "admin",
                Role::TempAdmin => "temp_admin",
                Role::Member => "member",
            };
            let want = v.role.as_deref().unwrap_or_default();
            roles.insert(
                line,
                Verdict {
                    line,
                    what: format!("{} is {want} at tick {at_tick}", v.account.as_deref().unwrap_or_default()),
                    ok: role == want,
                    detail: format!(
                        "{role} at tick {} (day {:.1} after genesis)",
                        world.tick(),
                        world.time_ms().saturating_sub(world.governance().genesis_ms) as f64 / DAY_MS as f64
                    ),
                },
            );
        }
    }

    let verdicts = judge(spec, text, &c, &honest, &g, (&labelled, &at_door), roles)?;
    let ticks = (0..c.len() as NodeId).map(|i| c.node(i).map(|p| p.core.sim().world().tick().0)).collect();
    let report = Report {
        name: spec.name.clone(),
        seed,
        ticks,
        honest: honest.clone(),
        steps_submitted: submitted,
        trace: metatopia_sim::ids::hex(&c.trace_hash()),
        verdicts,
        net: c.stats(),
    };
    // The recording: the first honest node that is up.
    let rec_node = honest.iter().find_map(|h| c.node(*h)).context("no honest node is up at the end")?;
    Ok((report, recording(rec_node, &g.world, w)?))
}

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
        max_event_bytes: crate::core::MAX_BLOCK_EVENT_BYTES as usize,
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
    let mut ticks = Vec::new();
    for o in &node.log {
        if let CoreOutput::Committed(r) = o
            && let Some(root) = roots.get(&Tick(r.tick))
        {
            ticks.push(((**r).clone(), *root));
        }
    }
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

fn judge(
    spec: &Scenario,
    text: &str,
    c: &Cluster<Node>,
    honest: &[NodeId],
    g: &Genesis,
    (labelled, at_door): (&BTreeMap<String, EventId>, &BTreeMap<String, String>),
    mut roles: BTreeMap<usize, Verdict>,
) -> anyhow::Result<Vec<Verdict>> {
    let up: Vec<&Node> = honest.iter().filter_map(|h| c.node(*h)).collect();
    let first = *up.first().context("no honest node is up at the end")?;
    let all_roots: Vec<BTreeMap<Tick, Hash32>> = up.iter().map(|p| p.executed_roots()).collect();
    let mut out = Vec::new();
    // Always: the honest nodes agree wherever they both executed a tick.
    let mut agree = (true, String::from("no common ticks"));
    let mut compared = 0;
    'outer: for (i, a) in all_roots.iter().enumerate() {
        for b in &all_roots[i + 1..] {
            for (t, r) in a {
                if let Some(r2) = b.get(t) {
                    compared += 1;
                    if r != r2 {
                        agree = (false, format!("roots differ at tick {t}"));
                        break 'outer;
                    }
                }
            }
        }
    }
    if agree.0 {
        agree.1 = format!("{compared} tick roots compared across {} honest nodes", up.len());
    }
    out.push(Verdict {
        line: 0,
        what: "honest nodes agree (always checked)".into(),
        ok: agree.0,
        detail: agree.1.clone(),
    });
    for e in &spec.expect {
        let v = e.get_ref();
        let line = Scenario::line_of(text, e.span());
        let verdict = |what: String, ok: bool, detail: String| Verdict { line, what, ok, detail };
        let vd = match v.kind.as_str() {
            "roots_equal" => {
                verdict("roots equal on every honest node".into(), agree.0 && compared > 0, agree.1.clone())
            }
            "min_ticks" => {
                let want = v.ticks.unwrap_or_default();
                let got: Vec<u64> = up.iter().map(|p| p.core.sim().world().tick().0).collect();
                verdict(
                    format!("every honest node executed {want} ticks"),
                    got.iter().all(|t| *t >= want),
                    format!("{got:?}"),
                )
            }
            "no_desync" => {
                let bad: Vec<_> = up.iter().filter_map(|p| p.core.desynced()).collect();
                verdict("no honest node diverged".into(), bad.is_empty(), format!("{bad:?}"))
            }
            "desync" => {
                let node = NodeId::from(v.node.unwrap_or_default());
                let at = c.node(node).and_then(|p| {
                    p.log.iter().find_map(|o| match o {
                        CoreOutput::Desync(r) => Some(r.tick),
                        _ => None,
                    })
                });
                verdict(format!("node {node} noticed it diverged"), at.is_some(), format!("at tick {at:?}"))
            }
            "validator" | "observer" => {
                let node = NodeId::from(v.node.unwrap_or_default());
                let votes = c.node(node).and_then(|p| match p.core.agreement() {
                    Actor::Epochs(e) => Some((e.index().is_some(), e.epoch())),
                    _ => None,
                });
                let want = v.kind == "validator";
                let (ok, detail) = match votes {
                    Some((is, epoch)) => {
                        (is == want, format!("{} in epoch {epoch}", if is { "votes" } else { "follows" }))
                    }
                    None => (false, "down or not an honest node".to_owned()),
                };
                verdict(format!("node {node} {}", if want { "votes" } else { "only follows" }), ok, detail)
            }
            "joined" => {
                let node = NodeId::from(v.node.unwrap_or_default());
                let p = c.node(node);
                let at = p.and_then(|p| {
                    p.log.iter().find_map(|o| match o {
                        CoreOutput::Resynced { tick, certified_by, joined: true, .. } => Some((*tick, *certified_by)),
                        _ => None,
                    })
                });
                let (ok, detail) = match (p, at) {
                    (Some(p), Some((tick, by))) => {
                        let mine = p.executed_roots();
                        let first = mine.keys().next().map_or(0, |t| t.0);
                        let reference = &all_roots[0];
                        let bad = mine.iter().find(|(t, r)| reference.get(t).is_some_and(|h| h != *r));
                        match bad {
                            Some((t, _)) => (false, format!("joined at tick {tick}, but differs at tick {t}")),
                            None if first < tick => (false, format!("executed tick {first}, before its snapshot")),
                            None => (
                                mine.len() > 1,
                                format!("from tick {tick} (certified by {by}); {} ticks in step since", mine.len()),
                            ),
                        }
                    }
                    _ => (false, "never joined".to_owned()),
                };
                verdict(format!("node {node} joined from a snapshot and agrees"), ok, detail)
            }
            "resynced" => {
                let node = NodeId::from(v.node.unwrap_or_default());
                let p = c.node(node);
                let at = p.and_then(|p| {
                    p.log.iter().find_map(|o| match o {
                        CoreOutput::Resynced { tick, certified_by, .. } => Some((*tick, *certified_by)),
                        _ => None,
                    })
                });
                let (ok, detail) = match (p, at) {
                    (Some(p), Some((tick, by))) => {
                        let mine = p.executed_roots();
                        let after: Vec<_> = mine.range(Tick(tick)..).collect();
                        let reference = &all_roots[0];
                        let bad = after.iter().find(|(t, r)| reference.get(t).is_some_and(|h| h != *r));
                        match bad {
                            Some((t, _)) => (false, format!("resynced at tick {tick}, but differs at tick {t}")),
                            None => (
                                !after.is_empty(),
                                format!("from tick {tick} (certified by {by}); {} ticks in step since", after.len()),
                            ),
                        }
                    }
                    _ => (false, "never resynced".to_owned()),
                };
                verdict(format!("node {node} resynced and agrees"), ok, detail)
            }
            "objects" => {
                let want = v.count.unwrap_or_default();
                let got = first.core.sim().world().objects().len() as u64;
                verdict(format!("{want} objects at the end"), got == want, format!("{got}"))
            }
            "object_text" => {
                let name = v.object.as_deref().unwrap_or_default();
                let want = v.text.as_deref().unwrap_or_default();
                let got =
                    g.objects.get(name).and_then(|id| first.core.sim().world().object(*id)).map(|o| o.text.clone());
                verdict(format!("{name} shows {want:?}"), got.as_deref() == Some(want), format!("{got:?}"))
            }
            "chat_seen" => {
                let want = v.text.as_deref().unwrap_or_default();
                let seen: Vec<bool> = up
                    .iter()
                    .map(|p| {
                        p.log.iter().any(|o| {
                            matches!(o, CoreOutput::Executed { chat, .. } if chat.iter().any(|l| l.text.contains(want)))
                        })
                    })
                    .collect();
                verdict(format!("chat {want:?} seen"), seen.iter().all(|s| *s), format!("on nodes: {seen:?}"))
            }
            "outcome" => {
                let label = v.step.as_deref().unwrap_or_default();
                let id = labelled.get(label);
                let got: Vec<Option<Outcome>> = match at_door.get(label) {
                    Some(why) => up.iter().map(|_| Some(Outcome::Refused { tick: 0, reason: why.clone() })).collect(),
                    None => up.iter().map(|p| id.and_then(|id| p.core.outcome(id).cloned())).collect(),
                };
                let want = v.status.as_deref().unwrap_or_default();
                let reason = v.reason.as_deref().unwrap_or_default();
                let ok = outcome_holds(&got, want, reason);
                let detail = match &got[0] {
                    None if id.is_none() => "the step was never submitted".to_owned(),
                    other => format!("{other:?}"),
                };
                verdict(format!("step {label} {want}"), ok, detail)
            }
            "role" => roles.remove(&line).unwrap_or_else(|| {
                verdict(
                    format!(
                        "{} is {} at tick {}",
                        v.account.as_deref().unwrap_or_default(),
                        v.role.as_deref().unwrap_or_default(),
                        v.at_tick.unwrap_or_default()
                    ),
                    false,
                    "the sim never reached that tick".into(),
                )
            }),
            other => anyhow::bail!("line {line}: unknown expectation {other:?}"),
        };
        out.push(vd);
    }
    Ok(out)
}

/// An `outcome` expectation: every node saw the same outcome, of the wanted status (`executed`
/// or `refused`), and a refusal's reason contains `reason`.
pub fn outcome_holds(got: &[Option<Outcome>], want: &str, reason: &str) -> bool {
    got.iter().all(|o| *o == got[0])
        && match got.first().and_then(Option::as_ref) {
            Some(Outcome::Executed { .. }) => want == "executed",
            Some(Outcome::Refused { reason: r, .. }) => want == "refused" && r.contains(reason),
            None => false,
        }
}

/// Agreement for re-execution alone: nothing to agree on.
#[derive(Debug, Default)]
pub struct NoAgreement;

impl Agreement for NoAgreement {
    fn handle_message(&mut self, _: Micros, _: ValidatorIndex, _: Message) {}
    fn handle_timeout(&mut self, _: Micros) {}
    fn submit_events(&mut self, _: Micros, _: Vec<Vec<u8>>) {}
    fn poll_output(&mut self) -> Option<Output> {
        None
    }
    fn poll_timeout(&self) -> Option<Micros> {
        None
    }
    fn report_root(&mut self, _: u64, _: Digest) {}
    fn validators(&self) -> usize {
        4
    }
}

/// A recording's core, on its genesis time (where its accelerated time counts from).
fn replay_core(r: &Recording, sim: Sim<RhaiHost, AnyPhysics>) -> NodeCore<NoAgreement, RhaiHost, AnyPhysics> {
    let anchor_ms = sim.world().governance().genesis_ms;
    NodeCore::new(NoAgreement, sim, 1).with_time_scale(r.time_scale, anchor_ms)
}

fn load_sim(r: &Recording) -> anyhow::Result<Sim<RhaiHost, AnyPhysics>> {
    let snap = Snapshot::decode(&r.genesis, 1 << 30).map_err(|e| anyhow::anyhow!("the recording's genesis: {e}"))?;
    Sim::restore(snap, RhaiHost::default(), AnyPhysics::of(&r.physics), 1).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Re-execute a recording from genesis; the number of ticks whose roots matched, or the first
/// that did not.
pub fn replay_verify(r: &Recording) -> anyhow::Result<usize> {
    let mut core = replay_core(r, load_sim(r)?);
    for (rec, root) in &r.ticks {
        let got = core.replay(rec).map_err(|e| anyhow::anyhow!("tick {}: {e}", rec.tick))?;
        anyhow::ensure!(got == *root, "tick {}: replayed root {got} differs from the recorded {root}", rec.tick);
    }
    Ok(r.ticks.len())
}

/// SyncTest: every tick is executed, then executed again from a snapshot of the state before
/// it; both roots must equal the recorded one.
pub fn synctest(r: &Recording) -> anyhow::Result<usize> {
    let mut core = replay_core(r, load_sim(r)?);
    for (rec, root) in &r.ticks {
        let before = core.snapshot();
        let first = core.replay(rec).map_err(|e| anyhow::anyhow!("tick {}: {e}", rec.tick))?;
        let sim = Sim::restore(before, RhaiHost::default(), AnyPhysics::of(&r.physics), 1)
            .map_err(|e| anyhow::anyhow!("tick {}: restoring the snapshot before it: {e}", rec.tick))?;
        let mut again = replay_core(r, sim);
        let second = again.replay(rec).map_err(|e| anyhow::anyhow!("tick {} again: {e}", rec.tick))?;
        anyhow::ensure!(
            first == second && first == *root,
            "tick {}: executed {first}, from the snapshot before it {second}, recorded {root}",
            rec.tick
        );
    }
    Ok(r.ticks.len())
}

/// Read a scenario file.
pub fn load(path: &Path) -> anyhow::Result<(Scenario, String)> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let spec = Scenario::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((spec, text))
}

/// The example scripts of `scenarios/scripts/` (rhai, AGPL-3.0-or-later), built in.
pub const EXAMPLE_SCRIPTS: [(&str, &str); 5] = [
    ("door", include_str!("../../scenarios/scripts/door.rhai")),
    ("echo", include_str!("../../scenarios/scripts/echo.rhai")),
    ("counter", include_str!("../../scenarios/scripts/counter.rhai")),
    ("greeter", include_str!("../../scenarios/scripts/greeter.rhai")),
    ("ball", include_str!("../../scenarios/scripts/ball.rhai")),
];

/// The node's default world: the seeded demo world, with one prim in `every` carrying one of
/// the example rhai scripts (in turn) by its owner.
pub fn rhai_demo_world(spec: DemoSpec, every: usize) -> anyhow::Result<DemoWorld> {
    let mut demo = demo_world(DemoSpec { scripted_per_mille: 0, ..spec });
    let host = RhaiHost::default();
    let prims: Vec<(ObjectId, AccountId)> =
        demo.world.objects().values().filter(|o| o.kind == ObjectKind::Prim).map(|o| (o.id, o.owner)).collect();
    for (n, (id, owner)) in prims.into_iter().enumerate().filter(|(n, _)| n % every.max(1) == 0) {
        let (name, src) = EXAMPLE_SCRIPTS[(n / every.max(1)) % EXAMPLE_SCRIPTS.len()];
        attach_script(&mut demo.world, &host, id, owner, src, "AGPL-3.0-or-later")
            .map_err(|e| anyhow::anyhow!("the example script {name}: {e}"))?;
    }
    Ok(demo)
}
