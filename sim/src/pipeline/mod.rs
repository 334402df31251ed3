//! The tick pipeline (DESIGN §4).
//!
//! ```text
//! World_t + Batch_t + Queue_t
//! 1. verify   signatures (verdicts computed ahead), sim, size, account, ban, nonce, fields
//! 2. route    each event to its target: an object, governance, chat
//! 3. order    per target by blake3(seed ‖ target ‖ event_id); seed from the commit certificate
//! 4. run      object units in parallel over the immutable World_t; each returns only its part
//! 5. merge    parts in object order, then chat, then the governance unit
//! 6. physics  the stage consumes the merged commands, steps, and its bodies are read back
//! 7. hash     incremental Merkle root over the subsystem roots
//! ```
//!
//! Deviation from DESIGN §4's numbering: physics runs after the merge, because it consumes
//! the commands the merge collects (and the spawns of the governance unit). The governance
//! unit runs sequentially inside the merge: it allocates object slots and its events are few;
//! its permission checks use the roles of `World_t`, so its result does not depend on order.
//! Synthetic inputs come first in a unit: `Init` (scripts attached at genesis), `Tick`, then
//! `Timer`, then ordered events.

mod types;
mod unit;
mod verify;

use std::collections::BTreeMap;

use crate::event::{Checked, Payload, VerifiedBatch};
use crate::fx::Fx;
use crate::governance;
use crate::host::{Border, PhysicsCommand, PhysicsEvent, PhysicsStage, ScriptHost};
use crate::ids::{AccountId, EventId, Hash32, ObjectId, SimId, Tick};
use crate::links::{Departed, MailBody, ObjectRecord, OutMail, Received};
use crate::merkle::keys;
use crate::snapshot::{Snapshot, SnapshotError};
use crate::state::{ObjectKind, Queued, RejectReason, Rejection, SubsystemRoots, World};
use crate::vec2::Vec2;

pub use crate::host::script_seed;
pub use crate::state::MAX_INBOX_PER_TICK;
use types::TickCtx;
pub use types::{ChatLine, DEBUG_CHANNEL, ScriptErrorReport, Speaker, StepError, TickReport};
pub use unit::{FAILURE_WEIGHT, LISTEN_ENTRY_BYTES, MAX_CHAT_BYTES_PER_TICK};
use unit::{InstanceChange, ObjectPart, Unit, UnitInput};
pub use verify::{MAX_NONCE_STEP, check_at_door};

/// A sim: its world, script host, physics stage and worker count.
#[derive(Clone, Debug)]
pub struct Sim<H, P> {
    world: World,
    host: H,
    physics: P,
    workers: u32,
    roots: Option<SubsystemRoots>,
}

impl<H: ScriptHost, P: PhysicsStage> Sim<H, P> {
    /// A sim at genesis (or any world whose physics can be rebuilt from the world).
    pub fn new(world: World, host: H, mut physics: P, workers: u32) -> Result<Self, crate::host::PhysicsError> {
        physics.load(&world, None)?;
        Ok(Sim { world, host, physics, workers: workers.max(1), roots: None })
    }

    /// A sim continued from a snapshot, checked against the root it claims.
    pub fn restore(snapshot: Snapshot, host: H, mut physics: P, workers: u32) -> Result<Self, SnapshotError> {
        let Snapshot { world, physics: saved, root, .. } = snapshot;
        physics.load(&world, Some(&saved)).map_err(|e| SnapshotError::Invalid { reason: e.to_string() })?;
        let mut sim = Sim { world, host, physics, workers: workers.max(1), roots: None };
        let actual = sim.root();
        if actual != root {
            return Err(SnapshotError::RootMismatch { claimed: root, actual });
        }
        Ok(sim)
    }

    /// Replace the state with a snapshot's (a node that diverged takes a certified one), keeping
    /// the host and physics stage. On an error the sim must not be used until a good snapshot
    /// is installed.
    pub fn reset_to(&mut self, snapshot: Snapshot) -> Result<(), SnapshotError> {
        let Snapshot { world, physics: saved, root, .. } = snapshot;
        self.world = world;
        self.roots = None;
        self.physics.load(&self.world, Some(&saved)).map_err(|e| SnapshotError::Invalid { reason: e.to_string() })?;
        let actual = self.root();
        if actual != root {
            return Err(SnapshotError::RootMismatch { claimed: root, actual });
        }
        Ok(())
    }

