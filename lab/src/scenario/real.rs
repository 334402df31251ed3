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

use crate::scenario::common::{self as scenario, Report, Verdict};
use anyhow::Context;
use metatopia_node::api::http::{AccountView, ChatView, Client, ObjectView, RootView, Status};
use metatopia_node::config::{
    BotsConfig, NodeConfig, RaynetConfig, SimEntry, SimValidator, ValidatorEntry, WorldConfig,
};
use metatopia_node::core::Outcome;
use metatopia_node::store::{DataDir, write_atomic};
use metatopia_node::world::{Options, account_key};
use metatopia_scenarios::Scenario;
use metatopia_scenarios::spec::Action;
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
        .collect::<anyhow::Result<Vec<_>>>()?;
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
    let mut roles: BTreeMap<usize, Verdict> = BTreeMap::new();
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
            .filter_map(|i| status(*i).map(|s| s.tick + 1))
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
            if st.tick + 1 < s.at_tick {
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
            if let Err(e) = clients[via].submit(&metatopia_sim::codec::encode(&event))
                && let Some(l) = &s.label
            {
                at_door.insert(l.clone(), format!("refused at the door: {e}"));
            }
            submitted += 1;
        }
        for e in &spec.expect {
            let v = e.get_ref();
            let line = Scenario::line_of(text, e.span());
            if v.kind != "role" || roles.contains_key(&line) {
                continue;
            }
            let at = v.at_tick.unwrap_or_default();
            let Some((i, st)) = honest.iter().find_map(|i| status(*i).filter(|s| s.tick + 1 >= at).map(|s| (*i, s)))
            else {
                continue;
            };
            let who = account_of(&account_key(v.account.as_deref().unwrap_or_default()));
            let role = clients[i]
                .get::<AccountView>(&format!("/v1/accounts/{who}"))?
                .map_or("none".to_owned(), |a| a.role.replace(' ', "_"));
            let want = v.role.as_deref().unwrap_or_default();
            roles.insert(
                line,
                Verdict {
                    line,
                    what: format!("{} is {want} at tick {at}", v.account.as_deref().unwrap_or_default()),
                    ok: role == want,
                    detail: format!("{role} at tick {} on node {i}", st.tick + 1),
                },
            );
        }
    }
    bar.finish_and_clear();
    // Let in-flight acts execute everywhere.
    std::thread::sleep(Duration::from_millis(1_000));
    let up: Vec<usize> = honest.iter().copied().filter(|i| procs[*i].child.is_some()).collect();
    let verdicts = if sims > 1 {
        judge_world(spec, text, &clients, &up, per, &gs)?
    } else {
        judge(spec, text, &clients, &up, &procs, &gs[0].objects, (&labelled, &at_door), roles)?
    };
    let ticks = (0..n).map(|i| status(i).map(|s| s.tick + 1)).collect();
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

