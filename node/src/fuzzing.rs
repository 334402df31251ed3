//! Every decoder of untrusted bytes, as one function each: what `node/fuzz` runs under
//! libFuzzer (`cargo +nightly fuzz run TARGET`, see `node/fuzz/README.md`) and what
//! `tests/node/fuzz_corpus.rs` replays on stable from the committed corpora. Each takes any
//! bytes and must return without panicking, looping or allocating past the bound it was given.

use metatopia_scripting::RhaiHost;
use metatopia_sim::{SignedEvent, Sim, Snapshot};

use crate::world::AnyPhysics;

/// A decoder run on any bytes.
pub type Target = fn(&[u8]);

/// The targets by name (the names of `node/fuzz/fuzz_targets/*.rs` and of the corpus folders).
pub const TARGETS: &[(&str, Target)] = &[
    ("signed_event", signed_event),
    ("snapshot", snapshot),
    ("consensus_message", consensus_message),
    ("node_message", node_message),
    ("mail", mail),
    ("script_state", script_state),
    ("genesis", genesis),
    ("client_frame", client_frame),
    ("client_json", client_json),
    ("journal", journal),
    ("log_segment", log_segment),
];

/// A client's or a peer's signed event.
pub fn signed_event(b: &[u8]) {
    if let Ok(e) = SignedEvent::decode(b, 96 * 1024) {
        let _ = e.verify();
    }
}

/// A snapshot a peer offers, and restoring it (the root recomputed, physics loaded).
pub fn snapshot(b: &[u8]) {
    if let Ok(s) = Snapshot::decode(b, 1 << 24) {
        let _ = Sim::restore(s, RhaiHost::default(), AnyPhysics::of("kinematic"), 1);
    }
}

/// A consensus message from a peer.
pub fn consensus_message(b: &[u8]) {
    let _ = metatopia_consensus::Message::decode(b, 1 << 24);
}

/// A node message from a peer (the mesh's frames).
pub fn node_message(b: &[u8]) {
    let _ = crate::net::wire::NodeMsg::decode(b, crate::net::MAX_FRAME as usize);
}

/// A neighbour sim's mail body.
pub fn mail(b: &[u8]) {
    let _ = metatopia_sim::links::MailBody::decode(b);
}

/// A script's persisted state (from world state a peer may have sent).
pub fn script_state(b: &[u8]) {
    let _ = metatopia_scripting::persist::decode(b, 64 * 1024);
}

/// A genesis file (a joiner gets it from a peer).
pub fn genesis(b: &[u8]) {
    let _ = crate::world::genesis::Genesis::decode(b);
}

/// A client's QUIC frame body (postcard).
pub fn client_frame(b: &[u8]) {
    let _ = postcard::from_bytes::<metatopia_client::proto::ClientMsg>(b);
}

/// A client's WebSocket message (JSON).
pub fn client_json(b: &[u8]) {
    if let Ok(t) = std::str::from_utf8(b) {
        let _ = serde_json::from_str::<metatopia_client::proto::ClientMsg>(t);
    }
}

/// The agreement's journal as read back from disk.
pub fn journal(b: &[u8]) {
    let _ = crate::store::StateJournal::scan_bytes(b);
}

/// A commit-log segment as read back from disk.
pub fn log_segment(b: &[u8]) {
    let _ = crate::store::log::read_records_for_fuzzing(b);
}
