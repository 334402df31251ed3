//! The node's side of the client service that the loop feeds: the [`Hub`] (what every session
//! reads: the tick's deltas, the area-of-interest index, counts) and the grid [`AoiIndex`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, RwLock};

use metatopia_client::proto::{self, ChatView, NodeAddr, ObjectUpdate, ObjectView};
use tokio::sync::{broadcast, oneshot};

/// Events one connection may submit per second.
pub const SUBMITS_PER_SECOND: u32 = 50;
/// The side of the index's grid cells, metres.
const CELL_M: i64 = 16;

/// What the node's loop publishes to every session.
#[derive(Clone, Debug)]
pub enum Feed {
    /// A tick executed; these objects changed. Created and removed objects are found by
    /// comparing the index with what a session has sent.
    Tick {
        tick: u64,
        changed: Arc<Vec<(u64, ObjectUpdate)>>,
    },
    Chat(ChatView),
    Status(Box<proto::Status>),
    /// The sim's admin kicked or banned this account: its sessions are closed.
    Removed {
        account: String,
        why: &'static str,
    },
    /// This account's avatar crossed into the neighbour sim `sim`: sessions following it are
    /// told to move to a node of that sim.
    Moved {
        account: String,
        sim: u32,
    },
}

/// Crossed avatars remembered for `Route`.
pub const MAX_MOVED: usize = 65_536;

/// What sessions share with the node's loop.
#[derive(Debug)]
pub struct Hub {
    pub feed: broadcast::Sender<Feed>,
    pub index: RwLock<AoiIndex>,
    /// The sim this node serves and the nodes clients may connect to for it.
    pub sim: u32,
    pub nodes: Vec<NodeAddr>,
    /// Connected sessions.
    pub clients: AtomicU32,
    /// The other sims of the world and the nodes of each this node knows (found through Raynet,
    /// or listed with addresses under `[[sims]]`): where `Route` and `Moved` send clients.
    sims: RwLock<BTreeMap<u32, Vec<NodeAddr>>>,
    /// Accounts whose avatar crossed from this sim into another, and that sim (the newest
    /// crossing; beyond [`MAX_MOVED`] accounts one is forgotten to make room): where `Route`
    /// sends their clients.
    pub moved: RwLock<BTreeMap<String, u32>>,
    /// Sessions waiting for the outcome of an event they submitted (resolved by the loop after
    /// every executed tick: pushed, not polled).
    waiters: std::sync::Mutex<BTreeMap<metatopia_sim::EventId, Vec<oneshot::Sender<proto::Outcome>>>>,
}

impl Hub {
    pub fn new(sim: u32, nodes: Vec<NodeAddr>) -> Hub {
        Hub {
            feed: broadcast::channel(64).0,
            index: RwLock::new(AoiIndex::default()),
            sim,
            nodes,
            clients: AtomicU32::new(0),
            sims: RwLock::new(BTreeMap::new()),
            moved: RwLock::new(BTreeMap::new()),
            waiters: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// The nodes of another sim this node knows now.
    pub fn set_sim_nodes(&self, sim: u32, nodes: Vec<NodeAddr>) {
        self.sims.write().unwrap_or_else(|e| e.into_inner()).insert(sim, nodes);
    }

    /// The nodes of another sim clients may be sent to (none known: `None`).
    pub fn sim_nodes(&self, sim: u32) -> Option<Vec<NodeAddr>> {
        self.sims.read().unwrap_or_else(|e| e.into_inner()).get(&sim).filter(|n| !n.is_empty()).cloned()
    }

    /// An avatar crossed into `sim`: its clients are told to move there, and `Route` sends
    /// them there from now on.
    pub fn avatar_moved(&self, account: String, sim: u32) {
        {
            let mut moved = self.moved.write().unwrap_or_else(|e| e.into_inner());
            if moved.len() >= MAX_MOVED && !moved.contains_key(&account) {
                moved.pop_first();
            }
            moved.insert(account.clone(), sim);
        }
        self.publish(Feed::Moved { account, sim });
    }

    /// Tell the sessions waiting for events that now have an outcome; forget the waiters that
    /// gave up. The loop calls it after executing ticks.
    pub fn resolve(&self, outcome: impl Fn(&metatopia_sim::EventId) -> Option<proto::Outcome>) {
        let mut w = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|id, txs| {
            txs.retain(|tx| !tx.is_closed());
            match outcome(id) {
                Some(o) if !txs.is_empty() => {
                    for tx in txs.drain(..) {
                        let _ = tx.send(o.clone());
                    }
                    false
                }
                _ => !txs.is_empty(),
            }
        });
    }

    pub(crate) fn wait_for(&self, id: metatopia_sim::EventId) -> oneshot::Receiver<proto::Outcome> {
        let (tx, rx) = oneshot::channel();
        self.waiters.lock().unwrap_or_else(|e| e.into_inner()).entry(id).or_default().push(tx);
        rx
    }

    /// Whether any session listens (the loop skips building deltas otherwise).
    pub fn listened(&self) -> bool {
        self.feed.receiver_count() > 0
    }

    pub fn publish(&self, f: Feed) {
        let _ = self.feed.send(f);
    }
}

/// An object id (`SLOTvGEN`) as one number, for the index's sets.
pub fn key_of(id: &str) -> Option<u64> {
    let o = metatopia_client::conn::parse_object(id)?;
    Some((u64::from(o.slot()) << 32) | u64::from(o.generation()))
}

/// One object in the index: its view, where it is (whole metres) and its grid cell.
#[derive(Debug)]
pub(crate) struct Entry {
    view: ObjectView,
    at: [i64; 2],
    cell: (i64, i64),
    /// Position (mm) and velocity (mm/s), parsed once per change for every session's dead reckoning.
    motion: ([i64; 2], [i64; 2]),
}

/// Every object's view, on a grid of [`CELL_M`]-metre cells, and each account's avatar.
#[derive(Debug, Default)]
pub struct AoiIndex {
    pub tick: u64,
    pub(crate) objects: BTreeMap<u64, Entry>,
    pub(crate) cells: BTreeMap<(i64, i64), BTreeSet<u64>>,
    pub(crate) avatars: BTreeMap<String, u64>,
    /// The sim's area-of-interest radius setting, metres.
    pub radius_m: u32,
    /// The tick rate clients extrapolate motion at.
    pub rate_hz: u32,
}

impl AoiIndex {
    fn cell(p: [i64; 2]) -> (i64, i64) {
        (p[0].div_euclid(CELL_M), p[1].div_euclid(CELL_M))
    }

