//! Governance end to end (DESIGN §10) on four whole nodes in the deterministic cluster, over
//! accelerated time: one day of sim time is 8 ticks (400 ms of BFT time). Every act is a signed
//! event submitted through some node; every node must reach the same roles, the same refusals
//! with the same reasons, and the same state root at every tick.

use std::collections::BTreeMap;
use std::sync::Arc;

use metatopia_consensus::{Config, SigCache, SigningKey, Validator};
use metatopia_lab::simnet::{Actor, CoreProcess};
use metatopia_node::api::http::governance_view;
use metatopia_node::core::epochs::Epochs;
use metatopia_node::core::{NodeCore, Outcome};
use metatopia_scenarios::{Cluster, NetConfig, NodeId, Time};
use metatopia_sim::event::account_of;
use metatopia_sim::genesis::{DemoSpec, demo_key, demo_world};
use metatopia_sim::governance::{Role, role_of};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::rules::RuleHost;
use metatopia_sim::state::DAY_MS;
use metatopia_sim::{AccountId, AdminAct, ChatRange, EventId, Hash32, Payload, SignedEvent, Sim, SimId, Tick};

const MS: Time = 1_000;
/// Virtual (BFT) milliseconds per sim day, and the scale that makes it so.
const DAY_BFT_MS: u64 = 400;
const SCALE: u64 = DAY_MS / DAY_BFT_MS;
const EPOCH_TICKS: u64 = 40;

type Node = CoreProcess<Validator, RuleHost, KinematicPhysics>;

fn node_key(i: u16) -> SigningKey {
    let mut b = [7u8; 32];
    b[..2].copy_from_slice(&i.to_le_bytes());
    SigningKey::from_bytes(&b)
}

/// 20 Hz ticks, timeouts as the node's, one shared signature cache.
fn consensus_config() -> Config {
    Config {
        period_us: 50 * MS,
        leader_timeout_us: 250 * MS,
        notarize_timeout_us: 500 * MS,
        retry_us: 250 * MS,
        sig_cache: Arc::new(SigCache::default()),
        max_exec_lag: Some(4),
        ..Config::default()
    }
}

struct Person {
    key: SigningKey,
    nonce: u64,
}

impl Person {
    fn new(key: SigningKey) -> Person {
        Person { key, nonce: 0 }
    }
    fn id(&self) -> AccountId {
        account_of(&self.key)
    }
    fn sign(&mut self, payload: Payload) -> SignedEvent {
        self.nonce += 1;
        SignedEvent::new(&self.key, SimId(1), self.nonce, payload)
    }
    fn login(&mut self, name: &str) -> SignedEvent {
        self.sign(Payload::Login { name: name.into() })
    }
    fn act(&mut self, act: AdminAct) -> SignedEvent {
        self.sign(Payload::Admin(act))
    }
}

struct World {
    c: Cluster<Node>,
}

fn world(seed: u64) -> (World, Person) {
    let n = 4u16;
    let demo = demo_world(DemoSpec { seed: 10, objects: 20, players: 0, ..DemoSpec::default() });
    let keys: Vec<_> = (0..n).map(|i| node_key(i).verifying_key()).collect();
    let mut genesis = demo.world.clone();
    genesis.set_genesis_validators(keys.iter().map(|k| AccountId(k.to_bytes())));
    genesis.set_genesis_settings(metatopia_sim::Settings {
        epoch_ticks: EPOCH_TICKS,
        tick_rate_hz: 20,
        ..genesis.settings().clone()
    });
    let nodes_of: Arc<BTreeMap<u16, Vec<NodeId>>> = Arc::new((0..n).map(|i| (i, vec![u32::from(i)])).collect());
    let cfg = consensus_config();
    let nodes = (0..n)
        .map(|i| {
            let v = Validator::new(cfg.clone(), node_key(i), keys.clone(), 0);
            let sim = Sim::new(genesis.clone(), RuleHost::default(), KinematicPhysics::default(), 1).unwrap();
            let core = NodeCore::new(v, sim, 1).with_time_scale(SCALE, cfg.genesis_time_ms);
            CoreProcess::new(core, nodes_of.clone())
        })
        .collect();
    let net = NetConfig { delay_min_us: 300, delay_max_us: 6 * MS, loss_ppm: 10_000, duplicate_ppm: 10_000 };
    (World { c: Cluster::new(seed, net, nodes) }, Person::new(demo.admin))
}

