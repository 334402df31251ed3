//! The nodes' mesh, over libp2p: QUIC, with TCP + noise + yamux as the fallback; identify and
//! ping; and the sim's messages on long-lived streams of the protocol [`PROTOCOL`], one per
//! direction between two nodes, carrying length-prefixed frames.
//!
//! A node's libp2p identity *is* its ed25519 node key, so a peer is known by the key the
//! transport authenticated (noise or TLS), never by what it claims: dialing a listed node at its
//! address fails unless the node there holds that node's key, and an inbound connection is
//! numbered by its key. The numbering ("peer index") is the config's order of the sim's nodes;
//! nodes outside the list (a node that joined with `run --join` and follows the sim) get the
//! next free indices as they connect, up to [`MAX_UNLISTED`] at a time, and give them back when
//! they disconnect (a later one takes the index: [`MeshEvent::Joined`] says with which key); they
//! get the sim's broadcasts once they ask for them ([`NodeMsg::asks_for_the_sim`]), so a node
//! that merely connects costs nothing. Messages carry their own signatures besides (votes,
//! proposals, events), so the index only says whom to answer.

mod book;
pub mod card;
pub mod frames;
pub mod reach;
pub mod wire;

use book::Book;
pub use book::{MAX_UNLISTED, peer_key};
pub use card::peer_id;

/// Why the mesh could not start, or a stream to a peer could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The node key is not usable as a libp2p identity.
    #[error("the node key as a libp2p identity: {0}")]
    Identity(String),
    /// The transports or behaviours could not be built.
    #[error("setting up the transports: {0}")]
    Setup(String),
    /// A listening address could not be taken.
    #[error("listening: {0}")]
    Listen(String),
    /// The peer did not take a stream of the sim's protocol.
    #[error("a stream to a peer: {0}")]
    Stream(String),
}

fn setup_error(e: impl std::fmt::Display) -> NetError {
    NetError::Setup(e.to_string())
}

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::num::NonZeroU8;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, autonat, dcutr, identify, identity, noise, ping, relay, tcp, yamux};
use metatopia_consensus::{SigningKey, ValidatorIndex, VerifyingKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt};

pub use crate::net::frames::MAX_FRAME;
use crate::net::frames::{Outbox, outbox, read_frame, write_outbox};
use crate::net::reach::{NetInfo, Path, Reach, RelayLimits};
use crate::net::wire::NodeMsg;

/// The sim's messages between nodes. The version changes with the messages' meaning (2: block
/// digests over event ids, compact proposals), so nodes of different versions do not talk.
pub const PROTOCOL: StreamProtocol = StreamProtocol::new("/metatopia/sim/5");
/// What identify announces.
/// How often each connection is pinged, and how long a ping may take before the connection
/// is taken for dead and closed.
const PING_EVERY: Duration = Duration::from_secs(2);
const PING_TIMEOUT: Duration = Duration::from_secs(6);
/// How often listed nodes that are not connected are dialed again.
const REDIAL: Duration = Duration::from_millis(500);

/// `n` ports free on loopback for both TCP and UDP, for tests, devnets and benches that hand
/// ports to the nodes they start. They come from below the kernel's ephemeral range (which
/// starts at 32768 on Linux), so no socket bound to port 0 and no outgoing connection of any
/// process takes one between this check and the node's bind, and no port is handed out twice
/// by one process: the bind-drop-reuse race of picking "port 0" ports is gone.
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Below the devnet tests' contiguous blocks (20000..32000) and above the devnet's defaults.
    const LOW: u32 = 10_000;
    const SPAN: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    // Each process starts at its own place in the range (two test binaries at once rarely meet).
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(2_654_435_761) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    let mut out = Vec::with_capacity(n);
    for _ in 0..SPAN {
        if out.len() == n {
            break;
        }
        let port = (LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        let free = std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
            && std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if free {
            out.push(port);
        }
    }
    if out.len() < n {
        return Err(std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("fewer than {n} free ports")));
    }
    Ok(out)
}

/// [`free_ports`], for the UDP (QUIC) side.
pub fn free_udp_ports(n: usize) -> std::io::Result<Vec<u16>> {
    free_ports(n)
}

/// A node of the mesh: its key and where it listens (either address may be absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerAddr {
    pub key: VerifyingKey,
    /// TCP (noise + yamux).
    pub tcp: Option<SocketAddr>,
    /// UDP (QUIC).
    pub quic: Option<SocketAddr>,
    /// Through relays (`…/p2p/RELAY/p2p-circuit/p2p/NODE`), as its card says: tried after the
    /// direct addresses (first, once a direct dial failed), before this node's own relays.
    pub relayed: Vec<Multiaddr>,
}

