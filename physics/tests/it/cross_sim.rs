//! Sims side by side (DESIGN §7): each a whole `Sim` (world, rule scripts, region physics) with
//! its own validators; their mail travels as signed events with seeded delays, duplicates and
//! reordering, from validators of whom one signs corrupted mail and one drops half of its
//! copies. A receiver takes mail only at f + 1 matching copies. Bodies crossing borders arrive
//! exactly once with their object and script, and the whole run is deterministic, restarts
//! from snapshots included.

use metatopia_sim::state::BodyKind;
use std::collections::BTreeMap;

use metatopia_physics::RegionStage;
use metatopia_physics::region::FULL_ROOT_EVERY;
use metatopia_sim::genesis::attach_script;
use metatopia_sim::links::Neighbour;
use metatopia_sim::rng::DetRng;
use metatopia_sim::rules::RuleHost;
use metatopia_sim::snapshot::MAX_SNAPSHOT_BYTES;
use metatopia_sim::state::{Genesis, ObjectKind, Region, RejectReason, Settings, Shape};
use metatopia_sim::{
    AccountId, AdminAct, Batch, Fx, Hash32, ObjectId, Payload, SignedEvent, SigningKey, Sim, SimId, Snapshot, Vec2,
    VerifiedBatch,
};

const SIZE: i64 = 32;
const VALIDATORS: u8 = 4;
/// Keys a sim's validators may have (genesis: the first four; others admitted later).
const MAX_KEYS: u8 = 12;

type Node = Sim<RuleHost, RegionStage>;

fn key(sim: u32, i: u8) -> SigningKey {
    let mut b = [0u8; 32];
    b[0] = sim as u8 + 1;
    b[1] = i + 1;
    SigningKey::from_bytes(&b)
}

fn account(k: &SigningKey) -> AccountId {
    AccountId(k.verifying_key().to_bytes())
}

fn region(col: u32, row: u32) -> Region {
    Region { origin: Vec2::from_ints(i64::from(col) * SIZE, i64::from(row) * SIZE), size: Fx::from_int(SIZE) }
}

/// Sims `row * cols + col` of a grid, each knowing its edge and corner neighbours.
fn worlds(cols: u32, rows: u32, bodies: &[(String, Vec2, Vec2)]) -> Vec<Node> {
    let owner = account(&key(99, 0));
    let mut out = Vec::new();
    for row in 0..rows {
        for col in 0..cols {
            let sim = SimId(row * cols + col);
            let validators = (0..VALIDATORS).map(|i| account(&key(sim.0, i))).collect();
            let mut world = metatopia_sim::World::new(Genesis {
                sim,
                region: region(col, row),
                admin: owner,
                validators,
                // Short epochs: validator changes take effect within a test's run.
                settings: Settings { tick_rate_hz: 60, epoch_ticks: 20, ..Settings::default() },
                time_ms: 0,
            });
            let mut neighbours = Vec::new();
            for r in row.saturating_sub(1)..=(row + 1).min(rows - 1) {
                for c in col.saturating_sub(1)..=(col + 1).min(cols - 1) {
                    let n = SimId(r * cols + c);
                    if n != sim {
                        let validators = (0..VALIDATORS).map(|i| account(&key(n.0, i))).collect();
                        neighbours.push((n, Neighbour { region: region(c, r), validators }));
                    }
                }
            }
            let hi = Vec2::from_ints(i64::from(cols) * SIZE, i64::from(rows) * SIZE);
            world.set_genesis_neighbours(neighbours, (Vec2::ZERO, hi)).unwrap();
            for (name, p, v) in bodies {
                if world.region().contains(*p) {
                    let shape = Shape::Circle { radius: Fx::HALF };
                    let id = world.add_genesis_object(
                        ObjectKind::Prim,
                        owner,
                        name.clone(),
                        shape,
                        *p,
                        *v,
                        0xff0000ff,
                        String::new(),
                        BodyKind::Dynamic,
                    );
                    attach_script(&mut world, &RuleHost::default(), id, owner, "timer 6\non timer: count", "MPL-2.0")
                        .unwrap();
                }
            }
            out.push(Sim::new(world, RuleHost::default(), RegionStage::single(), 1).unwrap());
        }
    }
    out
}