impl World {
    /// Run until sim time reaches `day` days (on the cluster's clock).
    fn until_day(&mut self, day: f64) {
        let t = (day * DAY_BFT_MS as f64 * 1000.0) as Time;
        if t > self.c.now() {
            self.c.run_until(t, |_| {});
        }
    }

    /// Submit through `node` and run until every node executed it; the outcome, the same on all.
    fn submit(&mut self, node: NodeId, e: &SignedEvent) -> Outcome {
        let id = e.id();
        let bytes = metatopia_sim::codec::encode(e);
        self.c.with_node(node, |p, now, out| {
            assert_eq!(p.submit(now, vec![bytes], out), 1, "node {node} refused the submission");
        });
        self.outcome(id).unwrap_or_else(|| panic!("{:?} was not executed within 2 s", e.body.payload))
    }

    /// Whether `node` refuses `e` at the door (what execution would refuse whatever the tick).
    fn refused_at_door(&mut self, node: NodeId, e: &SignedEvent) -> bool {
        let bytes = metatopia_sim::codec::encode(e);
        let mut taken = 1;
        self.c.with_node(node, |p, now, out| taken = p.submit(now, vec![bytes], out));
        taken == 0
    }

    /// Run (up to 2 s of virtual time) until every node has an outcome for `id`; they must agree.
    fn outcome(&mut self, id: EventId) -> Option<Outcome> {
        let end = self.c.now() + 2_000 * MS;
        while self.c.now() < end {
            let t = self.c.now() + 50 * MS;
            self.c.run_until(t, |_| {});
            let all: Vec<Option<Outcome>> =
                (0..4).map(|i| self.c.node(i).unwrap().core.outcome(&id).cloned()).collect();
            if all.iter().all(Option::is_some) {
                assert!(all.iter().all(|o| *o == all[0]), "nodes disagree on an outcome: {all:?}");
                return all[0].clone();
            }
        }
        None
    }

    /// Every node's governance view now, asserted equal; the role of `who` from it.
    fn role(&self, who: &AccountId) -> Role {
        let views: Vec<_> = (0..4).map(|i| self.c.node(i).unwrap().core.sim().world()).collect();
        let ticks: Vec<Tick> = views.iter().map(|w| w.tick()).collect();
        // Nodes may be a tick or two apart; compare the roles of the slowest one's tick.
        let w = views[ticks.iter().enumerate().min_by_key(|(_, t)| **t).unwrap().0];
        role_of(w, who, w.time_ms())
    }

    fn executed_roots(&self) -> Vec<BTreeMap<Tick, Hash32>> {
        (0..4).map(|i| self.c.node(i).unwrap().executed_roots()).collect()
    }
}

fn refused(o: &Outcome, needle: &str) -> bool {
    matches!(o, Outcome::Refused { reason, .. } if reason.contains(needle))
}

fn assert_executed(o: &Outcome, what: &str) {
    assert!(matches!(o, Outcome::Executed { .. }), "{what}: {o:?}");
}

