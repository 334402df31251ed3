//! The tick pipeline end to end, with the built-in rules host and kinematic physics:
//! ownership, scripts, chat ranges, listeners, timers, rejections and their reasons.
use crate::common;

use crate::common::{Signer, TestSim, idle, step};
use metatopia_sim::event::account_of;
use metatopia_sim::genesis::{DemoSpec, demo_key, demo_world};
use metatopia_sim::pipeline::{DEBUG_CHANNEL, Speaker};
use metatopia_sim::state::{BodyKind, RejectReason, Shape};
use metatopia_sim::{ChatRange, Fx, ObjectEdit, ObjectId, Payload, SignedEvent, SimId, Vec2};

/// An empty region with two players logged in; returns the sim and their signers.
fn two_players() -> (TestSim, Signer, Signer) {
    two_players_with(|_| {})
}

/// The same, with limits of the test's choosing.
fn two_players_with(limits: impl FnOnce(&mut metatopia_sim::state::Limits)) -> (TestSim, Signer, Signer) {
    let mut demo = demo_world(DemoSpec { seed: 7, objects: 0, players: 0, ..DemoSpec::default() });
    let mut settings = demo.world.settings().clone();
    limits(&mut settings.limits);
    settings.check().expect("the test's limits are within bounds");
    demo.world.set_genesis_settings(settings);
    let mut sim = common::sim_of(&demo, 2);
    let mut ann = Signer::new(demo_key(99, 1), &sim);
    let mut bob = Signer::new(demo_key(99, 2), &sim);
    let a = ann.sign(&sim, Payload::Login { name: "ann".into() });
    let b = bob.sign(&sim, Payload::Login { name: "bob".into() });
    let r = step(&mut sim, vec![a, b]);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    (sim, ann, bob)
}

fn avatar(sim: &TestSim, s: &Signer) -> ObjectId {
    sim.world().account(&s.id()).and_then(|a| a.avatar).expect("logged in")
}

fn rez(sim: &mut TestSim, s: &mut Signer, at: Vec2) -> ObjectId {
    let before: Vec<ObjectId> = sim.world().objects().keys().copied().collect();
    let e = rez_at(sim, s, at);
    let r = step(sim, vec![e]);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    *sim.world().objects().keys().find(|id| !before.contains(id)).expect("a new object")
}

fn rez_centre(sim: &mut TestSim, s: &mut Signer) -> ObjectId {
    let c = sim.world().region().centre();
    rez(sim, s, c)
}

fn deploy(sim: &mut TestSim, s: &mut Signer, object: ObjectId, source: &str) -> metatopia_sim::TickReport {
    let e = s.sign(
        sim,
        Payload::DeployScript {
            object,
            source: source.into(),
            licence: "AGPL-3.0-or-later".into(),
            derived_from: None,
        },
    );
    step(sim, vec![e])
}

#[test]
fn login_creates_account_and_avatar_and_move_is_owner_only() {
    let (mut sim, mut ann, mut bob) = two_players();
    let a = avatar(&sim, &ann);
    assert_eq!(sim.world().object(a).unwrap().owner, ann.id());
    let v = Vec2::from_ints(3, 0);
    let mine = ann.sign(&sim, Payload::Move { object: a, velocity: v });
    let theirs = bob.sign(&sim, Payload::Move { object: a, velocity: Vec2::from_ints(0, 5) });
    let r = step(&mut sim, vec![mine, theirs]);
    assert_eq!(r.rejected.len(), 1);
    assert_eq!(r.rejected[0].reason, RejectReason::NotOwner { object: a });
    let start = sim.world().object(a).unwrap().position;
    idle(&mut sim, 30);
    // 30 ticks at 30 Hz, 3 m/s: 3 m east (fixed-point dt = 1/30 truncated, so within 1 mm).
    let moved = sim.world().object(a).unwrap().position - start;
    assert!((moved.x - Fx::from_int(3)).abs() < Fx::from_ratio(1, 1000), "{moved:?}");
    assert_eq!(moved.y, Fx::ZERO);
}

