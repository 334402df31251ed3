//! The client service: one session logic behind two transports that speak the same messages
//! ([`metatopia_client::proto`]):
//! - QUIC ([`serve_quic`]): the native client, terminal client and bots; length-prefixed
//!   postcard frames on one bidirectional stream; the node's certificate is made from its ed25519
//!   key, which clients pin;
//! - WebSocket (`GET /v1/ws`, [`upgrade`]): the web viewer; the same messages as JSON text frames.
//!
//! A session sees its **area of interest**: with `interest { follow: ACCOUNT }` the objects within
//! the radius (default: the sim's `aoi_radius_m` setting) of that account's avatar, from a grid
//! index ([`AoiIndex`]) the node's loop keeps after every tick; chat only within the line's range
//! of the avatar (whisper 10 m, say 20 m, shout 100 m) and private lines to that account. Without
//! an interest, a session sees the whole sim (the web viewer's overview).
//!
//! Limits: a client may submit at most [`SUBMITS_PER_SECOND`] events a second, frames are bounded,
//! and a frame that is not a message is answered with an error and the connection is cut; the
//! loop that runs the sim is never waited on by a session. A session makes each delta from the
//! index as it is (see [`crate::api::hub`]): one too slow for every tick skips ticks and its
//! next delta brings its client up to date; a delta that took long to go out (a client that
//! reads slowly, a congested link, a busy node) holds the next one back as long, and the
//! client's questions are answered before any further delta; a session more than
//! [`crate::api::hub::FEED`] chat lines behind loses the oldest.

use metatopia_sim::Tick;
use std::collections::BTreeSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use metatopia_client::proto::{
    self, ChatView, ClientMsg, MAX_CLIENT_FRAME, ObjectUpdate, ServerMsg, read_frame, write_frame,
};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, oneshot};

use crate::api::http::{Query, Service, parse_hash};
pub use crate::api::hub::{
    AoiIndex, Feed, Hub, MAX_AREA_OBJECTS, MAX_MOVED, REPLAY_LINES, REPLAY_TICKS, SUBMITS_PER_SECOND, key_of,
};
use crate::core::MAX_EVENT_BYTES;

/// A session's transport: it yields client messages (or the reason a frame was not one) and
/// carries server messages.
pub trait Transport: Send {
    /// `None`: the client went away.
    fn recv(&mut self) -> impl Future<Output = Option<Result<ClientMsg, String>>> + Send;
    /// `false`: the client went away.
    fn send(&mut self, m: &ServerMsg) -> impl Future<Output = bool> + Send;
}

/// The web viewer's transport: JSON text frames.
struct Ws(WebSocket);

impl Transport for Ws {
    async fn recv(&mut self) -> Option<Result<ClientMsg, String>> {
        loop {
            return match self.0.recv().await {
                Some(Ok(Message::Text(t))) => {
                    Some(serde_json::from_str(t.as_str()).map_err(|e| format!("not a client message: {e}")))
                }
                Some(Ok(Message::Binary(_))) => Some(Err("binary frames are not spoken here".into())),
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => None,
                Some(Ok(_)) => continue,
            };
        }
    }

    async fn send(&mut self, m: &ServerMsg) -> bool {
        match serde_json::to_string(m) {
            Ok(text) => self.0.send(Message::Text(text.into())).await.is_ok(),
            Err(_) => true,
        }
    }
}

/// The native client's transport: postcard frames on a QUIC stream. Frames are read on a task
/// of their own ([`frames`]): a frame read in pieces is never cut short by the session turning
/// to something else between two of them.
struct Quic {
    send: quinn::SendStream,
    frames: mpsc::Receiver<Result<ClientMsg, String>>,
}

impl Transport for Quic {
    async fn recv(&mut self) -> Option<Result<ClientMsg, String>> {
        self.frames.recv().await
    }

    async fn send(&mut self, m: &ServerMsg) -> bool {
        write_frame(&mut self.send, m).await.is_ok()
    }
}

