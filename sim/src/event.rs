//! Events: signed envelopes and their payloads (DESIGN §2, §4 step 1).
//!
//! An event body carries the sim id and a per-account nonce; the author signs
//! `DOMAIN ‖ postcard(body)` with ed25519. The event id is a keyed blake3 of the body's
//! encoding. A signature's validity is a pure function of the bytes, so it is checked ahead
//! of the tick, on any thread ([`VerifiedBatch::new`]); the tick reads the verdict and checks
//! nonces, which depend on state.

use std::collections::BTreeMap;

use ed25519_dalek::{Signature as DalekSig, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::codec::{self, DecodeError};
use crate::fx::Fx;
use crate::ids::{AccountId, EventId, Hash32, ObjectId, ScriptId, SimId, Tick};
use crate::merkle::keys;
use crate::state::{BodyKind, Settings, Shape, Surface};
use crate::vec2::Vec2;

/// Signature domain: no other Metatopia message signs these bytes.
pub const SIGNING_DOMAIN: &[u8] = b"metatopia/event/v1\0";

/// How far chat carries, like Second Life.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum ChatRange {
    /// 10 m.
    Whisper,
    /// 20 m.
    Say,
    /// 100 m.
    Shout,
}

impl ChatRange {
    pub fn metres(self) -> Fx {
        Fx::from_int(match self {
            ChatRange::Whisper => 10,
            ChatRange::Say => 20,
            ChatRange::Shout => 100,
        })
    }
}

/// What an event asks for.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Payload {
    /// First login creates the account; every login updates `last_login` and spawns the avatar
    /// if the account has none here (nor one on its way into a neighbour).
    Login {
        name: String,
    },
    /// Removes the author's avatar.
    Logout,
    /// Set an owned object's velocity (an intent: sent when it changes, not every tick).
    Move {
        object: ObjectId,
        velocity: Vec2,
    },
    Chat {
        channel: i32,
        range: ChatRange,
        text: String,
    },
    Touch {
        object: ObjectId,
    },
    /// Create a prim owned by the author.
    Rez {
        name: String,
        shape: Shape,
        position: Vec2,
        color: u32,
        text: String,
        body: BodyKind,
    },
    /// Remove an object the author owns.
    Derez {
        object: ObjectId,
    },
    /// Attach a script (source + copyleft licence) to an owned object.
    DeployScript {
        object: ObjectId,
        source: String,
        licence: String,
        derived_from: Option<ScriptId>,
    },
    Admin(AdminAct),
    /// Rez again, at `position`, an object the admin returned to the author (by its place in
    /// the account's `returned` list); its script, if any, is redeployed separately.
    RezReturned {
        index: u32,
        position: Vec2,
    },
    /// A neighbour sim's mail of its tick `tick` (a [`crate::links::MailBody`], encoded),
    /// signed by one of that sim's validators; see [`crate::links`]. Not nonce-checked: copies
    /// are counted per (sender, tick, digest) and delivered once.
    Mail {
        from: SimId,
        tick: Tick,
        body: Vec<u8>,
    },
    /// Change an object the author owns: each field given replaces the object's. A new
    /// position (inside the sim) or body places it there at rest.
    Edit {
        object: ObjectId,
        edit: ObjectEdit,
    },
}

/// The properties an owner's edit changes (`None`: unchanged).
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct ObjectEdit {
    pub name: Option<String>,
    pub text: Option<String>,
    pub color: Option<u32>,
    pub shape: Option<Shape>,
    pub position: Option<Vec2>,
    pub body: Option<BodyKind>,
    pub surface: Option<Surface>,
}

/// Governance acts (DESIGN §10); checked against the roles at the tick they execute.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum AdminAct {
    Kick {
        account: AccountId,
    },
    Ban {
        account: AccountId,
    },
    Unban {
        account: AccountId,
    },
    SetSettings(Settings),
    RemoveObject {
        object: ObjectId,
    },
    RemoveScript {
        object: ObjectId,
    },
    AdmitValidator {
        key: AccountId,
    },
    RemoveValidator {
        key: AccountId,
    },
    TransferAdmin {
        to: AccountId,
    },
    /// Take an object out of the world and give it back to its owner's account.
    ReturnObject {
        object: ObjectId,
    },
}

