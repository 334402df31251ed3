//! Worlds from files: a scenario or world file (`scenarios/README.md`) built into the genesis
//! world of a sim (its objects, scripts, accounts and settings), and the physics stage a sim
//! runs. `sim new` builds an operator's genesis with it, the devnet its demo sims, and the lab's
//! scenario runner its clusters.

pub mod demo;
pub mod error;
pub mod genesis;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use error::{Bad, Result, WorldError};

use metatopia_consensus::SigningKey;
use metatopia_physics::RegionStage;
use metatopia_scenarios::spec::Scenario;
use metatopia_scripting::RhaiHost;
use metatopia_sim::event::account_of;
use metatopia_sim::genesis::{DemoSpec, DemoWorld, attach_script, demo_world};
use metatopia_sim::host::{PhysicsCommand, PhysicsError, PhysicsOutput, PhysicsStage};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::state::{BodyKind, ObjectKind, Shape};
use metatopia_sim::{AccountId, Fx, Hash32, ObjectId, SimId, Vec2, World};

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

/// How to run a scenario.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Where `script = "…"` files are (`scenarios/scripts/`).
    pub scripts_dir: PathBuf,
    /// Print every node's tick and agreement, once a second of the run (to stderr).
    pub timeline: bool,
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
pub fn fx(x: f64) -> Fx {
    Fx::from_bits((x * 65_536.0).round() as i64)
}

pub fn v2(a: [f64; 2]) -> Vec2 {
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
pub fn genesis(spec: &Scenario, seed: u64, opts: &Options, validators: &[AccountId]) -> Result<Genesis> {
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

/// [`genesis`](fn@genesis) for one sim of several (`place`), or the lone sim (`None`). A sim of several
/// starts with the scenario's objects whose `at` is in its region, and no demo accounts.
pub fn genesis_in(
    spec: &Scenario,
    seed: u64,
    opts: &Options,
    validators: &[AccountId],
    place: Option<&Place>,
) -> Result<Genesis> {
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
            world
                .set_genesis_neighbours(p.neighbours.clone(), p.bounds)
                .bad(|| format!("sim {}'s neighbours", p.sim.0))?;
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
                let text = o.text.clone();
                world.add_genesis_object(o.kind, o.owner, name, o.shape, at, o.velocity, o.color, text, o.body);
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
    world.validate().bad(|| "the scenario's world is not valid".to_owned())?;
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
) -> Result<ObjectId> {
    let shape = if v.shape == "circle" {
        Shape::Circle { radius: fx(v.size[0]) }
    } else {
        Shape::Box { half_width: fx(v.size[0]), half_height: fx(v.size[1]) }
    };
    let color = u32::from_str_radix(&v.color, 16).unwrap_or(0x808080ff);
    let velocity = v.velocity.map_or(Vec2::ZERO, v2);
    let body = match v.body.as_deref() {
        None if v.velocity.is_some() => BodyKind::Dynamic,
        None => BodyKind::Static,
        Some(b) => BodyKind::parse(b).ok_or_else(|| {
            WorldError::Invalid(format!("object {:?}: body is static, kinematic or dynamic, not {b:?}", v.name))
        })?,
    };
    let id = world.add_genesis_object(
        ObjectKind::Prim,
        owner,
        v.name.clone(),
        shape,
        v2(v.at),
        velocity,
        color,
        v.text.clone(),
        body,
    );
    if let Some(file) = &v.script {
        let path = scripts_dir.join(file);
        let src = std::fs::read_to_string(&path).bad(|| format!("object {:?}: {}", v.name, path.display()))?;
        attach_script(world, host, id, owner, &src, &v.licence)
            .bad(|| format!("object {:?}: script {file}", v.name))?;
    }
    Ok(id)
}

/// Read a scenario file.
pub fn load(path: &Path) -> Result<(Scenario, String)> {
    let text = std::fs::read_to_string(path).bad(|| format!("reading {}", path.display()))?;
    let spec = Scenario::parse(&text).bad(|| format!("{}", path.display()))?;
    Ok((spec, text))
}

/// The example scripts of `scenarios/scripts/` (rhai, AGPL-3.0-or-later), built in.
pub const EXAMPLE_SCRIPTS: [(&str, &str); 5] = [
    ("door", include_str!("../../../scenarios/scripts/door.rhai")),
    ("echo", include_str!("../../../scenarios/scripts/echo.rhai")),
    ("counter", include_str!("../../../scenarios/scripts/counter.rhai")),
    ("greeter", include_str!("../../../scenarios/scripts/greeter.rhai")),
    ("ball", include_str!("../../../scenarios/scripts/ball.rhai")),
];

/// The node's default world: the seeded demo world, with one prim in `every` carrying one of
/// the example rhai scripts (in turn) by its owner.
pub fn rhai_demo_world(spec: DemoSpec, every: usize) -> Result<DemoWorld> {
    let mut demo = demo_world(DemoSpec { scripted_per_mille: 0, ..spec });
    let host = RhaiHost::default();
    let prims: Vec<(ObjectId, AccountId)> =
        demo.world.objects().values().filter(|o| o.kind == ObjectKind::Prim).map(|o| (o.id, o.owner)).collect();
    for (n, (id, owner)) in prims.into_iter().enumerate().filter(|(n, _)| n % every.max(1) == 0) {
        let (name, src) = EXAMPLE_SCRIPTS[(n / every.max(1)) % EXAMPLE_SCRIPTS.len()];
        attach_script(&mut demo.world, &host, id, owner, src, "AGPL-3.0-or-later")
            .bad(|| format!("the example script {name}"))?;
    }
    Ok(demo)
}
