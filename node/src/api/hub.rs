//! The node's side of the client service that the loop feeds: the [`Hub`] (what every session
//! reads: the area-of-interest index and the tick it is at, chat and status, counts) and the
//! grid [`AoiIndex`].
//!
//! A session makes its client's delta from the index alone: what it sent of each object it
//! knows (the motion its client extrapolates, the tick of its last delta) against the index
//! now. So a delta costs what the client's area holds, a session that falls behind skips ticks
//! instead of queueing them (and never starts over from the whole area), and the loop publishes
//! a tick as one number.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::RwLock;
use std::sync::atomic::AtomicU32;

use metatopia_client::proto::{self, ChatView, NodeAddr, ObjectUpdate, ObjectView};
use metatopia_sim::Tick;
use tokio::sync::{broadcast, oneshot, watch};

/// Events one connection may submit per second.
pub const SUBMITS_PER_SECOND: u32 = 50;
/// The side of the index's grid cells, metres.
const CELL_M: i64 = 16;

/// Lines, statuses and notices the node's loop publishes to every session (the ticks go by
/// [`Hub::ticks`]).
#[derive(Clone, Debug)]
pub enum Feed {
    /// A line, shared: a session copies it only when its client hears it.
    Chat(std::sync::Arc<ChatView>),
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

/// The most objects a client's area of interest holds: the nearest ones within its radius. In
/// a crowd (a thousand avatars on one square) every client would otherwise be sent, and kept up
/// to date on, the whole crowd: a login's first area alone a few hundred kilobytes.
pub const MAX_AREA_OBJECTS: usize = 256;

/// Lines and notices a session may be behind by before it misses some.
pub const FEED: usize = 1024;

/// Recent lines the hub keeps for sessions that start (a login, a failover): about ten
/// seconds of a crowd's chat.
pub const RECENT_CHAT: usize = 1024;

/// Lines a starting session replays at most (the newest it hears, of the last
/// [`REPLAY_TICKS`]): a viewer's scrollback, not a crowd's whole minute.
pub const REPLAY_LINES: usize = 64;

/// How far back, in ticks, a starting session's replay reaches.
pub const REPLAY_TICKS: u64 = 600;

/// Crossed avatars remembered for `Route`.
pub const MAX_MOVED: usize = 65_536;

/// What sessions share with the node's loop.
#[derive(Debug)]
pub struct Hub {
    pub feed: broadcast::Sender<Feed>,
    /// The tick the index is at, as the loop last brought it there: sessions wake on it.
    pub ticks: watch::Sender<Tick>,
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
    /// The newest lines said in the sim (at most [`RECENT_CHAT`], kept whether anyone listens
    /// or not): what a starting session replays, read without asking the loop.
    recent: std::sync::Mutex<std::collections::VecDeque<std::sync::Arc<ChatView>>>,
    /// Sessions waiting for the outcome of an event they submitted (resolved by the loop after
    /// every executed tick: pushed, not polled).
    waiters: std::sync::Mutex<BTreeMap<metatopia_sim::EventId, Vec<oneshot::Sender<proto::Outcome>>>>,
}

impl Hub {
    pub fn new(sim: u32, nodes: Vec<NodeAddr>) -> Hub {
        Hub {
            feed: broadcast::channel(FEED).0,
            ticks: watch::channel(Tick::ZERO).0,
            index: RwLock::new(AoiIndex::default()),
            sim,
            nodes,
            clients: AtomicU32::new(0),
            sims: RwLock::new(BTreeMap::new()),
            moved: RwLock::new(BTreeMap::new()),
            recent: std::sync::Mutex::new(std::collections::VecDeque::new()),
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

    /// A line was said (the loop calls it for every line, listened to or not); the oldest kept
    /// is forgotten beyond [`RECENT_CHAT`].
    pub fn said(&self, line: std::sync::Arc<ChatView>) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent.len() >= RECENT_CHAT {
            recent.pop_front();
        }
        recent.push_back(line);
    }

    /// The newest public lines since `since` that `hears` accepts, at most `max`, oldest first.
    pub fn replay(&self, since: Tick, max: usize, hears: impl Fn(&ChatView) -> bool) -> Vec<std::sync::Arc<ChatView>> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let mut lines: Vec<_> = recent
            .iter()
            .rev()
            .take_while(|l| l.tick >= since)
            .filter(|l| l.to.is_none() && hears(l))
            .take(max)
            .cloned()
            .collect();
        lines.reverse();
        lines
    }

