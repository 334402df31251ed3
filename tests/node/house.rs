//! The house's rules, checked on the workspace's sources (DESIGN §11, STYLE):
//! - the crates below the node stay pure: no tokio, sockets, HTTP or QUIC in their dependency
//!   trees (`cargo tree`), and no clock, socket or sleep in their sources;
//! - no source file outside the tests passes 1,000 lines without a reason named here;
//! - no crate's modules import each other in a cycle (a module's named paths to another; a
//!   split `impl`'s `use super::*`, the parent's own type continued in a child file, is not
//!   counted);
//! - the libraries return typed errors (`thiserror`): `anyhow` only in the node's program, its
//!   shell and command line, which report to an operator.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The crates that must not reach the network, the clock or the OS (DESIGN §5, §11).
const PURE: [&str; 6] = ["sim", "scripting", "physics", "consensus", "raynet", "scenarios"];
/// Every crate whose modules are checked for cycles.
const CRATES: [&str; 9] = ["sim", "scripting", "physics", "consensus", "raynet", "scenarios", "client", "node", "lab"];
/// Packages a pure crate may not depend on, at any depth.
const IMPURE_PACKAGES: [&str; 9] = ["tokio", "mio", "socket2", "quinn", "libp2p", "axum", "hyper", "ureq", "rustls"];
/// Text a pure crate's sources may not hold (outside comments).
const IMPURE_CALLS: [&str; 5] = ["Instant::now", "SystemTime", "std::net", "thread::sleep", "tokio::"];
/// Files allowed past the line limit, and why.
const LONG_FILES: [(&str, &str); 0] = [];
const LINE_LIMIT: usize = 1_000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// A source without its comments and without its unit-test module (the last item of a file,
/// by the house's convention).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

#[test]
fn the_crates_below_the_node_depend_on_no_runtime_socket_or_clock() {
    for krate in PURE {
        let out = Command::new(env!("CARGO"))
            .current_dir(root())
            .args(["tree", "--offline", "--locked", "-e", "normal", "--prefix", "none", "--format", "{p}"])
            .args(["-p", &format!("metatopia-{krate}")])
            .output()
            .unwrap();
        assert!(out.status.success(), "cargo tree -p metatopia-{krate}: {}", String::from_utf8_lossy(&out.stderr));
        let tree = String::from_utf8(out.stdout).unwrap();
        let packages: BTreeSet<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
        assert!(packages.len() > 1, "cargo tree printed nothing useful for {krate}: {tree}");
        for bad in IMPURE_PACKAGES {
            assert!(
                !packages.contains(bad),
                "metatopia-{krate} depends on {bad} (cargo tree -p metatopia-{krate} -i {bad})"
            );
        }
        let mut files = Vec::new();
        sources(&root().join(krate).join("src"), &mut files);
        assert!(!files.is_empty());
        for f in files {
            let code = code_of(&std::fs::read_to_string(&f).unwrap());
            for bad in IMPURE_CALLS {
                assert!(
                    !code.contains(bad),
                    "{} uses {bad}: the pure crates get time and I/O from the node",
                    f.display()
                );
            }
        }
    }
}

/// Where `anyhow` may be used: the node's program (the shell that runs a process and the
/// command line), and the lab's tools. Everything a library user calls returns typed errors.
const PROGRAM_DIRS: [&str; 3] = ["node/src/shell", "node/src/cli", "node/src/main.rs"];
/// Library sources checked for `anyhow`.
const LIBRARY_DIRS: [&str; 8] = [
    "sim/src",
    "scripting/src",
    "physics/src",
    "consensus/src",
    "raynet/src",
    "scenarios/src",
    "client/src",
    "node/src",
];

#[test]
fn the_libraries_return_typed_errors_and_anyhow_stays_in_the_program() {
    let mut files = Vec::new();
    for dir in LIBRARY_DIRS {
        let p = root().join(dir);
        if p.is_file() { files.push(p) } else { sources(&p, &mut files) }
    }
    let program: Vec<PathBuf> = PROGRAM_DIRS.iter().map(|d| root().join(d)).collect();
    let files: BTreeSet<PathBuf> = files.into_iter().filter(|f| !program.iter().any(|p| f.starts_with(p))).collect();
    assert!(files.len() > 50, "the library sources were not found under {}", root().display());
    let users: Vec<String> = files
        .iter()
        .filter(|f| code_of(&std::fs::read_to_string(f).unwrap()).contains("anyhow"))
        .map(|f| f.strip_prefix(root()).unwrap_or(f).display().to_string())
        .collect();
    assert!(users.is_empty(), "library code uses anyhow (return a thiserror type): {users:?}");
}

#[test]
fn no_source_file_passes_the_line_limit_without_a_named_reason() {
    let mut long = Vec::new();
    for krate in CRATES {
        let mut files = Vec::new();
        sources(&root().join(krate).join("src"), &mut files);
        for f in files {
            let lines = std::fs::read_to_string(&f).unwrap().lines().count();
            let rel = f.strip_prefix(root()).unwrap().to_string_lossy().into_owned();
            let allowed = LONG_FILES.iter().any(|(p, why)| *p == rel && !why.is_empty());
            if lines > LINE_LIMIT && !allowed {
                long.push(format!("{rel}: {lines} lines"));
            }
        }
    }
    assert!(long.is_empty(), "past {LINE_LIMIT} lines with no reason in LONG_FILES: {long:#?}");
    for (p, _) in LONG_FILES {
        let lines = std::fs::read_to_string(root().join(p)).unwrap().lines().count();
        assert!(lines > LINE_LIMIT, "{p} is {lines} lines now: take it off LONG_FILES");
    }
}

