//! The node's place in the Raynet overlay (DESIGN §9), sans-IO: every node of the world is a
//! Raynet peer at a point of its sim's square, and this is how sims find their neighbours and
//! how a node finds a node of another sim — by routing to a point of that sim's square.
//!
//! Raynet itself knows peers only as an id and a point. A node also needs a key and an address
//! to reach one, so every node signs a **card** (its key, sim, point, addresses, start time) and
//! cards travel beside the Raynet messages that name their peers. A card is taken only when its
//! signature checks, and a Raynet entry only when its card is known (its point is the card's,
//! whatever the entry says); a newer card of the same key replaces an older one (a restarted node
//! at a new address). Cards give reachability, not trust: a sim takes a neighbour's mail only when
//! f + 1 of the validators its genesis names signed it, and clients pin the key of the node they
//! are sent to; so a card lying about its sim can only make itself unreachable for that sim's work.
//!
//! The node's loop drives an [`Overlay`]: [`Overlay::round`] on a timer, [`Overlay::handle`] for
//! what arrives, and it sends what [`Overlay::poll_send`] gives to the card's node. For each
//! neighbour sim ([`Overlay::want_sim`]) the overlay looks up the centre of its square until it
//! knows a node there, asks that node for its sim's cards, and reports every node of the sim
//! it learns as [`OverlayEvent::SimNode`].

pub mod reach;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ed25519_dalek::VerifyingKey;
use metatopia_raynet::{Config, Entry, Event, Msg, Peer, PeerId, Point, Purpose};

pub use crate::net::card::{Card, CardBody, MAX_COORD, raynet_id};
use crate::net::wire::NodeMsg;

/// Cards taken from one message.
pub const MAX_CARDS: usize = 64;
/// Entries (samples, neighbours, visited peers) in one Raynet message.
pub const MAX_ENTRIES: usize = 64;
/// Cards a node keeps (the nearest and the newest matter; beyond this the oldest go).
pub const MAX_BOOK: usize = 4096;
/// Rounds between two lookups for the same neighbour sim while none of its nodes is known, and
/// between two refreshes of its cards once they are.
const LOOKUP_EVERY: u64 = 2;
const REFRESH_EVERY: u64 = 20;

/// A node's point: the centre of its sim's square (origin, side in metres), moved by up to a
/// quarter of the side in each direction by its key — so the node nearest a sim's centre is
/// always one of that sim's (another sim's node is at least three quarters of a side away).
pub fn node_point(key: &[u8; 32], origin: [i64; 2], size: i64) -> [i64; 2] {
    let h = blake3::hash(key);
    let b = h.as_bytes();
    let quarter = (size / 4).max(1);
    let off = |i: usize| {
        let r = u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        (r % (2 * quarter as u64 + 1)) as i64 - quarter
    };
    [origin[0] + size / 2 + off(8), origin[1] + size / 2 + off(16)]
}

/// What the overlay tells the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OverlayEvent {
    /// A node of another sim, with its card (first met, or a newer card); `genesis`: it is one
    /// of the validators that sim's genesis names (for a neighbour sim given to [`Overlay::want_sim`]).
    SimNode { sim: u32, card: Card, genesis: bool },
    /// A lookup started with [`Overlay::lookup`] ended at this node (the one nearest its point).
    Found { query: u64, card: Card },
    /// A lookup gave up.
    Lost { query: u64 },
}

/// A neighbour sim the node looks for.
#[derive(Clone, Debug)]
struct Wanted {
    centre: Point,
    /// Its genesis validators: the nodes that count.
    validators: BTreeSet<[u8; 32]>,
    /// Those met so far.
    met: BTreeSet<[u8; 32]>,
    last_lookup: Option<u64>,
    last_refresh: Option<u64>,
}

/// Why a lookup is under way.
#[derive(Clone, Copy, Debug)]
enum Query {
    Sim(u32),
    App(u64),
}

/// The node's Raynet peer and its cards.
#[derive(Debug)]
pub struct Overlay {
    me: Card,
    peer: Peer,
    /// Verified cards by Raynet id.
    book: BTreeMap<PeerId, Card>,
    wanted: BTreeMap<u32, Wanted>,
    queries: BTreeMap<u64, Query>,
    next_query: u64,
    rounds: u64,
    out: VecDeque<(Card, NodeMsg)>,
    events: VecDeque<OverlayEvent>,
}

