//! A sim its owner really owns (DESIGN §10), on real processes at real Unix times: made the
//! operator's way (`init`, `sim new` with a world file and a fresh admin key), four `run`
//! processes; a stranger cannot take it; the admin's key governs; the temp-admin rule picks the
//! longest-standing recent player once the admin is away; a node joins with `init` + `run --join`
//! and refuses a sim whose genesis is not the one its join address names.

use crate::support::{Kill, Scratch, cli, ok, refused, wait_for};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use metatopia_node::api::http::{Client, GovernanceView, Status};

fn free_ports(n: usize) -> Vec<u16> {
    metatopia_node::net::free_ports(n).unwrap()
}

fn governance(http: &str) -> Option<GovernanceView> {
    Client::new(http).get("/v1/governance").ok().flatten()
}

fn status(http: &str) -> Option<Status> {
    Client::new(http).get("/v1/status").ok().flatten()
}

/// A `run` process; what it prints goes to `DIR.out` and `DIR.err` beside its data directory.
fn run(dir: &Path, http: &str, extra: &[&str]) -> Kill {
    let file = |ext: &str| std::fs::File::create(dir.with_extension(ext)).unwrap();
    Kill(
        Command::new(env!("CARGO_BIN_EXE_metatopia"))
            .args(["run", "--data-dir"])
            .arg(dir)
            .args(["--http", http])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::from(file("out")))
            .stderr(Stdio::from(file("err")))
            .spawn()
            .unwrap(),
    )
}

/// The account id (hex) of a key file.
fn account_of(key_file: &Path) -> String {
    let key = metatopia_node::store::read_key(key_file).unwrap().unwrap();
    metatopia_sim::ids::hex(key.verifying_key().as_bytes())
}

struct Sim {
    root: Scratch,
    dirs: Vec<PathBuf>,
    http: Vec<String>,
    listen: Vec<String>,
}

/// Four nodes made with `init`, and a sim made for them with `sim new` from a world file.
fn make_sim(name: &str, world: &str) -> (Sim, String) {
    let scratch = Scratch::made(name);
    let root = scratch.0.clone();
    let ports = free_ports(8);
    let quic = metatopia_node::net::free_udp_ports(4).unwrap();
    let mut sim = Sim { root: scratch, dirs: Vec::new(), http: Vec::new(), listen: Vec::new() };
    for i in 0..4 {
        let d = root.join(format!("node-{i}"));
        let listen = format!("127.0.0.1:{}", ports[i]);
        let q = format!("127.0.0.1:{}", quic[i]);
        let out = ok(&["init", "--data-dir", d.to_str().unwrap(), "--listen", &listen, "--quic", &q]);
        assert!(out.contains("sim new") && out.contains("--join"), "init says what comes next: {out}");
        sim.dirs.push(d);
        sim.http.push(format!("127.0.0.1:{}", ports[4 + i]));
        sim.listen.push(listen);
    }
    let world_file = root.join("world.toml");
    std::fs::write(&world_file, world).unwrap();
    std::fs::write(root.join("hello.rhai"), "fn on_touch(who) { say(0, \"hello\"); }\n").unwrap();
    let out_dir = root.join("sim");
    let mut args = vec!["sim", "new", "--out", out_dir.to_str().unwrap(), "--world", world_file.to_str().unwrap()];
    for d in &sim.dirs {
        args.extend(["--data-dir", d.to_str().unwrap()]);
    }
    let out = ok(&args);
    assert!(out.contains("genesis hash") && out.contains("admin.key"), "{out}");
    (sim, out)
}

const WORLD: &str = r#"
[world]
region_size = 64
physics = "kinematic"
tick_rate_hz = 20
# A governance day passes in 4.32 s of real time.
time_scale = 20000
admin_absent_days = 30
temp_admin_active_days = 30
# Two governance days: 8.6 s of real time.
kick_cooldown_secs = 172800

[[objects]]
name = "sign"
at = [10.0, 10.0]
text = "welcome"
script = "hello.rhai"
"#;

