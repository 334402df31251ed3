//! Step 4, run: one object's unit. It reads only `World_t` and returns only its own part of
//! `World_{t+1}` (its object's appearance and script) plus messages, chat and physics commands.
//! Units of different objects run in parallel; their parts are merged in object order.

use std::borrow::Cow;

use crate::event::{Checked, ObjectEdit, Payload};
use crate::fx::Fx;
use crate::host::{
    PhysicsCommand, ScriptAction, ScriptCtx, ScriptError, ScriptErrorKind, ScriptHost, ScriptInput, ScriptOutput,
};
use crate::ids::{ObjectId, ScriptId};
use crate::state::{
    COPYLEFT_LICENCES, Object, ObjectKind, Queued, RejectReason, Rejection, ScriptInstance, ScriptSource, Timer, World,
};

use super::types::{ChatLine, DEBUG_CHANNEL, ScriptErrorReport, Speaker, TickCtx};

/// One input of a unit, after canonical ordering.
#[derive(Debug)]
pub(crate) enum UnitInput<'a> {
    /// The script was attached outside a tick: run its `on_init` first.
    Init,
    /// The object's script has a tick handler.
    Tick,
    /// The object's timer is due.
    Timer,
    Event(&'a Checked),
    Queued(Queued),
}

/// Everything addressed to one object this tick.
#[derive(Debug)]
pub(crate) struct Unit<'a, 'w> {
    pub object: ObjectId,
    pub inputs: Vec<UnitInput<'a>>,
    /// The object and its script in `World_t`, resolved by the router in one ordered pass
    /// (cheaper than a map lookup per unit).
    pub resolved: Option<(&'w Object, Option<&'w ScriptInstance>)>,
    /// Script operations the unit may use: its share of its owner's budget for the tick.
    pub operations: u64,
}

/// A change to an object's script instance.
#[derive(Debug)]
pub(crate) enum InstanceChange {
    Keep,
    Set(Box<ScriptInstance>),
}

/// What a unit returns: its own part of `World_{t+1}` and what it sends on. The big, rare
/// parts are boxed: parts are moved several times on their way to the merge.
#[derive(Debug)]
pub(crate) struct ObjectPart {
    pub object: ObjectId,
    /// The object's new appearance, if it changed.
    pub updated: Option<Box<Object>>,
    pub instance: InstanceChange,
    pub new_source: Option<Box<ScriptSource>>,
    pub physics: Vec<PhysicsCommand>,
    pub chat: Vec<ChatLine>,
    pub queued: Vec<Queued>,
    pub rejected: Vec<Rejection>,
    pub errors: Vec<ScriptErrorReport>,
    /// Script operations the unit used.
    pub operations: u64,
}

impl ObjectPart {
    /// Whether the part changes nothing and sends nothing on (the merge would skip it); the
    /// operations it used are counted before (`step_here`).
    pub(crate) fn is_empty(&self) -> bool {
        let ObjectPart {
            object: _,
            updated,
            instance,
            new_source,
            physics,
            chat,
            queued,
            rejected,
            errors,
            operations: _,
        } = self;
        updated.is_none()
            && matches!(instance, InstanceChange::Keep)
            && new_source.is_none()
            && physics.is_empty()
            && chat.is_empty()
            && queued.is_empty()
            && rejected.is_empty()
            && errors.is_empty()
    }
}

/// The working copy a unit edits; borrowed from `World_t` until something changes.
struct Work<'w> {
    object: Cow<'w, Object>,
    instance: Option<Cow<'w, ScriptInstance>>,
    source: Option<Cow<'w, ScriptSource>>,
    pending: Vec<ScriptInput>,
    failed_this_tick: bool,
    /// The unit's operation budget, and what is left of it.
    operations_share: u64,
    operations_left: u64,
}