#[test]
fn forged_replayed_and_wrong_sim_events_never_take_effect() {
    let (mut sim, mut ann, _bob) = two_players();
    let a = avatar(&sim, &ann);
    let good = ann.sign(&sim, Payload::Move { object: a, velocity: Vec2::from_ints(1, 0) });
    step(&mut sim, vec![good.clone()]);
    let root_before = {
        idle(&mut sim, 1);
        sim.world().object(a).unwrap().velocity
    };
    let mut forged = ann.sign(&sim, Payload::Move { object: a, velocity: Vec2::from_ints(9, 9) });
    forged.signature.0[5] ^= 1;
    let wrong_sim = SignedEvent::new(
        &ann.key,
        SimId(999),
        ann.nonce + 10,
        Payload::Move { object: a, velocity: Vec2::from_ints(9, 9) },
    );
    let r = step(&mut sim, vec![good.clone(), forged, wrong_sim]);
    let reasons: Vec<_> = r.rejected.iter().map(|x| x.reason.clone()).collect();
    assert!(reasons.contains(&RejectReason::BadSignature), "{reasons:?}");
    assert!(reasons.contains(&RejectReason::WrongSim { expected: sim.world().sim(), got: SimId(999) }));
    assert!(reasons.iter().any(|x| matches!(x, RejectReason::StaleNonce { .. })), "replay refused");
    assert_eq!(r.accepted, 0);
    assert_eq!(sim.world().object(a).unwrap().velocity, root_before, "nothing took effect");
    // The rejections are recorded in state, so every node records them identically.
    assert_eq!(sim.world().receipts(), &r.rejected[..]);
}

#[test]
fn unknown_accounts_must_log_in_first() {
    let (mut sim, _ann, _bob) = two_players();
    let mut eve = Signer::new(demo_key(99, 3), &sim);
    let e = eve.sign(&sim, Payload::Chat { channel: 0, range: ChatRange::Say, text: "hi".into() });
    let r = step(&mut sim, vec![e]);
    assert_eq!(r.rejected[0].reason, RejectReason::UnknownAccount);
}

#[test]
fn oversized_fields_are_refused_with_the_limit() {
    let (mut sim, mut ann, _bob) = two_players();
    let text = "x".repeat(5_000);
    let e = ann.sign(&sim, Payload::Chat { channel: 0, range: ChatRange::Say, text });
    let r = step(&mut sim, vec![e]);
    assert_eq!(r.rejected[0].reason, RejectReason::FieldTooLong { field: "text".into(), len: 5_000, max: 1_024 });
    let big = "y".repeat(200_000);
    let e = ann.sign(&sim, Payload::Chat { channel: 0, range: ChatRange::Say, text: big });
    let r = step(&mut sim, vec![e]);
    assert!(matches!(r.rejected[0].reason, RejectReason::TooLarge { max: 98_304, .. }), "{:?}", r.rejected);
}

#[test]
fn chat_carries_by_range_to_listening_scripts() {
    let (mut sim, mut ann, _bob) = two_players();
    let centre = sim.world().region().centre();
    let near = rez(&mut sim, &mut ann, centre + Vec2::from_ints(15, 0));
    let far = rez(&mut sim, &mut ann, centre + Vec2::from_ints(50, 0));
    for o in [near, far] {
        let r = deploy(&mut sim, &mut ann, o, "listen 5\non chat: echo");
        assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    }
    // A say (20 m) reaches `near` (15 m) but not `far` (50 m); a shout reaches both; a
    // whisper (10 m) neither.
    assert_eq!(echoes(&mut sim, &mut ann, ChatRange::Say, "ping"), vec![Speaker::Object(near)]);
    assert_eq!(echoes(&mut sim, &mut ann, ChatRange::Shout, "hey"), vec![Speaker::Object(near), Speaker::Object(far)]);
    assert_eq!(echoes(&mut sim, &mut ann, ChatRange::Whisper, "psst"), vec![]);
}

/// Say `text` on channel 5 at `range`; who echoed it on the next tick.
fn echoes(sim: &mut TestSim, s: &mut Signer, range: ChatRange, text: &str) -> Vec<Speaker> {
    let e = s.sign(sim, Payload::Chat { channel: 5, range, text: text.into() });
    step(sim, vec![e]);
    let r = step(sim, vec![]);
    let want = format!("echo: {text}");
    r.chat.iter().filter(|l| l.text == want).map(|l| l.speaker).collect()
}

