//! Wire types: blocks, votes, certificates and messages, with their signatures and bounded
//! decoding.

use std::collections::BTreeSet;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

pub use metatopia_sim::ids::Tick;

use crate::strict::KeyTable;

/// Time in microseconds (the caller's clock; virtual in simulation).
pub type Micros = u64;

/// A validator's index in the validator set.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct ValidatorIndex(pub u16);

/// A view: one attempt to extend the chain, with one leader.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default, Serialize, Deserialize)]
pub struct View(pub u64);

impl View {
    pub fn next(self) -> View {
        View(self.0 + 1)
    }
}

/// A 32-byte blake3 digest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Digest(pub [u8; 32]);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Digest({:02x}{:02x}{:02x}{:02x})", self.0[0], self.0[1], self.0[2], self.0[3])
    }
}

/// An ed25519 signature (64 bytes as two halves, for serde).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Sig(pub [u8; 32], pub [u8; 32]);

impl Sig {
    fn from_dalek(s: Signature) -> Sig {
        let b = s.to_bytes();
        let (mut r, mut t) = ([0u8; 32], [0u8; 32]);
        r.copy_from_slice(&b[..32]);
        t.copy_from_slice(&b[32..]);
        Sig(r, t)
    }
}

/// A validator's latest executed tick and its state root, carried in votes so that a node
/// whose state diverged is detected within a tick.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct RootReport {
    pub tick: Tick,
    pub root: Digest,
}

/// The parent a block extends.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Parent {
    pub view: View,
    pub digest: Digest,
}

/// A proposed block: the batch of one tick.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Block {
    pub view: View,
    pub leader: ValidatorIndex,
    pub parent: Parent,
    /// The tick this block's batch is for: after the parent's, at most a span (R1) past it; the
    /// ticks between are empty (genesis is tick 0's parent).
    pub tick: Tick,
    /// BFT time in milliseconds: above the parent's, at most `max_drift` ahead of voters' clocks.
    pub time_ms: u64,
    /// Opaque client events (the node passes signed sim events), shared with the pool.
    #[serde(with = "byte_strings")]
    pub events: Vec<EventBytes>,
    /// The notarization of the parent (None when the parent is genesis). Its hash is the seed
    /// of the parent tick's canonical order once this block is finalized.
    pub parent_certificate: Option<Certificate>,
}

impl Block {
    /// The block's digest: its header and its events' ids (which commit to the events).
    pub fn digest(&self) -> Digest {
        let ids = event_ids(&self.events);
        self.digest_with_ids(&ids)
    }

    /// [`Block::digest`] given the events' ids (`ids[i]` must be `event_id(&events[i])`): a
    /// validator usually knows them already (its pool), so the events are not hashed again.
    pub fn digest_with_ids(&self, ids: &[Digest]) -> Digest {
        debug_assert_eq!(ids.len(), self.events.len());
        self.header_digest(ids)
    }

    /// The digest of the block made of this header (its `events` are ignored) and the events
    /// named by `ids`: what a compact proposal ([`Message::ProposeIds`]) is checked against.
    pub fn header_digest(&self, ids: &[Digest]) -> Digest {
        #[derive(Serialize)]
        struct Header<'a> {
            view: View,
            leader: ValidatorIndex,
            parent: Parent,
            tick: Tick,
            time_ms: u64,
            events: u64,
            parent_certificate: &'a Option<Certificate>,
        }
        let header = Header {
            view: self.view,
            leader: self.leader,
            parent: self.parent,
            tick: self.tick,
            time_ms: self.time_ms,
            events: ids.len() as u64,
            parent_certificate: &self.parent_certificate,
        };
        // One input, not one update per id: blake3 hashes the whole chunks of a long input side
        // by side in SIMD lanes (one 32-byte update at a time compressed a block at a time,
        // 40 µs for 1,000 ids). Into a buffer of this thread's, kept: a fresh 32 KB one each
        // time cost a follower ~10 µs of its proposal's handling (the allocation's first touch).
        thread_local! {
            static BYTES: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        BYTES.with_borrow_mut(|kept| {
            let mut bytes = std::mem::take(kept);
            bytes.clear();
            let mut bytes = postcard::to_extend(&header, bytes).expect("encoding into a Vec cannot fail");
            for id in ids {
                bytes.extend_from_slice(&id.0);
            }
            let digest = Digest(*blake3::keyed_hash(b"metatopia/consensus/block/v2____", &bytes).as_bytes());
            if bytes.capacity() <= 1 << 20 {
                *kept = bytes;
            }
            digest
        })
    }
}

