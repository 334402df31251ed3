//! The agreement's journal (`consensus.journal`): its state, written before every vote leaves
//! (hundreds of times a second), in one of two slots of a file that never changes size.
//!
//! ```text
//! "MTJSLOT1"  slot size (u64 LE)                          16 bytes
//! slot 0: length (u32 LE), sequence (u64 LE), check (8 bytes), state, stale bytes to the slot's end
//! slot 1: the same
//! ```
//!
//! The check is blake3's over the sequence and the state. The state is the valid slot with the
//! higher sequence. A write goes to the slot that does not hold the newest *synced* state, so a
//! power cut in the middle of it (or of writes not synced yet) leaves that one whole; a write
//! overwrites the file in place, so its `fdatasync` flushes data only, never the file's size or
//! extents (an append's sync commits the file system's journal too: with four nodes on one disk
//! that made a vote's sync about half as long again, and its tail several times longer). A state
//! larger than a slot replaces the file (atomically) by one with slots twice its size; slots never
//! shrink, so the file is at most four times the largest state plus 16 bytes.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::disk::Disk;
use super::error::{Doing, Result, StoreError};
use super::log::MAX_RECORD;

/// The journal's name in the data directory.
pub(super) const JOURNAL: &str = "consensus.journal";
const MAGIC: &[u8; 8] = b"MTJSLOT1";
const FILE_HEADER: usize = 16;
const SLOT_HEADER: usize = 20;
/// The slots of a new journal.
pub const MIN_SLOT: u64 = 64 << 10;

/// The agreement's journal in a data directory (see the module's notes).
#[derive(Debug)]
pub struct StateJournal {
    disk: Arc<dyn Disk>,
    path: PathBuf,
    slot: u64,
    seq: u64,
    /// The slot holding the newest synced state (the next write goes to the other one).
    durable: u64,
    /// The slot written since the last sync, if any.
    pending: Option<u64>,
}

/// What a journal's bytes hold: its slot size and the newest valid state with its sequence.
#[derive(Debug, PartialEq, Eq)]
pub struct Slots {
    pub slot: u64,
    pub newest: Option<(u64, u64, Vec<u8>)>,
}

impl StateJournal {
    /// A journal at `path` that holds nothing yet (its slots not written).
    fn fresh(disk: Arc<dyn Disk>, path: PathBuf) -> StateJournal {
        StateJournal { disk, path, slot: MIN_SLOT, seq: 0, durable: 1, pending: None }
    }

    /// Open the journal of the data directory at `root` on `disk` (creating it). A data
    /// directory from before the journal: its `consensus.state` becomes the first state.
    pub(super) fn open_at(disk: Arc<dyn Disk>, root: &Path) -> Result<StateJournal> {
        let path = root.join(JOURNAL);
        let found = StateJournal::scan(&*disk, &path)?;
        let mut j = StateJournal::fresh(disk, path);
        match found {
            Some(Slots { slot, newest }) => {
                j.slot = slot;
                if let Some((index, seq, _)) = newest {
                    (j.seq, j.durable) = (seq, index);
                }
            }
            None => j.replace(&[], 0, MIN_SLOT)?,
        }
        let legacy = root.join("consensus.state");
        if j.seq == 0 && j.disk.exists(&legacy) {
            let bytes = j.disk.read(&legacy).doing(|| format!("reading {}", legacy.display()))?;
            j.write(&bytes)?;
            j.sync()?;
            j.disk.remove(&legacy).doing(|| format!("removing {}", legacy.display()))?;
        }
        Ok(j)
    }