impl PeerAddr {
    /// Where the mesh dials a card's node: directly first, then through the relays it names.
    pub fn of_card(card: &card::CardBody) -> Option<PeerAddr> {
        let key = VerifyingKey::from_bytes(&card.key).ok()?;
        let relayed = card.relayed_addrs().unwrap_or_default();
        Some(PeerAddr { key, tcp: Some(card.addr), quic: card.quic, relayed })
    }

    /// A node at these direct addresses (no relays known).
    pub fn direct(key: VerifyingKey, tcp: Option<SocketAddr>, quic: Option<SocketAddr>) -> PeerAddr {
        PeerAddr { key, tcp, quic, relayed: Vec::new() }
    }

    /// Where to dial, in order: QUIC first, TCP if QUIC fails.
    fn multiaddrs(&self) -> Vec<Multiaddr> {
        let quic = self.quic.map(|a| Multiaddr::from(a.ip()).with(Protocol::Udp(a.port())).with(Protocol::QuicV1));
        let tcp = self.tcp.map(|a| Multiaddr::from(a.ip()).with(Protocol::Tcp(a.port())));
        quic.into_iter().chain(tcp).collect()
    }
}

/// What the mesh hands the node.
#[derive(Debug)]
pub enum MeshEvent {
    /// A message from the node with this peer index.
    Message(ValidatorIndex, NodeMsg),
    /// A node outside the list connected and got this index (one freed by a node that left,
    /// perhaps: the key is now this one).
    Joined { index: u16, key: VerifyingKey },
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    stream: libp2p_stream::Behaviour,
    autonat: autonat::Behaviour,
    relay: relay::Behaviour,
    relay_client: relay::client::Behaviour,
    dcutr: libp2p::swarm::behaviour::toggle::Toggle<dcutr::Behaviour>,
}

/// Per peer index: the connection's number and its queue (a new stream replaces both).
type Writers = BTreeMap<u16, (u64, Outbox)>;

#[derive(Debug)]
struct Shared {
    book: Mutex<Book>,
    writers: Mutex<Writers>,
    streams: std::sync::atomic::AtomicU64,
    delay: LinkDelay,
    reach: Mutex<Reach>,
}

/// How a mesh is started besides its key, addresses and peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MeshOptions {
    /// A delay stage on every frame sent (tests and measurements).
    pub delay: LinkDelay,
    /// What this node's relay serves.
    pub relay: RelayLimits,
    /// Reachability as the operator states it, instead of AutoNAT's finding (a node known to be
    /// behind a NAT takes reservations from the start).
    pub reachability: Option<reach::Reachability>,
    /// Never upgrade a relayed connection by hole punching (it then stays relayed).
    pub no_hole_punching: bool,
}

/// A delay added to every frame this node sends, for tests and measurements of the protocol at
/// internet latencies on one machine (the kernel here has no netem): each frame leaves its
/// queue `one_way` (± `jitter_percent` of it, drawn per frame from a seeded generator) after it
/// was queued, and frames keep their order on each link, as on a real stream. Zero: no stage.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkDelay {
    pub one_way: Duration,
    pub jitter_percent: u32,
}

impl LinkDelay {
    /// No delay stage.
    pub const NONE: LinkDelay = LinkDelay { one_way: Duration::ZERO, jitter_percent: 0 };
}

/// The delay stage of one link: frames stamped as they are queued, released in order at their
/// time (never before the one before them).
fn delayed(
    mut queued: mpsc::UnboundedReceiver<Arc<Vec<u8>>>,
    delay: LinkDelay,
    seed: u64,
) -> mpsc::UnboundedReceiver<Arc<Vec<u8>>> {
    let (stamped_tx, mut stamped) = mpsc::unbounded_channel::<(tokio::time::Instant, Arc<Vec<u8>>)>();
    let (out, released) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(f) = queued.recv().await {
            if stamped_tx.send((tokio::time::Instant::now(), f)).is_err() {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let mut state = seed | 1;
        let mut last = tokio::time::Instant::now();
        let base = delay.one_way.as_micros() as i64;
        let spread = base * i64::from(delay.jitter_percent.min(100)) / 100;
        while let Some((at, f)) = stamped.recv().await {
            // xorshift64: a jitter in [-spread, spread] microseconds.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let jitter = if spread > 0 { (state % (2 * spread as u64 + 1)) as i64 - spread } else { 0 };
            let due = (at + Duration::from_micros((base + jitter).max(0) as u64)).max(last);
            last = due;
            tokio::time::sleep_until(due).await;
            if out.send(f).is_err() {
                return;
            }
        }
    });
    released
}

enum Command {
    Add(Vec<PeerAddr>),
    /// Close every connection (so the peers learn at once) and stop.
    Stop,
}

/// This node's side of the mesh.
#[derive(Debug, Clone)]
pub struct Mesh {
    shared: Arc<Shared>,
    commands: mpsc::UnboundedSender<Command>,
    listening: Vec<Multiaddr>,
}

