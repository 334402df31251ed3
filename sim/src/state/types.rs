//! The state's plain types: regions, shapes, objects, scripts, accounts, settings, limits,
//! governance, queued outputs and refusals.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::fx::Fx;
use crate::ids::{AccountId, ObjectId, ScriptId, SimId, Tick};
use crate::merkle::keys;
use crate::vec2::Vec2;

/// Most object or account slots a world may have (a bound for untrusted snapshots).
pub const MAX_SLOTS: u32 = 1 << 22;
/// Most queued events a world may carry between ticks.
pub const MAX_QUEUE: usize = 1 << 20;
/// Inputs one object may be sent for one tick (messages, chat heard, collisions), at most: the
/// rest are dropped in the queue's order. Scripts emit at most `max_script_outputs` each, but
/// many senders could otherwise bury one object.
pub const MAX_INBOX_PER_TICK: u32 = 128;

/// Milliseconds in a day of BFT time.
pub const DAY_MS: u64 = 86_400_000;

/// The square a sim runs: origin (south-west corner) and side length in metres.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Region {
    pub origin: Vec2,
    pub size: Fx,
}

impl Region {
    pub fn contains(&self, p: Vec2) -> bool {
        let rel = p - self.origin;
        rel.x >= Fx::ZERO && rel.y >= Fx::ZERO && rel.x < self.size && rel.y < self.size
    }

    pub fn centre(&self) -> Vec2 {
        self.origin + Vec2::new(self.size / Fx::TWO, self.size / Fx::TWO)
    }
}

/// A shape, in metres.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Shape {
    Circle { radius: Fx },
    Box { half_width: Fx, half_height: Fx },
}

impl Shape {
    /// Shapes must be positive and at most 64 m across.
    pub fn is_valid(&self) -> bool {
        let ok = |v: Fx| v > Fx::ZERO && v <= Fx::from_int(32);
        match *self {
            Shape::Circle { radius } => ok(radius),
            Shape::Box { half_width, half_height } => ok(half_width) && ok(half_height),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum ObjectKind {
    Prim,
    Avatar,
}

/// How an object moves: objects stay where they are put unless made to move.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum BodyKind {
    /// Anchored: nothing moves it but its owner's edit (the default for rezzed prims).
    Static,
    /// Moved by its script or owner (velocity, targets); collisions do not push it.
    Kinematic,
    /// Physics: pushed by collisions, bounces, rolls (avatars, balls).
    Dynamic,
}

impl BodyKind {
    /// As files and the command line write it.
    pub fn name(self) -> &'static str {
        match self {
            BodyKind::Static => "static",
            BodyKind::Kinematic => "kinematic",
            BodyKind::Dynamic => "dynamic",
        }
    }

    pub fn parse(s: &str) -> Option<BodyKind> {
        [BodyKind::Static, BodyKind::Kinematic, BodyKind::Dynamic].into_iter().find(|k| k.name() == s)
    }

    /// Whether velocities, impulses and targets move it.
    pub fn moves(self) -> bool {
        self != BodyKind::Static
    }
}

/// How an object's surface meets others and how fast it slows: a property its owner may set
/// (`None` on an object: the sim's physics defaults).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Surface {
    /// 0 (ice) to 10.
    pub friction: Fx,
    /// 0 (no bounce) to 1 (all of it).
    pub restitution: Fx,
    /// Linear damping per second: 0 (none) to 100.
    pub damping: Fx,
}

impl Surface {
    /// Each value within its range, or the first that is not, named.
    pub fn check(&self) -> Result<(), &'static str> {
        let within = |v: Fx, hi: i64| v >= Fx::ZERO && v <= Fx::from_int(hi);
        if !within(self.friction, 10) {
            Err("friction (0 to 10)")
        } else if !within(self.restitution, 1) {
            Err("restitution (0 to 1)")
        } else if !within(self.damping, 100) {
            Err("damping (0 to 100)")
        } else {
            Ok(())
        }
    }
}

/// A thing in the world.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Object {
    pub id: ObjectId,
    pub kind: ObjectKind,
    pub owner: AccountId,
    pub name: String,
    pub shape: Shape,
    /// Written only by the physics stage.
    pub position: Vec2,
    /// Written only by the physics stage.
    pub rotation: Fx,
    /// Written only by the physics stage (scripts and clients send commands).
    pub velocity: Vec2,
    /// RGBA.
    pub color: u32,
    /// Floating text.
    pub text: String,
    pub body: BodyKind,
    pub surface: Option<Surface>,
}

