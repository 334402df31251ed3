//! World state: objects, scripts, accounts, governance and settings, in ordered collections,
//! with the Merkle caches that make the state root incremental.
//!
//! Mutation goes through `World`'s methods, which keep the caches honest: every change to an
//! object, script instance or account marks its slot dirty.

pub mod near;
pub mod types;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::fx::Fx;
use crate::ids::{AccountId, Hash32, ObjectId, ScriptId, SimId, Tick};
use crate::links::{Links, Neighbour};
use crate::merkle::{self, SlotTree, keys};
use crate::objects::Objects;
use crate::vec2::Vec2;
use crate::wide;

pub use types::*;

/// The replicated state of one sim.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct World {
    pub(crate) sim: SimId,
    /// The next tick to execute.
    pub(crate) tick: Tick,
    /// BFT time of the last executed batch.
    pub(crate) time_ms: u64,
    pub(crate) region: Region,
    pub(crate) settings: Settings,
    pub(crate) governance: Governance,
    pub(crate) accounts: BTreeMap<AccountId, Account>,
    pub(crate) objects: Objects,
    pub(crate) scripts: BTreeMap<ObjectId, ScriptInstance>,
    pub(crate) sources: BTreeMap<ScriptId, ScriptSource>,
    /// Object slot high-water mark.
    pub(crate) next_slot: u32,
    /// Freed object slots and the generation their next object gets.
    pub(crate) free_slots: BTreeMap<u32, u32>,
    pub(crate) next_account_slot: u32,
    /// Events for the next tick.
    pub(crate) queue: Vec<Queued>,
    /// Scripts attached outside a tick (genesis, scenario files) whose `on_init` runs next tick.
    pub(crate) pending_init: BTreeSet<ObjectId>,
    /// Rejections of the last executed tick.
    pub(crate) receipts: Vec<Rejection>,
    /// Neighbour sims and the mail and objects crossing to and from them.
    pub(crate) links: Links,
    #[serde(skip)]
    pub(crate) cache: RootCache,
}

/// Merkle caches; rebuilt from state after decoding.
#[derive(Clone, Debug, Default)]
pub(crate) struct RootCache {
    objects: SlotTree,
    scripts: SlotTree,
    accounts: SlotTree,
    /// Object slots changed since the last root (a slot's leaf is that of its occupant at the
    /// time of the root, so a slot freed and reused in one tick ends with its newest one), and
    /// those whose occupant's fixed part changed ([`Object::fixed_bytes`]: its digest, kept
    /// beside the object in [`Objects`], is recomputed only then).
    changed: SlotMarks,
    dirty_scripts: BTreeSet<ObjectId>,
    dirty_accounts: BTreeSet<AccountId>,
    sources_root: Option<Hash32>,
    /// How many script instances run each source (derived; built on first use).
    source_refs: Option<BTreeMap<ScriptId, u32>>,
    built: bool,
}

/// Marks on object slots, as bitmaps: `dirty`, the slot's leaf must be rehashed; `fixed`, so
/// must the digest of its occupant's fixed part. (A `BTreeSet` of ids cost more to fill and
/// drain each tick than the leaves it named cost to hash.)
#[derive(Clone, Debug, Default)]
struct SlotMarks {
    dirty: Vec<u64>,
    fixed: Vec<u64>,
}

impl SlotMarks {
    fn mark(&mut self, slot: u32, fixed_too: bool) {
        let (word, bit) = ((slot / 64) as usize, 1u64 << (slot % 64));
        if word >= self.dirty.len() {
            self.dirty.resize(word + 1, 0);
            self.fixed.resize(word + 1, 0);
        }
        self.dirty[word] |= bit;
        if fixed_too {
            self.fixed[word] |= bit;
        }
    }

