//! Who is who on the mesh: peer index <-> key <-> peer id, which nodes are listed, connected,
//! of other sims, or outside the list and not asking yet (see the module above).

use std::collections::{BTreeMap, BTreeSet};

use libp2p::{PeerId, identity};
use metatopia_consensus::VerifyingKey;

use crate::net::card::peer_id;

/// Nodes outside the config's list this node serves at the same time (followers that joined).
pub const MAX_UNLISTED: usize = 64;
/// Peer indices stay below this (the agreement numbers senders outside a validator set from
/// 0x8000 up).
const MAX_INDEX: usize = 0x4000;

/// The node key behind a peer id, when it is an ed25519 key (inlined in the id).
pub fn peer_key(peer: &PeerId) -> Option<VerifyingKey> {
    let hash: &libp2p::multihash::Multihash<64> = peer.as_ref();
    if hash.code() != 0 {
        return None;
    }
    let public = identity::PublicKey::try_decode_protobuf(hash.digest()).ok()?.try_into_ed25519().ok()?;
    VerifyingKey::from_bytes(&public.to_bytes()).ok()
}

/// Who is who: peer index <-> key <-> peer id.
#[derive(Debug)]
pub(super) struct Book {
    pub(super) keys: Vec<VerifyingKey>,
    pub(super) by_peer: BTreeMap<PeerId, u16>,
    pub(super) listed: usize,
    pub(super) me: PeerId,
    /// Peers with at least one open connection.
    pub(super) connected: BTreeSet<PeerId>,
    /// Indices of nodes of other sims (neighbour sims' validators): messaged, not broadcast to.
    pub(super) outsiders: BTreeSet<u16>,
    /// Nodes of the world: keys from the config, the genesis or a card (not a node that just
    /// connected). Only they may hold a reservation on this node's relay.
    pub(super) members: BTreeSet<PeerId>,
    /// Indices of unlisted nodes that disconnected, given to the next ones (so strangers that
    /// come and go cannot use the index space up).
    pub(super) freed: BTreeSet<u16>,
    /// Unlisted nodes that have not asked for the sim's messages yet (a join, a snapshot, a
    /// consensus message): left out of broadcasts until they do.
    pub(super) quiet: BTreeSet<u16>,
}

impl Book {
    /// The index of the node with this key, numbering it next if it is new and there is room.
    pub(super) fn number_key(&mut self, key: VerifyingKey) -> Option<u16> {
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
        self.members.insert(id);
        Some(i)
    }

    /// The index of `peer`, numbering an unlisted one if there is room (`Some((index, new))`).
    pub(super) fn index(&mut self, peer: &PeerId) -> Option<(u16, bool)> {
        if let Some(&i) = self.by_peer.get(peer) {
            return Some((i, false));
        }
        let key = peer_key(peer)?;
        let unlisted = self
            .connected
            .iter()
            .filter(|p| self.by_peer.get(p).is_none_or(|&i| usize::from(i) >= self.listed))
            .count();
        if unlisted >= MAX_UNLISTED {
            return None;
        }
        let i = match self.freed.pop_first() {
            Some(i) => {
                self.keys[usize::from(i)] = key;
                i
            }
            None if self.keys.len() < MAX_INDEX => {
                self.keys.push(key);
                (self.keys.len() - 1) as u16
            }
            None => return None,
        };
        self.by_peer.insert(*peer, i);
        if !self.members.contains(peer) {
            self.quiet.insert(i);
        }
        Some((i, true))
    }

    /// `peer` has no connection left: an unlisted node's index is freed (a node of the world
    /// keeps its own). The index freed, if it was.
    pub(super) fn release(&mut self, peer: &PeerId) -> Option<u16> {
        self.connected.remove(peer);
        let i = *self.by_peer.get(peer)?;
        if usize::from(i) < self.listed || self.members.contains(peer) || self.outsiders.contains(&i) {
            return None;
        }
        self.by_peer.remove(peer);
        self.quiet.remove(&i);
        self.freed.insert(i);
        Some(i)
    }
}
