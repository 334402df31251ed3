//! Files made durable: atomic replacement and directory syncs.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use anyhow::Context;

/// Write `bytes` to `path` through a temporary file, synced, renamed over `path`, and the
/// directory synced: after a crash or a power cut `path` holds the old bytes or the new ones.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes).with_context(|| format!("writing {}", tmp.display()))?;
        f.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
    }
    fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    sync_dir(dir).with_context(|| format!("syncing {}", dir.display()))
}

/// Make a directory's entries (files created, renamed or removed in it) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}