/// What an application's commit log keeps of a committed block: with the notarization of the
/// block before it, enough to rebuild the block ([`crate::Validator::recall`]).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Logged {
    pub tick: Tick,
    pub time_ms: u64,
    #[serde(with = "byte_strings")]
    pub events: Vec<EventBytes>,
    /// The block's notarization, as its commit carried it ([`crate::Commit::certificate`]).
    pub notarization: Certificate,
    /// The empty block that opened the tick, when this block fills it ([`crate::Commit::opener`]).
    pub opener: Option<Opener>,
}

/// The empty block that opened a tick its committed block fills (R1 fills): its BFT time and
/// its notarization (the one the filling block embeds). With the block before it, enough to
/// rebuild it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Opener {
    pub time_ms: u64,
    pub notarization: Certificate,
}

/// Lists of byte strings (client events) encoded with `serialize_bytes`: postcard writes the same
/// bytes as for a sequence of `u8` (a length, then the bytes), but copies each string at once
/// instead of making one serde call per byte (that was 11% of a validator's time).
mod byte_strings {
    use serde::de::{SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::Bytes;

    use super::EventBytes;

    pub fn serialize<S: Serializer>(v: &[EventBytes], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|b| Bytes::new(b)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<EventBytes>, D::Error> {
        /// One byte string, copied once into its shared allocation.
        struct One(EventBytes);
        impl<'de> Deserialize<'de> for One {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<One, D::Error> {
                struct V;
                impl Visitor<'_> for V {
                    type Value = One;
                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str("a byte string")
                    }
                    fn visit_bytes<E: serde::de::Error>(self, b: &[u8]) -> Result<One, E> {
                        Ok(One(EventBytes::from(b)))
                    }
                }
                d.deserialize_bytes(V)
            }
        }
        struct List;
        impl<'de> Visitor<'de> for List {
            type Value = Vec<EventBytes>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of byte strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // The hint comes from untrusted bytes: cap the preallocation.
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4_096));
                while let Some(One(b)) = seq.next_element()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(List)
    }
}

/// A list of digests as one byte string (32 bytes each): postcard copies it at once, where a
/// `Vec<Digest>` is one serde call per byte (1,000 ids: 32,000 calls each way).
mod digest_list {
    use serde::de::{Error, Visitor};
    use serde::{Deserializer, Serializer};

    use super::Digest;

    pub fn serialize<S: Serializer>(v: &[Digest], s: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::with_capacity(v.len() * 32);
        for d in v {
            bytes.extend_from_slice(&d.0);
        }
        s.serialize_bytes(&bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Digest>, D::Error> {
        struct List;
        impl Visitor<'_> for List {
            type Value = Vec<Digest>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string of 32-byte digests")
            }
            fn visit_bytes<E: Error>(self, b: &[u8]) -> Result<Vec<Digest>, E> {
                if !b.len().is_multiple_of(32) {
                    return Err(E::invalid_length(b.len(), &self));
                }
                // (The length is the input's own: no allocation beyond the bytes received.)
                Ok(b.chunks_exact(32).map(|c| Digest(c.try_into().expect("32 bytes"))).collect())
            }
        }
        d.deserialize_bytes(List)
    }
}

/// A client event's bytes, shared: the pool, the blocks and the messages that hold an event
/// hold one allocation (a block is rebuilt from the pool without copying its events).
pub type EventBytes = std::sync::Arc<[u8]>;

const EVENT_KEY: &[u8; 32] = b"metatopia/consensus/event/v1____";

/// The id of an event: blake3 of its bytes.
pub fn event_id(bytes: &[u8]) -> Digest {
    Digest(*blake3::keyed_hash(EVENT_KEY, bytes).as_bytes())
}

