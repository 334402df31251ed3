//! The commit log: every committed tick with its certificate, in segments.
//!
//! ```text
//! <data-dir>/log/<first tick, 12 digits>.seg     consecutive ticks from the one in its name
//! <data-dir>/log/<...>.seg.damaged               a segment found damaged, kept for the operator
//! ```
//!
//! A record is `len: u32 LE`, `checksum: [u8; 8]` (keyed blake3 of the payload, truncated), then
//! the payload (a postcard [`LogRecord`]). It is written with one `write` as soon as its tick
//! commits, so a process killed with `kill -9` loses nothing the kernel has; `fdatasync` runs in
//! groups ([`SYNC_EVERY`] records, or [`CommitLog::sync`] before the agreement's state is made
//! durable), bounding what a power cut can take.
//!
//! Invariants, kept by construction:
//! - A segment holds consecutive ticks, starting at the tick in its name. A record that does not
//!   follow the current segment's last one (a certified snapshot installed, a repair) starts a
//!   new segment: a jump is a boundary, never mistaken for corruption.
//! - A later segment supersedes what earlier ones hold from its first tick on, and starting one
//!   deletes the segments that begin at or after it (a future this node no longer follows).
//! - Segments wholly below the oldest snapshot kept are deleted ([`CommitLog::prune_below`]), and a
//!   segment holds at most [`SEGMENT_RECORDS`] records, so the log's size is bounded by the
//!   snapshots' spacing, not by the sim's age; opening reads only the segments a restart needs.
//! - Only the newest segment's final record may be torn (a crash mid-write): it is cut off. A bad
//!   record anywhere else (a flipped bit, a lost sector) is reported with its file and offset,
//!   the segment is copied to `.damaged` and kept up to that record, and the node takes what it
//!   lacks from its peers (a snapshot they certify): nothing is misread, nothing wedges.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::{Doing, Result};
use metatopia_sim::Tick;
use serde::{Deserialize, Serialize};

use super::disk::{Disk, OsDisk};

/// Records per group `fdatasync`.
pub const SYNC_EVERY: u32 = 64;
/// Records per segment before a new one starts (a few minutes at the usual rates).
pub const SEGMENT_RECORDS: u64 = 4096;
/// Largest log record (a batch of events with its certificate).
pub const MAX_RECORD: u32 = 64 << 20;
pub(crate) const HEADER: usize = 12;
const EXT: &str = "seg";

/// One committed tick, as logged: enough to re-execute it and to prove it was committed.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct LogRecord {
    pub tick: Tick,
    pub time_ms: u64,
    /// The canonical-order seed (from the commit certificate).
    pub seed: [u8; 32],
    /// The signed events, as committed.
    pub events: Vec<Vec<u8>>,
    /// The block's notarization (postcard-encoded `Certificate`): proof for joiners.
    pub certificate: Vec<u8>,
    /// The empty block that opened the tick, when the logged block fills it (agreement's R1
    /// fills): its BFT time and its notarization (postcard-encoded `Certificate`).
    pub opener: Option<(u64, Vec<u8>)>,
}

/// What opening the log found.
#[derive(Debug, Default)]
pub struct Recovery {
    /// The records read, by tick; a gap is where no segment holds the ticks (a snapshot or the
    /// peers must bridge it).
    pub records: Vec<LogRecord>,
    /// Bytes cut off a torn tail of the newest segment (0 when it was whole).
    pub truncated: u64,
    /// Why the tail was cut, if it was.
    pub reason: Option<String>,
    /// Damage found elsewhere: the file, the offset and what was wrong, for each.
    pub damaged: Vec<String>,
}

/// The segment being appended to.
#[derive(Debug)]
struct Current {
    path: PathBuf,
    first: Tick,
    next: Tick,
    records: u64,
}

/// The segmented, append-only commit log.
#[derive(Debug)]
pub struct CommitLog {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    current: Option<Current>,
    unsynced: u32,
}

fn segment_path(dir: &Path, first: Tick) -> PathBuf {
    dir.join(format!("{:012}.{EXT}", first.0))
}

/// The segments in `dir`, by first tick.
fn segments(disk: &dyn Disk, dir: &Path) -> Result<Vec<(Tick, PathBuf)>> {
    let mut v = Vec::new();
    for p in disk.list(dir).doing(|| format!("listing {}", dir.display()))? {
        if p.extension().is_some_and(|x| x == EXT)
            && let Some(t) = p.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse().ok())
        {
            v.push((Tick(t), p));
        }
    }
    v.sort();
    Ok(v)
}

