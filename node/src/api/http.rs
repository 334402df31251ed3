//! The node's HTTP service: `/healthz`, `/readyz`, `/metrics` (Prometheus), and a small JSON API
//! that `metatopia stats` and `metatopia admin` use:
//!
//! | route                     | what                                                          |
//! |---------------------------|---------------------------------------------------------------|
//! | `GET /v1/status`          | [`Status`]: tick, root, dilation, latencies, counts, peers    |
//! | `POST /v1/events`         | one signed event (postcard bytes) into the pool → its id      |
//! | `GET /v1/events/{id}`     | [`Outcome`] once executed (executed or refused, with reason)  |
//! | `GET /v1/accounts/{id}`   | [`AccountView`]                                               |
//! | `GET /v1/governance`      | [`GovernanceView`]: admin, temp admin and why, validators     |
//! | `GET /v1/objects/{id}`    | [`ObjectView`] (with its script's source, readable by anyone) |
//! | `GET /v1/scripts/{id}`    | [`ScriptView`]: a script by id, to follow its provenance      |
//! | `GET /v1/roots/{tick}`    | [`RootView`]: this node's root for a recent tick              |
//! | `GET /v1/chat/{since}`    | [`ChatView`]s heard since a tick (the last 1,024 lines)       |
//! | `GET /v1/ws`              | the WebSocket gateway ([`crate::api::gateway`]): deltas, chat, acts |
//! | `GET /`                   | the web viewer (`node/web/`, embedded)                        |
//!
//! The handlers never touch the sim: they ask the node's loop through a channel ([`Query`]) and
//! read the status it publishes after every tick, so the lockstep loop stays the only owner of
//! the state.

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metatopia_consensus::Micros;
use metatopia_sim::governance::{Role, report, role_of};
use metatopia_sim::host::{PhysicsStage, ScriptHost};
use metatopia_sim::{AccountId, EventId, Tick};
use tokio::sync::{mpsc, oneshot, watch};

use crate::core::{Agreement, NodeCore, Outcome};

pub use metatopia_client::proto::{AccountView, ChatView, GovernanceView, ObjectView, RootView, ScriptView, Status};

/// How the API shows an object (`with_source`: include its script's source).
pub fn object_view(w: &metatopia_sim::World, o: &metatopia_sim::Object, with_source: bool) -> ObjectView {
    let shape = match o.shape {
        metatopia_sim::state::Shape::Circle { radius } => format!("circle {radius}"),
        metatopia_sim::state::Shape::Box { half_width, half_height } => format!("box {half_width} {half_height}"),
    };
    let source = w.script_source(o.id);
    ObjectView {
        id: o.id.to_string(),
        name: o.name.clone(),
        owner: o.owner.to_string(),
        avatar: o.kind == metatopia_sim::state::ObjectKind::Avatar,
        position: [o.position.x.to_string(), o.position.y.to_string()],
        velocity: [o.velocity.x.to_string(), o.velocity.y.to_string()],
        shape,
        color: format!("{:08x}", o.color),
        text: o.text.clone(),
        script: source.filter(|_| with_source).map(script_view),
        scripted: source.is_some(),
        body: o.body.name().to_owned(),
        surface: o.surface.map_or_else(String::new, |s| {
            format!("friction {} restitution {} damping {}", s.friction, s.restitution, s.damping)
        }),
    }
}

fn script_view(s: &metatopia_sim::state::ScriptSource) -> ScriptView {
    ScriptView {
        source: s.source.clone(),
        licence: s.licence.clone(),
        author: s.author.to_string(),
        derived_from: s.derived_from.map(|d| d.to_string()),
        id: s.id().to_string(),
    }
}

/// A question for the node's loop.
#[derive(Debug)]
pub enum Query {
    Submit(Vec<u8>, oneshot::Sender<Result<EventId, String>>),
    Outcome(EventId, oneshot::Sender<Option<Outcome>>),
    Account(AccountId, oneshot::Sender<Option<AccountView>>),
    Governance(oneshot::Sender<GovernanceView>),
    Object(metatopia_sim::ObjectId, oneshot::Sender<Option<ObjectView>>),
    /// A script the sim holds, by its id.
    Script(metatopia_sim::ScriptId, oneshot::Sender<Option<ScriptView>>),
    /// Every object (the first 10,000), without script sources.
    Objects(oneshot::Sender<Vec<ObjectView>>),
    Root(Tick, oneshot::Sender<Option<RootView>>),
    /// Which other sim this account's avatar is in (asked of a node of every sim known through Raynet;
    /// `None` when none says within a second). Answered by the node's loop, which has the mesh.
    Locate(AccountId, oneshot::Sender<Option<u32>>),
    /// The sim whose square holds this point (metres), and a node of it: the node nearest the
    /// point in the Raynet overlay (`None` when the lookup fails within a second).
    Nearest([i64; 2], oneshot::Sender<Option<(u32, metatopia_client::proto::NodeAddr)>>),
}

