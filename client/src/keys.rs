//! Keys as files and as text: the one place ed25519 keys are read, written, made and parsed, by
//! the clients and the node alike.
//!
//! A key file holds a secret key as 64 hex digits and a newline, readable by its owner only
//! (mode 0600), written through a synced temporary file renamed over the old one (so a crash
//! leaves the old key or the new one, never a torn file). Public keys and hashes travel as 64
//! hex digits too; every parse error says what was wrong, for any text (non-ASCII included).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;

use ed25519_dalek::{SigningKey, VerifyingKey};

/// What went wrong with a key or its file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The text is not what it should be (says why, naming a bad character).
    #[error("{0}")]
    Text(String),
    #[error("{what} {path}: {source}")]
    File { what: &'static str, path: String, source: io::Error },
    #[error("reading the key {path}: {source}")]
    InFile { path: String, source: Box<KeyError> },
    #[error("reading /dev/urandom for a new key: {0}")]
    Random(#[source] io::Error),
}

fn file_error(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> KeyError {
    let path = path.display().to_string();
    move |source| KeyError::File { what, path, source }
}

/// Lower-case hex of some bytes.
pub fn hex(bytes: &[u8]) -> String {
    ::hex::encode(bytes)
}

/// The bytes of a hex string (`None` if it is not hex of whole bytes).
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    ::hex::decode(text).ok()
}

/// 32 bytes written as 64 hex digits (keys, hashes); any other text is an error saying why.
pub fn parse_hex32(text: &str) -> Result<[u8; 32], KeyError> {
    let chars = text.chars().count();
    if chars != 64 {
        return Err(KeyError::Text(format!("64 hex digits are needed, this has {chars} characters")));
    }
    if let Some((at, c)) = text.chars().enumerate().find(|(_, c)| !c.is_ascii_hexdigit()) {
        return Err(KeyError::Text(format!("only hex digits (0-9, a-f) may appear, not {c:?} (character {})", at + 1)));
    }
    let mut out = [0u8; 32];
    ::hex::decode_to_slice(text, &mut out).map_err(|e| KeyError::Text(e.to_string()))?;
    Ok(out)
}

/// A secret key from its 64 hex digits.
pub fn parse(text: &str) -> Result<SigningKey, KeyError> {
    let bytes = parse_hex32(text).map_err(|e| KeyError::Text(format!("a secret key: {e}")))?;
    Ok(SigningKey::from_bytes(&bytes))
}

/// A public key from its 64 hex digits.
pub fn parse_public(text: &str) -> Result<VerifyingKey, KeyError> {
    let bytes = parse_hex32(text).map_err(|e| KeyError::Text(format!("a public key: {e}")))?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| KeyError::Text(format!("not an ed25519 public key: {e}")))
}

/// A new key from the OS's random source (the node and the clients are the only layers allowed
/// one).
pub fn generate() -> Result<SigningKey, KeyError> {
    let mut seed = [0u8; 32];
    File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut seed)).map_err(KeyError::Random)?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The key in the file at `path`; `None` if there is no file.
pub fn read(path: &Path) -> Result<Option<SigningKey>, KeyError> {
    match fs::read_to_string(path) {
        Ok(text) => parse(text.trim())
            .map_err(|e| KeyError::InFile { path: path.display().to_string(), source: Box::new(e) })
            .map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(file_error("reading the key", path)(e)),
    }
}

/// Write a key file readable by its owner only, durably (see the module's notes).
pub fn write(path: &Path, key: &SigningKey) -> Result<(), KeyError> {
    let tmp = path.with_extension("tmp");
    {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut f = options.open(&tmp).map_err(file_error("creating", &tmp))?;
        #[cfg(unix)]
        {
            // An existing temporary file keeps its old mode through open(): set it again.
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(fs::Permissions::from_mode(0o600)).map_err(file_error("restricting", &tmp))?;
        }
        f.write_all(format!("{}\n", hex(&key.to_bytes())).as_bytes()).map_err(file_error("writing", &tmp))?;
        f.sync_all().map_err(file_error("syncing", &tmp))?;
    }
    fs::rename(&tmp, path).map_err(file_error("renaming the new key to", path))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(dir).and_then(|d| d.sync_all()).map_err(file_error("syncing", dir))
}

/// Read the key at `path`, or make a new one there (with its directory) if there is none.
pub fn load_or_create(path: &Path) -> Result<SigningKey, KeyError> {
    if let Some(key) = read(path)? {
        return Ok(key);
    }
    let key = generate()?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(file_error("creating", dir))?;
    }
    write(path, &key)?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_then_read_back() {
        let dir = std::env::temp_dir().join(format!("metatopia-client-key-{}", std::process::id()));
        let path = dir.join("me.key");
        let _ = fs::remove_dir_all(&dir);
        let a = load_or_create(&path).unwrap();
        let b = load_or_create(&path).unwrap();
        assert_eq!(a.to_bytes(), b.to_bytes());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        fs::write(&path, "nothex").unwrap();
        assert!(format!("{:#}", load_or_create(&path).unwrap_err()).contains("64 hex digits"));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn any_text_parses_to_a_key_or_an_error_that_says_why() {
        let good = "ab".repeat(32);
        assert!(parse_public(&hex(SigningKey::from_bytes(&[7; 32]).verifying_key().as_bytes())).is_ok());
        assert!(parse(&good).is_ok());
        // 64 characters, not all ASCII: an error naming the character, never a panic.
        let accented = format!("é{}", "a".repeat(63));
        let e = format!("{:#}", parse(&accented).unwrap_err());
        assert!(e.contains("'é'"), "{e}");
        let e = format!("{:#}", parse_hex32(&"g".repeat(64)).unwrap_err());
        assert!(e.contains("'g'"), "{e}");
        assert!(format!("{:#}", parse_hex32("abc").unwrap_err()).contains("3 characters"));
        for text in ["", "€€€€", &"€".repeat(64), &"ab".repeat(33)] {
            assert!(parse_hex32(text).is_err());
        }
        assert_eq!(unhex("0aff"), Some(vec![10, 255]));
        assert_eq!(unhex("0af"), None);
        assert_eq!(unhex("zz"), None);
    }
}
