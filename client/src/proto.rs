//! The client protocol: what a client and a node say to each other. The native client speaks it
//! over QUIC as length-prefixed postcard frames ([`write_frame`], [`read_frame`]); the web
//! viewer speaks the very same messages over the node's WebSocket gateway as JSON (serde's
//! externally tagged form: `{"submit":{"ref":7,"event":"…"}}`, `{"tick":{"tick":9,…}}`).
//!
//! Client → node ([`ClientMsg`]): `route` (which nodes serve the sim of an account's avatar),
//! `interest` (the area of interest: follow an avatar, a radius), `submit` (a signed event, hex
//! of its postcard bytes), `object` (one object with its script's source), `account`, `ping`
//! (a round-trip probe, answered `pong`).
//!
//! Node → client ([`ServerMsg`]): on connect `status`, a `tick` with every object of the area
//! of interest in `enter` and the recent `chat`; then every tick a `tick` delta (objects that
//! entered the area or were created, changed, or left it or were removed), chat within range,
//! `status` once a second. A client too slow for the deltas loses them and gets its whole area
//! again; the sim never waits for a client.

use metatopia_sim::Tick;
use serde::{Deserialize, Serialize};

/// The QUIC application protocol name (ALPN).
pub const ALPN: &[u8] = b"metatopia/2";
/// What a node answers a question (an account, an object, the governance, a submission) its
/// loop could not answer in time: busy for now, not "there is none". Clients ask again.
pub const BUSY: &str = "the node is busy: ask again";
/// The largest frame a node accepts from a client (a signed event is at most 96 KiB; hex doubles it).
pub const MAX_CLIENT_FRAME: usize = 256 * 1024;
/// The largest frame a client accepts from a node (a whole area of interest at once).
pub const MAX_SERVER_FRAME: usize = 16 * 1024 * 1024;
/// How far (mm) a client's extrapolation of a moving object may drift before the node sends its
/// position again; and how much (mm/s) its velocity may change unannounced.
pub const DEAD_RECKONING_MM: i64 = 100;
/// Deltas a second the client library asks for (dead reckoning fills the ticks between).
pub const CLIENT_MAX_HZ: u32 = 10;
/// The default area-of-interest radius, metres (a sim's `aoi_radius_m` setting overrides it).
pub const DEFAULT_AOI_M: u32 = 64;