/// Answer a query on the loop that owns the core.
pub fn answer<A: Agreement, H: ScriptHost, P: PhysicsStage>(core: &mut NodeCore<A, H, P>, now: Micros, q: Query) {
    // A dropped receiver only means the HTTP client went away.
    match q {
        // Only a loop with a mesh can ask the neighbours.
        Query::Locate(_, tx) => {
            let _ = tx.send(None);
        }
        Query::Nearest(_, tx) => {
            let _ = tx.send(None);
        }
        Query::Submit(bytes, tx) => {
            let _ = tx.send(core.submit_event(now, bytes).map_err(|e| e.to_string()));
        }
        Query::Outcome(id, tx) => {
            let _ = tx.send(core.outcome(&id).cloned());
        }
        Query::Account(id, tx) => {
            let _ = tx.send(account_view(core.sim().world(), &id));
        }
        Query::Governance(tx) => {
            let _ = tx.send(governance_view(core.sim().world()));
        }
        Query::Object(id, tx) => {
            let w = core.sim().world();
            let _ = tx.send(w.object(id).map(|o| object_view(w, o, true)));
        }
        Query::Script(id, tx) => {
            let _ = tx.send(core.sim().world().sources().get(&id).map(script_view));
        }
        Query::Objects(tx) => {
            let w = core.sim().world();
            let _ = tx.send(w.objects().values().take(10_000).map(|o| object_view(w, o, false)).collect());
        }
        Query::Root(tick, tx) => {
            let _ = tx.send(core.root_of(tick).map(|r| RootView { tick, root: r.to_string() }));
        }
    }
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::Admin => "admin",
        Role::TempAdmin => "temp admin",
        Role::Member => "member",
    }
}

pub fn account_view(w: &metatopia_sim::World, id: &AccountId) -> Option<AccountView> {
    let a = w.account(id)?;
    let g = w.governance();
    Some(AccountView {
        id: id.to_string(),
        name: a.name.clone(),
        joined_at_ms: a.joined_at_ms,
        last_login_ms: a.last_login_ms,
        last_nonce: a.last_nonce,
        role: role_name(role_of(w, id, w.time_ms())).to_owned(),
        banned: g.banned.contains(id),
        kicked_until_ms: g.kicked_until_ms.get(id).copied().filter(|t| *t > w.time_ms()),
        avatar: a.avatar.map(|o| o.to_string()),
        returned: a.returned.iter().map(|r| r.name.clone()).collect(),
    })
}

pub fn governance_view(w: &metatopia_sim::World) -> GovernanceView {
    let r = report(w, w.time_ms());
    let g = w.governance();
    let name = |id: &AccountId| w.account(id).map(|a| a.name.clone());
    let epoch = w.settings().epoch_ticks.max(1);
    GovernanceView {
        tick: w.tick(),
        time_ms: w.time_ms(),
        admin: r.admin.to_string(),
        admin_name: name(&r.admin),
        admin_days_absent: r.admin_days_absent,
        admin_absent: r.admin_absent,
        temp_admin: r.temp_admin.map(|a| a.to_string()),
        temp_admin_name: r.temp_admin.as_ref().and_then(name),
        reason: r.reason,
        admin_absent_days: w.settings().admin_absent_days,
        temp_admin_active_days: w.settings().temp_admin_active_days,
        validators: g.validators.iter().map(ToString::to_string).collect(),
        pending_validators: g.pending_validators.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        next_epoch_tick: Tick((w.tick().0 / epoch + 1) * epoch),
        banned: g.banned.iter().map(ToString::to_string).collect(),
        settings: w.settings().clone(),
    }
}

/// Parse 64 hex digits.
pub fn parse_hash(s: &str) -> Option<[u8; 32]> {
    crate::config::parse_hex32(s).ok()
}

