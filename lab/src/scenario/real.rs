//! `metatopia-lab scenario run --real`: the scenario as real `metatopia run` processes on loopback.
//! Its times are sim time, as in simulation: the run lasts until the nodes have executed
//! `duration_secs × tick_rate_hz` ticks, and faults happen at the ticks their seconds stand for.
//! Steps are signed here and submitted through the nodes' HTTP API when the `via` node reaches
//! their tick; crashes are `kill -9` and a restart from the data directory; expectations are read
//! back through the API from every honest node. Real time and real sockets: the run is not
//! reproducible bit for bit (its trace is "real"), but every node must still agree.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::scenario::common::{self as scenario, Report};
use anyhow::Context;
use metatopia_node::api::http::{AccountView, ChatView, Client, ObjectView, RootView, Status};
use metatopia_node::config::{
    BotsConfig, NodeConfig, RaynetConfig, SimEntry, SimValidator, ValidatorEntry, WorldConfig,
};
use metatopia_node::core::Outcome;
use metatopia_node::store::{DataDir, write_atomic};
use metatopia_node::world::{Options, account_key};
use metatopia_scenarios::Scenario;
use metatopia_scenarios::judge::{Agreement, Crossings, Observed, StepOutcome, judge};
use metatopia_scenarios::spec::Action;
use metatopia_scenarios::spec::Expect;
use metatopia_sim::event::account_of;
use metatopia_sim::{EventId, ObjectId, SignedEvent};

struct Proc {
    child: Option<Child>,
    out: Arc<Mutex<String>>,
    err: Arc<Mutex<String>>,
}

impl Proc {
    /// The last lines the node wrote to stderr.
    fn err_tail(&self) -> String {
        let err = self.err.lock().map(|s| s.clone()).unwrap_or_default();
        let lines: Vec<&str> = err.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn spawn(dir: &Path, out: &Arc<Mutex<String>>, err: &Arc<Mutex<String>>) -> anyhow::Result<Child> {
    spawn_with(dir, &[], out, err)
}

fn spawn_with(
    dir: &Path,
    extra: &[String],
    out: &Arc<Mutex<String>>,
    err: &Arc<Mutex<String>>,
) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding this program")?;
    let mut child = Command::new(exe)
        .arg("run")
        .arg("--data-dir")
        .arg(dir)
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting a node")?;
    for (pipe, sink) in [
        (child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), out.clone()),
        (child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), err.clone()),
    ] {
        if let Some(p) = pipe {
            std::thread::spawn(move || {
                for line in BufReader::new(p).lines().map_while(Result::ok) {
                    sink.lock().unwrap_or_else(|e| e.into_inner()).push_str(&(line + "\n"));
                }
            });
        }
    }
    Ok(child)
}

fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    Ok(metatopia_node::net::free_ports(n)?)
}

fn check_supported(spec: &Scenario, text: &str) -> anyhow::Result<()> {
    for f in &spec.faults {
        let k = f.get_ref().kind.as_str();
        anyhow::ensure!(
            k == "crash" || k == "diverge" || k == "join",
            "line {}: fault {k:?} is simulation-only; --real supports crash, diverge and join",
            Scenario::line_of(text, f.span())
        );
    }
    let n = &spec.network;
    anyhow::ensure!(
        n.loss_percent == 0.0 && n.duplicate_percent == 0.0,
        "[network] loss and duplication are simulation-only; --real runs on loopback as it is"
    );
    Ok(())
}

