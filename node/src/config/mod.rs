//! `config.toml`: what a node runs. Unknown keys and bad values are errors that name the line.
//! [`reference`](mod@reference) renders every key, from the doc comments below, as `docs/config.md`.

pub mod reference;

use std::net::SocketAddr;
use std::path::Path;

use metatopia_client::keys::KeyError;

/// What is wrong with a node's config, said for its operator (the file, the field, the rule).
/// Each error carries its cause in its message, so it says all of itself however it is printed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {cause}")]
    Read { path: String, cause: std::io::Error },
    #[error("{path}: {msg}")]
    Parse { path: String, msg: String },
    #[error("checking {path}: {cause}")]
    Check { path: String, cause: Box<ConfigError> },
    /// A rule the config breaks.
    #[error("{0}")]
    Invalid(String),
    /// A key or hash field that does not parse.
    #[error("{field}: {cause}")]
    Key { field: String, cause: KeyError },
    /// A join address field that does not parse.
    #[error("{field}: {cause}")]
    Field { field: String, cause: Box<ConfigError> },
}

/// The config's results.
pub type Result<T, E = ConfigError> = std::result::Result<T, E>;

/// `Err(ConfigError::Invalid(..))` unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(ConfigError::Invalid(format!($($fmt)+)));
        }
    };
}

fn key_field(field: impl Into<String>) -> impl FnOnce(KeyError) -> ConfigError {
    let field = field.into();
    move |cause| ConfigError::Key { field, cause }
}

fn join_field(field: impl Into<String>) -> impl FnOnce(ConfigError) -> ConfigError {
    let field = field.into();
    move |cause| ConfigError::Field { field, cause: Box::new(cause) }
}
use metatopia_consensus::VerifyingKey;
use serde::{Deserialize, Serialize};

/// How long a validator waits for a view's proposal before it votes to skip the view: what a
/// dead or silent leader costs the sim, once per view it would lead.
pub const LEADER_TIMEOUT_US: u64 = 400_000;

/// The most time of ticks one agreed block covers (consensus' `max_span_us`): a block that
/// comes later than a tick period after its parent (a round trip longer than a period, a view
/// lost to a dead leader, twice with the view timeouts raised) covers the ticks due meanwhile,
/// so the sim keeps its rate at any latency up to about this; longer stalls slow the sim (time
/// dilation) rather than make it run a burst of ticks longer than this.
pub const MAX_SPAN_US: u64 = 2_000_000;

/// How long before a tick is due its events are proposed (consensus' `fill_lead_us`): each
/// tick is opened by an empty block and its events follow in a second one this long before
/// the next tick's block, so a client's event waits about half a period for its block and this
/// lead and a round more for its execution, where one block a tick made it wait a period more.
/// Time for the fill's notarization on a LAN; across longer round trips every block carries
/// events, as without fills.
pub const FILL_LEAD_US: u64 = 2_000;

/// The node's configuration file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Where this node listens for its peers over TCP (libp2p: noise + yamux), and for clients
    /// over QUIC (UDP, the same port).
    pub listen: SocketAddr,
    /// Where this node listens for its peers over QUIC (libp2p, UDP). Peers dial QUIC first and
    /// fall back to TCP; without it, TCP only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<SocketAddr>,
    /// The HTTP service (`/healthz`, `/readyz`, `/metrics`, the API of `stats` and `admin`).
    /// Default: the peers' address with the port + 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<SocketAddr>,
    /// The sim's tick rate.
    #[serde(default = "default_rate")]
    pub tick_rate_hz: u32,
    /// Write a snapshot every this many ticks.
    #[serde(default = "default_snapshot_every")]
    pub snapshot_every: u64,
    /// Threads a tick's parallel stages (scripts, physics islands, leaf hashing) split their
    /// work over, 1..=64. The results never depend on it (DESIGN §5). Default: one per core,
    /// at most 8. On a machine whose cores are all busy with other nodes, 1 is faster (a
    /// hand-over to a second thread costs a wake-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim_workers: Option<u32>,
    /// Finalized blocks this node keeps in memory for peers that fall a little behind, in MiB
    /// (1..=65536; default 256): the newest 2,048 ticks' blocks, fewer when they hold more than
    /// this (always the newest 64), read back from the commit log after a restart. A peer
    /// further behind (64 ticks, for 10 s) catches up from a snapshot its peers certify.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_history_mib: Option<u64>,
    /// The hash of the sim's genesis (`genesis.bin` in the data directory, as `metatopia sim
    /// new`, `init --genesis` or a join wrote it): a node refuses a genesis file that differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub genesis_hash: Option<String>,
    /// The sim this node belongs to; with `demo = true` only, a seeded demo world (devnet, tests).
    #[serde(default)]
    pub world: WorldConfig,
    /// Bots this node runs (signed events it submits every tick).
    #[serde(default)]
    pub bots: BotsConfig,
    /// The sim's validators, in index order (every node of the sim lists the same ones).
    pub validators: Vec<ValidatorEntry>,
    /// Set by `run --join KEY@HOST:PORT`: the node this one joined the sim through. A node in no
    /// `[[validators]]` list follows the sim (and serves clients) through it and the listed
    /// nodes, and votes once the admin admits its key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<String>,
    /// The other sims of a world of several sims (a scenario with `world.sims > 1`): each one's
    /// id and validators. A sim takes a neighbour's mail only when f + 1 of that neighbour's
    /// validators signed it, and this node sends its own sim's mail to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sims: Vec<SimEntry>,
    /// The Raynet overlay: how this node finds the nodes of other sims.
    #[serde(default, skip_serializing_if = "RaynetConfig::is_default")]
    pub raynet: RaynetConfig,
    /// Reachability behind NAT routers: relays and hole punching.
    #[serde(default, skip_serializing_if = "NetworkConfig::is_default")]
    pub network: NetworkConfig,
}