/// Client frames read whole from `r`, in order, on a task of their own (reading a frame takes
/// several reads once it spans packets; a session waiting on several things at once would drop
/// a read half done, and the stream would lose its framing). Ends after the first frame that is
/// not a message, or when the stream ends; a few frames wait at most (the client waits for the
/// session beyond that).
fn frames<R: tokio::io::AsyncRead + Unpin + Send + 'static>(mut r: R) -> mpsc::Receiver<Result<ClientMsg, String>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            let frame = match read_frame(&mut r, MAX_CLIENT_FRAME).await {
                Ok(m) => Ok(m),
                Err(proto::FrameError::Closed | proto::FrameError::Io(_)) => return,
                Err(e) => Err(e.to_string()),
            };
            let last = frame.is_err();
            if tx.send(frame).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

/// The WebSocket upgrade handler.
pub async fn upgrade(ws: WebSocketUpgrade, State(s): State<Service>) -> Response {
    ws.max_message_size(2 * MAX_EVENT_BYTES as usize + 1024)
        .on_upgrade(move |socket| session(Ws(socket), s, View::default()))
}

/// Why the QUIC gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("the node key as the gateway's TLS identity: {0}")]
    Identity(#[from] metatopia_client::error::ClientError),
    #[error("listening for QUIC clients: {0}")]
    Listen(#[from] std::io::Error),
}

/// Serve QUIC clients on `addr` (UDP) until the returned endpoint is closed, on the runtime `rt`
/// (the endpoint's driver and every session: the node's client runtime).
pub fn serve_quic(
    rt: &tokio::runtime::Handle,
    addr: SocketAddr,
    key: &metatopia_sim::SigningKey,
    service: Service,
) -> Result<(quinn::Endpoint, tokio::task::JoinHandle<()>), GatewayError> {
    let endpoint = {
        let _in = rt.enter();
        metatopia_client::quic::endpoint(addr, Some(metatopia_client::quic::server_config(key)?))?
    };
    let ep = endpoint.clone();
    let task = rt.spawn(async move {
        while let Some(incoming) = ep.accept().await {
            let s = service.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let Ok(Ok((send, recv))) = tokio::time::timeout(Duration::from_secs(10), conn.accept_bi()).await else {
                    return;
                };
                // A native client says what it wants to see (`interest`) before it sees anything.
                session(Quic { send, frames: frames(recv) }, s, View::nothing()).await;
                // Let the last frames (an error before a cut-off) reach the client.
                tokio::time::sleep(Duration::from_millis(100)).await;
                conn.close(0u32.into(), b"bye");
            });
        }
    });
    Ok((endpoint, task))
}

/// How long a session waits for the loop: for room in its queue, then for the answer.
const ASK_WAIT: Duration = Duration::from_secs(5);

/// Ask the loop; `None` when it is too busy to answer within [`ASK_WAIT`] (or stopping). A
/// session waits for room in the loop's queue rather than giving up at once: a crowd logging in
/// fills the queue for moments, and each session has one question in flight at most, so the
/// waiting is bounded by the sessions.
async fn ask<T>(s: &Service, make: impl FnOnce(oneshot::Sender<T>) -> Query) -> Option<T> {
    let deadline = tokio::time::Instant::now() + ASK_WAIT;
    let (tx, rx) = oneshot::channel();
    s.queries.send_timeout(make(tx), ASK_WAIT).await.ok()?;
    tokio::time::timeout_at(deadline, rx).await.ok()?.ok()
}