/// Run a scenario as real processes; `dir` keeps the nodes' data.
pub fn run(file: &Path, spec: &Scenario, text: &str, opts: &Options, dir: &Path) -> anyhow::Result<Report> {
    check_supported(spec, text)?;
    // Validators 0..count, then the observers (nodes that follow until admitted).
    let validators_n = usize::from(spec.validators.count);
    // Nodes per sim; with several sims, sim k's nodes are (k-1)·per … k·per-1.
    let per = validators_n + usize::from(spec.validators.observers);
    let sims = spec.world.sims.max(1) as usize;
    let n = per * sims;
    let sim_of = |i: usize| i / per;
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let ports = free_ports(2 * n)?;
    let quic = metatopia_node::net::free_udp_ports(n)?;
    let dirs: Vec<DataDir> = (0..n).map(|i| DataDir::open(&dir.join(format!("node-{i}")))).collect::<Result<_, _>>()?;
    // Observers with a `join` fault are in no config: they start later with `run --join`.
    let joiners: BTreeMap<usize, f64> = spec
        .faults
        .iter()
        .map(|f| f.get_ref())
        .filter(|f| f.kind == "join")
        .filter_map(|f| f.node.map(|x| (usize::from(x), f.at_secs)))
        .collect();
    let mut validators = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let key = d.key()?;
        if joiners.contains_key(&i) {
            continue;
        }
        validators.push(ValidatorEntry {
            key: metatopia_sim::ids::hex(key.verifying_key().as_bytes()),
            address: ([127, 0, 0, 1], ports[i]).into(),
            quic: Some(([127, 0, 0, 1], quic[i]).into()),
            http: None,
            observer: i % per >= validators_n,
        });
    }
    // Each sim's own entries (joiners are in none).
    let hex_keys: Vec<String> = dirs
        .iter()
        .map(|d| d.key().map(|k| metatopia_sim::ids::hex(k.verifying_key().as_bytes())))
        .collect::<Result<_, _>>()?;
    let entries_of = |k: usize| -> Vec<ValidatorEntry> {
        validators.iter().filter(|v| hex_keys[k * per..(k + 1) * per].contains(&v.key)).cloned().collect()
    };
    let file = std::fs::canonicalize(file)?;
    let seed: Vec<String> = match entries_of(0).first() {
        Some(v) if sims > 1 => vec![format!("{}@{}", v.key, v.address)],
        _ => Vec::new(),
    };
    let scripts = std::fs::canonicalize(&opts.scripts_dir)
        .with_context(|| format!("the scripts directory {}", opts.scripts_dir.display()))?;
    let diverging: Vec<usize> = spec
        .faults
        .iter()
        .filter(|f| f.get_ref().kind == "diverge")
        .filter_map(|f| f.get_ref().node.map(usize::from))
        .collect();
    // One genesis time for the world's nodes: a real one, as an operator's sim has.
    let genesis_ms = metatopia_node::unix_ms();
    for (i, d) in dirs.iter().enumerate().filter(|(i, _)| !joiners.contains_key(i)) {
        let cfg = NodeConfig {
            listen: ([127, 0, 0, 1], ports[i]).into(),
            quic: Some(([127, 0, 0, 1], quic[i]).into()),
            http: Some(([127, 0, 0, 1], ports[n + i]).into()),
            tick_rate_hz: spec.world.tick_rate_hz,
            snapshot_every: 640,
            genesis_hash: None,
            world: WorldConfig {
                sim_id: sim_of(i) as u32 + 1,
                seed: if diverging.contains(&i) { opts.seed ^ 0xd1fe } else { opts.seed },
                time_scale: spec.world.time_scale,
                scenario: Some(file.clone()),
                scripts: Some(scripts.clone()),
                ..WorldConfig::demo(genesis_ms)
            },
            bots: BotsConfig {
                events_per_tick: if usize::from(spec.bots.node) == i { spec.bots.events_per_tick } else { 0 },
            },
            validators: entries_of(sim_of(i)),
            join: None,
            sims: (0..sims)
                .filter(|k| *k != sim_of(i))
                .map(|k| SimEntry {
                    sim_id: k as u32 + 1,
                    validators: entries_of(k).iter().map(SimValidator::key_of).collect(),
                })
                .collect(),
            // The other sims' nodes are found through Raynet, starting from sim 1's first node.
            raynet: RaynetConfig { bootstrap: seed.clone(), ..RaynetConfig::default() },
            network: Default::default(),
            sim_workers: None,
            block_history_mib: None,
        };
        write_atomic(&d.config_path(), cfg.commented().as_bytes())?;
    }
    // Each sim's genesis (its named objects' ids, for the steps).
    let mut accounts = Vec::new();
    for k in 0..sims {
        let node_cfg = NodeConfig::load(&dirs[k * per].config_path())?;
        accounts.push(
            node_cfg.genesis_validators()?.iter().map(|k| metatopia_sim::AccountId(k.to_bytes())).collect::<Vec<_>>(),
        );
    }
    let gs = (0..sims)
        .map(|k| {
            let place = (sims > 1).then(|| metatopia_node::world::place_of(&spec.world, k as u32, &accounts));
            metatopia_node::world::genesis_in(spec, opts.seed, opts, &accounts[k], place.as_ref())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let honest: Vec<usize> = (0..n).filter(|i| !diverging.contains(i)).collect();

    let mut procs: Vec<Proc> = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        let (out, err) = (Arc::default(), Arc::default());
        let child = if joiners.contains_key(&i) { None } else { Some(spawn(d.root(), &out, &err)?) };
        procs.push(Proc { child, out, err });
    }
    // A joiner joins through node 0, with addresses of its own.
    let join_args = |i: usize| -> Vec<String> {
        let via = &validators[0];
        vec![
            "--join".into(),
            format!("{}@{}", via.key, via.address),
            "--listen".into(),
            format!("127.0.0.1:{}", ports[i]),
            "--quic".into(),
            format!("127.0.0.1:{}", quic[i]),
            "--http".into(),
            format!("127.0.0.1:{}", ports[n + i]),
        ]
    };
    let mut joins: std::collections::VecDeque<(f64, usize)> = joiners.iter().map(|(i, at)| (*at, *i)).collect();
    joins.make_contiguous().sort_by(|a, b| a.0.total_cmp(&b.0));
    let clients: Vec<Client> = (0..n).map(|i| Client::new(&format!("127.0.0.1:{}", ports[n + i]))).collect();
    let status = |i: usize| clients[i].get::<Status>("/v1/status").ok().flatten();
    // Wait for the nodes to serve (the first tick is the start of the scenario's time).
    let t0 = Instant::now();
    loop {
        let waiting: Vec<usize> = (0..n).filter(|i| !joiners.contains_key(i) && status(*i).is_none()).collect();
        if waiting.is_empty() {
            break;
        }
        // A node that stopped (a port taken, say) will not serve: say why now, not in a minute.
        for &i in &waiting {
            if let Some(code) = procs[i].child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                anyhow::bail!("node {i} stopped before it served ({code}):\n{}", procs[i].err_tail());
            }
        }
        if t0.elapsed() >= Duration::from_secs(60) {
            let why: Vec<String> = waiting.iter().map(|i| format!("node {i}:\n{}", procs[*i].err_tail())).collect();
            anyhow::bail!("nodes {waiting:?} did not start within 60 s\n{}", why.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    let mut crashes: Vec<(f64, usize, bool)> = Vec::new();
    for f in spec.faults.iter().map(|f| f.get_ref()).filter(|f| f.kind == "crash") {
        let node = usize::from(f.node.unwrap_or_default());
        crashes.push((f.at_secs, node, false));
        if let Some(u) = f.until_secs {
            crashes.push((u, node, true));
        }
    }
    crashes.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut crashes = std::collections::VecDeque::from(crashes);
    let mut steps: Vec<(usize, &metatopia_scenarios::spec::StepSpec)> =
        spec.steps.iter().map(|s| (Scenario::line_of(text, s.span()), s.get_ref())).collect();
    steps.sort_by_key(|(_, s)| s.at_tick);
    let mut pending = std::collections::VecDeque::from(steps);
    let mut nonces: BTreeMap<String, u64> = BTreeMap::new();
    let mut last: BTreeMap<String, SignedEvent> = BTreeMap::new();
    let mut labelled: BTreeMap<String, EventId> = BTreeMap::new();
    let mut at_door: BTreeMap<String, String> = BTreeMap::new();
    // Each account's last event still on its way, since when, and the tick its step names: a
    // step waits (up to `IN_FLIGHT`) until its node has executed the account's previous one (as
    // a client waits for its outcome) and every step of an earlier tick (a scenario's ticks say
    // what comes first: a ban before the banned account's chat). A sim that runs a span of
    // ticks at once (after a stall) would otherwise take steps submitted to two nodes in the
    // same instant in either order.
    let mut in_flight: BTreeMap<String, (EventId, Instant, u64)> = BTreeMap::new();
    const IN_FLIGHT: Duration = Duration::from_secs(5);
    // Roles seen at their tick: (account, tick) -> (role, where).
    let mut roles: BTreeMap<(String, u64), (String, String)> = BTreeMap::new();
    let mut submitted = 0;
    // Every node's key in node order (joiners included: the admin may admit them).
    let public: Vec<_> = dirs.iter().map(|d| d.key().map(|k| k.verifying_key())).collect::<Result<_, _>>()?;
    // The scenario's clock is sim time: run until the honest nodes have executed
    // `duration × rate` ticks (a loaded machine dilates time, it does not fail the run), and
    // crash or restart nodes at the tick their `at_secs` / `until_secs` stand for.
    let rate = f64::from(spec.world.tick_rate_hz);
    let target = (spec.duration_secs * rate) as u64;
    let cap = Duration::from_secs_f64(spec.duration_secs * 4.0 + 60.0);
    let start = Instant::now();
    let bar = indicatif::ProgressBar::new(target.max(1));
    loop {
        let ticks: Vec<u64> = honest
            .iter()
            .filter(|i| procs[**i].child.is_some())
            .filter_map(|i| status(*i).map(|s| s.tick.0 + 1))
            .collect();
        let (low, high) = (ticks.iter().copied().min().unwrap_or(0), ticks.iter().copied().max().unwrap_or(0));
        if low >= target || start.elapsed() > cap {
            break;
        }
        bar.set_position(low);
        std::thread::sleep(Duration::from_millis(50));
        while joins.front().is_some_and(|j| (j.0 * rate) as u64 <= high) {
            let Some((_, node)) = joins.pop_front() else { break };
            let p = &mut procs[node];
            p.child = Some(spawn_with(dirs[node].root(), &join_args(node), &p.out, &p.err)?);
        }
        while crashes.front().is_some_and(|c| (c.0 * rate) as u64 <= high) {
            let Some((_, node, restart)) = crashes.pop_front() else { break };
            let p = &mut procs[node];
            if restart {
                if p.child.is_none() {
                    p.child = Some(spawn(dirs[node].root(), &p.out, &p.err)?);
                }
            } else if let Some(mut c) = p.child.take() {
                c.kill()?;
                c.wait()?;
            }
        }
        while let Some((line, s)) = pending.front().copied() {
            let via = usize::from(s.via);
            let Some(st) = status(via) else { break };
            if st.tick.0 + 1 < s.at_tick {
                break;
            }
            let (mut waiting, mut done) = (false, Vec::new());
            for (by, (id, since, at)) in &in_flight {
                if since.elapsed() >= IN_FLIGHT {
                    done.push(by.clone());
                } else if *by == s.by || *at < s.at_tick {
                    if clients[via].get::<Outcome>(&format!("/v1/events/{id}"))?.is_some() {
                        done.push(by.clone());
                    } else {
                        waiting = true;
                        break;
                    }
                }
            }
            for by in done {
                in_flight.remove(&by);
            }
            if waiting {
                break;
            }
            pending.pop_front();
            let key = account_key(&s.by);
            let event = if s.action == Action::Replay {
                last.get(&s.by).cloned().with_context(|| format!("line {line}: {} has nothing to replay yet", s.by))?
            } else {
                let me = account_of(&key);
                let view = clients[via].get::<AccountView>(&format!("/v1/accounts/{me}"))?;
                let avatar = view.and_then(|a| a.avatar).and_then(|a| metatopia_client::conn::parse_object(&a));
                let k = sim_of(via);
                let payload = scenario::payload(s, &gs[k].objects, avatar, opts, &public[k * per..(k + 1) * per])
                    .with_context(|| format!("line {line}"))?;
                let nonce = nonces.entry(s.by.clone()).or_default();
                *nonce += 1;
                SignedEvent::new(&key, gs[k].world.sim(), *nonce, payload)
            };
            if let Some(l) = &s.label {
                labelled.insert(l.clone(), event.id());
            }
            last.insert(s.by.clone(), event.clone());
            // Refused at the door (a bad signature, a banned author) is an outcome too: it
            // never executes.
            match clients[via].submit(&metatopia_sim::codec::encode(&event)) {
                Ok(_) => {
                    in_flight.insert(s.by.clone(), (event.id(), Instant::now(), s.at_tick));
                }
                Err(e) => {
                    in_flight.remove(&s.by);
                    if let Some(l) = &s.label {
                        at_door.insert(l.clone(), format!("refused at the door: {e}"));
                    }
                }
            }
            submitted += 1;
        }
        for e in &spec.expect {
            let Expect::Role { account, at_tick, .. } = e.get_ref() else { continue };
            if roles.contains_key(&(account.clone(), *at_tick)) {
                continue;
            }
            let at = *at_tick;
            let Some((i, st)) = honest.iter().find_map(|i| status(*i).filter(|s| s.tick.0 + 1 >= at).map(|s| (*i, s)))
            else {
                continue;
            };
            let who = account_of(&account_key(account));
            let role = clients[i]
                .get::<AccountView>(&format!("/v1/accounts/{who}"))?
                .map_or("none".to_owned(), |a| a.role.replace(' ', "_"));
            roles.insert((account.clone(), at), (role, format!("at tick {} on node {i}", st.tick + 1)));
        }
    }
    bar.finish_and_clear();
    // Let in-flight acts execute everywhere.
    std::thread::sleep(Duration::from_millis(1_000));
    let up: Vec<usize> = honest.iter().copied().filter(|i| procs[*i].child.is_some()).collect();
    let verdicts = if sims > 1 {
        judge(spec, text, &WorldSeen::new(&clients, &up, per, &gs)?)
    } else {
        let seen = Seen::new(&clients, &up, &procs, &gs[0].objects, (&labelled, &at_door), roles)?;
        judge(spec, text, &seen)
    };
    let ticks = (0..n).map(|i| status(i).map(|s| s.tick.0 + 1)).collect();
    for p in &mut procs {
        if let Some(c) = p.child.as_mut() {
            let _ = Command::new("kill").arg("-INT").arg(c.id().to_string()).status();
            let _ = c.wait();
            p.child = None;
        }
    }
    Ok(Report {
        name: spec.name.clone(),
        seed: opts.seed,
        ticks,
        honest: honest.iter().map(|i| *i as u32).collect(),
        steps_submitted: submitted,
        trace: "real run (not bit-for-bit reproducible)".into(),
        verdicts,
        net: Default::default(),
    })
}

/// What a run of one sim's real processes saw, from their HTTP services and what they printed.
struct Seen<'a> {
    clients: &'a [Client],
    /// The honest nodes up at the end, and their status.
    up: &'a [usize],
    status: Vec<Status>,
    procs: &'a [Proc],
    objects: &'a BTreeMap<String, ObjectId>,
    labelled: &'a BTreeMap<String, EventId>,
    at_door: &'a BTreeMap<String, String>,
    roles: BTreeMap<(String, u64), (String, String)>,
    agreement: (u64, Option<u64>),
}

impl<'a> Seen<'a> {
    fn new(
        clients: &'a [Client],
        up: &'a [usize],
        procs: &'a [Proc],
        objects: &'a BTreeMap<String, ObjectId>,
        (labelled, at_door): (&'a BTreeMap<String, EventId>, &'a BTreeMap<String, String>),
        roles: BTreeMap<(String, u64), (String, String)>,
    ) -> anyhow::Result<Seen<'a>> {
        anyhow::ensure!(!up.is_empty(), "no honest node is up at the end");
        let status: Vec<Status> = up
            .iter()
            .map(|i| clients[*i].get::<Status>("/v1/status")?.context("no status"))
            .collect::<Result<_, _>>()?;
        // Agreement: every tick of the last 200 that all of them still remember.
        let low = status.iter().map(|s| s.tick.0).min().unwrap_or(0);
        let agreement = compare_roots_over_http(clients, up, low);
        Ok(Seen { clients, up, status, procs, objects, labelled, at_door, roles, agreement })
    }
}