/// The ids of many events, equal to [`event_id`] of each, hashed side by side in SIMD lanes
/// (`metatopia_sim::wide`: 8 or 16 at a time where the CPU has AVX2 or AVX-512, where the
/// `blake3` crate hashes a short input one at a time).
pub fn event_ids<E: AsRef<[u8]>>(events: &[E]) -> Vec<Digest> {
    let inputs: Vec<&[u8]> = events.iter().map(AsRef::as_ref).collect();
    metatopia_sim::wide::keyed_hash_many(EVENT_KEY, &inputs).into_iter().map(Digest).collect()
}

/// What a vote is for.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub enum VoteKind {
    /// "This block is a valid proposal for its view."
    Notarize,
    /// "This view failed (timed out) for me."
    Nullify,
    /// "I saw the block notarized and did not time out in its view."
    Finalize,
}

/// A signed vote.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Vote {
    pub kind: VoteKind,
    pub view: View,
    /// The block voted for; zero for nullify.
    pub digest: Digest,
    pub signer: ValidatorIndex,
    pub root: Option<RootReport>,
    pub sig: Sig,
}

/// The signed bytes of a vote. `chain` (the genesis digest of the chain or epoch the vote
/// belongs to) keeps a vote of one epoch from counting in another, where views start over.
fn vote_message(chain: &Digest, kind: VoteKind, view: View, digest: &Digest, root: &Option<RootReport>) -> Vec<u8> {
    let mut m = b"metatopia/consensus/vote/v2\0".to_vec();
    m.extend_from_slice(&chain.0);
    m.extend_from_slice(&postcard::to_allocvec(&(kind, view, digest, root)).expect("encoding into a Vec cannot fail"));
    m
}

/// A vote's authenticator for one receiver: blake3, keyed with the pairwise key of the signer
/// and that receiver, over the vote's signed bytes and its signature, cut to 16 bytes.
pub type Mac = [u8; 16];

/// The pairwise key of two validators: X25519 of one's ed25519 secret and the other's public
/// key (the same from either side), bound to the chain. Used only for [`Mac`]s.
pub fn pair_key(
    chain: &Digest,
    mine: &SigningKey,
    me: ValidatorIndex,
    theirs: &VerifyingKey,
    them: ValidatorIndex,
) -> [u8; 32] {
    let shared = theirs.to_montgomery().mul_clamped(mine.to_scalar_bytes());
    let (lo, hi) = if me <= them { (me, them) } else { (them, me) };
    let mut h = blake3::Hasher::new_derive_key("metatopia consensus vote authenticator key v1");
    h.update(shared.as_bytes());
    h.update(&chain.0);
    h.update(&lo.0.to_le_bytes());
    h.update(&hi.0.to_le_bytes());
    *h.finalize().as_bytes()
}

impl Vote {
    /// This vote's [`Mac`] under a pairwise key.
    pub fn mac(&self, chain: &Digest, key: &[u8; 32]) -> Mac {
        self.macs(chain, std::slice::from_ref(key))[0]
    }

    /// This vote's [`Mac`] under each key (its signed bytes are encoded once).
    pub fn macs(&self, chain: &Digest, keys: &[[u8; 32]]) -> Vec<Mac> {
        let mut signed = vote_message(chain, self.kind, self.view, &self.digest, &self.root);
        signed.extend_from_slice(&self.sig.0);
        signed.extend_from_slice(&self.sig.1);
        keys.iter()
            .map(|k| {
                let mut mac = [0u8; 16];
                mac.copy_from_slice(&blake3::keyed_hash(k, &signed).as_bytes()[..16]);
                mac
            })
            .collect()
    }
}

/// Remembers signature verdicts (a pure function of key, message and signature), so a vote
/// seen again inside certificates, or by several validators of a simulated cluster sharing
/// one cache, is verified once. Bounded: two generations of up to `SIG_CACHE_MAX / 2` verdicts
/// each, the older dropped whole when the newer fills (a lookup-only hash map: nothing
/// iterates it, DESIGN §5; a `BTreeMap` of 65,536 verdicts cost a validator a cache miss per
/// level on every vote checked). Signatures are checked as `verify_strict` does, from a
/// table kept per key ([`crate::strict`]: 25 µs a check here against 38).
#[derive(Debug, Default)]
pub struct SigCache {
    seen: std::sync::Mutex<Verdicts>,
    tables: std::sync::Mutex<std::collections::BTreeMap<[u8; 32], std::sync::Arc<KeyTable>>>,
}

