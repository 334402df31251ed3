//! Forks of scripts: a forked file starts with a header naming the script it derives from, and
//! deploying it records that provenance (`derived_from`). Shared by the command line and the
//! terminal client.

use metatopia_sim::ScriptId;

/// The line a forked script starts with.
pub const FORK_HEADER: &str = "// metatopia: derived from script ";

/// The script a source derives from, if it starts with a fork's header; an error names a
/// header whose id is not a script id.
pub fn derived_from(source: &str) -> Result<Option<ScriptId>, String> {
    match source.lines().next().and_then(|l| l.strip_prefix(FORK_HEADER)) {
        None => Ok(None),
        Some(rest) => {
            let text = rest.split_whitespace().next().unwrap_or("");
            let mut id = [0u8; 32];
            hex::decode_to_slice(text, &mut id)
                .map(|()| Some(ScriptId(id)))
                .map_err(|_| format!("the fork header names {text:?}, not a script id"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_header_names_its_origin_and_a_bad_one_is_an_error() {
        let id = "ab".repeat(32);
        let got = derived_from(&format!("{FORK_HEADER}{id} (lamp)\nfn on_init() {{}}")).unwrap().unwrap();
        assert_eq!(got.to_string(), id);
        assert_eq!(derived_from("fn on_init() {}").unwrap(), None);
        assert!(derived_from(&format!("{FORK_HEADER}xyz\n")).unwrap_err().contains("\"xyz\""));
    }
}
