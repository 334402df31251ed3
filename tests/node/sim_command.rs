//! `metatopia sim` as a user runs it: a real process, its output read back.

use std::process::Command;

fn run_sim(physics: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_metatopia"))
        .args([
            "sim",
            "local",
            "--ticks",
            "90",
            "--unpaced",
            "--objects",
            "300",
            "--players",
            "10",
            "--physics",
            physics,
        ])
        .output()
        .expect("metatopia runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

fn final_root(stdout: &str) -> String {
    let line = stdout.lines().find(|l| l.contains("final root")).unwrap_or_else(|| panic!("no final root:\n{stdout}"));
    line.rsplit(' ').next().unwrap().to_owned()
}

#[test]
fn two_runs_of_the_same_world_end_on_the_same_root_with_either_physics() {
    for physics in ["rapier", "kinematic"] {
        let (a, b) = (run_sim(physics), run_sim(physics));
        assert!(a.contains("after 90 ticks"), "{a}");
        assert_eq!(final_root(&a), final_root(&b), "{physics}");
        assert_eq!(final_root(&a).len(), 64, "{a}");
    }
    assert_ne!(final_root(&run_sim("rapier")), final_root(&run_sim("kinematic")));
}

#[test]
fn a_bad_physics_name_is_a_clear_error() {
    let out =
        Command::new(env!("CARGO_BIN_EXE_metatopia")).args(["sim", "local", "--physics", "magic"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value 'magic'") && err.contains("rapier"), "{err}");
}
