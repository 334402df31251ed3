//! One sim's scenario in the deterministic cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use metatopia_consensus::mocks::{Behaviour, Byzantine};
use metatopia_consensus::{Config, SigningKey};
use metatopia_scenarios::spec::{Action, Scenario};
use metatopia_scenarios::{Cluster, Fault, NodeId, Time};
use metatopia_scripting::RhaiHost;
use metatopia_sim::event::account_of;
use metatopia_sim::genesis::EventGen;
use metatopia_sim::governance::{Role, role_of};
use metatopia_sim::state::DAY_MS;
use metatopia_sim::{AccountId, EventId, Hash32, SignedEvent, Sim, SimId, World};

use crate::simnet::{Actor, CoreProcess};
use metatopia_node::core::epochs::Epochs;
use metatopia_node::core::{CoreOutput, NodeCore};
use metatopia_node::world::{AnyPhysics, Genesis, Options, account_key, genesis, validator_key};

use crate::scenario::common::*;
use metatopia_scenarios::judge::{Agreement, Observed, StepOutcome, compare_roots, judge, role_name};
use metatopia_scenarios::spec::{Expect, ExpectedRole};

struct Account {
    key: SigningKey,
    nonce: u64,
    last: Option<SignedEvent>,
}

/// Run a scenario in the deterministic cluster.
pub fn run(
    spec: &Scenario,
    text: &str,
    opts: &Options,
    progress: &mut dyn FnMut(Time, Time),
) -> anyhow::Result<(Report, Recording)> {
    let seed = opts.seed;
    let n = spec.validators.count;
    let w = &spec.world;
    anyhow::ensure!(
        spec.bots.events_per_tick == 0 || w.random_players > 0,
        "bots need players: set world.random_players"
    );
    // Every node's key (validators first, then observers); the genesis set is the validators'.
    let total = n + spec.validators.observers;
    let keys: Vec<SigningKey> = (0..total).map(validator_key).collect();
    let public: Vec<_> = keys.iter().map(|k| k.verifying_key()).collect();
    let genesis_set: Vec<_> = public[..usize::from(n)].to_vec();
    let accounts: Vec<AccountId> = keys[..usize::from(n)].iter().map(account_of).collect();
    let g = genesis(spec, seed, opts, &accounts)?;
    let faults: Vec<_> = spec.faults.iter().map(|f| f.get_ref().clone()).collect();
    let fault_of = |kind: &str| -> BTreeMap<u16, metatopia_scenarios::spec::FaultSpec> {
        faults.iter().filter(|f| f.kind == kind).filter_map(|f| f.node.map(|x| (x, f.clone()))).collect()
    };
    let (byzantine, twins, diverging) = (fault_of("byzantine"), fault_of("twin"), fault_of("diverge"));
    // Observers that start late, with nothing on disk, and join the running sim.
    let joiners: std::collections::BTreeSet<u16> = fault_of("join").into_keys().collect();

    let period_us = 1_000_000 / u64::from(w.tick_rate_hz);
    let cfg = consensus_config(period_us, w.start_unix_ms);
    // The nodes' clocks start at the scenario's real-looking time.
    let start_us = w.start_unix_ms.saturating_mul(1000);
    let epoch_ticks = g.world.settings().epoch_ticks;
    // Cluster nodes: the validators, the observers, then a twin per `twin` fault.
    let mut nodes_of: BTreeMap<u16, Vec<NodeId>> = (0..total).map(|i| (i, vec![u32::from(i)])).collect();
    let mut key_of_node: Vec<u16> = (0..total).collect();
    for t in twins.keys() {
        let id = key_of_node.len() as NodeId;
        nodes_of.entry(*t).or_default().push(id);
        key_of_node.push(*t);
    }
    let nodes_of = Arc::new(nodes_of);
    let other_world = || -> anyhow::Result<World> {
        let other = Scenario { seed: seed ^ 0xd1fe, ..spec.clone() };
        Ok(genesis(&other, seed ^ 0xd1fe, opts, &accounts)?.world)
    };
    // Each node's data directory on a simulated disk, written by the node's own store.
    let disks = Disks::new(key_of_node.len());
    let make = |node: usize, world: World, actor: Actor| -> anyhow::Result<Node> {
        let sim = Sim::new(world, RhaiHost::default(), AnyPhysics::of(&w.physics), 1)
            .map_err(|e| anyhow::anyhow!("node {node}: {e}"))?;
        let core = NodeCore::new(actor, sim, 1).with_time_scale(w.time_scale, w.start_unix_ms).defer_execution();
        let (store, _) = disks.open(node as NodeId)?;
        Ok(CoreProcess::new(core, nodes_of.clone()).with_store(store))
    };
    let mut procs = Vec::new();
    for (node, k) in key_of_node.iter().enumerate() {
        let k = *k;
        let actor = match byzantine.get(&k) {
            Some(f) => {
                let behaviour = match f.behaviour.as_deref() {
                    Some("equivocate") => Behaviour::Equivocate,
                    Some("double_vote") => Behaviour::DoubleVote,
                    Some("invalid_signatures") => Behaviour::InvalidSignatures,
                    _ => Behaviour::Withhold,
                };
                let c = Config { max_exec_lag: None, ..cfg.clone() };
                Actor::Byz(
                    Box::new(Byzantine::new(c, keys[k as usize].clone(), genesis_set.clone(), start_us, behaviour)),
                    n as usize,
                )
            }
            None => Actor::Epochs(Box::new(Epochs::new(
                cfg.clone(),
                keys[k as usize].clone(),
                public.clone(),
                genesis_set.clone(),
                epoch_ticks,
                start_us,
            ))),
        };
        let world = if diverging.contains_key(&k) { other_world()? } else { g.world.clone() };
        procs.push(make(node, world, actor)?);
    }
    let mut c = Cluster::starting_at(seed, net_config(spec), procs, start_us);
    // A crashed node comes back from its disk, as a node's restart does: the newest snapshot
    // that loads, the agreement's state, the log since the snapshot.
    {
        let (cfg, keys, public, genesis_world) = (cfg.clone(), keys.clone(), public.clone(), g.world.clone());
        let (physics, scale, nodes_of) = (w.physics.clone(), w.time_scale, nodes_of.clone());
        let anchor_ms = w.start_unix_ms;
        let key_of_node = key_of_node.clone();
        let genesis_n = usize::from(n);
        let joiners = joiners.clone();
        let disks = disks.clone();
        let dead =
            (genesis_world.clone(), w.physics.clone(), nodes_of.clone(), cfg.clone(), keys[0].clone(), public.clone());
        let restart = move |id: NodeId, now: Time| -> anyhow::Result<Node> {
            let k = key_of_node[id as usize] as usize;
            let (store, restored) = disks.open(id)?;
            // A joiner's first start: nothing of its own yet.
            let join =
                joiners.contains(&(k as u16)) && restored.recovery.records.is_empty() && restored.consensus.is_none();
            let fresh = || {
                let set = public[..genesis_n].to_vec();
                Epochs::new(cfg.clone(), keys[k].clone(), public.clone(), set, epoch_ticks, now)
            };
            let e = match &restored.consensus {
                Some(b) if !join => {
                    Epochs::restore(cfg.clone(), keys[k].clone(), public.clone(), now, b).unwrap_or_else(fresh)
                }
                _ => fresh(),
            };
            let sim = restored_sim(&store, &genesis_world, &physics)?;
            let mut core =
                NodeCore::new(Actor::Epochs(Box::new(e)), sim, 1).with_time_scale(scale, anchor_ms).defer_execution();
            if join {
                core = core.joining();
            }
            replay_log(&mut core, &restored.recovery.records);
            let mut p = CoreProcess::new(core, nodes_of.clone()).with_store(store);
            p.log = disks.history(id, &restored.recovery.records);
            Ok(p)
        };
        c.set_restarter(Box::new(move |id, now, _| {
            restart(id, now).unwrap_or_else(|why| {
                // It does not start (its disk is unreadable): it stays down, saying why.
                let (world, physics, nodes_of, cfg, key, public) = &dead;
                let sim = Sim::new(world.clone(), RhaiHost::default(), AnyPhysics::of(physics), 1)
                    .expect("the genesis world loaded before");
                let set = public[..genesis_n].to_vec();
                let e = Epochs::new(cfg.clone(), key.clone(), public.clone(), set, epoch_ticks, now);
                let mut p = CoreProcess::new(NodeCore::new(Actor::Epochs(Box::new(e)), sim, 1), nodes_of.clone());
                p.failed = Some(format!("cannot restart from its disk: {why:#}"));
                p
            })
        }));
    }
    for f in &faults {
        if !schedule_network_fault(&mut c, f) && f.kind == "join" {
            // Down from the start (before it has done anything), up at `at_secs`.
            let node = NodeId::from(f.node.unwrap_or_default());
            c.schedule_fault(0, Fault::Crash(node));
            c.schedule_fault(((f.at_secs * 1e6) as Time).max(1), Fault::Restart(node));
        }
    }
    let honest: Vec<NodeId> = (0..total)
        .filter(|k| !byzantine.contains_key(k) && !twins.contains_key(k) && !diverging.contains_key(k))
        .map(NodeId::from)
        .collect();

    // Drive: every tick period, submit the steps that are due and the bots' events.
    let mut accounts: BTreeMap<String, Account> = spec
        .accounts
        .iter()
        .map(|a| (a.get_ref().name.clone(), Account { key: account_key(&a.get_ref().name), nonce: 0, last: None }))
        .collect();
    let mut steps: Vec<(usize, &metatopia_scenarios::spec::StepSpec)> =
        spec.steps.iter().map(|s| (Scenario::line_of(text, s.span()), s.get_ref())).collect();
    steps.sort_by_key(|(_, s)| s.at_tick);
    let mut pending = std::collections::VecDeque::from(steps);
    let mut labelled: BTreeMap<String, EventId> = BTreeMap::new();
    // Steps a node refused at the door, with the reason.
    let mut at_door: BTreeMap<String, String> = BTreeMap::new();
    let mut submitted = 0;
    let mut bots = (spec.bots.events_per_tick > 0).then(|| EventGen::new(&g.demo, seed ^ 0xb075));
    // When in each period the bots submit: drawn, as clients are not in step with the schedule
    // (submitted at the periods' edges, every batch just missed, or just caught, a block).
    let mut bot_phase = metatopia_sim::rng::DetRng::from_u64(seed ^ 0xb075_f00d);
    // Roles seen at their tick: (account, tick) -> (role, detail).
    let mut roles: Roles = BTreeMap::new();
    let end = (spec.duration_secs * 1e6) as Time;
    let mut t = 0;
    while t < end {
        if let Some(b) = bots.as_mut() {
            c.run_until(t + bot_phase.below(period_us), |_| {});
            let via = NodeId::from(spec.bots.node);
            c.with_node(via, |p, now, out| {
                let w = p.core.sim().world();
                let batch = b.batch(w, w.tick(), spec.bots.events_per_tick as usize);
                p.submit(now, batch.events.iter().map(metatopia_sim::codec::encode).collect(), out);
            });
        }
        let second = t / 1_000_000;
        t = (t + period_us).min(end);
        c.run_until(t, |_| {});
        progress(t, end);
        if opts.timeline && t / 1_000_000 > second {
            timeline(&c, t, start_us, key_of_node.len());
        }
        // Steps due at the `via` node's tick (it must be up).
        while let Some((line, s)) = pending.front().copied() {
            let via = NodeId::from(s.via);
            let Some(p) = c.node(via) else { break };
            if p.core.sim().world().tick().0 < s.at_tick {
                break;
            }
            pending.pop_front();
            let acc = accounts.get_mut(&s.by).expect("checked by the spec");
            let event = match s.action {
                Action::Replay => match acc.last.clone() {
                    Some(e) => e,
                    None => anyhow::bail!("line {line}: {} has nothing to replay yet", s.by),
                },
                _ => {
                    let avatar = p.core.sim().world().account(&account_of(&acc.key)).and_then(|a| a.avatar);
                    let payload =
                        payload(s, &g.objects, avatar, opts, &public).with_context(|| format!("line {line}"))?;
                    acc.nonce += 1;
                    SignedEvent::new(&acc.key, SimId(1), acc.nonce, payload)
                }
            };
            if let Some(l) = &s.label {
                labelled.insert(l.clone(), event.id());
            }
            acc.last = Some(event.clone());
            let bytes = metatopia_sim::codec::encode(&event);
            let size = bytes.len() as u32;
            let mut taken = 1;
            c.with_node(via, |p, now, out| {
                taken = p.submit(now, vec![bytes], out);
                // Refused at the door (what execution would refuse anyway): an outcome too.
                if taken == 0
                    && let Some(l) = &s.label
                {
                    let why = metatopia_sim::pipeline::check_at_door(p.core.sim().world(), &event, size)
                        .err()
                        .map_or_else(|| "refused at the door".to_owned(), |r| format!("refused at the door: {r}"));
                    at_door.insert(l.clone(), why);
                }
            });
            submitted += 1;
        }
        // Roles at their tick, on the first honest node that is there.
        for e in &spec.expect {
            let Expect::Role { account, at_tick, .. } = e.get_ref() else { continue };
            if roles.contains_key(&(account.clone(), *at_tick)) {
                continue;
            }
            let Some(world) =
                honest.iter().filter_map(|h| c.node(*h)).map(|p| p.core.sim().world()).find(|w| w.tick().0 >= *at_tick)
            else {
                continue;
            };
            let who = account_of(&account_key(account));
            let role = match role_of(world, &who, world.time_ms()) {
                Role::Admin => ExpectedRole::Admin,
                Role::TempAdmin => ExpectedRole::TempAdmin,
                Role::Member => ExpectedRole::Member,
            };
            let detail = format!(
                "at tick {} (day {:.1} after genesis)",
                world.tick(),
                world.time_ms().saturating_sub(world.governance().genesis_ms) as f64 / DAY_MS as f64
            );
            roles.insert((account.clone(), *at_tick), (role_name(role).to_owned(), detail));
        }
    }

    let up: Vec<&Node> = honest.iter().filter_map(|h| c.node(*h)).collect();
    anyhow::ensure!(!up.is_empty(), "no honest node is up at the end");
    let seen = Seen {
        c: &c,
        roots: up.iter().map(|p| p.executed_roots().into_iter().map(|(t, r)| (t.0, r)).collect()).collect(),
        up,
        g: &g,
        labelled: &labelled,
        at_door: &at_door,
        roles,
    };
    let mut verdicts = judge(spec, text, &seen);
    let honest_key = |v: u16| honest.iter().any(|h| key_of_node[*h as usize] == v);
    verdicts
        .insert(1, restarts_verdict(&disks, honest.iter().filter_map(|h| c.node(*h).map(|p| (*h, p))), &honest_key));
    let ticks = (0..c.len() as NodeId).map(|i| c.node(i).map(|p| p.core.sim().world().tick().0)).collect();
    let report = Report {
        name: spec.name.clone(),
        seed,
        ticks,
        honest: honest.clone(),
        steps_submitted: submitted,
        trace: metatopia_sim::ids::hex(&c.trace_hash()),
        verdicts,
        net: c.stats(),
    };
    // The recording: the first honest node that is up.
    let rec_node = honest.iter().find_map(|h| c.node(*h)).context("no honest node is up at the end")?;
    Ok((report, recording(rec_node, &g.world, w)?))
}