/// `[network]`: how a node at home is reached. A node finds out whether it is publicly
/// reachable (AutoNAT: its peers dial it back); one that is not holds reservations on two
/// publicly reachable nodes of the world and is reached through them (Circuit Relay v2), and a
/// relayed connection becomes a direct one by hole punching where the NATs allow it. A publicly
/// reachable node relays for the world's nodes within the limits below.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// `"auto"` (AutoNAT decides), `"public"` (the listen address is reachable from the
    /// internet) or `"private"` (behind a NAT or firewall: take reservations at once).
    #[serde(default = "default_reachability")]
    pub reachability: String,
    /// Upgrade relayed connections to direct ones by hole punching (DCUtR).
    #[serde(default = "yes")]
    pub hole_punching: bool,
    /// Reservations this node's relay holds at once (nodes of the world only).
    #[serde(default = "default_relay_reservations")]
    pub relay_reservations: u32,
    /// Circuits this node's relay carries at once (8 per peer, 30 new ones a minute per peer).
    #[serde(default = "default_relay_circuits")]
    pub relay_circuits: u32,
    /// Bytes one relayed circuit carries before it is closed (and dialed again), MiB.
    #[serde(default = "default_relay_circuit_mib")]
    pub relay_circuit_mib: u64,
    /// How long one relayed circuit lasts before it is closed (and dialed again), seconds.
    #[serde(default = "default_relay_circuit_secs")]
    pub relay_circuit_secs: u64,
}

fn default_reachability() -> String {
    "auto".to_owned()
}

fn yes() -> bool {
    true
}

fn default_relay_reservations() -> u32 {
    64
}

fn default_relay_circuits() -> u32 {
    128
}

fn default_relay_circuit_mib() -> u64 {
    1024
}

fn default_relay_circuit_secs() -> u64 {
    3600
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            reachability: default_reachability(),
            hole_punching: true,
            relay_reservations: default_relay_reservations(),
            relay_circuits: default_relay_circuits(),
            relay_circuit_mib: default_relay_circuit_mib(),
            relay_circuit_secs: default_relay_circuit_secs(),
        }
    }
}

impl NetworkConfig {
    fn is_default(&self) -> bool {
        *self == NetworkConfig::default()
    }

    /// The mesh's options from this section (and the test-only delay stage).
    pub fn mesh_options(&self, delay: crate::net::LinkDelay) -> crate::net::MeshOptions {
        use crate::net::reach::{Reachability, RelayLimits};
        let reachability = match self.reachability.as_str() {
            "public" => Some(Reachability::Public),
            "private" => Some(Reachability::Private),
            _ => None,
        };
        crate::net::MeshOptions {
            delay,
            relay: RelayLimits {
                reservations: self.relay_reservations as usize,
                circuits: self.relay_circuits as usize,
                circuit_bytes: self.relay_circuit_mib.saturating_mul(1 << 20),
                circuit_duration: std::time::Duration::from_secs(self.relay_circuit_secs),
                ..RelayLimits::default()
            },
            reachability,
            no_hole_punching: !self.hole_punching,
        }
    }
}