/// The seeded network between the sims' validators.
struct Net {
    rng: DetRng,
    /// (deliver at our tick, to sim, event)
    inflight: Vec<(u64, u32, SignedEvent)>,
}

impl Net {
    /// Every validator of the sender (`signers`, by key index) signs its tick's mail:
    /// validator 3 corrupts the body, validator 2 drops half of its copies; copies take 1 to 6
    /// ticks, a tenth twice.
    fn post(&mut self, now: u64, from: SimId, report: &metatopia_sim::TickReport, signers: &[u8]) {
        for m in &report.mail {
            for &i in signers {
                if i == 2 && self.rng.chance(1, 2) {
                    continue;
                }
                let mut body = m.body.clone();
                if i == 3 {
                    body.push(0x55);
                }
                let payload = Payload::Mail { from, tick: m.tick, body };
                let e = SignedEvent::new(&key(from.0, i), m.to, m.tick.0, payload);
                let copies = if self.rng.chance(1, 10) { 2 } else { 1 };
                for _ in 0..copies {
                    let at = now + 1 + self.rng.below(6);
                    self.inflight.push((at, m.to.0, e.clone()));
                }
            }
        }
    }

    fn due(&mut self, now: u64, sim: u32) -> Vec<SignedEvent> {
        let mut due = Vec::new();
        self.inflight.retain(|(at, to, e)| {
            let take = *at <= now && *to == sim;
            if take {
                due.push(e.clone());
            }
            !take
        });
        // Arrival order inside a batch is shuffled too; the sim must not care.
        for i in (1..due.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            due.swap(i, j);
        }
        due
    }
}

fn seed(sim: u32, tick: u64) -> Hash32 {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(&sim.to_le_bytes());
    b[4..12].copy_from_slice(&tick.to_le_bytes());
    Hash32(*blake3::hash(&b).as_bytes())
}

/// Where each named body is: the sims whose world holds it, and those holding it as departed.
fn whereabouts(sims: &[Node]) -> BTreeMap<String, (Vec<u32>, Vec<u32>)> {
    let mut at: BTreeMap<String, (Vec<u32>, Vec<u32>)> = BTreeMap::new();
    for s in sims {
        for o in s.world().objects().values() {
            at.entry(o.name.clone()).or_default().0.push(s.world().sim().0);
        }
        for d in s.world().links().departed().values() {
            at.entry(d.record.object.name.clone()).or_default().1.push(s.world().sim().0);
        }
    }
    at
}

struct Run {
    roots: Vec<Hash32>,
    /// Snapshots taken at full-hash ticks in which a body arrived (each one loaded).
    full_tick_arrival_snapshots: u32,
    arrivals: BTreeMap<String, u32>,
    departures: BTreeMap<String, u32>,
    sims: Vec<Node>,
}

/// Run `ticks` ticks; at `restart_at`, every sim is rebuilt from an encoded snapshot.
fn run(sims: Vec<Node>, ticks: u64, net_seed: u64, restart_at: Option<u64>) -> Run {
    run_with(sims, ticks, net_seed, restart_at, Vec::new())
}

