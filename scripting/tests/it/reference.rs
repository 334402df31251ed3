//! The script API reference (`docs/creator.md`) and the host agree: every function the host
//! registers and every handler it calls has its row in the reference, and the reference has
//! no row the host lacks. A function added without its documentation fails here.

use std::collections::BTreeSet;

const DOCS: &str = include_str!("../../../docs/creator.md");
const API: &str = include_str!("../../src/api.rs");
const HOST: &str = include_str!("../../src/lib.rs");

/// The names in the first column of the reference's tables (`name(args)`).
fn documented() -> BTreeSet<String> {
    let start = DOCS.find("### Script API reference").expect("the reference section");
    let section = &DOCS[start..];
    let end = section[4..].find("\n### ").map_or(section.len(), |e| e + 4);
    section[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('(').next())
        .map(str::to_owned)
        .collect()
}

/// What the host registers (`register_fn("name", …)` in `api.rs`) and calls (`HANDLERS`).
fn hosted() -> BTreeSet<String> {
    let functions = API.split("register_fn(\"").skip(1).filter_map(|r| r.split('"').next());
    let handlers = HOST.split("const HANDLERS").nth(1).and_then(|r| r.split("];").next()).expect("HANDLERS");
    let handlers = handlers.split("(\"").skip(1).filter_map(|r| r.split('"').next());
    functions.chain(handlers).map(str::to_owned).collect()
}

#[test]
fn the_api_reference_lists_exactly_what_the_host_offers() {
    let (docs, host) = (documented(), hosted());
    assert!(host.len() >= 30 && host.contains("on_touch") && host.contains("nearby"), "{host:?}");
    let undocumented: Vec<_> = host.difference(&docs).collect();
    let missing: Vec<_> = docs.difference(&host).collect();
    assert!(undocumented.is_empty(), "the host offers these, the reference lacks them: {undocumented:?}");
    assert!(missing.is_empty(), "the reference lists these, the host lacks them: {missing:?}");
}