#[test]
fn touching_a_door_script_changes_it_and_its_state_persists() {
    let (mut sim, mut ann, mut bob) = two_players();
    let door = rez_centre(&mut sim, &mut ann);
    deploy(&mut sim, &mut ann, door, "on touch: color ff0000ff; say 0 opened; count");
    // Anyone may touch.
    let t1 = bob.sign(&sim, Payload::Touch { object: door });
    let r = step(&mut sim, vec![t1]);
    let o = sim.world().object(door).unwrap();
    assert_eq!(o.color, 0xff00_00ff);
    assert_eq!(o.text, "1");
    assert!(r.chat.iter().any(|l| l.text == "opened" && l.speaker == Speaker::Object(door)));
    let t2 = ann.sign(&sim, Payload::Touch { object: door });
    let t3 = bob.sign(&sim, Payload::Touch { object: door });
    step(&mut sim, vec![t2, t3]);
    assert_eq!(sim.world().object(door).unwrap().text, "3");
    // Source, licence and author are readable by anyone.
    let src = sim.world().script_source(door).unwrap();
    assert!(src.source.contains("on touch"));
    assert_eq!(src.licence, "AGPL-3.0-or-later");
    assert_eq!(src.author, ann.id());
}

#[test]
fn deploying_is_owner_only_and_needs_a_copyleft_licence_and_valid_source() {
    let (mut sim, mut ann, mut bob) = two_players();
    let o = rez_centre(&mut sim, &mut ann);
    let e = bob.sign(
        &sim,
        Payload::DeployScript {
            object: o,
            source: "on touch: count".into(),
            licence: "MIT".into(),
            derived_from: None,
        },
    );
    let r = step(&mut sim, vec![e]);
    assert_eq!(r.rejected[0].reason, RejectReason::NotOwner { object: o });
    let e = ann.sign(
        &sim,
        Payload::DeployScript {
            object: o,
            source: "on touch: count".into(),
            licence: "MIT".into(),
            derived_from: None,
        },
    );
    let r = step(&mut sim, vec![e]);
    assert_eq!(r.rejected[0].reason, RejectReason::LicenceNotCopyleft { licence: "MIT".into() });
    let r = deploy(&mut sim, &mut ann, o, "on touch: launch rockets");
    assert!(matches!(&r.rejected[0].reason, RejectReason::CompileError { message } if message.contains("line 1")));
    assert!(sim.world().script(o).is_none());
}

#[test]
fn script_errors_go_to_the_owner_and_suspend_after_the_limit() {
    let (mut sim, mut ann, _bob) = two_players();
    let o = rez_centre(&mut sim, &mut ann);
    let other = rez_centre(&mut sim, &mut ann);
    deploy(&mut sim, &mut ann, o, "on tick: fail");
    deploy(&mut sim, &mut ann, other, "on tick: count");
    let limit = sim.world().settings().limits.script_failure_limit;
    let mut suspended_at = None;
    for i in 0..limit + 3 {
        let r = step(&mut sim, vec![]);
        if let Some(e) = r.script_errors.first() {
            assert_eq!(e.owner, ann.id());
            assert!(r.chat.iter().any(|l| l.channel == DEBUG_CHANNEL && l.to == Some(ann.id())));
            if e.suspended && suspended_at.is_none() {
                suspended_at = Some(i);
            }
        }
    }
    assert!(sim.world().script(o).unwrap().suspended);
    assert!(suspended_at.is_some());
    // The healthy script kept running every tick.
    let count: u64 = sim.world().object(other).unwrap().text.parse().unwrap();
    assert!(count >= u64::from(limit) + 3, "{count}");
    // Redeploying clears the suspension.
    deploy(&mut sim, &mut ann, o, "on touch: count");
    assert!(!sim.world().script(o).unwrap().suspended);
}

#[test]
fn a_script_failing_every_other_tick_is_suspended_too_and_a_rare_failure_is_forgiven() {
    let (mut sim, mut ann, mut bob) = two_players();
    let flaky = rez_centre(&mut sim, &mut ann);
    let rare = rez_centre(&mut sim, &mut ann);
    deploy(&mut sim, &mut ann, flaky, "on tick: count\non touch: fail");
    deploy(&mut sim, &mut ann, rare, "on tick: count\non touch: fail");
    let limit = u64::from(sim.world().settings().limits.script_failure_limit);
    // `flaky` fails every other tick, `rare` one tick in eight: a clean tick between two failing
    // ones never wipes the slate.
    let mut suspended_at = None;
    for i in 0..8 * limit {
        let mut touches = Vec::new();
        if i % 2 == 0 {
            touches.push(bob.sign(&sim, Payload::Touch { object: flaky }));
        }
        if i % 8 == 0 {
            touches.push(ann.sign(&sim, Payload::Touch { object: rare }));
        }
        step(&mut sim, touches);
        if suspended_at.is_none() && sim.world().script(flaky).unwrap().suspended {
            suspended_at = Some(i);
        }
    }
    let at = suspended_at.expect("the flaky script is suspended");
    assert!(at > 2 * limit && at < 8 * limit, "suspended at tick {at} (limit {limit})");
    assert!(!sim.world().script(rare).unwrap().suspended, "a failure in eight ticks is forgiven");
}

