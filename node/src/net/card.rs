//! A node's signed card: its key, sim, point in the world, addresses (direct, and through the
//! relays a node behind a NAT holds reservations on) and when it was signed, as it travels in
//! the overlay's messages (see [`crate::overlay`] for how cards are used).

use std::net::SocketAddr;

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;
use metatopia_raynet::{Entry, PeerId, Point};
use serde::{Deserialize, Serialize};

/// Domain separation of card signatures.
const CARD_DOMAIN: &[u8] = b"metatopia/raynet-card/v1";
/// Coordinates beyond this (metres) are refused: no world is that large, and it keeps the
/// overlay's arithmetic finite.
pub const MAX_COORD: f64 = 1.0e9;

/// What a node says about itself in the overlay, signed by its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CardBody {
    pub key: [u8; 32],
    pub sim: u32,
    /// Its point in the world, metres (inside its sim's square).
    pub pos: [i64; 2],
    /// Its peers' TCP address, which is also where clients reach it (QUIC, UDP, same port).
    pub addr: SocketAddr,
    /// Its peers' QUIC address, if it has one.
    pub quic: Option<SocketAddr>,
    /// When the card was signed (unix ms; at the node's start, and again whenever its relayed
    /// addresses change): the newer of two cards of a key wins.
    pub since_ms: u64,
    /// Its HTTP service (the web viewer and its WebSocket), if it serves one: clients of other
    /// sims are sent there (a viewer draws the sims around its own from their nodes).
    pub http: Option<SocketAddr>,
    /// Where it is reached through relays (`RELAY_ADDR/p2p/RELAY/p2p-circuit/p2p/NODE`), when it
    /// is behind a NAT: at most [`MAX_RELAYED`], so a node of any sim can dial it, whether or
    /// not they share a relay.
    pub relayed: Vec<String>,
}

/// Relayed addresses a card carries at most.
pub const MAX_RELAYED: usize = 4;
/// Bytes one relayed address takes at most (as text).
const MAX_RELAYED_LEN: usize = 256;

impl CardBody {
    /// Its HTTP service as a client reaches it: a service bound to every interface
    /// (`0.0.0.0:PORT`) is at the card's peer address's IP.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.map(|h| if h.ip().is_unspecified() { SocketAddr::new(self.addr.ip(), h.port()) } else { h })
    }

    /// Its relayed addresses, each checked to be a circuit to this card's node.
    pub fn relayed_addrs(&self) -> Result<Vec<Multiaddr>, String> {
        if self.relayed.len() > MAX_RELAYED {
            return Err(format!("card with {} relayed addresses (at most {MAX_RELAYED})", self.relayed.len()));
        }
        let key = VerifyingKey::from_bytes(&self.key).map_err(|_| "card key is not an ed25519 point".to_owned())?;
        let me = peer_id(&key);
        self.relayed
            .iter()
            .map(|a| {
                if a.len() > MAX_RELAYED_LEN {
                    return Err(format!("card relayed address of {} bytes", a.len()));
                }
                let m: Multiaddr = a.parse().map_err(|e| format!("card relayed address {a:?}: {e}"))?;
                let circuit = m.iter().any(|p| p == Protocol::P2pCircuit);
                if !circuit || m.iter().last() != Some(Protocol::P2p(me)) {
                    return Err(format!("card relayed address {a} is not a circuit to the card's node"));
                }
                Ok(m)
            })
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Card {
    pub body: CardBody,
    pub sig: Vec<u8>,
}

fn card_message(body: &CardBody) -> Vec<u8> {
    let mut m = CARD_DOMAIN.to_vec();
    m.extend(postcard::to_allocvec(body).expect("encoding into a Vec cannot fail"));
    m
}

impl Card {
    pub fn sign(key: &SigningKey, body: CardBody) -> Card {
        let sig = key.sign(&card_message(&body)).to_bytes().to_vec();
        Card { body, sig }
    }

    /// Whether the card is well formed and signed by its key.
    pub fn check(&self) -> Result<(), String> {
        let [x, y] = self.body.pos;
        if (x as f64).abs() > MAX_COORD || (y as f64).abs() > MAX_COORD {
            return Err(format!("card point ({x}, {y}) is outside the world"));
        }
        self.body.relayed_addrs()?;
        let key =
            VerifyingKey::from_bytes(&self.body.key).map_err(|_| "card key is not an ed25519 point".to_owned())?;
        let sig: [u8; 64] =
            self.sig.as_slice().try_into().map_err(|_| format!("card signature of {} bytes", self.sig.len()))?;
        key.verify(&card_message(&self.body), &Signature::from_bytes(&sig))
            .map_err(|_| "card signature does not check".to_owned())
    }

    /// Its Raynet id.
    pub fn id(&self) -> PeerId {
        raynet_id(&self.body.key)
    }

    pub fn point(&self) -> Point {
        Point::new(self.body.pos[0] as f64, self.body.pos[1] as f64)
    }

    pub(crate) fn entry(&self) -> Entry {
        Entry { id: self.id(), pos: self.point(), age: 0 }
    }
}

/// A node's libp2p peer id: its ed25519 node key, inlined.
pub fn peer_id(key: &VerifyingKey) -> libp2p::PeerId {
    let public = libp2p::identity::ed25519::PublicKey::try_from_bytes(key.as_bytes())
        .expect("an ed25519-dalek verifying key is a valid ed25519 public key");
    libp2p::identity::PublicKey::from(public).to_peer_id()
}

/// A key's Raynet id: the first 8 bytes of its blake3 hash.
pub fn raynet_id(key: &[u8; 32]) -> PeerId {
    let h = blake3::hash(key);
    u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"))
}
