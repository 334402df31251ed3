//! The client library: connect to a node of the sim the avatar is in, keep a view of the area of
//! interest, act with signed events, and fail over to another node when the one in use dies.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use metatopia_client::{Client, proto::NodeAddr};
//! let bootstrap: NodeAddr = "…64 hex…@127.0.0.1:7400".parse().map_err(anyhow::Error::msg)?;
//! let key = metatopia_client::keys::load_or_create(std::path::Path::new("me.key"))?;
//! let mut c = Client::connect(&bootstrap, key).await?;
//! c.login("Ada").await?;
//! c.walk(1, 0).await?;                  // east at 1 m/s
//! c.say(0, "hello").await?;
//! while let Some(m) = c.next().await { /* c.view() is up to date */ }
//! # Ok(()) }
//! ```

pub use crate::error::ClientError;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use metatopia_sim::event::{ChatRange, Payload, SignedEvent, account_of};
use metatopia_sim::{Fx, ObjectId, SimId, Tick, Vec2};

use crate::proto::{
    AccountView, ChatView, ClientMsg, MAX_SERVER_FRAME, NodeAddr, ObjectUpdate, ObjectView, Outcome, ServerMsg, Status,
    decimal_of_mm, hex, read_frame, write_frame,
};
use crate::quic::{SERVER_NAME, client_config, parse_public, resolve};

/// How long a request waits for its answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// Chat lines a view keeps.
const KEEP_CHAT: usize = 200;

/// What a client knows of the world: its area of interest as of `tick`, and chat it heard.
#[derive(Debug, Default, Clone)]
pub struct View {
    pub tick: Tick,
    pub status: Option<Status>,
    pub objects: BTreeMap<String, ObjectView>,
    pub chat: VecDeque<ChatView>,
    /// `tick` messages applied.
    pub deltas: u64,
    /// Each object's dead-reckoning base: where it was (mm), its velocity (mm/s), at which tick.
    motion: BTreeMap<String, ([i64; 2], [i64; 2], Tick)>,
    /// Keep only the objects of this account ([`Client::keep_own_objects_only`]).
    own_only: Option<String>,
}

impl View {
    /// Apply a message from the node.
    pub fn apply(&mut self, m: &ServerMsg) {
        match m {
            ServerMsg::Status(s) => {
                self.tick = self.tick.max(s.tick);
                self.status = Some((**s).clone());
            }
            ServerMsg::Tick { tick, enter, update, leave } => {
                for o in enter {
                    if self.own_only.as_ref().is_some_and(|me| *me != o.owner) {
                        continue;
                    }
                    let (at, vel) = o.motion_mm();
                    self.motion.insert(o.id.clone(), (at, vel, *tick));
                    self.objects.insert(o.id.clone(), o.clone());
                }
                for u in update {
                    if let Some(o) = self.objects.get_mut(&u.id) {
                        u.apply(o);
                        if let Some(at) = u.at_mm {
                            let vel = u.vel_mm.unwrap_or_else(|| o.motion_mm().1);
                            match self.motion.get_mut(&u.id) {
                                Some(m) => *m = (at, vel, *tick),
                                None => {
                                    self.motion.insert(u.id.clone(), (at, vel, *tick));
                                }
                            }
                        }
                    }
                }
                for id in leave {
                    self.objects.remove(id);
                    self.motion.remove(id);
                }
                self.tick = *tick;
                self.deltas += 1;
            }
            ServerMsg::Chat(c) => {
                self.chat.push_back(c.clone());
                if self.chat.len() > KEEP_CHAT {
                    self.chat.pop_front();
                }
            }
            _ => {}
        }
    }

    /// Where an object is now, millimetres: dead reckoned from the last position the node sent
    /// (`objects[id].position` is that last position; moving objects go on moving between the
    /// node's corrections).
    pub fn position_mm(&self, id: &str) -> Option<[i64; 2]> {
        let o = self.objects.get(id)?;
        Some(match self.motion.get(id) {
            Some((at, vel, since)) if *vel != [0, 0] => {
                let rate = self.status.as_ref().map_or(20, |s| s.tick_rate_hz);
                ObjectUpdate::extrapolate(*at, *vel, self.tick.since(*since), rate)
            }
            _ => o.motion_mm().0,
        })
    }