/// The answer to a question the loop could not answer in time: an error saying so, which the
/// client asks again on ([`proto::BUSY`]), never an answer that reads as "there is none".
fn busy() -> ServerMsg {
    ServerMsg::Error { r#ref: None, message: proto::BUSY.into() }
}

/// The answer to `route` / `enter`: this sim if the avatar is here; else the sim it crossed into
/// from here; else whichever other sim says it holds it; else (`enter`) the sim whose square
/// holds `at`, found through Raynet; else this sim (log in here).
async fn route(s: &Service, hub: &Hub, account: String, at: Option<[i64; 2]>) -> ServerMsg {
    let account = account.to_ascii_lowercase();
    let moved = hub.moved.read().unwrap_or_else(|e| e.into_inner()).get(&account).copied();
    let mut here = false;
    let elsewhere = match parse_hash(&account).map(metatopia_sim::AccountId) {
        None => None,
        Some(id) => {
            let view = ask(s, |tx| Query::Account(id, tx)).await.flatten();
            here = view.is_some_and(|a| a.avatar.is_some());
            if here {
                None
            } else if moved.is_some() {
                moved
            } else {
                ask(s, |tx| Query::Locate(id, tx)).await.flatten()
            }
        }
    };
    let own = ServerMsg::Route { sim: hub.sim, nodes: hub.nodes.clone() };
    match elsewhere.and_then(|sim| hub.sim_nodes(sim).map(|n| (sim, n))) {
        Some((sim, nodes)) => ServerMsg::Route { sim, nodes },
        None => match at.filter(|_| !here) {
            // No avatar anywhere: the sim whose square holds the point (when
            // the lookup fails, this one).
            Some(point) => match ask(s, |tx| Query::Nearest(point, tx)).await.flatten() {
                Some((sim, node)) if sim != hub.sim => {
                    ServerMsg::Route { sim, nodes: hub.sim_nodes(sim).unwrap_or_else(|| vec![node]) }
                }
                _ => own,
            },
            None => own,
        },
    }
}

/// What a client was last told of an object's motion (its dead-reckoning base).
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: [i64; 2],
    vel: [i64; 2],
    tick: Tick,
}

/// One client's view: what it follows and which objects it has been sent.
#[derive(Debug, Default)]
struct View {
    follow: Option<String>,
    /// Accounts whose signed events this session submitted and the node took in (their
    /// signatures verified): the session holds their keys.
    authors: BTreeSet<String>,
    radius_m: Option<u32>,
    /// What the client was sent of each object it knows, in key order.
    known: Vec<(u64, Sent)>,
    /// The tick the area was last computed at (it is recomputed every [`AREA_EVERY`] ticks:
    /// objects enter a little late, at walking speeds a few decimetres, for a fraction of the
    /// cost; what is known keeps being updated meanwhile).
    area: Option<Tick>,
    /// The area's objects as last computed, in key order (kept to reuse its room).
    in_area: Vec<u64>,
    /// Objects of the area not sent yet (more than [`ENTER_PER_DELTA`] were new): the next
    /// deltas send them, nearest first.
    backlog: bool,
    /// Send a delta every this many ticks (from the client's `max_hz`).
    stride: u64,
    /// The index's tick at the last delta (0: none yet): the client has every object it knows
    /// as of then.
    last_tick: Tick,
}

/// Ticks between recomputations of a session's area of interest.
const AREA_EVERY: u64 = 4;

/// The most objects a delta brings into a client's view around its avatar, nearest first; the
/// rest of the area follows in the next deltas. A login in a crowd is sent its avatar and its
/// neighbours in a few kilobytes, and a question asked meanwhile (its account, say) waits
/// behind them, not behind the whole area of [`MAX_AREA_OBJECTS`] (tens of kilobytes, which a
/// loaded link takes seconds to carry).
const ENTER_PER_DELTA: usize = 64;

/// How long a new session waits for the area index nobody kept (a tick, or a second while the
/// sim is paused; an empty world has no index and waits this long once).
const INDEX_REFILL_WAIT: Duration = Duration::from_secs(2);

impl View {
    /// A view of nothing until the client states an interest.
    fn nothing() -> View {
        View { follow: Some(String::new()), ..View::default() }
    }