#[allow(clippy::disallowed_types)]
#[derive(Debug, Default)]
struct Verdicts {
    new: std::collections::HashMap<[u8; 32], bool>,
    old: std::collections::HashMap<[u8; 32], bool>,
}

impl Verdicts {
    fn get(&self, id: &[u8; 32]) -> Option<bool> {
        self.new.get(id).or_else(|| self.old.get(id)).copied()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.new.len() + self.old.len()
    }
}

const SIG_CACHE_MAX: usize = 1 << 16;
/// Keys with a table (30 KB each): a validator set's, and a few epochs' more.
const KEY_TABLES_MAX: usize = 1 << 10;

impl SigCache {
    pub fn new() -> SigCache {
        SigCache::default()
    }

    fn id(key: &VerifyingKey, msg: &[u8], sig: &Sig) -> [u8; 32] {
        let mut h = blake3::Hasher::new();
        h.update(key.as_bytes());
        h.update(&sig.0);
        h.update(&sig.1);
        h.update(msg);
        *h.finalize().as_bytes()
    }

    fn verify(&self, key: &VerifyingKey, msg: &[u8], sig: &Sig) -> bool {
        let id = SigCache::id(key, msg, sig);
        if let Some(v) = self.seen.lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
            return v;
        }
        let ok = self.table(key).verify(msg, &sig.0, &sig.1);
        self.insert(id, ok);
        ok
    }

    /// The key's table, made the first time it is asked for.
    fn table(&self, key: &VerifyingKey) -> std::sync::Arc<KeyTable> {
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tables.get(key.as_bytes()) {
            return t.clone();
        }
        if tables.len() >= KEY_TABLES_MAX {
            tables.clear();
        }
        let t = std::sync::Arc::new(KeyTable::new(key));
        tables.insert(key.to_bytes(), t.clone());
        t
    }

    fn insert(&self, id: [u8; 32], ok: bool) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.new.len() >= SIG_CACHE_MAX / 2 {
            seen.old = std::mem::take(&mut seen.new);
        }
        seen.new.insert(id, ok);
    }
}

impl Vote {
    #[allow(clippy::too_many_arguments)]
    pub fn sign(
        key: &SigningKey,
        chain: &Digest,
        signer: ValidatorIndex,
        kind: VoteKind,
        view: View,
        digest: Digest,
        root: Option<RootReport>,
    ) -> Vote {
        let sig = Sig::from_dalek(key.sign(&vote_message(chain, kind, view, &digest, &root)));
        Vote { kind, view, digest, signer, root, sig }
    }

    /// Record this vote, just signed with its signer's own key, as valid in `cache` (an honest
    /// signature always verifies), so that seeing it again costs no verification.
    pub(crate) fn remember_valid(&self, chain: &Digest, keys: &[VerifyingKey], cache: &SigCache) {
        if let Some(key) = keys.get(self.signer.0 as usize) {
            let msg = vote_message(chain, self.kind, self.view, &self.digest, &self.root);
            cache.insert(SigCache::id(key, &msg, &self.sig), true);
        }
    }

    /// Check the signature against the validator set of the chain (or epoch) `chain`.
    pub fn verify(&self, chain: &Digest, keys: &[VerifyingKey], cache: &SigCache) -> bool {
        let Some(key) = keys.get(self.signer.0 as usize) else {
            return false;
        };
        cache.verify(key, &vote_message(chain, self.kind, self.view, &self.digest, &self.root), &self.sig)
    }
}

/// A quorum certificate: 2f+1 votes of one kind for one (view, digest).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Certificate {
    pub kind: VoteKind,
    pub view: View,
    pub digest: Digest,
    pub votes: Vec<Vote>,
}

/// Why a certificate is not valid.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("{got} distinct valid votes, a quorum is {quorum}")]
    NoQuorum { got: usize, quorum: usize },
    #[error("a vote does not match the certificate's kind, view or digest")]
    Mismatch,
    #[error("a vote's signature does not verify")]
    BadSignature,
}

