//! The data directory: the node key, the commit log, snapshots and the consensus state.
//!
//! ```text
//! <data-dir>/node.key            ed25519 secret key (hex, mode 0600)
//! <data-dir>/config.toml         the node's config (see `crate::config`)
//! <data-dir>/log/commits.log     append-only: committed batches with their certificates
//! <data-dir>/snapshots/<tick>.snap   the sim after `tick` (the newest two are kept)
//! <data-dir>/consensus.state     the validator's votes and unfinished chain
//! ```
//!
//! **The log.** Each record is `len: u32 LE`, `checksum: [u8; 8]` (blake3 of the payload,
//! truncated), then the payload (postcard). A record is written with one `write` as soon as its
//! tick commits, so a process killed with `kill -9` loses nothing the kernel has; `fsync` runs in
//! groups (every [`SYNC_EVERY`] records or on [`CommitLog::sync`]), bounding what a power cut
//! can take. On open the log is read to its first torn or corrupt record, which is truncated
//! away with a warning, never misread: a record either checks out or is not there.
//!
//! **Snapshots and state files** are written to a temporary name and renamed, so a reader sees
//! the old file or the new one, never half of one.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use metatopia_sim::SigningKey;
use serde::{Deserialize, Serialize};

/// Records per group `fsync`.
pub const SYNC_EVERY: u32 = 64;
/// Largest log record (a batch of events with its certificate).
pub const MAX_RECORD: u32 = 64 << 20;
const HEADER: usize = 12;

/// One committed tick, as logged: enough to re-execute it and to prove it was committed.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LogRecord {
    pub tick: u64,
    pub time_ms: u64,
    /// The canonical-order seed (from the commit certificate).
    pub seed: [u8; 32],
    /// The signed events, as committed.
    pub events: Vec<Vec<u8>>,
    /// The block's notarization (postcard-encoded `Certificate`): proof for joiners.
    pub certificate: Vec<u8>,
}

/// What opening the log found.
#[derive(Debug, Default)]
pub struct Recovery {
    pub records: Vec<LogRecord>,
    /// Bytes cut off a torn or corrupt tail (0 when the log was clean).
    pub truncated: u64,
    /// Why the tail was cut, if it was.
    pub reason: Option<String>,
}

/// The append-only commit log.
#[derive(Debug)]
pub struct CommitLog {
    file: File,
    path: PathBuf,
    len: u64,
    unsynced: u32,
}

