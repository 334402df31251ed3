//! A scenario of several sims side by side (`world.sims > 1`) in the deterministic cluster:
//! every sim has its own validators (whole node cores, as for one sim), and each validator
//! signs its sim's mail for the neighbours and sends it to one of their validators, over the
//! same simulated network (delays, loss, partitions, crashes). Bodies cross borders by the
//! two-phase handoff, accepted only with f + 1 matching signed copies (DESIGN §7).
//!
//! Node numbering: sim k (1-based) has nodes (k-1)·n … k·n-1. What several sims support for
//! now: crash, partition and skew faults; steps; and the expectations `roots_equal`,
//! `min_ticks`, `no_desync`, `objects`, `object_text`, `handoffs` and `in_sim` (the spec
//! refuses the rest with a clear error).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context;
use metatopia_consensus::{SigningKey, VerifyingKey};
use metatopia_scenarios::spec::{Action, Scenario};
use metatopia_scenarios::{Cluster, NodeId, Time};
use metatopia_scripting::RhaiHost;
use metatopia_sim::event::account_of;
use metatopia_sim::{AccountId, EventId, Hash32, SignedEvent, Sim, SimId, World};

use crate::scenario::common::{
    Disks, Node, Recording, Report, consensus_config, net_config, recording, replay_log, restarts_verdict,
    restored_sim, schedule_network_fault,
};
use crate::simnet::{Actor, CoreProcess, WorldPlace};
use metatopia_node::core::NodeCore;
use metatopia_node::core::epochs::Epochs;
use metatopia_node::world::{AnyPhysics, Genesis, Options, genesis_in, place_of};
use metatopia_scenarios::judge::{Agreement, Crossings, Observed, compare_roots, judge};

/// The sims of a run: their genesis and their nodes' keys.
struct Sims {
    n: u16,
    genesis: Vec<Genesis>,
    /// Per sim, its validators' public keys (in index order).
    public: Vec<Vec<VerifyingKey>>,
    keys: Vec<SigningKey>,
}

impl Sims {
    fn sim_of(&self, node: NodeId) -> usize {
        node as usize / usize::from(self.n)
    }

    fn nodes(&self, k: usize) -> std::ops::Range<NodeId> {
        let n = NodeId::from(self.n);
        k as NodeId * n..(k as NodeId + 1) * n
    }
}