fn http_err(e: impl std::fmt::Display) -> String {
    format!("asking a node: {e}")
}

impl Observed for Seen<'_> {
    fn agreement(&self) -> Agreement {
        let (compared, bad) = self.agreement;
        Agreement {
            compared,
            differ: bad.map(|t| format!("roots differ at tick {t}")),
            scope: format!("across {} honest nodes", self.up.len()),
        }
    }

    fn ticks(&self) -> Vec<u64> {
        self.status.iter().map(|s| s.tick.0 + 1).collect()
    }

    fn desynced(&self) -> Vec<u64> {
        self.status.iter().filter_map(|s| s.desynced.map(|t| t.0)).collect()
    }

    fn objects(&self) -> u64 {
        self.status[0].objects
    }

    fn object_text(&self, name: &str) -> Result<Option<String>, String> {
        match self.objects.get(name) {
            Some(id) => Ok(self.clients[self.up[0]]
                .get::<ObjectView>(&format!("/v1/objects/{id}"))
                .map_err(http_err)?
                .map(|o| o.text)),
            None => Ok(None),
        }
    }

    fn input_latency_us(&self) -> Result<Vec<Option<(u64, u64)>>, String> {
        let mut got = Vec::new();
        for i in self.up {
            let s: Option<Status> = self.clients[*i].get("/v1/status").map_err(http_err)?;
            got.push(
                s.filter(|s| s.input_to_execution_p50_us > 0)
                    .map(|s| (s.input_to_execution_p50_us, s.input_to_execution_p99_us)),
            );
        }
        Ok(got)
    }

    fn chat_seen(&self, text: &str) -> Result<Vec<bool>, String> {
        let mut seen = Vec::new();
        for i in self.up {
            let lines: Vec<ChatView> = self.clients[*i].get("/v1/chat/0").map_err(http_err)?.unwrap_or_default();
            seen.push(lines.iter().any(|l| l.text.contains(text)));
        }
        Ok(seen)
    }

    fn outcomes(&self, step: &str) -> Result<Option<Vec<Option<StepOutcome>>>, String> {
        if let Some(why) = self.at_door.get(step) {
            return Ok(Some(self.up.iter().map(|_| Some(StepOutcome::Refused(why.clone()))).collect()));
        }
        let Some(id) = self.labelled.get(step) else { return Ok(None) };
        let mut got = Vec::new();
        for i in self.up {
            let o = self.clients[*i].get::<Outcome>(&format!("/v1/events/{id}")).map_err(http_err)?;
            got.push(o.as_ref().map(scenario::step_outcome));
        }
        Ok(Some(got))
    }

    fn role_at(&self, account: &str, at_tick: u64) -> Result<Option<(String, String)>, String> {
        Ok(self.roles.get(&(account.to_owned(), at_tick)).cloned())
    }

    fn noticed_desync(&self, node: u16) -> Result<(bool, String), String> {
        let err = self.procs[usize::from(node)].err.lock().map(|s| s.clone()).unwrap_or_default();
        Ok((err.contains("diverged at tick"), err.lines().find(|l| l.contains("diverged")).unwrap_or("").to_owned()))
    }

    fn caught_up(&self, node: u16, joined: bool) -> Result<(bool, String), String> {
        // "resynced: ..." or "joined: ...", and it agrees now: its root of a recent tick is the
        // first honest node's.
        let node = usize::from(node);
        let out = self.procs[node].out.lock().map(|s| s.clone()).unwrap_or_default();
        let prefix = if joined { "joined:" } else { "resynced" };
        let line = out.lines().find(|l| l.starts_with(prefix)).unwrap_or("").to_owned();
        let t = self.status[0].tick.saturating_sub(5);
        let mine = self.clients[node].get::<RootView>(&format!("/v1/roots/{t}")).ok().flatten();
        let theirs = self.clients[self.up[0]].get::<RootView>(&format!("/v1/roots/{t}")).ok().flatten();
        let ok = !line.is_empty() && mine.is_some() && mine == theirs;
        Ok((ok, format!("{line}; tick {t} equal: {}", mine == theirs)))
    }

    fn votes(&self, node: u16) -> Result<Option<(bool, String)>, String> {
        let st = self.clients.get(usize::from(node)).and_then(|c| c.get::<Status>("/v1/status").ok().flatten());
        Ok(st.map(|s| {
            (s.voting, format!("{} ({} validators)", if s.voting { "votes" } else { "follows" }, s.validators))
        }))
    }
}

