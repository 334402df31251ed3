//! Byzantine validators for the suites (feature `mocks`). Each wraps an honest [`Validator`]
//! (so it follows the protocol's timing and knows what honest peers expect) and corrupts what
//! it sends. Twins (two honest validators sharing one key) need no code here: the harness runs
//! two [`Validator`]s with the same key.

use std::collections::VecDeque;

use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::types::{Digest, Message, Micros, ValidatorIndex, Vote, VoteKind};
use crate::validator::{Config, Output, Validator};

/// What a Byzantine validator does wrong.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Behaviour {
    /// As leader, sends one block to half the validators and a different one to the rest,
    /// voting for both.
    Equivocate,
    /// Votes notarize for a second, made-up block, and both nullifies and finalizes every view.
    DoubleVote,
    /// Every vote and proposal it sends carries a corrupted signature.
    InvalidSignatures,
    /// Sends no proposals and no votes (alive, silent).
    Withhold,
}

impl Behaviour {
    pub const ALL: [Behaviour; 4] =
        [Behaviour::Equivocate, Behaviour::DoubleVote, Behaviour::InvalidSignatures, Behaviour::Withhold];
}

/// A Byzantine validator.
#[derive(Debug)]
pub struct Byzantine {
    inner: Validator,
    key: SigningKey,
    n: u16,
    behaviour: Behaviour,
    out: VecDeque<Output>,
}

impl Byzantine {
    pub fn new(cfg: Config, key: SigningKey, keys: Vec<VerifyingKey>, now: Micros, behaviour: Behaviour) -> Byzantine {
        let n = keys.len() as u16;
        Byzantine { inner: Validator::new(cfg, key.clone(), keys, now), key, n, behaviour, out: VecDeque::new() }
    }

    pub fn behaviour(&self) -> Behaviour {
        self.behaviour
    }

    pub fn handle_message(&mut self, now: Micros, from: ValidatorIndex, msg: Message) {
        self.inner.handle_message(now, from, msg);
        self.corrupt();
    }

    pub fn handle_timeout(&mut self, now: Micros) {
        self.inner.handle_timeout(now);
        self.corrupt();
    }

    pub fn submit_event(&mut self, now: Micros, event: impl Into<crate::EventBytes>) {
        self.inner.submit_event(now, event);
        self.corrupt();
    }

