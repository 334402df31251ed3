//! The script API: what a script may read and ask for. Nothing else is registered (no I/O, no
//! clock, no OS randomness). Functions reach the running script's context through scoped
//! thread-locals set for the duration of one object's handlers.

use std::cell::RefCell;

use metatopia_sim::host::ScriptAction;
use metatopia_sim::rng::DetRng;
use metatopia_sim::state::Object;
use metatopia_sim::{AccountId, ChatRange, Fx, ObjectId, Tick, Vec2, World};
use rhai::{Array, Dynamic, Engine, INT, ImmutableString, Map};

use crate::numbers::{RhaiResult, fx_dyn, to_fx, to_int, vec_map};

/// The running script's own, mutable context.
#[derive(Debug)]
pub(crate) struct Call {
    pub tick: Tick,
    /// The tick seed; the RNG is made from it on the first `random` call.
    pub tick_seed: metatopia_sim::Hash32,
    pub rng: Option<DetRng>,
    pub actions: Vec<ScriptAction>,
    pub max_nearby: usize,
}

scoped_tls::scoped_thread_local!(pub(crate) static WORLD: World);
scoped_tls::scoped_thread_local!(pub(crate) static NEAR: metatopia_sim::state::near::Near);
scoped_tls::scoped_thread_local!(pub(crate) static OBJECT: Object);
scoped_tls::scoped_thread_local!(pub(crate) static CALL: RefCell<Call>);

fn with_object<R>(f: impl FnOnce(&Object) -> R) -> RhaiResult<R> {
    if !OBJECT.is_set() {
        return Err("the script API is only available inside a handler".into());
    }
    Ok(OBJECT.with(f))
}

fn with_call<R>(f: impl FnOnce(&mut Call) -> R) -> RhaiResult<R> {
    if !CALL.is_set() {
        return Err("the script API is only available inside a handler".into());
    }
    CALL.with(|c| Ok(f(&mut c.borrow_mut())))
}

fn push(a: ScriptAction) -> RhaiResult<()> {
    with_call(|c| c.actions.push(a))
}

/// The most account ids [`account_str`] keeps per thread before it starts again.
const ACCOUNT_STRS_MAX: usize = 4_096;

thread_local! {
    /// Account ids as scripts see them, kept per thread: a pure function of the id, so sharing
    /// them changes nothing but the work (`nearby` makes a map of every object it finds, every
    /// tick, and objects' owners are few). Emptied when full.
    static ACCOUNT_STRS: RefCell<std::collections::BTreeMap<AccountId, ImmutableString>> =
        const { RefCell::new(std::collections::BTreeMap::new()) };
}

/// An account id as scripts see it: 64 hex digits.
fn account_str(a: &AccountId) -> ImmutableString {
    ACCOUNT_STRS.with_borrow_mut(|known| {
        if let Some(s) = known.get(a) {
            return s.clone();
        }
        if known.len() >= ACCOUNT_STRS_MAX {
            known.clear();
        }
        let s = ImmutableString::from(a.to_string());
        known.insert(*a, s.clone());
        s
    })
}

/// An object id as scripts see it (`12v0`), written on the stack (at most 21 characters:
/// rhai keeps a string that short inline) rather than through a heap `String`.
fn object_id_str(id: ObjectId) -> ImmutableString {
    use std::io::Write as _;
    let mut buf = [0u8; 24];
    let mut w = &mut buf[..];
    match write!(w, "{id}") {
        Ok(()) => {
            let len = 24 - w.len();
            std::str::from_utf8(&buf[..len]).map_or_else(|_| id.to_string().into(), ImmutableString::from)
        }
        Err(_) => id.to_string().into(),
    }
}

fn object_map(o: &Object) -> Map {
    let mut m = Map::new();
    m.insert("id".into(), object_id_str(o.id).into());
    m.insert("name".into(), ImmutableString::from(o.name.as_str()).into());
    m.insert("owner".into(), account_str(&o.owner).into());
    m.insert("avatar".into(), (o.kind == metatopia_sim::state::ObjectKind::Avatar).into());
    m.insert("position".into(), vec_map(o.position).into());
    m.insert("velocity".into(), vec_map(o.velocity).into());
    m.insert("color".into(), INT::from(o.color).into());
    m.insert("text".into(), ImmutableString::from(o.text.as_str()).into());
    m
}

