//! The data directory: the node key, the commit log, snapshots and the agreement's journal.
//!
//! ```text
//! <data-dir>/format              the data format this node writes ("4"), written first
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
//!   turn of the node's loop, for all the votes of that turn.
//! - A snapshot is written before the log is pruned below it; installing a certified snapshot
//!   starts a new log segment at its tick ([`log`]).
//! - Snapshots, keys, the format marker and compacted journals are written to a temporary name,
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
pub mod log;
pub use disk::{Disk, OsDisk, SimDisk};
pub use durable::write_atomic;
use log::HEADER;
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
/// creators' budgets and quotas; 6: a log record names the empty block that opened its tick.
pub const DATA_FORMAT: u32 = 6;

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
        let (_, newest) = StateJournal::scan(&*self.disk, &self.root.join(JOURNAL))?;
        if newest.is_some() {
            return Ok(newest);
        }
        match self.disk.read(&self.root.join("consensus.state")) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).doing(|| "reading consensus.state".to_owned()),
        }
    }
}

/// The agreement's journal in the data directory.
const JOURNAL: &str = "consensus.journal";
/// The journal is rewritten with its newest record alone once it is this long.
pub const JOURNAL_MAX: u64 = 4 << 20;

/// The agreement's state, written before every vote leaves (many times a second): appended to
/// `consensus.journal` as records (length, blake3 checksum, bytes) instead of a file created and
/// renamed per write; the newest whole record is the state, and a torn tail (a crash mid-write)
/// is cut off when the journal is opened. Past [`JOURNAL_MAX`] the journal is replaced
/// (atomically) by one holding the newest record.
#[derive(Debug)]
pub struct StateJournal {
    disk: Arc<dyn Disk>,
    path: PathBuf,
    len: u64,
}

impl StateJournal {
    /// Open the journal (creating it), cutting off a torn tail.
    pub fn open(dir: &DataDir) -> Result<StateJournal> {
        let (disk, path) = (dir.disk.clone(), dir.root.join(JOURNAL));
        let (good, newest) = StateJournal::scan(&*disk, &path)?;
        // A data directory from before the journal: its state becomes the first record.
        let legacy = dir.root.join("consensus.state");
        if newest.is_none() && disk.exists(&legacy) {
            let bytes = disk.read(&legacy).doing(|| format!("reading {}", legacy.display()))?;
            let mut first = Vec::new();
            let len = u32::try_from(bytes.len())
                .map_err(|_| StoreError::TooBig { what: "consensus.state", len: bytes.len() })?;
            push_record(&mut first, &bytes, len);
            disk.write_atomic(&path, &first).doing(|| format!("writing {}", path.display()))?;
            disk.remove(&legacy).doing(|| format!("removing {}", legacy.display()))?;
            return StateJournal::open(dir);
        }
        if disk.exists(&path) {
            if disk.len(&path).doing(|| format!("reading the size of {}", path.display()))? > good {
                disk.truncate(&path, good)
                    .and_then(|()| disk.sync(&path))
                    .doing(|| format!("cutting the torn tail of {}", path.display()))?;
            }
        } else {
            // Created and its name made durable, so a sync of it later keeps what it holds.
            disk.create(&path)
                .and_then(|()| disk.sync_dir(&dir.root))
                .doing(|| format!("creating {}", path.display()))?;
        }
        Ok(StateJournal { disk, path, len: good })
    }

