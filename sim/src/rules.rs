//! A tiny rule-based script host: a real [`ScriptHost`] for `sim`'s own tests and seeded
//! worlds. The `scripting` crate (rhai) is the one creators use.
//!
//! A rules script is lines of directives and handlers:
//!
//! ```text
//! # a door
//! listen 5
//! timer 30
//! on touch: color ff0000ff; say 0 opened; count
//! on chat: echo
//! on tick: velocity 1 0
//! ```
//!
//! Events: `init tick timer touch chat message collision`. Actions: `color RRGGBBAA`,
//! `text WORDS`, `say CH WORDS`, `shout CH WORDS`, `velocity X Y`, `impulse X Y`,
//! `target X Y SPEED`, `count` (persisted counter, shown as text), `echo` (say back what was
//! heard or received), `reply WORDS` (message the sender), `send SLOTvGEN WORDS`, `fail`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::event::ChatRange;
use crate::fx::Fx;
use crate::host::{
    Compiled, ScriptAction, ScriptCtx, ScriptError, ScriptErrorKind, ScriptHost, ScriptInput, ScriptOutput,
};
use crate::ids::{ObjectId, ScriptId};
use crate::state::{Limits, ScriptSource};
use crate::vec2::Vec2;

/// The rules host. Parsed scripts are cached by content hash (a cache only: every node parses
/// the same source the same way, so it never changes a result). Clones share the cache.
#[derive(Clone, Debug, Default)]
pub struct RuleHost {
    cache: Arc<Mutex<BTreeMap<ScriptId, Arc<Rules>>>>,
}

impl RuleHost {
    /// `id` is the source's content hash (an instance carries it: no need to rehash).
    fn rules(&self, id: ScriptId, source: &ScriptSource) -> Result<Arc<Rules>, String> {
        if let Some(r) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&id) {
            return Ok(r.clone());
        }
        let parsed = Arc::new(parse(&source.source)?);
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= 4_096 {
            cache.clear();
        }
        cache.insert(id, parsed.clone());
        Ok(parsed)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum On {
    Init,
    Tick,
    Timer,
    Touch,
    Chat,
    Message,
    Collision,
}

#[derive(Clone, PartialEq, Eq, Debug)]
enum Action {
    Color(u32),
    Text(String),
    Say(i32, ChatRange, String),
    Velocity(Vec2),
    Impulse(Vec2),
    Target(Vec2, Fx),
    Count,
    Echo,
    Reply(String),
    Send(ObjectId, String),
    Fail,
}

#[derive(Debug, Default)]
struct Rules {
    listen: Vec<i32>,
    timer: Option<u32>,
    handlers: BTreeMap<On, Vec<Action>>,
}

fn parse(src: &str) -> Result<Rules, String> {
    let mut r = Rules::default();
    for (n, line) in src.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |m: &str| format!("line {}: {m}: {line:?}", n + 1);
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[0] {
            "listen" => r.listen.push(words.get(1).and_then(|w| w.parse().ok()).ok_or_else(|| err("bad channel"))?),
            "timer" => r.timer = Some(words.get(1).and_then(|w| w.parse().ok()).ok_or_else(|| err("bad ticks"))?),
            "on" => {
                let (head, body) = line[2..].split_once(':').ok_or_else(|| err("expected `on EVENT: actions`"))?;
                let on = match head.trim() {
                    "init" => On::Init,
                    "tick" => On::Tick,
                    "timer" => On::Timer,
                    "touch" => On::Touch,
                    "chat" => On::Chat,
                    "message" => On::Message,
                    "collision" => On::Collision,
                    other => return Err(err(&format!("unknown event {other:?}"))),
                };
                let actions = body
                    .split(';')
                    .map(str::trim)
                    .filter(|a| !a.is_empty())
                    .map(|a| parse_action(a).map_err(|m| err(&m)))
                    .collect::<Result<Vec<_>, _>>()?;
                r.handlers.entry(on).or_default().extend(actions);
            }
            other => return Err(err(&format!("unknown directive {other:?}"))),
        }
    }
    Ok(r)
}

fn parse_action(a: &str) -> Result<Action, String> {
    let words: Vec<&str> = a.split_whitespace().collect();
    let rest = |from: usize| words.get(from..).map(|w| w.join(" ")).unwrap_or_default();
    let fx = |i: usize| -> Result<Fx, String> {
        words.get(i).ok_or("missing number")?.parse::<Fx>().map_err(|e| e.to_string())
    };
    let int = |i: usize| -> Result<i32, String> {
        words.get(i).and_then(|w| w.parse().ok()).ok_or_else(|| "bad channel".to_string())
    };
    Ok(match words[0] {
        "color" => {
            Action::Color(words.get(1).and_then(|w| u32::from_str_radix(w, 16).ok()).ok_or("color needs RRGGBBAA hex")?)
        }
        "text" => Action::Text(rest(1)),
        "say" => Action::Say(int(1)?, ChatRange::Say, rest(2)),
        "shout" => Action::Say(int(1)?, ChatRange::Shout, rest(2)),
        "velocity" => Action::Velocity(Vec2::new(fx(1)?, fx(2)?)),
        "impulse" => Action::Impulse(Vec2::new(fx(1)?, fx(2)?)),
        "target" => Action::Target(Vec2::new(fx(1)?, fx(2)?), fx(3)?),
        "count" => Action::Count,
        "echo" => Action::Echo,
        "reply" => Action::Reply(rest(1)),
        "send" => {
            let id = words.get(1).ok_or("send needs an object")?;
            let (s, g) = id.split_once('v').ok_or("object ids look like 3v0")?;
            let slot = s.parse().map_err(|_| "bad slot")?;
            let generation = g.parse().map_err(|_| "bad generation")?;
            Action::Send(ObjectId::new(slot, generation), rest(2))
        }
        "fail" => Action::Fail,
        other => return Err(format!("unknown action {other:?}")),
    })
}

