//! The nodes' mesh, over libp2p: QUIC, with TCP + noise + yamux as the fallback; identify and
//! ping; and the sim's messages on long-lived streams of the protocol [`PROTOCOL`], one per
//! direction between two nodes, carrying length-prefixed frames.
//!
//! A node's libp2p identity *is* its ed25519 node key, so a peer is known by the key the
//! transport authenticated (noise or TLS), never by what it claims: dialing a listed node at its
//! address fails unless the node there holds that node's key, and an inbound connection is
//! numbered by its key. The numbering ("peer index") is the config's order of the sim's nodes;
//! nodes outside the list (a node that joined with `run --join` and follows the sim) get the
//! next free indices as they connect, up to [`MAX_UNLISTED`] at a time. Messages carry their own
//! signatures besides (votes, proposals, events), so the index only says whom to answer.

pub mod card;
pub mod frames;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::num::NonZeroU8;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{Multiaddr, PeerId, StreamProtocol, identify, identity, noise, ping, tcp, yamux};
use metatopia_consensus::{SigningKey, ValidatorIndex, VerifyingKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::compat::{Compat, FuturesAsyncReadCompatExt};

pub use crate::net::frames::MAX_FRAME;
use crate::net::frames::{read_frame, write_frames};
use crate::net::wire::NodeMsg;

/// The sim's messages between nodes. The version changes with the messages' meaning (2: block
/// digests over event ids, compact proposals), so nodes of different versions do not talk.
pub const PROTOCOL: StreamProtocol = StreamProtocol::new("/metatopia/sim/5");
/// What identify announces.
const AGENT: &str = concat!("metatopia/", env!("CARGO_PKG_VERSION"));
/// Nodes outside the config's list this node serves at the same time (followers that joined).
pub const MAX_UNLISTED: usize = 64;
/// Peer indices stay below this (the agreement numbers senders outside a validator set from
/// 0x8000 up).
const MAX_INDEX: usize = 0x4000;
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
}

impl PeerAddr {
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
    /// A node outside the list connected and got this index.
    Joined { index: u16, key: VerifyingKey },
}

/// The libp2p identity of an ed25519 node key.
pub fn peer_id(key: &VerifyingKey) -> PeerId {
    let public = identity::ed25519::PublicKey::try_from_bytes(key.as_bytes())
        .expect("an ed25519-dalek verifying key is a valid ed25519 public key");
    identity::PublicKey::from(public).to_peer_id()
}

/// The node key behind a peer id, when it is an ed25519 key (inlined in the id).
pub fn peer_key(peer: &PeerId) -> Option<VerifyingKey> {
    let hash: &libp2p::multihash::Multihash<64> = peer.as_ref();
    if hash.code() != 0 {
        return None;
    }
    let public = identity::PublicKey::try_decode_protobuf(hash.digest()).ok()?.try_into_ed25519().ok()?;
    VerifyingKey::from_bytes(&public.to_bytes()).ok()
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    stream: libp2p_stream::Behaviour,
}

/// Who is who: peer index <-> key <-> peer id.
#[derive(Debug)]
struct Book {
    keys: Vec<VerifyingKey>,
    by_peer: BTreeMap<PeerId, u16>,
    listed: usize,
    me: PeerId,
    /// Peers with at least one open connection.
    connected: BTreeSet<PeerId>,
    /// How each connected peer was last reached ("quic" or "tcp").
    via: BTreeMap<PeerId, &'static str>,
    /// Indices of nodes of other sims (neighbour sims' validators): messaged, not broadcast to.
    outsiders: BTreeSet<u16>,
}

impl Book {
    /// The index of the node with this key, numbering it next if it is new and there is room.
    fn number_key(&mut self, key: VerifyingKey) -> Option<u16> {
        let id = peer_id(&key);
        if let Some(&i) = self.by_peer.get(&id) {
            return Some(i);
        }
        if self.keys.len() >= MAX_INDEX {
            return None;
        }
        let i = self.keys.len() as u16;
        self.keys.push(key);
        self.by_peer.insert(id, i);
        Some(i)
    }