#[test]
fn the_bob_and_charlie_story_on_four_nodes_over_accelerated_days() {
    let (mut w, mut admin) = world(21);
    let mut charlie = Person::new(demo_key(5, 1));
    let mut bob = Person::new(demo_key(5, 2));
    let mut dave = Person::new(demo_key(5, 3));
    let mut eve = Person::new(demo_key(5, 4));
    let (c, b, d, e) = (charlie.id(), bob.id(), dave.id(), eve.id());

    // Day 0 the admin logs in; Charlie joins day 1, Bob day 2, Dave and Eve day 3. Each act goes
    // through a different node.
    let ev = admin.login("admin");
    assert_executed(&w.submit(0, &ev), "admin login");
    w.until_day(1.0);
    assert_executed(&w.submit(1, &charlie.login("charlie")), "charlie joins");
    w.until_day(2.0);
    assert_executed(&w.submit(2, &bob.login("bob")), "bob joins");
    w.until_day(3.0);
    assert_executed(&w.submit(3, &dave.login("dave")), "dave joins");
    assert_executed(&w.submit(0, &eve.login("eve")), "eve joins");

    // Settings are an admin act too: a kick now lasts two days.
    let mut settings = w.c.node(0).unwrap().core.sim().world().settings().clone();
    settings.kick_cooldown_ms = 2 * DAY_MS;
    assert_executed(&w.submit(1, &admin.act(AdminAct::SetSettings(settings))), "settings");

    // While the admin is present a member's act is refused, and nobody is temp admin.
    let o = w.submit(1, &dave.act(AdminAct::Ban { account: e }));
    assert!(refused(&o, "needs the admin or temp-admin role"), "{o:?}");
    assert_eq!(w.role(&b), Role::Member);

    // The admin bans Eve, then unbans her; a replay of the ban changes nothing.
    let ban = admin.act(AdminAct::Ban { account: e });
    assert_executed(&w.submit(2, &ban), "ban");
    // A banned account's input is refused at the door: it never reaches the pool.
    let chat = eve.sign(Payload::Chat { channel: 0, range: ChatRange::Say, text: "hi".into() });
    assert!(w.refused_at_door(3, &chat), "a banned account's input is refused at the door");
    assert_executed(&w.submit(2, &admin.act(AdminAct::Unban { account: e })), "unban");
    w.until_day(4.0);
    let bytes = metatopia_sim::codec::encode(&ban);
    w.c.with_node(1, |p, now, out| {
        p.submit(now, vec![bytes], out);
    });
    w.until_day(5.0);
    for i in 0..4 {
        assert!(
            !w.c.node(i).unwrap().core.sim().world().governance().banned.contains(&e),
            "node {i}: the replayed ban took effect"
        );
    }
    assert_executed(&w.submit(0, &eve.login("eve")), "eve, unbanned, logs in");

    // Bob and Dave keep logging in; Charlie and the admin do not.
    for day in [10.0, 20.0, 28.0] {
        w.until_day(day);
        assert_executed(&w.submit(3, &bob.login("bob")), "bob");
        assert_executed(&w.submit(2, &dave.login("dave")), "dave");
    }

    // Past day 30 (X) the admin is absent: Bob, the most senior account active within 7 days
    // (Y), is temp admin. Charlie joined earlier but was last seen on day 1.
    w.until_day(31.5);
    assert_eq!(w.role(&b), Role::TempAdmin);
    assert_eq!(w.role(&c), Role::Member);
    let g = governance_view(w.c.node(0).unwrap().core.sim().world());
    assert_eq!(g.temp_admin, Some(b.to_string()));
    assert!(g.admin_absent && g.admin_days_absent >= 30, "{g:?}");

    // Bob acts as admin: kicks Eve, whose login within the cooldown is refused; Dave still
    // may not act. The temp admin's acts do not reset the admin's absence.
    assert_executed(&w.submit(1, &bob.act(AdminAct::Kick { account: e })), "bob kicks eve");
    let o = w.submit(2, &eve.login("eve"));
    assert!(refused(&o, "kicked"), "{o:?}");
    let o = w.submit(0, &dave.act(AdminAct::Kick { account: b }));
    assert!(refused(&o, "needs the admin or temp-admin role"), "{o:?}");
    assert_eq!(w.role(&admin.id()), Role::Admin);
    assert!(governance_view(w.c.node(3).unwrap().core.sim().world()).admin_absent);

    // Charlie, more senior, logs in: Charlie is temp admin at once, Bob no longer.
    w.until_day(32.0);
    assert_executed(&w.submit(3, &charlie.login("charlie")), "charlie returns");
    assert_eq!(w.role(&c), Role::TempAdmin);
    assert_eq!(w.role(&b), Role::Member);
    let o = w.submit(1, &bob.act(AdminAct::Ban { account: d }));
    assert!(refused(&o, "needs the admin or temp-admin role"), "bob lost the role: {o:?}");

    // The temp admin makes itself the permanent admin; the old admin, back, is a member whose
    // acts are refused.
    assert_executed(&w.submit(0, &charlie.act(AdminAct::TransferAdmin { to: c })), "charlie takes over");
    assert_eq!(w.role(&c), Role::Admin);
    w.until_day(33.0);
    let old = admin.id();
    assert_executed(&w.submit(2, &admin.login("old admin")), "the old admin logs in");
    assert_eq!(w.role(&old), Role::Member);
    let o = w.submit(2, &admin.act(AdminAct::Ban { account: c }));
    assert!(refused(&o, "needs the admin or temp-admin role"), "{o:?}");

    // Charlie bans Dave: Dave's inputs are refused, at the door of any node.
    assert_executed(&w.submit(3, &charlie.act(AdminAct::Ban { account: d })), "charlie bans dave");
    for node in 0..4 {
        let login = dave.login("dave");
        assert!(w.refused_at_door(node, &login), "node {node} took a banned account's login");
    }

    // Every node executed the same ticks with the same roots (roles included: they are state).
    let all = w.executed_roots();
    let longest = all.iter().max_by_key(|m| m.len()).unwrap();
    assert!(longest.len() > 260, "ran {} ticks", longest.len());
    for (i, mine) in all.iter().enumerate() {
        assert!(mine.len() + 5 >= longest.len(), "node {i} fell behind");
        for (t, r) in mine {
            assert_eq!(longest.get(t), Some(r), "node {i} differs at tick {t}");
        }
    }
}