    pub fn world(&self) -> &World {
        &self.world
    }

    pub fn host(&self) -> &H {
        &self.host
    }

    pub fn physics(&self) -> &P {
        &self.physics
    }

    pub fn workers(&self) -> u32 {
        self.workers
    }

    pub fn set_workers(&mut self, workers: u32) {
        self.workers = workers.max(1);
    }

    /// The subsystem roots of the current state.
    pub fn roots(&mut self) -> SubsystemRoots {
        if let Some(r) = self.roots {
            return r;
        }
        let r = self.world.subsystem_roots(self.physics.root(), self.workers);
        self.roots = Some(r);
        r
    }

    /// The state root of the current state.
    pub fn root(&mut self) -> Hash32 {
        self.roots().root()
    }

    /// A snapshot of the whole state with its root.
    pub fn snapshot(&mut self) -> Snapshot {
        let root = self.root();
        Snapshot::new(self.world.clone(), self.physics.save(), root)
    }

    /// Execute one committed batch.
    pub fn step(&mut self, batch: &VerifiedBatch) -> Result<TickReport, StepError> {
        let report = step(&mut self.world, batch, &self.host, &mut self.physics, self.workers)?;
        self.roots = Some(report.roots);
        Ok(report)
    }
}

/// Execute one committed batch on a world (see the module docs for the stages).
pub fn step(
    world: &mut World,
    batch: &VerifiedBatch,
    host: &dyn ScriptHost,
    physics: &mut dyn PhysicsStage,
    workers: u32,
) -> Result<TickReport, StepError> {
    crate::par::on_pool(workers, || step_here(world, batch, host, physics, workers))
}