    /// The index of `peer`, numbering an unlisted one if there is room (`Some((index, new))`).
    fn index(&mut self, peer: &PeerId) -> Option<(u16, bool)> {
        if let Some(&i) = self.by_peer.get(peer) {
            return Some((i, false));
        }
        let key = peer_key(peer)?;
        let unlisted = self
            .connected
            .iter()
            .filter(|p| self.by_peer.get(p).is_none_or(|&i| usize::from(i) >= self.listed))
            .count();
        if unlisted >= MAX_UNLISTED || self.keys.len() >= MAX_INDEX {
            return None;
        }
        let i = self.keys.len() as u16;
        self.keys.push(key);
        self.by_peer.insert(*peer, i);
        Some((i, true))
    }
}

/// Per peer index: the connection's number and its writer (a new stream replaces both).
type Writers = BTreeMap<u16, (u64, mpsc::UnboundedSender<Arc<Vec<u8>>>)>;

#[derive(Debug)]
struct Shared {
    book: Mutex<Book>,
    writers: Mutex<Writers>,
    streams: std::sync::atomic::AtomicU64,
    delay: LinkDelay,
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
    ) -> anyhow::Result<(Mesh, mpsc::UnboundedReceiver<MeshEvent>)> {
        Mesh::start_delayed(key, tcp, quic, peers, LinkDelay::NONE).await
    }

    /// [`Mesh::start`], with a [`LinkDelay`] on every frame this node sends.
    pub async fn start_delayed(
        key: &SigningKey,
        tcp: SocketAddr,
        quic: Option<SocketAddr>,
        peers: Vec<PeerAddr>,
        delay: LinkDelay,
    ) -> anyhow::Result<(Mesh, mpsc::UnboundedReceiver<MeshEvent>)> {
        let keypair = identity::Keypair::ed25519_from_bytes(key.to_bytes())
            .map_err(|e| anyhow::anyhow!("the node key as a libp2p identity: {e}"))?;
        let me = keypair.public().to_peer_id();
        let mut swarm = libp2p::SwarmBuilder::with_existing_identity(keypair)
            .with_tokio()
            .with_tcp(tcp::Config::new().nodelay(true), noise::Config::new, yamux::Config::default)?
            .with_quic_config(|mut c| {
                c.handshake_timeout = Duration::from_secs(2);
                c
            })
            .with_behaviour(|k| Behaviour {
                identify: identify::Behaviour::new(
                    identify::Config::new("/metatopia/1".into(), k.public()).with_agent_version(AGENT.into()),
                ),
                ping: ping::Behaviour::new(ping::Config::new().with_interval(Duration::from_secs(5))),
                stream: libp2p_stream::Behaviour::new(),
            })?
            .with_swarm_config(|c| {
                c.with_idle_connection_timeout(Duration::from_secs(3600))
                    // QUIC first, TCP only when QUIC fails.
                    .with_dial_concurrency_factor(NonZeroU8::MIN)
            })
            .build();
        swarm.listen_on(Multiaddr::from(tcp.ip()).with(Protocol::Tcp(tcp.port())))?;
        if let Some(q) = quic {
            swarm.listen_on(Multiaddr::from(q.ip()).with(Protocol::Udp(q.port())).with(Protocol::QuicV1))?;
        }
        // The listeners are up (or failed) once their first event arrives.
        let mut listening = Vec::new();
        let want = 1 + usize::from(quic.is_some());
        while listening.len() < want {
            match tokio::time::timeout(Duration::from_secs(5), swarm.select_next_some()).await {
                Ok(SwarmEvent::NewListenAddr { address, .. }) => listening.push(address),
                Ok(SwarmEvent::ListenerError { error, .. }) => anyhow::bail!("listening: {error}"),
                Ok(SwarmEvent::ListenerClosed { addresses, reason, .. }) => {
                    anyhow::bail!("listening on {addresses:?}: {:?}", reason.err())
                }
                Ok(_) => {}
                Err(_) => anyhow::bail!("the listeners on {tcp} and {quic:?} did not come up within 5 s"),
            }
        }

        let book = Book {
            keys: peers.iter().map(|p| p.key).collect(),
            by_peer: peers.iter().enumerate().map(|(i, p)| (peer_id(&p.key), i as u16)).collect(),
            listed: peers.len(),
            me,
            connected: BTreeSet::new(),
            via: BTreeMap::new(),
            outsiders: BTreeSet::new(),
        };
        let shared = Arc::new(Shared {
            book: Mutex::new(book),
            writers: Mutex::default(),
            streams: std::sync::atomic::AtomicU64::new(0),
            delay,
        });
        let (tx, rx) = mpsc::unbounded_channel();
        let (commands, command_rx) = mpsc::unbounded_channel();
        let mut control = swarm.behaviour().stream.new_control();
        let incoming = control.accept(PROTOCOL).map_err(|e| anyhow::anyhow!("{e}"))?;
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
        lock(&self.shared.book).keys.get(usize::from(index)).copied()
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
            metrics::counter!("metatopia_net_bytes_out_total").increment(frame.len() as u64 + 4);
            let _ = w.send(frame);
        }
    }

    /// Send an encoded [`NodeMsg`] to every connected peer of this sim.
    pub fn broadcast_frame(&self, frame: Arc<Vec<u8>>) {
        let outsiders = lock(&self.shared.book).outsiders.clone();
        let writers = lock(&self.shared.writers);
        let mut sent = 0;
        for (i, (_, w)) in writers.iter() {
            if !outsiders.contains(i) {
                let _ = w.send(frame.clone());
                sent += 1;
            }
        }
        metrics::counter!("metatopia_net_bytes_out_total").increment((frame.len() as u64 + 4) * sent);
    }

    /// The connected peers by index, each with how it was reached ("quic" or "tcp").
    pub fn transports(&self) -> BTreeMap<u16, &'static str> {
        let book = lock(&self.shared.book);
        book.via.iter().filter_map(|(p, v)| book.by_peer.get(p).map(|i| (*i, *v))).collect()
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

