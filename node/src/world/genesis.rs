//! A sim's genesis (DESIGN §10, "genesis belongs to the operator"): the file `genesis.bin` in
//! every node's data directory, the same bytes on every node of the sim.
//!
//! It holds the sim's state at tick 0 (a snapshot: region, settings, the admin's key and account,
//! the genesis validators, objects and scripts), the physics stage that runs it, and where the
//! genesis validators listen. Its **hash** covers the physics and the state, not the addresses
//! (nodes move; a sim does not): a node's config names the hash, a join address may too
//! (`KEY@HOST:PORT/HASH`), and a node refuses a genesis whose hash differs.
//!
//! `metatopia sim new` makes one from a world file (the `[world]` and `[[objects]]` of a
//! scenario file) with the operator's admin key and the real time as its BFT time; the devnet
//! and the tests make theirs from demo worlds, which only a config marked `world.demo = true`
//! may use.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use metatopia_scenarios::spec::{ObjectSpec, WorldSpec};
use metatopia_scripting::RhaiHost;
use metatopia_sim::state::{Genesis as WorldGenesis, Region, World};
use metatopia_sim::{AccountId, Fx, SimId, Snapshot, Vec2};
use serde::{Deserialize, Serialize};

use crate::world::AnyPhysics;
use crate::world::error::{Bad, Result, WorldError, ensure};

/// The genesis file's name in a data directory.
pub const FILE: &str = "genesis.bin";
/// The format this build writes and reads.
pub const FORMAT: u16 = 2;
/// A genesis file larger than this is refused (it is read whole, and sent to joining nodes).
pub const MAX_BYTES: usize = 64 << 20;
/// Contacts a genesis may list (validators are at most 100).
const MAX_CONTACTS: usize = 100;

/// Where a genesis validator listens (a hint for the nodes' configs; outside the hash).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contact {
    pub key: [u8; 32],
    pub address: SocketAddr,
    pub quic: Option<SocketAddr>,
}

/// The file as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Stored {
    format: u16,
    physics: String,
    /// Sim milliseconds per BFT millisecond (1: real time; tests make governance days pass faster).
    time_scale: u64,
    contacts: Vec<Contact>,
    /// The tick-0 [`Snapshot`], encoded.
    #[serde(with = "serde_bytes")]
    snapshot: Vec<u8>,
}

/// A genesis read and checked.
#[derive(Clone, Debug)]
pub struct Genesis {
    /// `rapier` or `kinematic`.
    pub physics: String,
    /// Sim milliseconds per BFT millisecond (1: real time).
    pub time_scale: u64,
    pub contacts: Vec<Contact>,
    pub snapshot: Snapshot,
    pub hash: GenesisHash,
    /// The file's bytes (what joining nodes are sent).
    pub bytes: Vec<u8>,
}

/// The hash that names a genesis: blake3 over its physics and its state.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct GenesisHash(pub [u8; 32]);

impl std::fmt::Display for GenesisHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&metatopia_sim::ids::hex(&self.0))
    }
}

impl std::str::FromStr for GenesisHash {
    type Err = WorldError;
    fn from_str(s: &str) -> Result<GenesisHash> {
        let bytes = crate::config::parse_hex32(s).bad(|| "a genesis hash is 64 hex digits".to_owned())?;
        Ok(GenesisHash(bytes))
    }
}

fn hash_of(physics: &str, time_scale: u64, snapshot: &[u8]) -> GenesisHash {
    let mut h = blake3::Hasher::new();
    h.update(b"metatopia genesis\0");
    h.update(&time_scale.to_le_bytes());
    h.update(&(physics.len() as u64).to_le_bytes());
    h.update(physics.as_bytes());
    h.update(snapshot);
    GenesisHash(*h.finalize().as_bytes())
}

impl Genesis {
    /// The genesis of a world at tick 0, run by `physics`: its physics state is loaded once so the
    /// snapshot carries it, as every node will have it.
    pub fn of_world(world: World, physics: &str, time_scale: u64, contacts: Vec<Contact>) -> Result<Genesis> {
        ensure!(world.tick().0 == 0, "a genesis is a world at tick 0, not {}", world.tick());
        world.validate().bad(|| "the genesis world is not valid".to_owned())?;
        let mut sim = metatopia_sim::Sim::new(world, RhaiHost::default(), AnyPhysics::of(physics), 1)
            .bad(|| "loading the genesis world's physics".to_owned())?;
        let snapshot = sim.snapshot();
        let stored =
            Stored { format: FORMAT, physics: physics.to_owned(), time_scale, contacts, snapshot: snapshot.encode() };
        let bytes = postcard::to_allocvec(&stored).bad(|| "encoding the genesis".to_owned())?;
        Genesis::decode(&bytes)
    }

