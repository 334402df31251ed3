//! Who leads a view: round robin over the validators the committed chain shows alive and not
//! failing (leader reputation, after DiemBFT's `LeaderReputation` and Shoal's: a crashed
//! validator costs a timeout per view it leads, so it stops leading once the chain shows it
//! failed, until it shows signs of life again).
//!
//! **Rules.**
//! - The committed chain tells, for each view, what happened in it: a view whose block is on
//!   the chain was led by its block's leader (a sign of life, at that view); a view between a
//!   block's parent's and its own was nullified (R1), a failure of its leader; and a block
//!   embeds its parent's notarization, whose signers are signs of life at the parent's view.
//!   Once block `b` (parent `p`) is committed, every view below `b` is known (`complete_below`).
//! - The leader of view `v` is taken from the views `[v - LAG - window, v - LAG)`: a validator is
//!   a candidate if it shows a sign of life there, unless it failed after its last sign of life
//!   and that is older than the last `quiet` views (a live validator's votes are in the chain's
//!   certificates; a view of an honest leader may fail for its parent's sake — a block stamped
//!   ahead of the honest clocks makes the next leader wait). Candidates lead in turn (`candidates[v mod |candidates|]`, by index).
//!   With no sign of life in the window (an instance's first views), every validator but those
//!   it starts demoted is a candidate ([`crate::Config::demoted`], handed on by the previous
//!   epoch); with fewer candidates than a quorum (not enough known), every validator is one.
//! - Every honest validator that has committed the chain through view `v - LAG` chooses alike.
//!   One that has not, or whose history starts too late (a restart whose commit log gave back
//!   less than a window and a lag), chooses by plain round robin over everyone but the demoted:
//!   a leader the others may not expect, which costs liveness in that view only (it does not
//!   vote for the proposal of the leader it does not expect), never safety, which does not
//!   depend on who leads. When such differences stall the sim, views go on without commits, and
//!   after `LAG` of them every validator's knowledge is incomplete alike: all choose by round
//!   robin, agree, and commit again. A restarted validator rebuilds its history from the blocks
//!   its commit log gives back (`Validator::recall`).
//! - A view's leader is fixed (remembered) once chosen with complete knowledge, so the leader of
//!   a nullified view is the one who was expected to lead it.
//!
//! Deviations: DiemBFT chooses among the active validators by a hash of the round and weighs
//! them by their proposals; here they take turns (each leads as often as the others). A leader
//! chooses which 2f+1 notarize votes it embeds, so a Byzantine leader can leave an honest
//! validator's out; the validator stays a candidate while any other leader of the window embeds
//! one of its votes. A validator that is always the slowest of the quorum to vote is not
//! embedded, and so does not lead: a slow leader does not set the pace.

use std::collections::{BTreeMap, VecDeque};

use crate::types::{Block, ValidatorIndex, View};

/// Views between the last one a choice looks at and the view chosen for: room for the commits
/// to arrive (a block's view is known once its child is committed, a few views later).
pub(super) const LAG: u64 = 8;

/// The window of views looked at, at least.
const MIN_WINDOW: u64 = 64;

/// Views a chosen leader is remembered for, behind the last known one.
const MEMO_VIEWS: u64 = 256;

#[derive(Debug)]
pub(super) struct Leaders {
    n: usize,
    quorum: usize,
    /// `false`: plain round robin.
    on: bool,
    window: u64,
    /// A validator that failed its view and shows no sign of life in this many views is
    /// demoted (one whose vote is in the chain's certificates since did not crash: its view
    /// may have failed for its parent's sake, a block stamped ahead of the clocks).
    quiet: u64,
    /// Every view below this has its outcome recorded...
    complete_below: View,
    /// ...from this one on (the first view recorded; a restarted validator's history starts
    /// where its commit log gave it back).
    known_from: Option<View>,
    /// Per validator, the views of its signs of life and of its failures, ascending.
    life: Vec<VecDeque<View>>,
    fail: Vec<VecDeque<View>>,
    /// The validators that start demoted (until the chain shows them alive).
    demoted: Vec<bool>,
    /// Leaders chosen with complete knowledge.
    chosen: BTreeMap<View, ValidatorIndex>,
}

