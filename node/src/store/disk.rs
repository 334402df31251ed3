//! The file system the store writes through: the machine's ([`OsDisk`]), or a simulated one
//! ([`SimDisk`]) with the faults real disks have, so the commit log, the journal and snapshots are
//! tested through power cuts, torn writes, flipped bits, a full disk and a read-only one.
//!
//! The operations are the few the store uses, by path: append, sync a file, sync a directory
//! (its entries: files created, renamed or removed in it), rename, remove, truncate, read. The
//! simulated disk keeps, like a kernel's page cache over a disk, what the process sees apart
//! from what is on stable storage: a file's bytes are durable once the file is synced, a name
//! once its directory is. A process killed (`kill -9`) loses nothing; a power cut loses what
//! was not synced, except that an append in flight may leave a prefix of itself behind (a torn
//! write). Anchors: FoundationDB's simulated disk and TigerBeetle's storage fault injection.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What the store needs of a file system.
pub trait Disk: Send + Sync + std::fmt::Debug {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// The entries of `dir` (full paths), in no particular order.
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>>;
    fn exists(&self, path: &Path) -> bool;
    fn len(&self, path: &Path) -> io::Result<u64>;
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// The first `n` bytes (fewer if the file is shorter).
    fn read_prefix(&self, path: &Path, n: u64) -> io::Result<Vec<u8>>;
    /// Append `bytes` (creating the file): one write.
    fn append(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    /// Write `bytes` at `offset` of the existing file `path`, in place.
    fn write_at(&self, path: &Path, offset: u64, bytes: &[u8]) -> io::Result<()>;
    /// Create `path` empty (or empty it).
    fn create(&self, path: &Path) -> io::Result<()>;
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()>;
    /// Make the file's bytes durable (`fdatasync`).
    fn sync(&self, path: &Path) -> io::Result<()>;
    /// Make the directory's entries durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    fn copy(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Replace `path` with `bytes` through a temporary file, synced, renamed over it, and the
    /// directory synced: after a crash or a power cut `path` holds the old bytes or the new ones.
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let tmp = path.with_extension("tmp");
        self.create(&tmp)?;
        self.append(&tmp, bytes)?;
        self.sync(&tmp)?;
        self.rename(&tmp, path)?;
        self.sync_dir(parent(path))
    }
}

fn parent(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Files kept open for appending, at most this many (the log's segment and the journal).
const OPEN_FILES: usize = 16;

/// The machine's file system. Files appended to or written in place stay open (so a write is
/// one `write` or `pwrite`).
#[derive(Debug, Default)]
pub struct OsDisk {
    open: Mutex<BTreeMap<PathBuf, File>>,
    /// Files written in place (opened without `O_APPEND`, which would append every write).
    placed: Mutex<BTreeMap<PathBuf, File>>,
}

impl OsDisk {
    fn with_file<T>(&self, path: &Path, f: impl FnOnce(&mut File) -> io::Result<T>) -> io::Result<T> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if !open.contains_key(path) {
            if open.len() >= OPEN_FILES {
                open.clear();
            }
            let file = OpenOptions::new().append(true).create(true).open(path)?;
            open.insert(path.to_owned(), file);
        }
        f(open.get_mut(path).expect("opened above"))
    }

    fn forget(&self, path: &Path) {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).remove(path);
        self.placed.lock().unwrap_or_else(|e| e.into_inner()).remove(path);
    }
}

impl Disk for OsDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        fs::read_dir(dir)?.map(|e| e.map(|e| e.path())).collect()
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(fs::metadata(path)?.len())
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }
    fn read_prefix(&self, path: &Path, n: u64) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        io::Read::read_to_end(&mut io::Read::take(File::open(path)?, n), &mut out)?;
        Ok(out)
    }
    fn append(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.with_file(path, |f| f.write_all(bytes))
    }
    fn write_at(&self, path: &Path, offset: u64, bytes: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut placed = self.placed.lock().unwrap_or_else(|e| e.into_inner());
        if !placed.contains_key(path) {
            if placed.len() >= OPEN_FILES {
                placed.clear();
            }
            placed.insert(path.to_owned(), OpenOptions::new().write(true).open(path)?);
        }
        placed.get(path).expect("opened above").write_all_at(bytes, offset)
    }
    fn create(&self, path: &Path) -> io::Result<()> {
        self.forget(path);
        File::create(path).map(drop)
    }
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        self.forget(path);
        OpenOptions::new().write(true).open(path)?.set_len(len)
    }
    fn sync(&self, path: &Path) -> io::Result<()> {
        self.with_file(path, |f| f.sync_data())
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.forget(from);
        self.forget(to);
        fs::rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.forget(path);
        fs::remove_file(path)
    }
    fn copy(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.forget(to);
        fs::copy(from, to).map(drop)
    }
}

