//! Byzantine validators for the suites (feature `mocks`). Each wraps an honest [`Validator`]
//! (so it follows the protocol's timing and knows what honest peers expect) and corrupts what
//! it sends. Twins (two honest validators sharing one key) need no code here: the harness runs
//! two [`Validator`]s with the same key.

use std::collections::VecDeque;

use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::types::{Message, Micros, ValidatorIndex, Vote, VoteKind};
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

    pub fn submit_event(&mut self, now: Micros, event: Vec<u8>) {
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

    fn emit(&mut self, to: Option<ValidatorIndex>, m: Message) {
        self.out.push_back(match to {
            Some(t) => Output::Send(t, m),
            None => Output::Broadcast(m),
        });
    }

    fn send_corrupted(&mut self, to: Option<ValidatorIndex>, m: Message) {
        match (self.behaviour, m) {
            (Behaviour::Withhold, Message::Propose { .. } | Message::Vote(_)) => {}
            (Behaviour::InvalidSignatures, Message::Vote(mut v)) => {
                v.sig.0[7] ^= 0x20;
                self.emit(to, Message::Vote(v));
            }
            (Behaviour::InvalidSignatures, Message::Propose { block, mut vote, nullifications }) => {
                vote.sig.1[3] ^= 0x01;
                self.emit(to, Message::Propose { block, vote, nullifications });
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
                other.events.push(format!("equivocation {}", block.view.0).into_bytes());
                let other_vote = Vote::sign(
                    &self.key,
                    &self.inner.genesis(),
                    self.me(),
                    VoteKind::Notarize,
                    other.view,
                    other.digest(),
                    vote.root,
                );
                for i in 0..self.n {
                    let target = ValidatorIndex(i);
                    if target == self.me() {
                        continue;
                    }
                    let m = if i % 2 == 0 {
                        Message::Propose {
                            block: block.clone(),
                            vote: vote.clone(),
                            nullifications: nullifications.clone(),
                        }
                    } else {
                        Message::Propose {
                            block: other.clone(),
                            vote: other_vote.clone(),
                            nullifications: nullifications.clone(),
                        }
                    };
                    self.emit(Some(target), m);
                }
            }
            (_, m) => self.emit(to, m),
        }
    }
}
