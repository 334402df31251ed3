//! The example scripts of `scenarios/scripts/`, each checked tick by tick on the real pipeline.

use crate::common::{Player, idle, script, scripted_prim, step, world_with_players};
use metatopia_sim::pipeline::Speaker;
use metatopia_sim::{ChatRange, Payload, Vec2};

fn said(r: &metatopia_sim::TickReport, text: &str) -> Vec<Speaker> {
    r.chat.iter().filter(|l| l.text == text).map(|l| l.speaker).collect()
}

#[test]
fn the_door_opens_on_touch_and_closes_after_three_seconds() {
    let (mut sim, mut ps) = world_with_players(2);
    let (door, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(2, 0), &script("door"));
    assert!(r.rejected.is_empty() && r.script_errors.is_empty(), "{:?} {:?}", r.rejected, r.script_errors);
    // on_init ran in the deploying tick.
    assert_eq!(sim.world().object(door).unwrap().text, "door: closed");
    let touch = ps[1].sign(&sim, Payload::Touch { object: door });
    let r = step(&mut sim, vec![touch]);
    assert_eq!(said(&r, "The door opens."), vec![Speaker::Object(door)]);
    assert_eq!(sim.world().object(door).unwrap().text, "door: open");
    assert_eq!(sim.world().object(door).unwrap().color, 0x00ff_0080);
    // Touching an open door does nothing.
    let again = ps[0].sign(&sim, Payload::Touch { object: door });
    let r = step(&mut sim, vec![again]);
    assert!(said(&r, "The door opens.").is_empty());
    // It closes exactly 90 ticks after it opened.
    let reports = idle(&mut sim, 88);
    assert!(reports.iter().all(|r| said(r, "The door closes.").is_empty()));
    let r = step(&mut sim, vec![]);
    assert_eq!(said(&r, "The door closes."), vec![Speaker::Object(door)]);
    assert_eq!(sim.world().object(door).unwrap().text, "door: closed");
}

#[test]
fn the_echo_bot_repeats_chat_in_range_but_not_echoes() {
    let (mut sim, mut ps) = world_with_players(1);
    let (bot, _) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(5, 0), &script("echo"));
    let (bot2, _) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(-5, 0), &script("echo"));
    let hello = ps[0].sign(&sim, Payload::Chat { channel: 0, range: ChatRange::Say, text: "hello".into() });
    let r = step(&mut sim, vec![hello]);
    assert!(said(&r, "echo: hello").is_empty(), "heard next tick, not the same tick");
    let r = step(&mut sim, vec![]);
    assert_eq!(said(&r, "echo: hello"), vec![Speaker::Object(bot), Speaker::Object(bot2)]);
    // The bots hear each other's echoes and ignore them: no storm.
    let reports = idle(&mut sim, 5);
    assert!(reports.iter().all(|r| r.chat.is_empty()), "{:?}", reports.iter().map(|r| &r.chat).collect::<Vec<_>>());
    // Another channel is not listened to.
    let other = ps[0].sign(&sim, Payload::Chat { channel: 7, range: ChatRange::Say, text: "psst".into() });
    step(&mut sim, vec![other]);
    assert!(idle(&mut sim, 2).iter().all(|r| r.chat.is_empty()));
}

#[test]
fn the_greeter_welcomes_each_avatar_once_when_it_comes_near() {
    let (mut sim, mut ps) = world_with_players(2);
    // 30 m east of the avatars: out of range.
    let (greeter, _) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(30, 0), &script("greeter"));
    assert!(idle(&mut sim, 3).iter().all(|r| r.chat.is_empty()));
    // Player 1 walks east at 5 m/s: within 10 m after about 4 s.
    let me = ps[1].avatar(&sim);
    let walk = ps[1].sign(&sim, Payload::Move { object: me, velocity: Vec2::from_ints(5, 0) });
    step(&mut sim, vec![walk]);
    let mut greeted_at = None;
    for t in 0..200 {
        let r = step(&mut sim, vec![]);
        if !said(&r, "Welcome, player1!").is_empty() {
            assert!(greeted_at.is_none(), "greeted twice");
            greeted_at = Some(t);
            let pos = sim.world().object(me).unwrap().position;
            let g = sim.world().object(greeter).unwrap().position;
            assert!(pos.within(g, metatopia_sim::Fx::from_int(10)));
        }
    }
    assert!(greeted_at.is_some_and(|t| (100..130).contains(&t)), "{greeted_at:?}");
    let _: &Player = &ps[0];
}

#[test]
fn the_ball_kicks_itself_every_two_seconds() {
    let (mut sim, mut ps) = world_with_players(1);
    let (ball, r) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(0, 20), &script("ball"));
    assert!(r.script_errors.is_empty(), "{:?}", r.script_errors);
    let start = sim.world().object(ball).unwrap().position;
    assert!(sim.world().object(ball).unwrap().velocity.is_zero());
    idle(&mut sim, 59);
    assert!(sim.world().object(ball).unwrap().velocity.is_zero(), "not before the timer");
    idle(&mut sim, 1);
    let v = sim.world().object(ball).unwrap().velocity;
    // An impulse of 2 m/s in some direction (cos² + sin² = 1 within rounding).
    let speed = v.length();
    assert!((speed - metatopia_sim::Fx::TWO).abs() < metatopia_sim::Fx::from_ratio(1, 100), "{v:?}");
    assert_eq!(sim.world().object(ball).unwrap().text, "kicks: 1");
    idle(&mut sim, 60);
    assert_eq!(sim.world().object(ball).unwrap().text, "kicks: 2");
    assert_ne!(sim.world().object(ball).unwrap().position, start);
}

#[test]
fn the_counter_keeps_its_count_in_state_across_a_snapshot() {
    let (mut sim, mut ps) = world_with_players(1);
    let (counter, _) = scripted_prim(&mut sim, &mut ps[0], Vec2::from_ints(1, 1), &script("counter"));
    for n in 1..=3 {
        let t = ps[0].sign(&sim, Payload::Touch { object: counter });
        step(&mut sim, vec![t]);
        assert_eq!(sim.world().object(counter).unwrap().text, n.to_string());
    }
    let state = sim.world().script(counter).unwrap().state.clone();
    assert!(!state.is_empty(), "the count is persisted");
    let snap = metatopia_sim::Snapshot::decode(&sim.snapshot().encode(), 1 << 30).unwrap();
    let mut restored = metatopia_sim::Sim::restore(
        snap,
        metatopia_scripting::RhaiHost::default(),
        metatopia_sim::kinematic::KinematicPhysics::default(),
        1,
    )
    .unwrap();
    let t = ps[0].sign(&restored, Payload::Touch { object: counter });
    step(&mut restored, vec![t.clone()]);
    step(&mut sim, vec![t]);
    assert_eq!(restored.world().object(counter).unwrap().text, "4");
    assert_eq!(restored.root(), sim.root());
}