#[test]
fn a_sim_made_by_its_operator_belongs_to_its_admin_key_and_the_temp_admin_rule_holds_on_real_time() {
    let (sim, said) = make_sim("ownership", WORLD);
    let admin_key = sim.root.join("sim").join("admin.key");
    let admin = account_of(&admin_key);
    assert!(said.contains(&admin), "sim new names the admin: {said}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&admin_key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the admin key is readable by its owner only");
    }
    // Every node holds the same genesis, and its config names its hash.
    let shown: Vec<String> = sim.dirs.iter().map(|d| ok(&["sim", "show", d.to_str().unwrap()])).collect();
    assert!(shown.iter().all(|s| s.lines().next() == shown[0].lines().next()), "{shown:?}");
    assert!(shown[0].contains("4 validators") && shown[0].contains("1 objects") && shown[0].contains("1 scripts"));
    let nodes: Vec<Kill> = sim.dirs.iter().zip(&sim.http).map(|(d, h)| run(d, h, &[])).collect();
    wait_for("the four nodes to tick", Duration::from_secs(120), || {
        let s: Vec<Status> = sim.http.iter().filter_map(|h| status(h)).collect();
        (s.len() == 4 && s.iter().all(|s| s.tick.0 >= 10)).then_some(())
    });
    let node = |i: usize| sim.http[i].as_str();
    // Keys made as an operator or player makes them: random, in files of their own.
    let key = |name: &str| {
        let d = sim.root.join(name);
        ok(&["init", "--data-dir", d.to_str().unwrap()]);
        d.join("node.key")
    };
    let (stranger, p1, p2) = (key("stranger"), key("p1"), key("p2"));
    let act = |key: &Path, via: usize, what: &[&str]| -> (bool, String) {
        let mut args = vec!["admin", "--node", node(via), "--key", key.to_str().unwrap()];
        args.extend(what);
        let (success, out, err) = cli(&args);
        (success, format!("{out}{err}"))
    };

    // A stranger logs in a moment after genesis: it is not temp admin, and its admin acts are
    // refused, whichever node it goes through.
    // What execution would refuse is refused at the door, before it reaches the pool.
    let (done, out) = act(&stranger, 1, &["login", &"x".repeat(70)]);
    assert!(!done && out.contains("refused: name is 70 bytes, the limit is 64"), "{out}");
    let (done, out) = act(&stranger, 1, &["login", "stranger"]);
    assert!(done && out.contains("executed"), "{out}");
    for (via, what) in [(2, vec!["ban", admin.as_str()]), (3, vec!["transfer-admin", &account_of(&stranger)])] {
        let (done, out) = act(&stranger, via, &what);
        assert!(!done && out.contains("needs the admin or temp-admin role"), "{out}");
    }
    for h in &sim.http {
        let g = governance(h).unwrap();
        assert_eq!((g.admin.as_str(), g.temp_admin.as_deref()), (admin.as_str(), None), "{h}: {g:?}");
        assert!(!g.admin_absent, "the admin of a fresh sim is present: {g:?}");
    }

    // The admin's key governs: it logs in, bans the stranger, and shortens X to one day.
    let (done, out) = act(&admin_key, 0, &["login", "owner"]);
    assert!(done, "{out}");
    let (done, out) = act(&admin_key, 1, &["ban", &account_of(&stranger)]);
    assert!(done, "{out}");
    // Two players arrive, P1 first.
    for (k, name) in [(&p1, "p1"), (&p2, "p2")] {
        let (done, out) = act(k, 2, &["login", name]);
        assert!(done, "{out}");
    }
    let (done, out) = act(&admin_key, 3, &["settings", "--admin-absent-days", "1"]);
    assert!(done, "{out}");

    // A day of BFT time later, with the admin away: P1, the longest-standing recent player, is
    // temp admin on every node (the banned stranger joined earlier but does not count).
    let p1_id = account_of(&p1);
    for h in &sim.http {
        let g = wait_for("the admin to count as absent", Duration::from_secs(60), || {
            governance(h).filter(|g| g.admin_absent)
        });
        assert_eq!(g.temp_admin.as_deref(), Some(p1_id.as_str()), "{h}: {g:?}");
        assert_eq!(g.admin, admin, "the temp admin's role does not make it admin");
    }
    // P1 acts as admin (P2 may not); then the admin logs in and P1 loses the role.
    let (done, out) = act(&p2, 0, &["unban", &account_of(&stranger)]);
    assert!(!done && out.contains("needs the admin or temp-admin role"), "{out}");
    // Refused acts can be tried again once their cause is gone, and get a fresh outcome.
    let (done, out) = act(&stranger, 2, &["login", "stranger"]);
    assert!(!done && out.contains("account is banned"), "{out}");
    let (done, out) = act(&p1, 0, &["unban", &account_of(&stranger)]);
    assert!(done, "{out}");
    let (done, out) = act(&stranger, 2, &["login", "stranger"]);
    assert!(done && out.contains("executed"), "the unbanned stranger logs in again: {out}");
    // The admin comes back (P1 loses the role at once) and sets X back to 30 days.
    let (done, out) = act(&admin_key, 1, &["login", "owner"]);
    assert!(done, "{out}");
    let (done, out) = act(&admin_key, 2, &["settings", "--admin-absent-days", "30"]);
    assert!(done, "{out}");
    for h in &sim.http {
        let g = governance(h).unwrap();
        assert!(g.banned.is_empty() && g.temp_admin.is_none() && !g.admin_absent, "{h}: {g:?}");
    }
    let (done, out) = act(&admin_key, 1, &["kick", &account_of(&p2)]);
    assert!(done, "{out}");
    let (done, out) = act(&p2, 3, &["login", "p2"]);
    assert!(!done && out.contains("account is kicked until 20"), "a date, not milliseconds: {out}");
    let out = wait_for("the kicked player to log in after the cooldown", Duration::from_secs(90), || {
        let (done, out) = act(&p2, 3, &["login", "p2"]);
        done.then_some(out)
    });
    assert!(out.contains("executed"), "{out}");
    // The settings act is checked before anything is signed, naming the field.
    let (done, out) = act(&admin_key, 0, &["settings", "--aoi-radius-m", "100000"]);
    assert!(!done && out.contains("aoi_radius_m must be 1..=1024 m, not 100000; nothing was submitted"), "{out}");

    // Honest signals: with one validator down, the others say 3 of 4, name it, and stay ready
    // (3 is a quorum of 4); with two down, they are not ready.
    let mut nodes = nodes;
    drop(nodes.pop());
    let key3 = account_of(&sim.dirs[3].join("node.key"));
    let want = format!("validators         3 of 4 connected (unreachable: {key3})\n");
    let stats = wait_for("node 0 to count 3 of 4 validators", Duration::from_secs(60), || {
        let out = ok(&["stats", "--node", node(0)]);
        out.contains(&want).then_some(out)
    });
    assert!(stats.contains("tick rate"), "{stats}");
    let warning = format!("warning: validator {key3} of this sim unreachable for 10s (3 of 4 validators connected)");
    wait_for("node 0 to name the missing validator", Duration::from_secs(60), || {
        std::fs::read_to_string(sim.dirs[0].with_extension("err")).unwrap().contains(&warning).then_some(())
    });
    assert_eq!(Client::new(node(0)).get_text("/readyz").unwrap().0, 200);
    drop(nodes.pop());
    // (The sim stalls at once; the mesh notices the lost peer within its connection timeouts.)
    let (code, why) = wait_for("node 0 to be not ready for want of validators", Duration::from_secs(60), || {
        Some(Client::new(node(0)).get_text("/readyz").unwrap()).filter(|(_, why)| why.contains("2 of 4 validators"))
    });
    assert_eq!(code, 503);
    assert!(why.contains("2 of 4 validators of this sim reachable, a quorum needs 3"), "{why}");
    drop(nodes);
}

