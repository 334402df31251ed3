//! The web viewer end to end: four real nodes on loopback run the plaza scenario's world; the
//! viewer served by node 0 is driven in real headless Chromium (playwright-core): objects
//! appear, the browser makes a key and logs in, chat gets the echo bot's reply, the door's
//! script source shows, touching opens the door; a screenshot is saved under target/.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use metatopia_node::http::Client;

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

    let cluster = common::Cluster::start("viewer", "plaza.toml");
    let http = cluster.http[0].clone();
    let client = Client::new(&http);
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