/// The swarm's loop: connections, dialing, identify and ping; a writer for each connected peer.
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
                            Some(q) if p.tcp.is_some() || p.quic.is_some() => *q = p,
                            Some(_) => {}
                            None => peers.push(p),
                        }
                    }
                }
                None => return,
            },
            _ = redial.tick() => {
                for p in &peers {
                    let id = peer_id(&p.key);
                    let addrs = p.multiaddrs();
                    if id == me || addrs.is_empty() || swarm.is_connected(&id) {
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
                SwarmEvent::ConnectionEstablished { peer_id, num_established, endpoint, .. } => {
                    let Some(index) = number(&shared, &peer_id, &events, true) else {
                        tracing::debug!(%peer_id, "refusing a peer: not an ed25519 identity, or too many unlisted peers");
                        let _ = swarm.disconnect_peer_id(peer_id);
                        continue;
                    };
                    let addr = endpoint.get_remote_address();
                    let via = if addr.iter().any(|p| matches!(p, Protocol::QuicV1)) { "quic" } else { "tcp" };
                    lock(&shared.book).via.insert(peer_id, via);
                    tracing::debug!(%peer_id, index, %addr, "connected");
                    if num_established.get() == 1 {
                        tokio::spawn(write_stream(control.clone(), shared.clone(), peer_id, index));
                    }
                }
                SwarmEvent::ConnectionClosed { peer_id, num_established: 0, cause, .. } => {
                    tracing::debug!(%peer_id, "disconnected: {cause:?}");
                    let mut book = lock(&shared.book);
                    book.connected.remove(&peer_id);
                    book.via.remove(&peer_id);
                }
                SwarmEvent::Behaviour(BehaviourEvent::Ping(ping::Event { result: Ok(rtt), .. })) => {
                    metrics::histogram!("metatopia_peer_rtt_seconds").record(rtt.as_secs_f64());
                }
                SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received { peer_id, info, .. })) => {
                    tracing::debug!(%peer_id, agent = info.agent_version, addrs = ?info.listen_addrs, "identified");
                }
                SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                    tracing::trace!(?peer_id, "dial failed: {error}");
                }
                _ => {}
            },
        }
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
        let (wtx, mut wrx) = mpsc::unbounded_channel::<Arc<Vec<u8>>>();
        let n = shared.streams.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if shared.delay != LinkDelay::NONE {
            wrx = delayed(wrx, shared.delay, (u64::from(index) << 32) ^ n);
        }
        lock(&shared.writers).insert(index, (n, wtx));
        write_frames(stream, wrx).await;
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
async fn open(control: &mut libp2p_stream::Control, peer: PeerId) -> anyhow::Result<Compat<libp2p::Stream>> {
    let mut stream = control.open_stream(peer, PROTOCOL).await?.compat();
    let mut ack = [0u8; 1];
    stream.read_exact(&mut ack).await?;
    anyhow::ensure!(ack == [ACK], "the peer answered {ack:?}, not a stream acknowledgement");
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
        tokio::spawn(async move {
            if stream.write_all(&[ACK]).await.is_err() || stream.flush().await.is_err() {
                return;
            }
            let mut bad = 0u64;
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
mod tests {
    use super::*;

    fn key(i: u8) -> SigningKey {
        SigningKey::from_bytes(&[i; 32])
    }

    fn loopback(port: u16) -> SocketAddr {
        ([127, 0, 0, 1], port).into()
    }

    fn addrs(n: usize) -> Vec<(SocketAddr, SocketAddr)> {
        let tcp = free_ports(n).unwrap();
        let udp = free_udp_ports(n).unwrap();
        tcp.into_iter().zip(udp).map(|(t, u)| (loopback(t), loopback(u))).collect()
    }

    /// The next message from `rx` within 10 s (skipping announcements).
    async fn next(rx: &mut mpsc::UnboundedReceiver<MeshEvent>) -> (ValidatorIndex, NodeMsg) {
        loop {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("a message within 10 s") {
                Some(MeshEvent::Message(i, m)) => return (i, m),
                Some(MeshEvent::Joined { .. }) => {}
                None => panic!("the mesh stopped"),
            }
        }
    }

    async fn until_connected(m: &Mesh, n: usize) {
        let t0 = std::time::Instant::now();
        while m.connected() < n {
            assert!(t0.elapsed() < Duration::from_secs(15), "{} of {n} peers connected", m.connected());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[test]
    fn peer_ids_are_the_node_keys() {
        let k = key(7).verifying_key();
        let id = peer_id(&k);
        assert_eq!(peer_key(&id), Some(k));
        assert_eq!(peer_key(&PeerId::random()), None, "not an ed25519 identity");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn listed_nodes_connect_over_quic_and_are_numbered_by_their_keys() {
        let a = addrs(3);
        let peers: Vec<PeerAddr> = (0..3)
            .map(|i| PeerAddr { key: key(i as u8 + 1).verifying_key(), tcp: Some(a[i].0), quic: Some(a[i].1) })
            .collect();
        let mut meshes = Vec::new();
        for (i, (tcp, quic)) in a.iter().enumerate() {
            meshes.push(Mesh::start(&key(i as u8 + 1), *tcp, Some(*quic), peers.clone()).await.unwrap());
        }
        for (m, _) in &meshes {
            until_connected(m, 2).await;
        }
        assert!(meshes[0].0.transports().values().all(|v| *v == "quic"), "{:?}", meshes[0].0.transports());
        meshes[0].0.broadcast(&NodeMsg::SnapshotRequest);
        for (_, rx) in &mut meshes[1..] {
            assert_eq!(next(rx).await, (ValidatorIndex(0), NodeMsg::SnapshotRequest));
        }
        let m = NodeMsg::Snapshot { tick: 9, bytes: vec![7; 300_000] };
        meshes[2].0.send(1, &m);
        assert_eq!(next(&mut meshes[1].1).await, (ValidatorIndex(2), m));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_delay_stage_holds_each_frame_and_keeps_their_order() {
        let a = addrs(2);
        let peers: Vec<PeerAddr> = (0..2)
            .map(|i| PeerAddr { key: key(i as u8 + 1).verifying_key(), tcp: Some(a[i].0), quic: Some(a[i].1) })
            .collect();
        let delay = LinkDelay { one_way: Duration::from_millis(40), jitter_percent: 50 };
        let (m0, _rx0) = Mesh::start_delayed(&key(1), a[0].0, Some(a[0].1), peers.clone(), delay).await.unwrap();
        let (m1, mut rx1) = Mesh::start(&key(2), a[1].0, Some(a[1].1), peers).await.unwrap();
        until_connected(&m0, 1).await;
        until_connected(&m1, 1).await;
        let frame = |tick| NodeMsg::Snapshot { tick, bytes: vec![tick as u8; 100] };
        m0.send(1, &frame(0));
        assert_eq!(next(&mut rx1).await.1, frame(0), "the stream is open");
        let t0 = std::time::Instant::now();
        for t in 1..=40 {
            m0.send(1, &frame(t));
        }
        assert_eq!(next(&mut rx1).await.1, frame(1));
        // At least the delay less its jitter (a loaded machine can only add to it).
        assert!(t0.elapsed() >= Duration::from_millis(20), "{:?}", t0.elapsed());
        // In order, whatever each frame's jitter.
        for t in 2..=40 {
            assert_eq!(next(&mut rx1).await.1, frame(t));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_quic_the_nodes_fall_back_to_tcp() {
        let a = addrs(2);
        // Node 1 listens on TCP only; node 0 is told of a QUIC address where nothing answers.
        let peers = vec![
            PeerAddr { key: key(1).verifying_key(), tcp: Some(a[0].0), quic: Some(a[0].1) },
            PeerAddr { key: key(2).verifying_key(), tcp: Some(a[1].0), quic: Some(a[1].1) },
        ];
        let (m0, _rx0) = Mesh::start(&key(1), a[0].0, Some(a[0].1), peers.clone()).await.unwrap();
        // (Node 1 does not dial: only node 0's dial, QUIC first, makes the connection.)
        let unknown = vec![PeerAddr { tcp: None, quic: None, ..peers[0].clone() }, peers[1].clone()];
        let (m1, mut rx1) = Mesh::start(&key(2), a[1].0, None, unknown).await.unwrap();
        until_connected(&m0, 1).await;
        until_connected(&m1, 1).await;
        m0.send(1, &NodeMsg::SnapshotRequest);
        assert_eq!(next(&mut rx1).await, (ValidatorIndex(0), NodeMsg::SnapshotRequest));
        assert_eq!(m0.transports().get(&1), Some(&"tcp"), "{:?}", m0.transports());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_node_is_known_by_its_key_not_its_address() {
        let a = addrs(2);
        let (k1, k2, impostor) = (key(1), key(2), key(3));
        // Node 0 expects key 2 at node 1's address, but the impostor listens there.
        let expected = vec![
            PeerAddr { key: k1.verifying_key(), tcp: Some(a[0].0), quic: Some(a[0].1) },
            PeerAddr { key: k2.verifying_key(), tcp: Some(a[1].0), quic: Some(a[1].1) },
        ];
        let (m0, mut rx0) = Mesh::start(&k1, a[0].0, Some(a[0].1), expected.clone()).await.unwrap();
        // The impostor dials node 0 itself, and says it is validator 1 by sending as it would.
        let theirs = vec![expected[0].clone(), PeerAddr { key: impostor.verifying_key(), tcp: None, quic: None }];
        let (m1, _rx1) = Mesh::start(&impostor, a[1].0, Some(a[1].1), theirs).await.unwrap();
        until_connected(&m1, 1).await;
        m1.send(0, &NodeMsg::SnapshotRequest);
        // Node 0 numbers it as a node outside its list, under its real key.
        let t0 = std::time::Instant::now();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), rx0.recv()).await.unwrap().unwrap() {
                MeshEvent::Joined { index, key } => {
                    assert_eq!((index, key), (2, impostor.verifying_key()));
                }
                MeshEvent::Message(from, m) => {
                    assert_eq!((from, m), (ValidatorIndex(2), NodeMsg::SnapshotRequest));
                    break;
                }
            }
            assert!(t0.elapsed() < Duration::from_secs(10));
        }
        assert_eq!(m0.key_of(2), Some(impostor.verifying_key()));
        // And its dials to "validator 1" at that address never connect as validator 1.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(m0.transports().keys().copied().collect::<Vec<_>>(), vec![2]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn garbage_on_the_port_harms_nothing() {
        use tokio::io::AsyncWriteExt as _;
        let a = addrs(2);
        let peers: Vec<PeerAddr> = (0..2)
            .map(|i| PeerAddr { key: key(i as u8 + 1).verifying_key(), tcp: Some(a[i].0), quic: Some(a[i].1) })
            .collect();
        let (m0, _rx0) = Mesh::start(&key(1), a[0].0, Some(a[0].1), peers.clone()).await.unwrap();
        for len in [0usize, 1, 40, 5_000] {
            let mut s = tokio::net::TcpStream::connect(a[0].0).await.unwrap();
            let _ = s.write_all(&vec![0xa5; len]).await;
        }
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        u.send_to(&[0xff; 1200], a[0].1).unwrap();
        let (m1, mut rx1) = Mesh::start(&key(2), a[1].0, Some(a[1].1), peers).await.unwrap();
        until_connected(&m0, 1).await;
        until_connected(&m1, 1).await;
        m0.send(1, &NodeMsg::SnapshotRequest);
        assert_eq!(next(&mut rx1).await, (ValidatorIndex(0), NodeMsg::SnapshotRequest));
    }
}