/// Another sim of the world, and its validators' keys (its genesis validator set, which this
/// sim's genesis names). Their addresses are found through Raynet; one given here is also a
/// contact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimEntry {
    /// That sim's id (its `[world] sim_id`).
    pub sim_id: u32,
    /// Its validators (its genesis validator set).
    pub validators: Vec<SimValidator>,
}

/// A validator of another sim: its key, and optionally where it listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimValidator {
    /// The validator's public key, 64 hex digits.
    #[serde(deserialize_with = "public_key")]
    pub key: String,
    /// Where it listens for peers over TCP, if known (then it is also a contact); otherwise
    /// found through Raynet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<SocketAddr>,
    /// Where it listens for peers over QUIC, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<SocketAddr>,
    /// It follows that sim without voting (until that sim's admin admits it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observer: bool,
}

impl SimValidator {
    /// Another sim's validator known by its key alone (its address comes through Raynet).
    pub fn key_of(v: &ValidatorEntry) -> SimValidator {
        SimValidator { key: v.key.clone(), address: None, quic: None, observer: v.observer }
    }

    /// With its addresses, as a contact.
    pub fn with_address(v: &ValidatorEntry) -> SimValidator {
        SimValidator { key: v.key.clone(), address: Some(v.address), quic: v.quic, observer: v.observer }
    }
}

/// `[raynet]`: the overlay every node of a world is a peer of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RaynetConfig {
    /// Nodes to start from (join addresses, `KEY@HOST:PORT`), of any sim: this node says hello
    /// to them, and they bring it into the overlay. A node also starts from its own sim's nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bootstrap: Vec<String>,
    /// Milliseconds between two gossip rounds.
    #[serde(default = "default_round_ms")]
    pub round_ms: u32,
}

fn default_round_ms() -> u32 {
    500
}

impl Default for RaynetConfig {
    fn default() -> Self {
        RaynetConfig { bootstrap: Vec::new(), round_ms: default_round_ms() }
    }
}

impl RaynetConfig {
    fn is_default(&self) -> bool {
        *self == RaynetConfig::default()
    }
}

/// `[world]`: the sim this node belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorldConfig {
    /// A demo sim: its genesis is built from `seed`, `objects`, `players` or `scenario`, with
    /// **demo keys anyone can derive** (its admin's included). For devnets and tests only; a
    /// real sim's genesis comes from `metatopia sim new`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub demo: bool,
    /// A demo sim's genesis time, Unix milliseconds (every node of the sim the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub genesis_time_ms: Option<u64>,
    /// A demo sim's seed (its objects, players and their keys).
    #[serde(default = "one")]
    pub seed: u64,
    /// A demo sim's random prims.
    #[serde(default)]
    pub objects: u32,
    /// A demo sim's players (accounts with avatars, whose keys the bots sign with).
    #[serde(default = "one_u32")]
    pub players: u32,
    /// A distinct number per sim (goes into every signed event).
    pub sim_id: u32,
    /// A demo sim's time scale: sim milliseconds per BFT millisecond (1: real time; tests make
    /// governance days pass faster). A real sim's is in its genesis (`[world] time_scale` of
    /// the world file `sim new` read).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub time_scale: u64,
    /// Build the genesis world from this scenario file instead of the demo world (its
    /// objects, scripts, accounts and settings; `seed` seeds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<std::path::PathBuf>,
    /// Where the scenario's `script = ...` files are (default: ../scripts next to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scripts: Option<std::path::PathBuf>,
}

fn one() -> u64 {
    1
}

fn one_u32() -> u32 {
    1
}

fn is_one(x: &u64) -> bool {
    *x == 1
}

impl Default for WorldConfig {
    fn default() -> Self {
        WorldConfig {
            demo: false,
            genesis_time_ms: None,
            seed: 1,
            objects: 300,
            players: 20,
            sim_id: 1,
            time_scale: 1,
            scenario: None,
            scripts: None,
        }
    }
}

impl WorldConfig {
    /// A demo sim's world (devnets, tests): the seeded demo world with demo keys, its genesis at
    /// `genesis_time_ms` (Unix milliseconds).
    pub fn demo(genesis_time_ms: u64) -> WorldConfig {
        WorldConfig { demo: true, genesis_time_ms: Some(genesis_time_ms), ..WorldConfig::default() }
    }
}

