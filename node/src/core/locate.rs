//! Where is an avatar that is not in this sim? A client's route asks its node, which asks nodes
//! of the other sims it knows (`Locate`) and answers with the first sim that says "here"
//! (`Located`), or with "nowhere" once every node asked said no or a second went by.
//!
//! Sans-IO: the shell sends the questions [`Locator::ask`] names, hands it the answers
//! ([`Locator::located`]) and the time ([`Locator::expire`]), and delivers what comes back to
//! whoever asked (`R`, a reply handle: a channel in the node, a number in tests).
//!
//! Rules:
//! 1. Only an answer from a node that was asked counts, and for the sim it belongs to (the
//!    shell names the sender's sim from the overlay, never from the message).
//! 2. The first "here" answers the question; the answers still on their way are dropped.
//! 3. A question whose every node said no, or that is [`LOCATE_US`] old, is answered "nowhere".
//! 4. At most [`MAX_ASKING`] questions wait at once: more are answered "nowhere" at once, and so
//!    is a question with no node to ask.

use std::collections::{BTreeSet, VecDeque};

use metatopia_consensus::Micros;
use metatopia_sim::{AccountId, SimId};

/// Sims asked at most where an avatar is.
pub const MAX_LOCATE_SIMS: usize = 64;
/// Questions waiting at most (rule 4).
pub const MAX_ASKING: usize = 1_024;
/// How long a question waits for a "here" (rule 3).
pub const LOCATE_US: Micros = 1_000_000;

/// One question: whose avatar, the nodes (with their sim) that have not answered yet, until when.
#[derive(Debug)]
struct Ask<R> {
    account: AccountId,
    reply: R,
    waiting: BTreeSet<(SimId, u16)>,
    deadline: Micros,
}

/// The questions this node asked other sims' nodes, oldest first.
#[derive(Debug)]
pub struct Locator<R> {
    asking: VecDeque<Ask<R>>,
}

impl<R> Default for Locator<R> {
    fn default() -> Self {
        Locator { asking: VecDeque::new() }
    }
}

/// An answer for whoever asked: the sim that holds the avatar, or `None` (nowhere).
pub type Answer<R> = (R, Option<SimId>);

impl<R> Locator<R> {
    /// Ask `nodes` (a node of each other sim, or two) where `account`'s avatar is: the nodes to
    /// send `Locate` to. With no node to ask, or too many questions waiting, the answer
    /// ("nowhere") comes back at once as the error.
    pub fn ask(
        &mut self,
        now: Micros,
        account: AccountId,
        nodes: BTreeSet<(SimId, u16)>,
        reply: R,
    ) -> Result<Vec<u16>, Answer<R>> {
        if nodes.is_empty() || self.asking.len() >= MAX_ASKING {
            return Err((reply, None));
        }
        let send = nodes.iter().map(|(_, n)| *n).collect();
        self.asking.push_back(Ask { account, reply, waiting: nodes, deadline: now.saturating_add(LOCATE_US) });
        Ok(send)
    }

    /// Node `node` of sim `sim` answered for `account`: the questions this settles.
    pub fn located(&mut self, sim: SimId, node: u16, account: AccountId, here: bool) -> Vec<Answer<R>> {
        let mut settled = Vec::new();
        let mut i = 0;
        while i < self.asking.len() {
            let a = &mut self.asking[i];
            let counts = a.account == account && a.waiting.remove(&(sim, node));
            if counts && (here || a.waiting.is_empty()) {
                if let Some(a) = self.asking.remove(i) {
                    settled.push((a.reply, here.then_some(sim)));
                }
            } else {
                i += 1;
            }
        }
        settled
    }

    /// The questions that waited [`LOCATE_US`] without a "here": answered "nowhere".
    pub fn expire(&mut self, now: Micros) -> Vec<Answer<R>> {
        let mut expired = Vec::new();
        while self.asking.front().is_some_and(|a| a.deadline <= now) {
            if let Some(a) = self.asking.pop_front() {
                expired.push((a.reply, None));
            }
        }
        expired
    }

