//! Hostile scripts are contained: each fails with the right error on the owner's debug channel,
//! the tick completes, and a healthy script beside them is unaffected.

use crate::common::{idle, script, scripted_prim, step, world_with_players};
use metatopia_sim::host::ScriptErrorKind;
use metatopia_sim::state::RejectReason;
use metatopia_sim::{ObjectId, Payload, Vec2};

const HOSTILE_AT_RUNTIME: &[(&str, &str, ScriptErrorKind)] = &[
    ("infinite loop", "fn on_tick() { loop { } }", ScriptErrorKind::OutOfBudget),
    ("deep recursion", "fn f(n) { f(n + 1) } fn on_tick() { f(0) }", ScriptErrorKind::TooDeep),
    ("string doubling", r#"fn on_tick() { let s = "x"; loop { s += s; } }"#, ScriptErrorKind::TooLarge),
    ("huge array", "fn on_tick() { let a = []; loop { a.push(1); } }", ScriptErrorKind::TooLarge),
    (
        "huge map",
        "fn on_tick() { let m = #{}; let i = 0; loop { m[`k${i}`] = i; m += #{ last: i }; i += 1; } }",
        ScriptErrorKind::TooLarge,
    ),
    // rhai checks a map's size when maps combine, not on each index assignment: growth that
    // way stops at the operation budget instead (and persisted state at its byte limit).
    (
        "map growth by index",
        "fn on_tick() { let m = #{}; let i = 0; loop { m[`k${i}`] = i; i += 1; } }",
        ScriptErrorKind::OutOfBudget,
    ),
    ("floats", r#"fn on_tick() { let x = parse_float("1.5"); }"#, ScriptErrorKind::Forbidden),
    ("float conversion", "fn on_tick() { let x = to_float(3); }", ScriptErrorKind::Forbidden),
    ("time", "fn on_tick() { let t = timestamp(); }", ScriptErrorKind::Forbidden),
    (
        "huge state",
        "fn on_tick() { this.a = []; for i in 0..1000 { this.a.push(`entry number ${i}`); } }",
        ScriptErrorKind::TooLarge,
    ),
    ("runtime error", r#"fn on_tick() { throw "boom"; }"#, ScriptErrorKind::Runtime),
    (
        "chat flood",
        r#"fn on_tick() { let s = "x"; s.pad(900, "x"); for i in 0..64 { say(0, s); } }"#,
        ScriptErrorKind::TooManyOutputs,
    ),
];

#[test]
fn hostile_scripts_fail_with_the_right_error_and_others_carry_on() {
    let (mut sim, mut ps) = world_with_players(1);
    let (counter, _) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(3, 0), &script("counter"));
    let mut hostile: Vec<(ObjectId, &str, ScriptErrorKind)> = Vec::new();
    // Every error report, from deployment on (the first failing tick of each script).
    let mut errors = Vec::new();
    let mut chat = Vec::new();
    for (i, (name, src, kind)) in HOSTILE_AT_RUNTIME.iter().enumerate() {
        let (id, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(-3, i as i64), src);
        assert!(r.rejected.is_empty(), "{name} should deploy: {:?}", r.rejected);
        hostile.push((id, name, *kind));
        errors.extend(r.script_errors);
        chat.extend(r.chat);
    }
    let touch = ps[0].sign(&sim, Payload::Touch { object: counter });
    let r = step(&mut sim, vec![touch]);
    errors.extend(r.script_errors);
    chat.extend(r.chat);
    for (id, name, kind) in &hostile {
        let e = errors.iter().find(|e| e.object == *id).unwrap_or_else(|| panic!("{name}: no error"));
        assert_eq!(e.error.kind, *kind, "{name}: {}", e.error.message);
        assert_eq!(e.owner, ps[0].id());
        assert!(
            chat.iter().any(|l| l.to == Some(ps[0].id()) && l.speaker == metatopia_sim::pipeline::Speaker::Object(*id)),
            "{name}: the owner hears about it"
        );
    }
    // The healthy script ran in the same tick.
    assert_eq!(sim.world().object(counter).unwrap().text, "1");
    // After the failure limit the hostile scripts are suspended; the counter still works.
    let limit = sim.world().settings().limits.script_failure_limit;
    idle(&mut sim, u64::from(limit));
    for (id, name, _) in &hostile {
        assert!(sim.world().script(*id).unwrap().suspended, "{name} suspended");
    }
    let r = step(&mut sim, vec![]);
    assert!(r.script_errors.is_empty(), "suspended scripts no longer run");
    let touch = ps[0].sign(&sim, Payload::Touch { object: counter });
    step(&mut sim, vec![touch]);
    assert_eq!(sim.world().object(counter).unwrap().text, "2");
}

#[test]
fn eval_import_and_bad_source_are_refused_at_deployment() {
    let (mut sim, mut ps) = world_with_players(1);
    for (name, src) in [
        ("eval", r#"fn on_tick() { eval("1 + 1"); }"#),
        ("import", r#"import "os" as os; fn on_tick() { }"#),
        ("syntax", "fn on_tick( {"),
        ("no handler", "fn helper() { 1 }"),
    ] {
        let (id, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(1, 1), src);
        let reason = &r.rejected.first().unwrap_or_else(|| panic!("{name} was accepted")).reason;
        assert!(matches!(reason, RejectReason::CompileError { .. }), "{name}: {reason:?}");
        assert!(sim.world().script(id).is_none(), "{name}");
    }
    let huge = format!("fn on_tick() {{ }} // {}", "x".repeat(70_000));
    let (_, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(1, 1), &huge);
    assert!(matches!(r.rejected[0].reason, RejectReason::FieldTooLong { .. }), "{:?}", r.rejected);
}

#[test]
fn scripts_read_the_world_but_change_only_their_own_object() {
    let (mut sim, mut ps) = world_with_players(2);
    let (other, _) = scripted_prim(&mut sim, &mut ps[1], Vec2::from_ints(2, 0), &script("counter"));
    let src = format!(
        r#"fn on_touch(who) {{
            let o = get_object("{other}");
            set_text(`${{o.name}} at ${{o.position.x}} has ${{nearby(50).len()}} neighbours`);
            o.text = "hacked";     // a copy: the other object does not change
            send("{other}", "hello");
        }}"#
    );
    let (spy, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(-2, 0), &src);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    let t = ps[0].sign(&sim, Payload::Touch { object: spy });
    let r = step(&mut sim, vec![t]);
    assert!(r.script_errors.is_empty(), "{:?}", r.script_errors);
    let text = &sim.world().object(spy).unwrap().text;
    assert!(text.starts_with("prim at 130"), "{text}");
    assert!(text.ends_with("3 neighbours"), "{text}");
    assert_eq!(sim.world().object(other).unwrap().text, "0");
    // Anyone can read any script's source.
    assert!(sim.world().script_source(other).unwrap().source.contains("fn on_touch"));
}

/// Each worker thread reuses one map for `this` (no allocation for scripts without state): a
/// script that writes `this`, or replaces it with something else, leaves nothing behind for
/// the scripts that run after it on the same thread.
#[test]
fn one_scripts_state_never_reaches_another_through_the_workers_map() {
    let (mut sim, mut ps) = world_with_players(1);
    sim.set_workers(1);
    let writer = "fn on_tick() { this.secret = 42; this.more = [1, 2]; }";
    let replacer = "fn on_tick() { this = 5; }";
    let reader = r#"fn on_tick() { set_text(if this.len() == 0 { "clean" } else { `leak ${this}` }); }"#;
    let mut readers = Vec::new();
    // Interleaved, so that on one thread each reader runs right after a writer or a replacer.
    for i in 0..4 {
        let first = if i % 2 == 0 { writer } else { replacer };
        scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(-6, i), first);
        readers.push(scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(6, i), reader).0);
    }
    let r = step(&mut sim, vec![]);
    for id in &readers {
        assert_eq!(sim.world().object(*id).unwrap().text, "clean");
    }
    // The replacers fail (state must stay a map; the first is suspended by now, having failed
    // on every tick since it was deployed) and the writers keep what they wrote.
    assert!(!r.script_errors.is_empty());
    assert!(r.script_errors.iter().all(|e| e.error.message.contains("must stay a map")), "{:?}", r.script_errors);
    let writers_state: Vec<_> = sim.world().scripts().iter().filter(|(_, s)| !s.state.is_empty()).collect();
    assert_eq!(writers_state.len(), 2, "the two writers keep their state");
}