/// Roles seen at their tick: (account, tick) -> (role, how it was seen).
type Roles = BTreeMap<(String, u64), (String, String)>;

/// What one sim's cluster run saw, for the judge.
struct Seen<'a> {
    c: &'a Cluster<Node>,
    /// The honest nodes up at the end, and their executed roots.
    up: Vec<&'a Node>,
    roots: Vec<BTreeMap<u64, Hash32>>,
    g: &'a Genesis,
    labelled: &'a BTreeMap<String, EventId>,
    at_door: &'a BTreeMap<String, String>,
    roles: Roles,
}

impl Seen<'_> {
    /// The first snapshot catch-up of a node (`joined`: as a new node): tick and certifiers.
    fn catch_up(&self, node: u16, joined: bool) -> Option<(&Node, u64, usize)> {
        let p = self.c.node(NodeId::from(node))?;
        let (tick, by) = p.log.iter().find_map(|o| match o {
            CoreOutput::Resynced { tick, certified_by, joined: j, .. } if *j || !joined => Some((*tick, *certified_by)),
            _ => None,
        })?;
        Some((p, tick.0, by))
    }
}

impl Observed for Seen<'_> {
    fn agreement(&self) -> Agreement {
        let (compared, bad) = compare_roots(&self.roots);
        Agreement {
            compared,
            differ: bad.map(|t| format!("roots differ at tick {t}")),
            scope: format!("across {} honest nodes", self.up.len()),
        }
    }

    fn ticks(&self) -> Vec<u64> {
        self.up.iter().map(|p| p.core.sim().world().tick().0).collect()
    }

    fn desynced(&self) -> Vec<u64> {
        self.up.iter().filter_map(|p| p.core.desynced().map(|t| t.0)).collect()
    }

    fn objects(&self) -> u64 {
        self.up[0].core.sim().world().objects().len() as u64
    }

    fn object_text(&self, name: &str) -> Result<Option<String>, String> {
        let world = self.up[0].core.sim().world();
        Ok(self.g.objects.get(name).and_then(|id| world.object(*id)).map(|o| o.text.clone()))
    }

    fn input_latency_us(&self) -> Result<Vec<Option<(u64, u64)>>, String> {
        Ok(self.up.iter().map(|p| p.core.input_latency_us()).collect())
    }

    fn chat_seen(&self, text: &str) -> Result<Vec<bool>, String> {
        Ok(self
            .up
            .iter()
            .map(|p| {
                p.log.iter().any(
                    |o| matches!(o, CoreOutput::Executed { chat, .. } if chat.iter().any(|l| l.text.contains(text))),
                )
            })
            .collect())
    }

    fn tick_costs(&self) -> Result<Vec<(u64, u64)>, String> {
        Ok(self
            .up
            .iter()
            .map(|p| {
                p.log.iter().fold((0, 0), |(ops, q), o| match o {
                    CoreOutput::Executed { script_operations, queued, .. } => {
                        (ops.max(*script_operations), q.max(u64::from(*queued)))
                    }
                    _ => (ops, q),
                })
            })
            .collect())
    }

    fn suspended(&self, object: &str) -> Result<Vec<Option<bool>>, String> {
        let id = self.g.objects.get(object).ok_or_else(|| format!("no object named {object:?}"))?;
        Ok(self.up.iter().map(|p| p.core.sim().world().script(*id).map(|s| s.suspended)).collect())
    }

    fn state_checks(&self) -> Result<Vec<Result<(), String>>, String> {
        Ok(self.up.iter().map(|p| p.core.sim().world().validate()).collect())
    }

    fn outcomes(&self, step: &str) -> Result<Option<Vec<Option<StepOutcome>>>, String> {
        if let Some(why) = self.at_door.get(step) {
            return Ok(Some(self.up.iter().map(|_| Some(StepOutcome::Refused(why.clone()))).collect()));
        }
        let Some(id) = self.labelled.get(step) else { return Ok(None) };
        Ok(Some(self.up.iter().map(|p| p.core.outcome(id).map(step_outcome)).collect()))
    }

    fn role_at(&self, account: &str, at_tick: u64) -> Result<Option<(String, String)>, String> {
        Ok(self.roles.get(&(account.to_owned(), at_tick)).cloned())
    }

    fn noticed_desync(&self, node: u16) -> Result<(bool, String), String> {
        let at = self.c.node(NodeId::from(node)).and_then(|p| {
            p.log.iter().find_map(|o| match o {
                CoreOutput::Desync(r) => Some(r.tick),
                _ => None,
            })
        });
        Ok((at.is_some(), format!("at tick {at:?}")))
    }

    fn caught_up(&self, node: u16, joined: bool) -> Result<(bool, String), String> {
        let what = if joined { "joined" } else { "resynced" };
        let Some((p, tick, by)) = self.catch_up(node, joined) else {
            return Ok((false, format!("never {what}")));
        };
        let mine: BTreeMap<u64, Hash32> = p.executed_roots().into_iter().map(|(t, r)| (t.0, r)).collect();
        let reference = &self.roots[0];
        // A joined node executes nothing before its snapshot; a resynced one is judged from it.
        let judged: Vec<(&u64, &Hash32)> = if joined { mine.iter().collect() } else { mine.range(tick..).collect() };
        let first = mine.keys().next().copied().unwrap_or(0);
        Ok(match judged.iter().find(|(t, r)| reference.get(t).is_some_and(|h| h != *r)) {
            Some((t, _)) => (false, format!("{what} at tick {tick}, but differs at tick {t}")),
            None if joined && first < tick => (false, format!("executed tick {first}, before its snapshot")),
            None => (
                if joined { judged.len() > 1 } else { !judged.is_empty() },
                format!("from tick {tick} (certified by {by}); {} ticks in step since", judged.len()),
            ),
        })
    }

    fn votes(&self, node: u16) -> Result<Option<(bool, String)>, String> {
        Ok(self.c.node(NodeId::from(node)).and_then(|p| match p.core.agreement() {
            Actor::Epochs(e) => {
                let is = e.index().is_some();
                Some((is, format!("{} in epoch {}", if is { "votes" } else { "follows" }, e.epoch())))
            }
            _ => None,
        }))
    }
}

/// One line a node: its tick and where its agreement stands (`--timeline`).
fn timeline(c: &Cluster<Node>, t: Time, start_us: Time, nodes: usize) {
    use metatopia_node::core::Agreement as _;
    for id in 0..nodes as NodeId {
        match c.node(id) {
            Some(p) => eprintln!(
                "{:>6.1} s ({} ms)  node {id}: tick {}{}, {}{}",
                t as f64 / 1e6,
                (start_us + t) / 1_000,
                p.core.sim().world().tick(),
                if p.core.resyncing() { " (taking a certified snapshot)" } else { "" },
                p.core.agreement().describe(),
                p.failed.as_deref().map_or(String::new(), |f| format!(" · stopped: {f}"))
            ),
            None => eprintln!("{:>6.1} s  node {id}: down", t as f64 / 1e6),
        }
    }
}