/// A file's bytes as the process sees them, and as they are on stable storage: the first
/// `durable_len` bytes of `data` while the file was only appended to since its last sync (a sync
/// copies nothing), or `rewritten` once it was cut below that.
#[derive(Debug, Clone, Default)]
struct Inode {
    data: Vec<u8>,
    durable_len: usize,
    rewritten: Option<Vec<u8>>,
    /// Written in place since the last sync: a power cut may keep the new bytes up to any point
    /// and the old ones after it (a torn overwrite).
    overwritten: bool,
}

#[derive(Debug, Default)]
struct SimState {
    inodes: BTreeMap<u64, Inode>,
    /// Names as the process sees them, and as they are on stable storage.
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    next: u64,
    capacity: Option<u64>,
    read_only: bool,
    syncs: u64,
}

/// An in-memory disk with fault injection (see the module's notes). Deterministic: what a power
/// cut keeps is chosen by the seed it is given.
#[derive(Debug, Default)]
pub struct SimDisk {
    state: Mutex<SimState>,
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}: no such file", path.display()))
}

/// splitmix64: the simulated disk's only randomness, from a seed.
fn mix(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A power cut: names not synced into their directory and bytes not synced are lost, but an
    /// append that was in flight may leave a prefix of itself (a torn write), chosen by `seed`.
    pub fn power_loss(&self, seed: u64) {
        let mut seed = seed;
        let mut s = self.lock();
        s.names = s.durable_names.clone();
        let live: BTreeSet<u64> = s.names.values().copied().collect();
        s.inodes.retain(|id, _| live.contains(id));
        for inode in s.inodes.values_mut() {
            match inode.rewritten.take() {
                Some(old) if std::mem::take(&mut inode.overwritten) => {
                    inode.data = match mix(&mut seed) % 3 {
                        0 => old,
                        1 => std::mem::take(&mut inode.data),
                        _ => {
                            let k = (mix(&mut seed) % (inode.data.len() as u64 + 1)) as usize;
                            let mut torn = inode.data[..k].to_vec();
                            torn.extend_from_slice(old.get(k..).unwrap_or_default());
                            torn
                        }
                    };
                }
                Some(old) => inode.data = old,
                None => {
                    // Appended since the last sync: some of it may have reached the platter.
                    let extra = (inode.data.len() - inode.durable_len) as u64;
                    let keep = match mix(&mut seed) % 3 {
                        0 => 0,
                        1 => extra,
                        _ => mix(&mut seed) % (extra + 1),
                    };
                    inode.data.truncate(inode.durable_len + keep as usize);
                }
            }
            inode.overwritten = false;
            inode.durable_len = inode.data.len();
        }
    }

    /// Flip one bit of a file (its stable copy too: the damage is on the disk).
    pub fn flip_bit(&self, path: &Path, offset: u64, bit: u8) -> io::Result<()> {
        let mut s = self.lock();
        let id = *s.names.get(path).ok_or_else(|| not_found(path))?;
        let inode = s.inodes.get_mut(&id).expect("named inodes exist");
        let at = offset as usize;
        if at >= inode.data.len() {
            return Err(io::Error::other(format!("offset {offset} is past the end of {}", path.display())));
        }
        inode.data[at] ^= 1 << (bit % 8);
        if let Some(old) = inode.rewritten.as_mut().filter(|o| at < o.len()) {
            old[at] ^= 1 << (bit % 8);
        }
        Ok(())
    }

    /// A disk of `bytes` (all files together), or unbounded.
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.lock().capacity = bytes;
    }

    pub fn set_read_only(&self, read_only: bool) {
        self.lock().read_only = read_only;
    }

    /// Syncs so far (files and directories).
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// Bytes all files take.
    pub fn used(&self) -> u64 {
        self.lock().inodes.values().map(|i| i.data.len() as u64).sum()
    }
}

impl SimState {
    fn writable(&self) -> io::Result<()> {
        if self.read_only {
            return Err(io::Error::new(io::ErrorKind::ReadOnlyFilesystem, "read-only file system"));
        }
        Ok(())
    }

    fn dir_exists(&self, dir: &Path) -> bool {
        dir == Path::new(".") || dir == Path::new("/") || self.dirs.contains(dir)
    }

    fn inode(&self, path: &Path) -> io::Result<&Inode> {
        self.names.get(path).and_then(|id| self.inodes.get(id)).ok_or_else(|| not_found(path))
    }