#[test]
fn a_node_without_its_owners_genesis_does_not_run_and_a_joiner_checks_the_genesis_it_is_named() {
    let (sim, said) = make_sim("genesis-checks", WORLD);
    let hash = said.split("hash ").nth(1).and_then(|r| r.split(|c: char| !c.is_ascii_hexdigit()).next()).unwrap();
    assert_eq!(hash.len(), 64, "{said}");
    // `run` on a node with no genesis, or on a config describing a demo world without the
    // explicit demo flag, fails and says what to do.
    let lone = sim.root.join("lone");
    ok(&["init", "--data-dir", lone.to_str().unwrap(), "--listen", "127.0.0.1:1"]);
    let err = refused(&["run", "--data-dir", lone.to_str().unwrap()]);
    assert!(err.contains("has no genesis") && err.contains("sim new") && err.contains("--join"), "{err}");
    let config = lone.join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\n[world]\n", "\n[world]\nscenario = \"devnet.toml\"\n")).unwrap();
    let err = refused(&["run", "--data-dir", lone.to_str().unwrap()]);
    assert!(err.contains("has no genesis"), "a demo world is not reachable without world.demo: {err}");

    let nodes: Vec<Kill> = sim.dirs.iter().zip(&sim.http).map(|(d, h)| run(d, h, &[])).collect();
    wait_for("the four nodes to tick", Duration::from_secs(120), || {
        let s: Vec<Status> = sim.http.iter().filter_map(|h| status(h)).collect();
        (s.len() == 4 && s.iter().all(|s| s.tick.0 >= 10)).then_some(())
    });
    let key0 = account_of(&sim.dirs[0].join("node.key"));
    let join = format!("{key0}@{}", sim.listen[0]);
    let ports = free_ports(3);
    let quic = metatopia_node::net::free_udp_ports(1).unwrap();
    let joiner = sim.root.join("joiner");
    let (listen, q, http) =
        (format!("127.0.0.1:{}", ports[0]), format!("127.0.0.1:{}", quic[0]), format!("127.0.0.1:{}", ports[1]));
    ok(&["init", "--data-dir", joiner.to_str().unwrap(), "--listen", &listen, "--quic", &q]);
    // A join address naming another genesis is refused before anything is written.
    let wrong = format!("{join}/{}", "ab".repeat(32));
    let err =
        refused(&["run", "--data-dir", joiner.to_str().unwrap(), "--http", &http, "--join", &wrong, "--ticks", "1"]);
    assert!(err.contains("not the one the join address names"), "{err}");
    assert!(!joiner.join("genesis.bin").exists());
    // The right one: `init` then `run --join` follows the sim.
    let right = format!("{join}/{hash}");
    let _j = run(&joiner, &http, &["--join", &right]);
    let s =
        wait_for("the joined node to follow", Duration::from_secs(120), || status(&http).filter(|s| s.tick.0 >= 20));
    assert_eq!(s.sim, 1);
    assert_eq!(
        ok(&["sim", "show", joiner.to_str().unwrap()]).lines().next(),
        ok(&["sim", "show", sim.dirs[0].to_str().unwrap()]).lines().next()
    );
    drop(nodes);
}