impl Leaders {
    pub(super) fn new(n: usize, quorum: usize, on: bool, demoted: Vec<bool>) -> Leaders {
        Leaders {
            n,
            quorum,
            on,
            window: MIN_WINDOW.max(16 * n as u64),
            quiet: 8.max(2 * n as u64),
            complete_below: View(1),
            known_from: None,
            life: vec![VecDeque::new(); n],
            fail: vec![VecDeque::new(); n],
            demoted,
            chosen: BTreeMap::new(),
        }
    }

    /// The leader of `view`.
    pub(super) fn leader(&self, view: View) -> ValidatorIndex {
        if !self.on {
            return ValidatorIndex((view.0 % self.n as u64) as u16);
        }
        if let Some(l) = self.chosen.get(&view) {
            return *l;
        }
        let c = self.candidates(view);
        c[(view.0 % c.len() as u64) as usize]
    }

    /// Remember the leader of `view` if it is chosen with complete knowledge (call on entering
    /// a view, so the leader of a view later nullified is the one expected then).
    pub(super) fn fix(&mut self, view: View) {
        if self.on && self.complete(view) && !self.chosen.contains_key(&view) {
            let l = self.leader(view);
            self.chosen.insert(view, l);
        }
    }

    /// Whether this validator knows all a choice for `view` looks at, as every validator that
    /// followed the chain does: every view of the window, each failure in it attributed to the
    /// leader expected then (so a history that starts late must reach a window and a lag back).
    fn complete(&self, view: View) -> bool {
        let hi = view.0.saturating_sub(LAG);
        if hi <= 1 {
            return true; // nothing to look at, for anyone
        }
        let lo = hi.saturating_sub(self.window);
        self.complete_below.0 >= hi && self.known_from.is_some_and(|k| k.0 <= 1 || lo >= k.0 + LAG + self.window)
    }

    /// Every validator but those this instance started demoted (all, if too few are left).
    fn everyone(&self) -> Vec<ValidatorIndex> {
        let all = (0..self.n).map(|i| ValidatorIndex(i as u16));
        let c: Vec<ValidatorIndex> = all.clone().filter(|i| !self.demoted[usize::from(i.0)]).collect();
        if c.len() < self.quorum { all.collect() } else { c }
    }

    /// The candidates for `view`, ascending; never empty. Without complete knowledge, everyone
    /// (round robin): when the validators' knowledge differs (a restart, a long stall), they
    /// agree again once views go on without commits for a lag, everyone's knowledge then
    /// incomplete alike.
    pub(super) fn candidates(&self, view: View) -> Vec<ValidatorIndex> {
        if !self.complete(view) {
            return self.everyone();
        }
        let hi = View(view.0.saturating_sub(LAG));
        let lo = View(hi.0.saturating_sub(self.window));
        let last = |views: &VecDeque<View>| {
            let i = views.partition_point(|v| *v < hi);
            i.checked_sub(1).map(|i| views[i]).filter(|v| *v >= lo)
        };
        let quiet = View(hi.0.saturating_sub(self.quiet));
        let mut alive = Vec::with_capacity(self.n);
        let mut any_life = false;
        for i in 0..self.n {
            let Some(life) = last(&self.life[i]) else { continue };
            any_life = true;
            let failed = last(&self.fail[i]).is_some_and(|f| f > life);
            if !(failed && life < quiet) {
                alive.push(ValidatorIndex(i as u16));
            }
        }
        if !any_life {
            return self.everyone();
        }
        if alive.len() < self.quorum {
            alive = (0..self.n).map(|i| ValidatorIndex(i as u16)).collect();
        }
        alive
    }

    /// How `view`'s leader is chosen, for an operator: among which candidates, or by plain
    /// round robin while this validator's history is incomplete (from which view it starts).
    pub(super) fn describe(&self, view: View) -> String {
        if !self.on {
            return "round robin".into();
        }
        let c: Vec<u16> = self.candidates(view).iter().map(|i| i.0).collect();
        match (self.complete(view), self.known_from) {
            (true, _) => format!("by reputation among {c:?}"),
            (false, Some(k)) => format!("by round robin among {c:?} (its history starts at view {})", k.0),
            (false, None) => format!("by round robin among {c:?} (no history yet)"),
        }
    }

    /// The validators that would not lead now: what a next instance starts demoted with.
    pub(super) fn demoted_now(&self) -> Vec<ValidatorIndex> {
        let c = self.candidates(View(self.complete_below.0 + LAG));
        (0..self.n).map(|i| ValidatorIndex(i as u16)).filter(|i| !c.contains(i)).collect()
    }