/// What a node publishes after every tick (`GET /v1/status`, `metatopia stats`, the gateway).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    pub sim: u32,
    /// This node's index among the sim's nodes, and the size of the current validator set.
    pub node: u32,
    pub validators: u32,
    /// Whether this node votes (a validator of the current epoch) or only follows (an observer).
    pub voting: bool,
    pub tick_rate_hz: u32,
    /// The sim's square region: origin and side, metres.
    pub region_origin: [i64; 2],
    pub region_size: i64,
    /// The last executed tick and the state root after it.
    pub tick: Tick,
    pub root: String,
    /// Sim seconds per wall second over the last second (1.0 in lockstep at the rate).
    pub dilation: f64,
    /// BFT time of a block to its commit here, milliseconds, over recent ticks.
    pub commit_latency_p50_ms: f64,
    pub commit_latency_p99_ms: f64,
    /// A block's proposal, as this node first saw it (made or received), to its commit here
    /// (finalization): microseconds, the median and the 99th percentile of recent commits. The
    /// figure above is coarser (milliseconds, and the block's time is its span's start).
    #[serde(default)]
    pub proposal_to_commit_p50_us: u64,
    #[serde(default)]
    pub proposal_to_commit_p99_us: u64,
    /// A client's event taken in by this node to its execution here, microseconds (events
    /// submitted through this node; the median and the 99th percentile of recent ones).
    #[serde(default)]
    pub input_to_execution_p50_us: u64,
    #[serde(default)]
    pub input_to_execution_p99_us: u64,
    /// Wall time per tick spent executing, scripts (summed over threads) and physics, ms,
    /// averaged over the last second.
    pub execute_ms: f64,
    pub script_ms: f64,
    pub physics_ms: f64,
    pub objects: u64,
    pub scripts: u64,
    /// Script operations the last executed tick ran, all objects together (the host's count:
    /// the same on every node).
    #[serde(default)]
    pub script_operations: u64,
    pub accounts: u64,
    pub pool_events: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub refused_submissions: u64,
    /// Nodes of any sim this node is connected to.
    pub peers: u32,
    /// Validators of this sim's current set this node reaches (itself included when it is one);
    /// a quorum needs 2f + 1 of `validators`.
    #[serde(default)]
    pub validators_connected: u32,
    /// Keys (hex) of this sim's validators this node does not reach now.
    #[serde(default)]
    pub validators_missing: Vec<String>,
    /// The sim's genesis hash (hex).
    #[serde(default)]
    pub genesis: String,
    /// Whether this node is reachable from the internet, as AutoNAT last found: "public",
    /// "private" (behind a NAT or firewall) or "unknown".
    #[serde(default)]
    pub reachability: String,
    /// Keys (hex) of the relays that hold a reservation for this node (when it is private).
    #[serde(default)]
    pub relays: Vec<String>,
    /// The relayed addresses this node's signed card names (where nodes of any sim dial it).
    #[serde(default)]
    pub card_relayed: Vec<String>,
    /// Each connected peer's key (hex) and path: "quic", "tcp" (direct) or "relayed".
    #[serde(default)]
    pub peer_paths: std::collections::BTreeMap<String, String>,
    /// Relayed connections upgraded to direct ones by hole punching, and attempts that failed.
    #[serde(default)]
    pub hole_punched: u64,
    #[serde(default)]
    pub hole_punch_failed: u64,
    /// This node's relay: reservations and circuits it serves now; requests it refused.
    #[serde(default)]
    pub relay_serving: [u64; 2],
    #[serde(default)]
    pub relay_refused: u64,
    /// Clients connected to this node (QUIC and WebSocket).
    pub clients: u32,
    /// The tick this node diverged at, if it did (it then stops executing).
    pub desynced: Option<Tick>,
    /// Milliseconds since the UNIX epoch when the last tick executed here.
    pub last_executed_unix_ms: u64,
    /// In a world of several sims: the neighbour sims, the mail this node signed for them and
    /// took from them, and the objects that crossed (left, arrived, and handed over but not yet
    /// confirmed, by name).
    #[serde(default)]
    pub neighbours: Vec<u32>,
    #[serde(default)]
    pub mail_sent: u64,
    #[serde(default)]
    pub mail_received: u64,
    /// Copies of neighbours' mail dropped because the sim already had it.
    #[serde(default)]
    pub mail_late: u64,
    #[serde(default)]
    pub departures: u64,
    #[serde(default)]
    pub arrivals: u64,
    #[serde(default)]
    pub in_transit: Vec<String>,
    /// The Raynet overlay: the nodes of the world whose cards this node holds, its Voronoi
    /// neighbours among them, and for each neighbour sim (as in `neighbours`) how many of the
    /// validators its genesis names this node has found.
    #[serde(default)]
    pub raynet_known: u32,
    #[serde(default)]
    pub raynet_neighbours: u32,
    #[serde(default)]
    pub neighbour_validators_found: Vec<u32>,
    /// The agreement: its validator epoch, its current view, and the last tick it committed
    /// (which `tick` follows; refreshed also when no tick executes).
    #[serde(default)]
    pub epoch: u64,
    #[serde(default)]
    pub view: u64,
    #[serde(default)]
    pub agreed_tick: Option<Tick>,
    /// Ticks handed out here in two blocks: opened empty, then filled with their events a
    /// moment before the next tick was due (the agreement's fills, which cut input latency).
    #[serde(default)]
    pub filled_ticks: u64,
}

/// An account as nodes show it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct AccountView {
    pub id: String,
    pub name: String,
    pub joined_at_ms: u64,
    pub last_login_ms: u64,
    /// Sign the next event with a nonce above this.
    pub last_nonce: u64,
    pub role: String,
    pub banned: bool,
    pub kicked_until_ms: Option<u64>,
    /// The avatar's object id (`SLOTvGEN`) while logged in.
    pub avatar: Option<String>,
    /// Names of the objects the admin returned to this account, in order (`RezReturned` takes
    /// the index).
    pub returned: Vec<String>,
}

/// Who governs the sim now, and why (`metatopia admin status`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GovernanceView {
    pub tick: Tick,
    /// Sim (BFT) time of the last executed tick, milliseconds.
    pub time_ms: u64,
    pub admin: String,
    pub admin_name: Option<String>,
    pub admin_days_absent: u64,
    pub admin_absent: bool,
    pub temp_admin: Option<String>,
    pub temp_admin_name: Option<String>,
    pub reason: String,
    /// X and Y of DESIGN §10.
    pub admin_absent_days: u32,
    pub temp_admin_active_days: u32,
    pub validators: Vec<String>,
    /// Validator changes waiting for the epoch boundary: (key, admit?).
    pub pending_validators: Vec<(String, bool)>,
    pub next_epoch_tick: Tick,
    pub banned: Vec<String>,
    /// All the settings (an admin's `settings` act replaces them whole).
    pub settings: metatopia_sim::Settings,
}

