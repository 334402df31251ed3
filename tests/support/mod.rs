//! Helpers shared by the node's and the lab's integration tests.

/// The binary under test: `metatopia`, or in the lab's tests `metatopia-lab` (which has every
/// `metatopia` command too).
pub fn bin() -> &'static str {
    option_env!("CARGO_BIN_EXE_metatopia")
        .or(option_env!("CARGO_BIN_EXE_metatopia-lab"))
        .expect("a test of the node or the lab")
}

use std::process::Command;

/// The longest any one `metatopia` command of a test may take: one that never ends fails its
/// test (with what it printed) instead of hanging the whole suite.
const CLI_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Run the `metatopia` binary: success, stdout, stderr.
pub fn cli(args: &[&str]) -> (bool, String, String) {
    use std::io::Read;
    let mut child = Command::new(bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > CLI_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            let (o, e) = (out.join().unwrap(), err.join().unwrap());
            panic!("`metatopia {}` did not end within {CLI_LIMIT:?}:\n{o}\n{e}", args.join(" "));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    (status.success(), out.join().unwrap(), err.join().unwrap())
}

/// Run the binary under test and expect success: its stdout.
pub fn ok(args: &[&str]) -> String {
    let (success, out, err) = cli(args);
    assert!(success, "`metatopia {}` failed:\n{out}\n{err}", args.join(" "));
    out
}

/// Run the binary under test and expect it to refuse: its stderr (the reason).
pub fn refused(args: &[&str]) -> String {
    let (success, out, err) = cli(args);
    assert!(!success, "`metatopia {}` should have been refused:\n{out}\n{err}", args.join(" "));
    err
}

/// Poll `f` every 200 ms until it gives a value; fail the test (naming `what`) after `limit`.
pub fn wait_for<T>(what: &str, limit: std::time::Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A node process, killed when dropped.
pub struct Kill(pub std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A test's own directory under the system's temporary one (`metatopia-NAME-PID`), empty and
/// not yet made: removed when dropped, unless its test is failing, when it stays for a look
/// (its path printed). A passing run leaves nothing behind.
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("metatopia-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }

    /// Made, for a test that writes into it directly.
    pub fn made(name: &str) -> Scratch {
        let s = Scratch::new(name);
        std::fs::create_dir_all(&s.0).unwrap();
        s
    }
}

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for a look: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Four validators of one sim as real `metatopia run` processes on loopback, on the world of a
/// catalogue scenario; ticking when this returns.
pub struct Cluster {
    pub root: std::path::PathBuf,
    pub nodes: Vec<Option<Kill>>,
    /// Each node's join address (`KEY@127.0.0.1:PORT`; QUIC on that UDP port).
    pub join: Vec<String>,
    /// Each node's HTTP address.
    pub http: Vec<String>,
}

impl Cluster {
    pub fn start(name: &str, scenario: &str) -> Cluster {
        Cluster::world(name, scenario, 1)
    }

    /// As [`Cluster::start`], with every frame between the nodes delayed `one_way_ms` (± 20 %)
    /// by the mesh's test-only delay stage: four nodes as far apart as homes on one continent.
    pub fn start_apart(name: &str, scenario: &str, one_way_ms: u32) -> Cluster {
        let delay = one_way_ms.to_string();
        Cluster::world_with(name, scenario, 1, &["--test-link-delay-ms", &delay, "--test-link-jitter-percent", "20"])
    }

    /// `sims` sims of four validators each (sim k's are nodes 4(k-1) … 4k-1), on the world of a
    /// catalogue scenario with that many sims.
    pub fn world(name: &str, scenario: &str, sims: usize) -> Cluster {
        Cluster::world_with(name, scenario, sims, &[])
    }

    /// As [`Cluster::world`], with `extra` arguments to every node's `metatopia run`.
    pub fn world_with(name: &str, scenario: &str, sims: usize, extra: &[&str]) -> Cluster {
        let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        Cluster::world_each(name, scenario, sims, &|_| extra.clone())
    }

    /// As [`Cluster::world`], with `extra(i)` arguments to node `i`'s `metatopia run`.
    pub fn world_each(name: &str, scenario: &str, sims: usize, extra: &dyn Fn(usize) -> Vec<String>) -> Cluster {
        use metatopia_node::config::{
            BotsConfig, NodeConfig, RaynetConfig, SimEntry, SimValidator, ValidatorEntry, WorldConfig,
        };
        use metatopia_node::store::{DataDir, write_atomic};
        let n = 4 * sims;
        let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let root = std::env::temp_dir().join(format!("metatopia-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let ports = metatopia_node::net::free_ports(2 * n).unwrap();
        let quic = metatopia_node::net::free_udp_ports(n).unwrap();
        let dirs: Vec<std::path::PathBuf> = (0..n).map(|i| root.join(format!("node-{i}"))).collect();
        let validators: Vec<ValidatorEntry> = dirs
            .iter()
            .zip(&ports)
            .enumerate()
            .map(|(i, (d, p))| ValidatorEntry {
                key: metatopia_sim::ids::hex(DataDir::open(d).unwrap().key().unwrap().verifying_key().as_bytes()),
                address: ([127, 0, 0, 1], *p).into(),
                quic: Some(([127, 0, 0, 1], quic[i]).into()),
                http: Some(([127, 0, 0, 1], ports[n + i]).into()),
                observer: false,
            })
            .collect();
        let of_sim = |k: usize| validators[4 * k..4 * k + 4].to_vec();
        let world = repo.join("scenarios").join("catalogue").join(scenario).canonicalize().unwrap();
        // One genesis time for the world's nodes: a real one, as an operator's sim has.
        let genesis_ms = metatopia_node::unix_ms();
        for (i, d) in dirs.iter().enumerate() {
            let k = i / 4;
            let cfg = NodeConfig {
                listen: validators[i].address,
                quic: validators[i].quic,
                http: Some(([127, 0, 0, 1], ports[n + i]).into()),
                tick_rate_hz: 20,
                snapshot_every: 640,
                genesis_hash: None,
                world: WorldConfig {
                    sim_id: k as u32 + 1,
                    scenario: Some(world.clone()),
                    ..WorldConfig::demo(genesis_ms)
                },
                bots: BotsConfig::default(),
                validators: of_sim(k),
                join: None,
                sims: (0..sims)
                    .filter(|j| *j != k)
                    .map(|j| SimEntry {
                        sim_id: j as u32 + 1,
                        validators: of_sim(j).iter().map(SimValidator::key_of).collect(),
                    })
                    .collect(),
                // Only their keys: their addresses are found through Raynet, from node 0.
                raynet: RaynetConfig {
                    bootstrap: vec![format!("{}@{}", validators[0].key, validators[0].address)],
                    ..RaynetConfig::default()
                },
                network: Default::default(),
                sim_workers: None,
                block_history_mib: None,
            };
            write_atomic(&DataDir::open(d).unwrap().config_path(), cfg.commented().as_bytes()).unwrap();
        }
        let nodes = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Some(Kill(
                    Command::new(bin())
                        .args(["run", "--data-dir"])
                        .arg(d)
                        .args(extra(i))
                        .env("RUST_LOG", "warn")
                        .stdout(std::process::Stdio::null())
                        .spawn()
                        .unwrap(),
                ))
            })
            .collect();
        let cluster = Cluster {
            root,
            nodes,
            join: validators.iter().map(|v| format!("{}@{}", v.key, v.address)).collect(),
            http: (0..n).map(|i| format!("127.0.0.1:{}", ports[n + i])).collect(),
        };
        let t0 = std::time::Instant::now();
        while (0..sims).any(|k| cluster.status(4 * k).is_none_or(|s| s.tick.0 < 10)) {
            assert!(t0.elapsed() < std::time::Duration::from_secs(120), "the nodes did not start ticking");
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        cluster
    }

    pub fn status(&self, i: usize) -> Option<metatopia_node::api::http::Status> {
        metatopia_node::api::http::Client::new(&self.http[i]).get("/v1/status").ok().flatten()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