impl Certificate {
    /// Check kind, view, digest, distinct signers, every signature, and the quorum.
    pub fn verify(
        &self,
        chain: &Digest,
        keys: &[VerifyingKey],
        quorum: usize,
        cache: &SigCache,
    ) -> Result<(), CertificateError> {
        let mut signers = BTreeSet::new();
        for v in &self.votes {
            if v.kind != self.kind || v.view != self.view || v.digest != self.digest {
                return Err(CertificateError::Mismatch);
            }
            if !v.verify(chain, keys, cache) {
                return Err(CertificateError::BadSignature);
            }
            signers.insert(v.signer);
        }
        if signers.len() < quorum {
            return Err(CertificateError::NoQuorum { got: signers.len(), quorum });
        }
        Ok(())
    }

    /// The hash of the certificate's encoding: with the block it certifies, the order seed.
    pub fn hash(&self) -> Digest {
        let bytes = postcard::to_allocvec(self).expect("encoding into a Vec cannot fail");
        Digest(*blake3::keyed_hash(b"metatopia/consensus/cert/v1_____", &bytes).as_bytes())
    }
}

/// A consensus message between validators.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Message {
    /// A leader's block with its own notarize vote, and the nullifications that justify
    /// skipping the views between the parent and this one.
    Propose {
        block: Block,
        vote: Vote,
        nullifications: Vec<Certificate>,
    },
    Vote(Vote),
    /// A certificate passed on, so that laggards catch up.
    Certificate(Certificate),
    /// Client events, disseminated to the validators' pools.
    Events(#[serde(with = "byte_strings")] Vec<EventBytes>),
    /// Ask for a block by digest (to finish a commit or catch up).
    Fetch(Digest),
    /// The answer to `Fetch`, with the certificate that notarized it, and its leader's notarize
    /// vote (the proposal's signature): a validator whose copy of the proposal was lost takes
    /// the block as the proposal with it.
    Block {
        block: Block,
        notarization: Option<Certificate>,
        leader_vote: Option<Box<Vote>>,
    },
    /// A compact proposal, what a leader sends: the block's header (`block.events` empty) and
    /// its events' ids. The events were disseminated to the pools before (`Events`), so a
    /// validator rebuilds the block from its pool, and fetches it when any event is missing.
    /// A thirtieth of the bytes of a full proposal of 100-byte events, and no event is decoded
    /// or hashed again on the commit's path.
    ProposeIds {
        block: Block,
        #[serde(with = "digest_list")]
        ids: Vec<Digest>,
        vote: Vote,
        nullifications: Vec<Certificate>,
    },
    /// A vote or proposal from its signer with an authenticator (PBFT's term): one [`Mac`] per
    /// validator, by index. A receiver whose MAC checks knows the vote is its signer's, counts
    /// it at once and checks the ed25519 signature a little later, off the commit's path; the
    /// signature is what makes certificates transferable. Anything else inside is ignored.
    Authenticated {
        inner: Box<Signed>,
        macs: Vec<Mac>,
    },
    /// A compact proposal whose events are named as runs of the gossip batches they came in
    /// (every validator got each batch, as one `Events` message), and by id where a batch is
    /// not (or no longer) to be counted on: a few hundred bytes for 1,000 events instead of
    /// 32 KB, found with a lookup a run instead of one an event. The block is the same, and
    /// so is its digest (over its header and its events' ids).
    ProposeRefs {
        block: Block,
        pieces: Vec<Piece>,
        vote: Vote,
        nullifications: Vec<Certificate>,
    },
}

/// What a compact proposal names its events by, in order ([`Message::ProposeRefs`]).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Piece {
    /// Events `start .. start + len` of the gossip batch named `batch`: the blake3 hash (key
    /// derived from "metatopia consensus gossip batch v1") of its events' ids in order.
    Run { batch: Digest, start: u32, len: u32 },
    /// Events by id.
    Ids(#[serde(with = "digest_list")] Vec<Digest>),
}

