//! The node's reach beyond its sim: its [`Overlay`] on the [`Mesh`].
//!
//! Raynet messages and cards travel as node messages over the mesh. A node says hello (its card)
//! to its contacts — its own sim's nodes, `[raynet] bootstrap`, the `[[sims]]` validators listed
//! with an address, its join node — until they answer with theirs; from then on Raynet brings it
//! everyone else. Nodes of other sims are outsiders of the mesh (messaged, never broadcast to).
//! What it learns is kept here: the nodes of every other sim it met, by sim — those its neighbour
//! sims' genesis names get the sim's mail, and all are where clients are sent for that sim.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;

use metatopia_consensus::{SigningKey, VerifyingKey};
use metatopia_sim::SimId;

use crate::api::hub::Hub;
use crate::net::wire::NodeMsg;
use crate::net::{Mesh, PeerAddr};
use crate::overlay::{Card, CardBody, Overlay, OverlayEvent};

/// Nodes kept per sim that are not its genesis validators.
const MAX_PER_SIM: usize = 16;

/// A node of another sim, as far as this node knows it.
#[derive(Clone, Debug)]
struct Known {
    /// Its peer index, once it is dialled (the neighbours' validators at once, others when a
    /// message is first sent to them).
    index: Option<u16>,
    addr: SocketAddr,
    card: Card,
    /// One of the validators its sim's genesis names (for neighbour sims).
    genesis: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub struct Reach {
    overlay: Overlay,
    mesh: Mesh,
    sim: u32,
    /// Contacts said hello to, whose card has not come yet (their hello is sent again each round).
    contacts: Vec<(u16, VerifyingKey)>,
    /// Nodes of other sims by sim, then by key.
    others: BTreeMap<u32, BTreeMap<[u8; 32], Known>>,
    neighbours: BTreeSet<u32>,
    hub: Option<Arc<Hub>>,
    found: VecDeque<OverlayEvent>,
    /// Lines to print (what was found).
    pub said: VecDeque<String>,
}

impl Reach {
    /// `neighbours`: each neighbour sim with the centre of its square and its genesis validators.
    pub fn new(
        overlay: Overlay,
        mesh: Mesh,
        neighbours: BTreeMap<SimId, ([i64; 2], BTreeSet<[u8; 32]>)>,
        hub: Option<Arc<Hub>>,
    ) -> Reach {
        let sim = overlay.card().body.sim;
        let mut r = Reach {
            overlay,
            mesh,
            sim,
            contacts: Vec::new(),
            others: BTreeMap::new(),
            neighbours: neighbours.keys().map(|s| s.0).collect(),
            hub,
            found: VecDeque::new(),
            said: VecDeque::new(),
        };
        for (s, (centre, validators)) in neighbours {
            r.overlay.want_sim(s.0, centre, validators);
        }
        r
    }

    pub fn overlay(&self) -> &Overlay {
        &self.overlay
    }

    /// Say hello to this node (its sim unknown) until it answers.
    pub fn contact(&mut self, peer: PeerAddr) {
        if peer.key.as_bytes() == &self.overlay.card().body.key {
            return;
        }
        let index = self.mesh.index_of(&peer.key).or_else(|| self.mesh.add_contact(peer.clone()));
        if let Some(i) = index
            && !self.contacts.iter().any(|(j, _)| *j == i)
        {
            self.contacts.push((i, peer.key));
            self.mesh.send(i, &self.overlay.hello());
        }
    }

    /// A node of another sim listed with its address (`[[sims]]`): an outsider, and a contact.
    pub fn contact_outsider(&mut self, peer: PeerAddr) {
        if let Some(&i) = self.mesh.add_outsiders(vec![peer.clone()]).first() {
            self.contacts.push((i, peer.key));
            self.mesh.send(i, &self.overlay.hello());
        }
    }