/// `[bots]`: load this node makes itself (devnets and benchmarks).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BotsConfig {
    /// Signed events per tick (0: no bots on this node).
    pub events_per_tick: u32,
}

/// `[[validators]]`: one validator of this node's sim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidatorEntry {
    /// The validator's public key, 64 hex digits.
    #[serde(deserialize_with = "public_key")]
    pub key: String,
    /// Where it listens for its peers over TCP (and for clients over QUIC, the same port).
    pub address: SocketAddr,
    /// Its QUIC address for peers (libp2p, UDP); without one, peers reach it over TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quic: Option<SocketAddr>,
    /// Its HTTP service (the web viewer), which viewers are sent to when it is their nearest
    /// node. Default: its address with the port + 1000 (a node's own default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<SocketAddr>,
    /// A node of the sim that starts as an observer: it executes every tick and serves clients
    /// but does not vote, until the admin admits its key (`admit-validator`; it votes from the
    /// next epoch boundary on).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observer: bool,
}

/// A public key's text, checked as it is read, so that a bad one is an error naming its line.
fn public_key<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let text = String::deserialize(d)?;
    parse_public(&text).map_err(|e| serde::de::Error::custom(format!("{e:#}")))?;
    Ok(text)
}

fn default_rate() -> u32 {
    20
}

fn default_snapshot_every() -> u64 {
    640
}