impl Overlay {
    /// `me`: this node's card; `world_radius`: about the world's half-diagonal, metres.
    pub fn new(me: Card, world_radius: f64) -> Overlay {
        let cfg = Config {
            world_radius: world_radius.max(2.0),
            min_link_distance: 1.0,
            // Nodes are few and routes short; a lost route is retried next round.
            max_hops: 64,
            ..Config::default()
        };
        let seed = u64::from_le_bytes(me.sig[..8].try_into().unwrap_or([0; 8]));
        let peer = Peer::new(me.id(), me.point(), seed, cfg);
        Overlay {
            me,
            peer,
            book: BTreeMap::new(),
            wanted: BTreeMap::new(),
            queries: BTreeMap::new(),
            next_query: 1,
            rounds: 0,
            out: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    pub fn card(&self) -> &Card {
        &self.me
    }

    /// This node's card, signed again (its relayed addresses changed): it goes with the
    /// messages from now on, and a newer card replaces the older one wherever it arrives. A
    /// card of another key is ignored.
    pub fn set_card(&mut self, card: Card) {
        if card.body.key == self.me.body.key && card.body.pos == self.me.body.pos {
            self.me = card;
        }
    }

    /// The hello a node sends a contact it knows only by key and address: its own card, and a
    /// request for the contact's.
    pub fn hello(&self) -> NodeMsg {
        NodeMsg::Cards { cards: vec![self.me.clone()], reply: true }
    }

    /// Look for the nodes of this neighbour sim (the centre of its square, its validators).
    pub fn want_sim(&mut self, sim: u32, centre: [i64; 2], validators: BTreeSet<[u8; 32]>) {
        let mut w = Wanted {
            centre: Point::new(centre[0] as f64, centre[1] as f64),
            validators,
            met: BTreeSet::new(),
            last_lookup: None,
            last_refresh: None,
        };
        for c in self.book.values().filter(|c| c.body.sim == sim && w.validators.contains(&c.body.key)) {
            w.met.insert(c.body.key);
            self.events.push_back(OverlayEvent::SimNode { sim, card: c.clone(), genesis: true });
        }
        self.wanted.insert(sim, w);
    }

    /// The validators looked for in a neighbour sim.
    pub fn wanted_validators(&self, sim: u32) -> Option<&BTreeSet<[u8; 32]>> {
        self.wanted.get(&sim).map(|w| &w.validators)
    }

    /// Look up the node nearest `target` (metres); the answer is [`OverlayEvent::Found`] with
    /// this query id, or [`OverlayEvent::Lost`].
    pub fn lookup(&mut self, target: [i64; 2]) -> u64 {
        let q = self.next_query;
        self.next_query += 1;
        self.queries.insert(q, Query::App(q));
        self.peer.lookup(q, Point::new(target[0] as f64, target[1] as f64));
        self.pump();
        q
    }

    /// The cards known, by sim.
    pub fn cards_of(&self, sim: u32) -> impl Iterator<Item = &Card> {
        self.book.values().filter(move |c| c.body.sim == sim)
    }

    pub fn known(&self) -> usize {
        self.book.len()
    }

    /// The Raynet neighbours' cards.
    pub fn neighbours(&self) -> Vec<&Card> {
        self.peer.neighbours().filter_map(|e| self.book.get(&e.id)).collect()
    }

    /// One gossip round; and the lookups for neighbour sims that are due.
    pub fn round(&mut self) {
        self.rounds += 1;
        self.peer.round();
        let r = self.rounds;
        let mut lookups = Vec::new();
        let mut refresh = Vec::new();
        for (sim, w) in self.wanted.iter_mut() {
            if w.met.len() < w.validators.len() {
                if w.last_lookup.is_none_or(|l| r >= l + LOOKUP_EVERY) {
                    w.last_lookup = Some(r);
                    lookups.push((*sim, w.centre));
                }
            } else if w.last_refresh.is_none_or(|l| r >= l + REFRESH_EVERY) {
                w.last_refresh = Some(r);
                refresh.push(*sim);
            }
        }
        for (sim, centre) in lookups {
            let q = self.next_query;
            self.next_query += 1;
            self.queries.insert(q, Query::Sim(sim));
            self.peer.lookup(q, centre);
        }
        // Now and then ask one known node of each complete sim for its sim's cards again (a
        // restarted node comes back at a new address with a newer card).
        for sim in refresh {
            if let Some(c) = self.cards_of(sim).max_by_key(|c| c.body.since_ms).cloned() {
                self.out.push_back((c, NodeMsg::SimCards { sim }));
            }
        }
        self.pump();
    }

    /// A message from the node with this key (as the mesh authenticated it).
    pub fn handle(&mut self, from: &VerifyingKey, msg: NodeMsg) {
        match msg {
            NodeMsg::Raynet { msg, cards } => {
                self.take_cards(cards);
                let Some(sender) = self.book.get(&raynet_id(from.as_bytes())).cloned() else {
                    tracing::debug!("a Raynet message from a node without a card: dropped");
                    return;
                };
                if let Some(msg) = self.vet(&sender, msg) {
                    self.peer.handle(sender.id(), msg);
                    self.pump();
                }
            }
            NodeMsg::Cards { cards, reply } => {
                let first = cards.first().cloned();
                self.take_cards(cards);
                // The sender's own card comes first: a contact, so it seeds the overlay.
                if let Some(c) = first.filter(|c| c.body.key == *from.as_bytes())
                    && self.book.get(&c.id()) == Some(&c)
                {
                    if reply {
                        self.out.push_back((c.clone(), NodeMsg::Cards { cards: vec![self.me.clone()], reply: false }));
                    }
                    self.peer.bootstrap(&[c.entry()]);
                    self.pump();
                }
            }
            NodeMsg::SimCards { sim } => {
                let Some(sender) = self.book.get(&raynet_id(from.as_bytes())).cloned() else { return };
                let mut cards: Vec<Card> = self.cards_of(sim).take(MAX_CARDS - 1).cloned().collect();
                if sim == self.me.body.sim {
                    cards.insert(0, self.me.clone());
                }
                self.out.push_back((sender, NodeMsg::Cards { cards, reply: false }));
            }
            _ => {}
        }
    }

    /// The transport has no way to this card's node (its address is unknown or full).
    pub fn unreachable(&mut self, to: &Card, msg: NodeMsg) {
        if let NodeMsg::Raynet { msg, .. } = msg {
            self.peer.unreachable(to.id(), msg);
            self.pump();
        }
    }

    #[must_use]
    pub fn poll_send(&mut self) -> Option<(Card, NodeMsg)> {
        self.out.pop_front()
    }

    #[must_use]
    pub fn poll_event(&mut self) -> Option<OverlayEvent> {
        self.events.pop_front()
    }

    /// Verify and keep new cards (a card already kept is not checked again).
    fn take_cards(&mut self, cards: Vec<Card>) {
        for c in cards.into_iter().take(MAX_CARDS) {
            let id = c.id();
            if c.body.key == self.me.body.key || self.book.get(&id) == Some(&c) {
                continue;
            }
            if self.book.get(&id).is_some_and(|old| old.body.since_ms >= c.body.since_ms) {
                continue;
            }
            if let Err(why) = c.check() {
                tracing::debug!("a card refused: {why}");
                continue;
            }
            if self.book.len() >= MAX_BOOK && !self.book.contains_key(&id) {
                let oldest = self.book.values().min_by_key(|c| (c.body.since_ms, c.id())).map(Card::id);
                if let Some(o) = oldest {
                    self.book.remove(&o);
                }
            }
            self.book.insert(id, c.clone());
            self.met(c);
        }
    }

    fn met(&mut self, c: Card) {
        if c.body.sim == self.me.body.sim {
            return;
        }
        let genesis = match self.wanted.get_mut(&c.body.sim) {
            Some(w) if w.validators.contains(&c.body.key) => {
                w.met.insert(c.body.key);
                true
            }
            _ => false,
        };
        self.events.push_back(OverlayEvent::SimNode { sim: c.body.sim, card: c, genesis });
    }

    /// The card of the node with this key, if known.
    pub fn card_of(&self, key: &[u8; 32]) -> Option<&Card> {
        if *key == self.me.body.key { Some(&self.me) } else { self.book.get(&raynet_id(key)) }
    }

    /// A peer's Raynet message, made to agree with the cards: entries without a card are left
    /// out (we could not reach them), every entry's point is its card's, sizes are bounded, and
    /// the sender is who it says it is.
    fn vet(&self, sender: &Card, msg: Msg) -> Option<Msg> {
        let fix = |e: Entry| -> Option<Entry> {
            if e.id == self.me.id() {
                return Some(Entry { pos: self.me.point(), ..e });
            }
            self.book.get(&e.id).map(|c| Entry { pos: c.point(), age: e.age.min(1_000), id: e.id })
        };
        let list = |v: Vec<Entry>| -> Vec<Entry> { v.into_iter().take(MAX_ENTRIES).filter_map(fix).collect() };
        let point_ok =
            |p: Point| p.x.is_finite() && p.y.is_finite() && p.x.abs() <= MAX_COORD && p.y.abs() <= MAX_COORD;
        let own = |e: Entry| (e.id == sender.id()).then(|| Entry { pos: sender.point(), ..e });
        Some(match msg {
            Msg::Shuffle { from, sample } => Msg::Shuffle { from: own(from)?, sample: list(sample) },
            Msg::ShuffleReply { from, sample } => Msg::ShuffleReply { from: own(from)?, sample: list(sample) },
            Msg::Neighbours { from, neighbours } => Msg::Neighbours { from: own(from)?, neighbours: list(neighbours) },
            Msg::Route { target, origin, purpose, hops, escapes, visited, best } => {
                if !point_ok(target) || visited.len() > MAX_ENTRIES {
                    return None;
                }
                let best = if purpose == Purpose::Join && best.id == origin.id { Some(best) } else { fix(best) };
                Msg::Route { target, origin: fix(origin)?, purpose, hops, escapes, visited, best: best? }
            }
            Msg::Arrived { target, closest, purpose, hops } => {
                if !point_ok(target) {
                    return None;
                }
                Msg::Arrived { target, closest: fix(closest)?, purpose, hops }
            }
        })
    }

    /// The cards a message names, so its receiver can reach them.
    fn cards_for(&self, msg: &Msg) -> Vec<Card> {
        let mut ids: Vec<PeerId> = match msg {
            Msg::Shuffle { from, sample } | Msg::ShuffleReply { from, sample } => {
                std::iter::once(from.id).chain(sample.iter().map(|e| e.id)).collect()
            }
            Msg::Neighbours { from, neighbours } => {
                std::iter::once(from.id).chain(neighbours.iter().map(|e| e.id)).collect()
            }
            Msg::Route { origin, best, .. } => vec![origin.id, best.id],
            Msg::Arrived { closest, .. } => vec![closest.id],
        };
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .filter_map(|id| if id == self.me.id() { Some(&self.me) } else { self.book.get(&id) })
            .take(MAX_CARDS)
            .cloned()
            .collect()
    }

    /// Move what the Raynet peer produced into the overlay's queues.
    fn pump(&mut self) {
        while let Some((to, msg)) = self.peer.poll_send() {
            let Some(card) = self.book.get(&to).cloned() else {
                // A peer we hold no card of (it cannot happen for entries we vetted): forget it.
                self.peer.unreachable(to, msg);
                continue;
            };
            let cards = self.cards_for(&msg);
            self.out.push_back((card, NodeMsg::Raynet { msg, cards }));
        }
        while let Some(e) = self.peer.poll_event() {
            match e {
                Event::Found { query, closest, .. } => {
                    let card = if closest.id == self.me.id() {
                        Some(self.me.clone())
                    } else {
                        self.book.get(&closest.id).cloned()
                    };
                    match (self.queries.remove(&query), card) {
                        // A node of that sim (or the nearest to its centre, if none is up): ask
                        // it for its sim's cards.
                        (Some(Query::Sim(sim)), Some(card))
                            if card.body.sim == sim && card.body.key != self.me.body.key =>
                        {
                            self.out.push_back((card.clone(), NodeMsg::SimCards { sim }));
                        }
                        (Some(Query::App(q)), Some(card)) => {
                            self.events.push_back(OverlayEvent::Found { query: q, card })
                        }
                        (Some(Query::App(q)), None) => self.events.push_back(OverlayEvent::Lost { query: q }),
                        _ => {}
                    }
                }
                Event::Lost { query } => {
                    if let Some(Query::App(q)) = self.queries.remove(&query) {
                        self.events.push_back(OverlayEvent::Lost { query: q });
                    }
                }
            }
        }
        // Lookups never answered (their route died with a node) are forgotten after a while.
        if self.queries.len() > 1024 {
            let drop: Vec<u64> = self.queries.keys().take(self.queries.len() - 1024).copied().collect();
            for q in drop {
                if let Some(Query::App(a)) = self.queries.remove(&q) {
                    self.events.push_back(OverlayEvent::Lost { query: a });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    /// A world of `side`×`side` sims of 128 m, `per` nodes each, passing messages in memory.
    struct World {
        nodes: Vec<(SigningKey, Overlay)>,
        found: BTreeMap<usize, BTreeMap<u32, BTreeSet<[u8; 32]>>>,
        answers: BTreeMap<(usize, u64), Card>,
    }

    const SIZE: i64 = 128;

    fn origin(sim: u32, side: u32) -> [i64; 2] {
        let k = i64::from(sim - 1);
        [(k % i64::from(side)) * SIZE, (k / i64::from(side)) * SIZE]
    }

    fn key(i: usize) -> SigningKey {
        SigningKey::from_bytes(blake3::hash(&(i as u64).to_le_bytes()).as_bytes())
    }

    impl World {
        fn new(side: u32, per: usize) -> World {
            let sims = side * side;
            let mut nodes = Vec::new();
            for s in 1..=sims {
                for j in 0..per {
                    let k = key(nodes.len());
                    let body = CardBody {
                        key: k.verifying_key().to_bytes(),
                        sim: s,
                        pos: node_point(&k.verifying_key().to_bytes(), origin(s, side), SIZE),
                        addr: ([127, 0, 0, 1], 10_000 + (s * 10) as u16 + j as u16).into(),
                        quic: None,
                        since_ms: 1,
                        http: None,
                        relayed: Vec::new(),
                    };
                    let card = Card::sign(&k, body);
                    nodes.push((k, Overlay::new(card, SIZE as f64 * f64::from(side))));
                }
            }
            let keys_of = |s: u32| -> BTreeSet<[u8; 32]> {
                let first = (s as usize - 1) * per;
                (first..first + per).map(|i| key(i).verifying_key().to_bytes()).collect()
            };
            // Each node wants the sims that share an edge or a corner with its own.
            for (i, (_, o)) in nodes.iter_mut().enumerate() {
                let s = (i / per) as u32 + 1;
                let (x, y) = ((s - 1) % side, (s - 1) / side);
                for t in 1..=sims {
                    let (tx, ty) = ((t - 1) % side, (t - 1) / side);
                    if t != s && tx.abs_diff(x) <= 1 && ty.abs_diff(y) <= 1 {
                        let o2 = origin(t, side);
                        o.want_sim(t, [o2[0] + SIZE / 2, o2[1] + SIZE / 2], keys_of(t));
                    }
                }
            }
            World { nodes, found: BTreeMap::new(), answers: BTreeMap::new() }
        }

        fn index_of(&self, key: &[u8; 32]) -> Option<usize> {
            self.nodes.iter().position(|(k, _)| k.verifying_key().as_bytes() == key)
        }

        /// Deliver everything queued until the network is quiet.
        fn settle(&mut self) {
            for _ in 0..10_000 {
                let mut moved = false;
                for i in 0..self.nodes.len() {
                    let from = self.nodes[i].0.verifying_key();
                    while let Some((to, msg)) = self.nodes[i].1.poll_send() {
                        moved = true;
                        if let Some(j) = self.index_of(&to.body.key) {
                            self.nodes[j].1.handle(&from, msg);
                        }
                    }
                    while let Some(e) = self.nodes[i].1.poll_event() {
                        match e {
                            OverlayEvent::SimNode { sim, card, genesis } => {
                                if genesis {
                                    self.found.entry(i).or_default().entry(sim).or_default().insert(card.body.key);
                                }
                            }
                            OverlayEvent::Found { query, card } => {
                                self.answers.insert((i, query), card);
                            }
                            OverlayEvent::Lost { .. } => {}
                        }
                    }
                }
                if !moved {
                    return;
                }
            }
            panic!("the overlay never went quiet");
        }

        fn round(&mut self) {
            for (_, o) in self.nodes.iter_mut() {
                o.round();
            }
            self.settle();
        }
    }

    #[test]
    fn every_node_finds_its_neighbour_sims_and_lookups_end_in_the_right_sim() {
        let (side, per) = (3u32, 4usize);
        let mut w = World::new(side, per);
        // Everyone knows only the first node of sim 1 (a seed), and that node knows nobody.
        let seed = w.nodes[0].0.verifying_key();
        for i in 1..w.nodes.len() {
            let hello = w.nodes[i].1.hello();
            let from = w.nodes[i].0.verifying_key();
            w.nodes[0].1.handle(&from, hello);
        }
        let _ = seed;
        w.settle();
        // Rounds for the overlay to converge: every node finds its neighbours' validators
        // within 12 here, and greedy routes reach every sim's centre within 20 (each node's
        // Raynet draws from a seed taken from its card's signature, so the count depends on the
        // cards; lookups issued earlier can be dropped on the way, which the node answers by
        // its fallback and the next lookup).
        for _ in 0..24 {
            w.round();
        }
        for i in 0..w.nodes.len() {
            let s = (i / per) as u32 + 1;
            let wanted: Vec<u32> = w.nodes[i].1.wanted.keys().copied().collect();
            assert!(!wanted.is_empty());
            for t in wanted {
                let got = w.found.get(&i).and_then(|m| m.get(&t)).map_or(0, BTreeSet::len);
                assert_eq!(got, per, "node {i} of sim {s} knows {got} of sim {t}'s {per} validators");
            }
        }
        // A lookup of any point of a sim's square, from any node, ends at a node of that sim.
        let mut asked = Vec::new();
        for i in (0..w.nodes.len()).step_by(5) {
            for t in 1..=side * side {
                let o = origin(t, side);
                let point = [o[0] + SIZE / 2 + (i as i64 % 7) - 3, o[1] + SIZE / 2 - (i as i64 % 5) + 2];
                let q = w.nodes[i].1.lookup(point);
                asked.push((i, q, t));
            }
        }
        w.settle();
        for (i, q, t) in asked {
            let card = w.answers.get(&(i, q)).unwrap_or_else(|| panic!("node {i}'s lookup of sim {t} got no answer"));
            assert_eq!(card.body.sim, t, "node {i}'s lookup of sim {t}'s centre ended in sim {}", card.body.sim);
        }
    }

    #[test]
    fn forged_cards_and_unknown_entries_are_left_out() {
        let mut w = World::new(2, 4);
        let honest = w.nodes[1].1.card().clone();
        // A card whose body was changed after signing (another address) is refused.
        let mut forged = honest.clone();
        forged.body.addr = ([10, 0, 0, 1], 1).into();
        forged.body.since_ms += 1;
        assert!(forged.check().is_err());
        let bad_sig = Card { sig: vec![1; 10], ..honest.clone() };
        assert!(bad_sig.check().unwrap_err().contains("10 bytes"));
        let far = Card::sign(&w.nodes[1].0, CardBody { pos: [i64::MAX / 2, 0], ..honest.body.clone() });
        assert!(far.check().unwrap_err().contains("outside the world"));
        let from = w.nodes[1].0.verifying_key();
        w.nodes[0].1.handle(&from, NodeMsg::Cards { cards: vec![forged.clone()], reply: true });
        assert_eq!(w.nodes[0].1.known(), 0, "a forged card is not kept");
        assert!(w.nodes[0].1.poll_send().is_none(), "and is not answered");
        // The honest card is kept and answered; a Raynet message naming a peer without a card
        // passes without that entry.
        w.nodes[0].1.handle(&from, NodeMsg::Cards { cards: vec![honest.clone()], reply: true });
        assert_eq!(w.nodes[0].1.known(), 1);
        let stranger = Entry { id: 42, pos: Point::new(1.0, 1.0), age: 0 };
        let liar = Entry { id: honest.id(), pos: Point::new(5_000.0, 5_000.0), age: 0 };
        let msg = Msg::Neighbours { from: liar, neighbours: vec![stranger] };
        let vetted = w.nodes[0].1.vet(&honest, msg).expect("the sender is who it says");
        assert_eq!(vetted, Msg::Neighbours { from: Entry { pos: honest.point(), ..liar }, neighbours: vec![] });
        // A message whose sender entry is someone else is dropped whole.
        let other = Msg::Shuffle { from: Entry { id: 7, ..liar }, sample: vec![] };
        assert!(w.nodes[0].1.vet(&honest, other).is_none());
        // A route to a point that is not finite is dropped.
        let route = Msg::Route {
            target: Point::new(f64::NAN, 0.0),
            origin: Entry { pos: honest.point(), ..liar },
            purpose: Purpose::Lookup(1),
            hops: 0,
            escapes: 0,
            visited: vec![],
            best: Entry { pos: honest.point(), ..liar },
        };
        assert!(w.nodes[0].1.vet(&honest, route).is_none());
    }

    /// Whatever a peer sends (points that are not finite or far away, huge counters, lists
    /// past the bounds, entries of strangers and of itself), a node neither panics nor keeps
    /// what it cannot reach, and still routes its own lookups.
    #[test]
    fn hostile_raynet_messages_never_panic_and_leave_nothing_unreachable_behind() {
        let mut w = World::new(2, 4);
        let honest = w.nodes[1].1.card().clone();
        let from = w.nodes[1].0.verifying_key();
        w.nodes[0].1.handle(&from, NodeMsg::Cards { cards: vec![honest.clone()], reply: false });
        let mut r = metatopia_raynet::rng::SplitMix::new(7);
        let weird = [f64::NAN, f64::INFINITY, -f64::INFINITY, f64::MAX, -1e300, 0.0, 64.0, 1e12];
        let ids = [honest.id(), w.nodes[0].1.card().id(), 42, u64::MAX];
        let point = |r: &mut metatopia_raynet::rng::SplitMix| {
            Point::new(weird[r.below(8) as usize], weird[r.below(8) as usize])
        };
        let entry = |r: &mut metatopia_raynet::rng::SplitMix| Entry {
            id: ids[r.below(4) as usize],
            pos: point(r),
            age: r.next_u64() as u32,
        };
        for _ in 0..3_000 {
            let list: Vec<Entry> = (0..r.below(300)).map(|_| entry(&mut r)).collect();
            let purpose = match r.below(3) {
                0 => Purpose::Join,
                1 => Purpose::LongLink(r.next_u64() as u8),
                _ => Purpose::Lookup(r.next_u64()),
            };
            let msg = match r.below(5) {
                0 => Msg::Shuffle { from: entry(&mut r), sample: list },
                1 => Msg::ShuffleReply { from: entry(&mut r), sample: list },
                2 => Msg::Neighbours { from: entry(&mut r), neighbours: list },
                3 => Msg::Route {
                    target: point(&mut r),
                    origin: entry(&mut r),
                    purpose,
                    hops: r.next_u64() as u32,
                    escapes: r.next_u64() as u32,
                    visited: list.iter().map(|e| e.id).collect(),
                    best: entry(&mut r),
                },
                _ => Msg::Arrived { target: point(&mut r), closest: entry(&mut r), purpose, hops: r.next_u64() as u32 },
            };
            w.nodes[0].1.handle(&from, NodeMsg::Raynet { msg, cards: Vec::new() });
            if r.below(50) == 0 {
                w.nodes[0].1.round();
            }
            while let Some((to, _)) = w.nodes[0].1.poll_send() {
                assert!(to.id() == honest.id(), "a message to a node without a card: {:?}", to.body);
            }
            while w.nodes[0].1.poll_event().is_some() {}
        }
        // It still answers its own lookups (here: only itself and the honest node are known).
        let q = w.nodes[0].1.lookup([10, 10]);
        let mut answered = false;
        while let Some(e) = w.nodes[0].1.poll_event() {
            answered |= matches!(e, OverlayEvent::Found { query, .. } | OverlayEvent::Lost { query } if query == q);
        }
        let sent = std::iter::from_fn(|| w.nodes[0].1.poll_send()).count();
        assert!(answered || sent > 0, "the lookup neither ended nor went on");
    }

    #[test]
    fn a_node_point_is_inside_its_sim_and_nearer_its_centre_than_any_other_sims_node() {
        for i in 0..500 {
            let k = key(i).verifying_key().to_bytes();
            let p = node_point(&k, [256, 128], 128);
            assert!((256 + 32..=256 + 96).contains(&p[0]) && (128 + 32..=128 + 96).contains(&p[1]), "{p:?}");
        }
    }
}