    /// Sign this node's card again when the relays it is reached through changed (a node behind
    /// a NAT: its card tells the world's nodes where to dial it), and send it at once to the
    /// nodes of other sims it is in touch with (the overlay's messages carry it to the rest).
    pub fn refresh_card(&mut self, key: &SigningKey, now_ms: u64) {
        let relayed: Vec<String> = self.mesh.relayed_addresses().iter().map(ToString::to_string).collect();
        let me = self.overlay.card();
        if me.body.relayed == relayed {
            return;
        }
        tracing::info!(relays = relayed.len(), "the card names the relays this node is reached through");
        let body = CardBody { relayed, since_ms: now_ms.max(me.body.since_ms + 1), ..me.body.clone() };
        self.overlay.set_card(Card::sign(key, body));
        let hello = NodeMsg::Cards { cards: vec![self.overlay.card().clone()], reply: false };
        for i in self.others.values().flat_map(|m| m.values().filter_map(|k| k.index)) {
            self.mesh.send(i, &hello);
        }
    }

    /// One gossip round (the loop's timer).
    pub fn round(&mut self) {
        self.overlay.round();
        let hello = self.overlay.hello();
        let overlay = &self.overlay;
        self.contacts.retain(|(_, k)| overlay.card_of(k.as_bytes()).is_none());
        for (i, _) in &self.contacts {
            self.mesh.send(*i, &hello);
        }
        self.flush();
    }

    /// Take an overlay message from peer `from` (Raynet, cards); any other is handed back.
    pub fn handle(&mut self, from: u16, msg: NodeMsg) -> Option<NodeMsg> {
        if !matches!(msg, NodeMsg::Raynet { .. } | NodeMsg::Cards { .. } | NodeMsg::SimCards { .. }) {
            return Some(msg);
        }
        let key = self.mesh.key_of(from)?;
        self.overlay.handle(&key, msg);
        if self.overlay.card_of(key.as_bytes()).is_some_and(|c| c.body.sim != self.sim) {
            self.mesh.mark_outsider(from);
        }
        self.flush();
        None
    }

    /// The world's record of its neighbours' validators (each neighbour's mail names its set,
    /// which changes at its epoch boundaries): look for the new ones, and send the sim's mail to
    /// the validators of now.
    pub fn update_neighbours(&mut self, neighbours: BTreeMap<SimId, ([i64; 2], BTreeSet<[u8; 32]>)>) {
        for (s, (centre, validators)) in neighbours {
            if self.overlay.wanted_validators(s.0) == Some(&validators) {
                continue;
            }
            if let Some(m) = self.others.get_mut(&s.0) {
                for (k, n) in m.iter_mut() {
                    n.genesis = validators.contains(k);
                }
            }
            self.said.push_back(format!(
                "neighbour sim {} has {} validators now: looking for them",
                s.0,
                validators.len()
            ));
            self.overlay.want_sim(s.0, centre, validators);
            self.neighbours.insert(s.0);
        }
        self.flush();
    }

    /// Look up the node nearest this point; the answer comes from [`Reach::poll_found`].
    pub fn lookup(&mut self, point: [i64; 2]) -> u64 {
        let q = self.overlay.lookup(point);
        self.flush();
        q
    }

    /// Answers to [`Reach::lookup`].
    pub fn poll_found(&mut self) -> Option<OverlayEvent> {
        self.found.pop_front()
    }

    /// The peer indices of the genesis validators of neighbour sim `sim` met so far, in key order.
    pub fn neighbour_nodes(&self, sim: SimId) -> Vec<u16> {
        self.others
            .get(&sim.0)
            .map_or_else(Vec::new, |m| m.values().filter(|k| k.genesis).filter_map(|k| k.index).collect())
    }