/// The roots of the last 200 ticks that all of `nodes` remember: (ticks compared, first
/// tick that differs).
fn compare_roots_over_http(clients: &[Client], nodes: &[usize], low: u64) -> (u64, Option<u64>) {
    let mut compared = 0;
    for t in low.saturating_sub(200)..=low {
        let roots: Vec<Option<RootView>> =
            nodes.iter().map(|i| clients[*i].get::<RootView>(&format!("/v1/roots/{t}")).ok().flatten()).collect();
        let known: Vec<&RootView> = roots.iter().flatten().collect();
        if known.len() == nodes.len() {
            compared += 1;
            if known.iter().any(|r| r.root != known[0].root) {
                return (compared, Some(t));
            }
        }
    }
    (compared, None)
}

/// What a run of a world's real processes saw, from their HTTP services.
struct WorldSeen<'a> {
    clients: &'a [Client],
    up: &'a [usize],
    per: usize,
    gs: &'a [metatopia_node::world::Genesis],
    status: BTreeMap<usize, Status>,
    /// The sims each object is in (by the first node up of each sim), and those in transit.
    objects: BTreeMap<String, Vec<u32>>,
    in_transit: BTreeMap<String, u32>,
    left: u64,
    arrived: u64,
    compared: u64,
    differ: Option<String>,
}