pub(crate) fn run(world: &World, host: &dyn ScriptHost, unit: &Unit<'_, '_>, ctx: &TickCtx) -> ObjectPart {
    let mut part = ObjectPart {
        object: unit.object,
        updated: None,
        instance: InstanceChange::Keep,
        new_source: None,
        physics: Vec::new(),
        chat: Vec::new(),
        queued: Vec::new(),
        rejected: Vec::new(),
        errors: Vec::new(),
        operations: 0,
    };
    let Some((object, instance)) = unit.resolved else {
        for input in &unit.inputs {
            if let UnitInput::Event(c) = input {
                part.rejected.push(reject(c, RejectReason::NoSuchObject { object: unit.object }));
            }
        }
        return part;
    };
    let mut w = Work {
        object: Cow::Borrowed(object),
        instance: instance.map(Cow::Borrowed),
        source: instance.and_then(|i| world.sources.get(&i.script)).map(Cow::Borrowed),
        pending: Vec::new(),
        failed_this_tick: false,
        operations_share: unit.operations,
        operations_left: unit.operations,
    };
    for input in &unit.inputs {
        match input {
            UnitInput::Init => w.pending.push(ScriptInput::Init),
            UnitInput::Tick => w.pending.push(ScriptInput::Tick),
            UnitInput::Timer => {
                if let Some(inst) = w.instance.as_mut()
                    && let Some(t) = inst.timer
                {
                    inst.to_mut().timer = Some(Timer { every_ticks: t.every_ticks, next: next_fire(t, ctx) });
                    w.pending.push(ScriptInput::Timer);
                }
            }
            UnitInput::Queued(q) => w.pending.push(queued_input(q)),
            UnitInput::Event(c) => client_event(world, host, ctx, &mut w, &mut part, c),
        }
    }
    flush(world, host, ctx, &mut w, &mut part);
    finish(w, part)
}

fn next_fire(t: Timer, ctx: &TickCtx) -> crate::ids::Tick {
    crate::ids::Tick(ctx.tick.0.saturating_add(u64::from(t.every_ticks.max(1))))
}

fn finish(w: Work<'_>, mut part: ObjectPart) -> ObjectPart {
    if let Cow::Owned(o) = w.object {
        part.updated = Some(Box::new(o));
    }
    let Some(mut inst) = w.instance else { return part };
    // One rule for the failure score: a failing tick adds FAILURE_WEIGHT, a clean run takes one
    // off, and a suspended script (which did not run) keeps its score. So a script is suspended
    // for failing often, not only in a row (DESIGN §6: failing every other tick reaches the
    // limit too). Written back only if it changed.
    let failures = if w.failed_this_tick {
        inst.failures.saturating_add(FAILURE_WEIGHT)
    } else if inst.suspended {
        inst.failures
    } else {
        inst.failures.saturating_sub(1)
    };
    if failures != inst.failures {
        inst.to_mut().failures = failures;
    }
    if let Cow::Owned(inst) = inst {
        part.instance = InstanceChange::Set(Box::new(inst));
    }
    part
}

fn reject(c: &Checked, reason: RejectReason) -> Rejection {
    Rejection { event: c.id, author: c.event.body.author, reason }
}

fn queued_input(q: &Queued) -> ScriptInput {
    match q {
        Queued::Message { from, data, .. } => ScriptInput::Message { from: *from, data: data.clone() },
        Queued::Heard { channel, speaker, text, .. } => {
            ScriptInput::Chat { channel: *channel, speaker: speaker.clone(), text: text.clone() }
        }
        Queued::Collision { other, .. } => ScriptInput::Collision { other: *other },
    }
}

fn client_event(
    world: &World,
    host: &dyn ScriptHost,
    ctx: &TickCtx,
    w: &mut Work<'_>,
    part: &mut ObjectPart,
    c: &Checked,
) {
    let author = c.event.body.author;
    let owner_only = |w: &Work<'_>| {
        if w.object.owner == author { Ok(()) } else { Err(RejectReason::NotOwner { object: w.object.id }) }
    };
    let result = match &c.event.body.payload {
        Payload::Move { velocity, .. } => owner_only(w).and_then(|()| {
            if !w.object.body.moves() {
                return Err(RejectReason::InvalidValue { field: "object (static: edit its position instead)".into() });
            }
            let velocity = velocity.clamp_length(world.settings.limits.max_speed);
            let object = w.object.id;
            // An avatar walks: it holds its owner's velocity; other objects are set moving.
            part.physics.push(if w.object.kind == ObjectKind::Avatar {
                PhysicsCommand::Drive { object, velocity }
            } else {
                PhysicsCommand::SetVelocity { object, velocity }
            });
            Ok(())
        }),
        Payload::Edit { edit, .. } => owner_only(w).and_then(|()| apply_edit(world, w, part, edit)),
        Payload::Touch { .. } => {
            w.pending.push(ScriptInput::Touch { who: author });
            Ok(())
        }
        Payload::DeployScript { source, licence, derived_from, .. } => owner_only(w).and_then(|()| {
            let record =
                ScriptSource { source: source.clone(), licence: licence.clone(), author, derived_from: *derived_from };
            deploy(world, host, ctx, w, part, record)
        }),
        // The router sends only object payloads here.
        other => unreachable!("routed a non-object payload to an object unit: {other:?}"),
    };
    if let Err(reason) = result {
        part.rejected.push(reject(c, reason));
    }
}