    /// Block `view` (led by `leader`, on parent `parent`, whose notarization's signers are
    /// `signers`) is committed: record what it tells. Blocks come in chain order.
    /// [`Leaders::committed`] of a block of this instance (not its anchor).
    pub(super) fn committed_block(&mut self, block: &Block) {
        let signers = block.parent_certificate.iter().flat_map(|c| c.votes.iter().map(|v| v.signer));
        self.committed(block.view, block.leader, block.parent.view, signers);
    }

    pub(super) fn committed(
        &mut self,
        view: View,
        leader: ValidatorIndex,
        parent: View,
        signers: impl IntoIterator<Item = ValidatorIndex>,
    ) {
        if !self.on || view < self.complete_below {
            return;
        }
        match self.known_from {
            None => self.known_from = Some(View(parent.0.max(1))),
            // A hole in what was recorded (a block its commit log could not give back): start
            // over from here.
            Some(_) if parent > self.complete_below => {
                self.life.iter_mut().chain(self.fail.iter_mut()).for_each(VecDeque::clear);
                self.known_from = Some(parent);
            }
            Some(_) => {}
        }
        // The parent's signers (the first block of an instance embeds none of this instance).
        if parent > View(0) {
            for s in signers {
                Self::note(&mut self.life, s, parent);
            }
        }
        self.complete_below = self.complete_below.max(View(parent.0 + 1));
        // The nullified views between, each known once those before it are.
        for v in parent.0 + 1..view.0 {
            let v = View(v);
            let failed = self.chosen.get(&v).copied().unwrap_or_else(|| self.leader(v));
            Self::note(&mut self.fail, failed, v);
            self.complete_below = View(v.0 + 1);
        }
        Self::note(&mut self.life, leader, view);
        self.complete_below = view;
        self.prune();
    }

    fn note(lists: &mut [VecDeque<View>], who: ValidatorIndex, view: View) {
        if let Some(l) = lists.get_mut(usize::from(who.0))
            && l.back().is_none_or(|b| *b < view)
        {
            l.push_back(view);
        }
    }