#[test]
fn messages_and_timers_arrive_on_the_next_ticks() {
    let (mut sim, mut ann, _bob) = two_players();
    let c = sim.world().region().centre();
    let relay = rez(&mut sim, &mut ann, c);
    let sender = rez(&mut sim, &mut ann, c);
    deploy(&mut sim, &mut ann, relay, "on message: reply pong");
    deploy(&mut sim, &mut ann, sender, &format!("timer 3\non timer: send {relay} ping\non message: count"));
    idle(&mut sim, 10);
    // Fired at least twice (every 3 ticks), each ping answered by a pong that increments.
    let n: u64 = sim.world().object(sender).unwrap().text.parse().unwrap();
    assert!((2..=4).contains(&n), "{n}");
}

#[test]
fn derez_and_logout_remove_objects_and_free_slots_for_new_generations() {
    let (mut sim, mut ann, mut bob) = two_players();
    let o = rez_centre(&mut sim, &mut ann);
    let steal = bob.sign(&sim, Payload::Derez { object: o });
    let r = step(&mut sim, vec![steal]);
    assert_eq!(r.rejected[0].reason, RejectReason::NotOwner { object: o });
    let e = ann.sign(&sim, Payload::Derez { object: o });
    step(&mut sim, vec![e]);
    assert!(sim.world().object(o).is_none());
    let again = rez_centre(&mut sim, &mut ann);
    assert_eq!(again.slot(), o.slot());
    assert_eq!(again.generation(), o.generation() + 1, "a reused slot never aliases the old id");
    let touch_old = bob.sign(&sim, Payload::Touch { object: o });
    let r = step(&mut sim, vec![touch_old]);
    assert_eq!(r.rejected[0].reason, RejectReason::NoSuchObject { object: o });
    let out = ann.sign(&sim, Payload::Logout);
    step(&mut sim, vec![out]);
    assert!(sim.world().account(&ann.id()).unwrap().avatar.is_none());
    assert_eq!(account_of(&ann.key), ann.id());
}

#[test]
fn shared_sources_live_while_any_object_runs_them() {
    let (mut sim, mut ann, _bob) = two_players();
    let a = rez_centre(&mut sim, &mut ann);
    let b = rez_centre(&mut sim, &mut ann);
    deploy(&mut sim, &mut ann, a, "on touch: count");
    deploy(&mut sim, &mut ann, b, "on touch: count");
    let id = sim.world().script(a).unwrap().script;
    assert_eq!(sim.world().script(b).unwrap().script, id, "content-addressed: one source");
    assert_eq!(sim.world().sources().len(), 1);
    let e = ann.sign(&sim, Payload::Derez { object: a });
    step(&mut sim, vec![e]);
    assert!(sim.world().sources().contains_key(&id), "b still runs it");
    deploy(&mut sim, &mut ann, b, "on touch: color ff0000ff");
    assert!(!sim.world().sources().contains_key(&id), "nobody runs it any more");
    assert_eq!(sim.world().sources().len(), 1);
}

#[test]
fn touching_a_suspended_script_leaves_it_untouched() {
    let (mut sim, mut ann, mut bob) = two_players();
    let o = rez_centre(&mut sim, &mut ann);
    deploy(&mut sim, &mut ann, o, "on tick: fail");
    let limit = sim.world().settings().limits.script_failure_limit;
    idle(&mut sim, u64::from(limit) + 1);
    let before = sim.world().script(o).unwrap().clone();
    assert!(before.suspended);
    let root = sim.roots().scripts;
    let t = bob.sign(&sim, Payload::Touch { object: o });
    let r = step(&mut sim, vec![t]);
    assert!(r.script_errors.is_empty());
    assert_eq!(sim.world().script(o).unwrap(), &before, "the failure streak is kept while suspended");
    assert_eq!(sim.roots().scripts, root, "no script state changed");
}

