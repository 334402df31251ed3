//! Governance (DESIGN §10): the temp-admin story step by step, in BFT days.
use crate::common;

use crate::common::{Signer, TestSim, batch_at};
use metatopia_sim::genesis::{DemoSpec, demo_key, demo_world};
use metatopia_sim::governance::{Role, admin_absent, report, role_of, temp_admin};
use metatopia_sim::state::{BodyKind, DAY_MS, RejectReason};
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
            Payload::Rez {
                name: name.into(),
                shape,
                position: at(x, 10),
                color: 0x11223344,
                text: "mine".into(),
                body: BodyKind::Static,
            },
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
    // Bob is online (his session refreshed), so his avatar is in the world.
    let e = login(&mut bob, &sim, "bob");
    at_day(&mut sim, 5, vec![e]);
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

mod real_clock {
    //! The temp-admin rule from a genesis at a real Unix time (DESIGN §10 on real nodes): the
    //! pipeline's roles against a model of the rule, over arbitrary logins and times.

    use super::common::{self, Signer, TestSim, batch_at};
    use metatopia_sim::genesis::{DemoSpec, demo_key, demo_world};
    use metatopia_sim::governance::{Role, role_of, temp_admin};
    use metatopia_sim::state::DAY_MS;
    use metatopia_sim::{AccountId, AdminAct, Payload};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// 2015-01-01 .. 2040-01-01 in Unix milliseconds.
    const REAL_TIMES: std::ops::Range<u64> = 1_420_070_400_000..2_208_988_800_000;

    /// A sim created at `genesis_ms` by its admin, whose account exists from genesis.
    fn created_at(genesis_ms: u64) -> (TestSim, Signer) {
        let mut demo = demo_world(DemoSpec { seed: 77, objects: 0, players: 0, ..DemoSpec::default() });
        demo.world.set_genesis_time(genesis_ms);
        let admin_id = metatopia_sim::event::account_of(&demo.admin);
        assert_eq!(
            demo.world.account(&admin_id).map(|a| (a.joined_at_ms, a.last_login_ms)),
            Some((genesis_ms, genesis_ms))
        );
        let sim = common::sim_of(&demo, 1);
        let admin = Signer::new(demo.admin.clone(), &sim);
        (sim, admin)
    }

    /// The rule as the design states it, over (joined, last login) of every non-admin account.
    fn model(
        admin_seen: u64,
        others: &BTreeMap<AccountId, (u64, u64)>,
        now: u64,
        x_days: u64,
        y_days: u64,
    ) -> Option<AccountId> {
        if now.saturating_sub(admin_seen) <= x_days * DAY_MS {
            return None;
        }
        others
            .iter()
            .filter(|(_, (_, last))| now.saturating_sub(*last) <= y_days * DAY_MS)
            .min_by_key(|(id, (joined, _))| (*joined, **id))
            .map(|(id, _)| *id)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Steps of (who logs in: 0 = the admin, 1..=4 players, 5 = nobody; hours later).
        #[test]
        fn the_rule_holds_from_a_real_genesis(
            genesis in REAL_TIMES,
            steps in proptest::collection::vec((0u64..6, 1u64..(24 * 20)), 1..40),
        ) {
            let (mut sim, mut admin) = created_at(genesis);
            let (x, y) = (u64::from(sim.world().settings().admin_absent_days), u64::from(sim.world().settings().temp_admin_active_days));
            let mut players: Vec<Signer> = (1..=4).map(|i| Signer::new(demo_key(991, i), &sim)).collect();
            let mut admin_seen = genesis;
            let mut others = BTreeMap::new();
            let mut now = genesis;
            for (who, hours) in steps {
                now += hours * 3_600_000;
                let temp_before = model(admin_seen, &others, now, x, y);
                // An admin act by every player: only the temp admin of the tick's start may act.
                let acts: Vec<_> = players
                    .iter_mut()
                    .map(|p| p.sign(&sim, Payload::Admin(AdminAct::Unban { account: AccountId([9; 32]) })))
                    .collect();
                let events = match who {
                    0 => vec![admin.sign(&sim, Payload::Login { name: "admin".into() })],
                    1..=4 => vec![players[who as usize - 1].sign(&sim, Payload::Login { name: format!("p{who}") })],
                    _ => vec![],
                };
                let r = sim.step(&batch_at(&sim, now, acts.clone())).expect("the batch is for this tick");
                let refused: Vec<_> = r.rejected.iter().map(|j| j.author).collect();
                for p in &players {
                    prop_assert_eq!(!refused.contains(&p.id()), temp_before == Some(p.id()));
                }
                let r = sim.step(&batch_at(&sim, now, events)).expect("the batch is for this tick");
                prop_assert!(r.rejected.is_empty(), "{:?}", r.rejected);
                match who {
                    0 => admin_seen = now,
                    1..=4 => {
                        let id = players[who as usize - 1].id();
                        others.entry(id).or_insert((now, now)).1 = now;
                    }
                    _ => {}
                }
                let want = model(admin_seen, &others, now, x, y);
                prop_assert_eq!(temp_admin(sim.world(), now), want);
                // Nobody is temp admin while the admin was seen within X days of now; the admin
                // is always the admin.
                if now - admin_seen <= x * DAY_MS {
                    prop_assert_eq!(want, None);
                }
                prop_assert_eq!(role_of(sim.world(), &admin.id(), now), Role::Admin);
            }
        }
    }

