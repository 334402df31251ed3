//! When a node says its sim has stalled, and how a node asked to stop after a tick stops: on
//! the core's clock, so the simulated cluster runs the same rules; the shell only prints what
//! the core says ([`CoreOutput::Stalled`](crate::core::CoreOutput::Stalled),
//! [`CoreOutput::Finishing`](crate::core::CoreOutput::Finishing)) and stops when told.
//!
//! - **Stall.** No commit for [`STALL_WARN_US`]: the core says where its agreement stands, and
//!   again each time as long again passes. A node finishing says nothing (it executes nothing
//!   more, and its peers may have stopped).
//! - **Finishing.** A node asked to stop after a tick (`--ticks`) stops only once every
//!   validator of its sim has executed that tick too (each reported that tick's root in its
//!   votes), or after [`FINISH_WAIT_US`], and then [`FINISH_LINGER_US`] later. Meanwhile it
//!   executes nothing more but still agrees, votes and answers fetches. Stopping at once
//!   stranded a slower node of a sim stopped whole: once a quorum of its peers had gone, the
//!   commits it still needed could no longer be certified, and it waited forever (a node
//!   replaying a long log while its peers ran their last few ticks).

use metatopia_consensus::Micros;
use metatopia_sim::Tick;

/// How long without a commit before a node says where its agreement stands (and again each
/// time as long again passes).
pub const STALL_WARN_US: Micros = 10_000_000;

/// Commits stopped: when to say so. The clock starts at the first look.
#[derive(Debug, Default)]
pub(crate) struct Stall {
    since: Option<Micros>,
    next: Micros,
}

impl Stall {
    pub(crate) fn committed(&mut self, now: Micros) {
        (self.since, self.next) = (Some(now), now.saturating_add(STALL_WARN_US));
    }

    /// How long commits have stopped, when it is time to say so again.
    pub(crate) fn due(&mut self, now: Micros) -> Option<Micros> {
        let Some(since) = self.since else {
            self.committed(now);
            return None;
        };
        (now >= self.next).then(|| {
            self.next = now.saturating_add(STALL_WARN_US);
            now - since
        })
    }

    /// When to look next (`None` before the first look).
    pub(crate) fn next(&self) -> Option<Micros> {
        self.since.map(|_| self.next)
    }
}

/// How long a node that has executed its requested ticks waits for the sim's other
/// validators to execute them too.
pub const FINISH_WAIT_US: Micros = 30_000_000;
/// How long it stays after that: more than two view timeouts, so that its own votes saying it
/// is done too reach its peers (its peers' reports can all be in before it votes once more, and
/// a node that stopped at once left its last peer waiting the whole [`FINISH_WAIT_US`]).
pub const FINISH_LINGER_US: Micros = 1_000_000;

/// What a finishing node says (and when to stop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    /// It executed `tick`, its last, and waits for its sim's other validators to execute it.
    Waiting { tick: Tick },
    /// It stops after `tick` although only `seen` of the sim's `of` validators were seen to
    /// execute it ([`FINISH_WAIT_US`] passed).
    Short { tick: Tick, seen: usize, of: usize },
    /// Stop now.
    Done,
}

/// A node asked to stop after a tick, once it executed it (see the module's rules).
#[derive(Debug)]
pub(crate) struct Finishing {
    tick: Tick,
    /// This node took a snapshot past `tick` (a certified one: a quorum executed it): it never
    /// reports that tick's root itself, and counts as having executed it.
    skipped: bool,
    deadline: Micros,
    said: bool,
    leaving: Option<Micros>,
    done: bool,
}

impl Finishing {
    pub(crate) fn new(tick: Tick, now: Micros) -> Finishing {
        Finishing {
            tick,
            skipped: false,
            deadline: now.saturating_add(FINISH_WAIT_US),
            said: false,
            leaving: None,
            done: false,
        }
    }

    /// Finishing after a snapshot brought this node past `tick` without executing it.
    pub(crate) fn skipped(tick: Tick, now: Micros) -> Finishing {
        Finishing { skipped: true, ..Finishing::new(tick, now) }
    }

    pub(crate) fn tick(&self) -> Tick {
        self.tick
    }

