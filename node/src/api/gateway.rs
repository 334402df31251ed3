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
//! next delta brings its client up to date; a session more than [`crate::api::hub::FEED`] chat
//! lines behind loses the oldest.

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

/// The native client's transport: postcard frames on a QUIC stream.
struct Quic {
    send: quinn::SendStream,
    recv: quinn::RecvStream,
}

impl Transport for Quic {
    async fn recv(&mut self) -> Option<Result<ClientMsg, String>> {
        match read_frame(&mut self.recv, MAX_CLIENT_FRAME).await {
            Ok(m) => Some(Ok(m)),
            Err(proto::FrameError::Closed | proto::FrameError::Io(_)) => None,
            Err(e) => Some(Err(e.to_string())),
        }
    }

    async fn send(&mut self, m: &ServerMsg) -> bool {
        write_frame(&mut self.send, m).await.is_ok()
    }
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
                session(Quic { send, recv }, s, View::nothing()).await;
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
    /// Send a delta every this many ticks (from the client's `max_hz`).
    stride: u64,
    /// The index's tick at the last delta (0: none yet): the client has every object it knows
    /// as of then.
    last_tick: Tick,
}

/// Ticks between recomputations of a session's area of interest.
const AREA_EVERY: u64 = 4;

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
            for k in &self.in_area {
                if self.known.binary_search_by_key(k, |(k, _)| *k).is_err()
                    && let Some(e) = index.entry(*k)
                {
                    entered.push((*k, Sent { at: e.motion.0, vel: e.motion.1, tick }));
                    enter.push(e.view_now());
                }
            }
            self.area = Some(tick);
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
    loop {
        tokio::select! {
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
            r = ticks.changed() => {
                if r.is_err() {
                    return;
                }
                let tick = *ticks.borrow_and_update();
                if tick < view.last_tick + view.stride.max(1) {
                    continue;
                }
                let m = {
                    let index = hub.index.read().unwrap_or_else(|e| e.into_inner());
                    if index.tick <= view.last_tick {
                        continue;
                    }
                    view.delta(&index)
                };
                if !t.send(&m).await {
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
mod tests {
    use super::*;
    use metatopia_client::proto::ObjectView;

    fn obj(id: &str, owner: &str, avatar: bool, x: i64, y: i64) -> ObjectView {
        ObjectView {
            id: id.into(),
            name: id.into(),
            owner: owner.into(),
            avatar,
            position: [x.to_string(), y.to_string()],
            velocity: ["0".into(), "0".into()],
            shape: "circle 0.5".into(),
            color: "ffffffff".into(),
            text: String::new(),
            script: None,
            scripted: false,
            body: "static".into(),
            surface: String::new(),
        }
    }

    /// In a crowd the area is the nearest objects, in key order, ties to the smaller key.
    #[test]
    fn an_area_in_a_crowd_is_its_nearest_objects() {
        let mut index = AoiIndex::default();
        let views = (0..40).map(|i| {
            // Forty objects on a line from x = 100 (every other one at the same distance on the
            // other side of the centre, x = 120).
            let x = if i % 2 == 0 { 120 + i / 2 } else { 120 - (i + 1) / 2 };
            obj(&format!("{i}v0"), "cc", false, x, 50)
        });
        index.update(Tick(1), views);
        let mut out = Vec::new();
        index.nearest([120, 50], 100, 5, &mut out);
        let key = |i: u64| i << 32;
        // Distance 0: object 0; 1: objects 1 and 2; 2: objects 3 and 4.
        assert_eq!(out, [0, 1, 2, 3, 4].map(key));
        index.nearest([120, 50], 100, 4, &mut out);
        assert_eq!(out, [0, 1, 2, 3].map(key), "a tie goes to the smaller key");
        index.nearest([120, 50], 100, 100, &mut out);
        assert_eq!(out.len(), 40, "fewer than the most: all within the radius");
        index.nearest([120, 50], 3, 100, &mut out);
        assert_eq!(out, [0, 1, 2, 3, 4, 5, 6].map(key), "and never one beyond it");
    }

    /// The index keeps its objects by slot: a slot's next object (a new generation) takes the
    /// old one's place whole, its cell and its avatar entry, and a client that knew the old one
    /// is told it left and the new one entered.
    #[test]
    fn a_slot_reused_by_a_new_object_replaces_the_old_one_everywhere() {
        let (a, b) = ("aa".repeat(32), "bb".repeat(32));
        let mut index = AoiIndex { radius_m: 30, ..AoiIndex::default() };
        index.update(Tick(1), [obj("0v0", &b, true, 10, 10), obj("3v0", &a, true, 12, 10)].into_iter());
        let mut view = View { follow: Some(b.clone()), ..View::default() };
        let ServerMsg::Tick { enter, .. } = view.delta(&index) else { panic!() };
        assert_eq!(enter.len(), 2);
        // Slot 3's avatar left and a prim took the slot, far away.
        index
            .update(Tick(1 + AREA_EVERY), [obj("0v0", &b, true, 10, 10), obj("3v1", "x", false, 500, 500)].into_iter());
        assert_eq!((index.len(), index.get(3 << 32), index.avatar_at(&a)), (2, None, None));
        assert_eq!(index.get((3 << 32) | 1).map(|v| v.id), Some("3v1".to_owned()));
        let mut near = Vec::new();
        index.within([12, 10], 5, &mut near);
        assert_eq!(near, [0], "the old avatar's cell entry went with it");
        let ServerMsg::Tick { enter, leave, .. } = view.delta(&index) else { panic!() };
        assert_eq!((enter.len(), leave), (0, vec!["3v0".to_string()]));
        // The world shrank: the slots' room goes back, the keys stay in order.
        index.update(Tick(2 + AREA_EVERY), [obj("0v0", &b, true, 10, 10)].into_iter());
        let mut all = Vec::new();
        index.all(&mut all);
        assert_eq!((all, index.objects.slots.len()), (vec![0], 1));
    }

    #[test]
    fn the_area_of_interest_follows_the_avatar_with_enter_update_leave() {
        let me = "aa".repeat(32);
        let mut index = AoiIndex { radius_m: 30, ..AoiIndex::default() };
        let world = |me_x: i64, door_text: &str| {
            let mut door = obj("1v0", "x", false, 100, 100);
            door.text = door_text.into();
            vec![
                obj("0v0", &me, true, me_x, 100),
                door,
                obj("2v0", "x", false, 200, 100),
                obj("3v0", "x", false, 125, 118),
            ]
        };
        let changed = index.update(Tick(1), world(90, "closed").into_iter());
        assert!(changed.is_empty(), "new objects are not changes");
        let mut view = View { follow: Some(me.clone()), ..View::default() };
        let ServerMsg::Tick { enter, leave, .. } = view.delta(&index) else { panic!() };
        let ids: Vec<&str> = enter.iter().map(|o| o.id.as_str()).collect();
        // 3v0 is 35 x 18 m away (39 m): outside 30 m; 2v0 far away.
        assert_eq!(ids, ["0v0", "1v0"]);
        assert!(leave.is_empty());
        // The door opens: an update; I walk east 20 m: 3v0 enters (15 m), nothing leaves.
        // (Areas are recomputed every AREA_EVERY ticks.)
        let changed = index.update(Tick(1 + AREA_EVERY), world(110, "open").into_iter());
        assert_eq!(changed.iter().map(|(_, u)| u.id.as_str()).collect::<Vec<_>>(), ["0v0", "1v0"]);
        assert_eq!(changed.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [0, 1 << 32]);
        let ServerMsg::Tick { tick, enter, update, leave } = view.delta(&index) else { panic!() };
        assert_eq!(tick, Tick(1 + AREA_EVERY));
        assert_eq!(enter.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["3v0"]);
        assert_eq!(update.len(), 2);
        assert_eq!(
            (update[0].id.as_str(), update[0].at_mm, update[0].text.clone()),
            ("0v0", Some([110_000, 100_000]), None)
        );
        assert_eq!((update[1].id.as_str(), update[1].at_mm, update[1].text.as_deref()), ("1v0", None, Some("open")));
        assert!(leave.is_empty());
        // Far east: everything but 2v0 leaves and 2v0 enters; a removed object leaves too.
        let mut w = world(190, "open");
        w.remove(3);
        index.update(Tick(1 + 2 * AREA_EVERY), w.into_iter());
        let ServerMsg::Tick { enter, leave, .. } = view.delta(&index) else { panic!() };
        assert_eq!(enter.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["2v0"]);
        assert_eq!(leave, ["1v0", "3v0"]);
        assert_eq!(index.len(), 3);
        // Chat: heard within its range of the avatar, private lines only by their account.
        let line = |x: i64, range_m: u32, to: Option<String>| ChatView {
            tick: Tick(3),
            name: "n".into(),
            channel: 0,
            text: "t".into(),
            position: [x, 100],
            range_m,
            to,
        };
        assert!(view.hears(&line(175, 20, None), &index));
        assert!(!view.hears(&line(165, 20, None), &index));
        assert!(view.hears(&line(100, 100, None), &index));
        // A line for `me` reaches this session only once it proved it holds `me`'s key (an
        // event of `me`'s taken in); following `me` is not enough.
        assert!(!view.hears(&line(0, 10, Some(me.clone())), &index));
        view.authors.insert(me.clone());
        assert!(view.hears(&line(0, 10, Some(me.clone())), &index));
        assert!(!view.hears(&line(190, 10, Some("bb".repeat(32))), &index));
        // Without an interest: the whole sim, every public line.
        let mut all = View::default();
        let ServerMsg::Tick { enter, .. } = all.delta(&index) else { panic!() };
        assert_eq!(enter.len(), 3);
        assert!(all.hears(&line(-1000, 10, None), &index));
    }

    /// Deltas come from the index alone: a session that skips ticks (a slow client, or one
    /// asking for fewer deltas) still ends with every object as it is. A session that had the
    /// object's fields before their last change gets that change; one further behind gets the
    /// fields whole.
    #[test]
    fn a_session_that_skips_ticks_gets_what_changed_since_its_last_delta() {
        let me = "aa".repeat(32);
        let mut index = AoiIndex { radius_m: 1000, rate_hz: 20, ..AoiIndex::default() };
        let world = |text: &str, color: &str| {
            let mut door = obj("1v0", "x", false, 5, 5);
            (door.text, door.color) = (text.into(), color.into());
            vec![obj("0v0", &me, true, 0, 0), door].into_iter()
        };
        let new = || View { follow: Some(me.clone()), ..View::default() };
        let (mut quick, mut slow) = (new(), new());
        let (mut qc, mut sc) = (metatopia_client::View::default(), metatopia_client::View::default());
        index.update(Tick(1), world("closed", "ffffffff"));
        qc.apply(&quick.delta(&index));
        sc.apply(&slow.delta(&index));
        index.update(Tick(2), world("open", "ffffffff"));
        qc.apply(&quick.delta(&index));
        index.update(Tick(3), world("open", "00ff00ff"));
        // The quick one had tick 2: the recolouring alone.
        let m = quick.delta(&index);
        let ServerMsg::Tick { update, .. } = &m else { panic!() };
        assert_eq!(update.len(), 1, "{update:?}");
        assert_eq!((update[0].color.as_deref(), update[0].text.as_deref()), (Some("00ff00ff"), None));
        qc.apply(&m);
        // The slow one last had tick 1: both changes, as the fields whole.
        let m = slow.delta(&index);
        let ServerMsg::Tick { update, enter, leave, .. } = &m else { panic!() };
        assert!(enter.is_empty() && leave.is_empty(), "no start over: {m:?}");
        assert_eq!((update[0].color.as_deref(), update[0].text.as_deref()), (Some("00ff00ff"), Some("open")));
        sc.apply(&m);
        for c in [&qc, &sc] {
            assert_eq!(c.objects.get("1v0"), index.get(1 << 32).as_ref(), "the client's door is the index's");
        }
        // Nothing changed since: an empty delta for both.
        index.update(Tick(4), world("open", "00ff00ff"));
        for v in [&mut quick, &mut slow] {
            let ServerMsg::Tick { update, enter, leave, .. } = v.delta(&index) else { panic!() };
            assert!(update.is_empty() && enter.is_empty() && leave.is_empty());
        }
    }

    /// One tick: the world is `me` and the ball; the node's delta goes to a real client view.
    fn step(
        index: &mut AoiIndex,
        view: &mut View,
        client: &mut metatopia_client::View,
        tick: u64,
        ball: ObjectView,
    ) -> usize {
        let me = "aa".repeat(32);
        index.update(Tick(tick), vec![obj("0v0", &me, true, 0, 0), ball].into_iter());
        let m = view.delta(index);
        let ServerMsg::Tick { update, .. } = &m else { panic!() };
        let n = update.iter().filter(|u| u.at_mm.is_some()).count();
        client.apply(&m);
        n
    }

    #[test]
    fn motion_is_dead_reckoned_corrected_when_it_drifts_and_stopped_explicitly() {
        let mut index = AoiIndex { radius_m: 1000, rate_hz: 20, ..AoiIndex::default() };
        // A ball rolling east at 1 m/s (50 mm a tick at 20 Hz), from x = 10 m.
        let ball = |x_mm: i64, v_mm: i64| {
            let mut b = obj("1v0", "x", false, 0, 0);
            b.position = [proto::decimal_of_mm(x_mm), "0".into()];
            b.velocity = [proto::decimal_of_mm(v_mm), "0".into()];
            b
        };
        let mut view = View { follow: Some("aa".repeat(32)), ..View::default() };
        let mut client = metatopia_client::View::default();
        let x = |c: &metatopia_client::View| c.position_mm("1v0").unwrap()[0];
        let mut sent = step(&mut index, &mut view, &mut client, 1, ball(10_000, 1000));
        for t in 2..=40 {
            sent += step(&mut index, &mut view, &mut client, t, ball(10_000 + 50 * (t as i64 - 1), 1000));
            assert_eq!(x(&client), 10_000 + 50 * (t as i64 - 1), "the client's extrapolation at tick {t}");
        }
        assert_eq!(sent, 0, "steady motion needs no position updates");
        // A bump: 150 mm further than the extrapolation, same velocity: corrected once.
        let x41 = 10_000 + 50 * 40 + 150;
        assert_eq!(step(&mut index, &mut view, &mut client, 41, ball(x41, 1000)), 1);
        assert_eq!(x(&client), x41);
        // A small drift (60 mm) is left to the extrapolation; a velocity change is sent.
        assert_eq!(step(&mut index, &mut view, &mut client, 42, ball(x41 + 50 + 60, 1000)), 0);
        assert_eq!(x(&client), x41 + 50);
        assert_eq!(step(&mut index, &mut view, &mut client, 43, ball(x41 + 200, 2000)), 1);
        // Stopping is always sent, so clients stop extrapolating.
        assert_eq!(step(&mut index, &mut view, &mut client, 44, ball(x41 + 250, 0)), 1);
        assert_eq!(step(&mut index, &mut view, &mut client, 45, ball(x41 + 250, 0)), 0);
        assert_eq!(x(&client), x41 + 250);
    }

    #[test]
    fn the_grid_query_matches_a_scan_of_every_object() {
        let mut index = AoiIndex::default();
        let mut seed = 12345u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((seed >> 33) % 600) as i64 - 300
        };
        let objects: Vec<ObjectView> = (0..500).map(|i| obj(&format!("{i}v0"), "o", false, next(), next())).collect();
        index.update(Tick(1), objects.clone().into_iter());
        for _ in 0..50 {
            let (c, r) = ([next(), next()], (next().unsigned_abs() % 120) as u32);
            let scan: BTreeSet<String> = objects
                .iter()
                .filter(|o| {
                    let p = o.metres();
                    (p[0] - c[0]).pow(2) + (p[1] - c[1]).pow(2) <= i64::from(r).pow(2)
                })
                .map(|o| o.id.clone())
                .collect();
            let scan: Vec<u64> =
                scan.iter().filter_map(|id| key_of(id)).collect::<BTreeSet<u64>>().into_iter().collect();
            let mut within = Vec::new();
            index.within(c, r, &mut within);
            assert_eq!(within, scan, "center {c:?} radius {r}");
        }
    }

    /// A transport of two channels: what the test sends the session, and what it answers.
    struct Pipe(mpsc::Receiver<ClientMsg>, mpsc::Sender<ServerMsg>);

    impl Transport for Pipe {
        async fn recv(&mut self) -> Option<Result<ClientMsg, String>> {
            self.0.recv().await.map(Ok)
        }
        async fn send(&mut self, m: &ServerMsg) -> bool {
            self.1.send(m.clone()).await.is_ok()
        }
    }

    /// After a failover to a node nobody listened on (so nobody kept its area index), the
    /// session waits for the loop to refill the index before it sends the area and replays the
    /// recent chat its avatar hears: the line said meanwhile is not lost.
    #[tokio::test]
    async fn a_session_on_a_node_nobody_listened_on_gets_the_chat_said_meanwhile() {
        let me = "aa".repeat(32);
        let hub = std::sync::Arc::new(Hub::new(1, Vec::new()));
        let (_status_tx, status) =
            tokio::sync::watch::channel(proto::Status { tick: Tick(700), ..proto::Status::default() });
        let (queries, mut asked) = mpsc::channel(8);
        let s = Service { status, queries, metrics: None, started: Instant::now(), hub: Some(hub.clone()) };
        let line = ChatView {
            tick: Tick(699),
            name: "bob".into(),
            channel: 0,
            text: "still here".into(),
            position: [101, 100],
            range_m: 20,
            to: None,
        };
        // The node's loop: the line was said while nobody listened (and so was one too long
        // ago, and one meant for another account alone); it refills the index at its next tick.
        let looped = hub.clone();
        hub.said(std::sync::Arc::new(ChatView {
            tick: Tick(700 - REPLAY_TICKS - 1),
            text: "too long ago".into(),
            ..line.clone()
        }));
        hub.said(std::sync::Arc::new(line.clone()));
        hub.said(std::sync::Arc::new(ChatView {
            text: "for bb only".into(),
            to: Some("bb".repeat(32)),
            ..line.clone()
        }));
        tokio::spawn(async move { while asked.recv().await.is_some() {} });
        let (to_session, from_test) = mpsc::channel(8);
        let (to_test, mut answers) = mpsc::channel(64);
        tokio::spawn(session(Pipe(from_test, to_test), s, View::nothing()));
        to_session.send(ClientMsg::Interest { follow: Some(me.clone()), radius_m: None, max_hz: None }).await.unwrap();
        for _ in 0..500 {
            if looped.listened() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(looped.listened(), "the session listens");
        tokio::time::sleep(Duration::from_millis(50)).await;
        {
            let mut index = looped.index.write().unwrap();
            index.radius_m = 30;
            index
                .update(Tick(701), vec![obj("0v0", &me, true, 100, 100), obj("1v0", "bb", true, 101, 100)].into_iter());
        }
        looped.publish_tick(Tick(701));
        let mut heard = Vec::new();
        // Five seconds for the first line, then half a second for any other.
        let mut wait = Duration::from_secs(5);
        while let Ok(Some(m)) = tokio::time::timeout(wait, answers.recv()).await {
            if let ServerMsg::Chat(c) = m {
                heard.push(c.text);
                wait = Duration::from_millis(500);
            }
        }
        assert_eq!(heard, ["still here"], "the line said while the client failed over");
    }

    /// A loop too busy to take a question within the wait: the session answers "busy: ask
    /// again", never "there is no such account" (a crowd's logins read that as an avatar-less
    /// login and gave up); once the loop takes questions again the same question is answered.
    #[tokio::test]
    async fn a_loop_too_busy_to_answer_is_said_busy_not_no_account() {
        let hub = std::sync::Arc::new(Hub::new(1, Vec::new()));
        let (_status_tx, status) =
            tokio::sync::watch::channel(proto::Status { tick: Tick(1), ..proto::Status::default() });
        let (queries, mut asked) = mpsc::channel(1);
        // The loop's queue is full, and the loop takes nothing yet.
        queries.try_send(Query::Governance(oneshot::channel().0)).unwrap();
        let s = Service { status, queries, metrics: None, started: Instant::now(), hub: Some(hub) };
        let (to_session, from_test) = mpsc::channel(8);
        let (to_test, mut answers) = mpsc::channel(64);
        tokio::spawn(session(Pipe(from_test, to_test), s, View::nothing()));
        let account = || ClientMsg::Account { id: "aa".repeat(32) };
        let answer = async |answers: &mut mpsc::Receiver<ServerMsg>| loop {
            match tokio::time::timeout(Duration::from_secs(30), answers.recv()).await {
                Ok(Some(m @ (ServerMsg::Account { .. } | ServerMsg::Error { .. }))) => break m,
                Ok(Some(_)) => {}
                other => panic!("no answer: {other:?}"),
            }
        };
        to_session.send(account()).await.unwrap();
        match answer(&mut answers).await {
            ServerMsg::Error { r#ref: None, message } => assert_eq!(message, proto::BUSY),
            other => panic!("a busy loop answered {other:?}"),
        }
        // The loop is back: it answers that there is no such account, now that it looked.
        tokio::spawn(async move {
            while let Some(q) = asked.recv().await {
                if let Query::Account(_, tx) = q {
                    let _ = tx.send(None);
                }
            }
        });
        to_session.send(account()).await.unwrap();
        assert!(matches!(answer(&mut answers).await, ServerMsg::Account { account: None, .. }));
    }
}