/// What the HTTP handlers share.
#[derive(Clone, Debug)]
pub struct Service {
    pub status: watch::Receiver<Status>,
    pub queries: mpsc::Sender<Query>,
    /// Renders `/metrics` (None: metrics are off in this process).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    pub started: Instant,
    /// The client service's hub (None: no WebSocket gateway).
    pub hub: Option<std::sync::Arc<crate::api::hub::Hub>>,
}

/// A tick older than this makes the node not ready.
const READY_STALE: Duration = Duration::from_secs(5);

fn err(code: StatusCode, msg: impl Into<String>) -> Response {
    (code, axum::Json(serde_json::json!({ "error": msg.into() }))).into_response()
}

impl Service {
    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Query) -> Result<T, Response> {
        let (tx, rx) = oneshot::channel();
        let busy = || err(StatusCode::SERVICE_UNAVAILABLE, "the node is busy or stopping");
        self.queries.try_send(make(tx)).map_err(|_| busy())?;
        tokio::time::timeout(Duration::from_secs(5), rx).await.map_err(|_| busy())?.map_err(|_| busy())
    }
}

/// The HTTP routes (the WebSocket gateway's is added by [`crate::api::router`]).
pub fn routes() -> Router<Service> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status))
        .route("/v1/events", post(submit))
        .route("/v1/events/{id}", get(outcome))
        .route("/v1/accounts/{id}", get(account))
        .route("/v1/governance", get(governance))
        .route("/v1/objects", get(objects))
        .route("/v1/objects/{id}", get(object))
        .route("/v1/scripts/{id}", get(script))
        .route("/", get(|| async { axum::response::Html(include_str!("../../web/index.html")) }))
        .route(
            "/viewer.js",
            get(|| async {
                ([(axum::http::header::CONTENT_TYPE, "text/javascript")], include_str!("../../web/viewer.js"))
            }),
        )
        .route(
            "/draw.js",
            get(|| async {
                ([(axum::http::header::CONTENT_TYPE, "text/javascript")], include_str!("../../web/draw.js"))
            }),
        )
        .route(
            "/world.js",
            get(|| async {
                ([(axum::http::header::CONTENT_TYPE, "text/javascript")], include_str!("../../web/world.js"))
            }),
        )
        .route(
            "/nacl.js",
            get(|| async {
                ([(axum::http::header::CONTENT_TYPE, "text/javascript")], include_str!("../../web/nacl-fast.min.js"))
            }),
        )
        .route(
            "/viewer.css",
            get(|| async { ([(axum::http::header::CONTENT_TYPE, "text/css")], include_str!("../../web/viewer.css")) }),
        )
        .route("/v1/roots/{tick}", get(root))
        .route("/v1/chat/{since}", get(chat))
}

async fn healthz(State(s): State<Service>) -> Response {
    // Alive: the loop answers.
    match s.ask(Query::Governance).await {
        Ok(_) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => e,
    }
}

async fn readyz(State(s): State<Service>) -> Response {
    let st = s.status.borrow().clone();
    let now_ms = crate::unix_ms();
    let quorum = st.validators.saturating_sub(1) / 3 * 2 + 1; // 2f + 1
    let why = if let Some(t) = st.desynced {
        Some(format!("diverged at tick {t}"))
    } else if st.last_executed_unix_ms == 0 {
        Some("no tick executed yet".to_owned())
    } else if st.validators_connected < quorum {
        Some(format!(
            "{} of {} validators of this sim reachable, a quorum needs {quorum} (missing: {})",
            st.validators_connected,
            st.validators,
            st.validators_missing.join(", ")
        ))
    } else if now_ms.saturating_sub(st.last_executed_unix_ms) > READY_STALE.as_millis() as u64 {
        Some(format!("no tick executed for {}", crate::when::duration(now_ms.saturating_sub(st.last_executed_unix_ms))))
    } else {
        None
    };
    match why {
        None => (StatusCode::OK, format!("ready: tick {}\n", st.tick)).into_response(),
        Some(w) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {w}\n")).into_response(),
    }
}

async fn metrics(State(s): State<Service>) -> Response {
    match &s.metrics {
        Some(h) => ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], h.render()).into_response(),
        None => err(StatusCode::NOT_FOUND, "metrics are off in this process"),
    }
}

async fn status(State(s): State<Service>) -> Response {
    axum::Json(s.status.borrow().clone()).into_response()
}