impl NodeConfig {
    pub fn load(path: &Path) -> Result<NodeConfig> {
        let shown = || path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|cause| ConfigError::Read { path: shown(), cause })?;
        let cfg: NodeConfig =
            toml::from_str(&text).map_err(|e| ConfigError::Parse { path: shown(), msg: e.to_string() })?;
        cfg.check().map_err(|cause| ConfigError::Check { path: shown(), cause: Box::new(cause) })?;
        Ok(cfg)
    }

    pub fn check(&self) -> Result<()> {
        ensure!((1..=240).contains(&self.tick_rate_hz), "tick_rate_hz must be 1..=240, not {}", self.tick_rate_hz);
        let every = metatopia_physics::region::FULL_ROOT_EVERY;
        ensure!(
            self.snapshot_every >= every && self.snapshot_every.is_multiple_of(every),
            "snapshot_every must be a multiple of {every} (the ticks whose root covers the whole physics state), not {}",
            self.snapshot_every
        );
        let voting = self.validators.iter().filter(|v| !v.observer).count();
        // A node made by `init` alone waits for a genesis (`sim new`, `init --genesis`) or a join:
        // it lists no validators yet.
        let awaiting = self.genesis_hash.is_none() && !self.world.demo && self.validators.is_empty();
        ensure!(
            awaiting || voting >= 4,
            "validators: a sim needs at least 4 (n = 3f + 1 with f >= 1), this config lists {voting} (not counting observers); add the others' keys and addresses",
        );
        if let Some(h) = &self.genesis_hash {
            parse_hex32(h).map_err(key_field("genesis_hash"))?;
        }
        ensure!(self.world.time_scale >= 1, "world.time_scale must be at least 1");
        ensure!(
            !self.world.demo || self.world.genesis_time_ms.is_some(),
            "world.demo needs world.genesis_time_ms: the demo sim's genesis time in Unix milliseconds, the same on every node"
        );
        ensure!(
            self.world.demo || self.bots.events_per_tick == 0,
            "bots sign as a demo world's players: they need world.demo = true"
        );
        ensure!(self.validators.len() <= 100, "validators: at most 100");
        ensure!(
            ["auto", "public", "private"].contains(&self.network.reachability.as_str()),
            "network.reachability must be \"auto\", \"public\" or \"private\", not {:?}",
            self.network.reachability
        );
        ensure!(
            self.network.relay_circuit_mib >= 1 && self.network.relay_circuit_secs >= 10,
            "network.relay_circuit_mib must be at least 1 and network.relay_circuit_secs at least 10"
        );
        ensure!(!self.world.demo || self.world.players >= 1, "world.players must be at least 1");
        for (i, v) in self.validators.iter().enumerate() {
            parse_public(&v.key).map_err(key_field(format!("validators[{i}].key")))?;
        }
        if let Some(j) = &self.join {
            parse_join(j).map_err(join_field("join"))?;
        }
        for (i, b) in self.raynet.bootstrap.iter().enumerate() {
            parse_join(b).map_err(join_field(format!("raynet.bootstrap[{i}]")))?;
        }
        if let Some(w) = self.sim_workers {
            ensure!((1..=64).contains(&w), "sim_workers must be 1..=64, not {w}");
        }
        if let Some(m) = self.block_history_mib {
            ensure!((1..=65_536).contains(&m), "block_history_mib must be 1..=65536, not {m}");
        }
        ensure!(
            (50..=60_000).contains(&self.raynet.round_ms),
            "raynet.round_ms must be 50..=60000, not {}",
            self.raynet.round_ms
        );
        let mut ids = std::collections::BTreeSet::from([self.world.sim_id]);
        for (i, s) in self.sims.iter().enumerate() {
            ensure!(ids.insert(s.sim_id), "sims[{i}]: sim {} is listed twice (or is this node's own sim)", s.sim_id);
            ensure!(!s.validators.is_empty(), "sims[{i}] (sim {}): no validators", s.sim_id);
            for (j, v) in s.validators.iter().enumerate() {
                parse_public(&v.key).map_err(key_field(format!("sims[{i}].validators[{j}].key")))?;
            }
        }
        Ok(())
    }

    /// The genesis validators of another sim of the world, from `[[sims]]`.
    pub fn sim_validators(&self, sim_id: u32) -> Result<Option<Vec<VerifyingKey>>> {
        let Some(s) = self.sims.iter().find(|s| s.sim_id == sim_id) else { return Ok(None) };
        s.validators
            .iter()
            .filter(|v| !v.observer)
            .map(|v| parse_public(&v.key).map_err(key_field("sims.validators.key")))
            .collect::<Result<_>>()
            .map(Some)
    }

    /// Threads for the tick's parallel stages: `sim_workers`, or one per core, at most 8.
    pub fn sim_workers(&self) -> u32 {
        self.sim_workers.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(8) as u32))
    }

    /// The bytes of finalized blocks kept for peers a little behind (`block_history_mib`).
    pub fn block_history_bytes(&self) -> u64 {
        self.block_history_mib.map_or(metatopia_consensus::Config::default().keep_bytes, |m| m << 20)
    }

    /// Where the HTTP service listens.
    pub fn http_addr(&self) -> SocketAddr {
        self.http.unwrap_or_else(|| SocketAddr::new(self.listen.ip(), self.listen.port().wrapping_add(1000)))
    }

    /// Every node of the sim's mesh, validators and observers, in index order.
    pub fn keys(&self) -> Result<Vec<VerifyingKey>> {
        self.validators.iter().map(|v| parse_public(&v.key).map_err(key_field("validators.key"))).collect()
    }

    /// The genesis validator set: the entries that are not observers.
    pub fn genesis_validators(&self) -> Result<Vec<VerifyingKey>> {
        self.validators
            .iter()
            .filter(|v| !v.observer)
            .map(|v| parse_public(&v.key).map_err(key_field("validators.key")))
            .collect()
    }

    /// A commented config for a new node (`metatopia init`).
    pub fn commented(&self) -> String {
        let body = toml::to_string_pretty(self).expect("a config serializes");
        format!(
            "# Metatopia node config. Precedence: command-line flags > METATOPIA_* environment > this file.\n\
             # listen: address for peers. tick_rate_hz: the sim's rate. snapshot_every: ticks between snapshots.\n\
             # genesis_hash: the hash of this sim's genesis (genesis.bin beside this file; `metatopia sim show`).\n\
             # [world]: sim_id; `demo = true` marks a devnet's or a test's seeded demo world (public keys).\n\
             # [bots]: signed events per tick this node submits (demo worlds only).\n\
             # [[validators]]: the sim's nodes, in index order, the same on every node; `observer = true`\n\
             # marks a node that follows (and serves clients) until the admin admits its key.\n\
             # [[sims]]: in a world of several sims, the other sims (sim_id, validators' keys; their\n\
             # addresses are found through Raynet). [raynet]: bootstrap = [\"KEY@HOST:PORT\", ...], round_ms.\n\
             # sim_workers = N: threads for a tick's parallel stages (default: one per core, at most 8).\n\
             # block_history_mib = N: finalized blocks kept in memory for peers a little behind (default 256).\n\n{body}"
        )
    }
}