fn step_here(
    world: &mut World,
    batch: &VerifiedBatch,
    host: &dyn ScriptHost,
    physics: &mut dyn PhysicsStage,
    workers: u32,
) -> Result<TickReport, StepError> {
    if batch.tick != world.tick {
        return Err(StepError::WrongTick { expected: world.tick, got: batch.tick });
    }
    if batch.time_ms < world.time_ms {
        return Err(StepError::TimeWentBack { last: world.time_ms, got: batch.time_ms });
    }
    let ctx = TickCtx {
        tick: world.tick,
        time_ms: batch.time_ms,
        seed: batch.seed,
        script_failure_limit: world.settings.limits.script_failure_limit,
        near: Default::default(),
    };
    let temp_admin = governance::temp_admin(world, ctx.time_ms);

    // 1. verify
    let mut verdicts = verify::check(world, batch);
    // Neighbours' mail: count the copies; mail that reaches its quorum goes to physics.
    let arrivals = receive_mail(world, physics, &verdicts.mail, &mut verdicts.rejected);
    // 2. route + 3. order
    let queue = std::mem::take(&mut world.queue);
    let (routes, units) = route(world, &verdicts.accepted, queue, &ctx);
    let unit_count = units.len() as u32;
    // 4. run, in parallel over the immutable World_t
    let w: &World = world;
    // Only parts that change something go on to the merge (most scripts change nothing in
    // most ticks): the merge would skip them anyway, and 10,000 of them are 1.5 MB to move.
    // The operations every unit used are summed here, so a part that only used some does not
    // go on (counted in the parts, they sent every script's part to the merge: a tick of
    // 10,000 scripts that change nothing took 6.56 ms, 6.06 once they were summed here).
    let operations = std::sync::atomic::AtomicU64::new(0);
    let parts: Vec<ObjectPart> = crate::par::map_chunks(&units, workers, 64, |units| {
        let mut used = 0u64;
        let parts = units
            .iter()
            .map(|u| unit::run(w, host, u, &ctx))
            .inspect(|p| used = used.saturating_add(p.operations))
            .filter(|p| !p.is_empty())
            .collect();
        operations.fetch_add(used, std::sync::atomic::Ordering::Relaxed);
        parts
    });
    let operations = operations.into_inner();
    drop(units);
    let client_chat = chat_unit(w, &routes.chat);

    // 5. merge: objects in id order, then chat, then governance
    let mut rejected = verdicts.rejected;
    rejected.extend(routes.refused.iter().cloned());
    rejected.extend(client_chat.1);
    let mut merged = merge(world, parts);
    rejected.append(&mut merged.rejected);
    let mut chat = client_chat.0;
    chat.append(&mut merged.chat);
    let gov = governance::apply(world, &routes.governance, temp_admin, ctx.time_ms);
    rejected.extend(gov.rejected);
    merged.physics.extend(gov.physics);
    merged.physics.extend(governance::expire_sessions(world, ctx.time_ms));
    for (author, nonce) in &verdicts.nonces {
        if let Some(a) = world.account_mut(author) {
            a.last_nonce = *nonce;
        }
    }

    // 6. physics
    let dt = Fx::ONE / Fx::from_int(i64::from(world.settings.tick_rate_hz.max(1)));
    let out = physics.step(world, &merged.physics, dt);
    let crossed = borders(world, physics, &out.borders, arrivals, ctx.time_ms);
    let bodies_moved = out.bodies.len() as u32;
    let local = |id: ObjectId| crossed.renamed.get(&id).copied().unwrap_or(id);
    for b in &out.bodies {
        world.set_motion(local(b.object), b.position, b.rotation, b.velocity);
    }

    // Queue_{t+1}: messages, chat heard by listening scripts, collisions.
    let mut queue = merged.queued;
    deliver_chat(world, &chat, &mut queue);
    for e in out.events {
        let PhysicsEvent::Collision { object, other } = e;
        queue.push(Queued::Collision { object: local(object), other: local(other) });
    }
    // The queue's bounds hold at execution, not only when a snapshot is checked: what a tick
    // would queue beyond them is dropped, the same on every node (in the queue's order).
    bound_inboxes(&mut queue);
    queue.truncate(crate::state::MAX_QUEUE);
    let queued = queue.len() as u32;
    world.queue = queue;
    world.pending_init.clear();
    world.receipts = rejected.clone();
    world.tick = world.tick.next();
    world.time_ms = ctx.time_ms;
    world.links.prune(world.tick);
    governance::end_of_tick(world);
    // The mail names the validators that sign it: this sim's after the tick.
    let validators: Vec<AccountId> = world.governance.validators.iter().copied().collect();
    let mail = out
        .mail
        .into_iter()
        .map(|(to, physics)| {
            let records = world.links.departed.values().filter(|d| d.to == to).map(|d| d.record.clone()).collect();
            let body = MailBody { physics, records, validators: validators.clone() };
            OutMail { to, tick: ctx.tick, body: body.encode() }
        })
        .collect();

    // 7. hash
    let roots = world.subsystem_roots(physics.root(), workers);
    Ok(TickReport {
        tick: ctx.tick,
        root: roots.root(),
        roots,
        accepted: verdicts.accepted.len() as u32,
        rejected,
        chat,
        script_errors: merged.errors,
        units: unit_count,
        script_operations: operations,
        queued,
        bodies_moved,
        mail,
        left: crossed.left,
        arrived: crossed.arrived,
    })
}

/// Count the batch's mail copies (in canonical order); hand what reached its quorum to the
/// physics stage, and return the object records it carried, by (sender, sender's id).
fn receive_mail(
    world: &mut World,
    physics: &mut dyn PhysicsStage,
    mail: &[&Checked],
    rejected: &mut Vec<Rejection>,
) -> BTreeMap<(SimId, ObjectId), ObjectRecord> {
    let mut arrivals = BTreeMap::new();
    let mut received = Received::default();
    for c in mail {
        let Payload::Mail { from, tick, body } = &c.event.body.payload else { continue };
        let author = c.event.body.author;
        let before = received.delivered.len();
        if let Err(reason) = world.links.vote(world.tick, *from, *tick, author, body, &mut received) {
            rejected.push(Rejection { event: c.id, author, reason });
        }
        if let Some((sim, _, Err(reason))) = received.delivered.get(before) {
            let reason = RejectReason::MalformedMail { sim: *sim, reason: reason.clone() };
            rejected.push(Rejection { event: c.id, author, reason });
        }
    }
    received.delivered.sort_by_key(|(from, tick, _)| (*from, *tick));
    for (from, tick, body) in received.delivered {
        if let Ok(body) = body {
            world.links.update_validators(from, tick, &body.validators);
            physics.deliver(from, &body.physics);
            for r in body.records {
                arrivals.insert((from, r.object.id), r);
            }
        }
    }
    arrivals
}