/// A segment read: its records, and the first bad one's offset and reason.
struct Read_ {
    records: Vec<LogRecord>,
    good_len: u64,
    bad: Option<(u64, String, bool)>,
}

/// Read a segment's records up to the first bad one. `torn` (the third field of `bad`): the bad
/// record is the file's last (its claimed end reaches the end of the file), as a crash mid-write
/// leaves it; anything else is damage.
fn read_segment(disk: &dyn Disk, path: &Path, first: Tick) -> Result<Read_> {
    let bytes = disk.read(path).doing(|| format!("reading {}", path.display()))?;
    read_records(&bytes[..], bytes.len() as u64, first).doing(|| format!("reading {}", path.display()))
}

/// The records of a segment of `size` bytes whose first tick is `first`, read from `r`, up to
/// the first bad one (public for the fuzz targets: any bytes, no panic, bounded allocation).
pub fn read_records_for_fuzzing(bytes: &[u8]) -> usize {
    read_records(bytes, bytes.len() as u64, Tick::ZERO).map_or(0, |r| r.records.len())
}

fn read_records(mut r: impl Read, size: u64, first: Tick) -> io::Result<Read_> {
    let mut out = Read_ { records: Vec::new(), good_len: 0, bad: None };
    let mut at = 0u64;
    let mut head = [0u8; HEADER];
    while at < size {
        let left = size - at;
        if left < HEADER as u64 {
            out.bad = Some((at, format!("a torn header ({left} of {HEADER} bytes)"), true));
            break;
        }
        r.read_exact(&mut head)?;
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        let end = at + (HEADER as u64) + u64::from(len);
        if len > MAX_RECORD {
            out.bad = Some((at, format!("a record length of {len} bytes (over the limit)"), end >= size));
            break;
        }
        if end > size {
            out.bad = Some((at, format!("a torn record ({} of {} bytes)", left, end - at), true));
            break;
        }
        let mut payload = vec![0u8; len as usize];
        r.read_exact(&mut payload)?;
        let last = end == size;
        if checksum(&payload) != head[4..] {
            out.bad = Some((at, "a checksum mismatch".into(), last));
            break;
        }
        let expected = first + out.records.len() as u64;
        match postcard::from_bytes::<LogRecord>(&payload) {
            Ok(rec) if rec.tick == expected => out.records.push(rec),
            Ok(rec) => {
                out.bad = Some((at, format!("a record for tick {} where tick {expected} belongs", rec.tick), false));
                break;
            }
            Err(e) => {
                out.bad = Some((at, format!("an undecodable record: {e}"), false));
                break;
            }
        }
        at = end;
        out.good_len = at;
    }
    Ok(out)
}

impl CommitLog {
    /// Open (or create) the log in `dir` and read the records a restart from tick `from` needs
    /// (the oldest snapshot it may load): the segments that can hold ticks at or after it.
    /// A torn tail of the newest segment is cut off; damage elsewhere is reported in
    /// [`Recovery::damaged`] and the segment kept up to it.
    pub fn open(dir: &Path, from: Tick) -> Result<(CommitLog, Recovery)> {
        CommitLog::open_on(Arc::new(OsDisk::default()), dir, from)
    }

    /// [`CommitLog::open`] on `disk` (the machine's, or a simulated one).
    pub fn open_on(disk: Arc<dyn Disk>, dir: &Path, from: Tick) -> Result<(CommitLog, Recovery)> {
        let d = &*disk;
        d.create_dir_all(dir).doing(|| format!("creating {}", dir.display()))?;
        adopt_single_file_log(d, dir)?;
        let all = segments(d, dir)?;
        let mut recovery = Recovery::default();
        let mut current = None;
        for (i, (first, path)) in all.iter().enumerate() {
            let newest = i + 1 == all.len();
            let next_first = all.get(i + 1).map(|(t, _)| *t);
            if !newest && next_first.is_some_and(|n| n <= from) {
                continue; // wholly before what a restart replays
            }
            let read = read_segment(d, path, *first)?;
            if let Some((offset, reason, torn)) = &read.bad {
                let size = d.len(path).doing(|| format!("reading the size of {}", path.display()))?;
                if newest && *torn {
                    recovery.truncated = size - offset;
                    recovery.reason = Some(format!("{reason} at offset {offset} of {}", path.display()));
                } else {
                    let keep = path.with_extension(format!("{EXT}.damaged"));
                    d.copy(path, &keep).doing(|| format!("keeping a copy of {}", path.display()))?;
                    recovery.damaged.push(format!(
                        "{}: {reason} at offset {offset}; the segment is kept up to there (a copy is {})",
                        path.display(),
                        keep.display()
                    ));
                }
                d.truncate(path, read.good_len)
                    .and_then(|()| d.sync(path))
                    .doing(|| format!("cutting {} at {}", path.display(), read.good_len))?;
            }
            recovery.records.retain(|r| r.tick < *first);
            let n = read.records.len() as u64;
            recovery.records.extend(read.records);
            if newest {
                current = Some(Current { path: path.clone(), first: *first, next: *first + n, records: n });
            }
        }
        Ok((CommitLog { disk, dir: dir.to_owned(), current, unsynced: 0 }, recovery))
    }