/// A script's source record: content-addressed, readable by anyone (DESIGN §8).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ScriptSource {
    pub source: String,
    /// SPDX id, from [`COPYLEFT_LICENCES`].
    pub licence: String,
    pub author: AccountId,
    /// The script this one was modified from, if any.
    pub derived_from: Option<ScriptId>,
}

impl ScriptSource {
    /// The content hash: over source, licence, author and provenance.
    pub fn id(&self) -> ScriptId {
        let bytes = postcard::to_allocvec(self).expect("encoding to a Vec cannot fail");
        ScriptId(*blake3::keyed_hash(&keys::SCRIPT_ID, &bytes).as_bytes())
    }
}

/// The SPDX ids a script may carry: copyleft licences only.
pub const COPYLEFT_LICENCES: &[&str] = &[
    "AGPL-3.0-or-later",
    "AGPL-3.0-only",
    "GPL-3.0-or-later",
    "GPL-3.0-only",
    "GPL-2.0-or-later",
    "LGPL-3.0-or-later",
    "LGPL-3.0-only",
    "MPL-2.0",
    "EUPL-1.2",
    "CC-BY-SA-4.0",
];

/// A periodic timer of a script.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Timer {
    pub every_ticks: u32,
    pub next: Tick,
}

/// A script running on an object: which source, and its persisted state.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ScriptInstance {
    pub script: ScriptId,
    /// The host's encoding of the script's variables between events.
    pub state: Vec<u8>,
    /// Whether the script has an `on_tick` handler (decided when compiled).
    pub wants_tick: bool,
    pub listen: BTreeSet<i32>,
    pub timer: Option<Timer>,
    /// The script's failure score: a failing tick adds `FAILURE_WEIGHT` (4), a clean run takes
    /// one off; at `script_failure_limit` × 4 it is suspended.
    pub failures: u32,
    pub suspended: bool,
}

/// An account (a player, creator or admin).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Account {
    pub id: AccountId,
    /// Leaf of the accounts tree; assigned at first login, never reused.
    pub slot: u32,
    pub name: String,
    /// BFT time of the first login.
    pub joined_at_ms: u64,
    pub last_login_ms: u64,
    /// The highest nonce accepted from this account.
    pub last_nonce: u64,
    pub avatar: Option<ObjectId>,
    /// Objects the admin returned to this account (oldest first), until it rezzes them again.
    pub returned: Vec<Returned>,
}

/// A script listens on at most this many chat channels; a `listen` past it is ignored and the
/// owner told (the listen set is part of the script's hashed state: it must stay small).
pub const MAX_LISTEN_CHANNELS: usize = 64;

/// At most this many returned objects wait in an account; returning more is refused.
pub const MAX_RETURNED: usize = 16;

/// An object the admin returned to its owner (DESIGN §10, like Second Life's "return"): out of
/// the world, kept whole in the owner's account, script source included, until the owner rezzes
/// it again (`Payload::RezReturned`) and, if it wants, redeploys the script.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Returned {
    pub name: String,
    pub shape: Shape,
    pub color: u32,
    pub text: String,
    pub script: Option<ScriptSource>,
    /// BFT time of the return.
    pub returned_at_ms: u64,
}

/// Sim settings, changeable by admin acts.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Settings {
    /// X: the admin counts as absent after this many days without a login.
    pub admin_absent_days: u32,
    /// Y: a temp admin must have logged in within this many days.
    pub temp_admin_active_days: u32,
    pub tick_rate_hz: u32,
    /// Ticks per validator epoch; validator changes apply at epoch boundaries.
    pub epoch_ticks: u64,
    pub kick_cooldown_ms: u64,
    /// How far around its avatar a client sees objects (its area of interest), metres.
    pub aoi_radius_m: u32,
    pub limits: Limits,
}