    /// An object's velocity now, millimetres a second.
    pub fn velocity_mm(&self, id: &str) -> Option<[i64; 2]> {
        match self.motion.get(id) {
            Some((_, vel, _)) => Some(*vel),
            None => self.objects.get(id).map(|o| o.motion_mm().1),
        }
    }

    /// Where an object is now, whole metres (rounded down).
    pub fn metres_of(&self, id: &str) -> Option<[i64; 2]> {
        self.position_mm(id).map(|p| [p[0].div_euclid(1000), p[1].div_euclid(1000)])
    }

    /// Where an object is now, as decimal metres.
    pub fn position_of(&self, id: &str) -> Option<[String; 2]> {
        self.position_mm(id).map(|p| [decimal_of_mm(p[0]), decimal_of_mm(p[1])])
    }

    /// The avatar of `account`, if it is in the area.
    pub fn avatar_of(&self, account: &str) -> Option<&ObjectView> {
        self.objects.values().find(|o| o.avatar && o.owner == account)
    }

    /// The object nearest to `at` other than avatars (what `touch` and `script` act on).
    pub fn nearest_thing(&self, at: [i64; 2]) -> Option<&ObjectView> {
        self.objects.values().filter(|o| !o.avatar).min_by_key(|o| {
            let p = self.metres_of(&o.id).unwrap_or_else(|| o.metres());
            ((p[0] - at[0]).pow(2) + (p[1] - at[1]).pow(2), o.id.clone())
        })
    }
}

/// One connection to a node.
struct Link {
    node: NodeAddr,
    conn: quinn::Connection,
    send: quinn::SendStream,
    rx: tokio::sync::mpsc::Receiver<ServerMsg>,
}

/// How long a client that followed its avatar into another sim waits for the avatar to arrive.
const ARRIVAL_WAIT: Duration = Duration::from_secs(5);

/// A client of one account.
#[derive(Debug)]
pub struct Client {
    key: SigningKey,
    account: String,
    endpoint: quinn::Endpoint,
    link: Option<LinkBox>,
    /// The nodes of the avatar's sim (from the route answer), to fail over to.
    nodes: Vec<NodeAddr>,
    sim: u32,
    nonce: u64,
    next_ref: u64,
    view: View,
    /// Messages read while waiting for an answer, for [`Client::next`].
    pending: VecDeque<ServerMsg>,
    name: Option<String>,
    /// Times this client moved to another node.
    pub failovers: u32,
    /// Times it followed its avatar into another sim.
    pub crossings: u32,
    /// A move to another sim (`Moved`) not finished yet: [`Client::next`] may be cancelled (a
    /// timeout around it) while it dials the new sim's node; the next call finishes the move.
    moving: Option<(u32, Vec<NodeAddr>)>,
    /// Why the node closed this client's session on purpose (kicked, banned, misbehaving): it
    /// does not fail over then.
    closed: Option<String>,
    /// When the session was last refreshed (a `Login` while logged in): a client that stops
    /// refreshing has its avatar removed after the sim's grace period.
    refreshed: Option<tokio::time::Instant>,
    /// A player's client uses the nearest node of its sim ([`crate::nearest`]); bots, many on
    /// one machine, spread by account without measuring.
    nearest: bool,
    /// The last round trips measured to `nodes` (same order), and when.
    rtts: Vec<Option<Duration>>,
    probed: Option<tokio::time::Instant>,
    /// A measurement running in the background.
    probing: Option<tokio::task::JoinHandle<Vec<Option<Duration>>>>,
    /// Times it moved to a clearly nearer node of its sim.
    pub nearer_moves: u32,
    /// How often it measures the sim's nodes again.
    probe_every: Duration,
}

/// `Link` without a `Debug` of its streams.
struct LinkBox(Link);

impl std::fmt::Debug for LinkBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({})", self.0.node)
    }
}

/// Why an event did not take effect.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error("the node refused it: {0}")]
    NotSubmitted(String),
    #[error("refused at tick {tick}: {reason}")]
    Refused { tick: Tick, reason: String },
    #[error("no outcome within {0:?}")]
    Timeout(Duration),
    #[error("connection: {0}")]
    Connection(String),
}

impl Client {
    /// Ask `bootstrap` (pinned to its key) which nodes serve this account's sim, then connect to
    /// one of them (the bootstrap itself when it is one). A client's own QUIC endpoint is bound
    /// on an ephemeral loopback or unspecified port, as the bootstrap's address family asks.
    pub async fn connect(bootstrap: &NodeAddr, key: SigningKey) -> Result<Client, ClientError> {
        Client::connect_at(bootstrap, key, None).await
    }

