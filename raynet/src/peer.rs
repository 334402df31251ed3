//! One Raynet peer, sans-IO: feed it [`Peer::handle`] and [`Peer::round`], drain
//! [`Peer::poll_send`] and [`Peer::poll_event`].

use std::collections::{BTreeMap, VecDeque};

use crate::geometry::{Point, estimate_cell};
use crate::rng::SplitMix;

/// A peer's id.
pub type PeerId = u64;

/// What peers know of each other: id, position, and how many rounds ago it was fresh.
#[derive(Clone, Copy, PartialEq, Debug, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    pub id: PeerId,
    pub pos: Point,
    pub age: u32,
}

/// Why a route is travelling.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub enum Purpose {
    /// A new peer looks for the peer whose cell holds its position.
    Join,
    /// Refreshing long link number `slot`.
    LongLink(u8),
    /// An application lookup (a client looking for the node nearest its avatar, a sim for its
    /// neighbour), with the caller's query id.
    Lookup(u64),
}

/// Messages between peers (values: the node carries them over the network).
#[derive(Clone, PartialEq, Debug, serde::Serialize, serde::Deserialize)]
pub enum Msg {
    /// Cyclon shuffle: a sample of the sender's view, with itself.
    Shuffle {
        from: Entry,
        sample: Vec<Entry>,
    },
    ShuffleReply {
        from: Entry,
        sample: Vec<Entry>,
    },
    /// The sender's Voronoi neighbours (also a heartbeat).
    Neighbours {
        from: Entry,
        neighbours: Vec<Entry>,
    },
    /// Greedy routing towards `target`.
    /// `best` is the closest peer met so far (a detour may pass farther ones).
    Route {
        target: Point,
        origin: Entry,
        purpose: Purpose,
        hops: u32,
        escapes: u32,
        visited: Vec<PeerId>,
        best: Entry,
    },
    /// The end of a route, sent back to its origin: `closest` is the peer whose cell holds the target.
    Arrived {
        target: Point,
        closest: Entry,
        purpose: Purpose,
        hops: u32,
    },
}

/// What a peer tells its application.
#[derive(Clone, PartialEq, Debug)]
pub enum Event {
    /// A lookup reached the peer closest to its target.
    Found { query: u64, closest: Entry, hops: u32 },
    /// A route gave up at its origin (hop limit); one that gives up elsewhere comes back as
    /// `Found` with the best peer it met.
    Lost { query: u64 },
}

/// Tuning.
#[derive(Clone, Debug)]
pub struct Config {
    /// Cyclon view size and shuffle length.
    pub view_size: usize,
    pub shuffle_len: usize,
    /// Random rays per estimate, and how many times a boundary between two hits is refined.
    pub rays: usize,
    pub refine_depth: u32,
    pub max_neighbours: usize,
    /// Candidates kept for estimating the cell (random view, neighbours, their neighbours).
    pub max_candidates: usize,
    pub long_links: usize,
    /// Entries not refreshed for this many rounds are dropped (failure detection).
    pub timeout_rounds: u32,
    pub max_hops: u32,
    /// Detours allowed when greedy routing meets a peer it already visited.
    pub max_escapes: u32,
    /// Detours taken at a local minimum even when nothing is blocked (a second opinion).
    pub verify_hops: u32,
    /// Radius of the world, for drawing long-link distances (Kleinberg, d = 2).
    pub world_radius: f64,
    pub min_link_distance: f64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            view_size: 20,
            shuffle_len: 8,
            rays: 24,
            refine_depth: 6,
            max_neighbours: 32,
            max_candidates: 160,
            long_links: 4,
            timeout_rounds: 6,
            max_hops: 512,
            max_escapes: 3,
            verify_hops: 2,
            world_radius: 1_000.0,
            min_link_distance: 1.0,
        }
    }
}