    /// The ids in the area, into `in_area` in key order (no interest: the whole sim).
    fn compute_area(&mut self, index: &AoiIndex) {
        match &self.follow {
            None => index.all(&mut self.in_area),
            Some(account) => match index.avatar_at(account) {
                Some(at) => {
                    let r = self.radius_m.unwrap_or(index.radius_m).clamp(1, 4096);
                    index.nearest(at, r, MAX_AREA_OBJECTS, &mut self.in_area);
                }
                None => self.in_area.clear(),
            },
        }
    }

    /// The delta that brings the client from what it knows to the area now: what entered and
    /// left its area, and for each object it knows, its motion when the client's dead reckoning
    /// would be off by more than [`proto::DEAD_RECKONING_MM`] (or its velocity changed as
    /// much), and its other fields when they changed since the last delta. It reads the index
    /// only: its cost is the client's area, whatever the rest of the world did.
    fn delta(&mut self, index: &AoiIndex) -> ServerMsg {
        let tick = index.tick;
        let fresh = match self.area {
            Some(at) => tick < at || tick.since(at) >= AREA_EVERY,
            None => true,
        };
        let mut enter = Vec::new();
        let mut entered = Vec::new();
        if fresh {
            self.compute_area(index);
            self.area = Some(tick);
        }
        if fresh || self.backlog {
            // What the client does not know yet; around an avatar at most ENTER_PER_DELTA of
            // them, nearest first (a view of the whole sim takes it all at once, as asked).
            let centre = self.follow.as_deref().and_then(|a| index.avatar_at(a)).map(|m| m.map(|v| v * 1000));
            let mut new: Vec<(i128, u64)> = Vec::new();
            for k in &self.in_area {
                if self.known.binary_search_by_key(k, |(k, _)| *k).is_err()
                    && let Some(e) = index.entry(*k)
                {
                    let d = centre.map_or(0, |c| {
                        let (dx, dy) = (i128::from(e.motion.0[0] - c[0]), i128::from(e.motion.0[1] - c[1]));
                        dx * dx + dy * dy
                    });
                    new.push((d, *k));
                }
            }
            self.backlog = centre.is_some() && new.len() > ENTER_PER_DELTA;
            if self.backlog {
                new.select_nth_unstable(ENTER_PER_DELTA - 1);
                new.truncate(ENTER_PER_DELTA);
                new.sort_unstable_by_key(|(_, k)| *k);
            }
            for (_, k) in new {
                if let Some(e) = index.entry(k) {
                    entered.push((k, Sent { at: e.motion.0, vel: e.motion.1, tick }));
                    enter.push(e.view_now());
                }
            }
        }
        // One pass over what the client knows, beside the area (both in key order), one index
        // lookup each (a slot): what left (the area, when it was recomputed, or the world) and
        // what changed.
        let (since, in_area) = (self.last_tick, fresh.then_some(&self.in_area));
        let (mut update, mut leave) = (Vec::new(), Vec::new());
        let mut next_in_area = 0;
        self.known.retain_mut(|(k, sent)| {
            let k = *k;
            let inside = in_area.is_none_or(|a| {
                while a.get(next_in_area).is_some_and(|n| *n < k) {
                    next_in_area += 1;
                }
                a.get(next_in_area) == Some(&k)
            });
            let e = match index.entry(k) {
                Some(e) if inside => e,
                _ => {
                    leave.push(format!("{}v{}", k >> 32, k & 0xffff_ffff));
                    return false;
                }
            };
            let (v, (at, vel), meta) = (&e.view, e.motion, &e.meta);
            let guess = ObjectUpdate::extrapolate(sent.at, sent.vel, tick.since(sent.tick), index.rate_hz);
            let off = |a: [i64; 2], b: [i64; 2]| (a[0] - b[0]).abs().max((a[1] - b[1]).abs());
            let stopped = vel == [0, 0] && sent.vel != [0, 0];
            let motion =
                off(guess, at) > proto::DEAD_RECKONING_MM || off(vel, sent.vel) > proto::DEAD_RECKONING_MM || stopped;
            // Most objects of a crowd move as the client's dead reckoning says: they cost this
            // comparison, not a copy.
            let fields = meta.tick > since;
            if !motion && !fields {
                return true;
            }
            let mut u = match (&meta.diff, fields) {
                (Some(d), true) if meta.prev <= since => ObjectUpdate { id: v.id.clone(), ..(**d).clone() },
                (_, true) => ObjectUpdate::fields_of(v),
                (_, false) => ObjectUpdate { id: v.id.clone(), ..ObjectUpdate::default() },
            };
            if motion {
                (u.at_mm, u.vel_mm) = (Some(at), Some(vel));
                *sent = Sent { at, vel, tick };
            }
            update.push(u);
            true
        });
        if !entered.is_empty() {
            self.known.extend(entered);
            self.known.sort_unstable_by_key(|(k, _)| *k);
        }
        self.last_tick = tick;
        ServerMsg::Tick { tick, enter, update, leave }
    }