#[test]
fn validator_changes_wait_for_the_epoch_boundary_on_every_node() {
    let (mut w, mut admin) = world(22);
    let newcomer = AccountId(node_key(9).verifying_key().to_bytes());
    let leaving = AccountId(node_key(3).verifying_key().to_bytes());
    let mut dave = Person::new(demo_key(5, 3));
    assert_executed(&w.submit(0, &admin.login("admin")), "admin login");
    assert_executed(&w.submit(1, &dave.login("dave")), "dave joins");
    let o = w.submit(2, &dave.act(AdminAct::AdmitValidator { key: account_of(&dave.key) }));
    assert!(refused(&o, "needs the admin or temp-admin role"), "a member may not admit validators: {o:?}");

    let o = w.submit(1, &admin.act(AdminAct::AdmitValidator { key: newcomer }));
    let Outcome::Executed { tick } = o else { panic!("admit: {o:?}") };
    assert_executed(&w.submit(2, &admin.act(AdminAct::RemoveValidator { key: leaving })), "remove");
    let boundary = (tick.0 / EPOCH_TICKS + 1) * EPOCH_TICKS;
    // Before the boundary: pending on every node; after it: applied on every node.
    for i in 0..4 {
        let world = w.c.node(i).unwrap().core.sim().world();
        if world.tick().0 <= boundary {
            let g = world.governance();
            assert!(!g.validators.contains(&newcomer) && g.validators.contains(&leaving), "node {i} too early");
            assert_eq!(g.pending_validators.get(&newcomer), Some(&true));
        }
    }
    let end = w.c.now() + (EPOCH_TICKS + 10) * 50 * MS;
    w.c.run_until(end, |_| {});
    let sets: Vec<_> =
        (0..4).map(|i| w.c.node(i).unwrap().core.sim().world().governance().validators.clone()).collect();
    for (i, s) in sets.iter().enumerate() {
        assert!(s.contains(&newcomer) && !s.contains(&leaving), "node {i}: {s:?}");
        assert_eq!(*s, sets[0]);
    }
}

