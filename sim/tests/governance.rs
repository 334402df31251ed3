//! Governance (DESIGN §10): the temp-admin story step by step, in BFT days.

mod common;

use common::{Signer, TestSim, batch_at};
use metatopia_sim::genesis::{DemoSpec, demo_key, demo_world};
use metatopia_sim::governance::{Role, admin_absent, report, role_of, temp_admin};
use metatopia_sim::state::{DAY_MS, RejectReason};
use metatopia_sim::{AdminAct, Payload, SignedEvent};

struct Story {
    sim: TestSim,
    admin: Signer,
    bob: Signer,
    charlie: Signer,
    dave: Signer,
    eve: Signer,
}

fn at_day(sim: &mut TestSim, day: u64, events: Vec<SignedEvent>) -> metatopia_sim::TickReport {
    let b = batch_at(sim, day * DAY_MS, events);
    sim.step(&b).expect("batch is for this tick")
}

fn login(s: &mut Signer, sim: &TestSim, name: &str) -> SignedEvent {
    s.sign(sim, Payload::Login { name: name.into() })
}

/// X = 30, Y = 7. Day 0 the admin logs in; Charlie joins day 1, Bob day 2, Dave day 3.
fn story() -> Story {
    let demo = demo_world(DemoSpec { seed: 10, objects: 0, players: 0, ..DemoSpec::default() });
    assert_eq!(demo.world.settings().admin_absent_days, 30);
    assert_eq!(demo.world.settings().temp_admin_active_days, 7);
    let mut sim = common::sim_of(&demo, 1);
    let mut admin = Signer::new(demo.admin.clone(), &sim);
    let mut charlie = Signer::new(demo_key(5, 1), &sim);
    let mut bob = Signer::new(demo_key(5, 2), &sim);
    let mut dave = Signer::new(demo_key(5, 3), &sim);
    let mut eve = Signer::new(demo_key(5, 4), &sim);
    let e = login(&mut admin, &sim, "admin");
    at_day(&mut sim, 0, vec![e]);
    let e = login(&mut charlie, &sim, "charlie");
    at_day(&mut sim, 1, vec![e]);
    let e = login(&mut bob, &sim, "bob");
    at_day(&mut sim, 2, vec![e]);
    let e = login(&mut dave, &sim, "dave");
    let e2 = login(&mut eve, &sim, "eve");
    at_day(&mut sim, 3, vec![e, e2]);
    Story { sim, admin, bob, charlie, dave, eve }
}

#[test]
fn the_temp_admin_story() {
    let Story { mut sim, mut admin, mut bob, mut charlie, mut dave, mut eve } = story();
    let x = 30;
    // Bob and Dave keep logging in; Charlie and the admin do not.
    for day in [10, 20, 28] {
        let (b, d) = (login(&mut bob, &sim, "bob"), login(&mut dave, &sim, "dave"));
        at_day(&mut sim, day, vec![b, d]);
    }
    // Day 30: the admin is exactly X days away, not more: no temp admin yet.
    at_day(&mut sim, x, vec![]);
    assert!(!admin_absent(sim.world(), x * DAY_MS));
    assert_eq!(temp_admin(sim.world(), x * DAY_MS), None);

    // Day X+1: the admin is absent; Bob (joined day 2, active within 7 days) is the most
    // senior active account; Charlie (joined day 1) last logged in 30 days ago.
    let day = x + 1;
    at_day(&mut sim, day, vec![]);
    let now = day * DAY_MS;
    assert!(admin_absent(sim.world(), now));
    assert_eq!(temp_admin(sim.world(), now), Some(bob.id()));
    assert_eq!(role_of(sim.world(), &bob.id(), now), Role::TempAdmin);
    assert_eq!(role_of(sim.world(), &dave.id(), now), Role::Member);
    assert!(report(sim.world(), now).reason.contains("absent more than 30 days"));

    // Bob acts as admin; a member's act is refused.
    let admin_seen_before = sim.world().account(&admin.id()).unwrap().last_login_ms;
    let kick = bob.sign(&sim, Payload::Admin(AdminAct::Kick { account: eve.id() }));
    let ban = dave.sign(&sim, Payload::Admin(AdminAct::Ban { account: eve.id() }));
    let r = at_day(&mut sim, day, vec![kick, ban]);
    assert_eq!(r.rejected.len(), 1);
    assert_eq!(r.rejected[0].reason, RejectReason::NotAuthorized { act: "ban".into() });
    assert!(sim.world().governance().kicked_until_ms.contains_key(&eve.id()));
    assert!(!sim.world().governance().banned.contains(&eve.id()));
    // Bob's acts do not make him permanent admin nor reset the admin's days since login.
    assert_eq!(sim.world().governance().admin, admin.id());
    assert_eq!(sim.world().account(&admin.id()).unwrap().last_login_ms, admin_seen_before);
    assert_eq!(report(sim.world(), now).admin_days_absent, day);

    // Bob keeps logging in; on day X+9 Charlie logs in and is temp admin from that tick.
    let b = login(&mut bob, &sim, "bob");
    at_day(&mut sim, x + 5, vec![b]);
    assert_eq!(temp_admin(sim.world(), (x + 5) * DAY_MS), Some(bob.id()));
    let c = login(&mut charlie, &sim, "charlie");
    at_day(&mut sim, x + 9, vec![c]);
    let now = (x + 9) * DAY_MS;
    assert_eq!(temp_admin(sim.world(), now), Some(charlie.id()));
    let late = bob.sign(&sim, Payload::Admin(AdminAct::Unban { account: eve.id() }));
    let r = at_day(&mut sim, x + 9, vec![late]);
    assert_eq!(r.rejected[0].reason, RejectReason::NotAuthorized { act: "unban".into() }, "Bob lost the role");

    // The admin logs in: no temp admin any more.
    let a = login(&mut admin, &sim, "admin");
    at_day(&mut sim, x + 10, vec![a]);
    let now = (x + 10) * DAY_MS;
    assert!(!admin_absent(sim.world(), now));
    assert_eq!(temp_admin(sim.world(), now), None);
    let c_act = charlie.sign(&sim, Payload::Admin(AdminAct::Unban { account: eve.id() }));
    let r = at_day(&mut sim, x + 10, vec![c_act]);
    assert_eq!(r.rejected[0].reason, RejectReason::NotAuthorized { act: "unban".into() });
    let _ = &mut eve;
}

