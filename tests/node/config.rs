//! A config or a join address with bad text in it: an error that says where and what, never a
//! panic.

use std::process::Command;

use crate::support::{Scratch, bin, cli};

#[test]
fn a_non_ascii_key_in_the_config_is_an_error_naming_its_line() {
    let dir = Scratch::new("config-ascii");
    let port = metatopia_node::net::free_ports(1).unwrap()[0].to_string();
    let (ok, out, err) = cli(&["init", "--data-dir", dir.to_str().unwrap(), "--listen", &format!("127.0.0.1:{port}")]);
    assert!(ok, "{out}{err}");
    let config = dir.join("config.toml");
    // `init` wrote `validators = []`: the list becomes a table array with one entry.
    let mut text: String = std::fs::read_to_string(&config)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("validators ="))
        .map(|l| format!("{l}\n"))
        .collect();
    let line = text.lines().count() + 3;
    text += &format!("\n[[validators]]\nkey = \"é{}\"\naddress = \"127.0.0.1:7100\"\n", "a".repeat(63));
    std::fs::write(&config, text).unwrap();
    let out = Command::new(bin()).args(["config", "check", "--data-dir", dir.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "an error, not a panic: {err}");
    assert!(err.contains(&format!("line {line}")) && err.contains("'é'"), "{err}");
}

#[test]
fn a_non_ascii_key_in_a_join_address_is_an_error_naming_it() {
    let dir = Scratch::new("join-ascii");
    let join = format!("{}é@127.0.0.1:7100", "a".repeat(63));
    let out = Command::new(bin())
        .args(["run", "--data-dir", dir.to_str().unwrap(), "--join", &join])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "an error, not a panic: {err}");
    assert!(err.contains("'é'") && err.contains("character 64"), "{err}");
}