async fn submit(State(s): State<Service>, body: axum::body::Bytes) -> Response {
    match s.ask(|tx| Query::Submit(body.to_vec(), tx)).await {
        Ok(Ok(id)) => (StatusCode::ACCEPTED, axum::Json(serde_json::json!({ "id": id.to_string() }))).into_response(),
        Ok(Err(reason)) => err(StatusCode::BAD_REQUEST, reason),
        Err(e) => e,
    }
}

async fn outcome(State(s): State<Service>, Path(id): Path<String>) -> Response {
    let Some(id) = parse_hash(&id) else { return err(StatusCode::BAD_REQUEST, "an event id is 64 hex digits") };
    match s.ask(|tx| Query::Outcome(EventId(id), tx)).await {
        Ok(Some(o)) => axum::Json(o).into_response(),
        Ok(None) => err(StatusCode::NOT_FOUND, "not executed here (yet)"),
        Err(e) => e,
    }
}

async fn account(State(s): State<Service>, Path(id): Path<String>) -> Response {
    let Some(id) = parse_hash(&id) else { return err(StatusCode::BAD_REQUEST, "an account id is 64 hex digits") };
    match s.ask(|tx| Query::Account(AccountId(id), tx)).await {
        Ok(Some(a)) => axum::Json(a).into_response(),
        Ok(None) => err(StatusCode::NOT_FOUND, "no such account in this sim"),
        Err(e) => e,
    }
}

async fn object(State(s): State<Service>, Path(id): Path<String>) -> Response {
    let Some(id) = metatopia_client::conn::parse_object(&id) else {
        return err(StatusCode::BAD_REQUEST, "an object id is SLOTvGENERATION, like 12v0");
    };
    match s.ask(|tx| Query::Object(id, tx)).await {
        Ok(Some(o)) => axum::Json(o).into_response(),
        Ok(None) => err(StatusCode::NOT_FOUND, "no such object"),
        Err(e) => e,
    }
}

async fn script(State(s): State<Service>, Path(id): Path<String>) -> Response {
    let Some(id) = parse_hash(&id).map(metatopia_sim::ScriptId) else {
        return err(StatusCode::BAD_REQUEST, "a script id is 64 hex digits");
    };
    match s.ask(|tx| Query::Script(id, tx)).await {
        Ok(Some(v)) => axum::Json(v).into_response(),
        Ok(None) => err(StatusCode::NOT_FOUND, "no such script in this sim"),
        Err(e) => e,
    }
}

async fn objects(State(s): State<Service>) -> Response {
    match s.ask(Query::Objects).await {
        Ok(list) => axum::Json(list).into_response(),
        Err(e) => e,
    }
}

async fn root(State(s): State<Service>, Path(tick): Path<u64>) -> Response {
    match s.ask(|tx| Query::Root(Tick(tick), tx)).await {
        Ok(Some(r)) => axum::Json(r).into_response(),
        Ok(None) => err(StatusCode::NOT_FOUND, "not executed here, or too long ago (the last 512 ticks are kept)"),
        Err(e) => e,
    }
}

/// Public lines only, read from the hub's ring without asking the loop: a line for one account
/// (its scripts' errors) is for that account's authenticated session (the gateway), not for
/// anyone who asks.
async fn chat(State(s): State<Service>, Path(since): Path<u64>) -> Response {
    let Some(hub) = s.hub.as_ref() else { return err(StatusCode::SERVICE_UNAVAILABLE, "this node serves no chat") };
    let lines: Vec<ChatView> =
        hub.replay(Tick(since), crate::api::hub::RECENT_CHAT, |_| true).iter().map(|l| ChatView::clone(l)).collect();
    axum::Json(lines).into_response()
}

async fn governance(State(s): State<Service>) -> Response {
    match s.ask(Query::Governance).await {
        Ok(g) => axum::Json(g).into_response(),
        Err(e) => e,
    }
}

/// What a request of [`Client`] can end in.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The node could not be reached, or the connection broke.
    #[error("{url}: {cause}")]
    Transport { url: String, cause: String },
    /// The node answered with an error (its message, or its body).
    #[error("{message} (HTTP {code})")]
    Refused { code: u16, message: String },
    /// An answer that is not what the API says.
    #[error("{url}: an answer that is not the API's: {cause}")]
    Answer { url: String, cause: String },
}

impl ApiError {
    fn transport(url: &str, cause: impl std::fmt::Display) -> ApiError {
        ApiError::Transport { url: url.to_owned(), cause: cause.to_string() }
    }
    fn answer(url: &str, cause: impl std::fmt::Display) -> ApiError {
        ApiError::Answer { url: url.to_owned(), cause: cause.to_string() }
    }
}