/// Five nodes, four of them validators at genesis, all following governance epoch by epoch.
fn epoch_cluster(seed: u64) -> (Cluster<Epochal>, Person) {
    let peers: Vec<_> = (0..5).map(|i| node_key(i).verifying_key()).collect();
    let demo = demo_world(DemoSpec { seed: 10, objects: 20, players: 0, ..DemoSpec::default() });
    let mut genesis = demo.world.clone();
    genesis.set_genesis_validators(peers[..4].iter().map(|k| AccountId(k.to_bytes())));
    genesis.set_genesis_settings(metatopia_sim::Settings {
        epoch_ticks: EPOCH_TICKS,
        tick_rate_hz: 20,
        ..genesis.settings().clone()
    });
    let nodes_of: Arc<BTreeMap<u16, Vec<NodeId>>> = Arc::new((0..5).map(|i| (i, vec![u32::from(i)])).collect());
    let cfg = consensus_config();
    let nodes = (0..5)
        .map(|i| {
            let e = Epochs::new(cfg.clone(), node_key(i), peers.clone(), peers[..4].to_vec(), EPOCH_TICKS, 0);
            let sim = Sim::new(genesis.clone(), RuleHost::default(), KinematicPhysics::default(), 1).unwrap();
            CoreProcess::new(NodeCore::new(Actor::Epochs(Box::new(e)), sim, 1), nodes_of.clone())
        })
        .collect();
    let net = NetConfig { delay_min_us: 300, delay_max_us: 5 * MS, loss_ppm: 5_000, duplicate_ppm: 5_000 };
    (Cluster::new(seed, net, nodes), Person::new(demo.admin))
}

type Epochal = CoreProcess<Actor, RuleHost, KinematicPhysics>;

fn epochs_of(c: &Cluster<Epochal>, i: NodeId) -> &Epochs {
    match c.node(i).unwrap().core.agreement() {
        Actor::Epochs(e) => e,
        _ => unreachable!(),
    }
}

fn tick_of(c: &Cluster<Epochal>, i: NodeId) -> u64 {
    c.node(i).map_or(0, |p| p.core.sim().world().tick().0)
}

fn submit_and_wait(c: &mut Cluster<Epochal>, e: &SignedEvent) -> Outcome {
    let id = e.id();
    let bytes = metatopia_sim::codec::encode(e);
    c.with_node(1, |p, now, out| {
        p.submit(now, vec![bytes], out);
    });
    for _ in 0..60 {
        let t = c.now() + 50 * MS;
        c.run_until(t, |_| {});
        if let Some(o) = c.node(1).unwrap().core.outcome(&id) {
            return o.clone();
        }
    }
    panic!("not executed")
}

#[test]
fn an_admitted_validator_votes_from_the_epoch_boundary_and_a_removed_one_stops() {
    let (mut c, mut admin) = epoch_cluster(31);
    let newcomer = AccountId(node_key(4).verifying_key().to_bytes());
    let leaving = AccountId(node_key(3).verifying_key().to_bytes());
    assert_executed(&submit_and_wait(&mut c, &admin.login("admin")), "admin login");
    assert_executed(&submit_and_wait(&mut c, &admin.act(AdminAct::AdmitValidator { key: newcomer })), "admit");
    assert_executed(&submit_and_wait(&mut c, &admin.act(AdminAct::RemoveValidator { key: leaving })), "remove");
    assert!(tick_of(&c, 1) < EPOCH_TICKS, "the acts came before the first boundary");
    // Before the boundary node 4 only follows; node 3 votes.
    assert_eq!(epochs_of(&c, 4).index(), None);
    assert!(epochs_of(&c, 3).index().is_some());

    // Past the boundary: a new epoch on every node, node 4 in the set, node 3 out.
    while (0..5).any(|i| tick_of(&c, i) < EPOCH_TICKS + 20) {
        let t = c.now() + 100 * MS;
        c.run_until(t, |_| {});
        assert!(c.now() < 30_000 * MS, "stuck at ticks {:?}", (0..5).map(|i| tick_of(&c, i)).collect::<Vec<_>>());
    }
    for i in 0..5 {
        let e = epochs_of(&c, i);
        assert_eq!(e.epoch(), 1, "node {i}");
        let set: Vec<AccountId> = e.keys().iter().map(|k| AccountId(k.to_bytes())).collect();
        assert!(set.contains(&newcomer) && !set.contains(&leaving), "node {i}: {set:?}");
    }
    assert!(epochs_of(&c, 4).index().is_some(), "node 4 votes now");
    assert_eq!(epochs_of(&c, 3).index(), None, "node 3 only follows now");

    // Proof that node 4's votes count: with node 0 (in the set) and node 3 (out of it) down,
    // the set {0, 1, 2, 4} still has 3 of 4 — the sim goes on only because node 4 votes.
    c.schedule_fault(c.now() + MS, metatopia_scenarios::Fault::Crash(0));
    c.schedule_fault(c.now() + MS, metatopia_scenarios::Fault::Crash(3));
    let before = tick_of(&c, 1);
    let t = c.now() + 6_000 * MS;
    c.run_until(t, |_| {});
    let after = tick_of(&c, 1);
    assert!(after >= before + 40, "ticks went from {before} to {after} with nodes 0 and 3 down");

    // Every node, observer or validator, executed the same roots all along.
    let all: Vec<_> = [1u32, 2, 4].iter().map(|i| c.node(*i).unwrap().executed_roots()).collect();
    for (k, mine) in all.iter().enumerate() {
        assert!(mine.len() as u64 >= after - 2, "node {k} executed {}", mine.len());
        for (t, r) in mine {
            assert_eq!(all[0].get(t).unwrap_or(r), r, "differs at tick {t}");
        }
    }
}