impl CommitLog {
    /// Open (or create) the log, read every good record, truncate a bad tail.
    pub fn open(path: &Path) -> anyhow::Result<(CommitLog, Recovery)> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .with_context(|| format!("opening the commit log {}", path.display()))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).with_context(|| format!("reading {}", path.display()))?;
        let mut recovery = Recovery::default();
        let mut at = 0usize;
        while at < bytes.len() {
            match read_record(&bytes[at..]) {
                Ok((rec, used)) => {
                    if let Some(last) = recovery.records.last()
                        && rec.tick != last.tick + 1
                    {
                        recovery.reason = Some(format!("record for tick {} follows tick {}", rec.tick, last.tick));
                        break;
                    }
                    recovery.records.push(rec);
                    at += used;
                }
                Err(reason) => {
                    recovery.reason = Some(reason);
                    break;
                }
            }
        }
        if at < bytes.len() {
            recovery.truncated = (bytes.len() - at) as u64;
            tracing::warn!(
                log = %path.display(),
                offset = at,
                bytes = recovery.truncated,
                reason = recovery.reason.as_deref().unwrap_or(""),
                "truncating a torn or corrupt commit log tail"
            );
            file.set_len(at as u64).context("truncating the commit log")?;
            file.sync_all().context("syncing the truncated commit log")?;
        }
        file.seek(SeekFrom::End(0))?;
        Ok((CommitLog { file, path: path.to_owned(), len: at as u64, unsynced: 0 }, recovery))
    }

    /// Append one record with one write; `fsync` every [`SYNC_EVERY`] records.
    pub fn append(&mut self, rec: &LogRecord) -> io::Result<()> {
        let payload = postcard::to_allocvec(rec).map_err(io::Error::other)?;
        if payload.len() > MAX_RECORD as usize {
            return Err(io::Error::other(format!("a record of {} bytes is over the limit", payload.len())));
        }
        let mut frame = Vec::with_capacity(HEADER + payload.len());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&checksum(&payload));
        frame.extend_from_slice(&payload);
        self.file.write_all(&frame)?;
        self.len += frame.len() as u64;
        self.unsynced += 1;
        if self.unsynced >= SYNC_EVERY {
            self.sync()?;
        }
        Ok(())
    }

    /// Make everything appended durable.
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced > 0 {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(())
    }

    pub fn len_bytes(&self) -> u64 {
        self.len
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn checksum(payload: &[u8]) -> [u8; 8] {
    let h = blake3::keyed_hash(b"metatopia/node/commit-log/v1____", payload);
    let mut c = [0u8; 8];
    c.copy_from_slice(&h.as_bytes()[..8]);
    c
}

fn read_record(bytes: &[u8]) -> Result<(LogRecord, usize), String> {
    if bytes.len() < HEADER {
        return Err(format!("a torn header ({} of {HEADER} bytes)", bytes.len()));
    }
    let len = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes"));
    if len > MAX_RECORD {
        return Err(format!("a record length of {len} bytes (over the limit)"));
    }
    let end = HEADER + len as usize;
    if bytes.len() < end {
        return Err(format!("a torn record ({} of {end} bytes)", bytes.len()));
    }
    let payload = &bytes[HEADER..end];
    if checksum(payload) != bytes[4..HEADER] {
        return Err("a checksum mismatch".into());
    }
    let (rec, rest) = postcard::take_from_bytes::<LogRecord>(payload).map_err(|e| format!("undecodable: {e}"))?;
    if !rest.is_empty() {
        return Err("trailing bytes in a record".into());
    }
    Ok((rec, end))
}

/// A node's data directory.
#[derive(Clone, Debug)]
pub struct DataDir {
    root: PathBuf,
}

/// The data format this node writes (consensus state, log, snapshots); a directory written by
/// another format is refused with a clear error instead of being misread. 2: votes signed under
/// their epoch's chain digest, node messages with epochs; 3: the `aoi_radius_m` setting and
/// returned objects in accounts; 4: block digests over the header and the events' ids.
pub const DATA_FORMAT: u32 = 4;

impl DataDir {
    /// Open (creating what is missing) the data directory at `root`. A directory holding
    /// consensus state or a log in another format (or from before formats were recorded) is an
    /// error that says so.
    pub fn open(root: &Path) -> anyhow::Result<DataDir> {
        let marker = root.join("format");
        let used = root.join("consensus.state").exists()
            || root.join(JOURNAL).exists()
            || root.join("log").join("commits.log").exists();
        match fs::read_to_string(&marker) {
            Ok(text) if text.trim() == DATA_FORMAT.to_string() => {}
            Ok(text) => anyhow::bail!(
                "{} holds data format {}, this node writes format {DATA_FORMAT}: move it away or start a new one",
                root.display(),
                text.trim()
            ),
            Err(_) if used => anyhow::bail!(
                "{} holds data from an older version (no format marker; this node writes format {DATA_FORMAT}): move it away or start a new one",
                root.display()
            ),
            Err(_) => {}
        }
        for d in [root.to_owned(), root.join("log"), root.join("snapshots")] {
            fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        if !marker.exists() {
            write_atomic(&marker, format!("{DATA_FORMAT}\n").as_bytes())?;
        }
        Ok(DataDir { root: root.to_owned() })
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

    pub fn log_path(&self) -> PathBuf {
        self.root.join("log").join("commits.log")
    }

    /// The node key, created on first use.
    pub fn key(&self) -> anyhow::Result<SigningKey> {
        let path = self.root.join("node.key");
        match read_key(&path) {
            Ok(Some(key)) => Ok(key),
            Ok(None) => {
                let key = fresh_key()?;
                write_key(&path, &key)?;
                Ok(key)
            }
            Err(e) => Err(e).with_context(|| format!("reading the node key {}", path.display())),
        }
    }

    /// Write the snapshot after `tick`; keep the newest two.
    pub fn write_snapshot(&self, tick: u64, bytes: &[u8]) -> anyhow::Result<()> {
        let path = self.root.join("snapshots").join(format!("{tick:012}.snap"));
        write_atomic(&path, bytes)?;
        let mut all = self.snapshots()?;
        while all.len() > 2 {
            let (_, old) = all.remove(0);
            let _ = fs::remove_file(old);
        }
        Ok(())
    }

    /// Snapshots on disk, oldest first.
    pub fn snapshots(&self) -> anyhow::Result<Vec<(u64, PathBuf)>> {
        let mut v = Vec::new();
        for e in fs::read_dir(self.root.join("snapshots"))? {
            let p = e?.path();
            if p.extension().is_some_and(|x| x == "snap")
                && let Some(t) = p.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse().ok())
            {
                v.push((t, p));
            }
        }
        v.sort();
        Ok(v)
    }

    /// The agreement's state as last written: the journal's newest whole record, or (a data
    /// directory from before the journal) the whole of `consensus.state`.
    pub fn read_consensus_state(&self) -> anyhow::Result<Option<Vec<u8>>> {
        let (_, newest) = StateJournal::scan(&self.root.join(JOURNAL))?;
        if newest.is_some() {
            return Ok(newest);
        }
        match fs::read(self.root.join("consensus.state")) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).context("reading consensus.state"),
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
    path: PathBuf,
    file: File,
    len: u64,
}

impl StateJournal {
    /// Open the journal (creating it), cutting off a torn tail.
    pub fn open(dir: &DataDir) -> anyhow::Result<StateJournal> {
        let path = dir.root.join(JOURNAL);
        let (good, newest) = StateJournal::scan(&path)?;
        // A data directory from before the journal: its state becomes the first record.
        let legacy = dir.root.join("consensus.state");
        if newest.is_none() && legacy.exists() {
            let bytes = fs::read(&legacy).with_context(|| format!("reading {}", legacy.display()))?;
            let mut first = Vec::new();
            let len = u32::try_from(bytes.len()).context("consensus.state is too big")?;
            push_record(&mut first, &bytes, len);
            write_atomic(&path, &first)?;
            fs::remove_file(&legacy).with_context(|| format!("removing {}", legacy.display()))?;
            return StateJournal::open(dir);
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        file.set_len(good).with_context(|| format!("cutting the torn tail of {}", path.display()))?;
        let mut j = StateJournal { path, file, len: good };
        j.file.seek(SeekFrom::Start(good))?;
        Ok(j)
    }

    /// The length of the whole records at the start of the file at `path`, and the newest one.
    fn scan(path: &Path) -> anyhow::Result<(u64, Option<Vec<u8>>)> {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, None)),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
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
        Ok((at as u64, newest))
    }

    /// Append `bytes` as the newest state (compacting first when the journal is long).
    pub fn write(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let len =
            u32::try_from(bytes.len()).ok().filter(|l| *l <= MAX_RECORD).context("the agreement's state is too big")?;
        if self.len + (HEADER + bytes.len()) as u64 > JOURNAL_MAX && self.len > 0 {
            let mut fresh = Vec::with_capacity(HEADER + bytes.len());
            push_record(&mut fresh, bytes, len);
            write_atomic(&self.path, &fresh)?;
            self.file = OpenOptions::new().append(true).open(&self.path)?;
            self.len = fresh.len() as u64;
        } else {
            let mut rec = Vec::with_capacity(HEADER + bytes.len());
            push_record(&mut rec, bytes, len);
            self.file.write_all(&rec).with_context(|| format!("writing {}", self.path.display()))?;
            self.len += rec.len() as u64;
        }
        Ok(())
    }
}

fn push_record(out: &mut Vec<u8>, bytes: &[u8], len: u32) {
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&blake3::hash(bytes).as_bytes()[..8]);
    out.extend_from_slice(bytes);
}