impl Mesh {
    /// Start the swarm with `key` as its identity: listen on TCP `tcp` and QUIC `quic`, keep
    /// connections to every node of `peers` (the sim's nodes in index order; this node's own
    /// entry is skipped), and hand what arrives to the returned channel.
    pub async fn start(
        key: &SigningKey,
        tcp: SocketAddr,
        quic: Option<SocketAddr>,
        peers: Vec<PeerAddr>,
    ) -> Result<(Mesh, mpsc::UnboundedReceiver<MeshEvent>), NetError> {
        Mesh::start_delayed(key, tcp, quic, peers, LinkDelay::NONE).await
    }

    /// [`Mesh::start`], with a [`LinkDelay`] on every frame this node sends.
    pub async fn start_delayed(
        key: &SigningKey,
        tcp: SocketAddr,
        quic: Option<SocketAddr>,
        peers: Vec<PeerAddr>,
        delay: LinkDelay,
    ) -> Result<(Mesh, mpsc::UnboundedReceiver<MeshEvent>), NetError> {
        Mesh::start_with(key, tcp, quic, peers, MeshOptions { delay, ..MeshOptions::default() }).await
    }

    /// [`Mesh::start`], with these options.
    pub async fn start_with(
        key: &SigningKey,
        tcp: SocketAddr,
        quic: Option<SocketAddr>,
        peers: Vec<PeerAddr>,
        options: MeshOptions,
    ) -> Result<(Mesh, mpsc::UnboundedReceiver<MeshEvent>), NetError> {
        let keypair =
            identity::Keypair::ed25519_from_bytes(key.to_bytes()).map_err(|e| NetError::Identity(e.to_string()))?;
        let me = keypair.public().to_peer_id();
        let book = Book {
            keys: peers.iter().map(|p| p.key).collect(),
            by_peer: peers.iter().enumerate().map(|(i, p)| (peer_id(&p.key), i as u16)).collect(),
            listed: peers.len(),
            me,
            connected: BTreeSet::new(),
            outsiders: BTreeSet::new(),
            members: peers.iter().map(|p| peer_id(&p.key)).collect(),
            freed: BTreeSet::new(),
            quiet: BTreeSet::new(),
        };
        let shared = Arc::new(Shared {
            book: Mutex::new(book),
            writers: Mutex::default(),
            streams: std::sync::atomic::AtomicU64::new(0),
            delay: options.delay,
            reach: Mutex::new(Reach {
                reachability: options.reachability.unwrap_or_default(),
                fixed: options.reachability.is_some(),
                ..Reach::default()
            }),
        });
        let (member, numbered) = (shared.clone(), shared.clone());
        let relay_config = reach::relay_config(
            options.relay,
            move |p| lock(&member.book).members.contains(p),
            move |p| lock(&numbered.book).by_peer.contains_key(p),
        );
        // This run's incarnation (see `reach::agent_version`).
        let since_1970 = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let incarnation = u64::try_from(since_1970.as_nanos()).unwrap_or(u64::MAX);
        let mut swarm = libp2p::SwarmBuilder::with_existing_identity(keypair)
            .with_tokio()
            .with_tcp(tcp::Config::new().nodelay(true), noise::Config::new, yamux::Config::default)
            .map_err(setup_error)?
            .with_quic_config(|mut c| {
                c.handshake_timeout = Duration::from_secs(2);
                c
            })
            .with_relay_client(noise::Config::new, yamux::Config::default)
            .map_err(setup_error)?
            .with_behaviour(|k, relay_client| Behaviour {
                identify: identify::Behaviour::new(
                    identify::Config::new("/metatopia/1".into(), k.public())
                        .with_agent_version(reach::agent_version(incarnation)),
                ),
                // A connection that misses its pings for PING_TIMEOUT is closed (and dialed
                // again): a dead peer or relay is noticed in seconds, not at an idle timeout.
                ping: ping::Behaviour::new(ping::Config::new().with_interval(PING_EVERY).with_timeout(PING_TIMEOUT)),
                stream: libp2p_stream::Behaviour::new(),
                autonat: autonat::Behaviour::new(me, reach::autonat_config()),
                relay: relay::Behaviour::new(me, relay_config),
                relay_client,
                dcutr: (!options.no_hole_punching).then(|| dcutr::Behaviour::new(me)).into(),
            })
            .map_err(setup_error)?
            .with_swarm_config(|c| {
                c.with_idle_connection_timeout(Duration::from_secs(3600))
                    // QUIC first, TCP only when QUIC fails.
                    .with_dial_concurrency_factor(NonZeroU8::MIN)
            })
            .build();
        // A node relays for the world's nodes (within its limits) while it is publicly
        // reachable: a private node refuses reservations (they would be of no use).
        let public = options.reachability == Some(reach::Reachability::Public);
        swarm.behaviour_mut().relay.set_status(Some(if public {
            relay::Status::Enable
        } else {
            relay::Status::Disable
        }));
        // (libp2p's `TransportError::Other` displays as nothing: the cause is its io error.)
        let listen_error = |e: libp2p::TransportError<std::io::Error>| {
            NetError::Listen(match e {
                libp2p::TransportError::Other(io) => io.to_string(),
                other => other.to_string(),
            })
        };
        swarm.listen_on(Multiaddr::from(tcp.ip()).with(Protocol::Tcp(tcp.port()))).map_err(listen_error)?;
        if let Some(q) = quic {
            swarm
                .listen_on(Multiaddr::from(q.ip()).with(Protocol::Udp(q.port())).with(Protocol::QuicV1))
                .map_err(listen_error)?;
        }
        // The listeners are up (or failed) once their first event arrives.
        let mut listening = Vec::new();
        let want = 1 + usize::from(quic.is_some());
        while listening.len() < want {
            match tokio::time::timeout(Duration::from_secs(5), swarm.select_next_some()).await {
                Ok(SwarmEvent::NewListenAddr { address, .. }) => listening.push(address),
                Ok(SwarmEvent::ListenerError { error, .. }) => return Err(NetError::Listen(error.to_string())),
                Ok(SwarmEvent::ListenerClosed { addresses, reason, .. }) => {
                    return Err(NetError::Listen(format!("on {addresses:?}: {:?}", reason.err())));
                }
                Ok(_) => {}
                Err(_) => {
                    return Err(NetError::Listen(format!(
                        "the listeners on {tcp} and {quic:?} did not come up within 5 s"
                    )));
                }
            }
        }
        if public {
            // Stated public: its listening addresses are where the internet reaches it (a
            // relay's reservations name them).
            for a in &listening {
                swarm.add_external_address(a.clone());
            }
        }

        let (tx, rx) = mpsc::unbounded_channel();
        let (commands, command_rx) = mpsc::unbounded_channel();
        let mut control = swarm.behaviour().stream.new_control();
        let incoming = control.accept(PROTOCOL).map_err(setup_error)?;
        tokio::spawn(read_streams(incoming, shared.clone(), tx.clone()));
        tokio::spawn(drive(swarm, control, shared.clone(), peers, command_rx, tx));
        Ok((Mesh { shared, commands, listening }, rx))
    }