    /// [`Client::connect`]; an account without an avatar anywhere goes to the sim whose square
    /// holds `at` (world metres), wherever the bootstrap is: its node finds that sim through
    /// Raynet.
    pub async fn connect_at(
        bootstrap: &NodeAddr,
        key: SigningKey,
        at: Option<[i64; 2]>,
    ) -> Result<Client, ClientError> {
        let endpoint = Client::endpoint_for(bootstrap)?;
        Client::connect_as(endpoint, bootstrap, key, at, true).await
    }

    /// A QUIC endpoint (one UDP socket, its buffers as large as the kernel grants up to
    /// [`crate::quic::SOCKET_BUFFER`]: bots share one a hundred) for reaching `node`.
    pub fn endpoint_for(node: &NodeAddr) -> Result<quinn::Endpoint, ClientError> {
        let first: SocketAddr = resolve(&node.addr)?;
        let bind: SocketAddr =
            if first.ip().is_loopback() { (first.ip(), 0).into() } else { "0.0.0.0:0".parse().expect("an address") };
        crate::quic::endpoint(bind, None).map_err(ClientError::Socket)
    }

    /// [`Client::connect`] on a given endpoint, for bots (many share a few endpoints on one
    /// machine): they spread over the sim's nodes by account, without measuring round trips.
    pub async fn connect_on(
        endpoint: quinn::Endpoint,
        bootstrap: &NodeAddr,
        key: SigningKey,
    ) -> Result<Client, ClientError> {
        Client::connect_as(endpoint, bootstrap, key, None, false).await
    }

    /// [`Client::connect_at`] on a given endpoint; `nearest`: measure the sim's nodes and use
    /// the nearest (a player), or spread by account (a bot).
    pub async fn connect_as(
        endpoint: quinn::Endpoint,
        bootstrap: &NodeAddr,
        key: SigningKey,
        at: Option<[i64; 2]>,
        nearest: bool,
    ) -> Result<Client, ClientError> {
        let account = account_of(&key).to_string();
        let mut c = Client {
            key,
            account,
            endpoint,
            link: None,
            nodes: Vec::new(),
            sim: 0,
            nonce: 0,
            next_ref: 0,
            view: View::default(),
            pending: VecDeque::new(),
            name: None,
            failovers: 0,
            crossings: 0,
            moving: None,
            closed: None,
            refreshed: None,
            nearest,
            rtts: Vec::new(),
            probed: None,
            probing: None,
            nearer_moves: 0,
            probe_every: crate::nearest::PROBE_EVERY,
        };
        c.link = Some(LinkBox(c.dial(bootstrap).await?));
        let route = c
            .request(
                match at {
                    Some(at) => ClientMsg::Enter { account: c.account.clone(), at },
                    None => ClientMsg::Route { account: c.account.clone() },
                },
                |m| matches!(m, ServerMsg::Route { .. }),
            )
            .await?;
        let ServerMsg::Route { sim, nodes } = route else { unreachable!("matched above") };
        if nodes.is_empty() {
            return Err(ClientError::NoNode(format!("{bootstrap} knows no node of this account's sim")));
        }
        c.sim = sim;
        c.nodes = nodes;
        // A player's client takes the nearest node; nodes as near share clients by account
        // (all of a sim's nodes serve the same state); a bootstrap that does not serve the sim
        // is always left. The keys come from the pinned bootstrap, so the next connection is
        // pinned too.
        c.measure().await;
        let pick = c.pick();
        if c.nodes[pick].key != bootstrap.key {
            let node = c.nodes[pick].clone();
            match c.dial(&node).await {
                Ok(link) => c.link = Some(LinkBox(link)),
                Err(_) if c.nodes.iter().any(|n| n.key == bootstrap.key) => {} // stay on the bootstrap
                Err(_) => c.reconnect().await?,
            }
        }
        c.follow().await?;
        Ok(c)
    }

    /// This account's node among the sim's: the nearest (as [`crate::nearest::choose`]), or by
    /// account when nothing was measured.
    fn pick(&self) -> usize {
        let hash = crate::nearest::spread_hash(&account_of(&self.key).0);
        crate::nearest::choose(&self.rtts, hash).unwrap_or(hash as usize % self.nodes.len().max(1))
    }

