//! Nodes at home: real node processes in network namespaces, some behind NAT routers made with
//! nftables, on a "public" network joined by a bridge. Needs root, `ip` and `nft` (`.ci/setup`
//! installs nftables); without them each test says why and passes without running.
//!
//! The network: a namespace holding the bridge (the internet, 10.200.0.0/24); public hosts
//! on it; home routers on it (10.200.0.10x) with a home host behind each (192.168.x.2), the
//! router masquerading the home's traffic. A *cone* router keeps a home socket's port for every
//! destination (endpoint-independent mapping: hole punching works); a *symmetric* router gives
//! every destination a random port (`masquerade fully-random`: hole punching fails). Both drop
//! whatever the home did not ask for.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use metatopia_node::api::http::Status;

use crate::delay::DelayStage;
use crate::support::{Kill, ok, wait_for};

/// Why these tests cannot run here, if they cannot.
fn unavailable() -> Option<String> {
    let root = Command::new("id").arg("-u").output().ok().is_some_and(|o| o.stdout.starts_with(b"0\n"));
    if !root {
        return Some("not root: network namespaces need it".into());
    }
    for tool in ["ip", "nft", "curl"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Some(format!("`{tool}` is not installed (.ci/setup installs nftables)"));
        }
    }
    None
}

/// Skip a test (with the reason on stderr) where namespaces cannot be made.
macro_rules! needs_namespaces {
    () => {
        if let Some(why) = unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Nat {
    Cone,
    Symmetric,
}

/// A host of the test network: its namespace and address.
#[derive(Clone, Debug)]
pub struct Host {
    pub ns: String,
    pub ip: String,
}

/// The namespaces of one test, removed (with everything in them) when dropped.
pub struct Net {
    prefix: String,
    made: Vec<String>,
}

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(out.status.success(), "`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl Net {
    /// The internet of this test: a namespace with a bridge.
    pub fn new(tag: &str) -> Net {
        let prefix = format!("mt{}{tag}", std::process::id() % 100_000);
        let mut net = Net { prefix, made: Vec::new() };
        let inet = net.namespace("inet");
        sh(&["ip", "-n", &inet, "link", "add", "br0", "type", "bridge"]);
        sh(&["ip", "-n", &inet, "link", "set", "br0", "up"]);
        net
    }

    fn namespace(&mut self, name: &str) -> String {
        let ns = format!("{}-{name}", self.prefix);
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        sh(&["ip", "netns", "add", &ns]);
        self.made.push(ns.clone());
        sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        ns
    }

    /// A link from `ns` (as `dev`) into the internet's bridge (as `port`).
    fn plug(&self, ns: &str, dev: &str, port: &str, ip: &str) {
        let inet = format!("{}-inet", self.prefix);
        sh(&["ip", "-n", ns, "link", "add", dev, "type", "veth", "peer", "name", port, "netns", &inet]);
        sh(&["ip", "-n", &inet, "link", "set", port, "master", "br0"]);
        sh(&["ip", "-n", &inet, "link", "set", port, "up"]);
        sh(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev]);
        sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
    }

    /// Public host `i` (1..): 10.200.0.(10 + i).
    pub fn public(&mut self, i: u8) -> Host {
        let ns = self.namespace(&format!("p{i}"));
        let ip = format!("10.200.0.{}", 10 + u32::from(i));
        self.plug(&ns, "eth0", &format!("p{i}"), &ip);
        Host { ns, ip }
    }

    /// This test process on the internet through a router whose forwarding passes a delay
    /// stage (see [`crate::delay`]): every packet between this process and `hosts[i]` waits
    /// `one_way[i]` each way. The stage runs until it is dropped.
    pub fn attach_delayed(&mut self, hosts: &[&Host], one_way: &[Duration]) -> DelayStage {
        let r = self.namespace("dly");
        self.plug(&r, "wan", "dly", "10.200.0.249");
        let (here, tun) = (format!("{}d", self.prefix), format!("{}t", self.prefix));
        let _ = Command::new("ip").args(["link", "del", &here]).output();
        sh(&["ip", "link", "add", &here, "type", "veth", "peer", "name", "in", "netns", &r]);
        sh(&["ip", "addr", "add", "10.201.0.2/24", "dev", &here]);
        sh(&["ip", "link", "set", &here, "up"]);
        sh(&["ip", "-n", &r, "addr", "add", "10.201.0.1/24", "dev", "in"]);
        sh(&["ip", "-n", &r, "link", "set", "in", "up"]);
        sh(&["ip", "route", "add", "10.200.0.0/24", "via", "10.201.0.1"]);
        for s in ["net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"] {
            sh(&["ip", "netns", "exec", &r, "sysctl", "-qw", s]);
        }
        let delays = hosts.iter().zip(one_way).map(|(h, d)| (h.ip.parse().unwrap(), *d)).collect();
        let stage = crate::delay::start(&tun, delays);
        sh(&["ip", "link", "set", &tun, "netns", &r]);
        sh(&["ip", "-n", &r, "link", "set", &tun, "up"]);
        // Everything the router forwards, either way, goes through the stage first.
        sh(&["ip", "-n", &r, "rule", "add", "iif", "in", "lookup", "100"]);
        sh(&["ip", "-n", &r, "rule", "add", "iif", "wan", "lookup", "100"]);
        sh(&["ip", "-n", &r, "route", "add", "default", "dev", &tun, "table", "100"]);
        for h in hosts {
            sh(&["ip", "-n", &h.ns, "route", "add", "10.201.0.0/24", "via", "10.200.0.249"]);
        }
        stage
    }

    /// Home `j` (1..): a router at 10.200.0.(100 + j) masquerading for a host at 192.168.j.2.
    pub fn home(&mut self, j: u8, nat: Nat) -> Host {
        let router = self.namespace(&format!("r{j}"));
        let ns = self.namespace(&format!("h{j}"));
        self.plug(&router, "wan", &format!("r{j}"), &format!("10.200.0.{}", 100 + u32::from(j)));
        sh(&["ip", "-n", &router, "link", "add", "lan", "type", "veth", "peer", "name", "eth0", "netns", &ns]);
        sh(&["ip", "-n", &router, "addr", "add", &format!("192.168.{j}.1/24"), "dev", "lan"]);
        sh(&["ip", "-n", &router, "link", "set", "lan", "up"]);
        let ip = format!("192.168.{j}.2");
        sh(&["ip", "-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"]);
        sh(&["ip", "-n", &ns, "route", "add", "default", "via", &format!("192.168.{j}.1")]);
        sh(&["ip", "netns", "exec", &router, "sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        let masquerade = match nat {
            Nat::Cone => "masquerade",
            Nat::Symmetric => "masquerade fully-random",
        };
        // Unasked-for packets from the internet are dropped, to the router too (so a
        // hole-punching packet that arrives early leaves no state that would remap the port).
        let rules = format!(
            "table ip nat {{\n chain post {{ type nat hook postrouting priority srcnat; policy accept; oifname \"wan\" {masquerade}; }}\n}}\n\
             table ip filter {{\n chain input {{ type filter hook input priority 0; policy accept; iifname \"wan\" ct state new drop; }}\n\
             chain forward {{ type filter hook forward priority 0; policy drop; iifname \"lan\" accept; ct state established,related accept; }}\n}}\n"
        );
        let mut nft = Command::new("ip")
            .args(["netns", "exec", &router, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(nft.stdin.as_mut().unwrap(), rules.as_bytes()).unwrap();
        drop(nft.stdin.take());
        assert!(nft.wait().unwrap().success(), "nft rules for {router}");
        Host { ns, ip }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.made.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// A node process in its host's namespace; what it prints goes to `DIR.out` and `DIR.err`.
fn run_in(host: &Host, dir: &Path, extra: &[&str]) -> Kill {
    let file = |ext: &str| std::fs::File::create(dir.with_extension(ext)).unwrap();
    Kill(
        Command::new("ip")
            .args(["netns", "exec", &host.ns, env!("CARGO_BIN_EXE_metatopia"), "run", "--data-dir"])
            .arg(dir)
            .args(["--http", &format!("{}:8100", host.ip)])
            .args(extra)
            .env("RUST_LOG", std::env::var("HOMES_LOG").unwrap_or_else(|_| "warn,metatopia_node::net=info".into()))
            .stdout(Stdio::from(file("out")))
            .stderr(Stdio::from(file("err")))
            .spawn()
            .unwrap(),
    )
}

/// A node's status, asked from inside its namespace.
fn status(host: &Host) -> Option<Status> {
    let out = Command::new("ip")
        .args(["netns", "exec", &host.ns, "curl", "-s", "--max-time", "2"])
        .arg(format!("http://{}:8100/v1/status", host.ip))
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// Wait until every host answers and `ok` holds for their statuses; on a timeout the test fails
/// with what each host said last (tick, vote, reachability, relays, paths).
fn wait_all(what: &str, limit: Duration, hosts: &[&Host], ok: impl Fn(&[Status]) -> bool) -> Vec<Status> {
    let t0 = std::time::Instant::now();
    let mut last: Vec<Option<Status>> = vec![None; hosts.len()];
    loop {
        let now: Vec<Option<Status>> = hosts.iter().map(|h| status(h)).collect();
        for (l, n) in last.iter_mut().zip(&now) {
            if n.is_some() {
                l.clone_from(n);
            }
        }
        if let Some(all) = now.into_iter().collect::<Option<Vec<Status>>>()
            && ok(&all)
        {
            return all;
        }
        if t0.elapsed() > limit {
            let said: Vec<String> = hosts
                .iter()
                .zip(&last)
                .map(|(h, s)| match s {
                    None => format!("{}: no answer", h.ns),
                    Some(s) => format!(
                        "{}: tick {} voting {} validators {}/{} {} relays {} holes punched {} failed {} paths {:?}",
                        h.ns,
                        s.tick,
                        s.voting,
                        s.validators_connected,
                        s.validators,
                        s.reachability,
                        s.relays.len(),
                        s.hole_punched,
                        s.hole_punch_failed,
                        s.peer_paths.iter().map(|(k, p)| format!("{}:{p}", &k[..6])).collect::<Vec<_>>()
                    ),
                })
                .collect();
            panic!("timed out after {limit:?} waiting for {what}; last seen:\n{}", said.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The node's libp2p peer id (as relayed addresses name it).
fn peer_of(dir: &Path) -> String {
    let key = metatopia_node::store::read_key(&dir.join("node.key")).unwrap().unwrap();
    metatopia_node::net::peer_id(&key.verifying_key()).to_string()
}

fn key_of(dir: &Path) -> String {
    let key = metatopia_node::store::read_key(&dir.join("node.key")).unwrap().unwrap();
    metatopia_sim::ids::hex(key.verifying_key().as_bytes())
}

const WORLD: &str = r#"
[world]
region_size = 64
physics = "kinematic"
tick_rate_hz = 20
epoch_ticks = 200

[[objects]]
name = "sign"
at = [10.0, 10.0]
text = "welcome"
"#;

/// The sim's nodes' data directories, made by `init` at their hosts' addresses and `sim new`.
fn make_sim(root: &Path, hosts: &[&Host]) -> Vec<PathBuf> {
    let _ = std::fs::remove_dir_all(root);
    std::fs::create_dir_all(root).unwrap();
    let dirs: Vec<PathBuf> = (0..hosts.len()).map(|i| root.join(format!("node-{i}"))).collect();
    for (d, h) in dirs.iter().zip(hosts) {
        ok(&["init", "--data-dir", d.to_str().unwrap(), "--listen", &format!("{}:7100", h.ip)]);
    }
    let world = root.join("world.toml");
    std::fs::write(&world, WORLD).unwrap();
    let out = root.join("sim");
    let mut args = vec!["sim", "new", "--out", out.to_str().unwrap(), "--world", world.to_str().unwrap()];
    for d in &dirs {
        args.extend(["--data-dir", d.to_str().unwrap()]);
    }
    ok(&args);
    dirs
}

/// Every node's status, once all of them answer.
fn statuses(hosts: &[&Host]) -> Option<Vec<Status>> {
    hosts.iter().map(|h| status(h)).collect()
}

/// Two validators on the internet, one behind a cone NAT and one behind a symmetric NAT: all
/// four vote and agree; the NATed ones find themselves private and hold reservations on the
/// public ones; the two NATed ones reach each other through a relay (the symmetric NAT defeats
/// hole punching, so it stays relayed). A node behind another cone NAT joins with `run --join`
/// and is admitted; it ends on a direct (hole-punched) connection to the cone home. A relay
/// killed mid-run: the homes find each other through the other one and the sim ticks on.
#[test]
fn validators_behind_nats_vote_through_relays_and_a_dead_relay_is_replaced() {
    needs_namespaces!();
    let mut net = Net::new("a");
    let p1 = net.public(1);
    let p2 = net.public(2);
    let cone = net.home(1, Nat::Cone);
    let sym = net.home(2, Nat::Symmetric);
    let hosts = [&p1, &p2, &cone, &sym];
    let root = std::env::temp_dir().join(format!("metatopia-homes-{}", std::process::id()));
    let dirs = make_sim(&root, &hosts);
    let keys: Vec<String> = dirs.iter().map(|d| key_of(d)).collect();
    let mut nodes: Vec<Option<Kill>> = hosts.iter().zip(&dirs).map(|(h, d)| Some(run_in(h, d, &[]))).collect();

    // All four tick together: every one a voter, all on one root at some tick.
    let s = wait_all("four voting nodes past tick 100", Duration::from_secs(90), &hosts, |s| {
        s.iter().all(|s| s.voting && s.tick.0 > 100 && s.validators_connected == 4)
    });
    assert!(s.iter().all(|s| s.validators == 4), "{s:?}");
    // Reachability: the public ones public, the homes private with reservations on relays.
    let s = wait_all("reachability found and reservations held", Duration::from_secs(60), &hosts, |s| {
        s[0].reachability == "public"
            && s[1].reachability == "public"
            && s[2].reachability == "private"
            && s[3].reachability == "private"
            && !s[2].relays.is_empty()
            && !s[3].relays.is_empty()
            && s[2].peer_paths.contains_key(&keys[3])
            && s[0].relay_serving[1] + s[1].relay_serving[1] >= 1
    });
    for home in &s[2..] {
        assert!(home.relays.iter().all(|r| *r == keys[0] || *r == keys[1]), "relays are the public nodes: {home:?}");
    }
    // Their signed cards name where they are reached: a circuit through each relay (so a node
    // of any sim can dial them); the public ones' cards name none.
    let s = wait_all("the homes' cards naming their relays", Duration::from_secs(30), &hosts, |s| {
        s[2..].iter().all(|h| h.card_relayed.len() == h.relays.len())
    });
    assert!(s[..2].iter().all(|p| p.card_relayed.is_empty()), "{:?}", &s[..2]);
    for (home, host) in s[2..].iter().zip([&cone, &sym]) {
        let me = peer_of(&dirs[hosts.iter().position(|h| h.ip == host.ip).unwrap()]);
        for r in &home.relays {
            let relay = keys.iter().position(|k| k == r).unwrap();
            let relay_ip = &hosts[relay].ip;
            let want = format!("/ip4/{relay_ip}/");
            let circuit = format!("/p2p/{}/p2p-circuit/p2p/{me}", peer_of(&dirs[relay]));
            assert!(
                home.card_relayed.iter().any(|a| a.starts_with(&want) && a.ends_with(&circuit)),
                "a circuit through relay {r} at {relay_ip} in {:?}",
                home.card_relayed
            );
        }
    }
    // The homes reach the public nodes directly (they dial out), and each other through a
    // relay: the symmetric NAT gives the hole punch a port it cannot predict.
    assert_eq!(s[2].peer_paths.get(&keys[3]).map(String::as_str), Some("relayed"), "{:?}", s[2].peer_paths);
    assert_eq!(s[3].peer_paths.get(&keys[2]).map(String::as_str), Some("relayed"), "{:?}", s[3].peer_paths);
    for (i, home) in s[2..].iter().enumerate() {
        for p in &keys[..2] {
            let path = home.peer_paths.get(p).map(String::as_str);
            assert!(matches!(path, Some("quic" | "tcp")), "home {i} reaches public {p} directly: {path:?}");
        }
    }
    // Roots equal at a tick all four executed.
    let t = s.iter().map(|s| s.tick).min().unwrap();
    let roots: Vec<String> = hosts
        .iter()
        .map(|h| {
            let out = Command::new("ip")
                .args(["netns", "exec", &h.ns, "curl", "-s", "--max-time", "2"])
                .arg(format!("http://{}:8100/v1/roots/{t}", h.ip))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .collect();
    assert!(roots.iter().all(|r| *r == roots[0] && !r.is_empty()), "roots at tick {t}: {roots:?}");

    // A node at home (another cone NAT) joins through a public node and is admitted: it
    // reaches the cone home through a relay and then directly by hole punching, and the
    // symmetric home only through a relay.
    let joiner = net.home(3, Nat::Cone);
    let jdir = root.join("joiner");
    ok(&["init", "--data-dir", jdir.to_str().unwrap(), "--listen", &format!("{}:7100", joiner.ip)]);
    nodes.push(Some(run_in(&joiner, &jdir, &["--join", &format!("{}@{}:7100", keys[0], p1.ip)])));
    let jkey = key_of(&jdir);
    wait_for("the joiner to follow", Duration::from_secs(60), || status(&joiner).filter(|s| s.tick.0 > 0));
    let admin = root.join("sim").join("admin.key");
    let out = Command::new("ip")
        .args(["netns", "exec", &p1.ns, env!("CARGO_BIN_EXE_metatopia"), "admin", "--node"])
        .arg(format!("{}:8100", p1.ip))
        .arg("--key")
        .arg(&admin)
        .args(["admit-validator", &jkey])
        .output()
        .unwrap();
    assert!(out.status.success(), "admit: {}", String::from_utf8_lossy(&out.stderr));
    let all = [&p1, &p2, &cone, &sym, &joiner];
    let what = "the joiner admitted, voting, punched through to the cone home";
    // Generous: on a loaded machine the identify exchange that gives the punch its observed
    // addresses, and the punch's own attempts, take a while.
    let s = wait_all(what, Duration::from_secs(120), &all, |s| {
        s[4].voting
            && s.iter().all(|s| s.validators == 5)
            && s[4].reachability == "private"
            && s[2].peer_paths.get(&jkey).is_some_and(|p| p == "quic")
            && s[4].peer_paths.get(&keys[2]).is_some_and(|p| p == "quic")
    });
    assert!(s[2].hole_punched + s[4].hole_punched >= 1, "the direct path came from a hole punch: {:?}", &s[2..]);
    assert_eq!(s[4].peer_paths.get(&keys[3]).map(String::as_str), Some("relayed"), "{:?}", s[4].peer_paths);
    let mark = s[4].tick;
    wait_for("the joiner to keep up", Duration::from_secs(30), || status(&joiner).filter(|t| t.tick > mark + 40));

    // A third public node follows the sim (joined through a public one): the homes meet it
    // through the overlay, and it can relay too.
    let p3 = net.public(3);
    let d3 = root.join("public-follower");
    ok(&["init", "--data-dir", d3.to_str().unwrap(), "--listen", &format!("{}:7100", p3.ip)]);
    nodes.push(Some(run_in(&p3, &d3, &["--join", &format!("{}@{}:7100", keys[1], p2.ip)])));
    let k3 = key_of(&d3);
    wait_all("the homes to reach the public follower", Duration::from_secs(60), &[&cone, &sym, &joiner], |s| {
        s.iter().all(|h| h.peer_paths.contains_key(&k3))
    });

    // Kill a relay of the symmetric home: each home that held a reservation there takes one
    // on another public node within seconds, the homes find each other again through a
    // remaining relay, and the sim keeps committing.
    let dead = keys.iter().position(|k| s[3].relays.contains(k)).unwrap();
    let dead_at = format!("/ip4/{}/", hosts[dead].ip);
    drop(nodes[dead].take());
    let killed = std::time::Instant::now();
    let alive: Vec<&Host> = [&p1, &p2, &cone, &sym, &joiner, &p3]
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != dead)
        .map(|(_, h)| h)
        .collect();
    let before = statuses(&alive).unwrap().iter().map(|s| s.tick).max().unwrap();
    let s = wait_all("the homes' reservations replaced", Duration::from_secs(45), &alive, |s| {
        let homes: Vec<&Status> = s.iter().filter(|s| s.reachability == "private").collect();
        homes.len() == 3
            && homes.iter().all(|h| !h.relays.contains(&keys[dead]) && h.relays.len() == 2)
            && homes.iter().all(|h| h.card_relayed.len() == 2 && h.card_relayed.iter().all(|a| !a.contains(&dead_at)))
            && homes[0].peer_paths.get(&keys[3]).is_some_and(|p| p == "relayed")
    });
    eprintln!("reservations replaced {:?} after the relay was killed", killed.elapsed());
    let s2 = wait_all("ticks committed after the relay died", Duration::from_secs(30), &alive, |t| {
        t.iter().all(|t| t.tick > before + 100)
    });
    assert!(s2.iter().all(|t| t.desynced.is_none()), "{s2:?}");
    drop(s);
    drop(nodes);
    if std::env::var_os("HOMES_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
}

/// A player's client given any node of the world ends on the node of its sim with the lowest
/// round trip (the path from the client to the nodes is 60, 3, 15 and 40 ms long one way: a
/// delay stage on the network path, in user space; far enough apart that a loaded machine's
/// own delays never make two of them equally near by the client's rule), moves to the next nearest when that node
/// dies, and back once it returns and is clearly nearer. Then the web viewer, in headless
/// Chromium on the same paths: its page from node 0, it moves to node 1, and when node 1 dies
/// it goes on from node 2.
#[test]
fn a_client_uses_the_nearest_node_of_its_sim_and_moves_when_it_dies_and_returns() {
    needs_namespaces!();
    let mut net = Net::new("b");
    let hosts: Vec<Host> = (1..=4).map(|i| net.public(i)).collect();
    let refs: Vec<&Host> = hosts.iter().collect();
    let one_way: Vec<Duration> = [60, 3, 15, 40].into_iter().map(Duration::from_millis).collect();
    let stage = net.attach_delayed(&refs, &one_way);
    let root = std::env::temp_dir().join(format!("metatopia-nearest-{}", std::process::id()));
    let dirs = make_sim(&root, &refs);
    let keys: Vec<String> = dirs.iter().map(|d| key_of(d)).collect();
    let start = |i: usize| run_in(&hosts[i], &dirs[i], &[]);
    let mut nodes: Vec<Option<Kill>> = (0..4).map(|i| Some(start(i))).collect();
    wait_all("four ticking nodes", Duration::from_secs(60), &refs, |s| s.iter().all(|s| s.tick.0 > 20));

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let bootstrap = metatopia_client::proto::NodeAddr {
            key: keys[0].clone(),
            addr: format!("{}:7100", hosts[0].ip),
            http: None,
        };
        let key = ed25519_dalek::SigningKey::from_bytes(&[42; 32]);
        let mut c = metatopia_client::Client::connect(&bootstrap, key).await.unwrap();
        c.set_probe_every(Duration::from_secs(2));
        let on = |c: &metatopia_client::Client| c.node().map(|n| n.key.clone()).unwrap_or_default();
        assert_eq!(on(&c), keys[1], "the nearest node: {:?}", c.round_trips());
        eprintln!("client: on the nearest node; round trips {:?}", c.round_trips());
        let rtt = |i: usize| c.round_trips()[i].unwrap_or(Duration::MAX);
        assert!(rtt(1) < rtt(2) && rtt(2) < rtt(3) && rtt(3) < rtt(0), "{:?}", c.round_trips());
        // The round trips are the path's: at least twice its one-way length each.
        for (i, d) in one_way.iter().enumerate() {
            assert!(rtt(i) >= *d * 2, "node {i}: {:?} over a path of {d:?} each way", rtt(i));
        }

        // Its node dies: it moves to the next nearest (as soon as a probe goes unanswered, or
        // when the connection times out, whichever comes first).
        drop(nodes[1].take());
        let t0 = std::time::Instant::now();
        while on(&c) == keys[1] {
            assert!(t0.elapsed() < Duration::from_secs(30), "still on the dead node");
            c.run_until(Duration::from_millis(500), |_, _| false).await;
        }
        eprintln!("left the dead node after {:?}", t0.elapsed());
        assert_eq!(on(&c), keys[2], "the next nearest after the nearest died: {:?}", c.round_trips());
        let moves = c.nearer_moves;

        // It comes back: the client measures again and moves to it.
        nodes[1] = Some(start(1));
        let t0 = std::time::Instant::now();
        while on(&c) != keys[1] {
            assert!(t0.elapsed() < Duration::from_secs(60), "back on the nearest node: {:?}", c.round_trips());
            c.run_until(Duration::from_millis(500), |_, _| false).await;
        }
        assert!(c.nearer_moves > moves);
    });
    // The web viewer, on the same paths.
    wait_all("node 1 back in step", Duration::from_secs(60), &refs, |s| s.iter().all(|s| s.tick.0 > 20 && s.voting));
    let (chromium, e2e) = crate::viewer::browser();
    let http = |i: usize| format!("{}:8100", hosts[i].ip);
    let url = format!("http://{}/", http(0));
    let mut page = crate::viewer::Page::start(&e2e, &chromium, "nearest.mjs", &[&url, &http(1), &http(2)]);
    eprintln!("viewer: {}", page.line("on the nearest node"));
    drop(nodes[1].take());
    let (ok, stdout, stderr) = page.finish();
    assert!(ok && stdout.contains("viewer nearest passed"), "{stdout}\n{stderr}");
    for line in stdout.lines().filter(|l| l.starts_with("moved")) {
        eprintln!("viewer: {line}");
    }
    drop(nodes);
    eprintln!("{} packets passed the delay stage", stage.passed.load(std::sync::atomic::Ordering::Relaxed));
    drop(stage);
    let _ = std::fs::remove_dir_all(&root);
}