    #[must_use]
    pub fn poll_output(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    #[must_use]
    pub fn poll_timeout(&self) -> Option<Micros> {
        self.inner.poll_timeout()
    }

    fn me(&self) -> ValidatorIndex {
        self.inner.index().expect("a Byzantine mock is in the validator set")
    }

    fn corrupt(&mut self) {
        while let Some(o) = self.inner.poll_output() {
            match o {
                Output::Broadcast(m) => self.send_corrupted(None, m),
                Output::Send(to, m) => self.send_corrupted(Some(to), m),
                // Its own view of commits and evidence is not sent anywhere.
                _ => {}
            }
        }
    }

    /// Send, with an authenticator made with its own pairwise keys (so a corrupted signature
    /// comes with a good MAC: receivers count the vote and must catch the signature later).
    fn emit(&mut self, to: Option<ValidatorIndex>, m: Message) {
        let m = self.inner.authenticate(m);
        self.out.push_back(match to {
            Some(t) => Output::Send(t, m),
            None => Output::Broadcast(m),
        });
    }

    /// Its own notarize vote for a block of its making.
    fn notarize(&self, view: crate::types::View, digest: Digest, root: Option<crate::types::RootReport>) -> Vote {
        Vote::sign(&self.key, &self.inner.genesis(), self.me(), VoteKind::Notarize, view, digest, root)
    }

    /// Another block for the view of `block` (whose events' ids are `ids`, voted for by
    /// `vote`): the same events in reverse, a millisecond later, with its own vote.
    fn reversed(
        &self,
        block: &crate::types::Block,
        ids: &[Digest],
        vote: &Vote,
    ) -> (crate::types::Block, Vec<Digest>, Vote) {
        let mut other = block.clone();
        other.time_ms += 1;
        let other_ids: Vec<Digest> = ids.iter().rev().copied().collect();
        let other_vote = self.notarize(other.view, other.header_digest(&other_ids), vote.root);
        (other, other_ids, other_vote)
    }

    /// An equivocation: `one` to the even-numbered peers, `other` to the odd ones.
    fn split(&mut self, one: Message, other: Message) {
        let me = self.me();
        for i in (0..self.n).filter(|i| ValidatorIndex(*i) != me) {
            let m = if i % 2 == 0 { one.clone() } else { other.clone() };
            self.emit(Some(ValidatorIndex(i)), m);
        }
    }

    fn send_corrupted(&mut self, to: Option<ValidatorIndex>, m: Message) {
        match (self.behaviour, m.unauthenticated()) {
            (
                Behaviour::Withhold,
                Message::Propose { .. } | Message::ProposeIds { .. } | Message::ProposeRefs { .. } | Message::Vote(_),
            ) => {}
            (Behaviour::InvalidSignatures, Message::Vote(mut v)) => {
                v.sig.0[7] ^= 0x20;
                self.emit(to, Message::Vote(v));
            }
            (Behaviour::InvalidSignatures, Message::Propose { block, mut vote, nullifications }) => {
                vote.sig.1[3] ^= 0x01;
                self.emit(to, Message::Propose { block, vote, nullifications });
            }
            (Behaviour::InvalidSignatures, Message::ProposeIds { block, ids, mut vote, nullifications }) => {
                vote.sig.1[3] ^= 0x01;
                self.emit(to, Message::ProposeIds { block, ids, vote, nullifications });
            }
            (Behaviour::InvalidSignatures, Message::ProposeRefs { block, pieces, mut vote, nullifications }) => {
                vote.sig.1[3] ^= 0x01;
                self.emit(to, Message::ProposeRefs { block, pieces, vote, nullifications });
            }
            (Behaviour::DoubleVote, Message::Vote(v)) if v.kind == VoteKind::Notarize => {
                let mut fake = v.digest;
                fake.0[0] ^= 0xff;
                let view = v.view;
                let root = v.root;
                self.emit(to, Message::Vote(v.clone()));
                for (kind, digest) in [
                    (VoteKind::Notarize, fake),
                    (VoteKind::Nullify, Default::default()),
                    (VoteKind::Finalize, v.digest),
                ] {
                    let extra = Vote::sign(&self.key, &self.inner.genesis(), self.me(), kind, view, digest, root);
                    self.emit(to, Message::Vote(extra));
                }
            }
            (Behaviour::Equivocate, Message::Propose { block, vote, nullifications }) => {
                let mut other = block.clone();
                other.time_ms += 1;
                other.events.reverse();
                other.events.push(format!("equivocation {}", block.view.0).into_bytes().into());
                let other_vote = self.notarize(other.view, other.digest(), vote.root);
                self.split(
                    Message::Propose { block, vote, nullifications: nullifications.clone() },
                    Message::Propose { block: other, vote: other_vote, nullifications },
                );
            }
            (Behaviour::Equivocate, Message::ProposeIds { block, ids, vote, nullifications }) => {
                // The other block names the same pooled events in reverse, a millisecond later.
                let (other, other_ids, other_vote) = self.reversed(&block, &ids, &vote);
                self.split(
                    Message::ProposeIds { block, ids, vote, nullifications: nullifications.clone() },
                    Message::ProposeIds { block: other, ids: other_ids, vote: other_vote, nullifications },
                );
            }
            (Behaviour::Equivocate, Message::ProposeRefs { block, pieces, vote, nullifications }) => {
                // The other block names the same pooled events by id, in reverse, a millisecond
                // later.
                let Some(ids) = self.inner.block_ids(&vote.digest) else { return };
                let (other, other_ids, other_vote) = self.reversed(&block, &ids, &vote);
                self.split(
                    Message::ProposeRefs { block, pieces, vote, nullifications: nullifications.clone() },
                    Message::ProposeIds { block: other, ids: other_ids, vote: other_vote, nullifications },
                );
            }
            (_, m) => self.emit(to, m),
        }
    }
}
