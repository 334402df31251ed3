//! Files made durable on the machine's disk: atomic replacement (directories are synced through
//! [`super::disk::OsDisk`]).

use std::path::Path;

use super::error::{Doing, Result};

use super::disk::{Disk, OsDisk};

/// Write `bytes` to `path` through a temporary file, synced, renamed over `path`, and the
/// directory synced: after a crash or a power cut `path` holds the old bytes or the new ones.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    OsDisk::default().write_atomic(path, bytes).doing(|| format!("writing {}", path.display()))
}
