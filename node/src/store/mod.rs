//! The data directory: the node key, the commit log, snapshots and the agreement's journal.
//!
//! ```text
//! <data-dir>/format              the data format this node writes ("7"), written first
//! <data-dir>/node.key            ed25519 secret key (hex, mode 0600)
//! <data-dir>/config.toml         the node's config (see `crate::config`)
//! <data-dir>/genesis.bin         the sim's genesis (see `crate::world::genesis`)
//! <data-dir>/log/<tick>.seg      the commit log's segments (see [`log`])
//! <data-dir>/snapshots/<tick>.snap   the sim after `tick` (the newest two are kept)
//! <data-dir>/consensus.journal   the validator's votes and unfinished chain
//! ```
//!
//! How they stay consistent:
//! - A commit is logged before it executes, and the log is made durable before the agreement's
//!   state that names it (so after a power cut the journal never runs ahead of the log by more
//!   than the commits a peer can give back).
//! - A vote is on stable storage (`fdatasync` of the journal) before it is sent: one sync per
//!   turn of the node's loop, for all the votes of that turn; the journal is written in place,
//!   in the slot not holding the newest synced state ([`journal`]).
//! - A snapshot is written before the log is pruned below it; installing a certified snapshot
//!   starts a new log segment at its tick ([`log`]).
//! - Snapshots, keys, the format marker and a journal given larger slots are written to a temporary name,
//!   synced, renamed, and their directory synced ([`write_atomic`]): a reader sees the old file
//!   or the new one, whole, also after a power cut.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::{Doing, Result, StoreError};
use metatopia_sim::{SigningKey, Tick};

pub mod disk;
pub mod durable;
mod error;
#[cfg(test)]
mod faults;
pub mod journal;
pub mod log;
pub use disk::{Disk, OsDisk, SimDisk};
pub use durable::write_atomic;
use journal::JOURNAL;
pub use journal::StateJournal;
pub use log::{CommitLog, LogRecord, MAX_RECORD, Recovery, SEGMENT_RECORDS, SYNC_EVERY};

/// A node's data directory, on the machine's disk or a simulated one.
#[derive(Clone, Debug)]
pub struct DataDir {
    root: PathBuf,
    disk: Arc<dyn Disk>,
}

/// The data format this node writes (consensus state, log, snapshots); a directory written by
/// another format is refused with a clear error instead of being misread. 2: votes signed under
/// their epoch's chain digest, node messages with epochs; 3: the `aoi_radius_m` setting and
/// returned objects in accounts; 4: block digests over the header and the events' ids; 5:
/// creators' budgets and quotas; 6: a log record names the empty block that opened its tick; 7:
/// the agreement's journal in two slots written in place ([`journal`]; a directory of format 6 is
/// carried over when it is opened).
pub const DATA_FORMAT: u32 = 7;

impl DataDir {
    /// Open (creating what is missing) the data directory at `root`. A directory holding
    /// consensus state or a log in another format (or from before formats were recorded) is an
    /// error that says so.
    pub fn open(root: &Path) -> Result<DataDir> {
        DataDir::open_on(Arc::new(OsDisk::default()), root)
    }