    /// The index is at `tick` now: sessions make their deltas.
    pub fn publish_tick(&self, tick: Tick) {
        self.ticks.send_replace(tick);
    }
}

/// Whether two views of an object differ in their motion at most.
fn same_fields(a: &ObjectView, b: &ObjectView) -> bool {
    a.text == b.text
        && a.color == b.color
        && a.shape == b.shape
        && a.name == b.name
        && a.owner == b.owner
        && a.scripted == b.scripted
        && a.body == b.body
        && a.surface == b.surface
}

/// An object id (`SLOTvGEN`) as one number, for the index's sets.
pub fn key_of(id: &str) -> Option<u64> {
    let o = metatopia_client::conn::parse_object(id)?;
    Some((u64::from(o.slot()) << 32) | u64::from(o.generation()))
}

/// What an object's view is made of, kept beside the view so that a tick compares these
/// (copies of plain values) instead of building the view of every object (about ten strings
/// each); the name and the text are compared with the view's own.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Raw {
    kind: metatopia_sim::state::ObjectKind,
    owner: metatopia_sim::AccountId,
    position: metatopia_sim::Vec2,
    velocity: metatopia_sim::Vec2,
    shape: metatopia_sim::state::Shape,
    color: u32,
    scripted: bool,
    body: metatopia_sim::state::BodyKind,
    surface: Option<metatopia_sim::state::Surface>,
}

impl Raw {
    /// Whether only the motion (position, velocity) differs.
    fn same_but_motion(&self, other: &Raw) -> bool {
        (self.kind, self.owner, self.shape, self.color, self.scripted, self.body, self.surface)
            == (other.kind, other.owner, other.shape, other.color, other.scripted, other.body, other.surface)
    }

    fn of(w: &metatopia_sim::World, o: &metatopia_sim::Object) -> Raw {
        Raw {
            kind: o.kind,
            owner: o.owner,
            position: o.position,
            velocity: o.velocity,
            shape: o.shape,
            color: o.color,
            scripted: w.script_source(o.id).is_some(),
            body: o.body,
            surface: o.surface,
        }
    }
}

/// Whole millimetres of `v` exactly as a client reads them from its decimal text
/// ([`proto::millimetres`] of its display), the text written on the stack: no allocation.
fn mm_of(v: metatopia_sim::Fx) -> i64 {
    use std::fmt::Write;
    struct Text([u8; 48], usize);
    impl Write for Text {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let end = self.1 + s.len();
            self.0.get_mut(self.1..end).ok_or(std::fmt::Error)?.copy_from_slice(s.as_bytes());
            self.1 = end;
            Ok(())
        }
    }
    let mut t = Text([0; 48], 0);
    if write!(t, "{v}").is_err() {
        return 0;
    }
    std::str::from_utf8(&t.0[..t.1]).map_or(0, proto::millimetres)
}

/// One object in the index: its view, where it is (whole metres) and its grid cell.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Its view; when `stale`, with the position and velocity it had when the view was built.
    pub(crate) view: ObjectView,
    /// What the view was built from (`None`: given as a view).
    raw: Option<Raw>,
    /// Only the object's motion changed since its view was built: `raw` and `motion` are
    /// current, the view's position and velocity text is not ([`Entry::view_now`]).
    stale: bool,
    at: [i64; 2],
    cell: (i64, i64),
    /// Position (mm) and velocity (mm/s), parsed once per change for every session's dead reckoning.
    pub(crate) motion: ([i64; 2], [i64; 2]),
    /// When its other fields last changed, and how.
    pub(crate) meta: Meta,
}

impl Entry {
    /// Its whole view as of now (what an entering object is sent as).
    pub(crate) fn view_now(&self) -> ObjectView {
        let mut v = self.view.clone();
        if let (true, Some(r)) = (self.stale, &self.raw) {
            v.position = [r.position.x.to_string(), r.position.y.to_string()];
            v.velocity = [r.velocity.x.to_string(), r.velocity.y.to_string()];
        }
        v
    }
}

/// When an object's fields other than its motion last changed: a session whose last delta
/// is at or after `prev` needs only `diff`; one further behind (or that never had it), the
/// whole of them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Meta {
    pub tick: Tick,
    pub prev: Tick,
    /// What changed at `tick` (no motion), `None` when it came into the index then.
    pub diff: Option<Box<ObjectUpdate>>,
}