#[test]
fn a_temp_admin_may_make_itself_permanent_admin() {
    let Story { mut sim, admin, mut bob, .. } = story();
    let b = login(&mut bob, &sim, "bob");
    at_day(&mut sim, 40, vec![b]);
    assert_eq!(temp_admin(sim.world(), 40 * DAY_MS), Some(bob.id()));
    let t = bob.sign(&sim, Payload::Admin(AdminAct::TransferAdmin { to: bob.id() }));
    let r = at_day(&mut sim, 40, vec![t]);
    assert!(r.rejected.is_empty());
    assert_eq!(sim.world().governance().admin, bob.id());
    assert_eq!(role_of(sim.world(), &admin.id(), 40 * DAY_MS), Role::Member);
    // Bob just logged in, so the new admin is present: no temp admin.
    assert_eq!(temp_admin(sim.world(), 40 * DAY_MS), None);
}

#[test]
fn ties_in_seniority_go_to_the_smallest_account_id() {
    let demo = demo_world(DemoSpec { seed: 11, objects: 0, players: 0, ..DemoSpec::default() });
    let mut sim = common::sim_of(&demo, 1);
    let mut p = Signer::new(demo_key(6, 1), &sim);
    let mut q = Signer::new(demo_key(6, 2), &sim);
    let (ep, eq) = (login(&mut p, &sim, "p"), login(&mut q, &sim, "q"));
    at_day(&mut sim, 35, vec![ep, eq]);
    let expect = p.id().min(q.id());
    assert_eq!(temp_admin(sim.world(), 35 * DAY_MS), Some(expect));
}

#[test]
fn banned_and_kicked_accounts_are_refused_and_validators_change_at_epochs() {
    let Story { mut sim, mut admin, mut eve, mut dave, .. } = story();
    let ban = admin.sign(&sim, Payload::Admin(AdminAct::Ban { account: eve.id() }));
    at_day(&mut sim, 4, vec![ban]);
    let e = login(&mut eve, &sim, "eve");
    let r = at_day(&mut sim, 4, vec![e]);
    assert_eq!(r.rejected[0].reason, RejectReason::Banned);
    assert!(temp_admin(sim.world(), 100 * DAY_MS) != Some(eve.id()));
    let kick = admin.sign(&sim, Payload::Admin(AdminAct::Kick { account: dave.id() }));
    at_day(&mut sim, 4, vec![kick]);
    let e = login(&mut dave, &sim, "dave");
    let r = at_day(&mut sim, 4, vec![e]);
    assert!(matches!(r.rejected[0].reason, RejectReason::Kicked { .. }));
    let e = login(&mut dave, &sim, "dave");
    let r = at_day(&mut sim, 5, vec![e]);
    assert!(r.rejected.is_empty(), "the cooldown is over: {:?}", r.rejected);

    let admit = admin.sign(&sim, Payload::Admin(AdminAct::AdmitValidator { key: dave.id() }));
    at_day(&mut sim, 5, vec![admit]);
    assert!(!sim.world().governance().validators.contains(&dave.id()), "waits for the epoch boundary");
    let epoch = sim.world().settings().epoch_ticks;
    while sim.world().tick().0 % epoch != 0 {
        at_day(&mut sim, 5, vec![]);
    }
    assert!(sim.world().governance().validators.contains(&dave.id()));
}