/// Limits on what events and scripts may carry.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Limits {
    pub max_event_bytes: u32,
    pub max_name_bytes: u32,
    pub max_text_bytes: u32,
    pub max_chat_bytes: u32,
    pub max_source_bytes: u32,
    pub max_script_state_bytes: u32,
    pub max_objects: u32,
    /// A script failing this many ticks in a row (or often enough over a longer stretch: its
    /// failure score, `ScriptInstance::failures`) is suspended until redeployed.
    pub script_failure_limit: u32,
    /// Messages, chat and commands one script may emit per tick.
    pub max_script_outputs: u32,
    pub max_speed: Fx,
    /// Script operations (the host's count, rhai's operations for rhai scripts) one object may
    /// use in a tick, all its inputs together; the inputs after it is spent are not run and the
    /// owner is told.
    pub operations_per_object_tick: u64,
    /// Script operations all of one account's objects may use in a tick together: each of its
    /// objects with work this tick gets an equal share (at most `operations_per_object_tick`).
    pub operations_per_account_tick: u64,
    /// Objects one account may have in the sim (avatar not counted); a rez past it is refused.
    pub max_objects_per_account: u32,
    /// Bytes of script source on one account's objects together (each object's script counted
    /// once per object); a deployment past it is refused.
    pub max_script_bytes_per_account: u32,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            admin_absent_days: 30,
            temp_admin_active_days: 7,
            tick_rate_hz: 30,
            epoch_ticks: 1_000,
            kick_cooldown_ms: 15 * 60 * 1_000,
            aoi_radius_m: 64,
            limits: Limits::default(),
        }
    }
}

/// A setting outside its bounds (an admin's `settings` act, a world file).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be {range}, not {value}")]
pub struct SettingError {
    pub field: &'static str,
    pub range: &'static str,
    pub value: String,
}

impl Settings {
    /// Every setting within its bounds, or the first that is not, named. The bounds keep a sim
    /// runnable (a tick rate agreement can follow, an area of interest a node can serve) and are
    /// the same on every node, so an admin's act is refused the same way everywhere.
    pub fn check(&self) -> Result<(), SettingError> {
        fn within(field: &'static str, v: u64, lo: u64, hi: u64, range: &'static str) -> Result<(), SettingError> {
            if (lo..=hi).contains(&v) { Ok(()) } else { Err(SettingError { field, range, value: v.to_string() }) }
        }
        let l = &self.limits;
        within("admin_absent_days", self.admin_absent_days.into(), 1, 3_650, "1..=3650 days")?;
        within("temp_admin_active_days", self.temp_admin_active_days.into(), 1, 3_650, "1..=3650 days")?;
        within("tick_rate_hz", self.tick_rate_hz.into(), 1, 120, "1..=120 Hz")?;
        within("epoch_ticks", self.epoch_ticks, 1, 10_000_000, "1..=10000000 ticks")?;
        within("kick_cooldown_ms", self.kick_cooldown_ms, 0, 365 * DAY_MS, "0..=365 days")?;
        within("aoi_radius_m", self.aoi_radius_m.into(), 1, 1_024, "1..=1024 m")?;
        within("max_event_bytes", l.max_event_bytes.into(), 1_024, 96 * 1024, "1024..=98304 bytes")?;
        within("max_name_bytes", l.max_name_bytes.into(), 1, 1_024, "1..=1024 bytes")?;
        within("max_text_bytes", l.max_text_bytes.into(), 0, 4_096, "0..=4096 bytes")?;
        within("max_chat_bytes", l.max_chat_bytes.into(), 1, 16_384, "1..=16384 bytes")?;
        within("max_source_bytes", l.max_source_bytes.into(), 1, 96 * 1024, "1..=98304 bytes")?;
        within("max_script_state_bytes", l.max_script_state_bytes.into(), 0, 1 << 20, "0..=1048576 bytes")?;
        within("max_objects", l.max_objects.into(), 1, MAX_SLOTS.into(), "1..=4194304")?;
        within("script_failure_limit", l.script_failure_limit.into(), 1, 1_000, "1..=1000 ticks")?;
        within("max_script_outputs", l.max_script_outputs.into(), 0, 1_024, "0..=1024 a tick")?;
        within("operations_per_object_tick", l.operations_per_object_tick, 1_000, 10_000_000, "1000..=10000000")?;
        within(
            "operations_per_account_tick",
            l.operations_per_account_tick,
            l.operations_per_object_tick,
            100_000_000,
            "at least operations_per_object_tick and at most 100000000",
        )?;
        within("max_objects_per_account", l.max_objects_per_account.into(), 1, MAX_SLOTS.into(), "1..=4194304")?;
        within(
            "max_script_bytes_per_account",
            l.max_script_bytes_per_account.into(),
            l.max_source_bytes.into(),
            1 << 30,
            "at least max_source_bytes and at most 1073741824 bytes",
        )?;
        if l.max_speed <= Fx::ZERO || l.max_speed > Fx::from_int(1_000) {
            return Err(SettingError {
                field: "max_speed",
                range: "above 0 and at most 1000 m/s",
                value: l.max_speed.to_string(),
            });
        }
        Ok(())
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_event_bytes: 96 * 1024,
            max_name_bytes: 64,
            max_text_bytes: 256,
            max_chat_bytes: 1_024,
            max_source_bytes: 64 * 1024,
            max_script_state_bytes: 16 * 1024,
            max_objects: 100_000,
            script_failure_limit: 10,
            max_script_outputs: 64,
            max_speed: Fx::from_int(50),
            operations_per_object_tick: 160_000,
            operations_per_account_tick: 320_000,
            max_objects_per_account: 1_000,
            max_script_bytes_per_account: 1 << 20,
        }
    }
}