/// An object as nodes show it (lengths in metres, as decimal text).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectView {
    pub id: String,
    pub name: String,
    pub owner: String,
    pub avatar: bool,
    pub position: [String; 2],
    /// Metres per second. Clients extrapolate positions with it between updates (the node sends
    /// a position again only when the extrapolation would be off by more than
    /// [`DEAD_RECKONING_MM`], or the velocity changed).
    pub velocity: [String; 2],
    /// `circle R` or `box HALF_W HALF_H`.
    pub shape: String,
    pub color: String,
    pub text: String,
    /// Its script, readable by anyone (only when asked for one object; deltas say `scripted`).
    pub script: Option<ScriptView>,
    pub scripted: bool,
    /// How it moves: `static`, `kinematic` or `dynamic`.
    #[serde(default)]
    pub body: String,
    /// Its own surface (`friction F restitution R damping D`), or empty: the sim's defaults.
    #[serde(default)]
    pub surface: String,
}

impl ObjectView {
    /// Position and velocity in whole millimetres (per second).
    pub fn motion_mm(&self) -> ([i64; 2], [i64; 2]) {
        (
            [millimetres(&self.position[0]), millimetres(&self.position[1])],
            [millimetres(&self.velocity[0]), millimetres(&self.velocity[1])],
        )
    }

    /// Its position in whole metres (rounded down), for maps and areas of interest.
    pub fn metres(&self) -> [i64; 2] {
        [whole_metres(&self.position[0]), whole_metres(&self.position[1])]
    }
}

/// What changed in an object since the last tick (`None`: unchanged): how `tick` deltas carry
/// objects a client already has.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ObjectUpdate {
    pub id: String,
    /// The new position in whole millimetres (rounded down): a few bytes instead of two decimals.
    pub at_mm: Option<[i64; 2]>,
    /// The new velocity in millimetres per second (sent with `at_mm`: extrapolate from there).
    pub vel_mm: Option<[i64; 2]>,
    pub text: Option<String>,
    pub color: Option<String>,
    pub shape: Option<String>,
    pub name: Option<String>,
    pub owner: Option<String>,
    pub scripted: Option<bool>,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub surface: Option<String>,
}

impl ObjectUpdate {
    /// Whether it changes nothing (dead reckoning left its motion out and nothing else changed).
    pub fn is_empty(&self) -> bool {
        self.at_mm.is_none() && self.vel_mm.is_none() && self.is_motion_only()
    }

    /// Whether it changes the motion only (or nothing).
    pub fn is_motion_only(&self) -> bool {
        self.text.is_none()
            && self.color.is_none()
            && self.shape.is_none()
            && self.name.is_none()
            && self.owner.is_none()
            && self.scripted.is_none()
            && self.body.is_none()
            && self.surface.is_none()
    }

    /// Where dead reckoning puts an object `ticks` after it was at `at` with velocity `vel` (mm,
    /// mm/s) at `rate_hz`: the same integer arithmetic on the node and in every client.
    pub fn extrapolate(at: [i64; 2], vel: [i64; 2], ticks: u64, rate_hz: u32) -> [i64; 2] {
        let (t, r) = (ticks.min(1 << 32) as i64, i64::from(rate_hz.max(1)));
        [at[0].saturating_add(vel[0].saturating_mul(t) / r), at[1].saturating_add(vel[1].saturating_mul(t) / r)]
    }

    /// An update carrying all of an object's fields but its motion (for a client whose copy
    /// of them may be older than the last change).
    pub fn fields_of(v: &ObjectView) -> ObjectUpdate {
        ObjectUpdate {
            id: v.id.clone(),
            at_mm: None,
            vel_mm: None,
            text: Some(v.text.clone()),
            color: Some(v.color.clone()),
            shape: Some(v.shape.clone()),
            name: Some(v.name.clone()),
            owner: Some(v.owner.clone()),
            scripted: Some(v.scripted),
            body: Some(v.body.clone()),
            surface: Some(v.surface.clone()),
        }
    }

