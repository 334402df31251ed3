//! Seeded demo worlds and event streams: the default world of the main command, the golden
//! tests and the benchmarks. Everything here is a pure function of its seed.

use ed25519_dalek::SigningKey;

use crate::event::{Batch, ChatRange, Payload, SignedEvent, account_of};
use crate::fx::Fx;
use crate::host::ScriptHost;
use crate::ids::{AccountId, Hash32, ObjectId, SimId, Tick};
use crate::rng::DetRng;
use crate::rules::RuleHost;
use crate::state::{
    BodyKind, DAY_MS, Genesis, Object, ObjectKind, Region, ScriptInstance, ScriptSource, Settings, Shape, World,
};
use crate::vec2::Vec2;

/// Sample rules scripts used by demo worlds.
pub const DEMO_SCRIPTS: &[&str] = &[
    "# door\non touch: color ff0000ff; say 0 the door opens; count",
    "# echo bot: hears channel 5, answers on 0\nlisten 5\non chat: echo",
    "# counter\ntimer 15\non timer: count",
    "# spinner\non tick: impulse 0.01 0\non touch: velocity 0 0",
    "# relay\non message: echo; reply got it",
];

/// What a demo world looks like.
#[derive(Clone, Copy, Debug)]
pub struct DemoSpec {
    pub seed: u64,
    pub sim: SimId,
    /// Prims, besides the players' avatars.
    pub objects: u32,
    pub players: u32,
    /// Per mille of prims that carry a script.
    pub scripted_per_mille: u32,
    /// Per mille of prims that start moving.
    pub moving_per_mille: u32,
    /// Side of the square region, metres.
    pub region_size: i64,
}

impl Default for DemoSpec {
    fn default() -> DemoSpec {
        DemoSpec {
            seed: 1,
            sim: SimId(1),
            objects: 1_000,
            players: 50,
            scripted_per_mille: 100,
            moving_per_mille: 100,
            region_size: 256,
        }
    }
}

/// A demo world and the keys that act in it.
#[derive(Debug)]
pub struct DemoWorld {
    pub world: World,
    pub admin: SigningKey,
    pub players: Vec<SigningKey>,
}

/// A deterministic signing key for a seed and index (tests and demos only).
pub fn demo_key(seed: u64, index: u64) -> SigningKey {
    let mut h = blake3::Hasher::new();
    h.update(b"metatopia demo key");
    h.update(&seed.to_le_bytes());
    h.update(&index.to_le_bytes());
    SigningKey::from_bytes(h.finalize().as_bytes())
}

fn random_point(rng: &mut DetRng, size: i64) -> Vec2 {
    // Uniform on a 1/256 m grid inside the region.
    let x = rng.range_i64(0, size * 256 - 1);
    let y = rng.range_i64(0, size * 256 - 1);
    Vec2::new(Fx::from_ratio(x, 256), Fx::from_ratio(y, 256))
}

fn random_velocity(rng: &mut DetRng, max_milli: i64) -> Vec2 {
    Vec2::new(
        Fx::from_ratio(rng.range_i64(-max_milli, max_milli), 1000),
        Fx::from_ratio(rng.range_i64(-max_milli, max_milli), 1000),
    )
}