/// Who governs the sim (DESIGN §10).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Governance {
    /// The permanent admin.
    pub admin: AccountId,
    /// BFT time of genesis: an admin who never logged in counts as last seen then.
    pub genesis_ms: u64,
    pub validators: BTreeSet<AccountId>,
    /// Changes waiting for the next epoch boundary: `true` admits, `false` removes.
    pub pending_validators: BTreeMap<AccountId, bool>,
    pub banned: BTreeSet<AccountId>,
    /// Kicked accounts and the BFT time until which they may not log in.
    pub kicked_until_ms: BTreeMap<AccountId, u64>,
}

/// An event queued during tick t-1 for tick t (DESIGN §4 `Queue_t`).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Queued {
    /// A script's message to another object.
    Message { from: ObjectId, to: ObjectId, data: String },
    /// Chat heard by a listening script.
    Heard { listener: ObjectId, channel: i32, speaker: String, text: String },
    /// A physics collision, for the owned body `object`.
    Collision { object: ObjectId, other: ObjectId },
}

impl Queued {
    pub fn target(&self) -> ObjectId {
        match *self {
            Queued::Message { to, .. } => to,
            Queued::Heard { listener, .. } => listener,
            Queued::Collision { object, .. } => object,
        }
    }
}

/// Why an event did not take effect. Recorded in state, identically on every node.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize, thiserror::Error)]
pub enum RejectReason {
    #[error("signature does not verify")]
    BadSignature,
    #[error("event is for {got}, this is {expected}")]
    WrongSim { expected: SimId, got: SimId },
    #[error("nonce {got} is not above the last accepted nonce {last}")]
    StaleNonce { last: u64, got: u64 },
    #[error("unknown account: log in first")]
    UnknownAccount,
    #[error("account is banned")]
    Banned,
    #[error("account is kicked until {}", crate::date::UnixDate(*until_ms))]
    Kicked { until_ms: u64 },
    #[error("event is {bytes} bytes, the limit is {max}")]
    TooLarge { bytes: u32, max: u32 },
    #[error("{field} is {len} bytes, the limit is {max}")]
    FieldTooLong { field: String, len: u32, max: u32 },
    #[error("invalid value for {field}")]
    InvalidValue { field: String },
    #[error("no such object {object}")]
    NoSuchObject { object: ObjectId },
    #[error("{object} is not owned by the author")]
    NotOwner { object: ObjectId },
    #[error("the author has no avatar in this sim")]
    NoAvatar,
    #[error("{act} needs the admin or temp-admin role")]
    NotAuthorized { act: String },
    #[error("licence {licence:?} is not on the copyleft list")]
    LicenceNotCopyleft { licence: String },
    #[error("script does not compile: {message}")]
    CompileError { message: String },
    #[error("the sim holds its maximum of {max} objects")]
    ObjectLimit { max: u32 },
    #[error("the account's quota of {max} {what} would be exceeded ({used} in use)")]
    AccountQuota { what: String, used: u64, max: u64 },
    #[error("the object was removed in the same tick")]
    Conflict,
    #[error("mail from {sim}, which is not a neighbour of this sim")]
    NotNeighbour { sim: SimId },
    #[error("mail signed by a key that is not a validator of {sim}")]
    NotNeighbourValidator { sim: SimId },
    #[error("mail of tick {tick} is older than the window behind the newest delivered ({newest})")]
    MailTooOld { tick: Tick, newest: Tick },
    #[error("the signer has too much undelivered mail from {sim} open")]
    MailBacklog { sim: SimId },
    #[error("mail from {sim} reached its quorum but does not decode: {reason}")]
    MalformedMail { sim: SimId, reason: String },
}

/// A rejected event and why.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Rejection {
    pub event: crate::ids::EventId,
    pub author: AccountId,
    pub reason: RejectReason,
}