    /// Bring the index to `now` (every object of the world as the API shows it); what changed
    /// in the objects it already had.
    pub fn update(&mut self, tick: u64, now: impl Iterator<Item = ObjectView>) -> Vec<(u64, ObjectUpdate)> {
        self.tick = tick;
        let mut changed = Vec::new();
        let mut seen = BTreeSet::new();
        for v in now {
            let Some(k) = key_of(&v.id) else { continue };
            seen.insert(k);
            match self.objects.get(&k) {
                Some(e) if e.view == v => continue,
                Some(e) => {
                    changed.push((k, ObjectUpdate::between(&e.view, &v)));
                    self.remove(k);
                }
                None => {}
            }
            self.insert(k, v);
        }
        let gone: Vec<u64> = self.objects.keys().filter(|k| !seen.contains(*k)).copied().collect();
        for k in gone {
            self.remove(k);
        }
        changed
    }

    fn insert(&mut self, k: u64, view: ObjectView) {
        let motion = view.motion_mm();
        let at = [motion.0[0].div_euclid(1000), motion.0[1].div_euclid(1000)];
        let cell = Self::cell(at);
        self.cells.entry(cell).or_default().insert(k);
        if view.avatar {
            self.avatars.insert(view.owner.clone(), k);
        }
        self.objects.insert(k, Entry { view, at, cell, motion });
    }

    fn remove(&mut self, k: u64) {
        if let Some(e) = self.objects.remove(&k) {
            if let Some(set) = self.cells.get_mut(&e.cell) {
                set.remove(&k);
                if set.is_empty() {
                    self.cells.remove(&e.cell);
                }
            }
            if e.view.avatar && self.avatars.get(&e.view.owner) == Some(&k) {
                self.avatars.remove(&e.view.owner);
            }
        }
    }

    pub fn clear(&mut self) {
        *self = AoiIndex { radius_m: self.radius_m, rate_hz: self.rate_hz, ..AoiIndex::default() };
    }

    pub fn get(&self, k: u64) -> Option<&ObjectView> {
        self.objects.get(&k).map(|e| &e.view)
    }

    /// An object's position (mm) and velocity (mm/s).
    pub(crate) fn motion(&self, k: u64) -> Option<([i64; 2], [i64; 2])> {
        self.objects.get(&k).map(|e| e.motion)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Where an account's avatar stands (whole metres), if it is in the sim.
    pub fn avatar_at(&self, account: &str) -> Option<[i64; 2]> {
        self.objects.get(self.avatars.get(account)?).map(|e| e.at)
    }

    /// The objects within `radius` metres of `center`.
    pub fn within(&self, center: [i64; 2], radius: u32) -> BTreeSet<u64> {
        let r = i64::from(radius);
        let (lo, hi) = (Self::cell([center[0] - r, center[1] - r]), Self::cell([center[0] + r, center[1] + r]));
        let mut out = BTreeSet::new();
        for (_, ids) in
            self.cells.range((lo.0, i64::MIN)..=(hi.0, i64::MAX)).filter(|((_, y), _)| (lo.1..=hi.1).contains(y))
        {
            for k in ids {
                let p = self.objects[k].at;
                let (dx, dy) = (i128::from(p[0] - center[0]), i128::from(p[1] - center[1]));
                if dx * dx + dy * dy <= i128::from(r) * i128::from(r) {
                    out.insert(*k);
                }
            }
        }
        out
    }

    pub fn all(&self) -> BTreeSet<u64> {
        self.objects.keys().copied().collect()
    }
}