    /// Whether this client hears a line. A line for one account (its scripts' errors) goes only
    /// to a session that proved it holds that account's key (an event of its taken in).
    fn hears(&self, line: &ChatView, index: &AoiIndex) -> bool {
        match (&self.follow, &line.to) {
            (_, Some(to)) => self.authors.contains(to),
            (None, None) => true,
            (Some(account), None) => index.avatar_at(account).is_some_and(|at| line.heard_at(at)),
        }
    }
}

/// Everything a new (or lagging) client needs: status, its whole area, recent chat it hears.
async fn full_state<T: Transport>(t: &mut T, s: &Service, hub: &Hub, view: &mut View) -> bool {
    let interested = view.follow.as_deref() != Some("");
    if interested && hub.index.read().unwrap_or_else(|e| e.into_inner()).is_empty() {
        // Nobody listened here until now, so nobody kept the area index: the loop refills it at
        // the next tick (or within a second while the sim is paused). Without it this session
        // would see no area and hear none of the recent chat it is owed (after a failover). A
        // session that has stated no interest yet (a probe's ping, say) has nothing to wait for.
        let mut ticks = hub.ticks.subscribe();
        let _ = tokio::time::timeout(INDEX_REFILL_WAIT, ticks.changed()).await;
    }
    let status = s.status.borrow().clone();
    let tick = status.tick;
    if !t.send(&ServerMsg::Status(Box::new(status))).await {
        return false;
    }
    let m = {
        let index = hub.index.read().unwrap_or_else(|e| e.into_inner());
        view.known.clear();
        view.area = None;
        view.last_tick = Tick::ZERO;
        let mut m = view.delta(&index);
        if let ServerMsg::Tick { tick: t, .. } = &mut m {
            // An index nobody kept (no session listened) is refilled at the next tick.
            *t = (*t).max(tick);
        }
        m
    };
    if !t.send(&m).await {
        return false;
    }
    // The recent lines its avatar hears, from the hub (the loop is not asked: a crowd's logins
    // would each have it copy every line it keeps).
    let lines = {
        let index = hub.index.read().unwrap_or_else(|e| e.into_inner());
        hub.replay(tick.saturating_sub(REPLAY_TICKS), REPLAY_LINES, |l| view.hears(l, &index))
    };
    for line in lines {
        if !t.send(&ServerMsg::Chat((*line).clone())).await {
            return false;
        }
    }
    true
}