    /// The length of the whole records at the start of the file at `path`, and the newest one.
    fn scan(disk: &dyn Disk, path: &Path) -> Result<(u64, Option<Vec<u8>>)> {
        let bytes = match disk.read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, None)),
            Err(e) => return Err(e).doing(|| format!("reading {}", path.display())),
        };
        Ok(StateJournal::scan_bytes(&bytes))
    }

    /// The length of the whole records at the start of `bytes`, and the newest one.
    pub fn scan_bytes(bytes: &[u8]) -> (u64, Option<Vec<u8>>) {
        let (mut at, mut newest) = (0usize, None);
        while let Some(head) = bytes.get(at..at + HEADER) {
            let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
            let Some(body) = bytes.get(at + HEADER..at + HEADER + len) else { break };
            if blake3::hash(body).as_bytes()[..8] != head[4..] {
                break;
            }
            newest = Some(body.to_vec());
            at += HEADER + len;
        }
        (at as u64, newest)
    }

    /// Append `bytes` as the newest state (compacting first when the journal is long).
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let len = u32::try_from(bytes.len())
            .ok()
            .filter(|l| *l <= MAX_RECORD)
            .ok_or(StoreError::TooBig { what: "the agreement's state", len: bytes.len() })?;
        if self.len + (HEADER + bytes.len()) as u64 > JOURNAL_MAX && self.len > 0 {
            let mut fresh = Vec::with_capacity(HEADER + bytes.len());
            push_record(&mut fresh, bytes, len);
            self.disk.write_atomic(&self.path, &fresh).doing(|| format!("writing {}", self.path.display()))?;
            self.len = fresh.len() as u64;
        } else {
            let mut rec = Vec::with_capacity(HEADER + bytes.len());
            push_record(&mut rec, bytes, len);
            self.disk.append(&self.path, &rec).doing(|| format!("writing {}", self.path.display()))?;
            self.len += rec.len() as u64;
        }
        Ok(())
    }

    /// Make the written state durable (`fdatasync`): before the votes it holds are sent.
    pub fn sync(&mut self) -> Result<()> {
        self.disk.sync(&self.path).doing(|| format!("syncing {}", self.path.display()))
    }
}

fn push_record(out: &mut Vec<u8>, bytes: &[u8], len: u32) {
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&blake3::hash(bytes).as_bytes()[..8]);
    out.extend_from_slice(bytes);
}

pub use metatopia_client::keys::{generate as fresh_key, parse as parse_key, read as read_key, write as write_key};

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{self, OpenOptions};
    use std::io::Write;

    /// A test's directory, removed when it ends.
    fn tmp(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("metatopia-store-{name}-")).tempdir().unwrap()
    }

    #[test]
    fn the_agreement_journal_keeps_the_newest_whole_state_through_torn_tails_and_compaction() {
        let scratch = tmp("journal");
        let d = scratch.path();
        let dir = DataDir::open(d).unwrap();
        assert_eq!(dir.read_consensus_state().unwrap(), None);
        let mut j = StateJournal::open(&dir).unwrap();
        let state = |i: u32| -> Vec<u8> { (0..1_000 + i).map(|b| (b ^ i) as u8).collect() };
        for i in 0..50 {
            j.write(&state(i)).unwrap();
        }
        assert_eq!(dir.read_consensus_state().unwrap(), Some(state(49)));
        // A crash in the middle of the next write: the tail is cut off, the state before it stays.
        drop(j);
        let path = d.join(JOURNAL);
        let whole = fs::metadata(&path).unwrap().len();
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        let mut torn = Vec::new();
        push_record(&mut torn, &state(50), 1_050);
        f.write_all(&torn[..torn.len() / 2]).unwrap();
        drop(f);
        assert_eq!(dir.read_consensus_state().unwrap(), Some(state(49)));
        let mut j = StateJournal::open(&dir).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), whole, "the torn tail is cut off");
        j.write(&state(51)).unwrap();
        assert_eq!(dir.read_consensus_state().unwrap(), Some(state(51)));
        // A flipped byte in the newest record: the one before it is the state.
        let mut bytes = fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 3] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        assert_eq!(dir.read_consensus_state().unwrap(), Some(state(49)));
        // Long journals are replaced by their newest record.
        let mut j = StateJournal::open(&dir).unwrap();
        let big = vec![7u8; 300_000];
        for _ in 0..40 {
            j.write(&big).unwrap();
        }
        assert!(fs::metadata(&path).unwrap().len() <= JOURNAL_MAX, "compacted");
        assert_eq!(dir.read_consensus_state().unwrap(), Some(big));
    }

    #[test]
    fn a_consensus_state_from_before_the_journal_becomes_its_first_record() {
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
