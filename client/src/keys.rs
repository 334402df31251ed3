//! The account key: an ed25519 secret key kept as 64 hex digits in a file readable by its owner.

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use ed25519_dalek::SigningKey;

/// Read the key at `path`, or make a new one there (from the OS's random source) if there is none.
pub fn load_or_create(path: &Path) -> anyhow::Result<SigningKey> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(text.trim()).with_context(|| format!("reading the account key {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = generate()?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
            write(path, &key)?;
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("reading the account key {}", path.display())),
    }
}

/// A new key from the OS's random source.
pub fn generate() -> anyhow::Result<SigningKey> {
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut seed))
        .context("reading /dev/urandom for a new account key")?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Write a key readable by its owner only.
pub fn write(path: &Path, key: &SigningKey) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{}\n", crate::proto::hex(&key.to_bytes())))
        .with_context(|| format!("writing {}", tmp.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).context("restricting the key file")?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// 64 hex digits of secret key.
pub fn parse(hex: &str) -> anyhow::Result<SigningKey> {
    let bytes = crate::proto::unhex(hex)
        .filter(|b| b.len() == 32)
        .with_context(|| format!("a key is 64 hex digits (this one: {} characters)", hex.len()))?;
    let mut seed = [0u8; 32];
    seed.copy_from_slice(&bytes);
    Ok(SigningKey::from_bytes(&seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_then_read_back() {
        let dir = std::env::temp_dir().join(format!("metatopia-client-key-{}", std::process::id()));
        let path = dir.join("me.key");
        let _ = std::fs::remove_dir_all(&dir);
        let a = load_or_create(&path).unwrap();
        let b = load_or_create(&path).unwrap();
        assert_eq!(a.to_bytes(), b.to_bytes());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        std::fs::write(&path, "nothex").unwrap();
        assert!(format!("{:#}", load_or_create(&path).unwrap_err()).contains("64 hex digits"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
