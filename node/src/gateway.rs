//! The WebSocket gateway (`GET /v1/ws`): what the web viewer speaks. JSON text frames, one
//! message each, tagged by `type`.
//!
//! Client → node ([`ClientMsg`]):
//! - `{"type":"submit","ref":7,"event":"<hex of a postcard SignedEvent>"}` → `submitted`
//!   (with the event id) or `error`, then `outcome` once executed (executed or refused, why);
//! - `{"type":"object","id":"12v0"}` → `object` (with its script's source and provenance);
//! - `{"type":"account","id":"<64 hex>"}` → `account` (nonce, role, avatar).
//!
//! Node → client ([`ServerMsg`]): on connect `status`, a `tick` with every object in `enter`
//! and the recent `chat`; then every tick a `tick` delta (objects that entered, changed or left;
//! enter and update are both "upsert"), every chat line, `status` once a second. A client too
//! slow for the deltas loses them and gets the whole state again (the sim never waits for it).
//! A client may submit at most [`SUBMITS_PER_SECOND`] events a second; frames are bounded.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, oneshot};

use crate::core::{MAX_EVENT_BYTES, Outcome};
use crate::http::{AccountView, ChatView, ObjectView, Query, Service, Status, parse_hash};

/// Events one connection may submit per second.
pub const SUBMITS_PER_SECOND: u32 = 50;