    /// Where it stands now, given how many of the sim's `of` validators were seen to execute
    /// the last tick (`reported`, its peers' roots): what to say, if anything.
    pub(crate) fn step(&mut self, now: Micros, reported: usize, of: usize) -> Option<Finish> {
        if self.done {
            return None;
        }
        if let Some(at) = self.leaving {
            self.done = now >= at;
            return self.done.then_some(Finish::Done);
        }
        let seen = (reported + usize::from(self.skipped)).min(of);
        if seen < of && now < self.deadline {
            return (!std::mem::replace(&mut self.said, true)).then_some(Finish::Waiting { tick: self.tick });
        }
        self.leaving = Some(now.saturating_add(FINISH_LINGER_US));
        (seen < of).then_some(Finish::Short { tick: self.tick, seen, of })
    }

    /// When to look again without news from peers.
    pub(crate) fn next(&self) -> Option<Micros> {
        if self.done {
            return None;
        }
        Some(self.leaving.unwrap_or(self.deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Micros = 1_764_000_000_000_000; // a real-looking clock, not time 0

    /// A node that executed the last tick waits for all four roots; one that a snapshot brought
    /// past it never reports that root itself, so it waits for the other three only (before,
    /// it waited the whole `FINISH_WAIT_US` and warned that a validator had not executed it).
    #[test]
    fn a_node_a_snapshot_brought_past_its_last_tick_waits_only_for_its_peers() {
        let mut executed = Finishing::new(Tick(99), T0);
        assert_eq!(executed.step(T0, 3, 4), Some(Finish::Waiting { tick: Tick(99) }));
        assert_eq!(executed.step(T0 + 1, 3, 4), None, "said once");
        assert!(executed.leaving.is_none(), "three of four roots seen: still waiting");
        assert_eq!(executed.step(T0 + 2, 4, 4), None);
        assert_eq!(executed.leaving, Some(T0 + 2 + FINISH_LINGER_US), "all four seen: leaving after the linger");
        assert_eq!(executed.step(T0 + 2 + FINISH_LINGER_US - 1, 4, 4), None);
        assert_eq!(executed.step(T0 + 2 + FINISH_LINGER_US, 4, 4), Some(Finish::Done));
        assert_eq!(executed.next(), None);
        let mut skipped = Finishing::skipped(Tick(99), T0);
        assert_eq!(skipped.step(T0, 3, 4), None);
        assert!(skipped.leaving.is_some(), "its peers' three roots are all it waits for");
        let mut early = Finishing::skipped(Tick(99), T0);
        assert_eq!(early.step(T0, 2, 4), Some(Finish::Waiting { tick: Tick(99) }));
        assert!(early.leaving.is_none(), "a peer has yet to execute the tick");
    }

    /// A peer that never executes the last tick holds a finishing node for the wait, no longer;
    /// the node says how many it saw.
    #[test]
    fn a_peer_that_never_executes_the_last_tick_holds_a_node_for_the_wait_only() {
        let mut f = Finishing::new(Tick(7), T0);
        assert_eq!(f.step(T0, 2, 4), Some(Finish::Waiting { tick: Tick(7) }));
        assert_eq!(f.next(), Some(T0 + FINISH_WAIT_US));
        assert_eq!(f.step(T0 + FINISH_WAIT_US - 1, 3, 4), None);
        assert_eq!(f.step(T0 + FINISH_WAIT_US, 3, 4), Some(Finish::Short { tick: Tick(7), seen: 3, of: 4 }));
        assert_eq!(f.next(), Some(T0 + FINISH_WAIT_US + FINISH_LINGER_US));
        assert_eq!(f.step(T0 + FINISH_WAIT_US + FINISH_LINGER_US, 3, 4), Some(Finish::Done));
    }

    /// The stall clock starts at the first look, says so after the warning time and again each
    /// time as long again passes, and starts over at a commit.
    #[test]
    fn a_stall_is_said_every_ten_seconds_without_a_commit_and_a_commit_resets_it() {
        let mut s = Stall::default();
        assert_eq!(s.next(), None);
        assert_eq!(s.due(T0), None, "the first look starts the clock");
        assert_eq!(s.due(T0 + STALL_WARN_US - 1), None);
        assert_eq!(s.due(T0 + STALL_WARN_US), Some(STALL_WARN_US));
        assert_eq!(s.due(T0 + STALL_WARN_US + 1), None, "not again at once");
        assert_eq!(s.due(T0 + 2 * STALL_WARN_US), Some(2 * STALL_WARN_US));
        s.committed(T0 + 2 * STALL_WARN_US + 5);
        assert_eq!(s.due(T0 + 3 * STALL_WARN_US), None);
        assert_eq!(s.next(), Some(T0 + 3 * STALL_WARN_US + 5));
    }
}