    /// [`DataDir::open`] on `disk` (the machine's, or a simulated one).
    pub fn open_on(disk: Arc<dyn Disk>, root: &Path) -> Result<DataDir> {
        let d = &*disk;
        let marker = root.join("format");
        let logged = d.list(&root.join("log")).is_ok_and(|l| !l.is_empty());
        let used = d.exists(&root.join("consensus.state")) || d.exists(&root.join(JOURNAL)) || logged;
        let text = d.read(&marker).map(|b| String::from_utf8_lossy(&b).into_owned());
        match text {
            Ok(text) if text.trim() == DATA_FORMAT.to_string() => {}
            // Format 6 differs only in the journal's layout: carried over, then marked.
            Ok(text) if text.trim() == "6" => {
                journal::upgrade_format_6(&disk, &root.join(JOURNAL))?;
                d.write_atomic(&marker, format!("{DATA_FORMAT}\n").as_bytes())
                    .doing(|| format!("writing {}", marker.display()))?;
            }
            // An empty marker (written before markers were synced, and cut short by a crash) in a
            // directory with nothing else of ours yet: written again below.
            Ok(text) if text.trim().is_empty() && !used => {
                d.remove(&marker).doing(|| format!("removing the empty {}", marker.display()))?;
            }
            Ok(text) if text.trim().is_empty() => {
                return Err(StoreError::Format(format!(
                    "{}'s format marker is empty (a crash while it was written?); if the directory is this version's, write {DATA_FORMAT} into {}",
                    root.display(),
                    marker.display()
                )));
            }
            Ok(text) => {
                return Err(StoreError::Format(format!(
                    "{} holds data format {}, this node writes format {DATA_FORMAT}: move it away or start a new one",
                    root.display(),
                    text.trim()
                )));
            }
            Err(_) if used => {
                return Err(StoreError::Format(format!(
                    "{} holds data from an older version (no format marker; this node writes format {DATA_FORMAT}): move it away or start a new one",
                    root.display()
                )));
            }
            Err(_) => {}
        }
        for dir in [root.to_owned(), root.join("log"), root.join("snapshots")] {
            d.create_dir_all(&dir).doing(|| format!("creating {}", dir.display()))?;
        }
        if !d.exists(&marker) {
            d.write_atomic(&marker, format!("{DATA_FORMAT}\n").as_bytes())
                .doing(|| format!("writing {}", marker.display()))?;
        }
        Ok(DataDir { root: root.to_owned(), disk })
    }

    /// The disk it is on.
    pub fn disk(&self) -> &Arc<dyn Disk> {
        &self.disk
    }

    /// Whether `root` holds data this node cannot read (another format).
    pub fn incompatible(root: &Path) -> bool {
        root.exists() && DataDir::open(root).is_err()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn config_path(&self) -> PathBuf {
        self.root.join("config.toml")
    }

    /// The commit log's directory (its segments).
    pub fn log_dir(&self) -> PathBuf {
        self.root.join("log")
    }

    /// The node key, created on first use.
    pub fn key(&self) -> Result<SigningKey> {
        let path = self.root.join("node.key");
        let key_error = |cause| StoreError::Key { path: path.display().to_string(), cause };
        match read_key(&path).map_err(key_error)? {
            Some(key) => Ok(key),
            None => {
                let key = fresh_key().map_err(key_error)?;
                write_key(&path, &key).map_err(key_error)?;
                Ok(key)
            }
        }
    }

    /// Write the snapshot after `tick`; keep the newest two.
    pub fn write_snapshot(&self, tick: Tick, bytes: &[u8]) -> Result<()> {
        let path = self.root.join("snapshots").join(format!("{:012}.snap", tick.0));
        self.disk.write_atomic(&path, bytes).doing(|| format!("writing {}", path.display()))?;
        let mut all = self.snapshots()?;
        while all.len() > 2 {
            let (_, old) = all.remove(0);
            let _ = self.disk.remove(&old);
        }
        Ok(())
    }

    /// The tick of the oldest snapshot kept (what the log must reach back to).
    pub fn oldest_snapshot(&self) -> Result<Option<Tick>> {
        Ok(self.snapshots()?.first().map(|(t, _)| *t))
    }

    /// Snapshots on disk, oldest first.
    pub fn snapshots(&self) -> Result<Vec<(Tick, PathBuf)>> {
        let mut v = Vec::new();
        for p in self
            .disk
            .list(&self.root.join("snapshots"))
            .doing(|| format!("listing {}/snapshots", self.root.display()))?
        {
            if p.extension().is_some_and(|x| x == "snap")
                && let Some(t) = p.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse().ok())
            {
                v.push((Tick(t), p));
            }
        }
        v.sort();
        Ok(v)
    }

    /// The agreement's state as last written: the journal's newest whole record, or (a data
    /// directory from before the journal) the whole of `consensus.state`.
    pub fn read_consensus_state(&self) -> Result<Option<Vec<u8>>> {
        let found = StateJournal::scan(&*self.disk, &self.root.join(JOURNAL))?;
        if let Some((_, _, newest)) = found.and_then(|s| s.newest) {
            return Ok(Some(newest));
        }
        match self.disk.read(&self.root.join("consensus.state")) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).doing(|| "reading consensus.state".to_owned()),
        }
    }
}

impl StateJournal {
    /// Open the journal of `dir` (creating it; see [`journal`]).
    pub fn open(dir: &DataDir) -> Result<StateJournal> {
        StateJournal::open_at(dir.disk.clone(), &dir.root)
    }
}