    /// The marked slots in increasing order, and those among them marked `fixed`; clears
    /// every mark.
    fn take(&mut self) -> (Vec<u32>, Vec<u32>) {
        fn push_bits(out: &mut Vec<u32>, word: usize, mut bits: u64) {
            while bits != 0 {
                out.push(word as u32 * 64 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        let count = |words: &[u64]| words.iter().map(|w| w.count_ones() as usize).sum();
        let (mut dirty, mut fixed) = (Vec::with_capacity(count(&self.dirty)), Vec::with_capacity(count(&self.fixed)));
        for (w, d) in self.dirty.iter_mut().enumerate() {
            push_bits(&mut dirty, w, std::mem::take(d));
        }
        if fixed.capacity() > 0 {
            for (w, f) in self.fixed.iter_mut().enumerate() {
                push_bits(&mut fixed, w, std::mem::take(f));
            }
        }
        (dirty, fixed)
    }
}

/// The per-subsystem roots under the state root (DESIGN §4 step 7).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct SubsystemRoots {
    pub objects: Hash32,
    pub scripts: Hash32,
    pub physics: Hash32,
    /// Accounts, governance, settings and the tick's receipts.
    pub governance: Hash32,
    pub queue: Hash32,
}

impl SubsystemRoots {
    /// The state root over the subsystem roots.
    pub fn root(&self) -> Hash32 {
        merkle::combine(
            &keys::ROOT,
            &[&self.objects.0, &self.scripts.0, &self.physics.0, &self.governance.0, &self.queue.0],
        )
    }
}

/// Parameters of a new world.
#[derive(Clone, Debug)]
pub struct Genesis {
    pub sim: SimId,
    pub region: Region,
    pub admin: AccountId,
    pub validators: BTreeSet<AccountId>,
    pub settings: Settings,
    pub time_ms: u64,
}

impl World {
    pub fn new(g: Genesis) -> World {
        World {
            sim: g.sim,
            tick: Tick::ZERO,
            time_ms: g.time_ms,
            region: g.region,
            settings: g.settings,
            governance: Governance {
                admin: g.admin,
                genesis_ms: g.time_ms,
                validators: g.validators,
                pending_validators: BTreeMap::new(),
                banned: BTreeSet::new(),
                kicked_until_ms: BTreeMap::new(),
            },
            accounts: BTreeMap::new(),
            objects: Objects::default(),
            scripts: BTreeMap::new(),
            sources: BTreeMap::new(),
            next_slot: 0,
            free_slots: BTreeMap::new(),
            next_account_slot: 0,
            queue: Vec::new(),
            pending_init: BTreeSet::new(),
            receipts: Vec::new(),
            links: Links::default(),
            cache: RootCache::default(),
        }
    }

    // ---- reading ----

    pub fn sim(&self) -> SimId {
        self.sim
    }
    pub fn tick(&self) -> Tick {
        self.tick
    }
    pub fn time_ms(&self) -> u64 {
        self.time_ms
    }
    pub fn region(&self) -> &Region {
        &self.region
    }
    pub fn settings(&self) -> &Settings {
        &self.settings
    }
    pub fn governance(&self) -> &Governance {
        &self.governance
    }
    pub fn accounts(&self) -> &BTreeMap<AccountId, Account> {
        &self.accounts
    }
    pub fn account(&self, id: &AccountId) -> Option<&Account> {
        self.accounts.get(id)
    }
    /// The objects, in id order, held by slot ([`Objects`]).
    pub fn objects(&self) -> &Objects {
        &self.objects
    }
    pub fn object(&self, id: ObjectId) -> Option<&Object> {
        self.objects.get(&id)
    }
    pub fn scripts(&self) -> &BTreeMap<ObjectId, ScriptInstance> {
        &self.scripts
    }
    pub fn script(&self, object: ObjectId) -> Option<&ScriptInstance> {
        self.scripts.get(&object)
    }
    pub fn sources(&self) -> &BTreeMap<ScriptId, ScriptSource> {
        &self.sources
    }
    /// Any object's script source, licence, author and provenance: readable by anyone.
    pub fn script_source(&self, object: ObjectId) -> Option<&ScriptSource> {
        self.scripts.get(&object).and_then(|i| self.sources.get(&i.script))
    }
    pub fn queue(&self) -> &[Queued] {
        &self.queue
    }
    /// Rejections recorded by the last executed tick.
    /// Neighbour sims, mail waiting for its quorum, objects in transit.
    pub fn links(&self) -> &Links {
        &self.links
    }

    pub fn receipts(&self) -> &[Rejection] {
        &self.receipts
    }

    /// Objects whose centre lies within `radius` of `centre`, in id order.
    pub fn objects_within(&self, centre: Vec2, radius: Fx) -> impl Iterator<Item = &Object> {
        self.objects.values().filter(move |o| o.position.within(centre, radius))
    }

    // ---- changing (crate-internal: the pipeline is the only writer) ----

    /// Allocate an id for a new object: the lowest free slot, else a new one.
    pub(crate) fn allocate_object_id(&mut self) -> ObjectId {
        if let Some((&slot, &generation)) = self.free_slots.iter().next() {
            self.free_slots.remove(&slot);
            ObjectId::new(slot, generation)
        } else {
            let slot = self.next_slot;
            self.next_slot += 1;
            ObjectId::new(slot, 0)
        }
    }

    pub(crate) fn object_count(&self) -> u32 {
        self.objects.len() as u32
    }

    /// Genesis editing: the sim's validator keys. After genesis they change only through
    /// admin acts, at epoch boundaries.
    pub fn set_genesis_validators(&mut self, validators: impl IntoIterator<Item = AccountId>) {
        self.governance.validators = validators.into_iter().collect();
    }

    /// Genesis editing: the permanent admin. After genesis it changes only by `TransferAdmin`.
    pub fn set_genesis_admin(&mut self, admin: AccountId) {
        self.governance.admin = admin;
    }

    /// Genesis editing: a new object; its id. After genesis objects appear only through events.
    #[allow(clippy::too_many_arguments)]
    pub fn add_genesis_object(
        &mut self,
        kind: ObjectKind,
        owner: AccountId,
        name: String,
        shape: Shape,
        position: Vec2,
        velocity: Vec2,
        color: u32,
        text: String,
        body: BodyKind,
    ) -> ObjectId {
        let id = self.allocate_object_id();
        let rotation = Fx::ZERO;
        let surface = None;
        self.put_object(Object {
            id,
            kind,
            owner,
            name,
            shape,
            position,
            rotation,
            velocity,
            color,
            text,
            body,
            surface,
        });
        id
    }

    /// Genesis editing: the neighbour sims (whose validators vouch for their mail) and the
    /// walls around the whole world. Ids must be below [`crate::links::MAX_NEIGHBOUR_SIM`].
    pub fn set_genesis_neighbours(
        &mut self,
        neighbours: impl IntoIterator<Item = (SimId, Neighbour)>,
        bounds: (Vec2, Vec2),
    ) -> Result<(), String> {
        let links = Links { neighbours: neighbours.into_iter().collect(), bounds: Some(bounds), ..Links::default() };
        if links.neighbours.contains_key(&self.sim) {
            return Err(format!("{} lists itself as a neighbour", self.sim));
        }
        links.validate()?;
        self.links = links;
        Ok(())
    }

    /// Genesis editing: move the genesis to BFT time `time_ms` (a real Unix time in
    /// milliseconds on real nodes). Worlds are built at time 0 with accounts whose `joined_at`
    /// and `last_login` are offsets from genesis; this shifts those by `time_ms` too, so an
    /// account that "joined a day after genesis" still did. Only meaningful at tick 0.
    pub fn set_genesis_time(&mut self, time_ms: u64) {
        let shift = time_ms.saturating_sub(self.governance.genesis_ms);
        self.time_ms = time_ms;
        self.governance.genesis_ms = time_ms;
        for a in self.accounts.values_mut() {
            a.joined_at_ms = a.joined_at_ms.saturating_add(shift);
            a.last_login_ms = a.last_login_ms.saturating_add(shift);
            self.cache.dirty_accounts.insert(a.id);
        }
    }

    /// Genesis editing: an account that exists from genesis (the admin's, for one), joined and
    /// last logged in at the genesis time.
    pub fn add_genesis_account(&mut self, id: AccountId, name: String) {
        let at = self.governance.genesis_ms;
        self.create_account(id, name, at);
    }

    /// Genesis editing: the settings. After genesis they change only through admin acts.
    pub fn set_genesis_settings(&mut self, settings: Settings) {
        self.settings = settings;
    }

    /// Insert or replace an object. The tick pipeline is the normal writer; tools, tests and
    /// benchmarks may use this too (the Merkle caches stay correct).
    pub fn put_object(&mut self, o: Object) {
        let slot = o.id.slot();
        let same_fixed = self.objects.by_slot(slot).is_some_and(|old| old.same_fixed_part(&o));
        self.cache.changed.mark(slot, !same_fixed);
        self.objects.insert(o, same_fixed);
    }

    /// Change an object in place (marks it for rehashing, all of it). See
    /// [`World::put_object`]; [`World::set_motion`] is cheaper for a move.
    pub fn object_mut(&mut self, id: ObjectId) -> Option<&mut Object> {
        let o = self.objects.get_mut(&id)?;
        self.cache.changed.mark(id.slot(), true);
        Some(o)
    }

    /// Move an object (what the physics stage writes each tick): only its leaf is rehashed,
    /// not the digest of its fixed part. False if there is no such object.
    pub fn set_motion(&mut self, id: ObjectId, position: Vec2, rotation: Fx, velocity: Vec2) -> bool {
        let Some(o) = self.objects.get_mut(&id) else { return false };
        o.position = position;
        o.rotation = rotation;
        o.velocity = velocity;
        self.cache.changed.mark(id.slot(), false);
        true
    }

    /// Remove an object and its script; frees the slot for the next generation.
    pub(crate) fn remove_object(&mut self, id: ObjectId) -> Option<Object> {
        let o = self.objects.remove(&id)?;
        self.cache.changed.mark(id.slot(), false);
        self.remove_script(id);
        self.free_slots.insert(id.slot(), id.generation().wrapping_add(1));
        if let Some(a) = self.accounts.get_mut(&o.owner)
            && a.avatar == Some(id)
        {
            a.avatar = None;
            self.cache.dirty_accounts.insert(a.id);
        }
        Some(o)
    }

    pub(crate) fn put_script(&mut self, object: ObjectId, instance: ScriptInstance) {
        self.cache.dirty_scripts.insert(object);
        self.source_refs(); // build the counts before changing what they count
        let new = instance.script;
        let old = self.scripts.insert(object, instance).map(|o| o.script);
        if old != Some(new) {
            *self.source_refs().entry(new).or_insert(0) += 1;
            if let Some(old) = old {
                self.release_source(old);
            }
        }
    }

    pub(crate) fn remove_script(&mut self, object: ObjectId) {
        self.source_refs(); // build the counts before changing what they count
        if let Some(old) = self.scripts.remove(&object) {
            self.cache.dirty_scripts.insert(object);
            self.release_source(old.script);
        }
    }

    pub(crate) fn add_source(&mut self, s: ScriptSource) -> ScriptId {
        let id = s.id();
        if let std::collections::btree_map::Entry::Vacant(e) = self.sources.entry(id) {
            e.insert(s);
            self.cache.sources_root = None;
        }
        id
    }

    fn source_refs(&mut self) -> &mut BTreeMap<ScriptId, u32> {
        let scripts = &self.scripts;
        self.cache.source_refs.get_or_insert_with(|| {
            let mut refs = BTreeMap::new();
            for i in scripts.values() {
                *refs.entry(i.script).or_insert(0) += 1;
            }
            refs
        })
    }

    /// One instance stopped running `id`; drop the source when nobody runs it any more
    /// (sources are content-addressed and shared).
    fn release_source(&mut self, id: ScriptId) {
        let refs = self.source_refs();
        let n = refs.get(&id).copied().unwrap_or(0).saturating_sub(1);
        if n == 0 {
            refs.remove(&id);
            self.sources.remove(&id);
            self.cache.sources_root = None;
        } else {
            refs.insert(id, n);
        }
    }

    pub(crate) fn account_mut(&mut self, id: &AccountId) -> Option<&mut Account> {
        let a = self.accounts.get_mut(id)?;
        self.cache.dirty_accounts.insert(a.id);
        Some(a)
    }

    pub(crate) fn create_account(&mut self, id: AccountId, name: String, now_ms: u64) -> &mut Account {
        let slot = self.next_account_slot;
        self.next_account_slot += 1;
        self.cache.dirty_accounts.insert(id);
        self.accounts.entry(id).or_insert(Account {
            id,
            slot,
            name,
            joined_at_ms: now_ms,
            last_login_ms: now_ms,
            last_nonce: 0,
            avatar: None,
            returned: Vec::new(),
        })
    }

    /// Structural checks on a world from untrusted bytes, so that nothing later can panic
    /// or allocate without bound on it. (Content is checked by the root.)
    pub fn validate(&self) -> Result<(), String> {
        let lim = &self.settings.limits;
        if self.next_slot > MAX_SLOTS || self.next_account_slot > MAX_SLOTS {
            return Err(format!("slot high-water mark beyond {MAX_SLOTS}"));
        }
        if self.objects.len() > MAX_SLOTS as usize || self.queue.len() > MAX_QUEUE {
            return Err("too many objects or queued events".into());
        }
        for (id, o) in &self.objects {
            if id.slot() >= self.next_slot || self.free_slots.contains_key(&id.slot()) {
                return Err(format!("object {id} has a slot that is free or out of range"));
            }
            if !o.shape.is_valid() {
                return Err(format!("object {id} has an invalid shape"));
            }
        }
        if self.free_slots.keys().any(|s| *s >= self.next_slot) {
            return Err("a free slot is out of range".into());
        }
        for (id, inst) in &self.scripts {
            if !self.objects.contains_key(id) {
                return Err(format!("script on missing object {id}"));
            }
            if !self.sources.contains_key(&inst.script) {
                return Err(format!("script on {id} has no source"));
            }
            if inst.state.len() > lim.max_script_state_bytes as usize {
                return Err(format!("script state on {id} is over the limit"));
            }
            if inst.listen.len() > MAX_LISTEN_CHANNELS {
                return Err(format!("script on {id} listens on more than {MAX_LISTEN_CHANNELS} channels"));
            }
        }
        let mut inbox: BTreeMap<ObjectId, u32> = BTreeMap::new();
        for q in &self.queue {
            let n = inbox.entry(q.target()).or_default();
            *n += 1;
            if *n > MAX_INBOX_PER_TICK {
                return Err(format!("more than {MAX_INBOX_PER_TICK} inputs queued for {}", q.target()));
            }
        }
        for (id, a) in &self.accounts {
            if a.returned.len() > MAX_RETURNED || a.returned.iter().any(|r| !r.shape.is_valid()) {
                return Err(format!("account {id} holds too many or malformed returned objects"));
            }
        }
        if self.pending_init.iter().any(|id| !self.scripts.contains_key(id)) {
            return Err("an init is pending for an object without a script".into());
        }
        for (sid, src) in &self.sources {
            if src.id() != *sid {
                return Err(format!("script source {sid} does not match its content hash"));
            }
        }
        self.links.validate()?;
        let mut slots = BTreeSet::new();
        for (id, a) in &self.accounts {
            if *id != a.id || a.slot >= self.next_account_slot || !slots.insert(a.slot) {
                return Err(format!("account {} has a bad key or slot", id.short()));
            }
            if let Some(av) = a.avatar
                && self.objects.get(&av).is_none_or(|o| o.owner != a.id)
            {
                return Err(format!("account {} has a missing avatar", id.short()));
            }
        }
        Ok(())
    }

    // ---- hashing ----

    /// Per-subsystem roots, given the physics stage's root. Rehashes only what changed
    /// since the last call; `workers` threads hash the changed leaves.
    pub fn subsystem_roots(&mut self, physics: Hash32, workers: u32) -> SubsystemRoots {
        crate::par::on_pool(workers, || self.subsystem_roots_here(physics, workers))
    }

    fn subsystem_roots_here(&mut self, physics: Hash32, workers: u32) -> SubsystemRoots {
        self.refresh_cache(workers);
        let c = &mut self.cache;
        let sources_root = *c.sources_root.get_or_insert_with(|| {
            let mut h = blake3::Hasher::new_keyed(&keys::SUBSYSTEM);
            for id in self.sources.keys() {
                h.update(&id.0);
            }
            Hash32(*h.finalize().as_bytes())
        });
        let scripts = merkle::combine(&keys::SUBSYSTEM, &[b"scripts", &c.scripts.root().0, &sources_root.0]);
        let objects = merkle::combine(&keys::SUBSYSTEM, &[b"objects", &c.objects.root().0]);
        let meta = postcard::to_allocvec(&(
            self.sim,
            self.tick,
            self.time_ms,
            &self.region,
            &self.settings,
            &self.governance,
            self.next_slot,
            &self.free_slots,
            self.next_account_slot,
            &self.receipts,
            &self.pending_init,
        ))
        .expect("encoding to a Vec cannot fail");
        let mut governance = merkle::combine(&keys::SUBSYSTEM, &[b"governance", &c.accounts.root().0, &meta]);
        if !self.links.is_empty() {
            // A sim with no neighbours has nothing here, and hashes as it did before links.
            let links = postcard::to_allocvec(&self.links).expect("encoding to a Vec cannot fail");
            governance = merkle::combine(&keys::SUBSYSTEM, &[b"links", &governance.0, &links]);
        }
        let queue_bytes = postcard::to_allocvec(&self.queue).expect("encoding to a Vec cannot fail");
        let queue = merkle::combine(&keys::SUBSYSTEM, &[b"queue", &queue_bytes]);
        SubsystemRoots { objects, scripts, physics, governance, queue }
    }

    fn refresh_cache(&mut self, workers: u32) {
        let c = &mut self.cache;
        if !c.built {
            for id in self.objects.keys() {
                c.changed.mark(id.slot(), true);
            }
            c.dirty_scripts.extend(self.scripts.keys());
            c.dirty_accounts.extend(self.accounts.keys());
            c.built = true;
        }
        c.objects.ensure_slots(self.next_slot);
        c.scripts.ensure_slots(self.next_slot);
        c.accounts.ensure_slots(self.next_account_slot);

        // Objects are most of a tick's changes: first the digests of the fixed parts that
        // changed, then the leaves and their paths, split over the workers by subtree.
        let (changed, fixed) = c.changed.take();
        let objects = &self.objects;
        let digests =
            crate::par::map_chunks(&fixed, workers, SlotTree::MIN_SPLIT, |slots| fixed_digests(slots, objects));
        for (&slot, digest) in fixed.iter().zip(digests) {
            self.objects.set_fixed(slot, digest);
        }
        let objects = &self.objects;
        c.objects.update(
            &changed,
            workers,
            |slot| *slot,
            |part, level, base| object_leaves(part, objects, level, base),
        );
        let dirty: Vec<ObjectId> = std::mem::take(&mut c.dirty_scripts).into_iter().collect();
        let leaves = hash_leaves(&dirty, workers, &self.scripts);
        for (id, leaf) in dirty.iter().zip(leaves) {
            c.scripts.set(id.slot(), leaf);
        }
        let dirty: Vec<AccountId> = std::mem::take(&mut c.dirty_accounts).into_iter().collect();
        let leaves = hash_leaves(&dirty, workers, &self.accounts);
        for (id, leaf) in dirty.iter().zip(leaves) {
            if let Some(a) = self.accounts.get(id) {
                c.accounts.set(a.slot, leaf);
            }
        }
    }

    /// Forget the caches (after decoding, or to check the incremental root in tests).
    pub fn invalidate_caches(&mut self) {
        self.cache = RootCache::default();
    }
}

/// The bytes a Merkle leaf commits to. Must cover every field, unambiguously.
pub(crate) trait LeafBytes {
    fn leaf_bytes(&self, buf: &mut Vec<u8>);
}

impl Object {
    /// Whether two objects agree on everything but their motion and colour (the part whose
    /// digest the state root keeps, [`Object::fixed_bytes`]).
    fn same_fixed_part(&self, other: &Object) -> bool {
        self.fixed_part() == other.fixed_part()
    }

    /// The part of an object that seldom changes. Every field is named, so a new one must be
    /// placed here or in the leaf ([`Object::motion`]).
    #[allow(clippy::type_complexity)]
    fn fixed_part(&self) -> (ObjectId, ObjectKind, &AccountId, &str, Shape, &str, BodyKind, Option<Surface>) {
        let Object {
            id,
            kind,
            owner,
            name,
            shape,
            position: _,
            rotation: _,
            velocity: _,
            color: _,
            text,
            body,
            surface,
        } = self;
        (*id, *kind, owner, name, *shape, text, *body, *surface)
    }

    /// The bytes of the part of an object that seldom changes: id, kind, owner, name, shape,
    /// text, body kind and surface, as fixed-width little-endian fields and length-prefixed strings. The state
    /// root keeps their digest per slot, so a tick that only moves or recolours an object
    /// hashes one short leaf ([`Object::leaf_bytes`]) and reads none of its strings.
    pub fn fixed_bytes(&self, b: &mut Vec<u8>) {
        let (id, kind, owner, name, shape, text, body, surface) = self.fixed_part();
        let st = |b: &mut Vec<u8>, s: &str| {
            b.extend_from_slice(&(s.len() as u64).to_le_bytes());
            b.extend_from_slice(s.as_bytes());
        };
        b.extend_from_slice(&id.0.to_le_bytes());
        b.push(match kind {
            ObjectKind::Prim => 0,
            ObjectKind::Avatar => 1,
        });
        b.extend_from_slice(&owner.0);
        st(b, name);
        match shape {
            Shape::Circle { radius } => {
                b.push(0);
                b.extend_from_slice(&radius.to_bits().to_le_bytes());
            }
            Shape::Box { half_width, half_height } => {
                b.push(1);
                b.extend_from_slice(&half_width.to_bits().to_le_bytes());
                b.extend_from_slice(&half_height.to_bits().to_le_bytes());
            }
        }
        st(b, text);
        b.push(match body {
            BodyKind::Static => 0,
            BodyKind::Kinematic => 1,
            BodyKind::Dynamic => 2,
        });
        match surface {
            None => b.push(0),
            Some(Surface { friction, restitution, damping }) => {
                b.push(1);
                for v in [friction, restitution, damping] {
                    b.extend_from_slice(&v.to_bits().to_le_bytes());
                }
            }
        }
    }

    /// An object's Merkle leaf: its motion and colour, then the digest of its fixed part.
    ///
    /// Within a region every motion value fits in 40 bits (±8,388,608 m or m/s at 16
    /// fractional bits), so the leaf is usually the compact form: a 0 byte, the five values as
    /// 5-byte little-endian integers, the colour, the digest: 62 bytes, one BLAKE3
    /// compression instead of the two a leaf of every field took. A value that does not fit
    /// makes the whole leaf the full form: a 1 byte and 8 bytes a value (77 bytes). The first
    /// byte fixes every length after it, so each leaf parses one way. (Variable-length
    /// integers were tried first: their data-dependent branches cost more than the hashing.)
    pub fn leaf_bytes(&self, fixed_digest: &[u8; 32], b: &mut Vec<u8>) {
        let mut leaf = [0u8; 64];
        if self.compact_leaf(fixed_digest, &mut leaf) {
            b.extend_from_slice(&leaf[..COMPACT_LEAF]);
            return;
        }
        let (values, color) = self.motion();
        b.push(1);
        for v in values {
            b.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        b.extend_from_slice(&color.to_le_bytes());
        b.extend_from_slice(fixed_digest);
    }

    /// The part of an object a leaf holds whole: its motion (position, rotation, velocity) and
    /// colour. Every field is named, so a new one must be placed in the leaf or the fixed part.
    fn motion(&self) -> ([Fx; 5], u32) {
        let Object {
            id: _,
            kind: _,
            owner: _,
            name: _,
            shape: _,
            position,
            rotation,
            velocity,
            color,
            text: _,
            body: _,
            surface: _,
        } = self;
        ([position.x, position.y, *rotation, velocity.x, velocity.y], *color)
    }

    /// Write the compact form of [`Object::leaf_bytes`] into `leaf` (its first
    /// [`COMPACT_LEAF`] bytes; the rest is left alone), if every motion value fits in 40 bits.
    fn compact_leaf(&self, fixed_digest: &[u8; 32], leaf: &mut [u8; 64]) -> bool {
        let (values, color) = self.motion();
        let values = values.map(Fx::to_bits);
        if values.iter().any(|&v| (v << 24) >> 24 != v) {
            return false;
        }
        leaf[0] = 0;
        for (k, v) in values.iter().enumerate() {
            leaf[1 + 5 * k..6 + 5 * k].copy_from_slice(&v.to_le_bytes()[..5]);
        }
        leaf[26..30].copy_from_slice(&color.to_le_bytes());
        leaf[30..COMPACT_LEAF].copy_from_slice(fixed_digest);
        true
    }
}

/// The length of an object's leaf in its compact form.
const COMPACT_LEAF: usize = 62;

/// The digests of the fixed parts of the objects in `slots`, one per slot (an empty slot's is
/// the digest of nothing, and is never kept: `Objects::set_fixed` ignores an empty slot).
fn fixed_digests(slots: &[u32], objects: &Objects) -> Vec<[u8; 32]> {
    let mut buf = Vec::with_capacity(128 * slots.len());
    let mut ends = Vec::with_capacity(slots.len());
    for &slot in slots {
        if let Some(o) = objects.by_slot(slot) {
            o.fixed_bytes(&mut buf);
        }
        ends.push(buf.len());
    }
    wide::keyed_hash_many(&keys::OBJECT_FIXED, &split_at_ends(&buf, &ends))
}

/// Write the leaves of the objects in `slots` (`EMPTY` for an empty slot) into `level` at
/// their slot less `base`, from the digests of their fixed parts kept beside them, hashed side
/// by side in SIMD lanes ([`wide`]). Compact leaves are built in place as padded blocks; the
/// rare full one goes the general way.
fn object_leaves(slots: &[u32], objects: &Objects, level: &mut [[u8; 32]], base: u32) {
    let mut blocks = vec![[0u8; 64]; slots.len()];
    let mut at = Vec::with_capacity(slots.len());
    let mut full = Vec::new();
    let mut full_bytes = Vec::new();
    for &slot in slots {
        let Some((o, fixed)) = objects.with_fixed(slot) else {
            level[(slot - base) as usize] = merkle::EMPTY;
            continue;
        };
        if o.compact_leaf(fixed, &mut blocks[at.len()]) {
            at.push(slot - base);
        } else {
            o.leaf_bytes(fixed, &mut full_bytes);
            full.push((slot, full_bytes.len()));
        }
    }
    blocks.truncate(at.len());
    let lens = vec![COMPACT_LEAF as u8; blocks.len()];
    wide::keyed_hash_blocks_at(&keys::LEAF, &blocks, &lens, &at, level);
    let ends: Vec<usize> = full.iter().map(|f| f.1).collect();
    let hashes = wide::keyed_hash_many(&keys::LEAF, &split_at_ends(&full_bytes, &ends));
    for ((slot, _), h) in full.iter().zip(hashes) {
        level[(slot - base) as usize] = h;
    }
}

/// The pieces of `buf` that end at each of `ends`, in order.
fn split_at_ends<'a>(buf: &'a [u8], ends: &[usize]) -> Vec<&'a [u8]> {
    let mut start = 0;
    ends.iter()
        .map(|&end| {
            let piece = &buf[start..end];
            start = end;
            piece
        })
        .collect()
}

impl LeafBytes for ScriptInstance {
    fn leaf_bytes(&self, buf: &mut Vec<u8>) {
        *buf = postcard::to_extend(self, std::mem::take(buf)).expect("encoding to a Vec cannot fail");
    }
}

impl LeafBytes for Account {
    fn leaf_bytes(&self, buf: &mut Vec<u8>) {
        *buf = postcard::to_extend(self, std::mem::take(buf)).expect("encoding to a Vec cannot fail");
    }
}

/// Leaf hashes of the values under the given keys (EMPTY for keys not in `map`), split over
/// `workers` threads; results come back in the keys' order.
fn hash_leaves<K, T>(keys: &[K], workers: u32, map: &BTreeMap<K, T>) -> Vec<Hash32>
where
    K: Copy + Ord + Sync,
    T: LeafBytes + Sync,
{
    crate::par::map_chunks(keys, workers, 512, |chunk| leaf_hashes(chunk, map))
}

/// Leaf hashes of the values under the given keys (EMPTY for keys not in `map`), on this
/// thread: all the leaves are encoded into one buffer, then hashed side by side in SIMD lanes
/// (`wide`).
fn leaf_hashes<K: Ord, T: LeafBytes>(chunk: &[K], map: &BTreeMap<K, T>) -> Vec<Hash32> {
    let mut buf = Vec::with_capacity(128 * chunk.len());
    let mut ends = Vec::with_capacity(chunk.len());
    let mut present = Vec::with_capacity(chunk.len());
    for key in chunk {
        if let Some(v) = map.get(key) {
            v.leaf_bytes(&mut buf);
            ends.push(buf.len());
            present.push(true);
        } else {
            present.push(false);
        }
    }
    let leaves = split_at_ends(&buf, &ends);
    let mut hashes = wide::keyed_hash_many(&merkle::keys::LEAF, &leaves).into_iter();
    present
        .iter()
        .map(|&p| if p { Hash32(hashes.next().unwrap_or(merkle::EMPTY)) } else { Hash32(merkle::EMPTY) })
        .collect()
}