/// Listen growth (issue #52): a script that listens on 100 new channels every tick keeps at
/// most `MAX_LISTEN_CHANNELS`; the rest are ignored and its owner is told, and the world stays
/// valid (a snapshot of it loads).
#[test]
fn a_script_listens_on_at_most_the_channel_limit() {
    use metatopia_sim::state::MAX_LISTEN_CHANNELS;
    let (mut sim, mut players) = world_with_players(1);
    let source = "fn on_tick() { let base = tick() * 100; for c in 0..100 { listen(base + c); } }";
    let (id, _) = scripted_prim(&mut sim, &mut players[0], Vec2::ZERO, source);
    let reports = idle(&mut sim, 4);
    let listening = sim.world().scripts()[&id].listen.len();
    assert_eq!(listening, MAX_LISTEN_CHANNELS);
    let told = reports.iter().flat_map(|r| &r.chat).any(|l| {
        l.to == Some(metatopia_sim::event::account_of(&players[0].key))
            && l.text.contains("listens on at most 64 channels")
    });
    assert!(told, "the owner was told");
    assert!(sim.world().scripts()[&id].failures == 0 && !sim.world().scripts()[&id].suspended, "not a failure");
    let snap = sim.snapshot();
    let bytes = snap.encode();
    assert!(metatopia_sim::Snapshot::decode(&bytes, 1 << 30).is_ok());
}