pub use metatopia_client::keys::{generate as fresh_key, parse as parse_key, read as read_key, write as write_key};

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// A test's directory, removed when it ends.
    fn tmp(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("metatopia-store-{name}-")).tempdir().unwrap()
    }

    #[test]
    fn a_consensus_state_from_before_the_journal_becomes_its_first_state() {
        let scratch = tmp("legacy");
        let d = scratch.path();
        let dir = DataDir::open(d).unwrap();
        fs::write(d.join("consensus.state"), b"old votes").unwrap();
        assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"old votes"[..]));
        let mut j = StateJournal::open(&dir).unwrap();
        assert!(!d.join("consensus.state").exists());
        assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"old votes"[..]));
        j.write(b"new votes").unwrap();
        assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"new votes"[..]));
    }

    #[test]
    fn the_key_is_created_once_and_kept_private() {
        let scratch = tmp("key");
        let d = scratch.path();
        let dir = DataDir::open(d).unwrap();
        let a = dir.key().unwrap();
        let b = dir.key().unwrap();
        assert_eq!(a.to_bytes(), b.to_bytes());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(d.join("node.key")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        fs::write(d.join("node.key"), "zz").unwrap();
        let e = dir.key().unwrap_err();
        assert!(format!("{e:#}").contains("64 hex digits"), "{e:#}");
    }

    #[test]
    fn a_directory_of_another_data_format_is_refused_not_misread() {
        let scratch = tmp("format");
        let root = scratch.path();
        DataDir::open(root).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("format")).unwrap().trim(), DATA_FORMAT.to_string());
        std::fs::write(root.join("format"), "1\n").unwrap();
        let e = DataDir::open(root).unwrap_err().to_string();
        assert!(e.contains("format 1") && e.contains("move it away"), "{e}");
        assert!(DataDir::incompatible(root));
        // Data from before the marker existed.
        std::fs::remove_file(root.join("format")).unwrap();
        std::fs::write(root.join("consensus.state"), b"old").unwrap();
        let e = DataDir::open(root).unwrap_err().to_string();
        assert!(e.contains("older version"), "{e}");
        // An empty marker: written again in a directory with nothing in it yet, an error (naming
        // it) in one with data.
        std::fs::write(root.join("format"), "").unwrap();
        let e = DataDir::open(root).unwrap_err().to_string();
        assert!(e.contains("format marker is empty"), "{e}");
        std::fs::remove_file(root.join("consensus.state")).unwrap();
        DataDir::open(root).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("format")).unwrap().trim(), DATA_FORMAT.to_string());
    }

    #[test]
    fn a_directory_of_format_6_is_carried_over_with_its_votes() {
        let scratch = tmp("format6");
        let root = scratch.path();
        DataDir::open(root).unwrap();
        std::fs::write(root.join("format"), "6\n").unwrap();
        // A format-6 journal: records appended (length, blake3 check, bytes).
        let mut old = Vec::new();
        for body in [&b"older votes"[..], b"newest votes"] {
            old.extend_from_slice(&(body.len() as u32).to_le_bytes());
            old.extend_from_slice(&blake3::hash(body).as_bytes()[..8]);
            old.extend_from_slice(body);
        }
        std::fs::write(root.join(JOURNAL), &old).unwrap();
        let dir = DataDir::open(root).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("format")).unwrap().trim(), DATA_FORMAT.to_string());
        assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"newest votes"[..]));
        let mut j = StateJournal::open(&dir).unwrap();
        j.write(b"later votes").unwrap();
        j.sync().unwrap();
        assert_eq!(DataDir::open(root).unwrap().read_consensus_state().unwrap().as_deref(), Some(&b"later votes"[..]));
    }

    #[test]
    fn snapshots_keep_the_newest_two() {
        let scratch = tmp("snaps");
        let d = scratch.path();
        let dir = DataDir::open(d).unwrap();
        for t in [10u64, 20, 30, 40] {
            dir.write_snapshot(Tick(t), &[t as u8; 10]).unwrap();
        }
        let s = dir.snapshots().unwrap();
        assert_eq!(s.iter().map(|(t, _)| t.0).collect::<Vec<_>>(), vec![30, 40]);
        assert_eq!(fs::read(&s[1].1).unwrap(), vec![40u8; 10]);
    }
}