/// Build a demo world.
pub fn demo_world(spec: DemoSpec) -> DemoWorld {
    let mut rng = DetRng::from_u64(spec.seed);
    let admin = demo_key(spec.seed, 0);
    let players: Vec<SigningKey> = (1..=u64::from(spec.players)).map(|i| demo_key(spec.seed, i)).collect();
    let region = Region { origin: Vec2::ZERO, size: Fx::from_int(spec.region_size) };
    let mut world = World::new(Genesis {
        sim: spec.sim,
        region,
        admin: account_of(&admin),
        validators: Default::default(),
        settings: Settings::default(),
        time_ms: 0,
    });
    // Players joined on different days so seniority is well defined.
    for (i, key) in std::iter::once(&admin).chain(&players).enumerate() {
        let id = account_of(key);
        world.create_account(id, format!("player-{i}"), i as u64 * DAY_MS / 24);
        let avatar =
            put(&mut world, id, ObjectKind::Avatar, format!("player-{i}"), random_point(&mut rng, spec.region_size));
        if let Some(a) = world.account_mut(&id) {
            a.avatar = Some(avatar);
        }
    }
    let owners: Vec<AccountId> = players.iter().map(account_of).collect();
    for n in 0..spec.objects {
        let owner = owners.get(rng.below(owners.len().max(1) as u64) as usize).copied().unwrap_or(account_of(&admin));
        let id =
            put(&mut world, owner, ObjectKind::Prim, format!("prim-{n}"), random_point(&mut rng, spec.region_size));
        if let Some(o) = world.object_mut(id) {
            o.color = rng.next_u64() as u32 | 0xff;
            if rng.chance(u64::from(spec.moving_per_mille), 1000) {
                o.velocity = random_velocity(&mut rng, 2_000);
            }
        }
        if rng.chance(u64::from(spec.scripted_per_mille), 1000) {
            let src = DEMO_SCRIPTS[rng.below(DEMO_SCRIPTS.len() as u64) as usize];
            attach(&mut world, id, owner, src);
        }
    }
    DemoWorld { world, admin, players }
}

fn put(world: &mut World, owner: AccountId, kind: ObjectKind, name: String, position: Vec2) -> ObjectId {
    let id = world.allocate_object_id();
    world.put_object(Object {
        id,
        kind,
        owner,
        name,
        shape: Shape::Circle { radius: Fx::HALF },
        position,
        rotation: Fx::ZERO,
        velocity: Vec2::ZERO,
        color: 0xffff_ffff,
        text: String::new(),
        // The demo world's prims and players are physics bodies (its moving prims bounce).
        body: BodyKind::Dynamic,
        surface: None,
    });
    id
}

/// Attach a rules script to an object at genesis.
fn attach(world: &mut World, object: ObjectId, author: AccountId, source: &str) {
    attach_script(world, &RuleHost::default(), object, author, source, "AGPL-3.0-or-later")
        .expect("demo scripts compile");
}

/// Attach a script to an object of a world being built (genesis, scenario files), compiled by
/// `host`. Its `on_init` handler runs on the first tick, as after a deployment. Worlds in
/// flight change scripts only through signed `DeployScript` events.
pub fn attach_script(
    world: &mut World,
    host: &dyn ScriptHost,
    object: ObjectId,
    author: AccountId,
    source: &str,
    licence: &str,
) -> Result<(), String> {
    if world.object(object).is_none() {
        return Err(format!("no object {object}"));
    }
    if !crate::state::COPYLEFT_LICENCES.contains(&licence) {
        return Err(format!("licence {licence:?} is not on the copyleft list"));
    }
    let record = ScriptSource { source: source.to_string(), licence: licence.into(), author, derived_from: None };
    let compiled = host.compile(&record, &world.settings.limits)?;
    let script = world.add_source(record);
    world.put_script(
        object,
        ScriptInstance {
            script,
            state: Vec::new(),
            wants_tick: compiled.wants_tick,
            listen: Default::default(),
            timer: None,
            failures: 0,
            suspended: false,
        },
    );
    world.pending_init.insert(object);
    Ok(())
}

/// A seeded stream of signed events against a demo world, with a share of bad ones
/// (forged signatures, replays, wrong sim) that must never take effect.
#[derive(Debug)]
pub struct EventGen {
    rng: DetRng,
    sim: SimId,
    keys: Vec<SigningKey>,
    nonces: Vec<u64>,
    /// Per mille of events that are deliberately bad.
    pub bad_per_mille: u32,
    last: Option<SignedEvent>,
    /// What `DeployScript` events carry (default: the rules [`DEMO_SCRIPTS`]).
    scripts: Vec<String>,
}