    /// Questions waiting.
    pub fn len(&self) -> usize {
        self.asking.len()
    }

    pub fn is_empty(&self) -> bool {
        self.asking.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADA: AccountId = AccountId([1; 32]);
    const BOB: AccountId = AccountId([2; 32]);

    fn nodes(of: &[(u32, u16)]) -> BTreeSet<(SimId, u16)> {
        of.iter().map(|(s, n)| (SimId(*s), *n)).collect()
    }

    #[test]
    fn the_first_here_answers_and_the_answers_after_it_are_dropped() {
        let mut l = Locator::default();
        let send = l.ask(0, ADA, nodes(&[(2, 10), (2, 11), (3, 20)]), "q").unwrap();
        assert_eq!(send, vec![10, 11, 20]);
        assert!(l.located(SimId(2), 10, ADA, false).is_empty(), "one no of three");
        assert_eq!(l.located(SimId(3), 20, ADA, true), vec![("q", Some(SimId(3)))]);
        assert!(l.located(SimId(2), 11, ADA, true).is_empty(), "already answered");
        assert!(l.is_empty());
    }

    #[test]
    fn every_no_answers_nowhere_before_the_second_is_up() {
        let mut l = Locator::default();
        l.ask(0, ADA, nodes(&[(2, 10), (3, 20)]), 1).unwrap();
        assert!(l.located(SimId(2), 10, ADA, false).is_empty());
        assert_eq!(l.located(SimId(3), 20, ADA, false), vec![(1, None)]);
        assert!(l.expire(LOCATE_US).is_empty(), "nothing left to expire");
    }

    #[test]
    fn only_an_asked_node_of_its_own_sim_about_the_same_account_counts() {
        let mut l = Locator::default();
        l.ask(0, ADA, nodes(&[(2, 10)]), 1).unwrap();
        // A node not asked, the asked node claimed for another sim, an answer about someone else.
        assert!(l.located(SimId(2), 12, ADA, true).is_empty());
        assert!(l.located(SimId(3), 10, ADA, true).is_empty());
        assert!(l.located(SimId(2), 10, BOB, true).is_empty());
        assert_eq!(l.len(), 1);
        assert_eq!(l.located(SimId(2), 10, ADA, true), vec![(1, Some(SimId(2)))]);
    }

    #[test]
    fn one_answer_settles_every_question_about_the_account_that_asked_that_node() {
        let mut l = Locator::default();
        l.ask(0, ADA, nodes(&[(2, 10)]), 1).unwrap();
        l.ask(5, BOB, nodes(&[(2, 10)]), 2).unwrap();
        l.ask(9, ADA, nodes(&[(2, 10), (3, 20)]), 3).unwrap();
        assert_eq!(l.located(SimId(2), 10, ADA, true), vec![(1, Some(SimId(2))), (3, Some(SimId(2)))]);
        assert_eq!(l.len(), 1, "bob's question waits");
    }

    #[test]
    fn a_question_nobody_answers_is_answered_nowhere_after_a_second() {
        let mut l = Locator::default();
        l.ask(0, ADA, nodes(&[(2, 10)]), 1).unwrap();
        l.ask(500_000, BOB, nodes(&[(2, 10)]), 2).unwrap();
        assert!(l.expire(LOCATE_US - 1).is_empty());
        assert_eq!(l.expire(LOCATE_US), vec![(1, None)]);
        assert_eq!(l.expire(LOCATE_US + 500_000), vec![(2, None)]);
        assert!(l.is_empty());
    }

    #[test]
    fn no_node_to_ask_or_too_many_questions_answer_nowhere_at_once() {
        let mut l = Locator::default();
        assert_eq!(l.ask(0, ADA, BTreeSet::new(), 0), Err((0, None)));
        for i in 0..MAX_ASKING {
            assert!(l.ask(0, ADA, nodes(&[(2, 10)]), i).is_ok());
        }
        assert_eq!(l.ask(0, ADA, nodes(&[(2, 10)]), MAX_ASKING), Err((MAX_ASKING, None)));
        assert_eq!(l.len(), MAX_ASKING, "bounded");
    }
}