    fn prune(&mut self) {
        let keep = View(self.complete_below.0.saturating_sub(LAG + self.window));
        for l in self.life.iter_mut().chain(self.fail.iter_mut()) {
            while l.front().is_some_and(|v| *v < keep) {
                l.pop_front();
            }
        }
        let memo = View(self.complete_below.0.saturating_sub(MEMO_VIEWS));
        while self.chosen.first_key_value().is_some_and(|(v, _)| *v < memo) {
            self.chosen.pop_first();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(i: u16) -> ValidatorIndex {
        ValidatorIndex(i)
    }

    /// A chain of four validators where every view up to `to` is led in turn and each block
    /// embeds the votes of all but `absent`.
    fn healthy(l: &mut Leaders, from: u64, to: u64, absent: Option<u16>) {
        for view in from..=to {
            let leader = l.leader(View(view));
            let signers: Vec<_> = (0..4).filter(|i| Some(*i) != absent).map(v).collect();
            l.committed(View(view), leader, View(view - 1), signers);
        }
    }

    #[test]
    fn a_validator_that_fails_and_falls_silent_stops_leading_and_returns_when_alive() {
        let mut l = Leaders::new(4, 3, true, vec![false; 4]);
        healthy(&mut l, 1, 40, None);
        assert_eq!(l.candidates(View(50)), vec![v(0), v(1), v(2), v(3)]);
        // Validator 2 crashes: its views are nullified and its votes are in no certificate.
        let mut view = 41;
        while view < 80 {
            let leader = l.leader(View(view));
            if leader == v(2) {
                view += 1; // nullified: the next block's parent is two views back
                let next = l.leader(View(view));
                l.committed(View(view), next, View(view - 2), [v(0), v(1), v(3)]);
            } else {
                l.committed(View(view), leader, View(view - 1), [v(0), v(1), v(3)]);
            }
            view += 1;
        }
        assert_eq!(l.candidates(View(view)), vec![v(0), v(1), v(3)]);
        let failed: usize = (41..view).filter(|w| l.chosen.get(&View(*w)) == Some(&v(2))).count();
        assert!(failed <= 6, "the dead validator was expected to lead {failed} views");
        // Back: its votes are in the certificates again, and it leads again.
        healthy(&mut l, view, view + 20, None);
        assert_eq!(l.candidates(View(view + 30)), vec![v(0), v(1), v(2), v(3)]);
        assert_eq!(l.demoted_now(), vec![]);
    }

    #[test]
    fn a_failed_view_of_a_validator_that_votes_does_not_demote_it() {
        let mut l = Leaders::new(4, 3, true, vec![false; 4]);
        healthy(&mut l, 1, 30, None);
        // View 31's leader had to wait for its parent's time: nullified, but it votes on.
        let failed = l.leader(View(31));
        l.committed(View(32), l.leader(View(32)), View(30), [v(0), v(1), v(2), v(3)]);
        healthy(&mut l, 33, 60, None);
        assert!(l.candidates(View(45)).contains(&failed));
        assert_eq!(l.candidates(View(70)).len(), 4);
    }

    /// A chain where validator 2 is dead from view 10 on: its views nullified, its votes absent.
    fn dead_two(l: &mut Leaders, chain: &mut Vec<(View, ValidatorIndex, View)>, to: u64) {
        let mut view = chain.last().map_or(1, |(v, _, _)| v.0 + 1);
        let mut parent = chain.last().map_or(View(0), |(v, _, _)| *v);
        while view <= to {
            let leader = l.leader(View(view));
            if view >= 10 && leader == v(2) {
                view += 1;
                continue;
            }
            let signers: Vec<_> = (0..4).filter(|i| view < 10 || *i != 2).map(v).collect();
            l.committed(View(view), leader, parent, signers);
            chain.push((View(view), leader, parent));
            parent = View(view);
            view += 1;
        }
    }

    #[test]
    fn a_history_that_starts_late_is_used_once_it_reaches_a_window_and_a_lag_back() {
        let mut full = Leaders::new(4, 3, true, vec![false; 4]);
        let mut chain = Vec::new();
        dead_two(&mut full, &mut chain, 300);
        assert_eq!(full.candidates(View(300)), vec![v(0), v(1), v(3)]);
        // A validator restarted with the chain from view 100 on (its commit log's), votes and
        // all as the others saw them.
        let mut late = Leaders::new(4, 3, true, vec![false; 4]);
        let from = chain.iter().position(|(w, _, _)| w.0 >= 100).unwrap();
        for (w, leader, parent) in &chain[from..] {
            let signers: Vec<_> = (0..4).filter(|i| *i != 2).map(v).collect();
            late.committed(*w, *leader, *parent, signers);
        }
        let parent = chain[from].2;
        // Too little history for a choice that looks back a window and a lag: round robin.
        let early = View(parent.0 + LAG + 1 + 64);
        assert_eq!(late.candidates(early), vec![v(0), v(1), v(2), v(3)]);
        // Far enough on, it chooses as the validator that saw it all.
        for w in (parent.0 + 2 * (LAG + 64) + 1)..300 {
            assert_eq!(late.candidates(View(w)), full.candidates(View(w)), "view {w}");
        }
    }

    #[test]
    fn views_without_commits_for_a_lag_bring_everyone_back_to_round_robin() {
        let mut l = Leaders::new(4, 3, true, vec![false; 4]);
        let mut chain = Vec::new();
        dead_two(&mut l, &mut chain, 200);
        let last = chain.last().unwrap().0;
        assert_eq!(l.candidates(View(last.0 + LAG)), vec![v(0), v(1), v(3)]);
        // No commit since: a view a lag past what is known is chosen by round robin, as every
        // validator would, whatever it knew.
        assert_eq!(l.candidates(View(last.0 + LAG + 1)), vec![v(0), v(1), v(2), v(3)]);
    }

    #[test]
    fn an_instance_starts_with_the_demoted_and_never_has_fewer_than_a_quorum() {
        let l = Leaders::new(4, 3, true, vec![false, false, true, false]);
        assert_eq!(l.candidates(View(1)), vec![v(0), v(1), v(3)]);
        assert!((1..40).all(|w| l.leader(View(w)) != v(2)));
        let l = Leaders::new(4, 3, true, vec![true, false, true, false]);
        assert_eq!(l.candidates(View(1)).len(), 4, "too few left: everyone leads");
        let off = Leaders::new(4, 3, false, vec![false, false, true, false]);
        assert_eq!((1..9).map(|w| off.leader(View(w)).0).collect::<Vec<_>>(), [1, 2, 3, 0, 1, 2, 3, 0]);
    }
}