impl Piece {
    /// How many events it names.
    pub fn len(&self) -> usize {
        match self {
            Piece::Run { len, .. } => *len as usize,
            Piece::Ids(ids) => ids.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What an authenticator carries: a vote, or a proposal with its leader's vote (the same
/// fields as the [`Message`] variants of those names; a type of its own so that authenticators
/// cannot nest).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Signed {
    Vote(Vote),
    Propose {
        block: Block,
        vote: Vote,
        nullifications: Vec<Certificate>,
    },
    ProposeIds {
        block: Block,
        #[serde(with = "digest_list")]
        ids: Vec<Digest>,
        vote: Vote,
        nullifications: Vec<Certificate>,
    },
    ProposeRefs {
        block: Block,
        pieces: Vec<Piece>,
        vote: Vote,
        nullifications: Vec<Certificate>,
    },
}

impl Signed {
    /// A vote or proposal as a [`Signed`]; anything else back as it was.
    pub fn from_message(m: Message) -> Result<Signed, Box<Message>> {
        match m {
            Message::Vote(v) => Ok(Signed::Vote(v)),
            Message::Propose { block, vote, nullifications } => Ok(Signed::Propose { block, vote, nullifications }),
            Message::ProposeIds { block, ids, vote, nullifications } => {
                Ok(Signed::ProposeIds { block, ids, vote, nullifications })
            }
            Message::ProposeRefs { block, pieces, vote, nullifications } => {
                Ok(Signed::ProposeRefs { block, pieces, vote, nullifications })
            }
            m => Err(Box::new(m)),
        }
    }

    pub fn into_message(self) -> Message {
        match self {
            Signed::Vote(v) => Message::Vote(v),
            Signed::Propose { block, vote, nullifications } => Message::Propose { block, vote, nullifications },
            Signed::ProposeIds { block, ids, vote, nullifications } => {
                Message::ProposeIds { block, ids, vote, nullifications }
            }
            Signed::ProposeRefs { block, pieces, vote, nullifications } => {
                Message::ProposeRefs { block, pieces, vote, nullifications }
            }
        }
    }

    pub fn vote(&self) -> &Vote {
        match self {
            Signed::Vote(v)
            | Signed::Propose { vote: v, .. }
            | Signed::ProposeIds { vote: v, .. }
            | Signed::ProposeRefs { vote: v, .. } => v,
        }
    }
}

impl Message {
    /// Bounded decoding of untrusted bytes.
    pub fn decode(bytes: &[u8], max_bytes: usize) -> Result<Message, DecodeError> {
        if bytes.len() > max_bytes {
            return Err(DecodeError::TooLarge { len: bytes.len(), max: max_bytes });
        }
        let (m, rest) = postcard::take_from_bytes(bytes).map_err(|e| DecodeError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(DecodeError::Malformed(format!("{} trailing bytes", rest.len())));
        }
        Ok(m)
    }

    pub fn encode(&self) -> Vec<u8> {
        // Into a buffer sized once: grown by doubling, a compact proposal's 32 KB was copied
        // five times, into fresh memory each time (page faults on the commit's path: its
        // encoding took 54 µs of the leader's thread CPU in `bench agreement`, now ~40).
        postcard::to_extend(self, Vec::with_capacity(self.size_hint())).expect("encoding into a Vec cannot fail")
    }

    /// About the encoded size (at least the bulk of it: ids and events).
    fn size_hint(&self) -> usize {
        let events = |es: &[EventBytes]| es.iter().map(|e| e.len() + 4).sum::<usize>();
        256 + match self {
            Message::Authenticated { inner, macs } => {
                macs.len() * 32
                    + match &**inner {
                        Signed::Vote(_) => 0,
                        Signed::Propose { block, .. } => events(&block.events) + 1024,
                        Signed::ProposeIds { ids, .. } => ids.len() * 32 + 1024,
                        Signed::ProposeRefs { pieces, .. } => Message::pieces_hint(pieces) + 1024,
                    }
            }
            Message::Propose { block, .. } | Message::Block { block, .. } => events(&block.events) + 1024,
            Message::ProposeIds { ids, .. } => ids.len() * 32 + 1024,
            Message::ProposeRefs { pieces, .. } => Message::pieces_hint(pieces) + 1024,
            Message::Events(es) => events(es),
            Message::Certificate(c) => c.votes.len() * 192,
            Message::Vote(_) | Message::Fetch(_) => 0,
        }
    }

    fn pieces_hint(pieces: &[Piece]) -> usize {
        pieces.iter().map(|p| if let Piece::Ids(ids) = p { ids.len() * 32 + 4 } else { 48 }).sum()
    }

    /// The vote a vote or proposal carries (inside an authenticator too).
    pub fn vote(&self) -> Option<&Vote> {
        match self {
            Message::Vote(v)
            | Message::Propose { vote: v, .. }
            | Message::ProposeIds { vote: v, .. }
            | Message::ProposeRefs { vote: v, .. } => Some(v),
            Message::Authenticated { inner, .. } => Some(inner.vote()),
            _ => None,
        }
    }

    /// The message without its authenticator.
    pub fn unauthenticated(self) -> Message {
        match self {
            Message::Authenticated { inner, .. } => (*inner).into_message(),
            m => m,
        }
    }

    fn vote_kind(v: &Vote) -> &'static str {
        match v.kind {
            VoteKind::Notarize => "notarize",
            VoteKind::Nullify => "nullify",
            VoteKind::Finalize => "finalize",
        }
    }

    /// A short name, for traces and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Authenticated { inner, .. } => match &**inner {
                Signed::Vote(v) => Message::vote_kind(v),
                Signed::Propose { .. } | Signed::ProposeIds { .. } | Signed::ProposeRefs { .. } => "propose",
            },
            Message::Propose { .. } | Message::ProposeIds { .. } | Message::ProposeRefs { .. } => "propose",
            Message::Vote(v) => Message::vote_kind(v),
            Message::Certificate(_) => "certificate",
            Message::Events(_) => "events",
            Message::Fetch(_) => "fetch",
            Message::Block { .. } => "block",
        }
    }
}