/// What the node's loop publishes to every gateway session.
#[derive(Clone, Debug)]
pub enum Feed {
    Tick { tick: u64, enter: Vec<ObjectView>, update: Vec<ObjectView>, leave: Vec<String> },
    Chat(ChatView),
    Status(Box<Status>),
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMsg {
    Status(Box<Status>),
    Tick { tick: u64, enter: Vec<ObjectView>, update: Vec<ObjectView>, leave: Vec<String> },
    Chat(ChatView),
    Submitted { r#ref: u64, id: String },
    Outcome { id: String, outcome: Outcome },
    Object { object: Option<ObjectView> },
    Account { id: String, account: Option<AccountView> },
    Error { r#ref: Option<u64>, message: String },
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMsg {
    Submit { r#ref: u64, event: String },
    Object { id: String },
    Account { id: String },
}

/// The upgrade handler.
pub async fn upgrade(ws: WebSocketUpgrade, State(s): State<Service>) -> Response {
    ws.max_message_size(2 * MAX_EVENT_BYTES as usize + 1024).on_upgrade(move |socket| session(socket, s))
}

async fn ask<T>(s: &Service, make: impl FnOnce(oneshot::Sender<T>) -> Query) -> Option<T> {
    let (tx, rx) = oneshot::channel();
    s.queries.try_send(make(tx)).ok()?;
    tokio::time::timeout(Duration::from_secs(5), rx).await.ok()?.ok()
}

async fn send(socket: &mut WebSocket, m: &ServerMsg) -> bool {
    match serde_json::to_string(m) {
        Ok(text) => socket.send(Message::Text(text.into())).await.is_ok(),
        Err(_) => true,
    }
}

/// Everything a new (or lagging) client needs: status, all objects, recent chat.
async fn full_state(socket: &mut WebSocket, s: &Service) -> bool {
    let status = s.status.borrow().clone();
    let tick = status.tick;
    if !send(socket, &ServerMsg::Status(Box::new(status))).await {
        return false;
    }
    let enter = ask(s, Query::Objects).await.unwrap_or_default();
    if !send(socket, &ServerMsg::Tick { tick, enter, update: Vec::new(), leave: Vec::new() }).await {
        return false;
    }
    for line in ask(s, |tx| Query::Chat(tick.saturating_sub(600), tx)).await.unwrap_or_default() {
        if !send(socket, &ServerMsg::Chat(line)).await {
            return false;
        }
    }
    true
}

async fn session(mut socket: WebSocket, s: Service) {
    let Some(feed) = s.feed.as_ref() else { return };
    let mut feed = feed.subscribe();
    if !full_state(&mut socket, &s).await {
        return;
    }
    let (outcomes_tx, mut outcomes) = mpsc::channel::<ServerMsg>(256);
    let (mut window, mut submits) = (Instant::now(), 0u32);
    loop {
        tokio::select! {
            m = socket.recv() => {
                let text = match m {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                    Some(Ok(_)) => continue,
                };
                let reply = match serde_json::from_str::<ClientMsg>(text.as_str()) {
                    Err(e) => ServerMsg::Error { r#ref: None, message: format!("not a client message: {e}") },
                    Ok(ClientMsg::Object { id }) => {
                        let parsed = id.split_once('v').and_then(|(a, b)| {
                            Some(metatopia_sim::ObjectId::new(a.parse().ok()?, b.parse().ok()?))
                        });
                        match parsed {
                            Some(oid) => ServerMsg::Object { object: ask(&s, |tx| Query::Object(oid, tx)).await.flatten() },
                            None => ServerMsg::Error { r#ref: None, message: format!("{id:?} is not an object id") },
                        }
                    }
                    Ok(ClientMsg::Account { id }) => match parse_hash(&id) {
                        Some(a) => {
                            let account = ask(&s, |tx| Query::Account(metatopia_sim::AccountId(a), tx)).await.flatten();
                            ServerMsg::Account { id, account }
                        }
                        None => ServerMsg::Error { r#ref: None, message: format!("{id:?} is not an account id") },
                    },
                    Ok(ClientMsg::Submit { r#ref, event }) => {
                        if window.elapsed() >= Duration::from_secs(1) {
                            (window, submits) = (Instant::now(), 0);
                        }
                        submits += 1;
                        if submits > SUBMITS_PER_SECOND {
                            let m = format!("more than {SUBMITS_PER_SECOND} events a second: disconnected");
                            let _ = send(&mut socket, &ServerMsg::Error { r#ref: Some(r#ref), message: m }).await;
                            return;
                        }
                        submit(&s, r#ref, &event, &outcomes_tx).await
                    }
                };
                if !send(&mut socket, &reply).await {
                    return;
                }
            }
            f = feed.recv() => {
                let m = match f {
                    Ok(Feed::Tick { tick, enter, update, leave }) => ServerMsg::Tick { tick, enter, update, leave },
                    Ok(Feed::Chat(c)) => ServerMsg::Chat(c),
                    Ok(Feed::Status(st)) => ServerMsg::Status(st),
                    Err(RecvError::Lagged(_)) => {
                        // Too slow for the deltas: they are dropped; start again from the whole state.
                        if !full_state(&mut socket, &s).await {
                            return;
                        }
                        continue;
                    }
                    Err(RecvError::Closed) => return,
                };
                if !send(&mut socket, &m).await {
                    return;
                }
            }
            Some(m) = outcomes.recv() => {
                if !send(&mut socket, &m).await {
                    return;
                }
            }
        }
    }
}

/// Decode, hand to the loop, and watch for the outcome (reported on `outcomes`).
async fn submit(s: &Service, r#ref: u64, event: &str, outcomes: &mpsc::Sender<ServerMsg>) -> ServerMsg {
    let bytes = match decode_hex(event) {
        Some(b) if b.len() <= MAX_EVENT_BYTES as usize => b,
        _ => return ServerMsg::Error { r#ref: Some(r#ref), message: "event: hex of at most 64 KiB expected".into() },
    };
    match ask(s, |tx| Query::Submit(bytes, tx)).await {
        None => ServerMsg::Error { r#ref: Some(r#ref), message: "the node is busy or stopping".into() },
        Some(Err(reason)) => ServerMsg::Error { r#ref: Some(r#ref), message: reason },
        Some(Ok(id)) => {
            let (s2, tx) = (s.clone(), outcomes.clone());
            tokio::spawn(async move {
                for _ in 0..150 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if let Some(Some(outcome)) = ask(&s2, |t| Query::Outcome(id, t)).await {
                        let _ = tx.send(ServerMsg::Outcome { id: id.to_string(), outcome }).await;
                        return;
                    }
                }
            });
            ServerMsg::Submitted { r#ref, id: id.to_string() }
        }
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}