impl<'a> WorldSeen<'a> {
    fn new(
        clients: &'a [Client],
        up: &'a [usize],
        per: usize,
        gs: &'a [metatopia_node::world::Genesis],
    ) -> anyhow::Result<WorldSeen<'a>> {
        let status: BTreeMap<usize, Status> =
            up.iter().filter_map(|i| clients[*i].get::<Status>("/v1/status").ok().flatten().map(|s| (*i, s))).collect();
        let mut seen = WorldSeen {
            clients,
            up,
            per,
            gs,
            status,
            objects: BTreeMap::new(),
            in_transit: BTreeMap::new(),
            left: 0,
            arrived: 0,
            compared: 0,
            differ: None,
        };
        // Per sim: its nodes that are up, the objects its first one holds, and its crossings.
        for k in 0..gs.len() {
            let nodes: Vec<usize> =
                up.iter().copied().filter(|i| i / per == k && seen.status.contains_key(i)).collect();
            let first = *nodes.first().with_context(|| format!("no node of sim {} is up at the end", k + 1))?;
            let low = nodes.iter().map(|i| seen.status[i].tick.0).min().unwrap_or(0);
            let (n, bad) = compare_roots_over_http(clients, &nodes, low);
            seen.compared += n;
            if let Some(t) = bad.filter(|_| seen.differ.is_none()) {
                seen.differ = Some(format!("sim {}: roots differ at tick {t}", k + 1));
            }
            let list: Vec<ObjectView> = clients[first].get("/v1/objects")?.unwrap_or_default();
            for o in list {
                seen.objects.entry(o.name).or_default().push(k as u32 + 1);
            }
            for name in &seen.status[&first].in_transit {
                *seen.in_transit.entry(name.clone()).or_default() += 1;
            }
            seen.left += nodes.iter().map(|i| seen.status[i].departures).max().unwrap_or(0);
            seen.arrived += nodes.iter().map(|i| seen.status[i].arrivals).max().unwrap_or(0);
        }
        Ok(seen)
    }
}