    /// The reported take-over: a stranger logs in one tick after a sim made at a real time and is
    /// not temp admin, and its admin act is refused.
    #[test]
    fn a_stranger_on_a_fresh_sim_is_never_temp_admin() {
        let genesis = 1_795_700_000_000;
        let (mut sim, _admin) = created_at(genesis);
        let mut stranger = Signer::new(demo_key(4040, 1), &sim);
        let login = stranger.sign(&sim, Payload::Login { name: "stranger".into() });
        sim.step(&batch_at(&sim, genesis + 50, vec![login])).unwrap();
        for t in [genesis + 100, genesis + 29 * DAY_MS] {
            assert_eq!(temp_admin(sim.world(), t), None);
            let act = stranger.sign(&sim, Payload::Admin(AdminAct::TransferAdmin { to: stranger.id() }));
            let r = sim.step(&batch_at(&sim, t, vec![act])).unwrap();
            assert_eq!(r.rejected.len(), 1, "the stranger's act at {t} is refused");
        }
        assert_ne!(sim.world().governance().admin, stranger.id());
    }
}

/// A refused act can be tried again once its cause is gone (signed anew with the next nonce, as
/// `metatopia admin` and the clients sign: one above the last the sim used up), and gets a fresh
/// outcome; a replay of an executed event still never takes effect twice.
#[test]
fn a_kicked_or_banned_account_logs_in_again_once_its_cause_is_gone_and_replays_stay_refused() {
    let Story { mut sim, mut admin, dave, .. } = story();
    // The way a tool signs: the next nonce after the one the world last used up.
    let fresh = |sim: &TestSim, key: &metatopia_sim::SigningKey, payload: Payload| {
        let id = metatopia_sim::event::account_of(key);
        let last = sim.world().account(&id).map_or(0, |a| a.last_nonce);
        SignedEvent::new(key, sim.world().sim(), last + 1, payload)
    };
    let login = Payload::Login { name: "dave".into() };
    let kick = admin.sign(&sim, Payload::Admin(AdminAct::Kick { account: dave.id() }));
    at_day(&mut sim, 4, vec![kick]);
    let cooldown = sim.world().settings().kick_cooldown_ms;
    let day4 = 4 * DAY_MS;
    let refused = fresh(&sim, &dave.key, login.clone());
    let r = sim.step(&batch_at(&sim, day4 + cooldown / 2, vec![refused.clone()])).unwrap();
    assert!(matches!(r.rejected[0].reason, RejectReason::Kicked { .. }), "{:?}", r.rejected);
    assert!(r.rejected[0].reason.to_string().contains("kicked until 1970-01-05T00:15:00Z"), "{}", r.rejected[0].reason);
    // After the cooldown: the retry is a new event (new id), and it executes.
    let retry = fresh(&sim, &dave.key, login.clone());
    assert_ne!(retry, refused, "the retry is signed anew, not the refused bytes again");
    let r = sim.step(&batch_at(&sim, day4 + cooldown + 1, vec![retry.clone()])).unwrap();
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    // Replays of the refused and of the executed event take no effect.
    let r = sim.step(&batch_at(&sim, day4 + cooldown + 2, vec![refused, retry])).unwrap();
    assert_eq!(r.rejected.len(), 2);
    assert!(r.rejected.iter().all(|j| matches!(j.reason, RejectReason::StaleNonce { .. })), "{:?}", r.rejected);
    // Banned, then unbanned: the same.
    let ban = admin.sign(&sim, Payload::Admin(AdminAct::Ban { account: dave.id() }));
    at_day(&mut sim, 5, vec![ban]);
    let e = fresh(&sim, &dave.key, login.clone());
    let r = at_day(&mut sim, 5, vec![e]);
    assert_eq!(r.rejected[0].reason, RejectReason::Banned);
    let unban = admin.sign(&sim, Payload::Admin(AdminAct::Unban { account: dave.id() }));
    at_day(&mut sim, 5, vec![unban]);
    let e = fresh(&sim, &dave.key, login);
    let r = at_day(&mut sim, 5, vec![e]);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
}