/// An account id: 64 hex digits.
fn account_id(s: &str) -> Option<metatopia_sim::AccountId> {
    let mut id = [0u8; 32];
    hex::decode_to_slice(s, &mut id).ok().map(|()| metatopia_sim::AccountId(id))
}

fn parse_id(s: &str) -> RhaiResult<ObjectId> {
    let (slot, generation) =
        s.split_once('v').ok_or_else(|| format!("not an object id: {s:?} (ids look like 12v0)"))?;
    match (slot.parse(), generation.parse()) {
        (Ok(slot), Ok(generation)) => Ok(ObjectId::new(slot, generation)),
        _ => Err(format!("not an object id: {s:?}").into()),
    }
}

fn say(channel: INT, range: ChatRange, text: ImmutableString) -> RhaiResult<()> {
    let channel = i32::try_from(channel).map_err(|_| format!("channel {channel} is out of range"))?;
    push(ScriptAction::Say { channel, range, text: text.to_string() })
}

fn vec_of(x: &Dynamic, y: &Dynamic) -> RhaiResult<Vec2> {
    Ok(Vec2::new(to_fx("x", x)?, to_fx("y", y)?))
}

/// Register the API on an engine.
pub(crate) fn register(engine: &mut Engine) {
    // Reading.
    engine.register_fn("me", || -> RhaiResult<Map> { with_object(object_map) });
    engine.register_fn("tick", || -> RhaiResult<INT> { with_call(|c| c.tick.0 as INT) });
    engine.register_fn("nearby", |radius: Dynamic| -> RhaiResult<Array> {
        let r = to_fx("radius", &radius)?;
        let (me, pos) = with_object(|o| (o.id, o.position))?;
        let max = with_call(|c| c.max_nearby)?;
        if !WORLD.is_set() || !NEAR.is_set() {
            return Err("no world".into());
        }
        Ok(WORLD.with(|w| {
            NEAR.with(|near| {
                near.within(w, pos, r, me, max).into_iter().map(|o| Dynamic::from_map(object_map(o))).collect()
            })
        }))
    });
    // An object by id, or an account's avatar by account id (what `on_touch` gives as `who`).
    engine.register_fn("get_object", |id: ImmutableString| -> RhaiResult<Dynamic> {
        if !WORLD.is_set() {
            return Err("no world".into());
        }
        let id = match account_id(&id) {
            Some(account) => match WORLD.with(|w| w.account(&account).and_then(|a| a.avatar)) {
                Some(avatar) => avatar,
                None => return Ok(Dynamic::UNIT),
            },
            None => parse_id(&id)
                .map_err(|_| format!("get_object({id:?}): not an object id (12v0) or an account id (64 hex digits)"))?,
        };
        Ok(WORLD.with(|w| w.object(id).map_or(Dynamic::UNIT, |o| Dynamic::from_map(object_map(o)))))
    });
    engine.register_fn("script_source", |id: ImmutableString| -> RhaiResult<Dynamic> {
        let id = parse_id(&id)?;
        Ok(WORLD.with(|w| w.script_source(id).map_or(Dynamic::UNIT, |s| s.source.clone().into())))
    });

    // Own object.
    engine.register_fn("set_color", |c: INT| push(ScriptAction::SetColor(c as u32)));
    engine.register_fn("set_text", |t: ImmutableString| push(ScriptAction::SetText(t.to_string())));
    engine.register_fn("set_velocity", |x: Dynamic, y: Dynamic| push(ScriptAction::SetVelocity(vec_of(&x, &y)?)));
    engine.register_fn("apply_impulse", |x: Dynamic, y: Dynamic| push(ScriptAction::Impulse(vec_of(&x, &y)?)));
    engine.register_fn("set_target", |x: Dynamic, y: Dynamic, speed: Dynamic| {
        push(ScriptAction::SetTarget { target: vec_of(&x, &y)?, speed: to_fx("speed", &speed)? })
    });

    // Talking.
    engine.register_fn("say", |ch: INT, t: ImmutableString| say(ch, ChatRange::Say, t));
    engine.register_fn("whisper", |ch: INT, t: ImmutableString| say(ch, ChatRange::Whisper, t));
    engine.register_fn("shout", |ch: INT, t: ImmutableString| say(ch, ChatRange::Shout, t));
    engine.register_fn("listen", |ch: INT| {
        let channel = i32::try_from(ch).map_err(|_| format!("channel {ch} is out of range"))?;
        push(ScriptAction::Listen { channel, on: true })
    });
    engine.register_fn("unlisten", |ch: INT| {
        let channel = i32::try_from(ch).map_err(|_| format!("channel {ch} is out of range"))?;
        push(ScriptAction::Listen { channel, on: false })
    });
    engine.register_fn("send", |to: ImmutableString, data: ImmutableString| {
        push(ScriptAction::Send { to: parse_id(&to)?, data: data.to_string() })
    });

    // Time and chance, deterministic.
    engine.register_fn("start_timer", |ticks: INT| {
        let every_ticks = u32::try_from(ticks.max(1)).map_err(|_| format!("timer of {ticks} ticks is out of range"))?;
        push(ScriptAction::SetTimer { every_ticks })
    });
    engine.register_fn("stop_timer", || push(ScriptAction::SetTimer { every_ticks: 0 }));
    engine.register_fn("random", |n: INT| -> RhaiResult<INT> {
        if n <= 0 {
            return Err(format!("random({n}): the bound must be positive").into());
        }
        let id = with_object(|o| o.id)?;
        with_call(|c| {
            let seed = c.tick_seed;
            let rng = c.rng.get_or_insert_with(|| DetRng::from_seed(metatopia_sim::pipeline::script_seed(&seed, id)));
            rng.below(n as u64) as INT
        })
    });

    // Deterministic math on numbers (integers or decimals), through Fx.
    engine.register_fn("sqrt", |x: Dynamic| -> RhaiResult<Dynamic> { Ok(fx_dyn(to_fx("x", &x)?.sqrt())) });
    engine.register_fn("sin", |x: Dynamic| -> RhaiResult<Dynamic> { Ok(fx_dyn(to_fx("x", &x)?.sin())) });
    engine.register_fn("cos", |x: Dynamic| -> RhaiResult<Dynamic> { Ok(fx_dyn(to_fx("x", &x)?.cos())) });
    engine.register_fn("atan2", |y: Dynamic, x: Dynamic| -> RhaiResult<Dynamic> {
        Ok(fx_dyn(Fx::atan2(to_fx("y", &y)?, to_fx("x", &x)?)))
    });
    engine.register_fn("distance", |a: Map, b: Map| -> RhaiResult<Dynamic> {
        let get = |m: &Map, k: &str| m.get(k).cloned().unwrap_or(Dynamic::UNIT);
        let pa = vec_of(&get(&a, "x"), &get(&a, "y"))?;
        let pb = vec_of(&get(&b, "x"), &get(&b, "y"))?;
        Ok(fx_dyn(pa.distance(pb)))
    });
    engine.register_fn("to_int", |x: Dynamic| to_int("x", &x));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objects_map_shows_its_ids_as_scripts_read_them() {
        let world = metatopia_sim::genesis::demo_world(metatopia_sim::genesis::DemoSpec {
            objects: 300,
            players: 20,
            ..Default::default()
        })
        .world;
        for _ in 0..2 {
            for o in world.objects().values() {
                let m = object_map(o);
                let text = |k: &str| m[k].clone().into_immutable_string().unwrap().to_string();
                assert_eq!(text("id"), o.id.to_string());
                assert_eq!(text("owner"), o.owner.to_string());
                assert_eq!(text("name"), o.name);
                assert_eq!(text("text"), o.text);
            }
        }
        // More accounts than are kept: each still reads right, and what is kept stays bounded.
        for i in 0..(ACCOUNT_STRS_MAX as u32 + 100) {
            let mut id = [7u8; 32];
            id[..4].copy_from_slice(&i.to_be_bytes());
            let a = AccountId(id);
            assert_eq!(account_str(&a).as_str(), a.to_string());
        }
        assert!(ACCOUNT_STRS.with_borrow(|k| k.len()) <= ACCOUNT_STRS_MAX);
        assert_eq!(
            object_id_str(ObjectId::new(u32::MAX, u32::MAX)).as_str(),
            ObjectId::new(u32::MAX, u32::MAX).to_string()
        );
    }
}