/// [`run`], with events for the sims (at our tick, to sim).
fn run_with(
    mut sims: Vec<Node>,
    ticks: u64,
    net_seed: u64,
    restart_at: Option<u64>,
    events: Vec<(u64, u32, SignedEvent)>,
) -> Run {
    let mut net = Net { rng: DetRng::from_u64(net_seed), inflight: events };
    let mut names: Vec<String> = whereabouts(&sims).into_keys().collect();
    let mut r = Run {
        roots: Vec::new(),
        full_tick_arrival_snapshots: 0,
        arrivals: BTreeMap::new(),
        departures: BTreeMap::new(),
        sims: Vec::new(),
    };
    for t in 0..ticks {
        if restart_at == Some(t) {
            sims = sims
                .iter_mut()
                .map(|s| {
                    let bytes = s.snapshot().encode();
                    let snap = Snapshot::decode(&bytes, MAX_SNAPSHOT_BYTES).unwrap();
                    Sim::restore(snap, RuleHost::default(), RegionStage::single(), 1).unwrap()
                })
                .collect();
        }
        let mut reports = Vec::new();
        for s in sims.iter_mut() {
            let id = s.world().sim();
            let events = net.due(t, id.0);
            let batch = Batch { tick: s.world().tick(), time_ms: t * 16, seed: seed(id.0, t), events };
            let report = s.step(&VerifiedBatch::new(batch, 1)).unwrap();
            for rej in &report.rejected {
                // The corrupted copies never reach a quorum, so nothing malformed is delivered.
                assert!(!matches!(rej.reason, RejectReason::MalformedMail { .. }), "{rej:?}");
            }
            for (id, _, _) in &report.arrived {
                let name = s.world().object(*id).unwrap().name.clone();
                *r.arrivals.entry(name).or_default() += 1;
            }
            for (id, _) in &report.left {
                let name = s.world().links().departed()[id].record.object.name.clone();
                *r.departures.entry(name).or_default() += 1;
            }
            r.roots.push(report.root);
            // Every snapshot a node would take (at multiples of the full-hash period) loads and
            // gives the same root, a tick whose arrivals renamed bodies after the step included.
            let tick = s.world().tick().0;
            if tick.is_multiple_of(FULL_ROOT_EVERY) {
                let bytes = s.snapshot().encode();
                let snap = Snapshot::decode(&bytes, MAX_SNAPSHOT_BYTES).unwrap();
                let mut back = Sim::restore(snap, RuleHost::default(), RegionStage::single(), 1)
                    .unwrap_or_else(|e| panic!("sim {} tick {tick}: its snapshot does not load: {e}", id.0));
                assert_eq!(back.root(), report.root, "sim {} tick {tick}", id.0);
                if !report.arrived.is_empty() {
                    r.full_tick_arrival_snapshots += 1;
                }
            }
            reports.push((id, report));
        }
        for (id, report) in &reports {
            // The sender's validators of now sign its mail.
            let set = &sims[id.0 as usize].world().governance().validators;
            let signers: Vec<u8> = (0..MAX_KEYS).filter(|i| set.contains(&account(&key(id.0, *i)))).collect();
            net.post(t, *id, report, &signers);
        }
        // Never lost, never doubled: each body is in exactly one world, or (in transit) in
        // none and departed from exactly one.
        let at = whereabouts(&sims);
        // (Bodies may appear: an avatar logging in.)
        let vanished: Vec<&String> = names.iter().filter(|n| !at.contains_key(*n)).collect();
        assert!(vanished.is_empty(), "tick {t}: {vanished:?} vanished");
        names = at.keys().cloned().collect();
        for (name, (worlds, departed)) in &at {
            assert!(worlds.len() <= 1, "tick {t}: {name} is in the worlds of sims {worlds:?}");
            assert!(departed.len() <= 1, "tick {t}: {name} departed from {departed:?}");
            assert!(!worlds.is_empty() || departed.len() == 1, "tick {t}: {name} is nowhere");
        }
    }
    r.sims = sims;
    r
}

fn owner_of(sims: &[Node], name: &str) -> (u32, ObjectId) {
    for s in sims {
        if let Some(o) = s.world().objects().values().find(|o| o.name == name) {
            return (s.world().sim().0, o.id);
        }
    }
    panic!("{name} is in no world");
}