/// Counts a session while it lives.
struct Counted<'a>(&'a AtomicU32);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One client's session, whatever its transport.
async fn session<T: Transport>(mut t: T, s: Service, mut view: View) {
    let Some(hub) = s.hub.clone() else { return };
    hub.clients.fetch_add(1, Ordering::Relaxed);
    let _counted = Counted(&hub.clients);
    let mut feed = hub.feed.subscribe();
    let mut ticks = hub.ticks.subscribe();
    if !full_state(&mut t, &s, &hub, &mut view).await {
        return;
    }
    let (outcomes_tx, mut outcomes) = mpsc::channel::<ServerMsg>(256);
    let (mut window, mut submits) = (Instant::now(), 0u32);
    let mut deltas_after = tokio::time::Instant::now();
    loop {
        // The client's questions first, then what is owed it (outcomes, chat), then the next
        // delta: a question waits for the delta being sent at most, never for a run of them
        // (a crowd's sessions, each slow to send, answered logins after 10 s and more).
        tokio::select! {
            biased;
            m = t.recv() => {
                let msg = match m {
                    None => return,
                    Some(Err(why)) => {
                        // Garbage: say why, then cut the client off.
                        let _ = t.send(&ServerMsg::Error { r#ref: None, message: format!("{why}: disconnected") }).await;
                        return;
                    }
                    Some(Ok(msg)) => msg,
                };
                let reply = match msg {
                    ClientMsg::Route { account } => Some(route(&s, &hub, account, None).await),
                    ClientMsg::Enter { account, at } => Some(route(&s, &hub, account, Some(at)).await),
                    ClientMsg::Ping { r#ref } => Some(ServerMsg::Pong { r#ref }),
                    ClientMsg::Governance {} => {
                        Some(ask(&s, Query::Governance).await.map_or_else(busy, |g| ServerMsg::Governance(Box::new(g))))
                    }
                    ClientMsg::Interest { follow, radius_m, max_hz } => {
                        if let Some(f) = follow.as_deref().filter(|f| parse_hash(f).is_none()) {
                            Some(ServerMsg::Error { r#ref: None, message: format!("{f:?} is not an account id") })
                        } else {
                            view.follow = follow.map(|f| f.to_ascii_lowercase());
                            view.radius_m = radius_m;
                            let rate = u64::from(s.status.borrow().tick_rate_hz.max(1));
                            view.stride = max_hz.map_or(1, |hz| rate.div_ceil(u64::from(hz.max(1)))).max(1);
                            if !full_state(&mut t, &s, &hub, &mut view).await {
                                return;
                            }
                            None
                        }
                    }
                    ClientMsg::Object { id } => {
                        Some(match metatopia_client::conn::parse_object(&id) {
                            Some(oid) => match ask(&s, |tx| Query::Object(oid, tx)).await {
                                Some(object) => ServerMsg::Object { object: object.map(Box::new) },
                                None => busy(),
                            },
                            None => ServerMsg::Error { r#ref: None, message: format!("{id:?} is not an object id") },
                        })
                    }
                    ClientMsg::Account { id } => Some(match parse_hash(&id) {
                        Some(a) => match ask(&s, |tx| Query::Account(metatopia_sim::AccountId(a), tx)).await {
                            Some(account) => ServerMsg::Account { id, account },
                            None => busy(),
                        },
                        None => ServerMsg::Error { r#ref: None, message: format!("{id:?} is not an account id") },
                    }),
                    ClientMsg::Submit { r#ref, event } => {
                        if window.elapsed() >= Duration::from_secs(1) {
                            (window, submits) = (Instant::now(), 0);
                        }
                        submits += 1;
                        if submits > SUBMITS_PER_SECOND {
                            let m = format!("more than {SUBMITS_PER_SECOND} events a second: disconnected");
                            let _ = t.send(&ServerMsg::Error { r#ref: Some(r#ref), message: m }).await;
                            return;
                        }
                        let author = proto::unhex(&event)
                            .and_then(|b| metatopia_sim::event::SignedEvent::decode(&b, MAX_EVENT_BYTES).ok())
                            .map(|e| e.body.author.to_string());
                        let reply = submit(&s, r#ref, &event, &outcomes_tx).await;
                        // Taken in: its signature verified, so this session holds the author's
                        // key and may hear the lines meant for that account alone (its scripts'
                        // errors). A session acts for a few accounts at most; the set stays small.
                        if let (ServerMsg::Submitted { .. }, Some(author)) = (&reply, author)
                            && view.authors.len() < 64
                        {
                            view.authors.insert(author);
                        }
                        Some(reply)
                    }
                };
                if let Some(reply) = reply
                    && !t.send(&reply).await
                {
                    return;
                }
            }
            f = feed.recv() => {
                let m = match f {
                    Ok(Feed::Chat(c)) => {
                        let heard = view.hears(&c, &hub.index.read().unwrap_or_else(|e| e.into_inner()));
                        if !heard {
                            continue;
                        }
                        ServerMsg::Chat((*c).clone())
                    }
                    Ok(Feed::Status(st)) => ServerMsg::Status(st),
                    Ok(Feed::Moved { account, sim }) => {
                        if view.follow.as_ref() != Some(&account) {
                            continue;
                        }
                        ServerMsg::Moved { sim, nodes: hub.sim_nodes(sim).unwrap_or_default() }
                    }
                    Ok(Feed::Removed { account, why }) => {
                        if view.follow.as_ref() == Some(&account) || view.authors.contains(&account) {
                            let message = format!("{why} by the sim's admin: disconnected");
                            let _ = t.send(&ServerMsg::Error { r#ref: None, message }).await;
                            return;
                        }
                        continue;
                    }
                    Err(RecvError::Lagged(n)) => {
                        // More than `FEED` lines behind (a client that does not read): the
                        // oldest are lost; its deltas are not (they come from the index).
                        tracing::debug!(missed = n, "a session fell behind the chat feed");
                        continue;
                    }
                    Err(RecvError::Closed) => return,
                };
                if !t.send(&m).await {
                    return;
                }
            }
            Some(m) = outcomes.recv() => {
                if !t.send(&m).await {
                    return;
                }
            }
            r = ticks.changed() => {
                if r.is_err() {
                    return;
                }
                let tick = *ticks.borrow_and_update();
                if tick < view.last_tick + view.stride.max(1) || tokio::time::Instant::now() < deltas_after {
                    continue;
                }
                let m = {
                    let index = hub.index.read().unwrap_or_else(|e| e.into_inner());
                    if index.tick <= view.last_tick {
                        continue;
                    }
                    view.delta(&index)
                };
                let sending = tokio::time::Instant::now();
                if !t.send(&m).await {
                    return;
                }
                // The next delta waits as long as this one took to go out: a client (or a
                // link, or a node) slower than the deltas gets fewer, larger ones, and the
                // session spends at most half its time on them.
                deltas_after = tokio::time::Instant::now() + sending.elapsed();
            }
        }
    }
}

/// Decode, hand to the loop, and watch for the outcome (reported on `outcomes`).
async fn submit(s: &Service, r#ref: u64, event: &str, outcomes: &mpsc::Sender<ServerMsg>) -> ServerMsg {
    let bytes = match proto::unhex(event) {
        Some(b) if b.len() <= MAX_EVENT_BYTES as usize => b,
        _ => return ServerMsg::Error { r#ref: Some(r#ref), message: "event: hex of at most 96 KiB expected".into() },
    };
    match ask(s, |tx| Query::Submit(bytes, tx)).await {
        None => ServerMsg::Error { r#ref: Some(r#ref), message: proto::BUSY.into() },
        Some(Err(reason)) => ServerMsg::Error { r#ref: Some(r#ref), message: reason },
        Some(Ok(id)) => {
            let tx = outcomes.clone();
            let done = match s.hub.as_ref() {
                Some(hub) => hub.wait_for(id),
                None => return ServerMsg::Submitted { r#ref, id: id.to_string() },
            };
            tokio::spawn(async move {
                // Executed within 15 s or not reported (the client may still ask `GET /v1/events/ID`).
                if let Ok(Ok(outcome)) = tokio::time::timeout(Duration::from_secs(15), done).await {
                    let _ = tx.send(ServerMsg::Outcome { id: id.to_string(), outcome }).await;
                }
            });
            ServerMsg::Submitted { r#ref, id: id.to_string() }
        }
    }
}

#[cfg(test)]
mod tests;