    /// Where this node listens (its multiaddrs).
    pub fn listening(&self) -> &[Multiaddr] {
        &self.listening
    }

    /// This node's libp2p identity.
    pub fn local_peer_id(&self) -> PeerId {
        lock(&self.shared.book).me
    }

    /// These keys are nodes of the world (the sim's current validators, say): they may hold a
    /// reservation on this node's relay.
    pub fn add_members(&self, keys: &[VerifyingKey]) {
        let mut book = lock(&self.shared.book);
        for k in keys {
            book.members.insert(peer_id(k));
        }
    }

    /// Close every connection, so the peers learn of it at once (rather than by a missed ping),
    /// and stop the mesh.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
    }

    /// Keep connections to these nodes too (after the ones the mesh started with).
    pub fn add_peers(&self, peers: Vec<PeerAddr>) {
        let _ = self.commands.send(Command::Add(peers));
    }

    /// Keep connections to nodes of other sims too (a neighbour sim's validators, for its mail):
    /// numbered like peers, but left out of broadcasts. Returns their indices, in order (a node
    /// already numbered keeps its index; beyond the index space a node is left out).
    pub fn add_outsiders(&self, peers: Vec<PeerAddr>) -> Vec<u16> {
        let mut indices = Vec::new();
        {
            let mut book = lock(&self.shared.book);
            for p in &peers {
                let Some(i) = book.number_key(p.key) else { continue };
                book.outsiders.insert(i);
                indices.push(i);
            }
        }
        let _ = self.commands.send(Command::Add(peers));
        indices
    }

    /// Keep a connection to this node, whose sim is not known yet (a Raynet contact): numbered,
    /// and a peer until [`Mesh::mark_outsider`]. Its index, unless the index space is full.
    pub fn add_contact(&self, peer: PeerAddr) -> Option<u16> {
        let i = lock(&self.shared.book).number_key(peer.key)?;
        let _ = self.commands.send(Command::Add(vec![peer]));
        Some(i)
    }

    /// This index is a node of another sim: left out of broadcasts from now on.
    pub fn mark_outsider(&self, index: u16) {
        lock(&self.shared.book).outsiders.insert(index);
    }

    /// The index of the node with this key, if it has one.
    pub fn index_of(&self, key: &VerifyingKey) -> Option<u16> {
        lock(&self.shared.book).by_peer.get(&peer_id(key)).copied()
    }

    /// Whether this index is a node of another sim.
    pub fn is_outsider(&self, index: u16) -> bool {
        lock(&self.shared.book).outsiders.contains(&index)
    }

    /// The key of the node with this peer index.
    pub fn key_of(&self, index: u16) -> Option<VerifyingKey> {
        let book = lock(&self.shared.book);
        if book.freed.contains(&index) {
            return None;
        }
        book.keys.get(usize::from(index)).copied()
    }

    pub fn send(&self, to: u16, msg: &NodeMsg) {
        self.send_frame(to, Arc::new(msg.encode()));
    }

    pub fn broadcast(&self, msg: &NodeMsg) {
        self.broadcast_frame(Arc::new(msg.encode()));
    }

    /// Send an encoded [`NodeMsg`] (encoded once for many sends).
    pub fn send_frame(&self, to: u16, frame: Arc<Vec<u8>>) {
        if let Some((_, w)) = lock(&self.shared.writers).get(&to) {
            let len = frame.len() as u64 + 4;
            if w.push(frame) {
                metrics::counter!("metatopia_net_bytes_out_total").increment(len);
            } else {
                metrics::counter!("metatopia_net_frames_dropped_total").increment(1);
            }
        }
    }

    /// Send an encoded [`NodeMsg`] to every connected peer of this sim.
    pub fn broadcast_frame(&self, frame: Arc<Vec<u8>>) {
        // Not to other sims' nodes, nor to unlisted nodes that have not asked for the sim's.
        let skip: BTreeSet<u16> = {
            let book = lock(&self.shared.book);
            book.outsiders.union(&book.quiet).copied().collect()
        };
        let writers = lock(&self.shared.writers);
        let mut sent = 0;
        for (i, (_, w)) in writers.iter() {
            if !skip.contains(i) {
                if w.push(frame.clone()) {
                    sent += 1;
                } else {
                    metrics::counter!("metatopia_net_frames_dropped_total").increment(1);
                }
            }
        }
        metrics::counter!("metatopia_net_bytes_out_total").increment((frame.len() as u64 + 4) * sent);
    }

    /// The connected peers by index, each with its best path ("quic", "tcp" or "relayed").
    pub fn transports(&self) -> BTreeMap<u16, &'static str> {
        let book = lock(&self.shared.book);
        let reach = lock(&self.shared.reach);
        book.connected.iter().filter_map(|p| Some((*book.by_peer.get(p)?, reach.path(p)?.as_str()))).collect()
    }

    /// Where this node is reached through the relays holding a reservation for it
    /// (`…/p2p/RELAY/p2p-circuit/p2p/ME`), at most [`card::MAX_RELAYED`]: for its card.
    pub fn relayed_addresses(&self) -> Vec<Multiaddr> {
        let me = self.local_peer_id();
        let reach = lock(&self.shared.reach);
        reach
            .relayed_listen
            .iter()
            .map(|a| {
                let mut a = a.clone();
                if !matches!(a.iter().last(), Some(Protocol::P2p(_))) {
                    a.push(Protocol::P2p(me));
                }
                a
            })
            .take(card::MAX_RELAYED)
            .collect()
    }

    /// Reachability, relays and each connected peer's path, for `stats`.
    pub fn net_info(&self) -> NetInfo {
        // Book before reach, everywhere both are held.
        let book = lock(&self.shared.book);
        let reach = lock(&self.shared.reach);
        let hex =
            |p: &PeerId| peer_key(p).map(|k| metatopia_sim::ids::hex(k.as_bytes())).unwrap_or_else(|| p.to_string());
        NetInfo {
            reachability: reach.reachability,
            relays: reach.reservations.keys().map(hex).collect(),
            paths: book.connected.iter().filter_map(|p| reach.path(p).map(|path| (hex(p), path.as_str()))).collect(),
            hole_punched: reach.hole_punched,
            hole_punch_failed: reach.hole_punch_failed,
            serving_reservations: reach.serving_reservations.len() as u64,
            serving_circuits: reach.serving_circuits,
            relay_refused: reach.relay_refused,
        }
    }

    /// Peers this node has a stream to now.
    pub fn connected(&self) -> usize {
        lock(&self.shared.writers).len()
    }

    /// The keys of the nodes this one is connected to now.
    pub fn connected_keys(&self) -> std::collections::BTreeSet<[u8; 32]> {
        let indices: Vec<u16> = lock(&self.shared.writers).keys().copied().collect();
        let book = lock(&self.shared.book);
        indices.iter().filter_map(|i| book.keys.get(usize::from(*i))).map(|k| k.to_bytes()).collect()
    }
}