/// What the border crossings of a step did to the world.
#[derive(Debug, Default)]
struct Crossed {
    /// The physics stage's names of arrived bodies -> their new ids.
    renamed: BTreeMap<ObjectId, ObjectId>,
    left: Vec<(ObjectId, SimId)>,
    arrived: Vec<(ObjectId, SimId, ObjectId)>,
}

/// Move object records across borders as the physics stage moved their bodies: a body that
/// left takes its object (and script) out of this world into `departed` (sent with every mail
/// to the neighbour until it settles); a body that arrived gets its object from the record the
/// same mail carried, under a fresh local id.
fn borders(
    world: &mut World,
    physics: &mut dyn PhysicsStage,
    borders: &[Border],
    mut arrivals: BTreeMap<(SimId, ObjectId), ObjectRecord>,
    now_ms: u64,
) -> Crossed {
    let mut c = Crossed::default();
    for b in borders {
        match *b {
            Border::Left { object, to } => {
                let Some(o) = world.objects.get(&object).cloned() else { continue };
                let script = world
                    .scripts
                    .get(&object)
                    .and_then(|i| world.sources.get(&i.script).map(|s| (i.clone(), s.clone())));
                world.remove_object(object);
                world.pending_init.remove(&object);
                world.links.departed.insert(object, Departed { to, record: ObjectRecord { object: o, script } });
                c.left.push((object, to));
            }
            Border::Settled { object, to } => {
                if world.links.departed.get(&object).is_some_and(|d| d.to == to) {
                    world.links.departed.remove(&object);
                }
            }
            Border::Arrived { object, from, origin } => match arrivals.remove(&(from, origin)) {
                Some(record) if record.object.shape.is_valid() => {
                    let id = arrive(world, record, now_ms);
                    physics.rename(object, id);
                    c.renamed.insert(object, id);
                    c.arrived.push((id, from, origin));
                }
                // A body without its record (or with a broken one) cannot live here.
                _ => physics.despawn(object),
            },
        }
    }
    c
}

/// Put an arrived object into this world under a fresh id; an avatar becomes its owner's
/// avatar here (the account is created on its first arrival, as by a first login).
fn arrive(world: &mut World, record: ObjectRecord, now_ms: u64) -> ObjectId {
    let id = world.allocate_object_id();
    let mut o = record.object;
    o.id = id;
    let (owner, kind, name) = (o.owner, o.kind, o.name.clone());
    world.put_object(o);
    if let Some((mut instance, source)) = record.script {
        instance.script = world.add_source(source);
        if let Some(t) = instance.timer.as_mut() {
            t.next = world.tick.next();
        }
        world.put_script(id, instance);
    }
    if kind == ObjectKind::Avatar {
        if world.accounts.contains_key(&owner) {
            if let Some(a) = world.account_mut(&owner) {
                a.avatar = Some(id);
            }
        } else {
            world.create_account(owner, name, now_ms).avatar = Some(id);
        }
    }
    id
}

/// Where each accepted event goes, already in canonical order (object units, in object-id
/// order, are returned beside it).
#[derive(Debug)]
struct Routes<'a> {
    governance: Vec<&'a Checked>,
    chat: Vec<&'a Checked>,
    /// Deployments refused before any unit ran (an account's script bytes).
    refused: Vec<Rejection>,
}

/// The order key of an event at a target: blake3(seed ‖ target ‖ event id), keyed.
fn order_key(seed: &Hash32, target: &[u8], id: &EventId) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(&keys::ORDER);
    h.update(&seed.0);
    h.update(target);
    h.update(&id.0);
    *h.finalize().as_bytes()
}

fn object_target(id: ObjectId) -> [u8; 9] {
    let mut t = [0u8; 9];
    t[1..].copy_from_slice(&id.0.to_le_bytes());
    t
}

const GOVERNANCE_TARGET: &[u8] = &[1];
const CHAT_TARGET: &[u8] = &[2];

fn queued_id(tick: Tick, index: u32) -> EventId {
    let mut h = blake3::Hasher::new_keyed(&keys::QUEUED_ID);
    h.update(&tick.0.to_le_bytes());
    h.update(&index.to_le_bytes());
    EventId(*h.finalize().as_bytes())
}

