//! The Raynet simulator: N peers in one process, seeded, in synchronous gossip rounds with
//! message loss and churn. Each round it measures neighbour recall and precision against the
//! exact Delaunay triangulation (spade), view sizes, and greedy routing success and hops.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use spade::{DelaunayTriangulation, HasPosition, Point2, Triangulation};

use crate::geometry::Point;
use crate::peer::{Config, Entry, Event, Msg, Peer, PeerId};
use crate::rng::SplitMix;

/// How peers are placed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Placement {
    Uniform,
    /// Ten Gaussian clusters (a world with towns).
    Clustered,
}

/// A simulation.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub peers: usize,
    pub placement: Placement,
    pub seed: u64,
    /// Peers replaced per round, per mille.
    pub churn_per_mille: u32,
    /// Messages lost, per mille.
    pub loss_per_mille: u32,
    /// Random contacts each peer starts from.
    pub bootstrap_contacts: usize,
    /// Lookups measured per round.
    pub route_samples: usize,
    pub peer: Config,
}

impl SimConfig {
    pub fn new(peers: usize, placement: Placement, seed: u64) -> SimConfig {
        SimConfig {
            peers,
            placement,
            seed,
            churn_per_mille: 0,
            loss_per_mille: 0,
            bootstrap_contacts: 4,
            route_samples: 200,
            peer: Config::default(),
        }
    }

    /// Side of the square world: about 10 m² per peer... times 10 (a peer per 100 m²).
    pub fn side(&self) -> f64 {
        (self.peers as f64).sqrt() * 10.0
    }
}

/// What one round measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoundStats {
    pub round: u32,
    pub peers: usize,
    pub recall: f64,
    pub precision: f64,
    pub mean_neighbours: f64,
    pub mean_known: f64,
    pub route_success: f64,
    pub mean_hops: f64,
    pub p99_hops: u32,
    pub messages: u64,
}

impl RoundStats {
    pub const CSV_HEADER: &'static str =
        "round,peers,recall,precision,mean_neighbours,mean_known,route_success,mean_hops,p99_hops,messages";

    pub fn csv(&self) -> String {
        format!(
            "{},{},{:.5},{:.5},{:.2},{:.2},{:.5},{:.3},{},{}",
            self.round,
            self.peers,
            self.recall,
            self.precision,
            self.mean_neighbours,
            self.mean_known,
            self.route_success,
            self.mean_hops,
            self.p99_hops,
            self.messages
        )
    }
}

/// The simulator.
#[derive(Debug)]
pub struct Simulator {
    cfg: SimConfig,
    peers: BTreeMap<PeerId, Peer>,
    rng: SplitMix,
    next_id: PeerId,
    round: u32,
    centres: Vec<Point>,
}

#[derive(Clone, Copy, Debug)]
struct Vertex {
    pos: Point2<f64>,
    id: PeerId,
}

impl HasPosition for Vertex {
    type Scalar = f64;
    fn position(&self) -> Point2<f64> {
        self.pos
    }
}

impl Simulator {
    pub fn new(cfg: SimConfig) -> Simulator {
        let mut rng = SplitMix::new(cfg.seed);
        let side = cfg.side();
        let centres = (0..10).map(|_| Point::new(rng.unit() * side, rng.unit() * side)).collect();
        let mut sim = Simulator { cfg, peers: BTreeMap::new(), rng, next_id: 1, round: 0, centres };
        let mut ids = Vec::new();
        for _ in 0..sim.cfg.peers {
            let pos = sim.place();
            let id = sim.next_id;
            sim.next_id += 1;
            let mut peer_cfg = sim.cfg.peer.clone();
            peer_cfg.world_radius = side;
            sim.peers.insert(id, Peer::new(id, pos, sim.cfg.seed, peer_cfg));
            ids.push(id);
        }
        // A random bootstrap: each peer knows a few peers picked at random.
        for id in &ids {
            let contacts = sim.random_entries_from(&ids, sim.cfg.bootstrap_contacts);
            if let Some(p) = sim.peers.get_mut(id) {
                p.bootstrap(&contacts);
            }
        }
        sim.deliver(true);
        sim
    }

    /// Change the churn rate from the next round on.
    pub fn set_churn(&mut self, per_mille: u32) {
        self.cfg.churn_per_mille = per_mille;
    }

    pub fn peers(&self) -> &BTreeMap<PeerId, Peer> {
        &self.peers
    }