fn deploy(
    world: &World,
    host: &dyn ScriptHost,
    ctx: &TickCtx,
    w: &mut Work<'_>,
    part: &mut ObjectPart,
    record: ScriptSource,
) -> Result<(), RejectReason> {
    if !COPYLEFT_LICENCES.contains(&record.licence.as_str()) {
        return Err(RejectReason::LicenceNotCopyleft { licence: record.licence });
    }
    let compiled = host
        .compile(&record, &world.settings.limits)
        .map_err(|message| RejectReason::CompileError { message: truncate(message, 512) })?;
    // Inputs that arrived before the deployment go to the old script.
    flush(world, host, ctx, w, part);
    let id: ScriptId = record.id();
    w.instance = Some(Cow::Owned(ScriptInstance {
        script: id,
        state: Vec::new(),
        wants_tick: compiled.wants_tick,
        listen: Default::default(),
        timer: None,
        failures: 0,
        suspended: false,
    }));
    w.source = Some(Cow::Owned(record.clone()));
    part.new_source = Some(Box::new(record));
    w.pending.push(ScriptInput::Init);
    Ok(())
}

/// An owner's edit of its object's properties. A new position (inside the sim), shape or body
/// kind places the body afresh, at rest; the rest only changes how the object looks.
fn apply_edit(world: &World, w: &mut Work<'_>, part: &mut ObjectPart, edit: &ObjectEdit) -> Result<(), RejectReason> {
    let ObjectEdit { name, text, color, shape, position, body, surface } = edit;
    if position.is_some_and(|p| !world.region.contains(p)) {
        return Err(RejectReason::InvalidValue { field: "position (outside this sim)".into() });
    }
    if w.object.kind == ObjectKind::Avatar && (body.is_some() || position.is_some()) {
        return Err(RejectReason::InvalidValue { field: "object (an avatar walks: it is not placed)".into() });
    }
    let o = w.object.to_mut();
    if let Some(n) = name {
        o.name.clone_from(n);
    }
    if let Some(t) = text {
        o.text.clone_from(t);
    }
    if let Some(c) = color {
        o.color = *c;
    }
    if shape.is_some() || position.is_some() || body.is_some() || surface.is_some() {
        o.shape = shape.unwrap_or(o.shape);
        o.position = position.unwrap_or(o.position);
        o.body = body.unwrap_or(o.body);
        if surface.is_some() {
            o.surface = *surface;
        }
        // A new surface alone keeps it moving; a new place, shape or body puts it at rest.
        if shape.is_some() || position.is_some() || body.is_some() {
            o.velocity = crate::vec2::Vec2::ZERO;
        }
        part.physics.push(PhysicsCommand::Spawn {
            object: o.id,
            position: o.position,
            velocity: o.velocity,
            shape: o.shape,
            body: o.body,
            surface: o.surface,
        });
    }
    Ok(())
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// Run the pending inputs through the current script and apply its output.
fn flush(world: &World, host: &dyn ScriptHost, ctx: &TickCtx, w: &mut Work<'_>, part: &mut ObjectPart) {
    if w.pending.is_empty() {
        return;
    }
    let inputs = std::mem::take(&mut w.pending);
    let (Some(instance), Some(source)) = (w.instance.as_ref(), w.source.as_ref()) else {
        return; // no script: touches and messages have no effect
    };
    if instance.suspended {
        return;
    }
    let limits = &world.settings.limits;
    let out = host.run(
        &ScriptCtx {
            world,
            object: &w.object,
            instance,
            source,
            tick: ctx.tick,
            time_ms: ctx.time_ms,
            tick_seed: ctx.seed,
            limits,
            operations: w.operations_left,
            near: &ctx.near,
        },
        &inputs,
    );
    w.operations_left = w.operations_left.saturating_sub(out.operations);
    part.operations = part.operations.saturating_add(out.operations);
    apply_output(world, ctx, w, part, out);
}

fn apply_output(world: &World, ctx: &TickCtx, w: &mut Work<'_>, part: &mut ObjectPart, out: ScriptOutput) {
    let limits = &world.settings.limits;
    let mut error = out.error;
    let max_outputs = limits.max_script_outputs as usize;
    let mut emitted = 0usize;
    let mut said = 0usize;
    for action in out.actions {
        if let ScriptAction::Say { text, .. } = &action {
            said += text.len();
            if said > MAX_CHAT_BYTES_PER_TICK {
                error.get_or_insert(ScriptError {
                    kind: ScriptErrorKind::TooManyOutputs,
                    message: format!("more than {MAX_CHAT_BYTES_PER_TICK} bytes of chat in one tick"),
                });
                break;
            }
        }
        let emits = matches!(
            action,
            ScriptAction::Say { .. }
                | ScriptAction::Send { .. }
                | ScriptAction::Impulse(_)
                | ScriptAction::SetVelocity(_)
                | ScriptAction::SetTarget { .. }
        );
        if emits {
            emitted += 1;
            if emitted > max_outputs {
                error.get_or_insert(ScriptError {
                    kind: ScriptErrorKind::TooManyOutputs,
                    message: format!("more than {max_outputs} messages, chat lines or commands in one tick"),
                });
                break;
            }
        }
        apply_action(world, w, part, action);
    }
    // The listen set counts against the state's bytes: every per-script collection is bounded
    // and part of what the script may keep (its timer is one value).
    let listening = w.instance.as_ref().map_or(0, |i| i.listen.len() * LISTEN_ENTRY_BYTES);
    if out.state.len() + listening > limits.max_script_state_bytes as usize {
        error.get_or_insert(ScriptError {
            kind: ScriptErrorKind::TooLarge,
            message: format!(
                "state is {} bytes with its listen set ({listening}), the limit is {}",
                out.state.len() + listening,
                limits.max_script_state_bytes
            ),
        });
    } else if let Some(inst) = w.instance.as_mut()
        && !same_bytes(&inst.state, &out.state)
    {
        inst.to_mut().state = out.state;
    }
    if let Some(e) = error {
        report_error(ctx, w, part, e);
    }
    if out.dropped > 0 {
        // Not a failure: the object did too much this tick, and its owner should know.
        let text = format!(
            "{} of this tick's inputs were not run: the object spent its operation budget for the tick ({} operations, its share of its owner's {})",
            out.dropped, w.operations_share, limits.operations_per_account_tick
        );
        part.chat.push(to_owner(&w.object, text));
    }
}

/// `a == b` for byte strings, without calling `memcmp` on two empty ones: most scripts keep no
/// state, and glibc's AVX-512 `memcmp` does a masked load from the empty vectors' dangling
/// pointer, which on this AMD machine costs a fault-suppression assist (~100 ns, a fifth of a
/// small script's tick in the scripts bench).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && (a.is_empty() || a == b)
}