/// One ball rolls from sim 0 into sim 1: it arrives once, keeps its velocity, owner, colour,
/// script and the script's state, and sim 0 forgets it once sim 1 confirms.
#[test]
fn a_body_crossing_between_two_sims_arrives_exactly_once_with_its_script() {
    let ball = ("ball".to_string(), Vec2::from_ints(26, 16), Vec2::from_ints(5, 0));
    let sims = worlds(2, 1, &[ball]);
    let r = run(sims, 150, 7, None);
    assert_eq!(r.departures.get("ball"), Some(&1));
    assert_eq!(r.arrivals.get("ball"), Some(&1));
    let (sim, id) = owner_of(&r.sims, "ball");
    assert_eq!(sim, 1);
    let w = r.sims[1].world();
    let o = w.object(id).unwrap();
    assert!(o.position.x > Fx::from_int(SIZE + 1), "{:?}", o.position);
    assert_eq!(o.velocity, Vec2::from_ints(5, 0), "velocity carried across exactly");
    assert_eq!((o.owner, o.color), (account(&key(99, 0)), 0xff0000ff));
    let src = w.script_source(id).unwrap();
    assert_eq!((src.source.as_str(), src.licence.as_str()), ("timer 6\non timer: count", "MPL-2.0"));
    // The counter kept counting across the border: 150 ticks / 6, give or take the crossing.
    let count: u32 = o.text.parse().unwrap();
    assert!((22..=25).contains(&count), "count {count}");
    assert!(r.sims[0].world().links().departed().is_empty(), "settled");
    assert!(r.sims[0].world().objects().is_empty());
    // Nothing waits for a quorum that the honest validators already gave.
    for s in &r.sims {
        assert!(s.world().links().pending_count() <= 8, "{}", s.world().links().pending_count());
    }
}

/// A 2×2 world of sims with bodies bouncing everywhere: many crossings, each exactly once,
/// never lost or doubled at any tick; the same seeds give the same roots, and a restart of
/// every sim from its snapshot changes nothing.
#[test]
fn a_two_by_two_world_hands_bodies_over_exactly_once_and_deterministically() {
    let mut rng = DetRng::from_u64(11);
    let bodies: Vec<(String, Vec2, Vec2)> = (0..16)
        .map(|i| {
            let p = Vec2::from_ints(4 + (i % 4) * 15, 4 + (i / 4) * 15);
            let v = Vec2::from_ints(rng.range_i64(-9, 9), rng.range_i64(-9, 9));
            (format!("b{i}"), p, v)
        })
        .collect();
    let a = run(worlds(2, 2, &bodies), 600, 3, None);
    let crossings: u32 = a.arrivals.values().sum();
    assert!(crossings >= 12, "only {crossings} crossings");
    for (name, n) in &a.arrivals {
        assert_eq!(a.departures.get(name), Some(n), "{name}: left {:?} times, arrived {n}", a.departures.get(name));
    }
    let b = run(worlds(2, 2, &bodies), 600, 3, None);
    assert_eq!(a.roots, b.roots, "same seeds, same roots");
    let c = run(worlds(2, 2, &bodies), 600, 3, Some(300));
    assert_eq!(a.roots, c.roots, "a restart from snapshots changes nothing");
    let d = run(worlds(2, 2, &bodies), 600, 4, None);
    assert_ne!(a.roots.last(), d.roots.last(), "other network timing, other (still consistent) run");
}

