//! Reachability: nodes at home, behind NAT routers and firewalls.
//!
//! - **AutoNAT** (libp2p's, v1): a node asks the peers it is connected to to dial it back at
//!   its addresses on a fresh port; if none can, it is *private* (behind a NAT or a firewall).
//! - **Relays** (Circuit Relay v2): every publicly reachable node of the world serves as a relay
//!   for the nodes of the world it knows, within [`RelayLimits`]. A private node holds a
//!   reservation on up to [`RESERVATIONS`] of the peers it is directly connected to (a private
//!   one refuses, and is tried again later), and takes another when a relay goes away.
//! - **Dialing through relays**: a listed node this one cannot dial directly is dialed through
//!   the relays this node reaches directly (`RELAY/p2p-circuit/p2p/NODE`): if the node holds a
//!   reservation there, the circuit connects.
//! - **Hole punching** (DCUtR): over a relayed connection both ends learn each other's observed
//!   addresses and dial at once; where the NATs allow it (endpoint-independent mapping) a direct
//!   connection results and the relayed one is closed. Behind a symmetric NAT (a new port per
//!   destination) it fails and the connection stays relayed.
//!
//! The relay's policy: a reservation only for a node of the world (a key from the config, the
//! genesis or a card: a *member*); a circuit only from a node this node numbers (members and
//! the followers it serves, [`super::MAX_UNLISTED`] at most), a few a minute each; every
//! circuit bounded in bytes and duration. A stranger cannot be reached through a node, nor
//! reach anyone but the world's nodes, nor for long.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use libp2p::multiaddr::Protocol;
use libp2p::swarm::ConnectionId;
use libp2p::{Multiaddr, PeerId, autonat, relay};

/// Reservations a private node holds at once.
pub const RESERVATIONS: usize = 2;
/// A relay that refused or dropped a reservation is not asked again for this long (a node
/// that just started may not know yet that it is public).
pub const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Relays a dial through relays tries at most.
pub const RELAYS_PER_DIAL: usize = 3;

/// What this node's relay serves, at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RelayLimits {
    /// Reservations held at once (all peers), and per peer.
    pub reservations: usize,
    pub reservations_per_peer: usize,
    /// Circuits open at once (all peers), and per peer.
    pub circuits: usize,
    pub circuits_per_peer: usize,
    /// New circuits a peer may open a minute.
    pub circuits_per_minute: u32,
    /// One circuit's life and bytes (both directions); past either it is closed (a sim's node
    /// dials again at once).
    pub circuit_duration: Duration,
    pub circuit_bytes: u64,
}

impl Default for RelayLimits {
    fn default() -> Self {
        RelayLimits {
            reservations: 64,
            reservations_per_peer: 2,
            circuits: 128,
            circuits_per_peer: 8,
            circuits_per_minute: 30,
            circuit_duration: Duration::from_secs(3600),
            // A relayed validator's link carries ~0.3 MB/s at 60 Hz under load: an hour.
            circuit_bytes: 1 << 30,
        }
    }
}

/// Whether this node is reachable from the internet, as AutoNAT last found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reachability {
    #[default]
    Unknown,
    Public,
    Private,
}

impl Reachability {
    pub fn as_str(self) -> &'static str {
        match self {
            Reachability::Unknown => "unknown",
            Reachability::Public => "public",
            Reachability::Private => "private",
        }
    }

    pub(crate) fn of(status: &autonat::NatStatus) -> Reachability {
        match status {
            autonat::NatStatus::Public(_) => Reachability::Public,
            autonat::NatStatus::Private => Reachability::Private,
            autonat::NatStatus::Unknown => Reachability::Unknown,
        }
    }
}

/// How one connection reaches its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Path {
    Quic,
    Tcp,
    Relayed,
}

impl Path {
    pub fn of(addr: &Multiaddr) -> Path {
        if addr.iter().any(|p| matches!(p, Protocol::P2pCircuit)) {
            Path::Relayed
        } else if addr.iter().any(|p| matches!(p, Protocol::QuicV1)) {
            Path::Quic
        } else {
            Path::Tcp
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Path::Quic => "quic",
            Path::Tcp => "tcp",
            Path::Relayed => "relayed",
        }
    }
}