/// The peer index of `peer` (numbered now and announced if it is new; `connected`: a connection
/// to it was just established).
fn number(shared: &Shared, peer: &PeerId, events: &mpsc::UnboundedSender<MeshEvent>, connected: bool) -> Option<u16> {
    let mut book = lock(&shared.book);
    let (index, new) = book.index(peer)?;
    if connected {
        book.connected.insert(*peer);
    }
    if new {
        // Sent under the lock, so the node learns indices in order.
        let _ = events.send(MeshEvent::Joined { index, key: book.keys[usize::from(index)] });
    }
    Some(index)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The swarm's loop: connections, dialing (directly, then through relays), identify and ping,
/// reachability and reservations (see [`reach`]); a writer for each connected peer.
async fn drive(
    mut swarm: libp2p::Swarm<Behaviour>,
    control: libp2p_stream::Control,
    shared: Arc<Shared>,
    mut peers: Vec<PeerAddr>,
    mut commands: mpsc::UnboundedReceiver<Command>,
    events: mpsc::UnboundedSender<MeshEvent>,
) {
    let me = lock(&shared.book).me;
    let mut redial = tokio::time::interval(REDIAL);
    redial.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            c = commands.recv() => match c {
                Some(Command::Add(more)) => {
                    let mut book = lock(&shared.book);
                    for p in more {
                        let _ = book.number_key(p.key);
                        // Known already: its addresses may be new (it restarted elsewhere).
                        match peers.iter_mut().find(|q| q.key == p.key) {
                            Some(q) if p.tcp.is_some() || p.quic.is_some() || !p.relayed.is_empty() => *q = p,
                            Some(_) => {}
                            None => peers.push(p),
                        }
                    }
                }
                Some(Command::Stop) => {
                    let peers: Vec<PeerId> = swarm.connected_peers().copied().collect();
                    for p in peers {
                        let _ = swarm.disconnect_peer_id(p);
                    }
                    // Until the connections are closed (their close frames sent), 1 s at most.
                    let _ = tokio::time::timeout(Duration::from_secs(1), async {
                        while swarm.connected_peers().next().is_some() {
                            swarm.select_next_some().await;
                        }
                    })
                    .await;
                    return;
                }
                None => return,
            },
            _ = redial.tick() => {
                let now = std::time::Instant::now();
                let mut reach = lock(&shared.reach);
                // A private node listens through relays, up to its count.
                while let Some((relay, addr)) = reach.next_relay(now) {
                    match swarm.listen_on(reach::reservation_addr(&addr, relay)) {
                        Ok(l) => {
                            tracing::info!(%relay, "behind a NAT: asking for a reservation on a relay");
                            reach.reservations.insert(relay, l);
                        }
                        Err(e) => {
                            tracing::debug!(%relay, "a reservation: {e}");
                            reach.refused.insert(relay, now);
                        }
                    }
                }
                for p in &peers {
                    let id = peer_id(&p.key);
                    let direct = p.multiaddrs();
                    if id == me || swarm.is_connected(&id) {
                        continue;
                    }
                    // Directly first; through relays after (or first, once a dial failed): the
                    // ones its card names, then this node's own.
                    let mut relayed = p.relayed.clone();
                    relayed.extend(reach.circuits_to(id).into_iter().filter(|a| !p.relayed.contains(a)));
                    let addrs: Vec<Multiaddr> = if reach.failures.contains_key(&id) {
                        relayed.into_iter().chain(direct).collect()
                    } else {
                        direct.into_iter().chain(relayed).collect()
                    };
                    if addrs.is_empty() {
                        continue;
                    }
                    let opts = DialOpts::peer_id(id)
                        .addresses(addrs)
                        .condition(PeerCondition::DisconnectedAndNotDialing)
                        .build();
                    if let Err(e) = swarm.dial(opts) {
                        tracing::trace!(%id, "dial: {e}");
                    }
                }
            }
            ev = swarm.select_next_some() => match ev {
                SwarmEvent::ConnectionEstablished { peer_id, connection_id, num_established, endpoint, .. } => {
                    let Some(index) = number(&shared, &peer_id, &events, true) else {
                        tracing::debug!(%peer_id, "refusing a peer: not an ed25519 identity, or too many unlisted peers");
                        let _ = swarm.disconnect_peer_id(peer_id);
                        continue;
                    };
                    let addr = endpoint.get_remote_address();
                    // An inbound relayed connection's remote address is only `/p2p/PEER`.
                    let path = if endpoint.is_relayed() { Path::Relayed } else { Path::of(addr) };
                    // Where to reach it directly (for a reservation on its relay): the address
                    // dialed, or the one it is listed at.
                    let bare: Multiaddr = addr.iter().filter(|p| !matches!(p, Protocol::P2p(_))).collect();
                    let listed = match path {
                        Path::Relayed => None,
                        _ if endpoint.is_dialer() => Some(bare),
                        _ => peers.iter().find(|p| peer_id_of(p) == peer_id).and_then(|p| p.multiaddrs().into_iter().next()),
                    };
                    let stale = {
                        let mut reach = lock(&shared.reach);
                        reach.failures.remove(&peer_id);
                        reach.conns.entry(peer_id).or_default().insert(connection_id, (path, listed));
                        // A direct connection makes the relayed ones redundant.
                        if path == Path::Relayed { Vec::new() } else { reach.relayed(&peer_id) }
                    };
                    for c in stale {
                        tracing::info!(%peer_id, "a direct connection: closing the relayed one");
                        swarm.close_connection(c);
                    }
                    tracing::debug!(%peer_id, index, %addr, "connected");
                    if num_established.get() == 1 {
                        tokio::spawn(write_stream(control.clone(), shared.clone(), peer_id, index));
                    }
                }
                SwarmEvent::ConnectionClosed { peer_id, connection_id, num_established, cause, .. } => {
                    lock(&shared.reach).closed(&peer_id, connection_id);
                    if num_established == 0 {
                        tracing::debug!(%peer_id, "disconnected: {cause:?}");
                        let freed = lock(&shared.book).release(&peer_id);
                        if let Some(i) = freed {
                            // Its writer ends with it (nothing may be waiting to be written).
                            lock(&shared.writers).remove(&i);
                        }
                    }
                }
                SwarmEvent::ListenerClosed { listener_id, reason, addresses } => {
                    let mut reach = lock(&shared.reach);
                    for a in &addresses {
                        reach.relayed_listen.remove(a);
                    }
                    let gone: Vec<PeerId> =
                        reach.reservations.iter().filter(|(_, l)| **l == listener_id).map(|(r, _)| *r).collect();
                    for r in gone {
                        tracing::info!(relay = %r, "a relay's reservation ended ({:?}); taking another", reason.as_ref().err());
                        reach.reservations.remove(&r);
                        reach.refused.insert(r, std::time::Instant::now());
                    }
                }
                SwarmEvent::NewListenAddr { address, .. } if Path::of(&address) == Path::Relayed => {
                    tracing::info!(%address, "reachable through a relay");
                    lock(&shared.reach).relayed_listen.insert(address);
                }
                SwarmEvent::ExpiredListenAddr { address, .. } => {
                    lock(&shared.reach).relayed_listen.remove(&address);
                }
                SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event { result: Ok(rtt), .. })) => {
                    metrics::histogram!("metatopia_peer_rtt_seconds").record(rtt.as_secs_f64());
                }
                SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event { peer, connection, result: Err(e) })) => {
                    tracing::debug!(%peer, "a connection missed its ping ({e}): closing it");
                    swarm.close_connection(connection);
                }
                SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received { peer_id, connection_id, info })) => {
                    tracing::debug!(%peer_id, agent = info.agent_version, addrs = ?info.listen_addrs, observed = %info.observed_addr, "identified");
                    let incarnation = reach::incarnation_of(&info.agent_version);
                    let stale = incarnation.map(|i| lock(&shared.reach).identified(peer_id, connection_id, i));
                    for c in stale.unwrap_or_default() {
                        tracing::info!(%peer_id, "the peer restarted: closing a connection to its run before");
                        swarm.close_connection(c);
                    }
                }
                SwarmEvent::Behaviour(BehaviourEvent::Autonat(autonat::Event::StatusChanged { old, new })) => {
                    let r = reach::Reachability::of(&new);
                    tracing::info!(was = reach::Reachability::of(&old).as_str(), now = r.as_str(), "reachability");
                    let mut reach = lock(&shared.reach);
                    if reach.fixed {
                        continue;
                    }
                    reach.reachability = r;
                    let serve = if r == reach::Reachability::Public { relay::Status::Enable } else { relay::Status::Disable };
                    swarm.behaviour_mut().relay.set_status(Some(serve));
                    if r == reach::Reachability::Public {
                        for (_, l) in std::mem::take(&mut reach.reservations) {
                            swarm.remove_listener(l);
                        }
                    }
                }
                SwarmEvent::Behaviour(BehaviourEvent::Relay(e)) => served(&mut lock(&shared.reach), e),
                SwarmEvent::Behaviour(BehaviourEvent::RelayClient(relay::client::Event::ReservationReqAccepted {
                    relay_peer_id, renewal: false, ..
                })) => {
                    tracing::info!(relay = %relay_peer_id, "a relay holds a reservation for this node");
                }
                SwarmEvent::Behaviour(BehaviourEvent::Dcutr(dcutr::Event { remote_peer_id, result })) => {
                    let mut reach = lock(&shared.reach);
                    match result {
                        Ok(_) => {
                            tracing::info!(peer = %remote_peer_id, "hole punched: a direct connection");
                            reach.hole_punched += 1;
                        }
                        Err(e) => {
                            tracing::info!(peer = %remote_peer_id, "hole punching failed, staying relayed: {e}");
                            reach.hole_punch_failed += 1;
                        }
                    }
                }
                SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                    tracing::trace!(?peer_id, "dial failed: {error}");
                    if let Some(p) = peer_id {
                        *lock(&shared.reach).failures.entry(p).or_default() += 1;
                    }
                }
                _ => {}
            },
        }
    }
}