/// What a listened channel counts against `max_script_state_bytes`.
pub const LISTEN_ENTRY_BYTES: usize = 4;

/// Bytes of chat one script may say in one tick (its lines together): what its chat costs every
/// listener, client and node is charged to it; more is a failure (too many outputs).
pub const MAX_CHAT_BYTES_PER_TICK: usize = 16 * 1024;

/// What a failing tick adds to a script's failure score (a clean run takes one off); a score of
/// `script_failure_limit` times this suspends it: that many failing ticks in a row, or failing
/// ticks more often than one in this many over a longer stretch.
pub const FAILURE_WEIGHT: u32 = 4;

fn report_error(ctx: &TickCtx, w: &mut Work<'_>, part: &mut ObjectPart, e: ScriptError) {
    w.failed_this_tick = true;
    let limit = ctx.script_failure_limit;
    if let Some(inst) = w.instance.as_mut() {
        // `failures` scores earlier ticks; this tick adds its weight (once, in `finish`).
        if inst.failures.saturating_add(FAILURE_WEIGHT) >= limit.saturating_mul(FAILURE_WEIGHT) {
            inst.to_mut().suspended = true;
        }
    }
    let suspended = w.instance.as_ref().is_some_and(|i| i.suspended);
    part.errors.push(ScriptErrorReport { object: w.object.id, owner: w.object.owner, error: e.clone(), suspended });
    let text = truncate(format!("script error: {e}{}", if suspended { " (suspended)" } else { "" }), 1024);
    part.chat.push(to_owner(&w.object, text));
}

