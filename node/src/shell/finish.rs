//! When a node says its sim has stalled, and how a node asked to stop after a tick stops.

use std::time::Duration;

/// How long without a commit before a node says where its agreement stands (and again each
/// time as long again passes).
const STALL_WARN: Duration = Duration::from_secs(10);

/// Commits stopped: when to say so.
#[derive(Debug)]
pub struct Stall {
    since: std::time::Instant,
    next: std::time::Instant,
}

impl Default for Stall {
    fn default() -> Stall {
        Stall::new()
    }
}

impl Stall {
    pub fn new() -> Stall {
        let now = std::time::Instant::now();
        Stall { since: now, next: now + STALL_WARN }
    }

    pub fn committed(&mut self) {
        *self = Stall::new();
    }

    /// How long commits have stopped, when it is time to warn again.
    pub fn due(&mut self) -> Option<Duration> {
        let now = std::time::Instant::now();
        (now >= self.next).then(|| {
            self.next = now + STALL_WARN;
            now - self.since
        })
    }
}

/// How long a node that has executed its requested ticks waits for the sim's other
/// validators to execute them too.
const FINISH_WAIT: Duration = Duration::from_secs(30);
/// How long it stays after that: more than two view timeouts, so that its own votes saying it
/// is done too reach its peers (its peers' reports can all be in before it votes once more, and
/// a node that stopped at once left its last peer waiting the whole `FINISH_WAIT`).
const FINISH_LINGER: Duration = Duration::from_millis(1_000);

/// A node asked to stop after a tick (`--ticks`) stops only once every validator of its sim has
/// executed that tick too (each reported that tick's root in its votes), or after
/// [`FINISH_WAIT`], and then [`FINISH_LINGER`] later. Meanwhile it executes nothing more but
/// still agrees, votes and answers fetches. Stopping at once stranded a slower node of a sim
/// stopped whole: once a quorum of its peers had gone, the commits it still needed could no
/// longer be certified, and it waited forever (a node replaying a long log while its peers ran
/// their last few ticks).
#[derive(Debug)]
pub struct Finishing {
    tick: u64,
    /// This node took a snapshot past `tick` (a certified one: a quorum executed it): it never
    /// reports that tick's root itself, and counts as having executed it.
    skipped: bool,
    deadline: std::time::Instant,
    said: bool,
    leaving: Option<std::time::Instant>,
}

impl Finishing {
    pub fn new(tick: u64) -> Finishing {
        Finishing {
            tick,
            skipped: false,
            deadline: std::time::Instant::now() + FINISH_WAIT,
            said: false,
            leaving: None,
        }
    }

    /// Finishing after a snapshot brought this node past `tick` without executing it.
    pub fn skipped(tick: u64) -> Finishing {
        Finishing { skipped: true, ..Finishing::new(tick) }
    }

    /// Whether to stop now.
    pub fn done(&mut self, agreement: &impl crate::core::Agreement, tag: &str) -> bool {
        let now = std::time::Instant::now();
        if let Some(at) = self.leaving {
            return now >= at;
        }
        let of = agreement.validators();
        let seen =
            (agreement.peer_roots(metatopia_consensus::Tick(self.tick)).len() + usize::from(self.skipped)).min(of);
        if seen < of && now < self.deadline {
            if !self.said {
                self.said = true;
                println!("{tag}executed tick {}: waiting for the sim's other validators to execute it too", self.tick);
            }
            return false;
        }
        if seen < of {
            eprintln!(
                "{tag}warning: stopping after tick {} although only {seen} of the sim's {of} validators were seen to execute it (waited {} s)",
                self.tick,
                FINISH_WAIT.as_secs()
            );
        }
        self.leaving = Some(now + FINISH_LINGER);
        false
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An agreement of four validators of which `reported` reported a root for every tick.
    struct Reported(Vec<u16>);

    impl crate::core::Agreement for Reported {
        fn handle_message(&mut self, _: u64, _: metatopia_consensus::ValidatorIndex, _: metatopia_consensus::Message) {}
        fn handle_timeout(&mut self, _: u64) {}
        fn submit_events(&mut self, _: u64, _: Vec<Vec<u8>>) {}
        fn poll_output(&mut self) -> Option<metatopia_consensus::Output> {
            None
        }
        fn poll_timeout(&self) -> Option<u64> {
            None
        }
        fn report_root(&mut self, _: metatopia_consensus::Tick, _: metatopia_consensus::Digest) {}
        fn validators(&self) -> usize {
            4
        }
        fn peer_roots(
            &self,
            _tick: metatopia_consensus::Tick,
        ) -> Vec<(metatopia_consensus::ValidatorIndex, metatopia_consensus::Digest)> {
            self.0
                .iter()
                .map(|v| (metatopia_consensus::ValidatorIndex(*v), metatopia_consensus::Digest([0; 32])))
                .collect()
        }
    }

    /// A node that executed the last tick waits for all four roots; one that a snapshot brought
    /// past it never reports that root itself, so it waits for the other three only (before,
    /// it waited the whole `FINISH_WAIT` and warned that a validator had not executed it).
    #[test]
    fn a_node_a_snapshot_brought_past_its_last_tick_waits_only_for_its_peers() {
        let three = Reported(vec![0, 1, 2]);
        let mut executed = Finishing::new(99);
        assert!(!executed.done(&three, ""));
        assert!(executed.leaving.is_none(), "three of four roots seen: still waiting");
        assert!(!executed.done(&Reported(vec![0, 1, 2, 3]), ""));
        assert!(executed.leaving.is_some(), "all four seen: leaving after the linger");
        let mut skipped = Finishing::skipped(99);
        assert!(!skipped.done(&three, ""));
        assert!(skipped.leaving.is_some(), "its peers' three roots are all it waits for");
        let mut early = Finishing::skipped(99);
        assert!(!early.done(&Reported(vec![0, 1]), ""));
        assert!(early.leaving.is_none(), "a peer has yet to execute the tick");
    }
}