    /// Append one record with one write (a new segment first when it does not follow the last
    /// one, or the segment is full); `fdatasync` every [`SYNC_EVERY`] records.
    pub fn append(&mut self, rec: &LogRecord) -> io::Result<()> {
        let payload = postcard::to_allocvec(rec).map_err(io::Error::other)?;
        if payload.len() > MAX_RECORD as usize {
            return Err(io::Error::other(format!("a record of {} bytes is over the limit", payload.len())));
        }
        if self.current.as_ref().is_none_or(|c| c.next != rec.tick || c.records >= SEGMENT_RECORDS) {
            self.start_segment(rec.tick)?;
        }
        let c = self.current.as_mut().expect("a segment was started");
        let mut frame = Vec::with_capacity(HEADER + payload.len());
        frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        frame.extend_from_slice(&checksum(&payload));
        frame.extend_from_slice(&payload);
        self.disk.append(&c.path, &frame)?;
        c.next = rec.tick.next();
        c.records += 1;
        self.unsynced += 1;
        if self.unsynced >= SYNC_EVERY {
            self.sync()?;
        }
        Ok(())
    }

    /// Close the current segment (durable) and start one at `first`; segments that begin at or
    /// after it are a future this node no longer follows, and go.
    fn start_segment(&mut self, first: Tick) -> io::Result<()> {
        self.sync()?;
        self.current = None;
        for (t, p) in segments(&*self.disk, &self.dir).map_err(io::Error::other)? {
            if t >= first {
                self.disk.remove(&p)?;
            }
        }
        let path = segment_path(&self.dir, first);
        self.disk.create(&path)?;
        self.disk.sync(&path)?;
        self.disk.sync_dir(&self.dir)?;
        self.current = Some(Current { path, first, next: first, records: 0 });
        Ok(())
    }

    /// Make everything appended durable.
    pub fn sync(&mut self) -> io::Result<()> {
        if self.unsynced > 0
            && let Some(c) = &self.current
        {
            self.disk.sync(&c.path)?;
        }
        self.unsynced = 0;
        Ok(())
    }

    /// Delete the segments wholly below `tick` (the oldest snapshot kept); the current one stays.
    pub fn prune_below(&mut self, tick: Tick) -> Result<u32> {
        let all = segments(&*self.disk, &self.dir)?;
        let current = self.current.as_ref().map(|c| c.first);
        let mut removed = 0;
        for w in all.windows(2) {
            let ((first, path), (next_first, _)) = (&w[0], &w[1]);
            if *next_first <= tick && Some(*first) != current {
                self.disk.remove(path).doing(|| format!("removing {}", path.display()))?;
                removed += 1;
            }
        }
        if removed > 0 {
            self.disk.sync_dir(&self.dir).doing(|| format!("syncing {}", self.dir.display()))?;
        }
        Ok(removed)
    }

    /// Bytes the log's segments take on disk.
    pub fn disk_bytes(&self) -> u64 {
        segments(&*self.disk, &self.dir).map_or(0, |s| s.iter().filter_map(|(_, p)| self.disk.len(p).ok()).sum())
    }