impl Meta {
    fn after(old: Meta, tick: Tick, u: &ObjectUpdate) -> Meta {
        if u.is_motion_only() {
            return old;
        }
        let diff = ObjectUpdate { at_mm: None, vel_mm: None, ..u.clone() };
        Meta { tick, prev: old.tick, diff: Some(Box::new(diff)) }
    }
}

/// An object of a grid cell: its key and where it is (whole metres).
pub(crate) type Placed = (u64, [i64; 2]);

/// The index's objects by slot: an object id's slot is small and dense (the sim reuses freed
/// slots) and its generation tells a slot's successive objects apart, so a lookup (every
/// session, every object it knows, every delta) is an index and a comparison, not a tree walk.
/// Keys come out in key order.
#[derive(Debug, Default)]
pub(crate) struct Objects {
    pub(crate) slots: Vec<Option<(u32, Entry)>>,
    len: usize,
}

impl Objects {
    fn split(k: u64) -> (usize, u32) {
        ((k >> 32) as usize, k as u32)
    }

    pub(crate) fn get(&self, k: u64) -> Option<&Entry> {
        let (slot, generation) = Self::split(k);
        match self.slots.get(slot) {
            Some(Some((g, e))) if *g == generation => Some(e),
            _ => None,
        }
    }

    fn get_mut(&mut self, k: u64) -> Option<&mut Entry> {
        let (slot, generation) = Self::split(k);
        match self.slots.get_mut(slot) {
            Some(Some((g, e))) if *g == generation => Some(e),
            _ => None,
        }
    }

    /// The key of the object in `k`'s slot, whichever its generation.
    fn occupant(&self, k: u64) -> Option<u64> {
        let (slot, _) = Self::split(k);
        let (g, _) = self.slots.get(slot)?.as_ref()?;
        Some(((slot as u64) << 32) | u64::from(*g))
    }

    /// Put `e` under `k`, in place of whatever its slot held.
    fn insert(&mut self, k: u64, e: Entry) {
        let (slot, generation) = Self::split(k);
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || None);
        }
        if self.slots[slot].replace((generation, e)).is_none() {
            self.len += 1;
        }
    }

    fn remove(&mut self, k: u64) -> Option<Entry> {
        let (slot, generation) = Self::split(k);
        match self.slots.get_mut(slot) {
            Some(s @ Some(_)) if s.as_ref().is_some_and(|(g, _)| *g == generation) => {
                self.len -= 1;
                let e = s.take().map(|(_, e)| e);
                // The room of a world that shrank goes back.
                while self.slots.last().is_some_and(Option::is_none) {
                    self.slots.pop();
                }
                e
            }
            _ => None,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every object with its key, in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &Entry)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| s.as_ref().map(|(g, e)| (((slot as u64) << 32) | u64::from(*g), e)))
    }

    pub(crate) fn keys(&self) -> impl Iterator<Item = u64> {
        self.iter().map(|(k, _)| k)
    }
}

/// Every object's view, on a grid of `CELL_M`-metre cells, and each account's avatar.
#[derive(Debug, Default)]
pub struct AoiIndex {
    pub tick: Tick,
    pub(crate) objects: Objects,
    /// Each cell's objects by key, with where they are (whole metres).
    pub(crate) cells: BTreeMap<(i64, i64), Vec<Placed>>,
    pub(crate) avatars: BTreeMap<String, u64>,
    /// The index's keys, reused by [`AoiIndex::update_world`] from tick to tick.
    pub(crate) scratch: Vec<u64>,
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
    pub fn update(&mut self, tick: Tick, now: impl Iterator<Item = ObjectView>) -> Vec<(u64, ObjectUpdate)> {
        self.tick = tick;
        let mut changed = Vec::new();
        let mut seen = BTreeSet::new();
        for v in now {
            let Some(k) = key_of(&v.id) else { continue };
            seen.insert(k);
            match self.objects.get_mut(k) {
                Some(e) if e.view == v => continue,
                Some(e) => {
                    let u = ObjectUpdate::between(&e.view, &v);
                    let meta = Meta::after(std::mem::take(&mut e.meta), tick, &u);
                    changed.push((k, u));
                    self.replace(k, v, meta);
                }
                None => self.insert(k, v),
            }
        }
        let gone: Vec<u64> = self.objects.keys().filter(|k| !seen.contains(k)).collect();
        for k in gone {
            self.remove(k);
        }
        changed
    }