/// A crowd around a `nearby()` script (issue #52): with 64 objects in range it gets its
/// documented maximum of 64, not an error that suspends it.
#[test]
fn nearby_returns_its_documented_maximum_in_a_crowd() {
    use metatopia_sim::{Fx, state::Shape};
    let (mut sim, mut players) = world_with_players(1);
    let centre = sim.world().region().centre();
    let rez: Vec<_> = (0..70)
        .map(|i| {
            let at = centre + Vec2::new(Fx::from_int(i % 10 - 5), Fx::from_int(i / 10 - 4));
            let name = format!("a prim with a longish name, number {i}");
            let text = "floating text ".repeat(16);
            players[0].sign(
                &sim,
                Payload::Rez {
                    name,
                    shape: Shape::Circle { radius: Fx::HALF },
                    position: at,
                    color: 1,
                    text,
                    body: metatopia_sim::state::BodyKind::Static,
                },
            )
        })
        .collect();
    let r = step(&mut sim, rez);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    let source = "fn on_tick() { set_text(`${nearby(40).len()}`); }";
    let (id, _) = scripted_prim(&mut sim, &mut players[0], Vec2::ZERO, source);
    let reports = idle(&mut sim, 2);
    assert!(reports.iter().all(|r| r.script_errors.is_empty()), "{:?}", reports.last().map(|r| &r.script_errors));
    assert_eq!(sim.world().object(id).unwrap().text, "64");
}

/// All or nothing (issue #52): a handler that fails after acting leaves no effect — no chat
/// line, no colour, no state — only its error for the owner.
#[test]
fn a_failing_handler_leaves_no_half_effect() {
    let (mut sim, mut players) = world_with_players(1);
    let source = r#"fn on_init() { this.n = 1; }
fn on_tick() { this.n += 1; set_color(255); say(0, "half done"); throw "then it fails"; }"#;
    let (id, _) = scripted_prim(&mut sim, &mut players[0], Vec2::ZERO, source);
    let state_before = sim.world().scripts()[&id].state.clone();
    let reports = idle(&mut sim, 3);
    assert!(reports.iter().all(|r| !r.script_errors.is_empty()), "it fails every tick");
    assert!(
        reports.iter().flat_map(|r| &r.chat).all(|l| !l.text.contains("half done")),
        "no chat from a failed handler"
    );
    assert_ne!(sim.world().object(id).unwrap().color, 255, "no colour from a failed handler");
    assert_eq!(sim.world().scripts()[&id].state, state_before, "the state is as before the failed tick");
}