    /// The update that turns `old` into `new` (the same object).
    pub fn between(old: &ObjectView, new: &ObjectView) -> ObjectUpdate {
        fn diff<T: PartialEq + Clone>(a: &T, b: &T) -> Option<T> {
            (a != b).then(|| b.clone())
        }
        ObjectUpdate {
            id: new.id.clone(),
            at_mm: (old.position != new.position)
                .then(|| [millimetres(&new.position[0]), millimetres(&new.position[1])]),
            vel_mm: (old.velocity != new.velocity)
                .then(|| [millimetres(&new.velocity[0]), millimetres(&new.velocity[1])]),
            text: diff(&old.text, &new.text),
            color: diff(&old.color, &new.color),
            shape: diff(&old.shape, &new.shape),
            name: diff(&old.name, &new.name),
            owner: diff(&old.owner, &new.owner),
            scripted: diff(&old.scripted, &new.scripted),
            body: diff(&old.body, &new.body),
            surface: diff(&old.surface, &new.surface),
        }
    }

    /// Fold a later update of the same object into this one (later fields win).
    pub fn merge(&mut self, later: &ObjectUpdate) {
        fn take<T: Clone>(field: &mut Option<T>, v: &Option<T>) {
            if v.is_some() {
                field.clone_from(v);
            }
        }
        take(&mut self.at_mm, &later.at_mm);
        take(&mut self.vel_mm, &later.vel_mm);
        take(&mut self.text, &later.text);
        take(&mut self.color, &later.color);
        take(&mut self.shape, &later.shape);
        take(&mut self.name, &later.name);
        take(&mut self.owner, &later.owner);
        take(&mut self.scripted, &later.scripted);
        take(&mut self.body, &later.body);
        take(&mut self.surface, &later.surface);
    }

    pub fn apply(&self, o: &mut ObjectView) {
        fn set<T: Clone>(field: &mut T, v: &Option<T>) {
            if let Some(v) = v {
                field.clone_from(v);
            }
        }
        if let Some([x, y]) = self.at_mm {
            write_decimal_of_mm(&mut o.position[0], x);
            write_decimal_of_mm(&mut o.position[1], y);
        }
        if let Some([x, y]) = self.vel_mm {
            write_decimal_of_mm(&mut o.velocity[0], x);
            write_decimal_of_mm(&mut o.velocity[1], y);
        }
        set(&mut o.text, &self.text);
        set(&mut o.color, &self.color);
        set(&mut o.shape, &self.shape);
        set(&mut o.name, &self.name);
        set(&mut o.owner, &self.owner);
        set(&mut o.scripted, &self.scripted);
        set(&mut o.body, &self.body);
        set(&mut o.surface, &self.surface);
    }
}

/// The whole millimetres of a decimal like `-12.3756` (rounded down; 0 if it is not a number).
pub fn millimetres(decimal: &str) -> i64 {
    let (int, frac) = decimal.split_once('.').unwrap_or((decimal, ""));
    let i: i64 = int.parse().unwrap_or(0);
    let negative = int.starts_with('-');
    // The first three decimals (padded with zeros), without building a string: a node and a
    // client read many positions a second.
    let mut three = [b'0'; 3];
    for (d, b) in three.iter_mut().zip(frac.bytes()) {
        *d = b;
    }
    let f: i64 = if three.iter().all(u8::is_ascii_digit) {
        three.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0'))
    } else {
        let digits: String = frac.chars().chain("000".chars()).take(3).collect();
        digits.parse().unwrap_or(0)
    };
    let exact = frac.len() <= 3 || frac.get(3..).is_none_or(|rest| rest.bytes().all(|b| b == b'0'));
    match (negative, f, exact) {
        (false, _, _) => i * 1000 + f,
        (true, 0, true) => i * 1000,
        (true, _, true) => i * 1000 - f,
        (true, _, false) => i * 1000 - f - 1,
    }
}

/// Millimetres as a decimal of metres: `-12376` → `-12.376`.
pub fn decimal_of_mm(mm: i64) -> String {
    let mut s = String::with_capacity(16);
    write_decimal_of_mm(&mut s, mm);
    s
}