#[test]
fn the_admin_returns_an_object_to_its_owner_who_rezzes_it_again() {
    use metatopia_sim::state::{MAX_RETURNED, Shape};
    use metatopia_sim::{Fx, Vec2};
    let Story { mut sim, mut admin, mut bob, mut dave, .. } = story();
    let at = |x: i64, y: i64| Vec2::new(Fx::from_int(x), Fx::from_int(y));
    let shape = Shape::Circle { radius: Fx::from_int(1) };
    let rez = |s: &mut Signer, sim: &TestSim, name: &str, x: i64| {
        s.sign(
            sim,
            Payload::Rez { name: name.into(), shape, position: at(x, 10), color: 0x11223344, text: "mine".into() },
        )
    };
    let e = rez(&mut bob, &sim, "bob's lamp", 10);
    assert!(at_day(&mut sim, 4, vec![e]).rejected.is_empty());
    let lamp = sim.world().objects().values().find(|o| o.name == "bob's lamp").unwrap().id;
    let deploy = bob.sign(
        &sim,
        Payload::DeployScript {
            object: lamp,
            source: "on touch: say 0 lit".into(),
            licence: "AGPL-3.0-or-later".into(),
            derived_from: None,
        },
    );
    assert!(at_day(&mut sim, 4, vec![deploy]).rejected.is_empty());
    assert!(sim.world().script_source(lamp).is_some());

    // A member may not return it; an avatar cannot be returned; the admin returns it.
    let by_dave = dave.sign(&sim, Payload::Admin(AdminAct::ReturnObject { object: lamp }));
    let r = at_day(&mut sim, 5, vec![by_dave]);
    assert_eq!(r.rejected[0].reason, RejectReason::NotAuthorized { act: "return-object".into() });
    let avatar = sim.world().account(&bob.id()).unwrap().avatar.unwrap();
    let e = admin.sign(&sim, Payload::Admin(AdminAct::ReturnObject { object: avatar }));
    assert!(matches!(at_day(&mut sim, 5, vec![e]).rejected[0].reason, RejectReason::InvalidValue { .. }));
    let e = admin.sign(&sim, Payload::Admin(AdminAct::ReturnObject { object: lamp }));
    assert!(at_day(&mut sim, 5, vec![e]).rejected.is_empty());
    assert!(sim.world().object(lamp).is_none(), "out of the world");
    let returned = &sim.world().account(&bob.id()).unwrap().returned;
    assert_eq!(returned.len(), 1);
    assert_eq!(
        (returned[0].name.as_str(), returned[0].color, returned[0].text.as_str()),
        ("bob's lamp", 0x11223344, "mine")
    );
    assert_eq!(returned[0].script.as_ref().unwrap().source, "on touch: say 0 lit", "kept with its script");
    assert_eq!(returned[0].returned_at_ms, 5 * DAY_MS);

    // Only the owner can rez it again, at a place in the region; then it is back, whole.
    let e = dave.sign(&sim, Payload::RezReturned { index: 0, position: at(20, 20) });
    assert!(matches!(at_day(&mut sim, 6, vec![e]).rejected[0].reason, RejectReason::InvalidValue { .. }));
    let e = bob.sign(&sim, Payload::RezReturned { index: 0, position: at(-5, 20) });
    assert!(matches!(at_day(&mut sim, 6, vec![e]).rejected[0].reason, RejectReason::InvalidValue { .. }));
    let e = bob.sign(&sim, Payload::RezReturned { index: 0, position: at(20, 20) });
    assert!(at_day(&mut sim, 6, vec![e]).rejected.is_empty());
    let back = sim.world().objects().values().find(|o| o.name == "bob's lamp").unwrap();
    assert_eq!((back.owner, back.color, back.text.as_str(), back.shape), (bob.id(), 0x11223344, "mine", shape));
    assert_eq!(back.position, at(20, 20));
    assert!(sim.world().account(&bob.id()).unwrap().returned.is_empty());

    // An owner's returned objects are bounded: one more than the bound is refused, and the
    // object stays in the world.
    let rezzes: Vec<SignedEvent> =
        (0..=MAX_RETURNED).map(|i| rez(&mut bob, &sim, &format!("junk {i}"), 1 + i as i64)).collect();
    assert!(at_day(&mut sim, 7, rezzes).rejected.is_empty());
    let junk: Vec<_> = sim.world().objects().values().filter(|o| o.name.starts_with("junk")).map(|o| o.id).collect();
    let acts: Vec<SignedEvent> =
        junk.iter().map(|o| admin.sign(&sim, Payload::Admin(AdminAct::ReturnObject { object: *o }))).collect();
    let r = at_day(&mut sim, 8, acts);
    assert_eq!(r.rejected.len(), 1, "{:?}", r.rejected);
    assert_eq!(sim.world().account(&bob.id()).unwrap().returned.len(), MAX_RETURNED);
    assert_eq!(sim.world().objects().values().filter(|o| o.name.starts_with("junk")).count(), 1);
}