/// A join address, `KEY@HOST:PORT`: a node's public key (64 hex digits) and its peer address;
/// `KEY@HOST:PORT/HASH` names the sim's genesis hash too (see [`parse_join_genesis`]).
pub fn parse_join(s: &str) -> Result<(VerifyingKey, SocketAddr)> {
    parse_join_genesis(s).map(|(k, a, _)| (k, a))
}

/// A join address with the genesis hash it may name (`KEY@HOST:PORT/HASH`): a node joining
/// through it refuses a sim whose genesis has another hash.
pub fn parse_join_genesis(s: &str) -> Result<(VerifyingKey, SocketAddr, Option<[u8; 32]>)> {
    let (key, rest) = s.split_once('@').ok_or_else(|| {
        ConfigError::Invalid(format!("a join address is KEY@HOST:PORT (as `init` and `devnet` print it), not {s:?}"))
    })?;
    let key = parse_public(key).map_err(key_field("the key before '@'"))?;
    let (addr, genesis) = match rest.split_once('/') {
        Some((a, h)) => (a, Some(parse_hex32(h).map_err(key_field("the genesis hash after '/'"))?)),
        None => (rest, None),
    };
    let addr = addr.parse().map_err(|e| ConfigError::Invalid(format!("{addr:?} is not HOST:PORT ({e})")))?;
    Ok((key, addr, genesis))
}