    fn place(&mut self) -> Point {
        let side = self.cfg.side();
        match self.cfg.placement {
            Placement::Uniform => Point::new(self.rng.unit() * side, self.rng.unit() * side),
            Placement::Clustered => {
                let c = self.centres[self.rng.below(self.centres.len() as u64) as usize];
                // Box-Muller, sigma = side / 20, clamped to the world.
                let (u1, u2) = (self.rng.unit().max(1e-12), self.rng.unit());
                let r = (-2.0 * u1.ln()).sqrt() * side / 20.0;
                let a = u2 * std::f64::consts::TAU;
                Point::new((c.x + r * a.cos()).clamp(0.0, side), (c.y + r * a.sin()).clamp(0.0, side))
            }
        }
    }

    fn random_entries(&mut self, n: usize) -> Vec<Entry> {
        let ids: Vec<PeerId> = self.peers.keys().copied().collect();
        self.random_entries_from(&ids, n)
    }

    fn random_entries_from(&mut self, ids: &[PeerId], n: usize) -> Vec<Entry> {
        (0..n.min(ids.len()))
            .map(|_| {
                let id = ids[self.rng.below(ids.len() as u64) as usize];
                Entry { id, pos: self.peers[&id].pos(), age: 0 }
            })
            .collect()
    }

    /// Deliver messages until none are left (a synchronous round). Returns how many moved.
    fn deliver(&mut self, lossless: bool) -> u64 {
        let mut queue: VecDeque<(PeerId, PeerId, Msg)> = VecDeque::new();
        for (id, p) in self.peers.iter_mut() {
            while let Some((to, m)) = p.poll_send() {
                queue.push_back((*id, to, m));
            }
        }
        let cap = 200 * self.peers.len() as u64 + 10_000;
        let mut moved = 0u64;
        while let Some((from, to, msg)) = queue.pop_front() {
            moved += 1;
            if moved > cap {
                break;
            }
            if !lossless && self.rng.below(1000) < u64::from(self.cfg.loss_per_mille) {
                continue;
            }
            match self.peers.get_mut(&to) {
                Some(p) => {
                    p.handle(from, msg);
                    while let Some((next, m)) = p.poll_send() {
                        queue.push_back((to, next, m));
                    }
                }
                // The destination left: the sender's transport notices (a refused connection).
                None => {
                    if let Some(p) = self.peers.get_mut(&from) {
                        p.unreachable(to, msg);
                        while let Some((next, m)) = p.poll_send() {
                            queue.push_back((from, next, m));
                        }
                    }
                }
            }
        }
        moved
    }

    /// One round: churn, gossip, then measurement.
    pub fn round(&mut self) -> RoundStats {
        self.round += 1;
        self.churn();
        let ids: Vec<PeerId> = self.peers.keys().copied().collect();
        for id in &ids {
            if let Some(p) = self.peers.get_mut(id) {
                p.round();
            }
        }
        let messages = self.deliver(false);
        let mut stats = self.measure();
        stats.round = self.round;
        stats.messages = messages;
        stats
    }

    /// Add a peer at `pos` that bootstraps from random contacts; returns its id.
    pub fn add_peer(&mut self, pos: Point) -> PeerId {
        let id = self.next_id;
        self.next_id += 1;
        let contacts = self.random_entries(self.cfg.bootstrap_contacts);
        let mut cfg = self.cfg.peer.clone();
        cfg.world_radius = self.cfg.side();
        let mut p = Peer::new(id, pos, self.cfg.seed, cfg);
        p.bootstrap(&contacts);
        self.peers.insert(id, p);
        id
    }

    /// Move a peer (it tells others through its next messages).
    pub fn move_peer(&mut self, id: PeerId, pos: Point) {
        if let Some(p) = self.peers.get_mut(&id) {
            p.set_position(pos);
        }
    }

    /// The exact Delaunay neighbours of a peer (for tests and diagnostics).
    pub fn true_neighbours(&self, id: PeerId) -> BTreeSet<PeerId> {
        let vertices: Vec<Vertex> =
            self.peers.values().map(|p| Vertex { pos: Point2::new(p.pos().x, p.pos().y), id: p.id() }).collect();
        let dt: DelaunayTriangulation<Vertex> = DelaunayTriangulation::bulk_load(vertices).expect("finite positions");
        let mut out = BTreeSet::new();
        for e in dt.undirected_edges() {
            let [a, b] = e.vertices();
            if a.data().id == id {
                out.insert(b.data().id);
            }
            if b.data().id == id {
                out.insert(a.data().id);
            }
        }
        out
    }