    /// Measure the round trip to every node of the sim now (a player's client only).
    async fn measure(&mut self) {
        if let Some(p) = self.probing.take() {
            p.abort();
        }
        self.rtts =
            if self.nearest { crate::nearest::probe_all(&self.endpoint, &self.nodes).await } else { Vec::new() };
        self.probed = Some(tokio::time::Instant::now());
    }

    /// Every [`crate::nearest::PROBE_EVERY`], measure the nodes again in the background; when
    /// the answers are in and another node is clearly nearer, move there.
    async fn maybe_move_nearer(&mut self) {
        if !self.nearest || self.moving.is_some() {
            return;
        }
        if self.probing.as_ref().is_some_and(|p| p.is_finished()) {
            let Some(p) = self.probing.take() else { return };
            let Ok(rtts) = p.await else { return };
            if rtts.len() != self.nodes.len() {
                return; // the sim's nodes changed meanwhile
            }
            self.rtts = rtts;
            self.probed = Some(tokio::time::Instant::now());
            let current = self.link.as_ref().and_then(|l| self.nodes.iter().position(|n| n.key == l.0.node.key));
            let to = self.pick();
            if let Some(cur) = current
                && cur != to
                && crate::nearest::clearly_nearer(&self.rtts, cur, to)
            {
                let node = self.nodes[to].clone();
                if let Ok(link) = self.dial(&node).await {
                    tracing::info!(from = %self.nodes[cur], to = %node, "moving to a nearer node of the sim");
                    self.link = Some(LinkBox(link));
                    self.reset_view();
                    if self.follow().await.is_ok() {
                        self.nearer_moves += 1;
                    }
                }
            }
            return;
        }
        let due = self.probed.is_none_or(|t| t.elapsed() >= self.probe_every);
        if due && self.probing.is_none() {
            let (endpoint, nodes) = (self.endpoint.clone(), self.nodes.clone());
            self.probing = Some(tokio::spawn(async move { crate::nearest::probe_all(&endpoint, &nodes).await }));
        }
    }