    /// The journal at `path`: `None` when there is none (or it is empty).
    pub(super) fn scan(disk: &dyn Disk, path: &Path) -> Result<Option<Slots>> {
        let bytes = match disk.read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).doing(|| format!("reading {}", path.display())),
        };
        StateJournal::scan_bytes(&bytes).map_err(|why| StoreError::Format(format!("{}: {why}", path.display())))
    }

    /// What `bytes` hold (`None` if empty), or why they are not a journal. A slot whose check
    /// fails (torn, or damaged) is passed over.
    pub fn scan_bytes(bytes: &[u8]) -> std::result::Result<Option<Slots>, String> {
        if bytes.is_empty() {
            return Ok(None);
        }
        if bytes.len() < FILE_HEADER || &bytes[..8] != MAGIC {
            return Err("not an agreement journal of this data format (no slot header)".into());
        }
        let slot = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        if !(SLOT_HEADER as u64..=2 * (u64::from(MAX_RECORD) + SLOT_HEADER as u64)).contains(&slot) {
            return Err(format!("a slot size of {slot} bytes in its header is impossible"));
        }
        let mut newest: Option<(u64, u64, Vec<u8>)> = None;
        for index in 0..2u64 {
            let at = FILE_HEADER + (index * slot) as usize;
            let Some(head) = bytes.get(at..at + SLOT_HEADER) else { continue };
            let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
            let seq = u64::from_le_bytes(head[4..12].try_into().expect("8 bytes"));
            if seq == 0 || (SLOT_HEADER + len) as u64 > slot {
                continue;
            }
            let Some(body) = bytes.get(at + SLOT_HEADER..at + SLOT_HEADER + len) else { continue };
            if check(seq, body) != head[12..20] {
                continue;
            }
            if newest.as_ref().is_none_or(|(_, s, _)| seq > *s) {
                newest = Some((index, seq, body.to_vec()));
            }
        }
        Ok(Some(Slots { slot, newest }))
    }

    /// Write `bytes` as the newest state (durable at the next [`StateJournal::sync`]).
    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let len = u32::try_from(bytes.len())
            .ok()
            .filter(|l| *l <= MAX_RECORD)
            .ok_or(StoreError::TooBig { what: "the agreement's state", len: bytes.len() })?;
        let seq = self.seq + 1;
        if (SLOT_HEADER + bytes.len()) as u64 > self.slot {
            let slot = ((SLOT_HEADER + bytes.len()) as u64 * 2).next_multiple_of(4096);
            return self.replace(bytes, seq, slot);
        }
        let target = 1 - self.durable;
        let mut rec = Vec::with_capacity(SLOT_HEADER + bytes.len());
        rec.extend_from_slice(&len.to_le_bytes());
        rec.extend_from_slice(&seq.to_le_bytes());
        rec.extend_from_slice(&check(seq, bytes));
        rec.extend_from_slice(bytes);
        let at = FILE_HEADER as u64 + target * self.slot;
        self.disk.write_at(&self.path, at, &rec).doing(|| format!("writing {}", self.path.display()))?;
        (self.seq, self.pending) = (seq, Some(target));
        Ok(())
    }

    /// Make the state written durable (`fdatasync`): before the votes it holds are sent.
    pub fn sync(&mut self) -> Result<()> {
        if let Some(target) = self.pending {
            self.disk.sync(&self.path).doing(|| format!("syncing {}", self.path.display()))?;
            (self.durable, self.pending) = (target, None);
        }
        Ok(())
    }

    /// Replace the file (atomically, synced) by one of slots of `slot` bytes holding `bytes` as
    /// state `seq` in slot 0 (no state when `seq` is 0).
    fn replace(&mut self, bytes: &[u8], seq: u64, slot: u64) -> Result<()> {
        let mut file = vec![0u8; FILE_HEADER + 2 * slot as usize];
        file[..8].copy_from_slice(MAGIC);
        file[8..16].copy_from_slice(&slot.to_le_bytes());
        if seq > 0 {
            let s = &mut file[FILE_HEADER..];
            s[..4].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
            s[4..12].copy_from_slice(&seq.to_le_bytes());
            s[12..20].copy_from_slice(&check(seq, bytes));
            s[SLOT_HEADER..SLOT_HEADER + bytes.len()].copy_from_slice(bytes);
        }
        self.disk.write_atomic(&self.path, &file).doing(|| format!("writing {}", self.path.display()))?;
        (self.slot, self.seq, self.durable, self.pending) = (slot, seq, 0, None);
        Ok(())
    }
}

fn check(seq: u64, body: &[u8]) -> [u8; 8] {
    let mut h = blake3::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(body);
    h.finalize().as_bytes()[..8].try_into().expect("8 bytes")
}

/// The newest whole record of a journal of data format 6 (records appended: length, blake3
/// check, bytes), to carry it into the slots of format 7.
pub(super) fn format_6_newest(bytes: &[u8]) -> Option<Vec<u8>> {
    const HEADER: usize = 12;
    let (mut at, mut newest) = (0usize, None);
    while let Some(head) = bytes.get(at..at + HEADER) {
        let len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as usize;
        let Some(body) = bytes.get(at + HEADER..at + HEADER + len) else { break };
        if blake3::hash(body).as_bytes()[..8] != head[4..] {
            break;
        }
        newest = Some(body);
        at += HEADER + len;
    }
    newest.map(<[u8]>::to_vec)
}