impl ScriptHost for RuleHost {
    fn compile(&self, source: &ScriptSource, limits: &Limits) -> Result<Compiled, String> {
        if source.source.len() > limits.max_source_bytes as usize {
            return Err(format!("source is over {} bytes", limits.max_source_bytes));
        }
        let rules = parse(&source.source)?;
        Ok(Compiled { wants_tick: rules.handlers.contains_key(&On::Tick) })
    }

    fn run(&self, ctx: &ScriptCtx<'_>, inputs: &[ScriptInput]) -> ScriptOutput {
        let rules = match self.rules(ctx.instance.script, ctx.source) {
            Ok(r) => r,
            Err(message) => {
                return ScriptOutput {
                    state: ctx.instance.state.clone(),
                    actions: Vec::new(),
                    error: Some(ScriptError { kind: ScriptErrorKind::Runtime, message }),
                    dropped: 0,
                    operations: 0,
                };
            }
        };
        let mut counter = decode_counter(&ctx.instance.state);
        let mut out = ScriptOutput::default();
        for input in inputs {
            let on = match input {
                ScriptInput::Init => {
                    for ch in &rules.listen {
                        out.actions.push(ScriptAction::Listen { channel: *ch, on: true });
                    }
                    if let Some(t) = rules.timer {
                        out.actions.push(ScriptAction::SetTimer { every_ticks: t });
                    }
                    On::Init
                }
                ScriptInput::Tick => On::Tick,
                ScriptInput::Timer => On::Timer,
                ScriptInput::Touch { .. } => On::Touch,
                ScriptInput::Chat { .. } => On::Chat,
                ScriptInput::Message { .. } => On::Message,
                ScriptInput::Collision { .. } => On::Collision,
            };
            let actions = rules.handlers.get(&on).map(Vec::as_slice).unwrap_or(&[]);
            // Rules count one operation per rule run: the budget applies to them too.
            if out.operations >= ctx.operations && !actions.is_empty() {
                out.dropped += 1;
                continue;
            }
            out.operations += actions.len() as u64;
            for action in actions {
                if let Err(e) = perform(action, input, &mut counter, &mut out.actions) {
                    out.error = Some(e);
                    out.state = counter.to_le_bytes().to_vec();
                    return out;
                }
            }
        }
        out.state = if counter == 0 { Vec::new() } else { counter.to_le_bytes().to_vec() };
        out
    }
}

fn decode_counter(state: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = state.len().min(8);
    b[..n].copy_from_slice(&state[..n]);
    u64::from_le_bytes(b)
}

fn perform(a: &Action, input: &ScriptInput, counter: &mut u64, out: &mut Vec<ScriptAction>) -> Result<(), ScriptError> {
    match a {
        Action::Color(c) => out.push(ScriptAction::SetColor(*c)),
        Action::Text(t) => out.push(ScriptAction::SetText(t.clone())),
        Action::Say(channel, range, text) => {
            out.push(ScriptAction::Say { channel: *channel, range: *range, text: text.clone() })
        }
        Action::Velocity(v) => out.push(ScriptAction::SetVelocity(*v)),
        Action::Impulse(v) => out.push(ScriptAction::Impulse(*v)),
        Action::Target(t, s) => out.push(ScriptAction::SetTarget { target: *t, speed: *s }),
        Action::Count => {
            *counter = counter.saturating_add(1);
            out.push(ScriptAction::SetText(counter.to_string()));
        }
        Action::Echo => {
            let heard = match input {
                ScriptInput::Chat { text, .. } => Some(text),
                ScriptInput::Message { data, .. } => Some(data),
                _ => None,
            };
            if let Some(text) = heard {
                out.push(ScriptAction::Say { channel: 0, range: ChatRange::Say, text: format!("echo: {text}") });
            }
        }
        Action::Reply(text) => {
            if let ScriptInput::Message { from, .. } = input {
                out.push(ScriptAction::Send { to: *from, data: text.clone() });
            }
        }
        Action::Send(to, text) => out.push(ScriptAction::Send { to: *to, data: text.clone() }),
        Action::Fail => {
            return Err(ScriptError { kind: ScriptErrorKind::Runtime, message: "the script called fail".into() });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_handlers_and_reports_line_numbers() {
        let r = parse("listen 5\n# c\non touch: color ff0000ff; say 0 hi there\non tick: velocity 1.5 -2").unwrap();
        assert_eq!(r.listen, vec![5]);
        assert_eq!(r.handlers[&On::Touch][1], Action::Say(0, ChatRange::Say, "hi there".into()));
        assert_eq!(r.handlers[&On::Tick][0], Action::Velocity(Vec2::new("1.5".parse().unwrap(), Fx::from_int(-2))));
        let e = parse("on touch: color red").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        assert!(parse("on whenever: count").is_err());
    }
}