    fn churn(&mut self) {
        let n = self.peers.len() * self.cfg.churn_per_mille as usize / 1000;
        let mut ids: Vec<PeerId> = self.peers.keys().copied().collect();
        for _ in 0..n.min(ids.len().saturating_sub(4)) {
            let gone = ids.swap_remove(self.rng.below(ids.len() as u64) as usize);
            self.peers.remove(&gone);
        }
        for _ in 0..n {
            let pos = self.place();
            self.add_peer(pos);
        }
    }

    /// Recall and precision against the exact Delaunay triangulation, views, and routing.
    pub fn measure(&mut self) -> RoundStats {
        let vertices: Vec<Vertex> =
            self.peers.values().map(|p| Vertex { pos: Point2::new(p.pos().x, p.pos().y), id: p.id() }).collect();
        let dt: DelaunayTriangulation<Vertex> = DelaunayTriangulation::bulk_load(vertices).expect("finite positions");
        let mut truth: BTreeMap<PeerId, BTreeSet<PeerId>> = BTreeMap::new();
        for e in dt.undirected_edges() {
            let [a, b] = e.vertices();
            truth.entry(a.data().id).or_default().insert(b.data().id);
            truth.entry(b.data().id).or_default().insert(a.data().id);
        }
        let (mut recall, mut precision, mut nr, mut np) = (0.0, 0.0, 0usize, 0usize);
        let (mut neigh, mut known) = (0usize, 0usize);
        for p in self.peers.values() {
            let est: BTreeSet<PeerId> = p.neighbours().map(|e| e.id).collect();
            neigh += est.len();
            known += p.known_len();
            if let Some(t) = truth.get(&p.id()) {
                let hit = est.intersection(t).count();
                recall += hit as f64 / t.len() as f64;
                nr += 1;
                if !est.is_empty() {
                    precision += hit as f64 / est.len() as f64;
                    np += 1;
                }
            }
        }
        let n = self.peers.len().max(1) as f64;
        let (success, mean_hops, p99_hops) = self.routing(&dt);
        RoundStats {
            round: self.round,
            peers: self.peers.len(),
            recall: recall / nr.max(1) as f64,
            precision: precision / np.max(1) as f64,
            mean_neighbours: neigh as f64 / n,
            mean_known: known as f64 / n,
            route_success: success,
            mean_hops,
            p99_hops,
            messages: 0,
        }
    }

    /// Lookups from random peers to random points, through the protocol's own messages
    /// (without loss); a success ends at the peer truly nearest the target.
    fn routing(&mut self, dt: &DelaunayTriangulation<Vertex>) -> (f64, f64, u32) {
        let ids: Vec<PeerId> = self.peers.keys().copied().collect();
        let side = self.cfg.side();
        let mut hops = Vec::new();
        let mut ok = 0usize;
        let samples = self.cfg.route_samples;
        for q in 0..samples {
            let src = ids[self.rng.below(ids.len() as u64) as usize];
            let target = Point::new(self.rng.unit() * side, self.rng.unit() * side);
            let want = dt.nearest_neighbor(Point2::new(target.x, target.y)).map(|v| v.data().id);
            if let Some(p) = self.peers.get_mut(&src) {
                p.lookup(q as u64, target);
            }
            self.deliver(true);
            let mut found = None;
            if let Some(p) = self.peers.get_mut(&src) {
                while let Some(e) = p.poll_event() {
                    if let Event::Found { query, closest, hops: h } = e
                        && query == q as u64
                    {
                        found = Some((closest, h));
                    }
                }
            }
            if let Some((closest, h)) = found {
                hops.push(h);
                let exact = want == Some(closest.id)
                    || want
                        .and_then(|w| self.peers.get(&w))
                        .is_some_and(|w| w.pos().dist2(target) == closest.pos.dist2(target));
                if exact {
                    ok += 1;
                }
            }
        }
        hops.sort_unstable();
        let mean = hops.iter().map(|h| f64::from(*h)).sum::<f64>() / hops.len().max(1) as f64;
        let p99 = hops.get((hops.len().saturating_sub(1) as f64 * 0.99) as usize).copied().unwrap_or(0);
        (ok as f64 / samples.max(1) as f64, mean, p99)
    }
}
