//! The store on a simulated disk with faults: power cuts (unsynced bytes and names lost, appends
//! in flight torn), flipped bits, a full disk, a read-only one. What the store promises: a
//! record or a state that was synced survives a power cut; nothing is misread; damage is an
//! error naming the file and offset; a full or read-only disk is a clear error, not a panic.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::disk::{Disk, SimDisk};
use super::log::{CommitLog, LogRecord, SEGMENT_RECORDS};
use super::{DataDir, StateJournal};
use metatopia_sim::Tick;

fn rec(tick: u64, size: u64) -> LogRecord {
    LogRecord {
        tick: Tick(tick),
        time_ms: tick * 50,
        seed: [tick as u8; 32],
        events: vec![vec![tick as u8; 40]; (size % 5) as usize],
        certificate: vec![7; 64],
        opener: (size % 2 == 1).then(|| ((tick * 50).saturating_sub(10), vec![6; 64])),
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a node's store holds, opened as a restart opens it.
struct Node {
    dir: DataDir,
    log: CommitLog,
    journal: StateJournal,
}

fn open(disk: &Arc<SimDisk>) -> (Node, Vec<LogRecord>) {
    let disk: Arc<dyn Disk> = disk.clone();
    let dir = DataDir::open_on(disk.clone(), Path::new("/node")).expect("the data directory opens");
    let (log, recovery) = CommitLog::open_on(disk, &dir.log_dir(), Tick::ZERO).expect("the log opens");
    assert!(recovery.damaged.is_empty(), "a power cut is not damage: {:?}", recovery.damaged);
    let journal = StateJournal::open(&dir).expect("the journal opens");
    (Node { dir, log, journal }, recovery.records)
}

/// One seed: a node's store written as the node writes it (commits appended, then the log
/// synced and the agreement's state written and synced before votes leave; now and then a
/// certified snapshot's jump), cut by power losses at random points, reopened each time.
fn power_losses(seed: u64) -> (u64, u64) {
    let mut rng = Rng(seed);
    let disk = Arc::new(SimDisk::new());
    let (mut node, _) = open(&disk);
    // What was appended (by tick) and what a sync made durable.
    let mut appended: BTreeMap<u64, LogRecord> = BTreeMap::new();
    let (mut synced_upto, mut next) = (None::<u64>, 0u64);
    let (mut written, mut synced_state) = (0u64, 0u64);
    let (mut cuts, mut lost) = (0u64, 0u64);
    for _ in 0..(100 + rng.below(400)) {
        match rng.below(40) {
            0 => next += 1 + rng.below(60),
            1 | 2 => {
                disk.power_loss(rng.next());
                cuts += 1;
                let (again, records) = open(&disk);
                node = again;
                // Every synced record is back, whole; nothing was made up.
                for r in &records {
                    assert_eq!(appended.get(&r.tick.0), Some(r), "seed {seed}: tick {} misread", r.tick);
                }
                let back: std::collections::BTreeSet<u64> = records.iter().map(|r| r.tick.0).collect();
                for t in appended.keys().filter(|t| synced_upto.is_some_and(|s| **t <= s)) {
                    assert!(back.contains(t), "seed {seed}: synced tick {t} lost");
                }
                lost += appended.len() as u64 - back.len() as u64;
                appended.retain(|t, _| back.contains(t));
                // The agreement's state: the last synced one or a newer one, never older.
                let state =
                    node.dir.read_consensus_state().unwrap().map(|b| u64::from_le_bytes(b[..8].try_into().unwrap()));
                assert!(
                    state.unwrap_or(0) >= synced_state && state.unwrap_or(0) <= written,
                    "seed {seed}: state {state:?}, synced {synced_state}, written {written}"
                );
                written = state.unwrap_or(0);
                synced_state = written;
                // The node goes on from its newest record (what it lost comes again from peers).
                next = records.last().map_or(0, |r| r.tick.0 + 1);
                synced_upto = synced_upto.min(records.last().map(|r| r.tick.0));
            }
            _ => {
                let r = rec(next, rng.next());
                node.log.append(&r).unwrap();
                appended.insert(next, r);
                next += 1;
                if rng.below(3) == 0 {
                    // A vote: the log synced, then the state written and synced.
                    node.log.sync().unwrap();
                    synced_upto = Some(next - 1);
                    written += 1;
                    node.journal.write(&written.to_le_bytes()).unwrap();
                    node.journal.sync().unwrap();
                    synced_state = written;
                } else if rng.below(2) == 0 {
                    written += 1;
                    node.journal.write(&written.to_le_bytes()).unwrap();
                }
            }
        }
    }
    (cuts, lost)
}

#[test]
fn power_losses_over_a_thousand_seeds_lose_no_synced_record_or_state_and_misread_nothing() {
    let (mut cuts, mut lost) = (0, 0);
    for seed in 0..1000 {
        let (c, l) = power_losses(seed);
        cuts += c;
        lost += l;
    }
    // The cuts did take unsynced records (the test would prove nothing otherwise).
    assert!(cuts > 2000 && lost > 0, "{cuts} power losses, {lost} unsynced records lost");
}

#[test]
fn a_flipped_bit_in_an_older_segment_is_reported_with_its_file_and_offset() {
    let disk = Arc::new(SimDisk::new());
    let d: Arc<dyn Disk> = disk.clone();
    let dir = Path::new("/node/log");
    let (mut log, _) = CommitLog::open_on(d.clone(), dir, Tick::ZERO).unwrap();
    for t in 0..SEGMENT_RECORDS + 20 {
        log.append(&rec(t, t)).unwrap();
    }
    log.sync().unwrap();
    drop(log);
    let seg = dir.join("000000000000.seg");
    let len = disk.len(&seg).unwrap();
    disk.flip_bit(&seg, len / 2, 3).unwrap();
    let (_, r) = CommitLog::open_on(d.clone(), dir, Tick::ZERO).unwrap();
    assert_eq!(r.damaged.len(), 1, "{:?}", r.damaged);
    assert!(r.damaged[0].contains("000000000000.seg") && r.damaged[0].contains("at offset"), "{}", r.damaged[0]);
    // What is read is what was written, up to the damage and from the next segment on.
    assert!(r.records.iter().all(|x| *x == rec(x.tick.0, x.tick.0)));
    assert!(r.records.iter().any(|x| x.tick.0 >= SEGMENT_RECORDS) && r.records.len() < (SEGMENT_RECORDS + 20) as usize);
    assert!(disk.exists(&dir.join("000000000000.seg.damaged")), "a copy kept for the operator");
}

#[test]
fn a_full_disk_is_a_clear_error_and_the_log_goes_on_once_there_is_room() {
    let disk = Arc::new(SimDisk::new());
    let d: Arc<dyn Disk> = disk.clone();
    let dir = Path::new("/node/log");
    let (mut log, _) = CommitLog::open_on(d.clone(), dir, Tick::ZERO).unwrap();
    for t in 0..50 {
        log.append(&rec(t, 4)).unwrap();
    }
    log.sync().unwrap();
    disk.set_capacity(Some(disk.used() + 100));
    let err = (50..60).find_map(|t| log.append(&rec(t, 4)).err()).expect("the disk fills");
    assert!(err.to_string().contains("no space left"), "{err}");
    // The node stops; restarted on the still-full disk, it cuts the torn record and opens.
    drop(log);
    let (_, r) = CommitLog::open_on(d.clone(), dir, Tick::ZERO).unwrap();
    assert!(r.records.len() >= 50 && r.damaged.is_empty());
    // Room again: it goes on where it was.
    disk.set_capacity(None);
    let (mut log, r) = CommitLog::open_on(d.clone(), dir, Tick::ZERO).unwrap();
    let next = r.records.last().unwrap().tick.0 + 1;
    for t in next..next + 10 {
        log.append(&rec(t, 4)).unwrap();
    }
    drop(log);
    let (_, r) = CommitLog::open_on(d, dir, Tick::ZERO).unwrap();
    assert_eq!(r.records.iter().map(|x| x.tick.0).collect::<Vec<_>>(), (0..next + 10).collect::<Vec<_>>());
}

#[test]
fn a_read_only_disk_is_an_error_naming_the_file_and_reading_still_works() {
    let disk = Arc::new(SimDisk::new());
    let d: Arc<dyn Disk> = disk.clone();
    let dir = DataDir::open_on(d.clone(), Path::new("/node")).unwrap();
    let (mut log, _) = CommitLog::open_on(d.clone(), &dir.log_dir(), Tick::ZERO).unwrap();
    let mut journal = StateJournal::open(&dir).unwrap();
    log.append(&rec(0, 1)).unwrap();
    journal.write(b"state").unwrap();
    disk.set_read_only(true);
    assert!(log.append(&rec(1, 1)).unwrap_err().to_string().contains("read-only"));
    let e = format!("{:#}", journal.write(b"newer").unwrap_err());
    assert!(e.contains("consensus.journal") && e.contains("read-only"), "{e}");
    assert!(format!("{:#}", dir.write_snapshot(Tick(1), b"snap").unwrap_err()).contains("read-only"));
    let (_, r) = CommitLog::open_on(d, &dir.log_dir(), Tick::ZERO).unwrap();
    assert_eq!(r.records, vec![rec(0, 1)]);
    assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"state"[..]));
}

#[test]
fn the_format_marker_and_snapshots_survive_a_power_loss_whole() {
    for seed in 0..200 {
        let disk = Arc::new(SimDisk::new());
        let d: Arc<dyn Disk> = disk.clone();
        let dir = DataDir::open_on(d.clone(), Path::new("/node")).unwrap();
        dir.write_snapshot(Tick(10), &[1; 300]).unwrap();
        dir.write_snapshot(Tick(20), &[2; 300]).unwrap();
        disk.power_loss(seed);
        let dir = DataDir::open_on(d.clone(), Path::new("/node")).expect("the marker is whole");
        let snaps = dir.snapshots().unwrap();
        assert_eq!(snaps.iter().map(|(t, _)| *t).collect::<Vec<_>>(), vec![Tick(10), Tick(20)], "seed {seed}");
        assert_eq!(d.read(&snaps[1].1).unwrap(), vec![2; 300]);
    }
}