/// One object's handlers share one operation budget per tick: touched twenty times in one tick
/// by a handler of ~15,000 operations, it runs about ten of them, its owner is told how many
/// were not run, nothing counts as a failure, and a script beside it carries on.
#[test]
fn a_busy_object_spends_its_tick_budget_and_the_rest_of_its_inputs_wait_for_nothing() {
    let (mut sim, mut ps) = world_with_players(20);
    let heavy_src = "fn on_touch(who) { let n = 0; for i in 0..3000 { n += i; } this.runs = (this.runs ?? 0) + 1; set_text(`${this.runs}`); }";
    let (heavy, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(4, 0), heavy_src);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    let (counter, _) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(-4, 0), &script("counter"));
    let mut touches: Vec<_> = (0..20).map(|i| ps[i].sign(&sim, Payload::Touch { object: heavy })).collect();
    touches.push(ps[1].sign(&sim, Payload::Touch { object: counter }));
    let r = step(&mut sim, touches);
    let runs: u32 = sim.world().object(heavy).unwrap().text.parse().unwrap();
    assert!((5..20).contains(&runs), "{runs} of 20 touches ran within the budget");
    let told = r
        .chat
        .iter()
        .find(|l| l.to == Some(ps[0].id()) && l.speaker == metatopia_sim::pipeline::Speaker::Object(heavy))
        .expect("the owner is told");
    assert!(told.text.starts_with(&format!("{} of this tick's inputs were not run", 20 - runs)), "{}", told.text);
    assert!(r.script_errors.is_empty(), "not a failure: {:?}", r.script_errors);
    assert_eq!(sim.world().script(heavy).unwrap().failures, 0);
    assert_eq!(sim.world().object(counter).unwrap().text, "1", "the script beside it ran");
    // The next tick, a touch runs again.
    let t = ps[3].sign(&sim, Payload::Touch { object: heavy });
    step(&mut sim, vec![t]);
    assert_eq!(sim.world().object(heavy).unwrap().text, (runs + 1).to_string());
}

/// One account's objects share one budget per tick: eight heavy objects of one owner, each
/// touched twenty times in a tick, run no more operations together than the account's budget
/// (each gets an eighth); a handler cut short by it is undone (its chat line is not said), and
/// another account's object beside them runs as usual.
#[test]
fn an_accounts_objects_share_its_budget_and_a_cut_handler_leaves_no_trace() {
    let (mut sim, mut ps) = world_with_players(20);
    let limits = sim.world().settings().limits.clone();
    let heavy_src = r#"fn on_touch(who) { say(0, "start"); let n = 0; for i in 0..3000 { n += i; } this.runs = (this.runs ?? 0) + 1; set_text(`${this.runs}`); }"#;
    let mut heavy = Vec::new();
    for i in 0..8 {
        let (id, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(4 + i, 0), heavy_src);
        assert!(r.rejected.is_empty(), "{:?}", r.rejected);
        heavy.push(id);
    }
    let (counter, _) = scripted_prim(&mut sim, &mut ps[1], Vec2::from_ints(-4, 0), &script("counter"));
    let mut touches = Vec::new();
    for p in ps.iter_mut() {
        for id in &heavy {
            touches.push(p.sign(&sim, Payload::Touch { object: *id }));
        }
    }
    touches.push(ps[2].sign(&sim, Payload::Touch { object: counter }));
    let r = step(&mut sim, touches);
    assert!(r.script_errors.is_empty(), "not a failure: {:?}", r.script_errors);
    assert!(
        r.script_operations <= limits.operations_per_account_tick + 1_000,
        "{} operations in the tick; the account may use {} (the counter a few)",
        r.script_operations,
        limits.operations_per_account_tick
    );
    let mut total = 0;
    for id in &heavy {
        let runs: u32 = sim.world().object(*id).map_or(0, |o| o.text.parse().unwrap_or(0));
        assert!((1..20).contains(&runs), "each heavy object ran some of its touches: {runs}");
        let said = r
            .chat
            .iter()
            .filter(|l| l.speaker == metatopia_sim::pipeline::Speaker::Object(*id) && l.text == "start")
            .count();
        assert_eq!(said as u32, runs, "a handler cut short says nothing");
        total += runs;
    }
    // Each handler is ~10,000 operations: an eighth of the account's budget runs four, where
    // each object's own budget alone would run sixteen (128 in all).
    assert!(total <= 8 * 4, "{total} touches ran across the account's objects");
    assert_eq!(sim.world().object(counter).unwrap().text, "1", "another account's script ran");
}