/// A point no peer is near (the starting `best` of a join, so any real peer beats it).
fn far_away() -> Point {
    Point::new(f64::MAX / 4.0, f64::MAX / 4.0)
}

/// A route being handled.
#[derive(Clone, Copy, Debug)]
struct RouteState {
    target: Point,
    origin: Entry,
    purpose: Purpose,
    hops: u32,
    escapes: u32,
    best: Entry,
}

/// A Raynet peer.
#[derive(Debug)]
pub struct Peer {
    cfg: Config,
    me: Entry,
    rng: SplitMix,
    round: u64,
    view: BTreeMap<PeerId, Entry>,
    neighbours: BTreeMap<PeerId, Entry>,
    candidates: BTreeMap<PeerId, Entry>,
    long_links: Vec<Option<Entry>>,
    joined: bool,
    out: VecDeque<(PeerId, Msg)>,
    events: VecDeque<Event>,
}

impl Peer {
    pub fn new(id: PeerId, pos: Point, seed: u64, cfg: Config) -> Peer {
        let links = cfg.long_links;
        Peer {
            cfg,
            me: Entry { id, pos, age: 0 },
            rng: SplitMix::new(seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            round: 0,
            view: BTreeMap::new(),
            neighbours: BTreeMap::new(),
            candidates: BTreeMap::new(),
            long_links: vec![None; links],
            joined: false,
            out: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    pub fn id(&self) -> PeerId {
        self.me.id
    }
    pub fn pos(&self) -> Point {
        self.me.pos
    }
    pub fn neighbours(&self) -> impl Iterator<Item = &Entry> {
        self.neighbours.values()
    }
    pub fn view_len(&self) -> usize {
        self.view.len()
    }
    pub fn known_len(&self) -> usize {
        self.known().count()
    }

    /// Move (positions may change; peers learn it from the next messages).
    pub fn set_position(&mut self, pos: Point) {
        self.me.pos = pos;
    }

    /// Start from some contacts: they seed the view, and a join route goes to our position.
    pub fn bootstrap(&mut self, contacts: &[Entry]) {
        for c in contacts {
            if c.id != self.me.id {
                self.view.insert(c.id, Entry { age: 0, ..*c });
                self.candidates.insert(c.id, Entry { age: 0, ..*c });
            }
        }
        self.recompute();
        self.start_join();
    }

    /// Tell our neighbours who our neighbours are (also a heartbeat).
    fn announce(&mut self) {
        let neighbours: Vec<Entry> = self.neighbours.values().copied().collect();
        for n in &neighbours {
            self.send(n.id, Msg::Neighbours { from: self.fresh(), neighbours: neighbours.clone() });
        }
    }

    /// Route to our own position through the known peer nearest to it.
    fn start_join(&mut self) {
        let me = self.me.pos;
        let first =
            self.known().min_by(|a, b| a.pos.dist2(me).total_cmp(&b.pos.dist2(me)).then(a.id.cmp(&b.id))).copied();
        if let Some(first) = first {
            let msg = self.route_msg(me, Purpose::Join);
            self.send(first.id, msg);
        }
    }

    /// Look up the peer closest to `target`; the answer comes as [`Event::Found`].
    pub fn lookup(&mut self, query: u64, target: Point) {
        let msg = self.route_msg(target, Purpose::Lookup(query));
        self.handle(self.me.id, msg);
    }

    #[must_use]
    pub fn poll_send(&mut self) -> Option<(PeerId, Msg)> {
        self.out.pop_front()
    }

    #[must_use]
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn send(&mut self, to: PeerId, msg: Msg) {
        self.out.push_back((to, msg));
    }

    fn fresh(&self) -> Entry {
        Entry { age: 0, ..self.me }
    }

    fn route_msg(&self, target: Point, purpose: Purpose) -> Msg {
        // A join looks for the *other* peer whose cell holds our position: we are "visited"
        // from the start (peers on the way learn of us and would otherwise route back to us).
        let visited = if purpose == Purpose::Join { vec![self.me.id] } else { Vec::new() };
        let best = if purpose == Purpose::Join { Entry { pos: far_away(), ..self.fresh() } } else { self.fresh() };
        Msg::Route { target, origin: self.fresh(), purpose, hops: 0, escapes: 0, visited, best }
    }

    /// Everyone this peer can route to.
    fn known(&self) -> impl Iterator<Item = &Entry> {
        self.neighbours
            .values()
            .chain(self.long_links.iter().flatten())
            .chain(self.view.values())
            .chain(self.candidates.values())
    }

    /// One gossip round: age entries, drop silent ones, shuffle with the oldest view entry,
    /// re-estimate the cell, tell the neighbours, refresh one long link.
    pub fn round(&mut self) {
        self.round += 1;
        let timeout = self.cfg.timeout_rounds;
        for map in [&mut self.view, &mut self.neighbours, &mut self.candidates] {
            map.retain(|_, e| {
                e.age += 1;
                e.age <= timeout
            });
        }
        for l in self.long_links.iter_mut() {
            if let Some(e) = l {
                e.age += 1;
                if e.age > timeout * 4 {
                    *l = None;
                }
            }
        }
        // Cyclon: shuffle with the oldest entry of the view.
        if let Some(oldest) = self.view.values().max_by_key(|e| (e.age, e.id)).copied() {
            self.view.remove(&oldest.id);
            let sample = self.sample(self.cfg.shuffle_len - 1);
            self.send(oldest.id, Msg::Shuffle { from: self.fresh(), sample });
        }
        self.recompute();
        self.announce();
        // Re-join (route to our own position) while young and now and then: the peer whose cell
        // holds our position welcomes us with its neighbours, which speeds up convergence and
        // repairs views after churn or movement.
        if self.round <= 8 || self.round.is_multiple_of(4) {
            self.start_join();
        }
        if !self.long_links.is_empty() && self.joined {
            let slot = (self.round % self.long_links.len() as u64) as u8;
            let target = self.long_link_target();
            let msg = self.route_msg(target, Purpose::LongLink(slot));
            self.handle(self.me.id, msg);
        }
    }

    /// A point at distance r with density ∝ 1/r (so peers at distance r are linked with
    /// probability ∝ 1/r², Kleinberg's law for d = 2), in a uniform direction.
    fn long_link_target(&mut self) -> Point {
        let (rmin, rmax) = (self.cfg.min_link_distance, self.cfg.world_radius.max(self.cfg.min_link_distance * 2.0));
        let u = self.rng.unit();
        let r = rmin * (rmax / rmin).powf(u);
        let a = self.rng.unit() * std::f64::consts::TAU;
        Point { x: self.me.pos.x + r * a.cos(), y: self.me.pos.y + r * a.sin() }
    }

    fn sample(&mut self, n: usize) -> Vec<Entry> {
        let mut all: Vec<Entry> = self.view.values().copied().collect();
        let mut out = vec![self.fresh()];
        while out.len() <= n && !all.is_empty() {
            let i = self.rng.below(all.len() as u64) as usize;
            out.push(all.swap_remove(i));
        }
        out
    }

    fn learn(&mut self, e: Entry) {
        if e.id == self.me.id {
            return;
        }
        let fresher = |old: Option<&Entry>| old.is_none_or(|o| e.age <= o.age);
        if fresher(self.candidates.get(&e.id)) {
            self.candidates.insert(e.id, e);
        }
        if let Some(n) = self.neighbours.get_mut(&e.id)
            && e.age <= n.age
        {
            *n = e;
        }
        for l in self.long_links.iter_mut().flatten() {
            if l.id == e.id && e.age <= l.age {
                *l = e;
            }
        }
    }

    /// Re-estimate the Voronoi cell from the candidates by casting rays.
    fn recompute(&mut self) {
        for e in self.view.values() {
            self.candidates.entry(e.id).or_insert(*e);
        }
        for e in self.neighbours.values() {
            self.candidates.entry(e.id).or_insert(*e);
        }
        // Bound the candidates: keep the nearest (the far ones cannot border the cell).
        if self.candidates.len() > self.cfg.max_candidates {
            let me = self.me.pos;
            let mut by_dist: Vec<Entry> = self.candidates.values().copied().collect();
            by_dist.sort_by(|a, b| me.dist2(a.pos).total_cmp(&me.dist2(b.pos)).then(a.id.cmp(&b.id)));
            by_dist.truncate(self.cfg.max_candidates);
            self.candidates = by_dist.into_iter().map(|e| (e.id, e)).collect();
        }
        let cands: Vec<Entry> = self.candidates.values().copied().collect();
        let hits = estimate_cell(self.me.pos, &cands, self.cfg.rays, self.cfg.refine_depth, &mut self.rng);
        let me = self.me.pos;
        let mut hit: Vec<Entry> = hits.into_iter().map(|i| cands[i]).collect();
        hit.sort_by(|a, b| me.dist2(a.pos).total_cmp(&me.dist2(b.pos)).then(a.id.cmp(&b.id)));
        hit.truncate(self.cfg.max_neighbours);
        self.neighbours = hit.into_iter().map(|e| (e.id, e)).collect();
    }

    /// The next hop towards `target`: the known peer closest to it, if closer than us.
    pub fn next_hop(&self, target: Point, visited: &[PeerId]) -> Option<Entry> {
        let mine = self.me.pos.dist2(target);
        self.known()
            .filter(|e| e.pos.dist2(target) < mine && !visited.contains(&e.id))
            .min_by(|a, b| a.pos.dist2(target).total_cmp(&b.pos.dist2(target)).then(a.id.cmp(&b.id)))
            .copied()
    }

    /// A message from peer `from` (or from ourselves, to start a route).
    pub fn handle(&mut self, from: PeerId, msg: Msg) {
        match msg {
            Msg::Shuffle { from: f, sample } => {
                let reply = self.sample(self.cfg.shuffle_len - 1);
                self.merge_view(f, &sample);
                self.send(from, Msg::ShuffleReply { from: self.fresh(), sample: reply });
            }
            Msg::ShuffleReply { from: f, sample } => self.merge_view(f, &sample),
            Msg::Neighbours { from: f, neighbours } => {
                self.learn(f);
                for n in neighbours.into_iter().take(self.cfg.max_neighbours) {
                    self.learn(Entry { age: n.age + 1, ..n });
                }
            }
            Msg::Route { target, origin, purpose, hops, escapes, mut visited, best } => {
                if origin.id != self.me.id {
                    self.learn(origin);
                }
                let is_joiner = purpose == Purpose::Join && origin.id == self.me.id;
                let best =
                    if !is_joiner && self.me.pos.dist2(target) <= best.pos.dist2(target) { self.fresh() } else { best };
                let r = RouteState { target, origin, purpose, hops, escapes, best };
                self.route(r, &mut visited);
            }
            Msg::Arrived { target: _, closest, purpose, hops } => {
                self.learn(closest);
                match purpose {
                    Purpose::Join => {
                        self.joined = true;
                        if closest.id != self.me.id {
                            self.view.insert(closest.id, closest);
                        }
                        // The welcome (the closest peer's neighbours) came just before this:
                        // estimate the cell now, and introduce ourselves to the new neighbours
                        // (so routes to points in our cell find us this round, not next).
                        self.recompute();
                        self.announce();
                    }
                    Purpose::LongLink(slot) => {
                        if let Some(l) = self.long_links.get_mut(slot as usize)
                            && closest.id != self.me.id
                        {
                            *l = Some(closest);
                        }
                    }
                    Purpose::Lookup(query) => self.events.push_back(Event::Found { query, closest, hops }),
                }
            }
        }
    }

    fn route(&mut self, r: RouteState, visited: &mut Vec<PeerId>) {
        let RouteState { target, origin, purpose, hops, escapes, best } = r;
        visited.push(self.me.id);
        if visited.len() > 64 {
            visited.remove(0);
        }
        if hops >= self.cfg.max_hops {
            // The origin hears of it: the best peer met, as an answer (or, at the origin
            // itself, that the route was lost).
            if let Purpose::Lookup(query) = purpose {
                if origin.id == self.me.id {
                    self.events.push_back(Event::Lost { query });
                } else {
                    self.send(origin.id, Msg::Arrived { target, closest: best, purpose, hops });
                }
            }
            return;
        }
        let forward =
            |escapes| Msg::Route { target, origin, purpose, hops: hops + 1, escapes, visited: visited.clone(), best };
        if let Some(n) = self.next_hop(target, visited) {
            let msg = forward(escapes);
            self.send(n.id, msg);
            return;
        }
        // A local minimum. Unless detours are used up, ask a second opinion: the unvisited
        // neighbour nearest the target may know a peer we do not yet (one that joined, or one
        // hidden behind a peer that left, this very round). Routes never loop (visited peers
        // are skipped) and the answer is the best peer met (bounded escape).
        if escapes < self.cfg.verify_hops.min(self.cfg.max_escapes) {
            let detour = self
                .neighbours
                .values()
                .filter(|e| !visited.contains(&e.id))
                .min_by(|a, b| a.pos.dist2(target).total_cmp(&b.pos.dist2(target)).then(a.id.cmp(&b.id)))
                .copied();
            if let Some(n) = detour {
                let msg = forward(escapes + 1);
                self.send(n.id, msg);
                return;
            }
        }
        let closest = best;
        if purpose == Purpose::Join && origin.id != self.me.id && closest.id == self.me.id {
            // Welcome the joiner with what we know around its position.
            let near: Vec<Entry> = self.neighbours.values().copied().chain([self.fresh()]).collect();
            self.send(origin.id, Msg::Neighbours { from: self.fresh(), neighbours: near });
            self.learn(origin);
        }
        let done = Msg::Arrived { target, closest, purpose, hops };
        if origin.id == self.me.id {
            self.handle(self.me.id, done);
        } else {
            self.send(origin.id, done);
        }
    }

    /// The transport could not reach `peer` (it left or failed): forget it everywhere and, if
    /// the message was a route, send it on by another way.
    pub fn unreachable(&mut self, peer: PeerId, msg: Msg) {
        let was_neighbour = self.neighbours.contains_key(&peer);
        self.forget(peer);
        if was_neighbour {
            // Peers that were hidden behind it may border our cell now.
            self.recompute();
        }
        if let Msg::Route { target, origin, purpose, hops, escapes, mut visited, best } = msg {
            let best = if best.id == peer { self.fresh() } else { best };
            visited.retain(|v| *v != self.me.id);
            self.route(RouteState { target, origin, purpose, hops, escapes, best }, &mut visited);
        }
    }

    fn forget(&mut self, peer: PeerId) {
        self.view.remove(&peer);
        self.neighbours.remove(&peer);
        self.candidates.remove(&peer);
        for l in self.long_links.iter_mut() {
            if l.is_some_and(|e| e.id == peer) {
                *l = None;
            }
        }
    }

    fn merge_view(&mut self, from: Entry, sample: &[Entry]) {
        self.learn(from);
        self.view.insert(from.id, Entry { age: 0, ..from });
        for e in sample {
            if e.id == self.me.id {
                continue;
            }
            self.learn(*e);
            self.view.insert(e.id, *e);
        }
        while self.view.len() > self.cfg.view_size {
            let oldest = self.view.values().max_by_key(|e| (e.age, e.id)).map(|e| e.id).expect("non-empty");
            self.view.remove(&oldest);
        }
    }
}