impl EventGen {
    pub fn new(demo: &DemoWorld, seed: u64) -> EventGen {
        let keys = demo.players.clone();
        let nonces = vec![0; keys.len()];
        EventGen {
            rng: DetRng::from_u64(seed ^ 0x5eed),
            sim: demo.world.sim(),
            keys,
            nonces,
            bad_per_mille: 20,
            last: None,
            scripts: DEMO_SCRIPTS.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Deploy these scripts instead of the rules demo scripts (for a world run by another host).
    pub fn with_scripts(mut self, scripts: &[&str]) -> EventGen {
        if !scripts.is_empty() {
            self.scripts = scripts.iter().map(|s| (*s).to_owned()).collect();
        }
        self
    }

    /// The batch for `tick` with `n` events, chosen against the current world.
    pub fn batch(&mut self, world: &World, tick: Tick, n: usize) -> Batch {
        let events = (0..n).map(|_| self.event(world)).collect();
        Batch { tick, time_ms: tick_time_ms(tick, world.settings().tick_rate_hz), seed: tick_seed(tick), events }
    }

    fn event(&mut self, world: &World) -> SignedEvent {
        let i = self.rng.below(self.keys.len() as u64) as usize;
        let author = account_of(&self.keys[i]);
        // Never behind the world (a generator started again on a world that ran on).
        self.nonces[i] = self.nonces[i].max(world.account(&author).map_or(0, |a| a.last_nonce));
        let payload = self.payload(world, author);
        if self.rng.chance(u64::from(self.bad_per_mille), 1000) {
            return self.bad(i, payload);
        }
        self.nonces[i] += 1;
        let e = SignedEvent::new(&self.keys[i], self.sim, self.nonces[i], payload);
        self.last = Some(e.clone());
        e
    }

    fn bad(&mut self, i: usize, payload: Payload) -> SignedEvent {
        match (self.rng.below(3), self.last.clone()) {
            (0, Some(replay)) => replay,
            (1, _) => SignedEvent::new(&self.keys[i], SimId(self.sim.0 + 1), self.nonces[i] + 1, payload),
            _ => {
                let mut forged = SignedEvent::new(&self.keys[i], self.sim, self.nonces[i] + 1, payload);
                forged.signature.1[3] ^= 0x40;
                forged
            }
        }
    }

    fn payload(&mut self, world: &World, author: AccountId) -> Payload {
        let avatar = world.account(&author).and_then(|a| a.avatar);
        let roll = self.rng.below(100);
        let any_object = |rng: &mut DetRng| {
            let n = world.objects().len();
            world.objects().keys().nth(rng.below(n.max(1) as u64) as usize).copied()
        };
        match (roll, avatar) {
            (_, None) => Payload::Login { name: format!("p{}", author.short()) },
            (0..=44, Some(a)) => Payload::Move { object: a, velocity: random_velocity(&mut self.rng, 3_000) },
            (45..=64, _) => Payload::Chat {
                channel: if self.rng.chance(1, 2) { 0 } else { 5 },
                range: ChatRange::Say,
                text: format!("hello {}", self.rng.below(1000)),
            },
            (65..=89, _) => match any_object(&mut self.rng) {
                Some(object) => Payload::Touch { object },
                None => Payload::Logout,
            },
            (90..=93, _) => Payload::Rez {
                name: "rezzed".into(),
                shape: Shape::Box { half_width: Fx::HALF, half_height: Fx::ONE },
                position: random_point(&mut self.rng, world.region().size.floor_int().max(1)),
                color: 0x00ff00ff,
                text: String::new(),
                body: BodyKind::Static,
            },
            (94..=96, _) => match world.objects().values().find(|o| o.owner == author && o.kind == ObjectKind::Prim) {
                Some(o) => Payload::DeployScript {
                    object: o.id,
                    source: self.scripts[self.rng.below(self.scripts.len() as u64) as usize].clone(),
                    licence: "GPL-3.0-or-later".into(),
                    derived_from: None,
                },
                None => Payload::Logout,
            },
            (97..=98, _) => Payload::Login { name: format!("p{}", author.short()) },
            _ => Payload::Logout,
        }
    }
}

/// BFT time of a tick in demo runs: tick × period.
pub fn tick_time_ms(tick: Tick, rate_hz: u32) -> u64 {
    tick.0.saturating_mul(1000) / u64::from(rate_hz.max(1))
}

/// Stand-in for the commit certificate's hash in demo runs.
pub fn tick_seed(tick: Tick) -> Hash32 {
    let mut h = blake3::Hasher::new();
    h.update(b"metatopia demo seed");
    h.update(&tick.0.to_le_bytes());
    Hash32(*h.finalize().as_bytes())
}