#[allow(clippy::too_many_arguments)]
fn judge(
    spec: &Scenario,
    text: &str,
    clients: &[Client],
    up: &[usize],
    procs: &[Proc],
    objects: &BTreeMap<String, ObjectId>,
    (labelled, at_door): (&BTreeMap<String, EventId>, &BTreeMap<String, String>),
    mut roles: BTreeMap<usize, Verdict>,
) -> anyhow::Result<Vec<Verdict>> {
    let first = *up.first().context("no honest node is up at the end")?;
    let status: Vec<Status> =
        up.iter().map(|i| clients[*i].get::<Status>("/v1/status")?.context("no status")).collect::<Result<_, _>>()?;
    // Agreement: every tick of the last 200 that all of them still remember.
    let low = status.iter().map(|s| s.tick).min().unwrap_or(0);
    let (compared, bad) = compare_roots(clients, up, low);
    let mut agree = (bad.is_none(), bad.map(|t| format!("roots differ at tick {t}")).unwrap_or_default());
    if agree.0 {
        agree.1 = format!("{compared} ticks compared across {} honest nodes", up.len());
    }
    let mut out = vec![Verdict {
        line: 0,
        what: "honest nodes agree (always checked)".into(),
        ok: agree.0 && compared > 0,
        detail: agree.1.clone(),
    }];
    for e in &spec.expect {
        let v = e.get_ref();
        let line = Scenario::line_of(text, e.span());
        let verdict = |what: String, ok: bool, detail: String| Verdict { line, what, ok, detail };
        let vd = match v.kind.as_str() {
            "roots_equal" => verdict("roots equal on every honest node".into(), out[0].ok, agree.1.clone()),
            "min_ticks" => {
                let want = v.ticks.unwrap_or_default();
                let got: Vec<u64> = status.iter().map(|s| s.tick + 1).collect();
                verdict(
                    format!("every honest node executed {want} ticks"),
                    got.iter().all(|t| *t >= want),
                    format!("{got:?}"),
                )
            }
            "no_desync" => {
                let bad: Vec<_> = status.iter().filter_map(|s| s.desynced).collect();
                verdict("no honest node diverged".into(), bad.is_empty(), format!("{bad:?}"))
            }
            "desync" | "resynced" | "joined" => {
                let node = usize::from(v.node.unwrap_or_default());
                let (out, err) = (procs[node].out.lock().map(|s| s.clone()), procs[node].err.lock().map(|s| s.clone()));
                let (out, err) = (out.unwrap_or_default(), err.unwrap_or_default());
                if v.kind == "desync" {
                    let ok = err.contains("diverged at tick");
                    verdict(
                        format!("node {node} noticed it diverged"),
                        ok,
                        err.lines().find(|l| l.contains("diverged")).unwrap_or("").to_owned(),
                    )
                } else {
                    // "resynced: ..." or "joined: ...", and it agrees now: its root of a recent
                    // tick is the first honest node's.
                    let prefix = if v.kind == "joined" { "joined:" } else { "resynced" };
                    let line = out.lines().find(|l| l.starts_with(prefix)).unwrap_or("").to_owned();
                    let t = status[0].tick.saturating_sub(5);
                    let mine = clients[node].get::<RootView>(&format!("/v1/roots/{t}")).ok().flatten();
                    let theirs = clients[first].get::<RootView>(&format!("/v1/roots/{t}")).ok().flatten();
                    let ok = !line.is_empty() && mine.is_some() && mine == theirs;
                    let what = if v.kind == "joined" { "joined from a snapshot" } else { "resynced" };
                    verdict(
                        format!("node {node} {what} and agrees"),
                        ok,
                        format!("{line}; tick {t} equal: {}", mine == theirs),
                    )
                }
            }
            "objects" => {
                let want = v.count.unwrap_or_default();
                verdict(
                    format!("{want} objects at the end"),
                    status[0].objects == want,
                    format!("{}", status[0].objects),
                )
            }
            "object_text" => {
                let name = v.object.as_deref().unwrap_or_default();
                let want = v.text.as_deref().unwrap_or_default();
                let got = match objects.get(name) {
                    Some(id) => clients[first].get::<ObjectView>(&format!("/v1/objects/{id}"))?.map(|o| o.text),
                    None => None,
                };
                verdict(format!("{name} shows {want:?}"), got.as_deref() == Some(want), format!("{got:?}"))
            }
            "chat_seen" => {
                let want = v.text.as_deref().unwrap_or_default();
                let mut seen = Vec::new();
                for i in up {
                    let lines: Vec<ChatView> = clients[*i].get("/v1/chat/0")?.unwrap_or_default();
                    seen.push(lines.iter().any(|l| l.text.contains(want)));
                }
                verdict(format!("chat {want:?} seen"), seen.iter().all(|s| *s), format!("on nodes: {seen:?}"))
            }
            "outcome" => {
                let label = v.step.as_deref().unwrap_or_default();
                let mut got: Vec<Option<Outcome>> = Vec::new();
                for i in up {
                    got.push(match (at_door.get(label), labelled.get(label)) {
                        (Some(why), _) => Some(Outcome::Refused { tick: 0, reason: why.clone() }),
                        (None, Some(id)) => clients[*i].get::<Outcome>(&format!("/v1/events/{id}"))?,
                        (None, None) => None,
                    });
                }
                let want = v.status.as_deref().unwrap_or_default();
                let reason = v.reason.as_deref().unwrap_or_default();
                let ok = scenario::outcome_holds(&got, want, reason);
                verdict(format!("step {label} {want}"), ok, format!("{:?}", got[0]))
            }
            "validator" | "observer" => {
                let node = usize::from(v.node.unwrap_or_default());
                let st = clients.get(node).and_then(|c| c.get::<Status>("/v1/status").ok().flatten());
                let want = v.kind == "validator";
                let (ok, detail) = match st {
                    Some(s) => (
                        s.voting == want,
                        format!("{} ({} validators)", if s.voting { "votes" } else { "follows" }, s.validators),
                    ),
                    None => (false, "down".to_owned()),
                };
                verdict(format!("node {node} {}", if want { "votes" } else { "only follows" }), ok, detail)
            }
            "role" => roles.remove(&line).unwrap_or_else(|| {
                verdict(format!("role at tick {}", v.at_tick.unwrap_or_default()), false, "never reached".into())
            }),
            other => anyhow::bail!("line {line}: unknown expectation {other:?}"),
        };
        out.push(vd);
    }
    Ok(out)
}