/// Carry a format-6 journal at `path` into the slots of this format (synced, atomically); a
/// journal already in slots is left as it is.
pub(super) fn upgrade_format_6(disk: &Arc<dyn Disk>, path: &Path) -> Result<()> {
    let bytes = match disk.read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).doing(|| format!("reading {}", path.display())),
    };
    if bytes.starts_with(MAGIC) {
        return Ok(());
    }
    let newest = format_6_newest(&bytes);
    let mut j = StateJournal::fresh(disk.clone(), path.to_owned());
    let state = newest.as_deref().unwrap_or_default();
    let slot = ((SLOT_HEADER + state.len()) as u64 * 2).next_multiple_of(4096).max(MIN_SLOT);
    j.replace(state, u64::from(newest.is_some()), slot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{DataDir, SimDisk};

    fn state(i: u32) -> Vec<u8> {
        (0..1_000 + i).map(|b| (b ^ i) as u8).collect()
    }

    #[test]
    fn the_journal_keeps_the_newest_synced_state_through_power_cuts_torn_slots_and_growth() {
        for seed in 0..300u64 {
            let disk = Arc::new(SimDisk::new());
            let d: Arc<dyn Disk> = disk.clone();
            let dir = DataDir::open_on(d.clone(), Path::new("/node")).unwrap();
            assert_eq!(dir.read_consensus_state().unwrap(), None);
            let mut j = StateJournal::open(&dir).unwrap();
            let len = d.len(&dir.root.join(JOURNAL)).unwrap();
            let mut synced = None;
            for i in 0..(seed % 7 + 3) as u32 {
                j.write(&state(i)).unwrap();
                if (seed >> i) % 2 == 0 {
                    j.sync().unwrap();
                    synced = Some(i);
                }
            }
            // The file never changed size (every sync was of data alone).
            assert_eq!(d.len(&dir.root.join(JOURNAL)).unwrap(), len);
            let written = (seed % 7 + 2) as u32;
            disk.power_loss(seed);
            let got = dir.read_consensus_state().unwrap();
            // The newest synced state or a newer one written after it, whole, never an older one.
            let at_least = synced.map(state);
            match (&got, &at_least) {
                (Some(g), Some(s)) => {
                    let i = (0..=written).find(|i| state(*i) == *g).expect("a state written, whole");
                    assert!(state(i).len() >= s.len(), "seed {seed}: state {i} is older than the synced one");
                }
                (None, None) => {}
                (Some(g), None) => assert!((0..=written).any(|i| state(i) == *g), "seed {seed}"),
                (None, Some(_)) => panic!("seed {seed}: the synced state was lost"),
            }
            // It opens again and goes on.
            let mut j = StateJournal::open(&dir).unwrap();
            j.write(b"next").unwrap();
            j.sync().unwrap();
            assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"next"[..]));
        }
        // A state larger than a slot replaces the file with larger slots, durably.
        let disk = Arc::new(SimDisk::new());
        let d: Arc<dyn Disk> = disk.clone();
        let dir = DataDir::open_on(d.clone(), Path::new("/node")).unwrap();
        let mut j = StateJournal::open(&dir).unwrap();
        let big = vec![7u8; 300_000];
        j.write(&big).unwrap();
        disk.power_loss(1);
        assert_eq!(dir.read_consensus_state().unwrap(), Some(big.clone()));
        let mut j = StateJournal::open(&dir).unwrap();
        assert!(d.len(&dir.root.join(JOURNAL)).unwrap() <= 4 * 300_020 + 16 + 8192);
        j.write(b"small").unwrap();
        j.sync().unwrap();
        assert_eq!(dir.read_consensus_state().unwrap().as_deref(), Some(&b"small"[..]));
    }

    #[test]
    fn a_damaged_slot_is_passed_over_and_a_foreign_file_is_an_error() {
        let disk = Arc::new(SimDisk::new());
        let d: Arc<dyn Disk> = disk.clone();
        let dir = DataDir::open_on(d.clone(), Path::new("/node")).unwrap();
        let mut j = StateJournal::open(&dir).unwrap();
        for i in 0..4 {
            j.write(&state(i)).unwrap();
            j.sync().unwrap();
        }
        // State 3 is in slot 0 (a new journal's first state goes to slot 1): flip a bit of it.
        let path = dir.root.join(JOURNAL);
        disk.flip_bit(&path, FILE_HEADER as u64 + 100, 3).unwrap();
        assert_eq!(dir.read_consensus_state().unwrap(), Some(state(2)));
        d.write_atomic(&path, b"something else entirely").unwrap();
        let e = dir.read_consensus_state().unwrap_err().to_string();
        assert!(e.contains("consensus.journal") && e.contains("not an agreement journal"), "{e}");
        assert!(StateJournal::scan_bytes(&[]).unwrap().is_none());
    }

    #[test]
    fn a_format_6_journal_is_carried_into_slots() {
        let disk: Arc<dyn Disk> = Arc::new(SimDisk::new());
        let path = Path::new("/node/consensus.journal");
        disk.create_dir_all(Path::new("/node")).unwrap();
        let mut old = Vec::new();
        for body in [&b"first"[..], b"second"] {
            old.extend_from_slice(&(body.len() as u32).to_le_bytes());
            old.extend_from_slice(&blake3::hash(body).as_bytes()[..8]);
            old.extend_from_slice(body);
        }
        old.extend_from_slice(&[9, 0, 0]); // a torn tail
        disk.write_atomic(path, &old).unwrap();
        upgrade_format_6(&disk, path).unwrap();
        let s = StateJournal::scan(&*disk, path).unwrap().unwrap();
        assert_eq!(s.newest.map(|(_, _, b)| b).as_deref(), Some(&b"second"[..]));
        // Twice is the same as once.
        upgrade_format_6(&disk, path).unwrap();
        let s = StateJournal::scan(&*disk, path).unwrap().unwrap();
        assert_eq!(s.newest.map(|(_, seq, b)| (seq, b)), Some((1, b"second".to_vec())));
    }
}
