//! Joining a sim through a join address (`run --join KEY@HOST:PORT[/HASH]`), both sides of the
//! handshake, without the network: what a node of the sim sends a joining node
//! ([`sim_info`]), and what the joining node accepts of the answer ([`adopt`]). The answer
//! comes from whichever node the address names, so it is checked as any peer's input:
//!
//! 1. The genesis must decode and check (as a genesis file does), and have the hash the join
//!    address names, if it names one (without one, the node says which hash it took).
//! 2. The config must load, name that genesis, and pass the checks every config passes.
//! 3. This node's own settings are its own, never the peer's: where it listens (mesh, QUIC,
//!    HTTP), its workers and block history; it runs no bots; it records the join address.
//!
//! The shell asks over a throwaway mesh and writes what [`adopt`] returns.

use crate::config::{ConfigError, NodeConfig};
use crate::net::wire::NodeMsg;
use crate::world::WorldError;
use crate::world::genesis::Genesis;

/// Why a join answer was refused, or a sim's answer could not be made.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The sim's config does not encode (a value TOML cannot hold).
    #[error("encoding the sim's config: {0}")]
    Encode(#[from] toml::ser::Error),
    /// The sim's genesis is too big for one mesh frame.
    #[error("the sim's genesis is over {max} bytes: too big to send to joining nodes")]
    TooBig { max: u32 },
    /// The genesis the peer sent does not decode or check.
    #[error("the genesis {join} sent: {cause}")]
    Genesis { join: String, cause: WorldError },
    /// The genesis is not the one the join address names.
    #[error("{join} serves a sim whose genesis hash is {got}, not the one the join address names: refused")]
    OtherGenesis { join: String, got: String },
    /// The config the peer sent does not parse.
    #[error("the config {join} sent does not load: {cause}")]
    Unloadable { join: String, cause: toml::de::Error },
    /// The config names another genesis than the one sent.
    #[error("{join} sent a config that names another genesis than the one it sent: refused")]
    Mismatch { join: String },
    /// The config breaks a rule every config keeps.
    #[error("the config {join} sent: {cause}")]
    Config { join: String, cause: ConfigError },
}

/// What a node joining this sim is sent: the sim's part of this node's config, and its
/// genesis. Relative paths (a scenario file, its scripts) are left out: the joiner starts from
/// the genesis, with no demo world to build and no scenario to read.
pub fn sim_info(cfg: &NodeConfig, genesis: &Genesis) -> Result<NodeMsg, JoinError> {
    let mut shared = cfg.clone();
    shared.http = None;
    shared.bots = Default::default();
    shared.join = None;
    shared.genesis_hash = Some(genesis.hash.to_string());
    (shared.world.scenario, shared.world.scripts) = (None, None);
    let config = toml::to_string(&shared)?;
    let msg = NodeMsg::SimInfo { config, genesis: genesis.bytes.clone() };
    if msg.encode().len() >= crate::net::MAX_FRAME as usize {
        return Err(JoinError::TooBig { max: crate::net::MAX_FRAME });
    }
    Ok(msg)
}

/// This node's own settings, kept whatever the sim's config says.
#[derive(Clone, Debug)]
pub struct Own {
    pub listen: std::net::SocketAddr,
    pub quic: std::net::SocketAddr,
    pub http: Option<std::net::SocketAddr>,
    /// The config this data directory had, if any (its workers and block history stay).
    pub had: Option<NodeConfig>,
}

/// What a joining node takes of an answer: the config to write and the genesis, and a note
/// to show when the join address named no genesis hash.
#[derive(Debug)]
pub struct Adopted {
    pub config: NodeConfig,
    pub genesis: Genesis,
    pub note: Option<String>,
}

/// Check a node's answer to a joining node (the rules at the top) and make this node's config
/// of it. `join` is the address as given (for messages), `want` the hash it names.
pub fn adopt(join: &str, want: Option<[u8; 32]>, config: &str, genesis: &[u8], own: Own) -> Result<Adopted, JoinError> {
    let g = Genesis::decode(genesis).map_err(|cause| JoinError::Genesis { join: join.to_owned(), cause })?;
    let note = match want {
        Some(w) if g.hash.0 != w => {
            return Err(JoinError::OtherGenesis { join: join.to_owned(), got: g.hash.to_string() });
        }
        Some(_) => None,
        None => Some(format!(
            "note: the join address names no genesis hash; this sim's is {} (KEY@HOST:PORT/HASH checks it)",
            g.hash
        )),
    };
    let mut cfg: NodeConfig =
        toml::from_str(config).map_err(|cause| JoinError::Unloadable { join: join.to_owned(), cause })?;
    if cfg.genesis_hash.as_deref() != Some(g.hash.to_string().as_str()) {
        return Err(JoinError::Mismatch { join: join.to_owned() });
    }
    cfg.listen = own.listen;
    cfg.quic = Some(own.quic);
    cfg.http = own.http;
    cfg.bots = Default::default();
    cfg.join = Some(join.to_owned());
    if let Some(h) = &own.had {
        (cfg.sim_workers, cfg.block_history_mib) = (h.sim_workers, h.block_history_mib);
    }
    cfg.check().map_err(|cause| JoinError::Config { join: join.to_owned(), cause })?;
    Ok(Adopted { config: cfg, genesis: g, note })
}