/// A private line from an object to its owner, on the debug channel.
fn to_owner(object: &crate::state::Object, text: String) -> ChatLine {
    ChatLine {
        speaker: Speaker::Object(object.id),
        name: object.name.clone(),
        channel: DEBUG_CHANNEL,
        range: crate::event::ChatRange::Say,
        position: object.position,
        text,
        to: Some(object.owner),
    }
}

fn apply_action(world: &World, w: &mut Work<'_>, part: &mut ObjectPart, action: ScriptAction) {
    let id = w.object.id;
    let limits = &world.settings.limits;
    match action {
        ScriptAction::SetColor(c) => {
            if w.object.color != c {
                w.object.to_mut().color = c;
            }
        }
        ScriptAction::SetText(t) => {
            let t = truncate(t, limits.max_text_bytes as usize);
            if w.object.text != t {
                w.object.to_mut().text = t;
            }
        }
        // A static object stays where it was put: motion asks nothing of physics (documented).
        ScriptAction::SetVelocity(_) | ScriptAction::SetTarget { .. } | ScriptAction::Impulse(_)
            if !w.object.body.moves() => {}
        ScriptAction::SetVelocity(v) => {
            part.physics.push(PhysicsCommand::SetVelocity { object: id, velocity: v.clamp_length(limits.max_speed) })
        }
        ScriptAction::SetTarget { target, speed } => part.physics.push(PhysicsCommand::SetTarget {
            object: id,
            target,
            speed: speed.clamp(Fx::ZERO, limits.max_speed),
        }),
        ScriptAction::Impulse(i) => {
            part.physics.push(PhysicsCommand::Impulse { object: id, impulse: i.clamp_length(limits.max_speed) })
        }
        ScriptAction::Say { channel, range, text } => part.chat.push(ChatLine {
            speaker: Speaker::Object(id),
            name: w.object.name.clone(),
            channel,
            range,
            position: w.object.position,
            text: truncate(text, limits.max_chat_bytes as usize),
            to: None,
        }),
        ScriptAction::Send { to, data } => {
            part.queued.push(Queued::Message { from: id, to, data: truncate(data, limits.max_chat_bytes as usize) })
        }
        ScriptAction::Listen { channel, on } => {
            if let Some(inst) = w.instance.as_mut()
                && inst.listen.contains(&channel) != on
            {
                if on && inst.listen.len() >= crate::state::MAX_LISTEN_CHANNELS {
                    let max = crate::state::MAX_LISTEN_CHANNELS;
                    part.chat.push(ChatLine {
                        speaker: Speaker::Object(id),
                        name: w.object.name.clone(),
                        channel: DEBUG_CHANNEL,
                        range: crate::event::ChatRange::Say,
                        position: w.object.position,
                        text: format!("listen {channel} ignored: a script listens on at most {max} channels"),
                        to: Some(w.object.owner),
                    });
                    return;
                }
                let l = &mut inst.to_mut().listen;
                if on {
                    l.insert(channel);
                } else {
                    l.remove(&channel);
                }
            }
        }
        ScriptAction::SetTimer { every_ticks } => {
            if let Some(inst) = w.instance.as_mut() {
                let timer = (every_ticks > 0).then(|| Timer {
                    every_ticks,
                    next: crate::ids::Tick(world.tick.0.saturating_add(u64::from(every_ticks))),
                });
                if inst.timer != timer {
                    inst.to_mut().timer = timer;
                }
            }
        }
    }
}
