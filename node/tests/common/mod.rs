//! Helpers shared by the node's integration tests.

use std::process::Command;

/// Run the `metatopia` binary: success, stdout, stderr.
pub fn cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_metatopia")).args(args).env("RUST_LOG", "warn").output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