    fn make(&mut self, path: &Path) -> io::Result<u64> {
        if !self.dir_exists(parent(path)) {
            return Err(not_found(parent(path)));
        }
        self.next += 1;
        let id = self.next;
        self.inodes.insert(id, Inode::default());
        self.names.insert(path.to_owned(), id);
        Ok(id)
    }
}

impl Disk for SimDisk {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        // Directories are durable at once (the store creates them before anything in them).
        for d in dir.ancestors().filter(|d| !d.as_os_str().is_empty()) {
            s.dirs.insert(d.to_owned());
        }
        Ok(())
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        let s = self.lock();
        if !s.dir_exists(dir) {
            return Err(not_found(dir));
        }
        Ok(s.names.keys().filter(|p| parent(p) == dir).cloned().collect())
    }
    fn exists(&self, path: &Path) -> bool {
        let s = self.lock();
        s.names.contains_key(path) || s.dirs.contains(path)
    }
    fn len(&self, path: &Path) -> io::Result<u64> {
        Ok(self.lock().inode(path)?.data.len() as u64)
    }
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        Ok(self.lock().inode(path)?.data.clone())
    }
    fn read_prefix(&self, path: &Path, n: u64) -> io::Result<Vec<u8>> {
        let s = self.lock();
        let data = &s.inode(path)?.data;
        Ok(data[..data.len().min(n as usize)].to_vec())
    }
    fn append(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.lock();
        s.writable()?;
        let id = match s.names.get(path) {
            Some(id) => *id,
            None => s.make(path)?,
        };
        let used: u64 = s.inodes.values().map(|i| i.data.len() as u64).sum();
        let room = s.capacity.map_or(u64::MAX, |c| c.saturating_sub(used));
        let n = (bytes.len() as u64).min(room) as usize;
        // A full disk takes what fits, then fails (as `write_all` over ENOSPC does).
        s.inodes.get_mut(&id).expect("named inodes exist").data.extend_from_slice(&bytes[..n]);
        if n < bytes.len() {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "no space left on device"));
        }
        Ok(())
    }
    fn write_at(&self, path: &Path, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.lock();
        s.writable()?;
        let id = *s.names.get(path).ok_or_else(|| not_found(path))?;
        let used: u64 = s.inodes.values().map(|i| i.data.len() as u64).sum();
        let inode = s.inodes.get(&id).expect("named inodes exist");
        let end = offset as usize + bytes.len();
        let grows = end.saturating_sub(inode.data.len()) as u64;
        if s.capacity.is_some_and(|c| used + grows > c) {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "no space left on device"));
        }
        let inode = s.inodes.get_mut(&id).expect("named inodes exist");
        if (offset as usize) < inode.durable_len && inode.rewritten.is_none() {
            inode.rewritten = Some(inode.data[..inode.durable_len].to_vec());
        }
        inode.overwritten = true;
        if inode.data.len() < end {
            inode.data.resize(end, 0);
        }
        inode.data[offset as usize..end].copy_from_slice(bytes);
        Ok(())
    }
    fn create(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.writable()?;
        s.make(path).map(drop)
    }
    fn truncate(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut s = self.lock();
        s.writable()?;
        let id = *s.names.get(path).ok_or_else(|| not_found(path))?;
        let inode = s.inodes.get_mut(&id).expect("named inodes exist");
        let len = len as usize;
        if len < inode.durable_len && inode.rewritten.is_none() {
            inode.rewritten = Some(inode.data[..inode.durable_len].to_vec());
        }
        inode.data.truncate(len);
        Ok(())
    }
    fn sync(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        let id = *s.names.get(path).ok_or_else(|| not_found(path))?;
        let inode = s.inodes.get_mut(&id).expect("named inodes exist");
        inode.rewritten = None;
        inode.overwritten = false;
        inode.durable_len = inode.data.len();
        s.syncs += 1;
        Ok(())
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut s = self.lock();
        if !s.dir_exists(dir) {
            return Err(not_found(dir));
        }
        let visible: Vec<(PathBuf, u64)> =
            s.names.iter().filter(|(p, _)| parent(p) == dir).map(|(p, i)| (p.clone(), *i)).collect();
        s.durable_names.retain(|p, _| parent(p) != dir);
        s.durable_names.extend(visible);
        s.syncs += 1;
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.writable()?;
        let id = s.names.remove(from).ok_or_else(|| not_found(from))?;
        s.names.insert(to.to_owned(), id);
        Ok(())
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.writable()?;
        s.names.remove(path).map(drop).ok_or_else(|| not_found(path))
    }
    fn copy(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.lock();
        s.writable()?;
        let data = s.inode(from)?.data.clone();
        let id = s.make(to)?;
        s.inodes.get_mut(&id).expect("made above").data = data;
        Ok(())
    }
}