fn route<'a, 'w>(
    world: &'w World,
    accepted: &[&'a Checked],
    queue: Vec<Queued>,
    ctx: &TickCtx,
) -> (Routes<'a>, Vec<Unit<'a, 'w>>) {
    let mut gov: Vec<([u8; 32], &Checked)> = Vec::new();
    let mut chat: Vec<([u8; 32], &Checked)> = Vec::new();
    let mut objects: BTreeMap<ObjectId, Vec<([u8; 32], UnitInput<'a>)>> = BTreeMap::new();
    let mut quota = ScriptQuota::default();
    let mut refused = Vec::new();
    for &c in accepted {
        match &c.event.body.payload {
            Payload::DeployScript { object, source, .. }
                if let Err(reason) = quota.check(world, c.event.body.author, *object, source.len()) =>
            {
                refused.push(Rejection { event: c.id, author: c.event.body.author, reason });
            }
            Payload::Move { object, .. }
            | Payload::Touch { object }
            | Payload::DeployScript { object, .. }
            | Payload::Edit { object, .. } => {
                let key = order_key(&ctx.seed, &object_target(*object), &c.id);
                objects.entry(*object).or_default().push((key, UnitInput::Event(c)));
            }
            Payload::Chat { .. } => chat.push((order_key(&ctx.seed, CHAT_TARGET, &c.id), c)),
            Payload::Login { .. }
            | Payload::Logout
            | Payload::Rez { .. }
            | Payload::Derez { .. }
            | Payload::RezReturned { .. }
            | Payload::Admin(_) => gov.push((order_key(&ctx.seed, GOVERNANCE_TARGET, &c.id), c)),
            Payload::Mail { .. } => {} // counted by the links before the tick's units
        }
    }
    // Queue_t: the previous tick made these; ids come from their place in the queue.
    let made_at = Tick(ctx.tick.0.saturating_sub(1));
    for (i, q) in queue.into_iter().enumerate() {
        let target = q.target();
        if world.objects.contains_key(&target) {
            let key = order_key(&ctx.seed, &object_target(target), &queued_id(made_at, i as u32));
            objects.entry(target).or_default().push((key, UnitInput::Queued(q)));
        }
    }
    let mut units = Vec::with_capacity(objects.len());
    let mut ordered = objects.into_iter().peekable();
    // Merge the scripted objects (tick handlers, due timers) with the addressed ones, in id order.
    for (&id, inst) in &world.scripts {
        while let Some((oid, _)) = ordered.peek()
            && *oid < id
        {
            let (oid, inputs) = ordered.next().expect("peeked");
            units.push(make_unit(oid, inputs, Synthetic::default()));
        }
        let init = world.pending_init.contains(&id);
        let wants_tick = inst.wants_tick && !inst.suspended;
        let timer_due = !inst.suspended && inst.timer.is_some_and(|t| t.next <= ctx.tick);
        let inputs = match ordered.peek() {
            Some((oid, _)) if *oid == id => ordered.next().expect("peeked").1,
            _ if init || wants_tick || timer_due => Vec::new(),
            _ => continue,
        };
        units.push(make_unit(id, inputs, Synthetic { init, tick: wants_tick, timer: timer_due }));
    }
    for (oid, inputs) in ordered {
        units.push(make_unit(oid, inputs, Synthetic::default()));
    }
    resolve(world, &mut units);
    share_budgets(world, &mut units);
    gov.sort_by_key(|a| a.0);
    chat.sort_by_key(|a| a.0);
    let routes = Routes {
        governance: gov.into_iter().map(|(_, c)| c).collect(),
        chat: chat.into_iter().map(|(_, c)| c).collect(),
        refused,
    };
    (routes, units)
}

/// Attach each unit's object and script from `World_t`: units and scripts are both in id
/// order, so one merged pass replaces a map lookup per unit (objects are held by slot, one
/// index each).
fn resolve<'a, 'w>(world: &'w World, units: &mut [Unit<'a, 'w>]) {
    let mut scripts = world.scripts.iter().peekable();
    for u in units.iter_mut() {
        while scripts.next_if(|(id, _)| **id < u.object).is_some() {}
        let object = world.objects.get(&u.object);
        let script = scripts.peek().filter(|(id, _)| **id == u.object).map(|(_, s)| *s);
        u.resolved = object.map(|o| (o, script));
    }
}

/// Script bytes per account (`max_script_bytes_per_account`), counted from `World_t` once the
/// tick's first deployment needs it and kept up to date over the tick's deployments in batch
/// order: each object's script counts once, and a deployment replaces what its object had.
#[derive(Default)]
struct ScriptQuota {
    counted: Option<(BTreeMap<AccountId, u64>, BTreeMap<ObjectId, u64>)>,
}

impl ScriptQuota {
    fn check(&mut self, world: &World, author: AccountId, object: ObjectId, bytes: usize) -> Result<(), RejectReason> {
        // Another's object: the unit refuses it (not the owner), and it changes no one's bytes.
        if world.objects.get(&object).is_none_or(|o| o.owner != author) {
            return Ok(());
        }
        let (used, on_object) = self.counted.get_or_insert_with(|| {
            let (mut used, mut on_object) = (BTreeMap::new(), BTreeMap::new());
            for (id, inst) in &world.scripts {
                if let (Some(o), Some(src)) = (world.objects.get(id), world.sources.get(&inst.script)) {
                    *used.entry(o.owner).or_default() += src.source.len() as u64;
                    on_object.insert(*id, src.source.len() as u64);
                }
            }
            (used, on_object)
        });
        let replaced = on_object.get(&object).copied().unwrap_or(0);
        let now = used.get(&author).copied().unwrap_or(0);
        let after = now.saturating_sub(replaced).saturating_add(bytes as u64);
        let max = u64::from(world.settings.limits.max_script_bytes_per_account);
        if after > max {
            return Err(RejectReason::AccountQuota { what: "bytes of script".into(), used: now, max });
        }
        used.insert(author, after);
        on_object.insert(object, bytes as u64);
        Ok(())
    }
}

/// Each unit's operation budget: its owner's per-tick budget (`operations_per_account_tick`)
/// shared equally among the owner's objects with script work this tick, at most
/// `operations_per_object_tick` each. Decided from `World_t` and the routed inputs alone, so it
/// is the same on every node and with any number of workers, and one account's objects
/// together never run more than its budget, however many it owns.
fn share_budgets(world: &World, units: &mut [Unit<'_, '_>]) {
    let limits = &world.settings.limits;
    let owners: Vec<Option<AccountId>> = units.iter().map(busy_owner).collect();
    let mut busy: BTreeMap<AccountId, u64> = BTreeMap::new();
    for owner in owners.iter().flatten() {
        *busy.entry(*owner).or_default() += 1;
    }
    for (u, owner) in units.iter_mut().zip(owners) {
        u.operations = owner.map_or(0, |o| {
            let n = busy.get(&o).copied().unwrap_or(1).max(1);
            (limits.operations_per_account_tick / n).min(limits.operations_per_object_tick)
        });
    }
}

/// The owner of a unit's object if its script may run this tick: a script that is not
/// suspended, or a deployment among its inputs.
fn busy_owner(u: &Unit<'_, '_>) -> Option<AccountId> {
    let (object, script) = u.resolved?;
    let runs = script.is_some_and(|s| !s.suspended)
        || u.inputs
            .iter()
            .any(|i| matches!(i, UnitInput::Event(c) if matches!(c.event.body.payload, Payload::DeployScript { .. })));
    runs.then_some(object.owner)
}

/// Inputs a unit gets from the script's own state rather than from events.
#[derive(Clone, Copy, Debug, Default)]
struct Synthetic {
    init: bool,
    tick: bool,
    timer: bool,
}

fn make_unit<'a, 'w>(object: ObjectId, mut keyed: Vec<([u8; 32], UnitInput<'a>)>, s: Synthetic) -> Unit<'a, 'w> {
    keyed.sort_by_key(|a| a.0);
    let mut inputs = Vec::with_capacity(keyed.len() + 3);
    if s.init {
        inputs.push(UnitInput::Init);
    }
    if s.tick {
        inputs.push(UnitInput::Tick);
    }
    if s.timer {
        inputs.push(UnitInput::Timer);
    }
    inputs.extend(keyed.into_iter().map(|(_, i)| i));
    Unit { object, inputs, resolved: None, operations: 0 }
}

/// The chat unit: client chat, spoken by the author's avatar.
fn chat_unit(world: &World, events: &[&Checked]) -> (Vec<ChatLine>, Vec<Rejection>) {
    let mut lines = Vec::new();
    let mut rejected = Vec::new();
    for c in events {
        let Payload::Chat { channel, range, text } = &c.event.body.payload else {
            unreachable!("routed a non-chat payload to chat")
        };
        let author = c.event.body.author;
        let avatar = world.accounts.get(&author).and_then(|a| a.avatar).and_then(|id| world.objects.get(&id));
        match avatar {
            Some(a) => lines.push(ChatLine {
                speaker: Speaker::Account(author),
                name: a.name.clone(),
                channel: *channel,
                range: *range,
                position: a.position,
                text: text.clone(),
                to: None,
            }),
            None => rejected.push(Rejection { event: c.id, author, reason: crate::state::RejectReason::NoAvatar }),
        }
    }
    (lines, rejected)
}

/// The merged result of the object units.
#[derive(Debug, Default)]
struct Merged {
    physics: Vec<PhysicsCommand>,
    chat: Vec<ChatLine>,
    queued: Vec<Queued>,
    rejected: Vec<Rejection>,
    errors: Vec<ScriptErrorReport>,
}

/// Apply the parts in object order. Ownership makes them disjoint: each part writes only its
/// own object's appearance and script (position and velocity belong to physics).
fn merge(world: &mut World, parts: Vec<ObjectPart>) -> Merged {
    let mut m = Merged::default();
    for p in parts {
        debug_assert!(p.updated.as_ref().is_none_or(|o| o.id == p.object));
        if let Some(o) = p.updated {
            world.put_object(*o);
        }
        if let Some(src) = p.new_source {
            world.add_source(*src);
        }
        if let InstanceChange::Set(inst) = p.instance {
            world.put_script(p.object, *inst);
        }
        m.physics.extend(p.physics);
        m.chat.extend(p.chat);
        m.queued.extend(p.queued);
        m.rejected.extend(p.rejected);
        m.errors.extend(p.errors);
    }
    m
}

/// Drop what a tick would queue for one object beyond [`MAX_INBOX_PER_TICK`], in the queue's
/// order.
fn bound_inboxes(queue: &mut Vec<Queued>) {
    if queue.len() <= MAX_INBOX_PER_TICK as usize {
        return;
    }
    let mut inbox: BTreeMap<ObjectId, u32> = BTreeMap::new();
    queue.retain(|q| {
        let n = inbox.entry(q.target()).or_default();
        *n += 1;
        *n <= MAX_INBOX_PER_TICK
    });
}

/// Queue chat for the scripts that listen on its channel within range (not the speaker).
/// Lines a listening script hears in one tick, at most (the rest are not delivered to it).
pub const MAX_HEARD_PER_TICK: u32 = 64;
/// Copies of its lines one speaker's chat may make in one tick, at most (each listener in range
/// of each line is a copy): the work chat causes is charged to who speaks, so a few chatty prims
/// cannot make every listener's work grow with their number.
pub const MAX_COPIES_PER_SPEAKER: u32 = 1_024;

fn deliver_chat(world: &World, chat: &[ChatLine], queue: &mut Vec<Queued>) {
    let public: Vec<&ChatLine> = chat.iter().filter(|l| l.to.is_none()).collect();
    if public.is_empty() {
        return;
    }
    // Index the listeners once per tick: channel -> (object, position), in object order.
    let mut listeners: BTreeMap<i32, Vec<(ObjectId, Vec2)>> = BTreeMap::new();
    for (id, inst) in &world.scripts {
        if inst.suspended || inst.listen.is_empty() {
            continue;
        }
        if let Some(o) = world.objects.get(id) {
            for ch in &inst.listen {
                listeners.entry(*ch).or_default().push((*id, o.position));
            }
        }
    }
    // Lines heard per listener and copies made per speaker this tick, in the chat's order.
    let mut heard: BTreeMap<ObjectId, u32> = BTreeMap::new();
    let mut copies: BTreeMap<&Speaker, u32> = BTreeMap::new();
    for line in public {
        let Some(ls) = listeners.get(&line.channel) else {
            continue;
        };
        for (id, pos) in ls {
            if line.speaker == Speaker::Object(*id) || !pos.within(line.position, line.range.metres()) {
                continue;
            }
            let made = copies.entry(&line.speaker).or_default();
            if *made >= MAX_COPIES_PER_SPEAKER {
                break;
            }
            let n = heard.entry(*id).or_default();
            if *n >= MAX_HEARD_PER_TICK {
                continue;
            }
            *n += 1;
            *made += 1;
            queue.push(Queued::Heard {
                listener: *id,
                channel: line.channel,
                speaker: line.name.clone(),
                text: line.text.clone(),
            });
        }
    }
}