/// Run a scenario of several sims.
pub fn run(
    spec: &Scenario,
    text: &str,
    opts: &Options,
    progress: &mut dyn FnMut(Time, Time),
) -> anyhow::Result<(Report, Recording)> {
    let seed = opts.seed;
    let w = &spec.world;
    let n = spec.validators.count;
    let count = w.sims as usize;
    let total = n * w.sims as u16;
    let keys: Vec<SigningKey> = (0..total).map(metatopia_node::world::validator_key).collect();
    let public: Vec<Vec<VerifyingKey>> = (0..count)
        .map(|k| keys[k * usize::from(n)..(k + 1) * usize::from(n)].iter().map(|k| k.verifying_key()).collect())
        .collect();
    let accounts: Vec<Vec<AccountId>> =
        public.iter().map(|ks| ks.iter().map(|k| AccountId(k.to_bytes())).collect()).collect();
    let mut genesis = Vec::new();
    for k in 0..count {
        let place = place_of(w, k as u32, &accounts);
        genesis
            .push(genesis_in(spec, seed, opts, &accounts[k], Some(&place)).with_context(|| format!("sim {}", k + 1))?);
    }
    let sims = Arc::new(Sims { n, genesis, public, keys });

    let period_us = 1_000_000 / u64::from(w.tick_rate_hz);
    let cfg = consensus_config(period_us, w.start_unix_ms);
    let start_us = w.start_unix_ms.saturating_mul(1000);
    let epoch_ticks = sims.genesis[0].world.settings().epoch_ticks;
    // Each node's data directory on a simulated disk, written by the node's own store; a
    // restart reads it back as a node's does.
    let disks = Disks::new(usize::from(total));
    let make = {
        let (sims, cfg, disks) = (sims.clone(), cfg.clone(), disks.clone());
        let (physics, scale, anchor_ms) = (w.physics.clone(), w.time_scale, w.start_unix_ms);
        let world_spec = w.clone();
        move |id: NodeId, now: Time| -> anyhow::Result<Node> {
            let k = sims.sim_of(id);
            let g = &sims.genesis[k];
            let key = sims.keys[id as usize].clone();
            let set = sims.public[k].clone();
            let (store, restored) = disks.open(id)?;
            let fresh = || Epochs::new(cfg.clone(), key.clone(), set.clone(), set.clone(), epoch_ticks, now);
            let e = match &restored.consensus {
                Some(b) => Epochs::restore(cfg.clone(), key.clone(), set.clone(), now, b).unwrap_or_else(fresh),
                None => fresh(),
            };
            let sim = restored_sim(&store, &g.world, &physics).with_context(|| format!("node {id}"))?;
            let mut core = NodeCore::new(Actor::Epochs(Box::new(e)), sim, 1)
                .with_time_scale(scale, anchor_ms)
                .with_mail_key(key)
                .defer_execution();
            replay_log(&mut core, &restored.recovery.records);
            let base = sims.nodes(k).start;
            let nodes_of = (0..sims.n).map(|i| (i, vec![base + NodeId::from(i)])).collect();
            let place = place_of(&world_spec, k as u32, &[]);
            let neighbours =
                place.neighbours.iter().map(|(sim, _)| (*sim, sims.nodes(sim.0 as usize - 1).collect())).collect();
            let place =
                WorldPlace { me: id, sim_nodes: Arc::new(sims.nodes(k).collect()), neighbours: Arc::new(neighbours) };
            let mut p = CoreProcess::new(core, Arc::new(nodes_of)).in_world(place).with_store(store);
            p.log = disks.history(id, &restored.recovery.records);
            Ok(p)
        }
    };
    let procs = (0..total).map(|id| make(NodeId::from(id), start_us)).collect::<anyhow::Result<Vec<_>>>()?;
    let make_dead = {
        let (sims, cfg, physics) = (sims.clone(), cfg.clone(), w.physics.clone());
        move |id: NodeId, now: Time| -> Node {
            let k = sims.sim_of(id);
            let set = sims.public[k].clone();
            let e = Epochs::new(cfg.clone(), sims.keys[id as usize].clone(), set.clone(), set, epoch_ticks, now);
            let sim = Sim::new(sims.genesis[k].world.clone(), RhaiHost::default(), AnyPhysics::of(&physics), 1)
                .expect("the genesis world loaded before");
            CoreProcess::new(NodeCore::new(Actor::Epochs(Box::new(e)), sim, 1), Arc::new(BTreeMap::new()))
        }
    };
    let mut c = Cluster::starting_at(seed, net_config(spec), procs, start_us);
    c.set_restarter(Box::new(move |id, now, _| {
        make(id, now).unwrap_or_else(|why| {
            // It does not start (its disk is unreadable): it stays down, saying why.
            let mut p = make_dead(id, now);
            p.failed = Some(format!("cannot restart from its disk: {why:#}"));
            p
        })
    }));
    for f in spec.faults.iter().map(|f| f.get_ref()) {
        anyhow::ensure!(schedule_network_fault(&mut c, f), "fault {:?} is not supported with several sims", f.kind);
    }
    let honest: Vec<NodeId> = (0..NodeId::from(total)).collect();

    // Drive: every tick period, the steps that are due, into the sim of their `via` node.
    let mut nonces: BTreeMap<String, u64> = BTreeMap::new();
    let mut steps: Vec<(usize, &metatopia_scenarios::spec::StepSpec)> =
        spec.steps.iter().map(|s| (Scenario::line_of(text, s.span()), s.get_ref())).collect();
    steps.sort_by_key(|(_, s)| s.at_tick);
    let mut pending = std::collections::VecDeque::from(steps);
    let mut last: BTreeMap<String, SignedEvent> = BTreeMap::new();
    let mut labelled: BTreeMap<String, EventId> = BTreeMap::new();
    let mut submitted = 0;
    let end = (spec.duration_secs * 1e6) as Time;
    let mut t = 0;
    while t < end {
        t = (t + period_us).min(end);
        c.run_until(t, |_| {});
        progress(t, end);
        while let Some((line, s)) = pending.front().copied() {
            let via = NodeId::from(s.via);
            let Some(p) = c.node(via) else { break };
            if p.core.sim().world().tick().0 < s.at_tick {
                break;
            }
            pending.pop_front();
            let k = sims.sim_of(via);
            let key = metatopia_node::world::account_key(&s.by);
            let event = match s.action {
                Action::Replay => {
                    last.get(&s.by).cloned().with_context(|| format!("line {line}: nothing to replay"))?
                }
                _ => {
                    let avatar = p.core.sim().world().account(&account_of(&key)).and_then(|a| a.avatar);
                    let payload =
                        crate::scenario::common::payload(s, &sims.genesis[k].objects, avatar, opts, &sims.public[k])
                            .with_context(|| format!("line {line}"))?;
                    let nonce = nonces.entry(s.by.clone()).or_default();
                    *nonce += 1;
                    SignedEvent::new(&key, SimId(k as u32 + 1), *nonce, payload)
                }
            };
            if let Some(l) = &s.label {
                labelled.insert(l.clone(), event.id());
            }
            last.insert(s.by.clone(), event.clone());
            let bytes = metatopia_sim::codec::encode(&event);
            c.with_node(via, |p, now, out| {
                p.submit(now, vec![bytes], out);
            });
            submitted += 1;
        }
    }

    let mut verdicts = judge(spec, text, &Seen::new(&c, &sims)?);
    let nodes = (0..c.len() as NodeId).filter_map(|i| c.node(i).map(|p| (i, p)));
    verdicts.insert(1, restarts_verdict(&disks, nodes, &|_| true));
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
    // The recording: sim 1, from its first node that is up.
    let rec_node = sims.nodes(0).find_map(|h| c.node(h)).context("no node of sim 1 is up at the end")?;
    let recording = recording(rec_node, &sims.genesis[0].world, w)?;
    let _ = labelled;
    Ok((report, recording))
}