/// [`decimal_of_mm`] into `out` (its old text replaced; no allocation once it has room): a
/// client applies many positions a second.
pub fn write_decimal_of_mm(out: &mut String, mm: i64) {
    out.clear();
    if mm < 0 {
        out.push('-');
    }
    let a = mm.unsigned_abs();
    let (m, r) = (a / 1000, a % 1000);
    // The whole metres' digits, last first (the formatting machinery costs more than this).
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut v = m;
    loop {
        start -= 1;
        digits[start] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend(digits[start..].iter().map(|d| char::from(*d)));
    if r != 0 {
        out.push('.');
        let places = if r % 100 == 0 {
            1
        } else if r % 10 == 0 {
            2
        } else {
            3
        };
        out.extend([r / 100, r / 10 % 10, r % 10][..places].iter().map(|d| char::from(b'0' + *d as u8)));
    }
}

/// The whole metres of a decimal like `-12.375` (rounded down; 0 if it is not a number).
pub fn whole_metres(decimal: &str) -> i64 {
    let (int, frac) = decimal.split_once('.').unwrap_or((decimal, ""));
    let i: i64 = int.parse().unwrap_or(0);
    let negative = int.starts_with('-');
    if negative && frac.bytes().any(|b| b != b'0') { i - 1 } else { i }
}

/// A script's source and provenance.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ScriptView {
    pub source: String,
    pub licence: String,
    pub author: String,
    pub derived_from: Option<String>,
    pub id: String,
}

/// A line of chat heard in the sim.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChatView {
    pub tick: Tick,
    pub name: String,
    pub channel: i32,
    pub text: String,
    /// Where it was said (whole metres) and how far it carries: 10 (whisper), 20 (say), 100 (shout).
    pub position: [i64; 2],
    pub range_m: u32,
    /// For a private line (a script error on the debug channel): the only account that hears it.
    pub to: Option<String>,
}

impl ChatView {
    /// Whether a listener at `at` (whole metres) hears it.
    pub fn heard_at(&self, at: [i64; 2]) -> bool {
        let (dx, dy) = (i128::from(self.position[0] - at[0]), i128::from(self.position[1] - at[1]));
        dx * dx + dy * dy <= i128::from(self.range_m) * i128::from(self.range_m)
    }
}

/// The root a node computed for a tick.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RootView {
    pub tick: Tick,
    pub root: String,
}

/// What became of a committed event (for the client that submitted it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It took effect at this tick.
    Executed { tick: Tick },
    /// It was committed at this tick but refused, for this reason, the same on every node.
    Refused { tick: Tick, reason: String },
}

/// A node a client can connect to: its identity (ed25519 public key, hex; the QUIC connection
/// is pinned to it) and its address.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeAddr {
    pub key: String,
    pub addr: String,
    /// Its HTTP service (`HOST:PORT`: the web viewer and its WebSocket), where known.
    #[serde(default)]
    pub http: Option<String>,
}

impl NodeAddr {
    /// A node at `addr` whose HTTP service is where a node serves it by default (the port +
    /// 1000).
    pub fn at(key: String, addr: std::net::SocketAddr) -> NodeAddr {
        let http = std::net::SocketAddr::new(addr.ip(), addr.port().saturating_add(1000)).to_string();
        NodeAddr { key, addr: addr.to_string(), http: Some(http) }
    }
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.key, self.addr)
    }
}

impl std::str::FromStr for NodeAddr {
    type Err = String;
    /// A join address as `metatopia init` prints it: `KEYHEX@HOST:PORT`, perhaps with the sim's
    /// genesis hash after a `/` (for joining nodes; a client needs only the node).
    fn from_str(s: &str) -> Result<NodeAddr, String> {
        let (key, addr) = s
            .split_once('@')
            .ok_or_else(|| format!("{s:?}: a node address is KEY@HOST:PORT (as `metatopia init` prints it)"))?;
        let addr = addr.split_once('/').map_or(addr, |(a, _)| a);
        if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("{key:?}: a node key is 64 hex digits"));
        }
        if !addr.contains(':') {
            return Err(format!("{addr:?}: the address needs a port, like 127.0.0.1:7400"));
        }
        Ok(NodeAddr { key: key.to_ascii_lowercase(), addr: addr.to_string(), http: None })
    }
}