    /// Read and check untrusted bytes (a file, or a peer's answer to a joining node).
    pub fn decode(bytes: &[u8]) -> Result<Genesis> {
        ensure!(bytes.len() <= MAX_BYTES, "a genesis is at most {MAX_BYTES} bytes, this one has {}", bytes.len());
        let stored: Stored = postcard::from_bytes(bytes).bad(|| "the genesis does not decode".to_owned())?;
        ensure!(stored.format == FORMAT, "the genesis is in format {}, this node reads format {FORMAT}", stored.format);
        ensure!(
            stored.physics == "rapier" || stored.physics == "kinematic",
            "the genesis names physics {:?} (rapier or kinematic)",
            stored.physics
        );
        ensure!(
            (1..=1_000_000).contains(&stored.time_scale),
            "the genesis's time scale is {} (1..=1000000)",
            stored.time_scale
        );
        ensure!(stored.contacts.len() <= MAX_CONTACTS, "the genesis lists more than {MAX_CONTACTS} contacts");
        let snapshot = Snapshot::decode(&stored.snapshot, MAX_BYTES as u32).bad(|| "the genesis state".to_owned())?;
        let w = &snapshot.world;
        ensure!(w.tick().0 == 0, "the genesis state is at {}, not tick 0", w.tick());
        let validators = &w.governance().validators;
        ensure!(validators.len() >= 4, "the genesis names {} validators; a sim needs at least 4", validators.len());
        for c in &stored.contacts {
            ensure!(
                validators.contains(&AccountId(c.key)),
                "the genesis lists a contact ({}) that is not one of its validators",
                metatopia_sim::ids::hex(&c.key)
            );
        }
        // The state must be what it claims to be (its root), physics included.
        metatopia_sim::Sim::restore(snapshot.clone(), RhaiHost::default(), AnyPhysics::of(&stored.physics), 1)
            .bad(|| "the genesis state does not load".to_owned())?;
        let hash = hash_of(&stored.physics, stored.time_scale, &stored.snapshot);
        Ok(Genesis {
            physics: stored.physics,
            time_scale: stored.time_scale,
            contacts: stored.contacts,
            snapshot,
            hash,
            bytes: bytes.to_vec(),
        })
    }

    /// The genesis of a data directory, if it has one.
    pub fn read(dir: &Path) -> Result<Option<Genesis>> {
        let path = dir.join(FILE);
        match std::fs::read(&path) {
            Ok(bytes) => Genesis::decode(&bytes).bad(|| format!("reading {}", path.display())).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).bad(|| format!("reading {}", path.display())),
        }
    }

    /// Write it into a data directory (atomically).
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        let path = dir.join(FILE);
        crate::store::write_atomic(&path, &self.bytes)?;
        Ok(path)
    }

    pub fn world(&self) -> &World {
        &self.snapshot.world
    }

    /// BFT time of genesis, Unix milliseconds.
    pub fn time_ms(&self) -> u64 {
        self.world().governance().genesis_ms
    }

    /// A few lines for a person: what this genesis is.
    pub fn describe(&self) -> String {
        let w = self.world();
        let scale = if self.time_scale == 1 { String::new() } else { format!(", time {}x", self.time_scale) };
        format!(
            "{} ({} m square at ({}, {}), {} physics), created {}, admin {}, {} validators, {} objects, {} scripts, {} Hz{scale}; genesis hash {}",
            w.sim(),
            w.region().size.floor_int(),
            w.region().origin.x.floor_int(),
            w.region().origin.y.floor_int(),
            self.physics,
            crate::when::date(self.time_ms()),
            metatopia_sim::ids::hex(&w.governance().admin.0),
            w.governance().validators.len(),
            w.objects().len(),
            w.scripts().len(),
            w.settings().tick_rate_hz,
            self.hash
        )
    }
}

/// A world file: the `[world]` and `[[objects]]` tables of a scenario file, for one sim made by
/// its operator. Objects belong to the admin unless `owner` is an account key (64 hex digits);
/// `script = "FILE"` is read from beside the world file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorldFile {
    #[serde(default)]
    pub world: WorldSpec,
    #[serde(default)]
    pub objects: Vec<ObjectSpec>,
}