    /// Bring the index to the world after a tick, building the views (`view`) of the objects
    /// whose other fields changed only: an unchanged object costs a comparison of plain values,
    /// a moving one its motion in millimetres and its place on the grid (sessions send motion
    /// as numbers; its view's text is brought up to date when it is sent whole). How many of
    /// the objects it already had changed.
    pub fn update_world(
        &mut self,
        tick: Tick,
        w: &metatopia_sim::World,
        view: impl Fn(&metatopia_sim::Object) -> ObjectView,
    ) -> usize {
        self.tick = tick;
        let mut changed = 0;
        // The index's keys and the world's objects, both in key order (slot, then generation):
        // a key of the index the walk passes without meeting its object is gone.
        let mut old = std::mem::take(&mut self.scratch);
        old.clear();
        old.extend(self.objects.keys());
        let mut next_old = 0;
        let mut last = None;
        for o in w.objects().values() {
            let k = (u64::from(o.id.slot()) << 32) | u64::from(o.id.generation());
            debug_assert!(last < Some(k), "objects come in key order");
            last = Some(k);
            while old.get(next_old).is_some_and(|g| *g < k) {
                self.remove(old[next_old]);
                next_old += 1;
            }
            if old.get(next_old) == Some(&k) {
                next_old += 1;
            }
            let raw = Raw::of(w, o);
            match self.objects.get_mut(k) {
                Some(e) if e.raw.as_ref() == Some(&raw) && e.view.name == o.name && e.view.text == o.text => {}
                Some(e)
                    if e.raw.as_ref().is_some_and(|r| r.same_but_motion(&raw))
                        && e.view.name == o.name
                        && e.view.text == o.text =>
                {
                    let motion = (
                        [mm_of(raw.position.x), mm_of(raw.position.y)],
                        [mm_of(raw.velocity.x), mm_of(raw.velocity.y)],
                    );
                    (e.raw, e.stale) = (Some(raw), true);
                    changed += 1;
                    self.moved(k, motion);
                }
                Some(e) => {
                    let v = view(o);
                    // (A view whose text is stale is replaced whatever it reads: its motion was
                    // set from numbers since, and is set from this view now.)
                    if !e.stale && e.view == v {
                        e.raw = Some(raw);
                        continue;
                    }
                    let old = std::mem::take(&mut e.meta);
                    let meta = if same_fields(&e.view, &v) {
                        old
                    } else {
                        Meta::after(old, tick, &ObjectUpdate::between(&e.view, &v))
                    };
                    changed += 1;
                    self.replace(k, v, meta);
                    self.objects.get_mut(k).expect("just replaced").raw = Some(raw);
                }
                None => {
                    self.insert(k, view(o));
                    self.objects.get_mut(k).expect("just inserted").raw = Some(raw);
                }
            }
        }
        for g in &old[next_old..] {
            self.remove(*g);
        }
        self.scratch = old;
        changed
    }

    fn insert(&mut self, k: u64, view: ObjectView) {
        // A slot's earlier object, gone from the world, leaves its cell and avatar entries too.
        if let Some(old) = self.objects.occupant(k).filter(|o| *o != k) {
            self.remove(old);
        }
        let motion = view.motion_mm();
        let at = [motion.0[0].div_euclid(1000), motion.0[1].div_euclid(1000)];
        let cell = Self::cell(at);
        let objects = self.cells.entry(cell).or_default();
        if let Err(i) = objects.binary_search_by_key(&k, |(k, _)| *k) {
            objects.insert(i, (k, at));
        }
        if view.avatar {
            self.avatars.insert(view.owner.clone(), k);
        }
        let meta = Meta { tick: self.tick, prev: self.tick, diff: None };
        self.objects.insert(k, Entry { view, raw: None, stale: false, at, cell, motion, meta });
    }

    /// A known object's new view: moved between cells only when its cell changed, its avatar
    /// entry touched only when its owner or kind did (a walking crowd costs no allocation).
    fn replace(&mut self, k: u64, view: ObjectView, meta: Meta) {
        let Some(e) = self.objects.get(k) else {
            self.insert(k, view);
            return;
        };
        if e.view.avatar != view.avatar || e.view.owner != view.owner {
            self.remove(k);
            self.insert(k, view);
            self.objects.get_mut(k).expect("just inserted").meta = meta;
            return;
        }
        let motion = view.motion_mm();
        self.moved(k, motion);
        if let Some(e) = self.objects.get_mut(k) {
            (e.view, e.stale, e.meta) = (view, false, meta);
        }
    }