fn rez_event(sim: &TestSim, s: &mut Signer, x: i64) -> SignedEvent {
    let at = sim.world().region().centre() + Vec2::from_ints(x, 0);
    rez_at(sim, s, at)
}

/// A signed rez of a dynamic 1 m circle named "box".
fn rez_at(sim: &TestSim, s: &mut Signer, at: Vec2) -> SignedEvent {
    rez_body_at(sim, s, at, BodyKind::Dynamic)
}

fn rez_body_at(sim: &TestSim, s: &mut Signer, at: Vec2, body: BodyKind) -> SignedEvent {
    s.sign(
        sim,
        Payload::Rez {
            name: "box".into(),
            shape: Shape::Circle { radius: Fx::ONE },
            position: at,
            color: 0xff,
            text: String::new(),
            body,
        },
    )
}

/// An account has at most `max_objects_per_account` prims (its avatar not counted): a rez past
/// it is refused with the quota named, in the same tick as the others or later; derezzing one
/// makes room; another account is not affected.
#[test]
fn an_account_rezzes_up_to_its_object_quota() {
    let (mut sim, mut ann, mut bob) = two_players_with(|l| l.max_objects_per_account = 3);
    let events: Vec<_> = (0..4).map(|i| rez_event(&sim, &mut ann, i)).collect();
    let r = step(&mut sim, events);
    assert_eq!(r.rejected.len(), 1, "{:?}", r.rejected);
    assert_eq!(r.rejected[0].reason, RejectReason::AccountQuota { what: "objects".into(), used: 3, max: 3 });
    assert!(r.rejected[0].reason.to_string().contains("quota of 3 objects"), "{}", r.rejected[0].reason);
    let mine: Vec<ObjectId> =
        sim.world().objects().values().filter(|o| o.owner == ann.id() && o.name == "box").map(|o| o.id).collect();
    assert_eq!(mine.len(), 3);
    let again = rez_event(&sim, &mut ann, 5);
    let theirs = rez_event(&sim, &mut bob, 6);
    let r = step(&mut sim, vec![again, theirs]);
    assert_eq!(r.rejected.len(), 1, "ann's fourth is refused, bob's first is not: {:?}", r.rejected);
    assert_eq!(r.rejected[0].author, ann.id());
    // Derez one and rez again, in one tick.
    let derez = ann.sign(&sim, Payload::Derez { object: mine[0] });
    let rez = rez_event(&sim, &mut ann, 7);
    let r = step(&mut sim, vec![derez, rez]);
    let derez_first = r.rejected.is_empty();
    // The tick's order decides whether the derez came first; either way the count holds.
    let now = sim.world().objects().values().filter(|o| o.owner == ann.id() && o.name == "box").count();
    assert_eq!(now, if derez_first { 3 } else { 2 }, "{:?}", r.rejected);
    let rez = rez_event(&sim, &mut ann, 8);
    let r = step(&mut sim, vec![rez]);
    assert_eq!(r.rejected.is_empty(), !derez_first, "{:?}", r.rejected);
    let now = sim.world().objects().values().filter(|o| o.owner == ann.id() && o.name == "box").count();
    assert_eq!(now, 3);
}

/// An account's objects hold at most `max_script_bytes_per_account` bytes of script: a
/// deployment past it is refused before it runs; redeploying on the same object replaces its
/// bytes; two deployments in one tick count together.
#[test]
fn an_accounts_script_bytes_are_bounded() {
    let (mut sim, mut ann, mut bob) = two_players_with(|l| {
        l.max_source_bytes = 1_000;
        l.max_script_bytes_per_account = 1_000;
    });
    let sized = |n: usize| {
        let mut s = String::from("on touch: say 0 hi\n#");
        while s.len() < n {
            s.push('x');
        }
        s
    };
    let (a, b, c) = (rez_centre(&mut sim, &mut ann), rez_centre(&mut sim, &mut ann), rez_centre(&mut sim, &mut bob));
    let r = deploy(&mut sim, &mut ann, a, &sized(600));
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    let r = deploy(&mut sim, &mut ann, b, &sized(600));
    assert_eq!(
        r.rejected.iter().map(|x| x.reason.clone()).collect::<Vec<_>>(),
        vec![RejectReason::AccountQuota { what: "bytes of script".into(), used: 600, max: 1_000 }]
    );
    assert!(sim.world().script(b).is_none());
    // Replacing a's script frees its bytes.
    let r = deploy(&mut sim, &mut ann, a, &sized(900));
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    // Another account has its own quota.
    let r = deploy(&mut sim, &mut bob, c, &sized(900));
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    // Two in one tick: 300 + 300 over a's 900 (now 200 + 300 after replacing a) ...
    let on_a = ann.sign(
        &sim,
        Payload::DeployScript {
            object: a,
            source: sized(200),
            licence: "AGPL-3.0-or-later".into(),
            derived_from: None,
        },
    );
    let on_b = ann.sign(
        &sim,
        Payload::DeployScript {
            object: b,
            source: sized(900),
            licence: "AGPL-3.0-or-later".into(),
            derived_from: None,
        },
    );
    let r = step(&mut sim, vec![on_a, on_b]);
    // ... whichever comes first in the batch, the two together (1,100 bytes) do not both fit.
    assert_eq!(r.rejected.len(), 1, "{:?}", r.rejected);
    let used: usize = [a, b].iter().filter_map(|o| sim.world().script_source(*o)).map(|s| s.source.len()).sum();
    assert!(used <= 1_000, "{used} bytes of script");
}