    /// The avatar crossed into `sim`: leave this node for one of that sim's and follow the avatar
    /// there (the sim gives the arrived avatar to the same account).
    async fn move_to(&mut self, sim: u32, nodes: Vec<NodeAddr>) -> Result<(), ClientError> {
        if nodes.is_empty() {
            return Err(ClientError::NoNode(format!("told to move to sim {sim}, but given none of its nodes")));
        }
        self.sim = sim;
        self.nodes = nodes;
        // The nonce is per sim: ask the new sim for the account's last one.
        self.nonce = 0;
        self.link = None;
        self.measure().await;
        let node = self.nodes[self.pick()].clone();
        match self.dial(&node).await {
            Ok(link) => self.link = Some(LinkBox(link)),
            Err(_) => self.reconnect().await?,
        }
        self.reset_view();
        self.follow().await?;
        // Done (the wait below may be cut short by a cancelled call: the avatar comes anyway).
        self.moving = None;
        self.crossings += 1;
        // The old sim tells us when the avatar leaves; the new one has it a few ticks later,
        // once the handoff's mail is certified there. Wait for it (briefly) so that acts that
        // need the avatar work as soon as this returns.
        let deadline = tokio::time::Instant::now() + ARRIVAL_WAIT;
        while tokio::time::Instant::now() < deadline {
            if self.account_view().await?.is_some_and(|a| a.avatar.is_some()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn dial(&self, node: &NodeAddr) -> Result<Link, ClientError> {
        let addr = resolve(&node.addr)?;
        let pinned = parse_public(&node.key).map_err(|e| ClientError::Key(format!("{e:#}")))?;
        let cfg = client_config(pinned)?;
        let connect = |reason: String| ClientError::Connect { node: node.to_string(), reason };
        let connecting = self.endpoint.connect_with(cfg, addr, SERVER_NAME).map_err(|e| connect(e.to_string()))?;
        let conn = tokio::time::timeout(ANSWER_WAIT, connecting)
            .await
            .map_err(|_| ClientError::NoAnswer { node: node.to_string(), wait: ANSWER_WAIT })?
            .map_err(|e| connect(e.to_string()))?;
        let (send, mut recv) = conn.open_bi().await.map_err(|e| connect(format!("opening a stream: {e}")))?;
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        tokio::spawn(async move {
            while let Ok(m) = read_frame::<ServerMsg, _>(&mut recv, MAX_SERVER_FRAME).await {
                if tx.send(m).await.is_err() {
                    return;
                }
            }
        });
        Ok(Link { node: node.clone(), conn, send, rx })
    }

    /// Move to the next node of the sim that answers (after the one in use died).
    async fn reconnect(&mut self) -> Result<(), ClientError> {
        let current = self.link.as_ref().and_then(|l| self.nodes.iter().position(|n| n.key == l.0.node.key));
        self.link = None;
        // Nearest first when measured; else the next ones in order.
        let order: Vec<usize> = if self.rtts.len() == self.nodes.len() {
            crate::nearest::failover_order(&self.rtts, current, self.nodes.len())
        } else {
            let start = current.map_or(0, |i| i + 1);
            (0..self.nodes.len()).map(|i| (start + i) % self.nodes.len()).collect()
        };
        let mut last = None;
        for round in 0..3u64 {
            for &i in &order {
                let node = self.nodes[i].clone();
                match self.dial(&node).await {
                    Ok(link) => {
                        self.link = Some(LinkBox(link));
                        self.reset_view();
                        return Ok(());
                    }
                    Err(e) => last = Some(e),
                }
            }
            tokio::time::sleep(Duration::from_millis(500 * (round + 1))).await;
        }
        Err(last.unwrap_or_else(|| ClientError::NoNode("no node of the sim to connect to".into())))
    }

    /// Tell the node to show this client the area around its avatar.
    async fn follow(&mut self) -> Result<(), ClientError> {
        let max_hz = Some(crate::proto::CLIENT_MAX_HZ);
        self.send(ClientMsg::Interest { follow: Some(self.account.clone()), radius_m: None, max_hz }).await
    }

    async fn send(&mut self, m: ClientMsg) -> Result<(), ClientError> {
        let link = self.link.as_mut().ok_or(ClientError::NotConnected)?;
        write_frame(&mut link.0.send, &m)
            .await
            .map_err(|source| ClientError::Send { node: link.0.node.to_string(), source })
    }

    /// Send `m` and wait for the first message `is_answer` accepts; other messages are applied to
    /// the view and kept for [`Client::next`].
    async fn request(
        &mut self,
        m: ClientMsg,
        is_answer: impl Fn(&ServerMsg) -> bool,
    ) -> Result<ServerMsg, ClientError> {
        self.send(m.clone()).await?;
        let deadline = tokio::time::Instant::now() + ANSWER_WAIT;
        // A busy node is asked again after a pause that doubles, until the answer's deadline.
        let mut pause = Duration::from_millis(100);
        loop {
            let link = self.link.as_mut().ok_or(ClientError::NotConnected)?;
            let node = || link.0.node.to_string();
            let got = tokio::time::timeout_at(deadline, link.0.rx.recv())
                .await
                .map_err(|_| ClientError::NoAnswer { node: node(), wait: ANSWER_WAIT })?
                .ok_or_else(|| ClientError::Closed { node: node() })?;
            if is_answer(&got) {
                return Ok(got);
            }
            if let ServerMsg::Error { r#ref: None, message } = &got {
                if message == crate::proto::BUSY && tokio::time::Instant::now() + pause < deadline {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    self.send(m.clone()).await?;
                    continue;
                }
                return Err(ClientError::Node { node: link.0.node.to_string(), message: message.clone() });
            }
            self.view.apply(&got);
            self.pending.push_back(got);
        }
    }

    /// The next message from the node, applied to the view. When the node dies the client
    /// moves to another node of the sim (the avatar stays in the sim) and goes on; `None` when
    /// no node of the sim answers any more.
    pub async fn next(&mut self) -> Option<ServerMsg> {
        if self.moving.is_some() && !self.finish_move().await {
            return None;
        }
        self.refresh_session().await;
        self.maybe_move_nearer().await;
        if let Some(m) = self.pending.pop_front() {
            return self.handle(m).await;
        }
        loop {
            let got = match self.link.as_mut() {
                Some(l) => l.0.rx.recv().await,
                None => None,
            };
            match got {
                Some(m) => {
                    if let ServerMsg::Error { r#ref: None, message } = &m
                        && message.ends_with("disconnected")
                    {
                        self.closed = Some(message.clone());
                    }
                    self.view.apply(&m);
                    return self.handle(m).await;
                }
                None if self.closed.is_some() => {
                    self.link = None;
                    return None;
                }
                None => {
                    if self.reconnect().await.is_err() || self.follow().await.is_err() {
                        return None;
                    }
                    self.failovers += 1;
                }
            }
        }
    }

    /// What a message asks of the client itself: a `Moved` takes it to the avatar's new sim.
    async fn handle(&mut self, m: ServerMsg) -> Option<ServerMsg> {
        if let ServerMsg::Moved { sim, nodes } = &m {
            self.moving = Some((*sim, nodes.clone()));
            if !self.finish_move().await {
                return None;
            }
        }
        Some(m)
    }

    /// Finish (or redo from the start, if a cancelled call left it half done) the move to
    /// another sim; `false` when it failed.
    async fn finish_move(&mut self) -> bool {
        let Some((sim, nodes)) = self.moving.clone() else { return true };
        match self.move_to(sim, nodes).await {
            Ok(()) => true,
            Err(e) => {
                self.moving = None;
                tracing::warn!("following the avatar into sim {sim}: {e:#}");
                false
            }
        }
    }

    /// Messages until `deadline`, or until `until` accepts one (`true`) or the stream ends.
    pub async fn run_until(&mut self, wait: Duration, until: impl Fn(&View, &ServerMsg) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.next()).await {
                Ok(Some(m)) if until(&self.view, &m) => return true,
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return false,
            }
        }
    }

    pub fn view(&self) -> &View {
        &self.view
    }

    /// Keep in the view only the objects this account owns (its avatar, its things), for a
    /// client that shows nothing else: a bot. Every message is still received and decoded;
    /// the view just does not hold (and update) the crowd around it.
    pub fn keep_own_objects_only(&mut self) {
        self.view.own_only = Some(self.account.clone());
        let me = self.account.clone();
        self.view.objects.retain(|_, o| o.owner == me);
        let objects = &self.view.objects;
        self.view.motion.retain(|id, _| objects.contains_key(id));
    }

    /// An empty view, keeping what it is asked to keep.
    fn reset_view(&mut self) {
        self.view = View { own_only: self.view.own_only.take(), ..View::default() };
    }

    /// This client's account id (hex of its public key).
    pub fn account(&self) -> &str {
        &self.account
    }

    pub fn key(&self) -> &SigningKey {
        &self.key
    }

    pub fn sim(&self) -> u32 {
        self.sim
    }

    /// The node in use.
    pub fn node(&self) -> Option<&NodeAddr> {
        self.link.as_ref().map(|l| &l.0.node)
    }

    /// Measure the sim's nodes this often (default [`crate::nearest::PROBE_EVERY`]).
    pub fn set_probe_every(&mut self, every: Duration) {
        self.probe_every = every;
    }

    /// The last round trips measured to [`Client::nodes`] (same order; `None`: no answer).
    pub fn round_trips(&self) -> &[Option<Duration>] {
        &self.rtts
    }

    /// The nodes of the sim this client may use.
    pub fn nodes(&self) -> &[NodeAddr] {
        &self.nodes
    }

    /// Bytes received over QUIC on the connection in use.
    pub fn bytes_received(&self) -> u64 {
        self.link.as_ref().map_or(0, |l| l.0.conn.stats().udp_rx.bytes)
    }

    /// The account as the sim has it.
    pub async fn account_view(&mut self) -> Result<Option<AccountView>, ClientError> {
        let id = self.account.clone();
        match self
            .request(
                ClientMsg::Account { id: id.clone() },
                |m| matches!(m, ServerMsg::Account { id: a, .. } if *a == id),
            )
            .await?
        {
            ServerMsg::Account { account, .. } => Ok(account),
            _ => unreachable!("matched above"),
        }
    }

    /// One object with its script's source, licence, author and provenance.
    pub async fn object(&mut self, id: &str) -> Result<Option<ObjectView>, ClientError> {
        match self.request(ClientMsg::Object { id: id.to_string() }, |m| matches!(m, ServerMsg::Object { .. })).await? {
            ServerMsg::Object { object } => Ok(object.map(|o| *o)),
            _ => unreachable!("matched above"),
        }
    }

    /// Sign and submit; the event id. The nonce is one above the last the sim accepted from
    /// this account (asked once, then counted here).
    pub async fn submit(&mut self, payload: Payload) -> Result<String, ActError> {
        let event = self.sign(payload).await?;
        self.submit_signed(&event).await
    }

    /// Sign with this account's next nonce (without submitting).
    pub async fn sign(&mut self, payload: Payload) -> Result<SignedEvent, ActError> {
        if self.nonce == 0 {
            let last = self
                .account_view()
                .await
                .map_err(|e| ActError::Connection(format!("{e:#}")))?
                .map_or(0, |a| a.last_nonce);
            self.nonce = last;
        }
        self.nonce += 1;
        Ok(SignedEvent::new(&self.key, SimId(self.sim), self.nonce, payload))
    }

    /// Submit an event as it is (signed by anyone, with any nonce): for tools and tests.
    pub async fn submit_signed(&mut self, event: &SignedEvent) -> Result<String, ActError> {
        self.next_ref += 1;
        let r = self.next_ref;
        let m = ClientMsg::Submit { r#ref: r, event: hex(&metatopia_sim::codec::encode(event)) };
        let answer = self
            .request(m, |m| matches!(m, ServerMsg::Submitted { r#ref, .. } | ServerMsg::Error { r#ref: Some(r#ref), .. } if *r#ref == r))
            .await
            .map_err(|e| ActError::Connection(format!("{e:#}")))?;
        match answer {
            ServerMsg::Submitted { id, .. } => Ok(id),
            ServerMsg::Error { message, .. } => Err(ActError::NotSubmitted(message)),
            _ => unreachable!("matched above"),
        }
    }

    /// Wait for an event's outcome (messages meanwhile are applied and kept for `next`).
    pub async fn outcome(&mut self, id: &str, wait: Duration) -> Result<Tick, ActError> {
        if let Some(i) = self.pending.iter().position(|m| matches!(m, ServerMsg::Outcome { id: x, .. } if x == id)) {
            let m = self.pending.remove(i).expect("found above");
            return outcome_of(m);
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let link = self.link.as_mut().ok_or_else(|| ActError::Connection("not connected".into()))?;
            let m = match tokio::time::timeout_at(deadline, link.0.rx.recv()).await {
                Err(_) => return Err(ActError::Timeout(wait)),
                Ok(None) => return Err(ActError::Connection(format!("{} closed the connection", link.0.node))),
                Ok(Some(m)) => m,
            };
            if matches!(&m, ServerMsg::Outcome { id: x, .. } if x == id) {
                return outcome_of(m);
            }
            self.view.apply(&m);
            self.pending.push_back(m);
        }
    }

    /// Submit and wait until it executed: the tick it took effect at.
    pub async fn act(&mut self, payload: Payload) -> Result<Tick, ActError> {
        let id = self.submit(payload).await?;
        self.outcome(&id, Duration::from_secs(15)).await
    }

    /// Log in (creating the account the first time); the avatar appears at the sim's arrival point.
    pub async fn login(&mut self, name: &str) -> Result<Tick, ActError> {
        self.name = Some(name.to_string());
        let tick = self.act(Payload::Login { name: name.to_string() }).await?;
        self.refreshed = Some(tokio::time::Instant::now());
        // The view follows the avatar from now on.
        self.follow().await.map_err(|e| ActError::Connection(format!("{e:#}")))?;
        Ok(tick)
    }

    /// Keep the session: once logged in, log in again every
    /// [`metatopia_sim::governance::SESSION_REFRESH_MS`] (it only refreshes the account's last
    /// login while the avatar is in the world). Called by [`Client::next`]; the outcome is not
    /// awaited.
    pub async fn refresh_session(&mut self) {
        let every = Duration::from_millis(metatopia_sim::governance::SESSION_REFRESH_MS);
        let (Some(name), Some(last)) = (self.name.clone(), self.refreshed) else { return };
        if last.elapsed() < every || self.closed.is_some() {
            return;
        }
        self.refreshed = Some(tokio::time::Instant::now());
        if let Err(e) = self.submit(Payload::Login { name }).await {
            tracing::debug!("refreshing the session: {e}");
        }
    }

    /// Log out: the avatar leaves the world now (rather than after the grace period).
    pub async fn logout(&mut self) -> Result<Tick, ActError> {
        self.refreshed = None;
        self.act(Payload::Logout).await
    }

    /// The avatar's object id: as the area's deltas brought it (the avatar stands at the area's
    /// centre), else asked from the sim. (Asked every time, a crowd's logins waited for the
    /// answer behind the deltas already on their way, and a walk cost a round trip.)
    pub async fn avatar(&mut self) -> Result<Option<ObjectId>, ClientError> {
        if let Some(id) = self.view.avatar_of(&self.account).and_then(|a| parse_object(&a.id)) {
            return Ok(Some(id));
        }
        Ok(self.account_view().await?.and_then(|a| a.avatar).and_then(|s| parse_object(&s)))
    }

    /// Walk: set the avatar's velocity, metres per second.
    pub async fn walk(&mut self, vx: i64, vy: i64) -> Result<Tick, ActError> {
        let object = self
            .avatar()
            .await
            .map_err(|e| ActError::Connection(format!("{e:#}")))?
            .ok_or_else(|| ActError::NotSubmitted("no avatar: log in first".into()))?;
        self.act(Payload::Move { object, velocity: Vec2::new(Fx::from_int(vx), Fx::from_int(vy)) }).await
    }

    /// Say on a channel (20 m); `whisper` 10 m and `shout` 100 m with [`Client::chat`].
    pub async fn say(&mut self, channel: i32, text: &str) -> Result<Tick, ActError> {
        self.chat(channel, ChatRange::Say, text).await
    }

    pub async fn chat(&mut self, channel: i32, range: ChatRange, text: &str) -> Result<Tick, ActError> {
        self.act(Payload::Chat { channel, range, text: text.to_string() }).await
    }

    pub async fn touch(&mut self, object: &str) -> Result<Tick, ActError> {
        let object =
            parse_object(object).ok_or_else(|| ActError::NotSubmitted(format!("{object:?} is not an object id")))?;
        self.act(Payload::Touch { object }).await
    }

    /// Why the node closed the session on purpose (kicked, banned, misbehaving), if it did.
    pub fn closed(&self) -> Option<&str> {
        self.closed.as_deref()
    }

    /// The name this client logged in with.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

fn outcome_of(m: ServerMsg) -> Result<Tick, ActError> {
    match m {
        ServerMsg::Outcome { outcome: Outcome::Executed { tick }, .. } => Ok(tick),
        ServerMsg::Outcome { outcome: Outcome::Refused { tick, reason }, .. } => {
            Err(ActError::Refused { tick, reason })
        }
        _ => Err(ActError::Connection("not an outcome".into())),
    }
}

/// `SLOTvGEN`.
pub fn parse_object(s: &str) -> Option<ObjectId> {
    let (a, b) = s.split_once('v')?;
    Some(ObjectId::new(a.parse().ok()?, b.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thing(id: &str, owner: &str, x: &str) -> ObjectView {
        ObjectView {
            id: id.into(),
            name: "thing".into(),
            owner: owner.into(),
            avatar: false,
            position: [x.into(), "1".into()],
            velocity: ["0".into(), "0".into()],
            shape: "circle 0.5".into(),
            color: "ffffffff".into(),
            text: String::new(),
            script: None,
            scripted: false,
            body: "dynamic".into(),
            surface: String::new(),
        }
    }

    /// A view kept to its own objects holds and follows this account's objects only, from the
    /// same messages a full view applies.
    #[test]
    fn a_view_kept_to_its_own_objects_follows_them_and_nothing_else() {
        let (me, them) = ("aa".repeat(32), "bb".repeat(32));
        let enter = vec![thing("1v0", &me, "2"), thing("2v0", &them, "3")];
        let update = |id: &str| ObjectUpdate { id: id.into(), at_mm: Some([5_000, 1_000]), ..ObjectUpdate::default() };
        let msgs = [
            ServerMsg::Tick { tick: Tick(1), enter, update: vec![], leave: vec![] },
            ServerMsg::Tick { tick: Tick(2), enter: vec![], update: vec![update("1v0"), update("2v0")], leave: vec![] },
        ];
        let (mut full, mut own) = (View::default(), View { own_only: Some(me.clone()), ..View::default() });
        for m in &msgs {
            full.apply(m);
            own.apply(m);
        }
        assert_eq!(full.objects.len(), 2);
        assert_eq!(own.objects.keys().collect::<Vec<_>>(), ["1v0"]);
        assert_eq!(own.position_mm("1v0"), Some([5_000, 1_000]));
        assert_eq!(own.position_mm("1v0"), full.position_mm("1v0"));
        assert_eq!((own.tick, own.deltas), (full.tick, full.deltas));
        assert_eq!(own.avatar_of(&them), None);
    }
}
