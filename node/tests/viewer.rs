//! The web viewer end to end: four real nodes on loopback run the plaza scenario's world; the
//! viewer served by node 0 is driven in real headless Chromium (playwright-core): objects
//! appear, the browser makes a key and logs in, chat gets the echo bot's reply, the door's
//! script source shows, touching opens the door; a screenshot is saved under target/.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use metatopia_node::config::{BotsConfig, NodeConfig, ValidatorEntry, WorldConfig};
use metatopia_node::http::{Client, Status};
use metatopia_node::store::{DataDir, write_atomic};

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_viewer_in_headless_chromium_logs_in_chats_reads_a_script_and_opens_the_door() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "the viewer test needs Chromium at {chromium} (Debian: apt-get install chromium; .ci/setup installs it)"
    );
    let e2e = repo().join("tests").join("viewer");
    if !e2e.join("node_modules").join("playwright-core").exists() {
        let ok = Command::new("npm").args(["ci", "--no-audit", "--no-fund"]).current_dir(&e2e).status().unwrap();
        assert!(ok.success(), "npm ci in tests/viewer failed");
    }

    let root = std::env::temp_dir().join(format!("metatopia-viewer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let ls: Vec<_> = (0..8).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let ports: Vec<u16> = ls.iter().map(|l| l.local_addr().unwrap().port()).collect();
    drop(ls);
    let dirs: Vec<PathBuf> = (0..4).map(|i| root.join(format!("node-{i}"))).collect();
    let validators: Vec<ValidatorEntry> = dirs
        .iter()
        .zip(&ports)
        .map(|(d, p)| ValidatorEntry {
            key: metatopia_sim::ids::hex(DataDir::open(d).unwrap().key().unwrap().verifying_key().as_bytes()),
            address: ([127, 0, 0, 1], *p).into(),
        })
        .collect();
    let plaza = repo().join("scenarios").join("catalogue").join("plaza.toml").canonicalize().unwrap();
    for (i, d) in dirs.iter().enumerate() {
        let cfg = NodeConfig {
            listen: validators[i].address,
            http: Some(([127, 0, 0, 1], ports[4 + i]).into()),
            tick_rate_hz: 20,
            snapshot_every: 640,
            world: WorldConfig { scenario: Some(plaza.clone()), ..WorldConfig::default() },
            bots: BotsConfig::default(),
            validators: validators.clone(),
        };
        write_atomic(&DataDir::open(d).unwrap().config_path(), cfg.commented().as_bytes()).unwrap();
    }
    let _nodes: Vec<Kill> = dirs
        .iter()
        .map(|d| {
            Kill(
                Command::new(env!("CARGO_BIN_EXE_metatopia"))
                    .args(["run", "--data-dir"])
                    .arg(d)
                    .env("RUST_LOG", "warn")
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    let http = format!("127.0.0.1:{}", ports[4]);
    let client = Client::new(&http);
    let t0 = Instant::now();
    while client.get::<Status>("/v1/status").ok().flatten().is_none_or(|s| s.tick < 10) {
        assert!(t0.elapsed() < Duration::from_secs(120), "the nodes did not start ticking");
        std::thread::sleep(Duration::from_millis(200));
    }
    // The page itself is served by the node.
    let (code, html) = client.get_text("/").unwrap();
    assert!(code == 200 && html.contains("viewer.js"), "{code}");

    let shot = repo().join("target").join("viewer-screenshot.png");
    let _ = std::fs::remove_file(&shot);
    let out = Command::new("node")
        .arg(e2e.join("e2e.mjs"))
        .arg(format!("http://{http}/"))
        .arg(&shot)
        .env("CHROMIUM", &chromium)
        .current_dir(&e2e)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("viewer e2e passed"), "{stdout}\n{stderr}");
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "a real screenshot: {} bytes", png.len());
}