fn peer_id_of(p: &PeerAddr) -> PeerId {
    peer_id(&p.key)
}

/// What this node's relay served: counted for `stats`.
#[allow(deprecated)]
fn served(reach: &mut Reach, e: relay::Event) {
    match e {
        relay::Event::ReservationReqAccepted { src_peer_id, .. } => {
            reach.serving_reservations.insert(src_peer_id);
        }
        relay::Event::ReservationClosed { src_peer_id } | relay::Event::ReservationTimedOut { src_peer_id } => {
            reach.serving_reservations.remove(&src_peer_id);
        }
        relay::Event::CircuitReqAccepted { .. } => reach.serving_circuits += 1,
        relay::Event::CircuitClosed { .. } => reach.serving_circuits = reach.serving_circuits.saturating_sub(1),
        relay::Event::ReservationReqDenied { src_peer_id, .. } => {
            tracing::debug!(peer = %src_peer_id, "refused a reservation");
            reach.relay_refused += 1;
        }
        relay::Event::CircuitReqDenied { src_peer_id, dst_peer_id, .. } => {
            tracing::debug!(from = %src_peer_id, to = %dst_peer_id, "refused a circuit");
            reach.relay_refused += 1;
        }
        _ => {}
    }
}

/// This node's stream to `peer`: opened while the peer is connected, and again if it breaks.
async fn write_stream(mut control: libp2p_stream::Control, shared: Arc<Shared>, peer: PeerId, index: u16) {
    loop {
        if !lock(&shared.book).connected.contains(&peer) {
            return;
        }
        let stream = match tokio::time::timeout(Duration::from_secs(5), open(&mut control, peer)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(%peer, "opening a stream: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            Err(_) => continue,
        };
        let (wtx, mut wrx) = outbox();
        let n = shared.streams.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if shared.delay != LinkDelay::NONE {
            wrx = wrx.through(|q| delayed(q, shared.delay, (u64::from(index) << 32) ^ n));
        }
        lock(&shared.writers).insert(index, (n, wtx));
        write_outbox(stream, wrx).await;
        {
            let mut w = lock(&shared.writers);
            if w.get(&index).is_some_and(|(c, _)| *c == n) {
                w.remove(&index);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A stream to `peer` that its node has taken: it answers a new stream with one byte once it
/// reads it. (Inbound streams the peer's libp2p cannot hand on at once are dropped there, so a
/// stream is used only after that answer: nothing is written into a stream nobody reads.)
async fn open(control: &mut libp2p_stream::Control, peer: PeerId) -> Result<Compat<libp2p::Stream>, NetError> {
    let stream_error = |e: &dyn std::fmt::Display| NetError::Stream(e.to_string());
    let mut stream = control.open_stream(peer, PROTOCOL).await.map_err(|e| stream_error(&e))?.compat();
    let mut ack = [0u8; 1];
    stream.read_exact(&mut ack).await.map_err(|e| stream_error(&e))?;
    if ack != [ACK] {
        return Err(NetError::Stream(format!("the peer answered {ack:?}, not a stream acknowledgement")));
    }
    Ok(stream)
}

/// The byte that acknowledges a stream.
const ACK: u8 = 0x4d;

/// Every stream peers open to this node: acknowledged, then frames decoded and handed on.
async fn read_streams(
    mut incoming: libp2p_stream::IncomingStreams,
    shared: Arc<Shared>,
    events: mpsc::UnboundedSender<MeshEvent>,
) {
    while let Some((peer, stream)) = incoming.next().await {
        let mut stream = stream.compat();
        let Some(index) = number(&shared, &peer, &events, false) else { continue };
        let events = events.clone();
        let shared = shared.clone();
        tokio::spawn(async move {
            if stream.write_all(&[ACK]).await.is_err() || stream.flush().await.is_err() {
                return;
            }
            let mut bad = 0u64;
            let mut asked = false;
            loop {
                let frame = match read_frame(&mut stream).await {
                    Ok(f) => f,
                    // One line per stream: why the peer's stream ended (closed, reset, over the limit).
                    Err(e) => {
                        tracing::debug!(%peer, index, "a peer's stream ended: {e:#}");
                        break;
                    }
                };
                metrics::counter!("metatopia_net_bytes_in_total").increment(frame.len() as u64 + 4);
                match NodeMsg::decode(&frame, MAX_FRAME as usize) {
                    Ok(m) => {
                        if !asked && m.asks_for_the_sim() {
                            asked = true;
                            lock(&shared.book).quiet.remove(&index);
                        }
                        if events.send(MeshEvent::Message(ValidatorIndex(index), m)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        // Rate-limited: the first, then every 1,000th of a stream.
                        bad += 1;
                        metrics::counter!("metatopia_net_bad_frames_total").increment(1);
                        if bad == 1 || bad.is_multiple_of(1000) {
                            tracing::warn!(%peer, index, bad, "dropping a bad frame: {e}");
                        }
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests;
