//! The configuration reference (`docs/config.md`, `metatopia config reference`), rendered from
//! the doc comments and serde attributes of the config's structs in `config/mod.rs`, so the
//! reference cannot drift from the code (a test compares the file with this).

/// The source this reference is read from.
const SOURCE: &str = include_str!("mod.rs");

/// One field of a config struct.
#[derive(Debug)]
struct Field {
    name: String,
    ty: String,
    doc: String,
    default: Option<String>,
}

/// One config struct: its doc and fields.
#[derive(Debug, Default)]
struct Struct {
    doc: String,
    fields: Vec<Field>,
}

fn join_doc(lines: &[&str]) -> String {
    lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// The value a `default = "f"` function returns (its body's one line).
fn default_fn(name: &str) -> Option<String> {
    let start = SOURCE.find(&format!("fn {name}() -> "))?;
    let body = &SOURCE[start..];
    let open = body.find('{')?;
    let close = body.find('}')?;
    Some(body[open + 1..close].trim().to_owned())
}

/// Every `pub struct` of the source with its documented fields.
fn structs() -> Vec<(String, Struct)> {
    let mut out = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    let mut serde = String::new();
    let mut current: Option<(String, Struct)> = None;
    for line in SOURCE.lines() {
        let t = line.trim();
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d);
        } else if t.starts_with("#[serde(") {
            serde.push_str(t);
        } else if t.starts_with("#[") {
        } else if let Some(rest) = line.strip_prefix("pub struct ") {
            let name = rest.split_whitespace().next().unwrap_or("").to_owned();
            current = Some((name, Struct { doc: join_doc(&doc), fields: Vec::new() }));
            doc.clear();
            serde.clear();
        } else if line == "}" {
            if let Some(s) = current.take() {
                out.push(s);
            }
            doc.clear();
            serde.clear();
        } else if let (Some((_, s)), Some(rest)) = (current.as_mut(), line.strip_prefix("    pub ")) {
            let (name, ty) = rest.split_once(':').unwrap_or((rest, ""));
            let ty = ty.trim().trim_end_matches(',').to_owned();
            let default = if serde.contains("default = \"") {
                let f = serde.split("default = \"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("");
                default_fn(f)
            } else if serde.contains("default") {
                Some(String::new())
            } else {
                None
            };
            s.fields.push(Field { name: name.trim().to_owned(), ty, doc: join_doc(&doc), default });
            doc.clear();
            serde.clear();
        } else if !t.is_empty() {
            doc.clear();
            serde.clear();
        }
    }
    out
}

/// How a type reads in TOML.
fn toml_type(ty: &str) -> String {
    let inner = ty.strip_prefix("Option<").and_then(|t| t.strip_suffix('>')).unwrap_or(ty);
    match inner {
        "SocketAddr" => "address (`HOST:PORT`)".to_owned(),
        "u32" | "u64" => "integer".to_owned(),
        "bool" => "`true` or `false`".to_owned(),
        "String" => "string".to_owned(),
        "std::path::PathBuf" | "PathBuf" => "path".to_owned(),
        "Vec<String>" => "list of strings".to_owned(),
        other => format!("`{other}`"),
    }
}

/// What a field's default reads as.
fn default_text(f: &Field) -> String {
    match &f.default {
        None if f.ty.starts_with("Option<") => "none".to_owned(),
        None => "**required**".to_owned(),
        Some(v) if !v.is_empty() => format!("`{v}`"),
        Some(_) if f.ty.starts_with("Option<") => "none".to_owned(),
        Some(_) if f.ty.starts_with("Vec<") => "none".to_owned(),
        Some(_) if f.ty == "bool" => "`false`".to_owned(),
        Some(_) if f.ty == "u32" || f.ty == "u64" => "`0`".to_owned(),
        Some(_) => "see the section".to_owned(),
    }
}

/// The reference, as Markdown.
pub fn markdown() -> String {
    let all = structs();
    let find = |n: &str| all.iter().find(|(name, _)| name == n).map(|(_, s)| s);
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every key of a node's `config.toml` (in its data directory; `metatopia init` writes a \
         commented one, `metatopia config check` checks one: unknown keys and bad values are \
         errors naming the line). Command-line flags and `METATOPIA_*` variables override the \
         file where `metatopia run --help` lists them.\n\n\
         This page is generated from the doc comments of `node/src/config/mod.rs` \
         (`metatopia config reference` prints it; a test fails when the two differ).\n",
    );
    // The top level, then each section in the order the top level names it.
    let mut queue: Vec<(String, String)> = vec![("NodeConfig".to_owned(), String::new())];
    while let Some((name, section)) = queue.first().cloned() {
        queue.remove(0);
        let Some(s) = find(&name) else { continue };
        let title = if section.is_empty() { "The top level".to_owned() } else { format!("`{section}`") };
        out += &format!("\n## {title}\n\n");
        if !s.doc.is_empty() {
            out += &format!("{}\n\n", s.doc);
        }
        out += "| key | type | default | what it is |\n|---|---|---|---|\n";
        let mut nested = Vec::new();
        for f in &s.fields {
            let inner = f.ty.strip_prefix("Vec<").and_then(|t| t.strip_suffix('>')).unwrap_or(&f.ty);
            if find(inner).is_some() {
                let path = if section.is_empty() {
                    f.name.clone()
                } else {
                    format!("{}.{}", section.trim_matches(['[', ']']), f.name)
                };
                let sub = if f.ty.starts_with("Vec<") { format!("[[{path}]]") } else { format!("[{path}]") };
                out += &format!("| `{}` | section `{sub}` | {} | {} |\n", f.name, default_text(f), f.doc);
                nested.push((inner.to_owned(), sub));
            } else {
                out += &format!("| `{}` | {} | {} | {} |\n", f.name, toml_type(&f.ty), default_text(f), f.doc);
            }
        }
        // A section's own sections come right after it.
        for (i, n) in nested.into_iter().enumerate() {
            queue.insert(i, n);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_the_config_is_in_the_reference_with_its_doc() {
        let md = markdown();
        for key in
            ["listen", "tick_rate_hz", "genesis_hash", "demo", "sim_id", "bootstrap", "events_per_tick", "observer"]
        {
            assert!(md.contains(&format!("| `{key}` |")), "{key} missing:\n{md}");
        }
        for section in
            ["`[world]`", "`[[validators]]`", "`[[sims]]`", "`[[sims.validators]]`", "`[raynet]`", "`[bots]`"]
        {
            assert!(md.contains(&format!("## {section}")), "{section} missing:\n{md}");
        }
        assert!(md.contains("| `tick_rate_hz` | integer | `20` | The sim's tick rate. |"), "{md}");
        assert!(md.contains("| `listen` | address (`HOST:PORT`) | **required** |"), "{md}");
        // Every field is documented.
        for (name, s) in structs() {
            for f in s.fields {
                assert!(!f.doc.is_empty(), "{name}.{} has no doc comment", f.name);
            }
        }
    }

    /// `docs/config.md` is this reference (`METATOPIA_WRITE_DOCS=1` rewrites it).
    #[test]
    fn the_docs_hold_the_current_reference() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.md");
        if std::env::var_os("METATOPIA_WRITE_DOCS").is_some() {
            std::fs::write(&path, markdown()).unwrap();
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == markdown(),
            "docs/config.md differs from the config's doc comments: run \
             `METATOPIA_WRITE_DOCS=1 cargo test -p metatopia-node --lib config::reference`"
        );
    }
}