/// Chat amplification is bounded by its cause: twenty prims that listen on channel 0 and say 64
/// lines a tick would make 24,320 copies a tick for their listeners; each listener hears at most
/// 64 lines a tick and each speaker's lines make at most 1,024 copies, so the queue holds at
/// most 20 × 64.
#[test]
fn chatty_prims_make_a_bounded_number_of_copies() {
    use metatopia_sim::pipeline::{MAX_COPIES_PER_SPEAKER, MAX_HEARD_PER_TICK};
    use metatopia_sim::state::Queued;
    let (mut sim, mut ps) = world_with_players(1);
    let chatter = r#"fn on_init() { listen(0); } fn on_tick() { let s = "x"; s.pad(200, "x"); for i in 0..64 { say(0, `line ${i} ${s}`); } } fn on_chat(ch, who, text) { }"#;
    let mut chatters = Vec::new();
    for i in 0..20 {
        let (id, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(i % 5, i / 5), chatter);
        assert!(r.rejected.is_empty(), "{:?}", r.rejected);
        chatters.push(id);
    }
    idle(&mut sim, 2);
    let heard = |sim: &crate::common::RhaiSim, id: ObjectId| {
        sim.world().queue().iter().filter(|q| matches!(q, Queued::Heard { listener, .. } if *listener == id)).count()
    };
    let total: usize = chatters.iter().map(|c| heard(&sim, *c)).sum();
    assert!(total > 0 && total <= 20 * MAX_HEARD_PER_TICK as usize, "{total} lines queued for the chatters");
    assert!(chatters.iter().all(|c| heard(&sim, *c) <= MAX_HEARD_PER_TICK as usize));
    assert!(total <= 20 * MAX_COPIES_PER_SPEAKER as usize);
    assert!(sim.world().queue().len() <= 20 * MAX_HEARD_PER_TICK as usize + 64, "{}", sim.world().queue().len());
}

/// `on_touch(who)` gives the toucher's account id; `get_object(who)` is its avatar, and a bad id
/// fails the handler with an error its owner reads.
#[test]
fn a_touch_names_the_account_and_get_object_finds_its_avatar() {
    let (mut sim, mut ps) = world_with_players(2);
    let src = r#"fn on_touch(who) { let a = get_object(who); set_text(`${a.name} at ${a.avatar}`); if who.len() != 64 { throw "not an account"; } }
fn on_message(from, data) { get_object("nonsense"); }"#;
    let (id, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(2, 0), src);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    let t = ps[1].sign(&sim, Payload::Touch { object: id });
    let r = step(&mut sim, vec![t]);
    assert!(r.script_errors.is_empty(), "{:?}", r.script_errors);
    assert_eq!(sim.world().object(id).unwrap().text, "player1 at true");
    // A bad id: the owner is told, with the function and what it wanted.
    let (sender, _) = scripted_prim(
        &mut sim,
        &mut ps[0],
        Vec2::from_ints(-2, 0),
        &format!("fn on_tick() {{ send(\"{id}\", \"x\"); }}"),
    );
    let mut errors = Vec::new();
    for _ in 0..3 {
        errors.extend(step(&mut sim, vec![]).script_errors);
    }
    assert!(sim.world().object(sender).is_some());
    let e = errors.iter().find(|e| e.object == id).expect("the error reached the owner");
    assert_eq!(e.owner, ps[0].id());
    assert!(e.error.message.contains("not an object id (12v0) or an account id"), "{}", e.error.message);
}