pub use metatopia_client::keys::{parse_hex32, parse_public};

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
listen = "127.0.0.1:7000"
tick_rate_hz = 30
[world]
seed = 5
objects = 10
players = 2
sim_id = 1
[[validators]]
key = "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29"
address = "127.0.0.1:7000"
[[validators]]
key = "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29"
address = "127.0.0.1:7001"
[[validators]]
key = "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29"
address = "127.0.0.1:7002"
[[validators]]
key = "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29"
address = "127.0.0.1:7003"
"#;

    #[test]
    fn a_good_config_loads_with_defaults() {
        let c: NodeConfig = toml::from_str(GOOD).unwrap();
        c.check().unwrap();
        assert_eq!(c.tick_rate_hz, 30);
        assert_eq!(c.snapshot_every, 640);
        assert_eq!(c.bots.events_per_tick, 0);
        // What `init` writes reads back the same.
        let again: NodeConfig = toml::from_str(&c.commented()).unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn join_addresses_parse_or_say_what_is_wrong() {
        let key = "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29";
        let (k, a) = parse_join(&format!("{key}@127.0.0.1:7400")).unwrap();
        assert_eq!((metatopia_sim::ids::hex(k.as_bytes()), a.port()), (key.to_owned(), 7400));
        assert!(parse_join("127.0.0.1:7400").unwrap_err().to_string().contains("KEY@HOST:PORT"));
        assert!(format!("{:#}", parse_join(&format!("{key}@nowhere")).unwrap_err()).contains("HOST:PORT"));
        assert!(format!("{:#}", parse_join("abc@127.0.0.1:1").unwrap_err()).contains("64 hex digits"));
    }

    #[test]
    fn an_unknown_key_is_an_error_naming_it_and_its_line() {
        let bad = GOOD.replace("tick_rate_hz = 30", "tick_rate_hz = 30\ntick_rat = 4");
        let e = toml::from_str::<NodeConfig>(&bad).unwrap_err().to_string();
        assert!(e.contains("tick_rat") && e.contains("line 4"), "{e}");
    }

    #[test]
    fn bad_values_are_errors_that_say_what_is_wrong() {
        let e = toml::from_str::<NodeConfig>(&GOOD.replace("127.0.0.1:7000\"\ntick", "nowhere\"\ntick")).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let c: NodeConfig = toml::from_str(&GOOD.replace("tick_rate_hz = 30", "tick_rate_hz = 0")).unwrap();
        assert!(c.check().unwrap_err().to_string().contains("tick_rate_hz"));
        // A bad key is refused as it is read, naming its line and what is wrong with it.
        let e = toml::from_str::<NodeConfig>(&GOOD.replacen("3b6a27bc", "zz6a27bc", 1)).unwrap_err().to_string();
        assert!(e.contains("line ") && e.contains("not 'z'"), "{e}");
        let mut c: NodeConfig = toml::from_str(GOOD).unwrap();
        c.validators.truncate(1);
        assert!(c.check().unwrap_err().to_string().contains("at least 4"));
        let c: NodeConfig = toml::from_str(&GOOD.replace("tick_rate_hz = 30", "sim_workers = 0")).unwrap();
        assert!(c.check().unwrap_err().to_string().contains("sim_workers must be 1..=64, not 0"));
        let c: NodeConfig = toml::from_str(&GOOD.replace("tick_rate_hz = 30", "block_history_mib = 0")).unwrap();
        assert!(c.check().unwrap_err().to_string().contains("block_history_mib must be 1..=65536, not 0"));
        let c: NodeConfig = toml::from_str(&GOOD.replace("tick_rate_hz = 30", "block_history_mib = 64")).unwrap();
        c.check().unwrap();
        assert_eq!(c.block_history_bytes(), 64 << 20);
        assert_eq!(toml::from_str::<NodeConfig>(&c.commented()).unwrap(), c, "what init writes reads back");
        let c: NodeConfig = toml::from_str(GOOD).unwrap();
        assert_eq!(c.block_history_bytes(), metatopia_consensus::Config::default().keep_bytes);
    }

    #[test]
    fn sim_workers_default_to_the_cores_and_can_be_set() {
        let c: NodeConfig = toml::from_str(GOOD).unwrap();
        let cores = std::thread::available_parallelism().unwrap().get().min(8) as u32;
        assert_eq!((c.sim_workers, c.sim_workers()), (None, cores));
        let one: NodeConfig = toml::from_str(&GOOD.replace("tick_rate_hz = 30", "sim_workers = 1")).unwrap();
        one.check().unwrap();
        assert_eq!(one.sim_workers(), 1);
        assert_eq!(toml::from_str::<NodeConfig>(&one.commented()).unwrap(), one, "what init writes reads back");
    }

    #[test]
    fn other_sims_are_checked_and_read() {
        let key = "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29";
        let sims =
            format!("{GOOD}[[sims]]\nsim_id = 2\n[[sims.validators]]\nkey = \"{key}\"\naddress = \"127.0.0.1:7010\"\n");
        let c: NodeConfig = toml::from_str(&sims).unwrap();
        c.check().unwrap();
        assert_eq!(c.sim_validators(2).unwrap().map(|v| v.len()), Some(1));
        assert_eq!(c.sim_validators(3).unwrap(), None);
        let again: NodeConfig = toml::from_str(&c.commented()).unwrap();
        assert_eq!(again, c, "what init writes reads back");
        // This node's own sim, a sim listed twice, a sim without validators, a bad key.
        let own: NodeConfig = toml::from_str(&sims.replace("sim_id = 2", "sim_id = 1")).unwrap();
        assert!(own.check().unwrap_err().to_string().contains("listed twice (or is this node's own sim)"));
        let mut twice = c.clone();
        twice.sims.push(c.sims[0].clone());
        assert!(twice.check().unwrap_err().to_string().contains("sim 2 is listed twice"));
        let mut empty = c.clone();
        empty.sims[0].validators.clear();
        assert!(empty.check().unwrap_err().to_string().contains("no validators"));
        let unknown = toml::from_str::<NodeConfig>(&sims.replace("7010\"", "7010\"\nfoo = 1")).unwrap_err();
        assert!(unknown.to_string().contains("foo"), "{unknown}");
        // A sim's validators may be listed by key alone (found through Raynet); bootstrap
        // contacts are join addresses, and a bad one is an error naming it.
        let keys_only = format!(
            "{GOOD}[raynet]\nbootstrap = [\"{key}@127.0.0.1:7000\"]\n[[sims]]\nsim_id = 2\n[[sims.validators]]\nkey = \"{key}\"\n"
        );
        let c: NodeConfig = toml::from_str(&keys_only).unwrap();
        c.check().unwrap();
        assert_eq!((c.sims[0].validators[0].address, c.raynet.round_ms), (None, 500));
        assert_eq!(toml::from_str::<NodeConfig>(&c.commented()).unwrap(), c, "what init writes reads back");
        let bad: NodeConfig = toml::from_str(&keys_only.replace("@127.0.0.1:7000", "")).unwrap();
        assert!(format!("{:#}", bad.check().unwrap_err()).contains("raynet.bootstrap[0]"));
        let at = sims.rfind(key).unwrap();
        let e = toml::from_str::<NodeConfig>(&format!("{}zz{}", &sims[..at], &sims[at + 2..])).unwrap_err().to_string();
        assert!(e.contains("line ") && e.contains("not 'z'"), "{e}");
    }
}