impl AdminAct {
    pub fn name(&self) -> &'static str {
        match self {
            AdminAct::Kick { .. } => "kick",
            AdminAct::Ban { .. } => "ban",
            AdminAct::Unban { .. } => "unban",
            AdminAct::SetSettings(_) => "settings",
            AdminAct::RemoveObject { .. } => "remove-object",
            AdminAct::RemoveScript { .. } => "remove-script",
            AdminAct::AdmitValidator { .. } => "admit-validator",
            AdminAct::RemoveValidator { .. } => "remove-validator",
            AdminAct::TransferAdmin { .. } => "transfer-admin",
            AdminAct::ReturnObject { .. } => "return-object",
        }
    }
}

/// The signed part of an event.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct EventBody {
    pub sim: SimId,
    pub author: AccountId,
    /// Must exceed the author's last accepted nonce.
    pub nonce: u64,
    pub payload: Payload,
}

/// An ed25519 signature (64 bytes, as two halves for serde).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Signature(pub [u8; 32], pub [u8; 32]);

impl Signature {
    fn to_bytes(self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[..32].copy_from_slice(&self.0);
        b[32..].copy_from_slice(&self.1);
        b
    }
}

/// An event as it travels: body and signature.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct SignedEvent {
    pub body: EventBody,
    pub signature: Signature,
}

fn signing_bytes(body_bytes: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIGNING_DOMAIN.len() + body_bytes.len());
    m.extend_from_slice(SIGNING_DOMAIN);
    m.extend_from_slice(body_bytes);
    m
}

/// The account id of a signing key.
pub fn account_of(key: &SigningKey) -> AccountId {
    AccountId(key.verifying_key().to_bytes())
}

impl SignedEvent {
    /// Sign a body.
    pub fn sign(body: EventBody, key: &SigningKey) -> SignedEvent {
        let bytes = codec::encode(&body);
        let sig = key.sign(&signing_bytes(&bytes)).to_bytes();
        let mut r = [0u8; 32];
        let mut s = [0u8; 32];
        r.copy_from_slice(&sig[..32]);
        s.copy_from_slice(&sig[32..]);
        SignedEvent { body, signature: Signature(r, s) }
    }

    /// Convenience: build and sign.
    pub fn new(key: &SigningKey, sim: SimId, nonce: u64, payload: Payload) -> SignedEvent {
        SignedEvent::sign(EventBody { sim, author: account_of(key), nonce, payload }, key)
    }

    pub fn id(&self) -> EventId {
        event_id(&codec::encode(&self.body))
    }

    /// Check the signature (strict: no malleable or small-order keys).
    pub fn verify(&self) -> bool {
        verify_encoded(&self.body.author, &codec::encode(&self.body), &self.signature)
    }

    /// Decode an event from untrusted bytes (bounded; see [`codec`]).
    pub fn decode(bytes: &[u8], max_bytes: u32) -> Result<SignedEvent, DecodeError> {
        codec::decode(bytes, max_bytes)
    }
}

fn event_id(body_bytes: &[u8]) -> EventId {
    EventId(*blake3::keyed_hash(&keys::EVENT_ID, body_bytes).as_bytes())
}

fn verify_encoded(author: &AccountId, body_bytes: &[u8], sig: &Signature) -> bool {
    let Ok(key) = VerifyingKey::from_bytes(&author.0) else {
        return false;
    };
    verify_with(&key, body_bytes, sig)
}

fn verify_with(key: &VerifyingKey, body_bytes: &[u8], sig: &Signature) -> bool {
    let sig = DalekSig::from_bytes(&sig.to_bytes());
    key.verify_strict(&signing_bytes(body_bytes), &sig).is_ok()
}

/// Authors' public keys, decompressed once per batch chunk (decompressing a point is a good part
/// of a signature check, and a tick's events come from far fewer authors than events).
#[derive(Default)]
struct AuthorKeys(BTreeMap<AccountId, Option<VerifyingKey>>);

impl AuthorKeys {
    fn verify(&mut self, author: &AccountId, body_bytes: &[u8], sig: &Signature) -> bool {
        let key = self.0.entry(*author).or_insert_with(|| VerifyingKey::from_bytes(&author.0).ok());
        key.as_ref().is_some_and(|k| verify_with(k, body_bytes, sig))
    }
}

/// One event of a batch with what can be known of it without state.
#[derive(Clone, Debug)]
pub struct Checked {
    pub event: SignedEvent,
    pub id: EventId,
    /// Encoded body size in bytes.
    pub size: u32,
    pub signature_ok: bool,
}