/// Client → node.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClientMsg {
    /// Which nodes serve the sim where this account's avatar is (any node answers); an account
    /// without an avatar anywhere is sent to the answering node's own sim.
    Route {
        account: String,
    },
    /// The area of interest: follow this account's avatar (and hear chat where it stands), out to
    /// `radius_m` (default: the sim's setting). Without one a client sees the whole sim. At most
    /// `max_hz` deltas a second (default: one per tick); each covers the ticks since the last.
    Interest {
        follow: Option<String>,
        radius_m: Option<u32>,
        max_hz: Option<u32>,
    },
    /// A signed event: hex of its postcard bytes.
    Submit {
        r#ref: u64,
        event: String,
    },
    Object {
        id: String,
    },
    Account {
        id: String,
    },
    /// `Route`, for an account that enters the world at a point: one without an avatar anywhere
    /// is sent to the sim whose square holds `at` (world metres; the node finds it through
    /// Raynet). Answered with `route`.
    Enter {
        account: String,
        at: [i64; 2],
    },
    /// A round-trip probe: answered with `pong` at once (clients measure the nodes of their
    /// sim with it and use the nearest).
    Ping {
        r#ref: u64,
    },
    /// Who governs the sim (its admin, temp admin and validators): answered with `governance`.
    Governance {},
}

/// Node → client.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum ServerMsg {
    Status(Box<Status>),
    /// Objects that entered the area (whole), changed in it (only what changed), left it.
    Tick {
        tick: Tick,
        enter: Vec<ObjectView>,
        update: Vec<ObjectUpdate>,
        leave: Vec<String>,
    },
    Chat(ChatView),
    Route {
        sim: u32,
        nodes: Vec<NodeAddr>,
    },
    /// The followed avatar crossed into the neighbour sim `sim`: continue on one of its nodes.
    Moved {
        sim: u32,
        nodes: Vec<NodeAddr>,
    },
    Submitted {
        r#ref: u64,
        id: String,
    },
    Outcome {
        id: String,
        outcome: Outcome,
    },
    Object {
        object: Option<Box<ObjectView>>,
    },
    Account {
        id: String,
        account: Option<AccountView>,
    },
    Error {
        r#ref: Option<u64>,
        message: String,
    },
    Pong {
        r#ref: u64,
    },
    Governance(Box<GovernanceView>),
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes is over the limit of {1}")]
    TooLarge(usize, usize),
    #[error("not a message of the protocol: {0}")]
    Decode(#[from] postcard::Error),
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("the stream ended")]
    Closed,
}

/// A message as one frame: a 4-byte big-endian length, then its postcard bytes.
pub fn encode_frame<T: Serialize>(m: &T) -> Vec<u8> {
    // Encoded behind room for its length, in one buffer (a node encodes a delta a client a
    // tick: a second buffer and a copy each showed in its profile with a crowd).
    let mut out = postcard::to_extend(m, Vec::from([0u8; 4])).unwrap_or_else(|_| vec![0u8; 4]);
    let n = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&n.to_be_bytes());
    out
}

/// Write one frame.
pub async fn write_frame<T: Serialize, W: tokio::io::AsyncWrite + Unpin>(w: &mut W, m: &T) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    w.write_all(&encode_frame(m)).await
}

/// Read one frame of at most `max` bytes. A clean end of stream before a frame is `Closed`.
pub async fn read_frame<T: serde::de::DeserializeOwned, R: tokio::io::AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<T, FrameError> {
    use tokio::io::AsyncReadExt;
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > max {
        return Err(FrameError::TooLarge(n, max));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).await?;
    Ok(postcard::from_bytes(&body)?)
}

pub use crate::keys::{hex, unhex};

#[cfg(test)]
mod tests {
    use super::*;

    fn object(id: &str, x: &str, y: &str) -> ObjectView {
        ObjectView {
            id: id.into(),
            name: "door".into(),
            owner: "ab".repeat(32),
            avatar: false,
            position: [x.into(), y.into()],
            velocity: ["0".into(), "0".into()],
            shape: "box 1 0.5".into(),
            color: "ff0000ff".into(),
            text: "closed".into(),
            script: None,
            scripted: true,
            body: "static".into(),
            surface: String::new(),
        }
    }

    #[tokio::test]
    async fn frames_round_trip() {
        let msgs = vec![
            ServerMsg::Tick {
                tick: Tick(9),
                enter: vec![object("1v0", "12.5", "-3.25")],
                update: vec![],
                leave: vec!["2v1".into()],
            },
            ServerMsg::Outcome {
                id: "ab".into(),
                outcome: Outcome::Refused { tick: Tick(3), reason: "banned".into() },
            },
            ServerMsg::Route {
                sim: 2,
                nodes: vec![NodeAddr { key: "c".repeat(64), addr: "127.0.0.1:1".into(), http: None }],
            },
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            write_frame(&mut buf, m).await.unwrap();
        }
        let mut r = &buf[..];
        for m in &msgs {
            let back: ServerMsg = read_frame(&mut r, MAX_SERVER_FRAME).await.unwrap();
            assert_eq!(&back, m);
        }
        assert!(matches!(read_frame::<ServerMsg, _>(&mut r, MAX_SERVER_FRAME).await, Err(FrameError::Closed)));
    }