/// Why bytes are not a message.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("message is {len} bytes, the limit is {max}")]
    TooLarge { len: usize, max: usize },
    #[error("malformed message: {0}")]
    Malformed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lists_keep_the_sequence_encoding() {
        let events = vec![b"signed event".to_vec(), Vec::new(), vec![0xff; 300]];
        let m = Message::Events(events.iter().map(|e| EventBytes::from(&e[..])).collect());
        // Variant 3, then exactly what a plain `Vec<Vec<u8>>` encodes to.
        let plain = [vec![3u8], postcard::to_allocvec(&events).unwrap()].concat();
        assert_eq!(m.encode(), plain);
        assert_eq!(Message::decode(&plain, 1 << 20).unwrap(), m);
        // A length prefix larger than the input is an error, not an allocation.
        let lying = [3u8, 0xff, 0xff, 0xff, 0x0f, 1, 2];
        assert!(Message::decode(&lying, 1 << 20).is_err());
    }

    #[test]
    fn a_compact_proposal_carries_its_ids_as_one_byte_string_and_rejects_a_partial_id() {
        let key = SigningKey::from_bytes(&[4; 32]);
        let block = Block {
            view: View(2),
            leader: ValidatorIndex(0),
            parent: Parent { view: View(1), digest: Digest([9; 32]) },
            tick: Tick(1),
            time_ms: 5,
            events: Vec::new(),
            parent_certificate: None,
        };
        let ids: Vec<Digest> = (0..40u8).map(|i| Digest([i; 32])).collect();
        let vote =
            Vote::sign(&key, &Digest([1; 32]), ValidatorIndex(0), VoteKind::Notarize, View(2), block.digest(), None);
        let m = Message::ProposeIds {
            block: block.clone(),
            ids: ids.clone(),
            vote: vote.clone(),
            nullifications: Vec::new(),
        };
        let bytes = m.encode();
        assert_eq!(Message::decode(&bytes, 1 << 20).unwrap(), m);
        // Encoding into a buffer sized ahead gives postcard's own bytes, for every kind.
        let events: Vec<EventBytes> = (0..5u8).map(|i| vec![i; 100 + i as usize].into()).collect();
        let others = [
            Message::Vote(vote.clone()),
            Message::Events(events.clone()),
            Message::Propose {
                block: Block { events, ..block.clone() },
                vote: vote.clone(),
                nullifications: Vec::new(),
            },
            Message::Authenticated { inner: Box::new(Signed::Vote(vote.clone())), macs: vec![[7; 16]; 4] },
            Message::Fetch(Digest([3; 32])),
            m.clone(),
            Message::ProposeRefs {
                block: block.clone(),
                pieces: vec![
                    Piece::Run { batch: Digest([5; 32]), start: 3, len: 250 },
                    Piece::Ids(ids[..3].to_vec()),
                    Piece::Run { batch: Digest([6; 32]), start: 0, len: 1 },
                ],
                vote: vote.clone(),
                nullifications: Vec::new(),
            },
        ];
        for o in others {
            let bytes = o.encode();
            assert_eq!(bytes, postcard::to_allocvec(&o).unwrap(), "{}", o.kind());
            assert_eq!(Message::decode(&bytes, 1 << 20).unwrap(), o);
            for cut in 0..bytes.len() {
                assert!(Message::decode(&bytes[..cut], 1 << 20).is_err(), "{} cut at {cut}", o.kind());
            }
        }
        // The ids are one run of 40 × 32 bytes, after a varint length of 1,280 (0x80 0x0a).
        let run: Vec<u8> = ids.iter().flat_map(|d| d.0).collect();
        let at = bytes.windows(run.len()).position(|w| w == run).expect("the ids in one run");
        assert_eq!(&bytes[at - 2..at], &[0x80, 0x0a]);
        // A byte string that is not a whole number of ids is an error.
        let mut short = bytes.clone();
        short[at - 2..at].copy_from_slice(&[0xff, 0x09]); // length 1,279: the last id cut
        short.remove(at + run.len() - 1);
        assert!(matches!(Message::decode(&short, 1 << 20), Err(DecodeError::Malformed(_))));
    }

    #[test]
    fn the_verdicts_kept_are_bounded_and_the_newest_are_kept() {
        let cache = SigCache::new();
        for i in 0..(SIG_CACHE_MAX as u32 * 2 + 5) {
            let mut id = [0u8; 32];
            id[..4].copy_from_slice(&i.to_le_bytes());
            cache.insert(id, i % 3 == 0);
        }
        let seen = cache.seen.lock().unwrap();
        assert!(seen.len() <= SIG_CACHE_MAX, "{} verdicts kept", seen.len());
        for i in (SIG_CACHE_MAX as u32 * 2 + 5 - SIG_CACHE_MAX as u32 / 2)..(SIG_CACHE_MAX as u32 * 2 + 5) {
            let mut id = [0u8; 32];
            id[..4].copy_from_slice(&i.to_le_bytes());
            assert_eq!(seen.get(&id), Some(i % 3 == 0), "verdict {i}");
        }
    }

    #[test]
    fn an_own_vote_is_remembered_as_valid_and_nothing_else_is() {
        let key = SigningKey::from_bytes(&[4; 32]);
        let keys = vec![key.verifying_key()];
        let chain = Digest([1; 32]);
        let cache = SigCache::new();
        let vote = Vote::sign(&key, &chain, ValidatorIndex(0), VoteKind::Finalize, View(3), Digest([2; 32]), None);
        vote.remember_valid(&chain, &keys, &cache);
        let verdicts = |c: &SigCache| c.seen.lock().unwrap().len();
        assert_eq!(verdicts(&cache), 1);
        // Seeing it again is a cache hit (no new verdict) and valid.
        assert!(vote.verify(&chain, &keys, &cache));
        assert_eq!(verdicts(&cache), 1);
        // Anything else is verified on its own merits.
        let mut bad_sig = vote.clone();
        bad_sig.sig.0[0] ^= 1;
        let mut other_root = vote.clone();
        other_root.root = Some(RootReport { tick: Tick(1), root: Digest([3; 32]) });
        assert!(!bad_sig.verify(&chain, &keys, &cache));
        assert!(!other_root.verify(&chain, &keys, &cache));
        assert!(!vote.verify(&Digest([9; 32]), &keys, &cache), "another chain's vote");
        assert_eq!(verdicts(&cache), 4);
    }
}