impl Checked {
    /// Check an event; `known` is its signature's verdict if it was computed ahead (a pure
    /// function of the event's bytes, so any thread or cache may have computed it).
    pub fn new(event: SignedEvent, known: Option<bool>) -> Checked {
        Checked::with_keys(event, known, &mut AuthorKeys::default())
    }

    fn with_keys(event: SignedEvent, known: Option<bool>, keys: &mut AuthorKeys) -> Checked {
        let bytes = codec::encode(&event.body);
        let signature_ok = known.unwrap_or_else(|| keys.verify(&event.body.author, &bytes, &event.signature));
        Checked { id: event_id(&bytes), size: bytes.len().min(u32::MAX as usize) as u32, signature_ok, event }
    }
}

/// The inputs consensus committed for one tick.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Batch {
    pub tick: Tick,
    /// BFT time of the batch, in milliseconds.
    pub time_ms: u64,
    /// Seed of the canonical order: the hash of the commit certificate (DESIGN §4 step 3).
    pub seed: Hash32,
    pub events: Vec<SignedEvent>,
}

/// A batch whose signatures have been checked (on any thread, ahead of the tick).
#[derive(Clone, Debug)]
pub struct VerifiedBatch {
    pub tick: Tick,
    pub time_ms: u64,
    pub seed: Hash32,
    pub events: Vec<Checked>,
}

impl VerifiedBatch {
    /// Check every signature, split over `workers` threads.
    pub fn new(batch: Batch, workers: u32) -> VerifiedBatch {
        VerifiedBatch::with_verdicts(batch, workers, |_| None)
    }

    /// Like [`VerifiedBatch::new`], taking the verdicts `known` has (computed ahead, while the
    /// events arrived) and checking only the others.
    pub fn with_verdicts(
        batch: Batch,
        workers: u32,
        known: impl Fn(&SignedEvent) -> Option<bool> + Sync,
    ) -> VerifiedBatch {
        let events = crate::par::map_chunks(&batch.events, workers, 32, |chunk| {
            let mut keys = AuthorKeys::default();
            chunk.iter().map(|e| Checked::with_keys(e.clone(), known(e), &mut keys)).collect()
        });
        VerifiedBatch { tick: batch.tick, time_ms: batch.time_ms, seed: batch.seed, events }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SigningKey {
        SigningKey::from_bytes(&[n; 32])
    }

    #[test]
    fn signed_events_verify_and_tampering_breaks_them() {
        let e = SignedEvent::new(&key(1), SimId(7), 1, Payload::Login { name: "ann".into() });
        assert!(e.verify());
        let mut other_sim = e.clone();
        other_sim.body.sim = SimId(8);
        assert!(!other_sim.verify());
        let mut replay_nonce = e.clone();
        replay_nonce.body.nonce = 2;
        assert!(!replay_nonce.verify());
        let mut forged = e.clone();
        forged.body.author = account_of(&key(2));
        assert!(!forged.verify());
        let mut garbage_key = e.clone();
        garbage_key.body.author = AccountId([0xff; 32]);
        assert!(!garbage_key.verify());
    }

    #[test]
    fn ids_depend_on_the_whole_body() {
        let a = SignedEvent::new(&key(1), SimId(7), 1, Payload::Logout);
        let b = SignedEvent::new(&key(1), SimId(7), 2, Payload::Logout);
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id(), a.clone().id());
    }

    #[test]
    fn verified_batch_is_the_same_for_any_worker_count() {
        let events: Vec<SignedEvent> = (0..100u64)
            .map(|i| {
                let mut e = SignedEvent::new(&key((i % 5) as u8), SimId(1), i + 1, Payload::Logout);
                if i % 7 == 0 {
                    e.signature.0[0] ^= 1;
                }
                e
            })
            .collect();
        let batch = Batch { tick: Tick(0), time_ms: 0, seed: Hash32([0; 32]), events };
        let one = VerifiedBatch::new(batch.clone(), 1);
        let many = VerifiedBatch::new(batch, 8);
        let v1: Vec<_> = one.events.iter().map(|c| (c.id, c.signature_ok)).collect();
        let v8: Vec<_> = many.events.iter().map(|c| (c.id, c.signature_ok)).collect();
        assert_eq!(v1, v8);
        assert_eq!(v1.iter().filter(|(_, ok)| !ok).count(), 15);
    }
}