fn rez_kind(sim: &mut TestSim, s: &mut Signer, at: Vec2, body: BodyKind) -> ObjectId {
    let before: Vec<ObjectId> = sim.world().objects().keys().copied().collect();
    let e = rez_body_at(sim, s, at, body);
    let r = step(sim, vec![e]);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    *sim.world().objects().keys().find(|id| !before.contains(id)).expect("a new object")
}

/// A static object stays where it is put: its owner cannot walk it, its script's motion does
/// nothing; a kinematic one moves as told.
#[test]
fn a_static_object_stays_put_and_a_kinematic_one_moves_as_told() {
    let (mut sim, mut ann, _) = two_players();
    let c = sim.world().region().centre();
    let anchored = rez_kind(&mut sim, &mut ann, c + Vec2::from_ints(-5, 0), BodyKind::Static);
    let moved = rez_kind(&mut sim, &mut ann, c + Vec2::from_ints(5, 0), BodyKind::Kinematic);
    let walk = ann.sign(&sim, Payload::Move { object: anchored, velocity: Vec2::from_ints(1, 0) });
    let r = step(&mut sim, vec![walk]);
    assert!(
        matches!(&r.rejected[..], [x] if x.reason.to_string().contains("static: edit its position")),
        "{:?}",
        r.rejected
    );
    for (id, src) in [(anchored, "on tick: velocity 2 0"), (moved, "on tick: velocity 2 0")] {
        let r = deploy(&mut sim, &mut ann, id, src);
        assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    }
    let (a0, m0) = (sim.world().object(anchored).unwrap().position, sim.world().object(moved).unwrap().position);
    idle(&mut sim, 30);
    assert_eq!(sim.world().object(anchored).unwrap().position, a0, "the static object did not move");
    assert!(sim.world().object(moved).unwrap().position.x > m0.x, "the kinematic object moved");
}