/// A blocking client of a node's HTTP service (the CLI's side).
#[derive(Debug, Clone)]
pub struct Client {
    base: String,
    agent: ureq::Agent,
}

impl Client {
    /// `node` is `host:port` or `http://host:port`.
    pub fn new(node: &str) -> Client {
        let base = if node.starts_with("http://") { node.to_owned() } else { format!("http://{node}") };
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .http_status_as_error(false)
            .build()
            .into();
        Client { base: base.trim_end_matches('/').to_owned(), agent }
    }

    fn read(&self, url: &str, mut r: ureq::http::Response<ureq::Body>) -> Result<(u16, String), ApiError> {
        let code = r.status().as_u16();
        let body =
            r.body_mut().with_config().limit(16 << 20).read_to_string().map_err(|e| ApiError::transport(url, e))?;
        Ok((code, body))
    }

    fn error_of(code: u16, body: &str) -> ApiError {
        let message = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
            .unwrap_or_else(|| body.trim().to_owned());
        ApiError::Refused { code, message }
    }

    /// GET a path; `Ok(None)` on 404.
    pub fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> Result<Option<T>, ApiError> {
        let url = format!("{}{path}", self.base);
        let r = self.agent.get(&url).call().map_err(|e| ApiError::transport(&url, e))?;
        let (code, body) = self.read(&url, r)?;
        match code {
            200 => serde_json::from_str(&body).map(Some).map_err(|e| ApiError::answer(&url, e)),
            404 => Ok(None),
            _ => Err(Self::error_of(code, &body)),
        }
    }

    /// GET a text path (`/healthz`, `/readyz`, `/metrics`): status code and body.
    pub fn get_text(&self, path: &str) -> Result<(u16, String), ApiError> {
        let url = format!("{}{path}", self.base);
        let r = self.agent.get(&url).call().map_err(|e| ApiError::transport(&url, e))?;
        self.read(&url, r)
    }

    /// Submit one encoded signed event; its id.
    pub fn submit(&self, event: &[u8]) -> Result<String, ApiError> {
        let url = format!("{}/v1/events", self.base);
        let r = self.agent.post(&url).send(event).map_err(|e| ApiError::transport(&url, e))?;
        let (code, body) = self.read(&url, r)?;
        if code != 202 {
            return Err(Self::error_of(code, &body));
        }
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| ApiError::answer(&url, e))?;
        v.get("id").and_then(|i| i.as_str()).map(str::to_owned).ok_or_else(|| ApiError::answer(&url, "no id"))
    }

    /// Wait (up to `wait`) for an event's outcome.
    pub fn wait_outcome(&self, id: &str, wait: Duration) -> Result<Option<Outcome>, ApiError> {
        let end = Instant::now() + wait;
        loop {
            if let Some(o) = self.get::<Outcome>(&format!("/v1/events/{id}"))? {
                return Ok(Some(o));
            }
            if Instant::now() >= end {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::hub::Hub;

    /// `GET /v1/chat/{since}` reads the hub's ring (the loop keeps no copy): the public lines
    /// since the tick, oldest first; a line meant for one account is never in it.
    #[tokio::test]
    async fn chat_since_a_tick_is_the_hubs_public_lines() {
        let hub = std::sync::Arc::new(Hub::new(1, Vec::new()));
        let line = |tick: u64, text: &str, to: Option<String>| {
            std::sync::Arc::new(ChatView {
                tick: Tick(tick),
                name: "bob".into(),
                channel: 0,
                text: text.into(),
                position: [0, 0],
                range_m: 20,
                to,
            })
        };
        hub.said(line(5, "old", None));
        hub.said(line(10, "hello", None));
        hub.said(line(11, "your script failed", Some("bb".repeat(32))));
        hub.said(line(12, "world", None));
        let (_status_tx, status) = tokio::sync::watch::channel(Status::default());
        // Nobody answers queries: the chat must not need the loop.
        let (queries, _asked) = tokio::sync::mpsc::channel(1);
        let s = Service { status, queries, metrics: None, started: std::time::Instant::now(), hub: Some(hub) };
        let response = chat(State(s), Path(10)).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.expect("body");
        let lines: Vec<ChatView> = serde_json::from_slice(&body).expect("json");
        let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(texts, ["hello", "world"]);
    }
}