/// Read a key file (64 hex digits of secret key); `None` if there is no file.
pub fn read_key(path: &Path) -> anyhow::Result<Option<SigningKey>> {
    match fs::read_to_string(path) {
        Ok(text) => parse_key(text.trim()).with_context(|| format!("reading the key {}", path.display())).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading the key {}", path.display())),
    }
}

/// Write a key file readable by its owner only.
pub fn write_key(path: &Path, key: &SigningKey) -> anyhow::Result<()> {
    write_atomic(path, format!("{}\n", metatopia_sim::ids::hex(&key.to_bytes())).as_bytes())?;
    restrict(path)
}

pub fn parse_key(hex: &str) -> anyhow::Result<SigningKey> {
    let seed = crate::config::parse_hex32(hex).context("a key file holds a secret key")?;
    Ok(SigningKey::from_bytes(&seed))
}

/// A new signing key from the OS's random source (node keys, an operator's admin key).
pub fn fresh_key() -> anyhow::Result<SigningKey> {
    let mut seed = [0u8; 32];
    getrandom(&mut seed)?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Write `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(bytes).with_context(|| format!("writing {}", tmp.display()))?;
    }
    fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}

#[cfg(unix)]
fn restrict(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).context("restricting the key file to its owner")
}

#[cfg(not(unix))]
fn restrict(_: &Path) -> anyhow::Result<()> {
    Ok(())
}

/// 32 bytes from the OS (the node is the only layer allowed an OS random source).
fn getrandom(buf: &mut [u8; 32]) -> anyhow::Result<()> {
    let mut f = File::open("/dev/urandom").context("opening /dev/urandom for a new node key")?;
    f.read_exact(buf).context("reading /dev/urandom")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(tick: u64) -> LogRecord {
        LogRecord {
            tick,
            time_ms: tick * 16,
            seed: [tick as u8; 32],
            events: vec![vec![1, 2, 3]; (tick % 3) as usize],
            certificate: vec![9; 40],
        }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("metatopia-store-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn the_agreement_journal_keeps_the_newest_whole_state_through_torn_tails_and_compaction() {
        let d = tmp("journal");
        let dir = DataDir::open(&d).unwrap();
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
        let d = tmp("legacy");
        let dir = DataDir::open(&d).unwrap();
        fs::write(d.join("consensus.state"), b"old votes").unwrap();
        assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"old votes"[..]));
        let mut j = StateJournal::open(&dir).unwrap();
        assert!(!d.join("consensus.state").exists());
        assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"old votes"[..]));
        j.write(b"new votes").unwrap();
        assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"new votes"[..]));
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_truncated_not_misread() {
        let d = tmp("torn");
        let path = d.join("commits.log");
        let (mut log, r) = CommitLog::open(&path).unwrap();
        assert!(r.records.is_empty() && r.truncated == 0);
        for t in 0..10 {
            log.append(&rec(t)).unwrap();
        }
        let good_len = log.len_bytes();
        log.append(&rec(10)).unwrap();
        drop(log);
        // Tear the last record in the middle, as a crash mid-write would.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(good_len + 7).unwrap();
        drop(f);
        let (mut log, r) = CommitLog::open(&path).unwrap();
        assert_eq!(r.records, (0..10).map(rec).collect::<Vec<_>>());
        assert_eq!(r.truncated, 7);
        assert!(r.reason.unwrap().contains("torn"));
        assert_eq!(fs::metadata(&path).unwrap().len(), good_len);
        // Appending after recovery continues the chain.
        log.append(&rec(10)).unwrap();
        drop(log);
        let (_, r) = CommitLog::open(&path).unwrap();
        assert_eq!(r.records.len(), 11);
        assert_eq!(r.truncated, 0);
    }

    #[test]
    fn a_flipped_bit_stops_reading_at_that_record() {
        let d = tmp("flip");
        let path = d.join("commits.log");
        let (mut log, _) = CommitLog::open(&path).unwrap();
        let mut ends = Vec::new();
        for t in 0..6 {
            log.append(&rec(t)).unwrap();
            ends.push(log.len_bytes());
        }
        drop(log);
        let mut bytes = fs::read(&path).unwrap();
        let victim = ends[2] as usize + HEADER + 3; // inside record 3's payload
        bytes[victim] ^= 0x10;
        fs::write(&path, &bytes).unwrap();
        let (_, r) = CommitLog::open(&path).unwrap();
        assert_eq!(r.records.len(), 3);
        assert!(r.reason.unwrap().contains("checksum"));
        assert_eq!(fs::metadata(&path).unwrap().len(), ends[2]);
    }

    #[test]
    fn garbage_and_huge_lengths_are_refused_without_allocating() {
        let d = tmp("garbage");
        let path = d.join("commits.log");
        let mut junk = vec![0xffu8; 4]; // length u32::MAX
        junk.extend_from_slice(&[0; 40]);
        fs::write(&path, &junk).unwrap();
        let (_, r) = CommitLog::open(&path).unwrap();
        assert!(r.records.is_empty());
        assert!(r.reason.unwrap().contains("over the limit"));
        assert_eq!(fs::metadata(&path).unwrap().len(), 0);
        // Random bytes: never a panic, never a record.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            let n = (round * 7) % 300;
            let bytes: Vec<u8> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            fs::write(&path, &bytes).unwrap();
            let (_, r) = CommitLog::open(&path).unwrap();
            assert!(r.records.is_empty());
        }
    }

    #[test]
    fn the_key_is_created_once_and_kept_private() {
        let d = tmp("key");
        let dir = DataDir::open(&d).unwrap();
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
        let root = tmp("format");
        DataDir::open(&root).unwrap();
        assert_eq!(std::fs::read_to_string(root.join("format")).unwrap().trim(), DATA_FORMAT.to_string());
        std::fs::write(root.join("format"), "1\n").unwrap();
        let e = DataDir::open(&root).unwrap_err().to_string();
        assert!(e.contains("format 1") && e.contains("move it away"), "{e}");
        assert!(DataDir::incompatible(&root));
        // Data from before the marker existed.
        std::fs::remove_file(root.join("format")).unwrap();
        std::fs::write(root.join("consensus.state"), b"old").unwrap();
        let e = DataDir::open(&root).unwrap_err().to_string();
        assert!(e.contains("older version"), "{e}");
    }

    #[test]
    fn snapshots_keep_the_newest_two() {
        let d = tmp("snaps");
        let dir = DataDir::open(&d).unwrap();
        for t in [10u64, 20, 30, 40] {
            dir.write_snapshot(t, &[t as u8; 10]).unwrap();
        }
        let s = dir.snapshots().unwrap();
        assert_eq!(s.iter().map(|(t, _)| *t).collect::<Vec<_>>(), vec![30, 40]);
        assert_eq!(fs::read(&s[1].1).unwrap(), vec![40u8; 10]);
    }
}