/// The network figures `stats` shows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetInfo {
    pub reachability: Reachability,
    /// Keys (hex) of the relays this node holds a reservation on.
    pub relays: Vec<String>,
    /// Connected peers by key (hex) and how: "quic", "tcp" or "relayed" (the best path).
    pub paths: BTreeMap<String, &'static str>,
    /// Relayed connections upgraded to direct ones by hole punching, and attempts that failed.
    pub hole_punched: u64,
    pub hole_punch_failed: u64,
    /// This node's relay: reservations and circuits it serves now; requests it refused.
    pub serving_reservations: u64,
    pub serving_circuits: u64,
    pub relay_refused: u64,
}

/// The relay's configuration from the limits and the policy (see the module's docs):
/// `member(peer)` says whether a key is a node of the world, `numbered(peer)` whether this node
/// serves it at all.
pub(crate) fn relay_config(
    limits: RelayLimits,
    member: impl Fn(&PeerId) -> bool + Send + 'static,
    numbered: impl Fn(&PeerId) -> bool + Send + 'static,
) -> relay::Config {
    let mut c = relay::Config {
        max_reservations: limits.reservations,
        max_reservations_per_peer: limits.reservations_per_peer,
        reservation_duration: Duration::from_secs(600),
        max_circuits: limits.circuits,
        max_circuits_per_peer: limits.circuits_per_peer,
        max_circuit_duration: limits.circuit_duration,
        max_circuit_bytes: limits.circuit_bytes,
        reservation_rate_limiters: Vec::new(),
        circuit_src_rate_limiters: Vec::new(),
    };
    c.reservation_rate_limiters.push(Box::new(move |peer, _: &Multiaddr, _| member(&peer)));
    c.circuit_src_rate_limiters.push(Box::new(move |peer, _: &Multiaddr, _| numbered(&peer)));
    let per_minute = std::num::NonZeroU32::new(limits.circuits_per_minute.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    c.circuit_src_per_peer(per_minute, Duration::from_secs(60)).reservation_rate_per_peer(
        std::num::NonZeroU32::new(10).unwrap_or(std::num::NonZeroU32::MIN),
        Duration::from_secs(60),
    )
}

/// AutoNAT's settings: quick at start (a sim's nodes want to know within seconds), servers
/// chosen among connected peers, private addresses allowed (test networks and LANs use them).
pub(crate) fn autonat_config() -> autonat::Config {
    autonat::Config {
        timeout: Duration::from_secs(10),
        boot_delay: Duration::from_secs(1),
        retry_interval: Duration::from_secs(5),
        refresh_interval: Duration::from_secs(600),
        throttle_server_period: Duration::from_secs(5),
        use_connected: true,
        confidence_max: 2,
        only_global_ips: false,
        ..autonat::Config::default()
    }
}

/// The mesh's reachability state: what AutoNAT found, the reservations held, and each peer's
/// connections by path.
#[derive(Debug, Default)]
pub(crate) struct Reach {
    pub reachability: Reachability,
    /// Set by the operator: AutoNAT's findings are ignored.
    pub fixed: bool,
    /// Relays this node listens through: relay -> its listener.
    pub reservations: BTreeMap<PeerId, libp2p::core::transport::ListenerId>,
    /// Where this node is reached through its relays (its relayed listen addresses).
    pub relayed_listen: BTreeSet<Multiaddr>,
    /// Relays that refused or dropped a reservation recently (tried again later).
    pub refused: BTreeMap<PeerId, std::time::Instant>,
    /// Every open connection: peer -> connection -> (path, an address to reach the peer at
    /// directly: the one dialed, or the one it is listed at).
    pub conns: BTreeMap<PeerId, BTreeMap<ConnectionId, (Path, Option<Multiaddr>)>>,
    /// Direct dials of a listed peer that failed in a row.
    pub failures: BTreeMap<PeerId, u32>,
    /// Each connected peer's newest incarnation (see [`incarnation_of`]) and the connections
    /// identified as it.
    pub incarnations: BTreeMap<PeerId, (u64, BTreeSet<ConnectionId>)>,
    pub hole_punched: u64,
    pub hole_punch_failed: u64,
    pub serving_reservations: BTreeSet<PeerId>,
    pub serving_circuits: u64,
    pub relay_refused: u64,
}

impl Reach {
    /// The best path to `peer` (direct before relayed), if connected.
    pub fn path(&self, peer: &PeerId) -> Option<Path> {
        self.conns.get(peer)?.values().map(|(p, _)| *p).min()
    }

    /// Peers this node is directly connected to, with an address to reach them at: the
    /// candidates for relays, in the order of their ids.
    pub fn relay_candidates(&self) -> Vec<(PeerId, Multiaddr)> {
        self.conns.iter().filter_map(|(p, cs)| cs.values().find_map(|(_, a)| a.clone()).map(|a| (*p, a))).collect()
    }

    /// Where to listen next for a reservation: a candidate not used, not refused in the last
    /// [`REFUSED_FOR`], as long as fewer than [`RESERVATIONS`] are held.
    pub fn next_relay(&self, now: std::time::Instant) -> Option<(PeerId, Multiaddr)> {
        if self.reachability != Reachability::Private || self.reservations.len() >= RESERVATIONS {
            return None;
        }
        self.relay_candidates().into_iter().find(|(p, _)| {
            !self.reservations.contains_key(p)
                && self.refused.get(p).is_none_or(|t| now.duration_since(*t) > REFUSED_FOR)
        })
    }

    /// Addresses of `peer` through the relays this node reaches directly.
    pub fn circuits_to(&self, peer: PeerId) -> Vec<Multiaddr> {
        self.relay_candidates()
            .into_iter()
            .filter(|(r, _)| *r != peer)
            .take(RELAYS_PER_DIAL)
            .map(|(r, a)| circuit(&a, r, peer))
            .collect()
    }

    /// `conn` to `peer` identified itself as `incarnation`: the connections to close because
    /// they belong to an earlier run of that peer (a node killed and restarted leaves its
    /// peers' connections to it open, dead, until their pings time out, and their messages go
    /// there meanwhile), or `conn` itself when it is the earlier one.
    pub fn identified(&mut self, peer: PeerId, conn: ConnectionId, incarnation: u64) -> Vec<ConnectionId> {
        let live = self.conns.get(&peer).is_some_and(|cs| cs.contains_key(&conn));
        if !live {
            return Vec::new();
        }
        let (known, conns) = self.incarnations.entry(peer).or_insert_with(|| (incarnation, BTreeSet::new()));
        if incarnation < *known {
            return vec![conn];
        }
        if incarnation > *known {
            *known = incarnation;
            let stale = std::mem::take(conns);
            conns.insert(conn);
            return stale.into_iter().filter(|c| *c != conn).collect();
        }
        conns.insert(conn);
        Vec::new()
    }

    /// `conn` to `peer` closed.
    pub fn closed(&mut self, peer: &PeerId, conn: ConnectionId) {
        if let Some(cs) = self.conns.get_mut(peer) {
            cs.remove(&conn);
            if cs.is_empty() {
                self.conns.remove(peer);
            }
        }
        if let Some((_, cs)) = self.incarnations.get_mut(peer) {
            cs.remove(&conn);
            if cs.is_empty() {
                self.incarnations.remove(peer);
            }
        }
    }

    /// The relayed connections to `peer` (closed once a direct one exists).
    pub fn relayed(&self, peer: &PeerId) -> Vec<ConnectionId> {
        self.conns
            .get(peer)
            .map(|cs| cs.iter().filter(|(_, (p, _))| *p == Path::Relayed).map(|(c, _)| *c).collect())
            .unwrap_or_default()
    }
}

/// The agent version a node announces: its build and its incarnation, the time it started in
/// nanoseconds since 1970 (a restarted node's is higher, which tells its peers that their
/// connections to the run before are dead).
pub fn agent_version(incarnation: u64) -> String {
    format!("{AGENT} incarnation {incarnation}")
}

/// The incarnation in a peer's agent version, if it announces one.
pub fn incarnation_of(agent_version: &str) -> Option<u64> {
    agent_version.strip_prefix("metatopia/")?.split_once(" incarnation ")?.1.parse().ok()
}

/// This build's agent name.
pub const AGENT: &str = concat!("metatopia/", env!("CARGO_PKG_VERSION"));

/// `relay_addr/p2p/RELAY/p2p-circuit[/p2p/PEER]`.
pub fn circuit(relay_addr: &Multiaddr, relay: PeerId, peer: PeerId) -> Multiaddr {
    let mut a: Multiaddr = relay_addr.iter().filter(|p| !matches!(p, Protocol::P2p(_))).collect();
    a.push(Protocol::P2p(relay));
    a.push(Protocol::P2pCircuit);
    a.push(Protocol::P2p(peer));
    a
}

/// Where to listen for a reservation on `relay`: `relay_addr/p2p/RELAY/p2p-circuit`.
pub fn reservation_addr(relay_addr: &Multiaddr, relay: PeerId) -> Multiaddr {
    let mut a: Multiaddr = relay_addr.iter().filter(|p| !matches!(p, Protocol::P2p(_))).collect();
    a.push(Protocol::P2p(relay));
    a.push(Protocol::P2pCircuit);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restarted_peers_new_incarnation_closes_the_connections_to_its_run_before() {
        assert_eq!(incarnation_of(&agent_version(42)), Some(42));
        assert_eq!(incarnation_of("metatopia/0.0.9"), None);
        assert_eq!(incarnation_of("other/1 incarnation 5"), None);
        let mut r = Reach::default();
        let p = PeerId::random();
        let c = ConnectionId::new_unchecked;
        for i in 1..=4 {
            r.conns.entry(p).or_default().insert(c(i), (Path::Quic, None));
        }
        // Two connections of the first run (a simultaneous dial): both kept.
        assert!(r.identified(p, c(1), 100).is_empty());
        assert!(r.identified(p, c(2), 100).is_empty());
        // The peer was killed and started again: its new connection closes both.
        assert_eq!(r.identified(p, c(3), 200), vec![c(1), c(2)]);
        // A late identification of the run before closes only itself.
        assert_eq!(r.identified(p, c(4), 100), vec![c(4)]);
        for i in 1..=4 {
            r.closed(&p, c(i));
        }
        assert!(r.conns.is_empty() && r.incarnations.is_empty());
        // Unknown connections (closed meanwhile) are not recorded.
        assert!(r.identified(p, c(5), 300).is_empty());
        assert!(r.incarnations.is_empty());
    }

    #[test]
    fn paths_prefer_direct_and_circuit_addresses_name_the_relay_and_the_peer() {
        let quic: Multiaddr = "/ip4/10.0.0.1/udp/7000/quic-v1".parse().unwrap();
        let tcp: Multiaddr = "/ip4/10.0.0.1/tcp/7000".parse().unwrap();
        let (r, p) = (PeerId::random(), PeerId::random());
        let c = circuit(&quic, r, p);
        assert_eq!(c.to_string(), format!("/ip4/10.0.0.1/udp/7000/quic-v1/p2p/{r}/p2p-circuit/p2p/{p}"));
        assert_eq!(Path::of(&c), Path::Relayed);
        assert_eq!(Path::of(&quic), Path::Quic);
        assert_eq!(Path::of(&tcp), Path::Tcp);
        let mut reach = Reach::default();
        let (a, b) = (ConnectionId::new_unchecked(1), ConnectionId::new_unchecked(2));
        reach.conns.entry(p).or_default().insert(a, (Path::Relayed, None));
        assert_eq!(reach.path(&p), Some(Path::Relayed));
        reach.conns.entry(p).or_default().insert(b, (Path::Quic, None));
        assert_eq!(reach.path(&p), Some(Path::Quic));
        assert_eq!(reach.relayed(&p), vec![a]);
    }

    #[test]
    fn a_private_node_reserves_on_reachable_peers_only_up_to_its_count() {
        let mut reach = Reach::default();
        let now = std::time::Instant::now();
        let addr: Multiaddr = "/ip4/10.0.0.1/udp/7000/quic-v1".parse().unwrap();
        let peers: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        // Reached through a relay only, or with no address known: not a candidate.
        reach.conns.entry(peers[0]).or_default().insert(ConnectionId::new_unchecked(1), (Path::Relayed, None));
        for (i, p) in peers[1..].iter().enumerate() {
            reach
                .conns
                .entry(*p)
                .or_default()
                .insert(ConnectionId::new_unchecked(2 + i), (Path::Quic, Some(addr.clone())));
        }
        assert_eq!(reach.next_relay(now), None, "not private (yet): no reservation");
        reach.reachability = Reachability::Private;
        let (first, _) = reach.next_relay(now).unwrap();
        assert_ne!(first, peers[0]);
        reach.reservations.insert(first, libp2p::core::transport::ListenerId::next());
        let (second, _) = reach.next_relay(now).unwrap();
        assert_ne!(second, first);
        reach.refused.insert(second, now);
        let (third, _) = reach.next_relay(now).unwrap();
        assert!(third != first && third != second);
        reach.reservations.insert(third, libp2p::core::transport::ListenerId::next());
        assert_eq!(reach.next_relay(now), None, "{RESERVATIONS} held");
        assert_eq!(reach.circuits_to(peers[1]).len(), 2, "through the other reachable peers");
    }
}