/// Where every named object is at the end, on the first node of each sim that is up: the sims
/// whose world holds it, and those holding it as departed (in transit).
fn whereabouts(worlds: &[(u32, &World)]) -> BTreeMap<String, (Vec<u32>, Vec<u32>)> {
    let mut at: BTreeMap<String, (Vec<u32>, Vec<u32>)> = BTreeMap::new();
    for (k, w) in worlds {
        for o in w.objects().values() {
            at.entry(o.name.clone()).or_default().0.push(*k);
        }
        for d in w.links().departed().values() {
            at.entry(d.record.object.name.clone()).or_default().1.push(*k);
        }
    }
    at
}

/// What a world's cluster run saw, for the judge.
struct Seen<'a> {
    c: &'a Cluster<Node>,
    sims: &'a Sims,
    /// The first node of each sim that is up, with its sim's number.
    firsts: Vec<(u32, &'a Node)>,
    /// Where each object is: the sims whose world holds it, and those that handed it over.
    at: BTreeMap<String, (Vec<u32>, Vec<u32>)>,
}

impl<'a> Seen<'a> {
    fn new(c: &'a Cluster<Node>, sims: &'a Sims) -> anyhow::Result<Seen<'a>> {
        let count = sims.genesis.len();
        let firsts: Vec<(u32, &Node)> =
            (0..count).filter_map(|k| sims.nodes(k).find_map(|id| c.node(id)).map(|p| (k as u32 + 1, p))).collect();
        anyhow::ensure!(firsts.len() == count, "some sim has no node up at the end");
        let worlds: Vec<(u32, &World)> = firsts.iter().map(|(k, p)| (*k, p.core.sim().world())).collect();
        let at = whereabouts(&worlds);
        Ok(Seen { c, sims, firsts, at })
    }

    fn up(&self) -> Vec<&Node> {
        (0..self.c.len() as NodeId).filter_map(|id| self.c.node(id)).collect()
    }
}

impl Observed for Seen<'_> {
    fn agreement(&self) -> Agreement {
        let count = self.sims.genesis.len();
        let (mut compared, mut differ) = (0, None);
        for k in 0..count {
            let roots: Vec<BTreeMap<u64, Hash32>> = self
                .sims
                .nodes(k)
                .filter_map(|id| self.c.node(id))
                .map(|p| p.executed_roots().into_iter().map(|(t, r)| (t.0, r)).collect())
                .collect();
            let (n, bad) = compare_roots(&roots);
            compared += n;
            if let Some(t) = bad.filter(|_| differ.is_none()) {
                differ = Some(format!("sim {}: roots differ at tick {t}", k + 1));
            }
        }
        Agreement { compared, differ, scope: format!("within {count} sims") }
    }

    fn ticks(&self) -> Vec<u64> {
        self.up().iter().map(|p| p.core.sim().world().tick().0).collect()
    }

    fn desynced(&self) -> Vec<u64> {
        self.up().iter().filter_map(|p| p.core.desynced().map(|t| t.0)).collect()
    }

    fn objects(&self) -> u64 {
        self.at.len() as u64
    }

    fn object_text(&self, name: &str) -> Result<Option<String>, String> {
        Ok(self
            .firsts
            .iter()
            .find_map(|(_, p)| p.core.sim().world().objects().values().find(|o| o.name == name))
            .map(|o| o.text.clone()))
    }

    fn sims_of(&self, object: &str) -> Result<Vec<u32>, String> {
        Ok(self.at.get(object).map(|(w, _)| w.clone()).unwrap_or_default())
    }

    fn crossings(&self) -> Result<Crossings, String> {
        let left: u64 = self.firsts.iter().map(|(_, p)| p.core.stats().departures).sum();
        let arrived: u64 = self.firsts.iter().map(|(_, p)| p.core.stats().arrivals).sum();
        let in_transit = self.at.values().filter(|(w, d)| w.is_empty() && d.len() == 1).count() as u64;
        let doubled = self.at.iter().filter(|(_, (w, d))| w.len() > 1 || d.len() > 1).map(|(n, _)| n.clone()).collect();
        let lost = self
            .sims
            .genesis
            .iter()
            .flat_map(|g| g.objects.keys())
            .filter(|n| !self.at.contains_key(*n))
            .cloned()
            .collect();
        Ok(Crossings { left, arrived, in_transit, doubled, lost })
    }
}
