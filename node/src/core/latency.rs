//! The node's latency figures, measured where the core sees the events (so the simulated
//! cluster measures them too): a block's proposal, as this node first saw it (made or
//! received), to its commit here; and a client's event, taken in by this node, to its execution
//! here. Microseconds, over the recent ones (bounded).

use std::collections::{BTreeMap, VecDeque};

use metatopia_consensus::{Message, Micros, Signed};
use metatopia_sim::EventId;

/// Proposals (and latencies) remembered for the figures.
pub const PROPOSALS_REMEMBERED: usize = 512;
/// Clients' events whose submission time is remembered.
pub const SUBMISSIONS_REMEMBERED: usize = 8192;

#[derive(Debug, Default)]
pub struct Latencies {
    /// By (tick, view): views start again at each epoch, ticks do not.
    proposed_at: BTreeMap<(u64, u64), Micros>,
    commit_us: VecDeque<u64>,
    submitted_at: BTreeMap<EventId, Micros>,
    submitted_order: VecDeque<EventId>,
    input_us: VecDeque<u64>,
}

impl Latencies {
    /// A proposal of (tick, view) seen (made or received) at `now`: the first sight counts.
    pub fn proposal_seen(&mut self, block: (u64, u64), now: Micros) {
        self.proposed_at.entry(block).or_insert(now);
        while self.proposed_at.len() > PROPOSALS_REMEMBERED {
            self.proposed_at.pop_first();
        }
    }

    /// The block of (tick, view) committed at `now`.
    pub fn committed(&mut self, block: (u64, u64), now: Micros) {
        if let Some(seen) = self.proposed_at.remove(&block) {
            push(&mut self.commit_us, now.saturating_sub(seen));
        }
    }

    /// A client's event taken in at `now`.
    pub fn submitted(&mut self, id: EventId, now: Micros) {
        if self.submitted_at.insert(id, now).is_none() {
            self.submitted_order.push_back(id);
        }
        while self.submitted_order.len() > SUBMISSIONS_REMEMBERED {
            if let Some(old) = self.submitted_order.pop_front() {
                self.submitted_at.remove(&old);
            }
        }
    }

    /// An event executed at `now` (counted if it was taken in here).
    pub fn executed(&mut self, id: &EventId, now: Micros) {
        if let Some(at) = self.submitted_at.remove(id) {
            push(&mut self.input_us, now.saturating_sub(at));
        }
    }

    pub fn commit_us(&self) -> Option<(u64, u64)> {
        median_and_p99(&self.commit_us)
    }

    pub fn input_us(&self) -> Option<(u64, u64)> {
        median_and_p99(&self.input_us)
    }
}

fn push(v: &mut VecDeque<u64>, x: u64) {
    v.push_back(x);
    if v.len() > PROPOSALS_REMEMBERED {
        v.pop_front();
    }
}

fn median_and_p99(v: &VecDeque<u64>) -> Option<(u64, u64)> {
    let mut v: Vec<u64> = v.iter().copied().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let at = |q: usize| v[(v.len() - 1) * q / 100];
    Some((at(50), at(99)))
}

/// The tick and view of a proposal (any of its forms), if `msg` is one.
pub fn proposal_view(msg: &Message) -> Option<(u64, u64)> {
    match msg {
        Message::Propose { block, .. } | Message::ProposeIds { block, .. } | Message::ProposeRefs { block, .. } => {
            Some((block.tick.0, block.view.0))
        }
        Message::Authenticated { inner, .. } => match &**inner {
            Signed::Propose { block, .. } | Signed::ProposeIds { block, .. } | Signed::ProposeRefs { block, .. } => {
                Some((block.tick.0, block.view.0))
            }
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Views start again at each epoch: a view's proposal that never committed in one epoch
    /// does not become the start of the same view's block in the next (a 50 s "latency").
    #[test]
    fn a_view_number_seen_again_in_a_later_epoch_is_a_new_proposal() {
        let mut l = Latencies::default();
        l.proposal_seen((100, 5), 0);
        l.proposal_seen((1100, 5), 50_000_000);
        l.committed((1100, 5), 50_020_000);
        assert_eq!(l.commit_us(), Some((20_000, 20_000)));
        // A second sight of a committed block's proposal is not counted again.
        l.committed((1100, 5), 50_040_000);
        assert_eq!(l.commit_us(), Some((20_000, 20_000)));
    }
}