    /// The next tick the log expects (one past its newest record), if it has any.
    pub fn next_tick(&self) -> Option<Tick> {
        self.current.as_ref().filter(|c| c.records > 0).map(|c| c.next)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A log from before segments (`log/commits.log`): it becomes the segment of its first tick.
fn adopt_single_file_log(disk: &dyn Disk, dir: &Path) -> Result<()> {
    let old = dir.join("commits.log");
    if !disk.exists(&old) {
        return Ok(());
    }
    // Its first record's header, then the record (not the whole log, which can be gigabytes).
    let head = disk.read_prefix(&old, HEADER as u64).doing(|| "reading log/commits.log".to_owned())?;
    let len = head.get(..4).map_or(0, |l| u32::from_le_bytes(l.try_into().expect("4 bytes")).min(MAX_RECORD));
    let bytes =
        disk.read_prefix(&old, HEADER as u64 + u64::from(len)).doing(|| "reading log/commits.log".to_owned())?;
    let first = bytes.get(..HEADER).and_then(|head| {
        let len = u32::from_le_bytes(head[..4].try_into().ok()?).min(MAX_RECORD) as usize;
        let payload = bytes.get(HEADER..HEADER + len)?;
        postcard::from_bytes::<LogRecord>(payload).ok().map(|r| r.tick)
    });
    match first {
        Some(t) => {
            disk.rename(&old, &segment_path(dir, t)).doing(|| "adopting log/commits.log as a segment".to_owned())?
        }
        None => disk.remove(&old).doing(|| "removing an empty log/commits.log".to_owned())?,
    }
    disk.sync_dir(dir).doing(|| format!("syncing {}", dir.display()))
}

fn checksum(payload: &[u8]) -> [u8; 8] {
    let h = blake3::keyed_hash(b"metatopia/node/commit-log/v1____", payload);
    let mut c = [0u8; 8];
    c.copy_from_slice(&h.as_bytes()[..8]);
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{self, OpenOptions};

    fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
        Ok(super::segments(&OsDisk::default(), dir)?.into_iter().map(|(t, p)| (t.0, p)).collect())
    }

    fn rec(tick: u64) -> LogRecord {
        LogRecord {
            tick: Tick(tick),
            time_ms: tick * 16,
            seed: [tick as u8; 32],
            events: vec![vec![1, 2, 3]; (tick % 3) as usize],
            certificate: vec![9; 40],
            opener: (tick % 2 == 1).then(|| ((tick * 16).saturating_sub(8), vec![8; 40])),
        }
    }

    /// A test's directory, removed when it ends.
    fn tmp(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("metatopia-log-{name}-")).tempdir().unwrap()
    }