/// A crate's modules (`["core", "epochs"]` for `src/core/epochs.rs`) and their files.
fn modules(krate: &str) -> BTreeMap<Vec<String>, PathBuf> {
    let src = root().join(krate).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut mods = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().with_extension("");
        let mut path: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        if path == ["lib"] || path == ["main"] || path.last().is_some_and(|l| l == "mod") {
            path.pop();
        }
        if path.is_empty() && f.ends_with("main.rs") {
            continue; // the binary's root: a crate of its own
        }
        mods.insert(path, f);
    }
    mods
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path in `code` as (first segment, later segments), brace groups expanded one level
/// (`crate::{a, b::c}` gives `crate::a` and `crate::b::c`).
fn paths(code: &str) -> Vec<(String, Vec<String>)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !is_ident(chars[i]) || (i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        let head: String = chars[start..i].iter().collect();
        let mut segs = Vec::new();
        loop {
            if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
                i += 2;
                if chars.get(i) == Some(&'{') {
                    let mut depth = 0;
                    let open = i;
                    while i < chars.len() {
                        depth += i32::from(chars[i] == '{') - i32::from(chars[i] == '}');
                        i += 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    let inner: String = chars[open + 1..i.saturating_sub(1)].iter().collect();
                    let mut depth = 0;
                    let mut item = String::new();
                    for c in inner.chars().chain([',']) {
                        depth += i32::from(c == '{') - i32::from(c == '}');
                        if c == ',' && depth == 0 {
                            let first = item.split('{').next().unwrap_or("");
                            let sub: Vec<String> = first
                                .split("::")
                                .map(|s| s.split_whitespace().next().unwrap_or("").to_owned())
                                .filter(|s| !s.is_empty() && s.chars().all(is_ident))
                                .collect();
                            let mut all = segs.clone();
                            all.extend(sub);
                            out.push((head.clone(), all));
                            item.clear();
                        } else {
                            item.push(c);
                        }
                    }
                    segs.clear();
                    break;
                }
                let s = i;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
                if s == i {
                    break;
                }
                segs.push(chars[s..i].iter().collect());
            } else {
                break;
            }
        }
        if !segs.is_empty() {
            out.push((head, segs));
        }
    }
    out
}

/// The module a path names: its longest prefix that is a module.
fn resolve(mods: &BTreeMap<Vec<String>, PathBuf>, segs: &[String]) -> Option<Vec<String>> {
    (1..=segs.len()).rev().map(|n| segs[..n].to_vec()).find(|p| mods.contains_key(p))
}

/// A crate's module graph: an edge from each module to every other module it names.
fn graph(krate: &str) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mods = modules(krate);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (me, file) in &mods {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        for (head, segs) in paths(&code) {
            let full: Vec<String> = match head.as_str() {
                "crate" => segs,
                "super" if !me.is_empty() => me[..me.len() - 1].iter().cloned().chain(segs).collect(),
                "self" => me.iter().cloned().chain(segs).collect(),
                child => {
                    let mut p = me.clone();
                    p.push(child.to_owned());
                    if !mods.contains_key(&p) {
                        continue;
                    }
                    p.extend(segs);
                    p
                }
            };
            if let Some(to) = resolve(&mods, &full).filter(|to| to != me) {
                edges.entry(me.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// A cycle of the graph, if it has one.
fn cycle(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        v: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        state.insert(v.clone(), 1);
        stack.push(v.clone());
        for w in edges.get(v).into_iter().flatten() {
            match state.get(w) {
                Some(1) => {
                    let at = stack.iter().position(|x| x == w).unwrap();
                    return Some(stack[at..].to_vec());
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(w, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(v.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for v in edges.keys() {
        if !state.contains_key(v) {
            let mut stack = Vec::new();
            if let Some(c) = visit(v, edges, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_crate_has_an_import_cycle() {
    let name = |m: &Vec<String>| if m.is_empty() { "crate".to_owned() } else { m.join("::") };
    for krate in CRATES {
        let edges = graph(krate);
        // The graph, for whoever runs this with --nocapture.
        for (from, to) in &edges {
            println!("{krate}: {} -> {}", name(from), to.iter().map(name).collect::<Vec<_>>().join(" "));
        }
        if let Some(c) = cycle(&edges) {
            let names: Vec<String> = c.iter().map(name).collect();
            panic!("{krate}: modules import each other in a cycle: {} -> {}", names.join(" -> "), names[0]);
        }
    }
    // The check sees edges (a parser that saw none would pass anything).
    let node = graph("node");
    let core = vec!["core".to_owned()];
    assert!(node.get(&vec!["shell".to_owned()]).is_some_and(|e| e.contains(&core)), "{node:?}");
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let a = vec!["a".to_owned()];
    let b = vec!["b".to_owned()];
    let edges = BTreeMap::from([(a.clone(), BTreeSet::from([b.clone()])), (b.clone(), BTreeSet::from([a.clone()]))]);
    assert!(cycle(&edges).is_some());
    let p = paths("use crate::{core::epochs::Epochs, net};\nlet x = super::y::z(1);");
    assert!(p.contains(&("crate".to_owned(), vec!["core".into(), "epochs".into(), "Epochs".into()])), "{p:?}");
    assert!(p.contains(&("crate".to_owned(), vec!["net".into()])), "{p:?}");
    assert!(p.contains(&("super".to_owned(), vec!["y".into(), "z".into()])), "{p:?}");
}