#[test]
fn without_the_admission_the_same_two_crashes_stop_the_sim() {
    // The control: no change of set, nodes 0 and 3 of {0, 1, 2, 3} down: no quorum.
    let (mut c, _) = epoch_cluster(32);
    let t = c.now() + 2_000 * MS;
    c.run_until(t, |_| {});
    c.schedule_fault(c.now() + MS, metatopia_scenarios::Fault::Crash(0));
    c.schedule_fault(c.now() + MS, metatopia_scenarios::Fault::Crash(3));
    let t = c.now() + 500 * MS;
    c.run_until(t, |_| {});
    let before = tick_of(&c, 1);
    let t = c.now() + 4_000 * MS;
    c.run_until(t, |_| {});
    assert!(tick_of(&c, 1) <= before + 1, "went from {before} to {} without a quorum", tick_of(&c, 1));
}

/// A validator cut off for eight seconds (four epochs of 40 ticks) is left in an epoch its
/// peers have left: they answer only for their current and previous epochs, so it could never
/// catch up (it stayed at tick 18 in epoch 0 for good). After 10 s with f+1 of its set speaking
/// for a later epoch, it joins theirs as a new node does (a later epoch only: it may have voted
/// in its own) from a snapshot 2f+1 certify, and runs in step from there.
#[test]
fn a_validator_left_behind_several_epochs_rejoins_its_peers_epoch() {
    let (mut c, _) = epoch_cluster(33);
    c.add_partition(metatopia_scenarios::Partition {
        from: 1_000 * MS,
        until: 9_000 * MS,
        groups: vec![[3].into_iter().collect(), [0, 1, 2, 4].into_iter().collect()],
    });
    let t = c.now() + 30_000 * MS;
    c.run_until(t, |_| {});
    let p = c.node(3).unwrap();
    assert_eq!(p.core.stats().stranded, 1);
    let joined = p.log.iter().find_map(|o| match o {
        metatopia_node::core::CoreOutput::Resynced { tick, certified_by, joined, .. } => {
            Some((*tick, *certified_by, *joined))
        }
        _ => None,
    });
    let (tick, certified_by, joined) = joined.expect("node 3 took its peers' state");
    assert!(joined && certified_by >= 3, "joined from a snapshot 2f+1 = 3 certify: {certified_by}");
    assert_eq!(epochs_of(&c, 3).epoch(), epochs_of(&c, 0).epoch());
    assert!(epochs_of(&c, 3).index().is_some(), "node 3 votes again");
    let (mine, theirs) = (p.executed_roots(), c.node(0).unwrap().executed_roots());
    let after: Vec<_> = mine.range(tick..).collect();
    assert!(after.len() > 50, "node 3 executed {} ticks after tick {tick}", after.len());
    for (t, r) in after {
        assert_eq!(theirs.get(t), Some(r), "node 3 at tick {t}");
    }
    assert!(tick_of(&c, 3) + 4 >= tick_of(&c, 0), "node 3 at {}, node 0 at {}", tick_of(&c, 3), tick_of(&c, 0));
}
