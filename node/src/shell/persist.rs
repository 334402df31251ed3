//! What a node writes to its data directory as its core hands out outputs, in the order that
//! keeps the log, the snapshots and the agreement's journal consistent (`crate::store`'s
//! rules): a commit is logged before it executes; before messages leave, the commits of the
//! turn are synced, then the agreement's state is written, and synced when it holds votes (a
//! restarted node never votes differently, nor has voted for what it has not logged); the
//! core's snapshot every `snapshot_every` ticks (the log synced first) and the log pruned below
//! the oldest one kept; a certified snapshot installed is written as the state the log replays on.
//! And a desync report, when the node diverged ([`write_desync_report`]).
//!
//! The node's loop and the simulated cluster (`metatopia-lab`, on a simulated disk) both write
//! through it, so the cluster's crashes and power cuts test the node's own disk path.

use anyhow::Context;

use crate::core::CoreOutput;
use crate::net::wire::NodeMsg;
use crate::store::{CommitLog, DataDir, LogRecord, Recovery, StateJournal};
use metatopia_sim::Tick;

#[derive(Debug)]
pub struct Persister {
    dir: DataDir,
    log: CommitLog,
    journal: StateJournal,
    last_state: [u8; 32],
    /// Sync before sending (off only with `--unsafe-no-sync`, to measure what syncs cost).
    durable: bool,
    committed: bool,
}

/// What a restart finds in the data directory.
#[derive(Debug)]
pub struct Restored {
    /// The log from the oldest snapshot kept on (what a restart may replay).
    pub recovery: Recovery,
    /// The agreement's state as last written.
    pub consensus: Option<Vec<u8>>,
}

impl Persister {
    /// Open the log and the journal of `dir`: what they hold, for the restart.
    pub fn open(dir: DataDir, durable: bool) -> anyhow::Result<(Persister, Restored)> {
        let from = dir.oldest_snapshot()?.unwrap_or_default();
        let (log, recovery) = CommitLog::open_on(dir.disk().clone(), &dir.log_dir(), from)?;
        // Read before the journal opens (opening it cuts a torn tail).
        let consensus = dir.read_consensus_state()?;
        let journal = StateJournal::open(&dir)?;
        let p = Persister { dir, log, journal, last_state: [0; 32], durable, committed: false };
        Ok((p, Restored { recovery, consensus }))
    }

    pub fn dir(&self) -> &DataDir {
        &self.dir
    }

    /// The snapshots kept, newest first, with their bytes (a bad one is the caller's to skip).
    pub fn snapshots(&self) -> anyhow::Result<Vec<(Tick, anyhow::Result<Vec<u8>>)>> {
        let disk = self.dir.disk();
        Ok(self
            .dir
            .snapshots()?
            .into_iter()
            .rev()
            .map(|(tick, path)| (tick, disk.read(&path).with_context(|| format!("reading {}", path.display()))))
            .collect())
    }

    /// A commit: logged before it executes.
    pub fn committed(&mut self, rec: &LogRecord) -> anyhow::Result<()> {
        self.log.append(rec).context("appending to the commit log")?;
        self.committed = true;
        Ok(())
    }

    /// The core's snapshot of tick `tick` ([`CoreOutput::Snapshot`]): written after the log
    /// is synced (a snapshot never runs ahead of the log that continues it), then the log is
    /// pruned below the oldest snapshot kept.
    pub fn snapshot(&mut self, tick: Tick, bytes: &[u8]) -> anyhow::Result<()> {
        self.log.sync().context("syncing the commit log")?;
        self.dir.write_snapshot(tick, bytes)?;
        if let Some(oldest) = self.dir.oldest_snapshot()? {
            self.log.prune_below(oldest)?;
        }
        Ok(())
    }

    /// A certified snapshot installed: the state the log replays on after a restart.
    pub fn resynced(&mut self, tick: Tick, snapshot: &[u8]) -> anyhow::Result<()> {
        Ok(self.dir.write_snapshot(tick, snapshot)?)
    }

    /// Before the turn's messages leave: the commits synced, then the agreement's state
    /// (`state` makes its bytes) written if it changed, and synced if the messages hold votes.
    pub fn before_sending(&mut self, votes: bool, state: impl FnOnce() -> Vec<u8>) -> anyhow::Result<()> {
        let committed = std::mem::take(&mut self.committed);
        if !(votes || committed) {
            return Ok(());
        }
        let state = state();
        let digest = *blake3::hash(&state).as_bytes();
        if digest == self.last_state {
            return Ok(());
        }
        if committed && self.durable {
            self.log.sync().context("syncing the commit log")?;
        }
        self.journal.write(&state).context("writing the agreement's state")?;
        if votes && self.durable {
            self.journal.sync()?;
        }
        self.last_state = digest;
        Ok(())
    }

    /// Everything appended made durable (a clean stop).
    pub fn sync(&mut self) -> anyhow::Result<()> {
        self.log.sync().context("syncing the commit log")
    }

    /// Bytes the log takes on disk.
    pub fn log_bytes(&self) -> u64 {
        self.log.disk_bytes()
    }
}

/// Whether outputs about to be sent hold one of this node's votes (which must be durable first).
pub fn holds_votes<'a>(outputs: impl IntoIterator<Item = &'a CoreOutput>) -> bool {
    outputs.into_iter().any(|o| {
        matches!(o, CoreOutput::Broadcast(m) | CoreOutput::Send(_, m)
            if matches!(m, NodeMsg::Consensus { msg, .. } if msg.vote().is_some()))
    })
}

/// A desync report (`desync-report-<tick>/` under `root`): the node's snapshot, its root and
/// the peers', its per-subsystem roots, and the last inputs.
pub fn write_desync_report(
    root: &std::path::Path,
    r: &crate::core::DesyncReport,
) -> anyhow::Result<std::path::PathBuf> {
    let dir = root.join(format!("desync-report-{}", r.tick));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("snapshot.bin"), &r.snapshot)?;
    let mut roots = format!("tick {}\nmine {}\n", r.tick, r.mine);
    for (v, h) in &r.theirs {
        roots += &format!("validator {} {}\n", v.0, h);
    }
    if let Some(s) = &r.subsystems {
        roots += &format!(
            "objects {}\nscripts {}\nphysics {}\ngovernance {}\nqueue {}\n",
            s.objects, s.scripts, s.physics, s.governance, s.queue
        );
    }
    std::fs::write(dir.join("roots.txt"), roots)?;
    std::fs::write(dir.join("last-inputs.bin"), postcard::to_allocvec(&r.last_inputs)?)?;
    Ok(dir)
}