impl Observed for WorldSeen<'_> {
    fn agreement(&self) -> Agreement {
        Agreement {
            compared: self.compared,
            differ: self.differ.clone(),
            scope: format!("within {} sims", self.gs.len()),
        }
    }

    fn ticks(&self) -> Vec<u64> {
        self.status.values().map(|s| s.tick.0 + 1).collect()
    }

    fn desynced(&self) -> Vec<u64> {
        self.status.values().filter_map(|s| s.desynced.map(|t| t.0)).collect()
    }

    fn objects(&self) -> u64 {
        let names: std::collections::BTreeSet<&String> = self.objects.keys().chain(self.in_transit.keys()).collect();
        names.len() as u64
    }

    fn object_text(&self, name: &str) -> Result<Option<String>, String> {
        let mut got = None;
        for k in self.objects.get(name).into_iter().flatten() {
            let first =
                self.up.iter().copied().find(|i| i / self.per == *k as usize - 1 && self.status.contains_key(i));
            let list: Vec<ObjectView> =
                first.and_then(|f| self.clients[f].get("/v1/objects").ok().flatten()).unwrap_or_default();
            got = list.into_iter().find(|o| o.name == name).map(|o| o.text);
        }
        Ok(got)
    }

    fn sims_of(&self, object: &str) -> Result<Vec<u32>, String> {
        Ok(self.objects.get(object).cloned().unwrap_or_default())
    }

    fn crossings(&self) -> Result<Crossings, String> {
        let in_transit = self.in_transit.keys().filter(|n| !self.objects.contains_key(*n)).count() as u64;
        let doubled = self
            .objects
            .iter()
            .filter(|(_, s)| s.len() > 1)
            .map(|(n, _)| n.clone())
            .chain(self.in_transit.iter().filter(|(_, c)| **c > 1).map(|(n, _)| n.clone()))
            .collect();
        let lost = self
            .gs
            .iter()
            .flat_map(|g| g.objects.keys())
            .filter(|n| !self.objects.contains_key(*n) && !self.in_transit.contains_key(*n))
            .cloned()
            .collect();
        Ok(Crossings { left: self.left, arrived: self.arrived, in_transit, doubled, lost })
    }
}

/// Where `--real` keeps the nodes' data.
pub fn default_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("metatopia-scenario-{name}"))
}