    #[tokio::test]
    async fn oversized_and_garbage_frames_are_errors_not_panics() {
        let mut big = Vec::new();
        big.extend_from_slice(&(MAX_CLIENT_FRAME as u32 + 1).to_be_bytes());
        let mut r = &big[..];
        assert!(matches!(read_frame::<ClientMsg, _>(&mut r, MAX_CLIENT_FRAME).await, Err(FrameError::TooLarge(..))));
        let mut garbage = vec![0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff];
        let mut r = &garbage[..];
        assert!(matches!(read_frame::<ClientMsg, _>(&mut r, MAX_CLIENT_FRAME).await, Err(FrameError::Decode(_))));
        garbage.truncate(6);
        let mut r = &garbage[..];
        assert!(matches!(read_frame::<ClientMsg, _>(&mut r, MAX_CLIENT_FRAME).await, Err(FrameError::Io(_))));
    }

    proptest::proptest! {
        /// The node decodes whatever a client sends: arbitrary bytes are an error or a message,
        /// never a panic, and never an allocation beyond the frame limit.
        #[test]
        fn arbitrary_client_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let mut r = &bytes[..];
                while let Ok(m) = read_frame::<ClientMsg, _>(&mut r, MAX_CLIENT_FRAME).await {
                    // What decodes encodes back to the same message.
                    let again = encode_frame(&m);
                    let back: ClientMsg = read_frame(&mut &again[..], MAX_CLIENT_FRAME).await.unwrap();
                    proptest::prop_assert_eq!(back, m);
                }
                Ok(())
            })?;
        }

        #[test]
        fn a_length_prefix_over_the_limit_is_refused_before_reading(len in (MAX_CLIENT_FRAME as u32 + 1)..u32::MAX) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let bytes = len.to_be_bytes();
            let got = rt.block_on(read_frame::<ClientMsg, _>(&mut &bytes[..], MAX_CLIENT_FRAME));
            proptest::prop_assert!(matches!(got, Err(FrameError::TooLarge(..))));
        }
    }

    #[test]
    fn an_update_carries_only_what_changed() {
        let old = object("4v1", "1.5", "2");
        let mut new = old.clone();
        new.position[1] = "2.25".into();
        new.text = "open".into();
        let u = ObjectUpdate::between(&old, &new);
        assert_eq!(u.at_mm, Some([1500, 2250]));
        assert_eq!((u.color.as_deref(), u.name.as_deref(), u.scripted), (None, None, None));
        let mut back = old.clone();
        u.apply(&mut back);
        assert_eq!(back, new);
        assert!(postcard::to_allocvec(&u).unwrap().len() < postcard::to_allocvec(&new).unwrap().len() / 3);
    }

    /// Postcard is not self-describing: a field the encoder skips shifts every later one (a
    /// `skip_serializing_if` once closed every client's connection). Views and updates with
    /// every optional field empty, and with every one set, come back whole.
    #[test]
    fn views_and_updates_survive_the_wire_with_fields_empty_or_set() {
        let view = object("4v1", "1.5", "2");
        let empty = ObjectUpdate { id: "4v1".into(), ..ObjectUpdate::default() };
        let mut other = view.clone();
        (other.text, other.name, other.body, other.scripted) = ("t".into(), "n".into(), "dynamic".into(), false);
        (other.color, other.shape, other.owner) = ("00ff00ff".into(), "circle 2".into(), "cd".repeat(32));
        other.surface = "friction 1 restitution 0 damping 2".into();
        other.velocity = ["1".into(), "2".into()];
        let full = ObjectUpdate::between(&view, &other);
        assert!(full.body.is_some() && full.vel_mm.is_some() && full.owner.is_some());
        let msg = ServerMsg::Tick {
            tick: Tick(9),
            enter: vec![view.clone()],
            update: vec![empty, full],
            leave: vec!["1v0".into()],
        };
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let mut buf = Vec::new();
        rt.block_on(write_frame(&mut buf, &msg)).unwrap();
        let back: ServerMsg = rt.block_on(read_frame(&mut &buf[..], MAX_CLIENT_FRAME * 64)).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn later_updates_fold_into_earlier_ones() {
        let mut a =
            ObjectUpdate { id: "1v0".into(), text: Some("open".into()), at_mm: Some([1, 2]), ..Default::default() };
        a.merge(&ObjectUpdate {
            id: "1v0".into(),
            at_mm: Some([3, 4]),
            color: Some("ff".into()),
            ..Default::default()
        });
        assert_eq!((a.text.as_deref(), a.at_mm, a.color.as_deref()), (Some("open"), Some([3, 4]), Some("ff")));
        assert!(!a.is_empty());
        assert!(ObjectUpdate { id: "2v0".into(), ..Default::default() }.is_empty());
    }

    #[test]
    fn millimetres_round_down_and_print_back() {
        for (d, mm) in [
            ("0", 0),
            ("12.5", 12500),
            ("12.3759", 12375),
            ("-0.5", -500),
            ("-3", -3000),
            ("-1.0001", -1001),
            ("-2.25", -2250),
        ] {
            assert_eq!(millimetres(d), mm, "{d}");
        }
        for mm in [0, 1, -1, 999, -1000, 12345, -12340] {
            assert_eq!(millimetres(&decimal_of_mm(mm)), mm, "{mm}");
        }
        assert_eq!(decimal_of_mm(-12340), "-12.34");
        assert_eq!(decimal_of_mm(7000), "7");
        // The same text as the plain formatting it replaced, into a reused buffer too.
        let plain = |mm: i64| {
            let sign = if mm < 0 { "-" } else { "" };
            let (m, r) = (mm.unsigned_abs() / 1000, mm.unsigned_abs() % 1000);
            if r == 0 { format!("{sign}{m}") } else { format!("{sign}{m}.{}", format!("{r:03}").trim_end_matches('0')) }
        };
        let mut buf = String::from("left over");
        for mm in (-30_000..30_000).chain([i64::MIN, i64::MAX, 1_000_001, -999_999_990]) {
            write_decimal_of_mm(&mut buf, mm);
            assert_eq!(buf, plain(mm), "{mm}");
        }
        // Reading without building a string reads what building one read, odd texts too.
        let built = |decimal: &str| {
            let (int, frac) = decimal.split_once('.').unwrap_or((decimal, ""));
            let i: i64 = int.parse().unwrap_or(0);
            let digits: String = frac.chars().chain("000".chars()).take(3).collect();
            let f: i64 = digits.parse().unwrap_or(0);
            let exact = frac.len() <= 3 || frac[3..].bytes().all(|b| b == b'0');
            match (int.starts_with('-'), f, exact) {
                (false, _, _) => i * 1000 + f,
                (true, 0, true) => i * 1000,
                (true, _, true) => i * 1000 - f,
                (true, _, false) => i * 1000 - f - 1,
            }
        };
        for d in ["1.2", "1.23", "-0.001", "5.", ".5", "-.25", "x.1", "1.a", "1.+5", "2.0000", "-7.1000001", "3.99999"]
        {
            assert_eq!(millimetres(d), built(d), "{d}");
        }
    }

    #[test]
    fn node_addresses_parse_with_clear_errors() {
        let key = "AB".repeat(32);
        let a: NodeAddr = format!("{key}@127.0.0.1:7400").parse().unwrap();
        assert_eq!(a.key, "ab".repeat(32));
        assert_eq!(a.to_string(), format!("{}@127.0.0.1:7400", "ab".repeat(32)));
        assert!("127.0.0.1:7400".parse::<NodeAddr>().unwrap_err().contains("KEY@HOST:PORT"));
        assert!(format!("{key}@localhost").parse::<NodeAddr>().unwrap_err().contains("port"));
        assert!("abc@127.0.0.1:1".parse::<NodeAddr>().unwrap_err().contains("64 hex"));
    }

    #[test]
    fn whole_metres_round_down_and_chat_carries_its_range() {
        assert_eq!(whole_metres("12.75"), 12);
        assert_eq!(whole_metres("-0.5"), -1);
        assert_eq!(whole_metres("-3"), -3);
        assert_eq!(whole_metres("-3.000"), -3);
        assert_eq!(object("1v0", "128.9", "-1.1").metres(), [128, -2]);
        let line = ChatView {
            tick: Tick(1),
            name: "a".into(),
            channel: 0,
            text: "hi".into(),
            position: [100, 100],
            range_m: 20,
            to: None,
        };
        assert!(line.heard_at([112, 116])); // 20 m exactly
        assert!(!line.heard_at([112, 117]));
        assert_eq!(unhex(&hex(&[1, 0xab, 255])), Some(vec![1, 0xab, 255]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