#[cfg(test)]
mod tests {
    use super::*;
    use metatopia_sim::genesis::{DemoSpec, demo_world};

    const JOIN: &str = "3b6a27bcceb6a42d62a3a8d02a6f0d73653215771de243a63ac048a18b59da29@127.0.0.1:7001";

    /// A sim's node: its config (with an HTTP address and bots of its own) and its genesis.
    fn sim() -> (NodeConfig, Genesis) {
        let key = |i: u8| {
            metatopia_sim::ids::hex(ed25519_dalek::SigningKey::from_bytes(&[i + 1; 32]).verifying_key().as_bytes())
        };
        let validators: String =
            (0..4).map(|i| format!("[[validators]]\nkey = \"{}\"\naddress = \"127.0.0.1:700{i}\"\n", key(i))).collect();
        let text = format!(
            "listen = \"127.0.0.1:7000\"\ntick_rate_hz = 30\nhttp = \"127.0.0.1:8000\"\n\
             [world]\nseed = 5\nobjects = 10\nplayers = 2\nsim_id = 1\n[bots]\nevents_per_tick = 5\n{validators}"
        );
        let cfg: NodeConfig = toml::from_str(&text).unwrap();
        let demo = demo_world(DemoSpec { objects: 10, players: 2, ..DemoSpec::default() });
        let mut world = demo.world;
        world.set_genesis_validators(
            cfg.genesis_validators().unwrap().iter().map(|k| metatopia_sim::AccountId(k.to_bytes())),
        );
        (cfg, Genesis::of_world(world, "kinematic", 1, Vec::new()).unwrap())
    }

    fn own() -> Own {
        Own {
            listen: "127.0.0.1:7100".parse().unwrap(),
            quic: "127.0.0.1:9100".parse().unwrap(),
            http: None,
            had: None,
        }
    }

    fn answer(cfg: &NodeConfig, g: &Genesis) -> (String, Vec<u8>) {
        let NodeMsg::SimInfo { config, genesis } = sim_info(cfg, g).unwrap() else { panic!("not a sim info") };
        (config, genesis)
    }

    /// The joiner takes the sim's settings and genesis, keeps its own addresses, runs no bots
    /// and records the join address; without a hash in the address it says which it took.
    #[test]
    fn a_joining_node_takes_the_sims_config_with_its_own_settings() {
        let (cfg, g) = sim();
        let (config, genesis) = answer(&cfg, &g);
        let a = adopt(JOIN, Some(g.hash.0), &config, &genesis, own()).unwrap();
        assert_eq!((a.genesis.hash, a.note), (g.hash, None));
        assert_eq!((&a.config.validators, a.config.tick_rate_hz, &a.config.world), (&cfg.validators, 30, &cfg.world));
        let o = own();
        assert_eq!(
            (a.config.listen, a.config.quic, a.config.http, a.config.bots.events_per_tick, a.config.join.as_deref()),
            (o.listen, Some(o.quic), None, 0, Some(JOIN))
        );
        let a = adopt(JOIN, None, &config, &genesis, own()).unwrap();
        assert!(a.note.is_some_and(|n| n.contains(&g.hash.to_string())));
    }

    /// A lying or broken answer is refused with an error that says what was wrong.
    #[test]
    fn a_lying_or_broken_answer_is_refused_with_a_clear_error() {
        let (cfg, g) = sim();
        let (config, genesis) = answer(&cfg, &g);
        let refused = |want: Option<[u8; 32]>, config: &str, genesis: &[u8]| {
            format!("{:#}", adopt(JOIN, want, config, genesis, own()).expect_err("refused"))
        };
        // Another sim than the address names.
        assert!(refused(Some([7; 32]), &config, &genesis).contains("not the one the join address names"));
        // A config naming another genesis than the one sent.
        let mut other: NodeConfig = toml::from_str(&config).unwrap();
        other.genesis_hash = Some("00".repeat(32));
        let other = toml::to_string(&other).unwrap();
        assert!(refused(Some(g.hash.0), &other, &genesis).contains("names another genesis"));
        // Garbage.
        assert!(refused(None, &config, b"not a genesis").contains("the genesis"));
        assert!(refused(None, "listen = [", &genesis).contains("does not load"));
        let mut truncated = genesis.clone();
        truncated.truncate(genesis.len() / 2);
        assert!(refused(Some(g.hash.0), &config, &truncated).contains("the genesis"));
        // A config every node would refuse.
        let mut bad: NodeConfig = toml::from_str(&config).unwrap();
        bad.tick_rate_hz = 0;
        let bad = toml::to_string(&bad).unwrap();
        assert!(refused(Some(g.hash.0), &bad, &genesis).contains("the config"));
    }
}