/// Settings out of bounds are refused, naming the field and its bounds; the defaults are within.
#[test]
fn settings_out_of_bounds_are_refused_naming_the_field() {
    let Story { mut sim, mut admin, .. } = story();
    assert_eq!(sim.world().settings().check(), Ok(()));
    let mut s = sim.world().settings().clone();
    s.aoi_radius_m = 100_000;
    let e = s.check().unwrap_err();
    assert_eq!(e.to_string(), "aoi_radius_m must be 1..=1024 m, not 100000");
    let act = admin.sign(&sim, Payload::Admin(AdminAct::SetSettings(s)));
    let r = at_day(&mut sim, 4, vec![act]);
    assert_eq!(
        r.rejected[0].reason.to_string(),
        "invalid value for settings: aoi_radius_m must be 1..=1024 m, not 100000"
    );
    let mut s = sim.world().settings().clone();
    s.tick_rate_hz = 0;
    assert_eq!(s.check().unwrap_err().field, "tick_rate_hz");
    let mut s = sim.world().settings().clone();
    s.limits.max_speed = metatopia_sim::Fx::ZERO;
    assert_eq!(s.check().unwrap_err().field, "max_speed");
}

/// A session that ends without a logout (a client killed, a network lost) stops refreshing its
/// login; its avatar is removed once the grace period has passed, and a refreshed one stays.
#[test]
fn avatars_of_sessions_that_stopped_refreshing_are_removed_after_the_grace_period() {
    use metatopia_sim::governance::{SESSION_GRACE_MS, SESSION_REFRESH_MS};
    let Story { mut sim, mut bob, mut dave, .. } = story();
    let t0 = 4 * DAY_MS;
    let (b, d) = (login(&mut bob, &sim, "bob"), login(&mut dave, &sim, "dave"));
    at_day(&mut sim, 4, vec![b, d]);
    let avatar = |sim: &TestSim, s: &Signer| sim.world().account(&s.id()).unwrap().avatar;
    let (bob_avatar, dave_avatar) = (avatar(&sim, &bob).unwrap(), avatar(&sim, &dave).unwrap());
    // Dave's client keeps refreshing; Bob's was killed.
    let mut t = t0;
    while t <= t0 + SESSION_GRACE_MS {
        t += SESSION_REFRESH_MS;
        let d = login(&mut dave, &sim, "dave");
        sim.step(&batch_at(&sim, t, vec![d])).unwrap();
        assert_eq!(avatar(&sim, &dave), Some(dave_avatar), "a refreshed session keeps its avatar");
        let gone = t.saturating_sub(t0) > SESSION_GRACE_MS;
        assert_eq!(sim.world().object(bob_avatar).is_none(), gone, "at +{} ms", t - t0);
    }
    assert_eq!(avatar(&sim, &bob), None);
    // Bob comes back: a new avatar.
    let b = login(&mut bob, &sim, "bob");
    sim.step(&batch_at(&sim, t + 1, vec![b])).unwrap();
    assert!(avatar(&sim, &bob).is_some());
}

/// A nonce may be at most `MAX_NONCE_STEP` above the account's last: `u64::MAX` is refused and
/// does not lock the account out of every later nonce.
#[test]
fn a_nonce_far_ahead_is_refused_and_cannot_brick_an_account() {
    use metatopia_sim::pipeline::MAX_NONCE_STEP;
    let Story { mut sim, dave, .. } = story();
    let last = sim.world().account(&dave.id()).unwrap().last_nonce;
    let far = SignedEvent::new(&dave.key, sim.world().sim(), u64::MAX, Payload::Login { name: "dave".into() });
    let r = at_day(&mut sim, 4, vec![far]);
    assert!(
        matches!(&r.rejected[0].reason, RejectReason::InvalidValue { field } if field.starts_with("nonce")),
        "{:?}",
        r.rejected
    );
    assert_eq!(sim.world().account(&dave.id()).unwrap().last_nonce, last, "nothing used up");
    let step =
        SignedEvent::new(&dave.key, sim.world().sim(), last + MAX_NONCE_STEP, Payload::Login { name: "dave".into() });
    assert!(at_day(&mut sim, 4, vec![step]).rejected.is_empty(), "the largest step is allowed");
}