/// The roots of the last 200 ticks that all of `nodes` remember: (ticks compared, first
/// tick that differs).
fn compare_roots(clients: &[Client], nodes: &[usize], low: u64) -> (u64, Option<u64>) {
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

/// The expectations of a world of several sims, from the nodes' HTTP services.
fn judge_world(
    spec: &Scenario,
    text: &str,
    clients: &[Client],
    up: &[usize],
    per: usize,
    gs: &[metatopia_node::world::Genesis],
) -> anyhow::Result<Vec<Verdict>> {
    let status: BTreeMap<usize, Status> =
        up.iter().filter_map(|i| clients[*i].get::<Status>("/v1/status").ok().flatten().map(|s| (*i, s))).collect();
    let mut agree = (true, String::new());
    let mut compared = 0;
    // Per sim: its nodes that are up, the objects its first one holds, and its crossings.
    let mut objects: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut in_transit: BTreeMap<String, u32> = BTreeMap::new();
    let (mut left, mut arrived) = (0, 0);
    for k in 0..gs.len() {
        let nodes: Vec<usize> = up.iter().copied().filter(|i| i / per == k && status.contains_key(i)).collect();
        let first = *nodes.first().with_context(|| format!("no node of sim {} is up at the end", k + 1))?;
        let low = nodes.iter().map(|i| status[i].tick).min().unwrap_or(0);
        let (n, bad) = compare_roots(clients, &nodes, low);
        compared += n;
        if let Some(t) = bad.filter(|_| agree.0) {
            agree = (false, format!("sim {}: roots differ at tick {t}", k + 1));
        }
        let list: Vec<ObjectView> = clients[first].get("/v1/objects")?.unwrap_or_default();
        for o in list {
            objects.entry(o.name).or_default().push(k as u32 + 1);
        }
        for name in &status[&first].in_transit {
            *in_transit.entry(name.clone()).or_default() += 1;
        }
        left += nodes.iter().map(|i| status[i].departures).max().unwrap_or(0);
        arrived += nodes.iter().map(|i| status[i].arrivals).max().unwrap_or(0);
    }
    if agree.0 {
        agree.1 = format!("{compared} tick roots compared within {} sims", gs.len());
    }
    let mut out = vec![Verdict {
        line: 0,
        what: "each sim's nodes agree (always checked)".into(),
        ok: agree.0 && compared > 0,
        detail: agree.1.clone(),
    }];
    for e in &spec.expect {
        let v = e.get_ref();
        let line = Scenario::line_of(text, e.span());
        let verdict = |what: String, ok: bool, detail: String| Verdict { line, what, ok, detail };
        out.push(match v.kind.as_str() {
            "roots_equal" => verdict("roots equal within every sim".into(), out[0].ok, agree.1.clone()),
            "min_ticks" => {
                let want = v.ticks.unwrap_or_default();
                let got: Vec<u64> = status.values().map(|s| s.tick + 1).collect();
                verdict(format!("every node executed {want} ticks"), got.iter().all(|t| *t >= want), format!("{got:?}"))
            }
            "no_desync" => {
                let bad: Vec<_> = status.values().filter_map(|s| s.desynced).collect();
                verdict("no node diverged".into(), bad.is_empty(), format!("{bad:?}"))
            }
            "objects" => {
                let want = v.count.unwrap_or_default();
                let names: std::collections::BTreeSet<&String> = objects.keys().chain(in_transit.keys()).collect();
                verdict(
                    format!("{want} objects in the world at the end"),
                    names.len() as u64 == want,
                    names.len().to_string(),
                )
            }
            "object_text" => {
                let name = v.object.as_deref().unwrap_or_default();
                let want = v.text.as_deref().unwrap_or_default();
                let mut got = None;
                for k in objects.get(name).into_iter().flatten() {
                    let first = up.iter().copied().find(|i| i / per == *k as usize - 1 && status.contains_key(i));
                    let list: Vec<ObjectView> =
                        first.and_then(|f| clients[f].get("/v1/objects").ok().flatten()).unwrap_or_default();
                    got = list.into_iter().find(|o| o.name == name).map(|o| o.text);
                }
                verdict(format!("{name} shows {want:?}"), got.as_deref() == Some(want), format!("{got:?}"))
            }
            "in_sim" => {
                let name = v.object.as_deref().unwrap_or_default();
                let want = v.sim.unwrap_or_default();
                let got = objects.get(name).cloned().unwrap_or_default();
                verdict(format!("{name} ends in sim {want}"), got == [want], format!("in sims {got:?}"))
            }
            "handoffs" => {
                let want = v.count.unwrap_or_default();
                let transit = in_transit.keys().filter(|n| !objects.contains_key(*n)).count() as u64;
                let doubled: Vec<&String> = objects
                    .iter()
                    .filter(|(_, s)| s.len() > 1)
                    .map(|(n, _)| n)
                    .chain(in_transit.iter().filter(|(_, c)| **c > 1).map(|(n, _)| n))
                    .collect();
                let lost: Vec<&String> = gs
                    .iter()
                    .flat_map(|g| g.objects.keys())
                    .filter(|n| !objects.contains_key(*n) && !in_transit.contains_key(*n))
                    .collect();
                let ok = arrived >= want && left == arrived + transit && doubled.is_empty() && lost.is_empty();
                verdict(
                    format!("at least {want} bodies crossed between sims, each exactly once"),
                    ok,
                    format!("{left} left, {arrived} arrived, {transit} in transit; doubled {doubled:?}, lost {lost:?}"),
                )
            }
            other => anyhow::bail!("line {line}: expectation {other:?} is not supported with several sims"),
        });
    }
    Ok(out)
}

/// Where `--real` keeps the nodes' data.
pub fn default_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("metatopia-scenario-{name}"))
}