impl WorldFile {
    pub fn load(path: &Path) -> Result<WorldFile> {
        let text = std::fs::read_to_string(path).bad(|| format!("reading {}", path.display()))?;
        let wf: WorldFile = toml::from_str(&text).bad(|| format!("{}", path.display()))?;
        wf.check().bad(|| format!("checking {}", path.display()))?;
        Ok(wf)
    }

    fn check(&self) -> Result<()> {
        let w = &self.world;
        ensure!(w.sims == 1, "world.sims: a world file describes one sim (`sim new` makes one sim at a time)");
        ensure!(
            w.random_objects == 0 && w.random_players == 0,
            "world.random_objects and world.random_players are for demo worlds (their owners' keys are public)"
        );
        ensure!((1..=240).contains(&w.tick_rate_hz), "world.tick_rate_hz must be 1..=240, not {}", w.tick_rate_hz);
        ensure!(
            (8..=4096).contains(&w.region_size),
            "world.region_size must be 8..=4096 metres, not {}",
            w.region_size
        );
        ensure!(
            w.physics == "kinematic" || w.physics == "rapier",
            "world.physics must be \"kinematic\" or \"rapier\", not {:?}",
            w.physics
        );
        ensure!(self.objects.len() <= 100_000, "at most 100,000 objects");
        for (i, o) in self.objects.iter().enumerate() {
            if let Some(owner) = &o.owner {
                crate::config::parse_hex32(owner)
                    .bad(|| format!("objects[{i}] ({:?}).owner must be an account key (64 hex digits)", o.name))?;
            }
        }
        Ok(())
    }
}

/// What `sim new` is asked for.
#[derive(Debug)]
pub struct NewSim<'a> {
    pub sim: SimId,
    pub admin: AccountId,
    pub validators: Vec<Contact>,
    pub world: Option<(&'a WorldFile, &'a Path)>,
    /// BFT time of genesis: the real time of creation, Unix milliseconds.
    pub time_ms: u64,
}

/// Build the genesis of a new sim owned by `admin`.
pub fn new_sim(n: NewSim<'_>) -> Result<Genesis> {
    let empty = WorldFile::default();
    let (wf, scripts_dir) = match n.world {
        Some((wf, path)) => (wf, path.parent().unwrap_or(Path::new(".")).to_owned()),
        None => (&empty, PathBuf::from(".")),
    };
    let spec = &wf.world;
    let mut settings = metatopia_sim::Settings { tick_rate_hz: spec.tick_rate_hz, ..Default::default() };
    settings.admin_absent_days = spec.admin_absent_days.unwrap_or(settings.admin_absent_days);
    settings.temp_admin_active_days = spec.temp_admin_active_days.unwrap_or(settings.temp_admin_active_days);
    settings.epoch_ticks = spec.epoch_ticks.unwrap_or(settings.epoch_ticks);
    settings.kick_cooldown_ms = spec.kick_cooldown_secs.map_or(settings.kick_cooldown_ms, |s| s.saturating_mul(1000));
    settings.aoi_radius_m = spec.aoi_radius_m.unwrap_or(settings.aoi_radius_m);
    settings.check().bad(|| "the world's settings".to_owned())?;
    let mut keys = std::collections::BTreeSet::new();
    for v in &n.validators {
        ensure!(keys.insert(AccountId(v.key)), "validator {} is listed twice", metatopia_sim::ids::hex(&v.key));
    }
    ensure!(
        (4..=100).contains(&keys.len()),
        "a sim needs 4 to 100 validators (n = 3f + 1 with f >= 1), {} given",
        keys.len()
    );
    let mut world = World::new(WorldGenesis {
        sim: n.sim,
        region: Region { origin: Vec2::ZERO, size: Fx::from_int(spec.region_size) },
        admin: n.admin,
        validators: keys,
        settings,
        time_ms: n.time_ms,
    });
    world.add_genesis_account(n.admin, "admin".to_owned());
    let host = RhaiHost::default();
    for o in &wf.objects {
        let owner = match &o.owner {
            Some(k) => AccountId(crate::config::parse_hex32(k).bad(|| format!("object {:?}: its owner", o.name))?),
            None => n.admin,
        };
        crate::world::add_object(&mut world, &host, o, owner, &scripts_dir)?;
    }
    Genesis::of_world(world, &spec.physics, spec.time_scale, n.validators)
}