/// Bodies crossing back and forth between two sims all the time, so that some arrive in a tick
/// a node snapshots (a multiple of the physics full-hash period): the arrival renames the body
/// after the step took the full hash, and the snapshot must still load (`run_with` loads every
/// snapshot at those ticks and compares roots). Before the fix such snapshots were refused as
/// "does not match its full hash".
#[test]
fn snapshots_at_ticks_with_arrivals_load_and_give_the_same_root() {
    let bodies: Vec<(String, Vec2, Vec2)> = (0..24)
        .map(|i| {
            let p = Vec2::from_ints(3 + (i % 12) * 5, 4 + (i / 12) * 20);
            let v = Vec2::from_ints(if i % 2 == 0 { 25 + i % 5 } else { -25 - i % 5 }, 0);
            (format!("b{i}"), p, v)
        })
        .collect();
    let r = run(worlds(2, 1, &bodies), 400, 5, None);
    let crossings: u32 = r.arrivals.values().sum();
    assert!(crossings >= 20, "only {crossings} crossings");
    assert!(r.full_tick_arrival_snapshots >= 1, "no snapshot fell in a tick with an arrival ({crossings} crossings)");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Mail the physics stage is handed is decoded with bounds: garbage (or envelopes naming
    /// bodies it must not take) is refused and counted, and the sim steps on.
    #[test]
    fn garbage_mail_never_breaks_the_stage(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        use metatopia_sim::host::PhysicsStage;
        let mut sims = worlds(2, 1, &[("ball".into(), Vec2::from_ints(10, 10), Vec2::from_ints(1, 0))]);
        let mut stage = RegionStage::single();
        stage.load(sims[0].world(), None).unwrap();
        stage.deliver(SimId(1), &bytes);
        let decodes = metatopia_sim::codec::decode::<Vec<metatopia_physics::Envelope>>(&bytes, 1 << 20).is_ok();
        if !decodes {
            proptest::prop_assert_eq!(stage.refused(), 1);
        }
        let _ = stage.step(sims[0].world(), &[], Fx::from_ratio(1, 60));
        let batch = Batch { tick: sims[0].world().tick(), time_ms: 0, seed: seed(0, 0), events: Vec::new() };
        proptest::prop_assert!(sims[0].step(&VerifiedBatch::new(batch, 1)).is_ok());
    }
}

/// Envelopes that decode but name bodies wrongly, or claim another sender, are refused.
#[test]
fn mail_naming_the_wrong_bodies_or_sender_is_refused() {
    use metatopia_physics::{Envelope, Msg, RegionId};
    use metatopia_sim::host::PhysicsStage;
    let sims = worlds(2, 1, &[]);
    let mut stage = RegionStage::single();
    stage.load(sims[0].world(), None).unwrap();
    let env = |from: u32, msg: Msg| Envelope { from: RegionId(from), to: RegionId(0), tick: 1, msg };
    let foreign_looking = ObjectId::new(1 << 31, 0);
    let mail = vec![
        env(1, Msg::Ghosts(Vec::new())),                                         // fine
        env(2, Msg::Ghosts(Vec::new())),                                         // wrong sender
        env(1, Msg::Done { object: foreign_looking, epoch: 1 }),                 // not our name
        env(1, Msg::Accept { object: ObjectId::new(3, 0), epoch: 1, nonce: 1 }), // fine (ours)
    ];
    stage.deliver(SimId(1), &metatopia_sim::codec::encode(&mail));
    assert_eq!(stage.refused(), 2);
}

/// Sim 0 replaces its validators one at a time — each epoch admits a new one and removes one of
/// the genesis set — until none of its genesis validators is left. Sim 1 follows the set through
/// sim 0's mail (each set vouched for by f + 1 of the one before), so sim 0's mail still counts
/// after the rotation: a ball that crosses then arrives exactly once, and sim 1 knows sim 0's
/// validators as sim 0 does.
#[test]
fn a_neighbour_that_replaces_all_its_validators_is_still_heard() {
    // (Clear of the admin's avatar, which logs in at the centre.)
    let ball = ("ball".to_string(), Vec2::from_ints(8, 4), Vec2::from_ints(4, 0));
    let sims = worlds(2, 1, &[ball]);
    let admin = key(99, 0);
    let sign = |nonce: u64, payload: Payload| SignedEvent::new(&admin, SimId(0), nonce, payload);
    let mut events = vec![(1, 0, sign(1, Payload::Login { name: "admin".into() }))];
    let mut nonce = 1;
    for step in 0..u64::from(VALIDATORS) {
        let at = 5 + 20 * step;
        for act in [
            AdminAct::AdmitValidator { key: account(&key(0, VALIDATORS + step as u8)) },
            AdminAct::RemoveValidator { key: account(&key(0, step as u8)) },
        ] {
            nonce += 1;
            events.push((at, 0, sign(nonce, Payload::Admin(act))));
        }
    }
    let r = run_with(sims, 450, 11, None, events);
    let set0 = r.sims[0].world().governance().validators.clone();
    let rotated: std::collections::BTreeSet<AccountId> =
        (VALIDATORS..2 * VALIDATORS).map(|i| account(&key(0, i))).collect();
    assert_eq!(set0, rotated, "sim 0 replaced every genesis validator");
    assert_eq!(r.sims[1].world().links().neighbours[&SimId(0)].validators, rotated, "sim 1 follows sim 0's set");
    assert_eq!((r.departures.get("ball"), r.arrivals.get("ball")), (Some(&1), Some(&1)));
    assert_eq!(owner_of(&r.sims, "ball").0, 1, "the ball crossed after the rotation (at about tick 360)");
    assert!(r.sims[0].world().links().departed().is_empty(), "sim 1's confirmation reached sim 0 too");
}

/// A client's login that was on its way while its avatar walked into the next sim (the
/// viewer logs in again every 20 s to keep its session) executes where the avatar no longer
/// is: it keeps the session and spawns no second avatar while the first is in transit.
#[test]
fn a_login_while_the_avatar_crosses_into_the_next_sim_spawns_no_second_avatar() {
    let mut sims = worlds(2, 1, &[]);
    let walker = key(50, 0);
    let me = account(&walker);
    let mut nonce = 0;
    let mut sign = |payload: Payload| {
        nonce += 1;
        SignedEvent::new(&walker, SimId(0), nonce, payload)
    };
    let mut net =
        Net { rng: DetRng::from_u64(5), inflight: vec![(0, 0, sign(Payload::Login { name: "walker".into() }))] };
    let (mut walking, mut in_transit_logins) = (false, 0);
    for t in 0..400u64 {
        let avatar = sims[0].world().objects().values().find(|o| o.owner == me).map(|o| o.id);
        if let (Some(object), false) = (avatar, walking) {
            net.inflight.push((t, 0, sign(Payload::Move { object, velocity: Vec2::from_ints(5, 0) })));
            walking = true;
        }
        let in_transit = sims[0].world().links().departed().values().any(|d| d.record.object.owner == me);
        if in_transit {
            // Executes this tick, while sim 0 holds the avatar as departed.
            net.inflight.push((t, 0, sign(Payload::Login { name: "walker".into() })));
            in_transit_logins += 1;
        }
        let mut reports = Vec::new();
        for s in sims.iter_mut() {
            let id = s.world().sim();
            let batch =
                Batch { tick: s.world().tick(), time_ms: t * 16, seed: seed(id.0, t), events: net.due(t, id.0) };
            let report = s.step(&VerifiedBatch::new(batch, 1)).unwrap();
            if id.0 == 0 && in_transit {
                assert!(report.rejected.is_empty(), "tick {t}: {:?}", report.rejected);
            }
            reports.push((id, report));
        }
        for (id, report) in &reports {
            let signers: Vec<u8> = (0..VALIDATORS).collect();
            net.post(t, *id, report, &signers);
        }
    }
    assert!(in_transit_logins > 0, "the avatar was in transit for some ticks");
    let avatars: Vec<(u32, Vec2)> = sims
        .iter()
        .flat_map(|s| {
            s.world()
                .objects()
                .values()
                .filter(|o| o.owner == me && o.kind == ObjectKind::Avatar)
                .map(|o| (s.world().sim().0, o.position))
        })
        .collect();
    assert_eq!(avatars.len(), 1, "one avatar: {avatars:?}");
    assert_eq!(avatars[0].0, 1, "in the sim it walked into: {avatars:?}");
    assert!(sims[0].world().links().departed().is_empty(), "settled");
}