/// An owner's edit changes what it names and nothing else; a new place puts the object there
/// at rest; a stranger's edit, a place outside the sim and placing an avatar are refused.
#[test]
fn an_owner_edits_an_object_and_others_cannot() {
    let (mut sim, mut ann, mut bob) = two_players();
    let c = sim.world().region().centre();
    let id = rez_kind(&mut sim, &mut ann, c, BodyKind::Dynamic);
    let walk = ann.sign(&sim, Payload::Move { object: id, velocity: Vec2::from_ints(2, 0) });
    let r = step(&mut sim, vec![walk]);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    idle(&mut sim, 3);
    let to = c + Vec2::from_ints(-10, 4);
    let edit = ObjectEdit {
        name: Some("lamp".into()),
        text: Some("hello".into()),
        color: Some(0x11223344),
        position: Some(to),
        body: Some(BodyKind::Static),
        ..ObjectEdit::default()
    };
    let e = ann.sign(&sim, Payload::Edit { object: id, edit });
    let r = step(&mut sim, vec![e]);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    let o = sim.world().object(id).unwrap().clone();
    assert_eq!((o.name.as_str(), o.text.as_str(), o.color, o.body), ("lamp", "hello", 0x11223344, BodyKind::Static));
    assert_eq!((o.position, o.velocity), (to, Vec2::ZERO), "placed there, at rest");
    assert_eq!(o.shape, Shape::Circle { radius: Fx::ONE }, "what the edit did not name is unchanged");
    idle(&mut sim, 10);
    assert_eq!(sim.world().object(id).unwrap().position, to, "and it stays");

    let theirs = bob.sign(
        &sim,
        Payload::Edit { object: id, edit: ObjectEdit { text: Some("mine".into()), ..ObjectEdit::default() } },
    );
    let outside = ann.sign(
        &sim,
        Payload::Edit {
            object: id,
            edit: ObjectEdit { position: Some(c + Vec2::from_ints(10_000, 0)), ..ObjectEdit::default() },
        },
    );
    let me = avatar(&sim, &ann);
    let avatar_body = ann.sign(
        &sim,
        Payload::Edit { object: me, edit: ObjectEdit { body: Some(BodyKind::Static), ..ObjectEdit::default() } },
    );
    let long = ann.sign(
        &sim,
        Payload::Edit { object: id, edit: ObjectEdit { name: Some("x".repeat(10_000)), ..ObjectEdit::default() } },
    );
    let bouncy = metatopia_sim::state::Surface { friction: Fx::ONE, restitution: Fx::from_int(2), damping: Fx::ZERO };
    let too_bouncy = ann
        .sign(&sim, Payload::Edit { object: id, edit: ObjectEdit { surface: Some(bouncy), ..ObjectEdit::default() } });
    let r = step(&mut sim, vec![theirs, outside, avatar_body, long, too_bouncy]);
    let reasons: Vec<String> = r.rejected.iter().map(|x| x.reason.to_string()).collect();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
    assert!(reasons.iter().any(|x| x.contains("restitution (0 to 1)")), "{reasons:?}");
    assert!(reasons.iter().any(|x| x.contains("not owned by the author")), "{reasons:?}");
    assert!(reasons.iter().any(|x| x.contains("outside this sim")), "{reasons:?}");
    assert!(reasons.iter().any(|x| x.contains("an avatar walks")), "{reasons:?}");
    assert!(reasons.iter().any(|x| x.contains("name is 10000 bytes")), "{reasons:?}");
    assert_eq!(sim.world().object(id).unwrap().text, "hello");
}

/// A crowd logging in at once stands side by side around the landing point: the first at the
/// region's centre, no two overlapping, every one still after a second of physics (stacked on
/// one point, the physics threw them apart at up to 15 m/s and kept them jostling).
#[test]
fn a_crowd_logging_in_together_lands_side_by_side_and_stays_still() {
    let demo = demo_world(DemoSpec { seed: 7, objects: 0, players: 0, ..DemoSpec::default() });
    let mut sim = common::sim_of(&demo, 2);
    let centre = sim.world().region().centre();
    let mut crowd: Vec<Signer> = (0..300).map(|i| Signer::new(demo_key(98, i), &sim)).collect();
    for chunk in crowd.chunks_mut(50) {
        let logins: Vec<SignedEvent> =
            chunk.iter_mut().map(|s| s.sign(&sim, Payload::Login { name: "crowd".into() })).collect();
        let r = step(&mut sim, logins);
        assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    }
    idle(&mut sim, 30);
    let w = sim.world();
    let at: Vec<Vec2> = crowd.iter().map(|s| w.object(avatar(&sim, s)).unwrap().position).collect();
    // (The first in the tick's canonical order, which is not the order they were signed in.)
    assert!(at.contains(&centre), "the first avatar lands on the centre");
    for (i, a) in at.iter().enumerate() {
        assert!(w.region().contains(*a), "avatar {i} at {a:?} is outside the region");
        for b in &at[i + 1..] {
            let d = *a - *b;
            let (dx, dy) = (i128::from(d.x.to_bits()), i128::from(d.y.to_bits()));
            assert!(dx * dx + dy * dy >= i128::from(Fx::ONE.to_bits()).pow(2), "avatars at {a:?} and {b:?} overlap");
        }
    }
    let moving = crowd.iter().filter(|s| w.object(avatar(&sim, s)).unwrap().velocity != Vec2::ZERO).count();
    assert_eq!(moving, 0, "avatars standing side by side stay still");
    let far = at.iter().map(|p| (*p - centre).x.abs().max((*p - centre).y.abs())).max().unwrap();
    assert!(far <= Fx::from_int(20), "300 avatars stand within 20 m of the centre, not {far:?}");
}