    /// The other sims this node knows a node of (at most `max`), each with the peer index of one
    /// of them (chosen by `pick`), dialled if need be.
    pub fn one_node_of_each(&mut self, pick: usize, max: usize) -> BTreeMap<SimId, u16> {
        let chosen: Vec<(u32, Card)> = self
            .others
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .take(max)
            .filter_map(|(s, m)| m.values().nth(pick % m.len()).map(|k| (*s, k.card.clone())))
            .collect();
        let mut out = BTreeMap::new();
        for (s, card) in chosen {
            if let Some(i) = self.index_for(&card) {
                if let Some(k) = self.others.get_mut(&s).and_then(|m| m.get_mut(&card.body.key)) {
                    k.index = Some(i);
                }
                out.insert(SimId(s), i);
            }
        }
        out
    }

    /// The other sim this peer index is a node of.
    pub fn sim_of(&self, index: u16) -> Option<SimId> {
        self.others.iter().find(|(_, m)| m.values().any(|k| k.index == Some(index))).map(|(s, _)| SimId(*s))
    }

    /// Neighbour sims, each with how many of its genesis validators are known.
    pub fn neighbour_counts(&self) -> BTreeMap<u32, usize> {
        self.neighbours.iter().map(|s| (*s, self.neighbour_nodes(SimId(*s)).len())).collect()
    }

    fn index_for(&mut self, card: &Card) -> Option<u16> {
        let peer = PeerAddr::of_card(&card.body)?;
        if card.body.sim == self.sim {
            return self.mesh.index_of(&peer.key).or_else(|| self.mesh.add_contact(peer));
        }
        if let Some(k) = self.others.get(&card.body.sim).and_then(|m| m.get(&card.body.key))
            && k.addr == card.body.addr
            && k.card.body.relayed == card.body.relayed
            && k.index.is_some()
        {
            return k.index;
        }
        let i = *self.mesh.add_outsiders(vec![peer]).first()?;
        Some(i)
    }

    /// Send what the overlay has for others; take in what it found.
    fn flush(&mut self) {
        while let Some((card, msg)) = self.overlay.poll_send() {
            match self.index_for(&card) {
                Some(i) => self.mesh.send(i, &msg),
                None => self.overlay.unreachable(&card, msg),
            }
        }
        while let Some(e) = self.overlay.poll_event() {
            match e {
                OverlayEvent::SimNode { sim, card, genesis } => {
                    // Other sims' nodes are remembered (a few per sim: where clients go); the
                    // neighbours' validators are dialled at once (their mail).
                    let known = self.others.get(&sim).map_or(0, BTreeMap::len);
                    let had = self.others.get(&sim).and_then(|m| m.get(&card.body.key)).and_then(|k| k.index);
                    if !genesis && known >= MAX_PER_SIM && had.is_none() {
                        continue;
                    }
                    let index = if genesis || had.is_some() { self.index_for(&card) } else { None };
                    let nodes = self.others.entry(sim).or_default();
                    let new = !nodes.contains_key(&card.body.key);
                    let addr = card.body.addr;
                    nodes.insert(card.body.key, Known { index, addr, card: card.clone(), genesis });
                    if new && genesis {
                        let n = nodes.values().filter(|k| k.genesis).count();
                        self.said.push_back(format!(
                            "found validator {} of neighbour sim {sim} through Raynet at {} ({n} known)",
                            &metatopia_sim::ids::hex(&card.body.key)[..8],
                            card.body.addr
                        ));
                    }
                    if let Some(hub) = &self.hub {
                        // Genesis validators first: they are the sim's own, the others' word
                        // about their sim is their own.
                        let mut all: Vec<(&[u8; 32], &Known)> = nodes.iter().collect();
                        all.sort_by_key(|(k, n)| (!n.genesis, **k));
                        let addrs = all
                            .into_iter()
                            .map(|(k, n)| {
                                let mut a = metatopia_client::proto::NodeAddr::at(metatopia_sim::ids::hex(k), n.addr);
                                if let Some(http) = n.card.body.http_addr() {
                                    a.http = Some(http.to_string());
                                }
                                a
                            })
                            .collect();
                        hub.set_sim_nodes(sim, addrs);
                    }
                }
                e => self.found.push_back(e),
            }
        }
    }
}