    fn ticks(r: &Recovery) -> Vec<u64> {
        r.records.iter().map(|r| r.tick.0).collect()
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_is_cut_not_misread() {
        let scratch = tmp("torn");
        let d = scratch.path();
        let (mut log, r) = CommitLog::open(d, Tick::ZERO).unwrap();
        assert!(r.records.is_empty() && r.truncated == 0);
        for t in 0..11 {
            log.append(&rec(t)).unwrap();
        }
        drop(log);
        let seg = segment_path(d, Tick(0));
        let whole = fs::metadata(&seg).unwrap().len();
        // Tear the last record in the middle, as a crash mid-write would.
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.set_len(whole - 9).unwrap();
        drop(f);
        let (mut log, r) = CommitLog::open(d, Tick::ZERO).unwrap();
        assert_eq!(r.records, (0..10).map(rec).collect::<Vec<_>>());
        assert!(r.truncated > 0 && r.reason.as_deref().unwrap().contains("torn"), "{:?}", r.reason);
        assert!(r.damaged.is_empty());
        // Appending after recovery continues the chain.
        log.append(&rec(10)).unwrap();
        drop(log);
        let (_, r) = CommitLog::open(d, Tick::ZERO).unwrap();
        assert_eq!(ticks(&r), (0..11).collect::<Vec<_>>());
        assert_eq!(r.truncated, 0);
    }

    /// The wedge of a node that installed a certified snapshot while its log went on: the jump
    /// starts a new segment, and a restart reads every record, cutting nothing.
    #[test]
    fn a_jump_starts_a_segment_and_is_never_taken_for_corruption() {
        let scratch = tmp("jump");
        let d = scratch.path();
        let (mut log, _) = CommitLog::open(d, Tick::ZERO).unwrap();
        for t in (0..976).chain(1080..1326) {
            log.append(&rec(t)).unwrap();
        }
        drop(log);
        let (_, r) = CommitLog::open(d, Tick::ZERO).unwrap();
        assert_eq!((r.truncated, r.damaged.len()), (0, 0), "{:?}", r.reason);
        assert_eq!(ticks(&r), (0..976).chain(1080..1326).collect::<Vec<_>>());
        assert_eq!(segments(d).unwrap().iter().map(|(t, _)| *t).collect::<Vec<_>>(), vec![0, 1080]);
    }

    /// Back to an older certified snapshot than what was logged: the new segment supersedes.
    #[test]
    fn a_later_segment_supersedes_what_earlier_ones_hold_from_its_first_tick() {
        let scratch = tmp("supersede");
        let d = scratch.path();
        let (mut log, _) = CommitLog::open(d, Tick::ZERO).unwrap();
        for t in 0..50 {
            log.append(&rec(t)).unwrap();
        }
        let mut other = rec(30);
        other.time_ms = 7;
        log.append(&other).unwrap();
        for t in 31..40 {
            log.append(&rec(t)).unwrap();
        }
        drop(log);
        let (_, r) = CommitLog::open(d, Tick::ZERO).unwrap();
        assert_eq!(ticks(&r), (0..40).collect::<Vec<_>>());
        assert_eq!(r.records[30].time_ms, 7, "the later segment's record");
    }

    #[test]
    fn damage_in_the_middle_is_reported_with_file_and_offset_and_the_rest_is_kept() {
        let scratch = tmp("flip");
        let d = scratch.path();
        let (mut log, _) = CommitLog::open(d, Tick::ZERO).unwrap();
        for t in 0..6 {
            log.append(&rec(t)).unwrap();
        }
        drop(log);
        let seg = segment_path(d, Tick(0));
        let mut bytes = fs::read(&seg).unwrap();
        let n = bytes.len();
        bytes[n / 4 + 3] ^= 0x10;
        fs::write(&seg, &bytes).unwrap();
        let (_, r) = CommitLog::open(d, Tick::ZERO).unwrap();
        assert!(r.records.len() < 6 && r.truncated == 0);
        assert_eq!(r.damaged.len(), 1);
        assert!(r.damaged[0].contains("000000000000.seg") && r.damaged[0].contains("at offset"), "{}", r.damaged[0]);
        assert!(d.join("000000000000.seg.damaged").exists(), "a copy kept for the operator");
    }

    #[test]
    fn segments_roll_and_are_pruned_below_the_oldest_snapshot_and_opening_reads_only_what_it_needs() {
        let scratch = tmp("prune");
        let d = scratch.path();
        let (mut log, _) = CommitLog::open(d, Tick::ZERO).unwrap();
        let n = 3 * SEGMENT_RECORDS + 10;
        for t in 0..n {
            log.append(&rec(t)).unwrap();
        }
        let firsts = |d: &Path| segments(d).unwrap().iter().map(|(t, _)| *t).collect::<Vec<_>>();
        assert_eq!(firsts(d), vec![0, SEGMENT_RECORDS, 2 * SEGMENT_RECORDS, 3 * SEGMENT_RECORDS]);
        // Opened for a restart from 2·S + 5: the first two segments are not read.
        let (_, r) = CommitLog::open(d, Tick(2 * SEGMENT_RECORDS + 5)).unwrap();
        assert_eq!(r.records.first().map(|r| r.tick), Some(Tick(2 * SEGMENT_RECORDS)));
        assert_eq!(r.records.len() as u64, n - 2 * SEGMENT_RECORDS);
        assert_eq!(log.prune_below(Tick(2 * SEGMENT_RECORDS + 5)).unwrap(), 2);
        assert_eq!(firsts(d), vec![2 * SEGMENT_RECORDS, 3 * SEGMENT_RECORDS]);
        assert_eq!(log.next_tick(), Some(Tick(n)));
    }

    #[test]
    fn garbage_and_huge_lengths_are_refused_without_allocating() {
        let scratch = tmp("garbage");
        let d = scratch.path();
        fs::create_dir_all(d).unwrap();
        let seg = segment_path(d, Tick(0));
        let mut junk = vec![0xffu8; 4]; // length u32::MAX
        junk.extend_from_slice(&[0; 40]);
        fs::write(&seg, &junk).unwrap();
        let (_, r) = CommitLog::open(d, Tick::ZERO).unwrap();
        assert!(r.records.is_empty());
        assert!(r.reason.unwrap().contains("over the limit"));
        assert_eq!(fs::metadata(&seg).unwrap().len(), 0);
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
            fs::write(&seg, &bytes).unwrap();
            let (_, r) = CommitLog::open(d, Tick::ZERO).unwrap();
            assert!(r.records.is_empty());
        }
    }

    #[test]
    fn a_log_from_before_segments_is_adopted() {
        let scratch = tmp("adopt");
        let d = scratch.path();
        let (mut log, _) = CommitLog::open(d, Tick::ZERO).unwrap();
        for t in 5..9 {
            log.append(&rec(t)).unwrap();
        }
        drop(log);
        fs::rename(segment_path(d, Tick(5)), d.join("commits.log")).unwrap();
        let (_, r) = CommitLog::open(d, Tick::ZERO).unwrap();
        assert_eq!(ticks(&r), vec![5, 6, 7, 8]);
        assert!(segment_path(d, Tick(5)).exists() && !d.join("commits.log").exists());
    }
}