    /// A known object's motion now: its place on the grid follows (another cell only when it
    /// crossed into one).
    fn moved(&mut self, k: u64, motion: ([i64; 2], [i64; 2])) {
        let at = [motion.0[0].div_euclid(1000), motion.0[1].div_euclid(1000)];
        let cell = Self::cell(at);
        let Some(e) = self.objects.get_mut(k) else { return };
        let old = std::mem::replace(&mut e.cell, cell);
        (e.at, e.motion) = (at, motion);
        if old != cell
            && let Some(objects) = self.cells.get_mut(&old)
        {
            if let Ok(i) = objects.binary_search_by_key(&k, |(k, _)| *k) {
                objects.remove(i);
            }
            if objects.is_empty() {
                self.cells.remove(&old);
            }
        }
        let objects = self.cells.entry(cell).or_default();
        match objects.binary_search_by_key(&k, |(k, _)| *k) {
            Ok(i) => objects[i].1 = at,
            Err(i) => objects.insert(i, (k, at)),
        }
    }

    fn remove(&mut self, k: u64) {
        if let Some(e) = self.objects.remove(k) {
            if let Some(objects) = self.cells.get_mut(&e.cell) {
                if let Ok(i) = objects.binary_search_by_key(&k, |(k, _)| *k) {
                    objects.remove(i);
                }
                if objects.is_empty() {
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

    /// An object's whole view as of now.
    pub fn get(&self, k: u64) -> Option<ObjectView> {
        self.objects.get(k).map(Entry::view_now)
    }

    /// An object's view, motion and the last change of its other fields.
    pub(crate) fn entry(&self, k: u64) -> Option<&Entry> {
        self.objects.get(k)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.len() == 0
    }

    /// Where an account's avatar stands (whole metres), if it is in the sim.
    pub fn avatar_at(&self, account: &str) -> Option<[i64; 2]> {
        self.objects.get(*self.avatars.get(account)?).map(|e| e.at)
    }

    /// The objects within `radius` metres of `center`, into `out` (cleared first) in key order.
    pub fn within(&self, center: [i64; 2], radius: u32, out: &mut Vec<u64>) {
        out.clear();
        let r = i64::from(radius);
        let (lo, hi) = (Self::cell([center[0] - r, center[1] - r]), Self::cell([center[0] + r, center[1] + r]));
        for (_, objects) in
            self.cells.range((lo.0, i64::MIN)..=(hi.0, i64::MAX)).filter(|((_, y), _)| (lo.1..=hi.1).contains(y))
        {
            for (k, p) in objects {
                let (dx, dy) = (i128::from(p[0] - center[0]), i128::from(p[1] - center[1]));
                if dx * dx + dy * dy <= i128::from(r) * i128::from(r) {
                    out.push(*k);
                }
            }
        }
        out.sort_unstable();
    }

    /// The `max` objects nearest `center` within `radius` metres, into `out` (cleared first) in
    /// key order; at equal distances the smaller key is nearer. A crowd's dense middle costs
    /// each of its clients `max` objects, not the crowd.
    pub fn nearest(&self, center: [i64; 2], radius: u32, max: usize, out: &mut Vec<u64>) {
        self.within(center, radius, out);
        if out.len() <= max {
            return;
        }
        let distance = |k: u64| {
            self.objects.get(k).map_or(i128::MAX, |e| {
                let (dx, dy) = (i128::from(e.at[0] - center[0]), i128::from(e.at[1] - center[1]));
                dx * dx + dy * dy
            })
        };
        let mut by_distance: Vec<(i128, u64)> = out.iter().map(|k| (distance(*k), *k)).collect();
        if max > 0 {
            by_distance.select_nth_unstable(max - 1);
        }
        by_distance.truncate(max);
        out.clear();
        out.extend(by_distance.into_iter().map(|(_, k)| k));
        out.sort_unstable();
    }

    /// Every object, into `out` (cleared first) in key order.
    pub fn all(&self, out: &mut Vec<u64>) {
        out.clear();
        out.extend(self.objects.keys());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::http::object_view;
    use metatopia_sim::genesis::{DemoSpec, EventGen, demo_world, tick_time_ms};
    use metatopia_sim::kinematic::KinematicPhysics;
    use metatopia_sim::rules::RuleHost;
    use metatopia_sim::{Hash32, Sim, VerifiedBatch};

    /// A starting session replays the newest lines it hears, at most `max`, oldest first,
    /// from the hub's ring, which keeps [`RECENT_CHAT`] lines at most.
    #[test]
    fn the_replay_is_the_newest_lines_heard_oldest_first_and_the_ring_is_bounded() {
        let hub = Hub::new(1, Vec::new());
        let line = |tick: u64, text: String| {
            std::sync::Arc::new(ChatView {
                tick: Tick(tick),
                name: "bob".into(),
                channel: 0,
                text,
                position: [0, 0],
                range_m: 20,
                to: None,
            })
        };
        for t in 0..(RECENT_CHAT as u64 + 500) {
            hub.said(line(t, format!("{t}")));
        }
        assert_eq!(hub.recent.lock().unwrap().len(), RECENT_CHAT);
        let texts = |v: Vec<std::sync::Arc<ChatView>>| v.iter().map(|l| l.text.clone()).collect::<Vec<_>>();
        let even = |l: &ChatView| l.text.parse::<u64>().unwrap() % 2 == 0;
        let newest = RECENT_CHAT as u64 + 499;
        assert_eq!(texts(hub.replay(Tick(0), 3, even)), [newest - 5, newest - 3, newest - 1].map(|t| t.to_string()));
        assert_eq!(texts(hub.replay(Tick(newest - 1), 64, |_| true)), [newest - 1, newest].map(|t| t.to_string()));
        // Beyond the ring's bound the oldest lines are gone.
        assert_eq!(hub.replay(Tick(0), usize::MAX, |_| true).len(), RECENT_CHAT);
    }

    /// Walking the world and comparing plain values gives the index (and the changes) that
    /// building every object's view gives, tick after tick, with objects moving, recoloured,
    /// retexted, scripted, rezzed and removed by the demo world's bots.
    /// The index's millimetres of a moving object are the ones a client reads from the text
    /// of its view, for every value (a position just below a millimetre prints as that
    /// millimetre), so both ends dead reckon from the same numbers.
    #[test]
    fn millimetres_without_text_are_the_texts_millimetres() {
        let edges = [0, 1, -1, 65, -65, 66, i64::MAX >> 17, -(i64::MAX >> 17), metatopia_sim::Fx::MAX.to_bits()];
        let values = (-(1i64 << 21)..(1 << 21)).step_by(7).chain((0..4_000).map(|i| i * 1_000_003_721)).chain(edges);
        for bits in values {
            let v = metatopia_sim::Fx::from_bits(bits);
            assert_eq!(mm_of(v), proto::millimetres(&v.to_string()), "{v}");
        }
    }

    #[test]
    fn the_world_walk_gives_what_building_every_view_gives() {
        let demo = demo_world(DemoSpec {
            seed: 3,
            objects: 300,
            players: 20,
            scripted_per_mille: 200,
            moving_per_mille: 300,
            ..DemoSpec::default()
        });
        let mut bots = EventGen::new(&demo, 3);
        let rate = demo.world.settings().tick_rate_hz;
        let mut sim = Sim::new(demo.world, RuleHost::default(), KinematicPhysics::default(), 1).unwrap();
        let (mut full, mut walk) = (AoiIndex::default(), AoiIndex::default());
        let mut changes = 0;
        for _ in 0..60 {
            let w = sim.world();
            let t = w.tick().0;
            let a = full.update(Tick(t), w.objects().values().map(|o| object_view(w, o, false)));
            let b = walk.update_world(Tick(t), w, |o| object_view(w, o, false));
            assert_eq!(a.len(), b, "tick {t}");
            changes += b;
            // The same last change of every object's other fields, for every session's delta.
            let metas = |i: &AoiIndex| {
                i.objects.iter().map(|(k, e)| (k, e.meta.tick, e.meta.prev, e.meta.diff.clone())).collect::<Vec<_>>()
            };
            assert_eq!(metas(&full), metas(&walk), "tick {t}");
            let views = |i: &AoiIndex| i.objects.iter().map(|(k, e)| (k, e.view_now(), e.motion)).collect::<Vec<_>>();
            assert_eq!(views(&full), views(&walk), "tick {t}");
            assert_eq!((&full.cells, &full.avatars), (&walk.cells, &walk.avatars), "tick {t}");
            let tick = w.tick();
            let mut batch = bots.batch(w, tick, 30);
            batch.time_ms = tick_time_ms(tick, rate).max(w.time_ms());
            batch.seed = Hash32(*blake3::hash(&tick.0.to_le_bytes()).as_bytes());
            sim.step(&VerifiedBatch::new(batch, 1)).unwrap();
        }
        assert!(changes > 100, "the world changed: {changes} changes");
    }
}
