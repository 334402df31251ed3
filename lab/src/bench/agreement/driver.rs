//! What every validator of the bench shares: the measurements, and the driver that hands each
//! validator its inputs and sends what they produce.

use metatopia_consensus::{Digest, Message, Output, Validator, ValidatorIndex};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

pub(super) type Frame = Arc<Vec<u8>>;

pub(super) struct Shared {
    pub(super) start: Instant,
    /// Each proposal, by the block's digest: when its leader sent it, and which validator that was.
    pub(super) proposed: Mutex<BTreeMap<Digest, (Duration, u16)>>,
    /// (validator, digest) -> when it learned of the finalization.
    pub(super) finalized: Mutex<Vec<(u16, Digest, Duration)>>,
    pub(super) committed: Mutex<Vec<(u16, u64, Duration, usize)>>,
    /// Time spent handling each kind of input: (count, total, max).
    pub(super) handling: Mutex<BTreeMap<&'static str, (u64, Duration, Duration)>>,
    /// Bytes sent by all validators, per kind of message: (frames, bytes).
    pub(super) sent: Mutex<BTreeMap<&'static str, (u64, u64)>>,
    /// Every input handled: (validator, start, end, kind), for `--timeline`.
    pub(super) inputs: Mutex<Vec<(u16, Duration, Duration, &'static str)>>,
    /// Each validator thread's CPU time and wall time, from its start to its end.
    pub(super) cpu: Mutex<Vec<(Duration, Duration)>>,
    /// (validator, digest) -> when it sent its finalize vote (queued it for its peers).
    pub(super) finalize_sent: Mutex<Vec<(u16, Digest, Duration)>>,
    /// The core each validator is pinned to (empty when not pinned).
    pub(super) cores: Mutex<Vec<usize>>,
}

pub(super) fn new_shared() -> Arc<Shared> {
    Arc::new(Shared {
        start: Instant::now(),
        proposed: Mutex::new(BTreeMap::new()),
        finalized: Mutex::new(Vec::new()),
        committed: Mutex::new(Vec::new()),
        handling: Mutex::new(BTreeMap::new()),
        sent: Mutex::new(BTreeMap::new()),
        inputs: Mutex::new(Vec::new()),
        cpu: Mutex::new(Vec::new()),
        finalize_sent: Mutex::new(Vec::new()),
        cores: Mutex::new(Vec::new()),
    })
}

/// Peers' messages in two queues: votes, proposals and certificates first, then gossiped
/// client events (a proposal queued behind a few hundred events waited 50-150 µs).
pub(super) type Inboxes =
    (mpsc::UnboundedReceiver<(ValidatorIndex, Message)>, mpsc::UnboundedReceiver<(ValidatorIndex, Message)>);

/// The sending half of [`Inboxes`]: routes a peer's message to its queue.
#[derive(Clone)]
pub(super) struct Inbox {
    pub(super) first: mpsc::UnboundedSender<(ValidatorIndex, Message)>,
    pub(super) gossip: mpsc::UnboundedSender<(ValidatorIndex, Message)>,
}

impl Inbox {
    pub(super) fn new() -> (Inbox, Inboxes) {
        let (first, a) = mpsc::unbounded_channel();
        let (gossip, b) = mpsc::unbounded_channel();
        (Inbox { first, gossip }, (a, b))
    }

    /// `false` once the validator is gone.
    pub(super) fn send(&self, from: ValidatorIndex, m: Message) -> bool {
        let queue = if matches!(m, Message::Events(_)) { &self.gossip } else { &self.first };
        queue.send((from, m)).is_ok()
    }
}

/// What a validator's links are: plain TCP, its thread busy-polling them or not; or the node's
/// mesh, whose frames are `NodeMsg::Consensus` rather than bare messages.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Links {
    Tcp(Idle),
    Mesh,
}

/// An input for a validator.
pub(super) enum Input {
    Message(ValidatorIndex, Box<Message>),
    Events(Vec<Vec<u8>>),
    Timeout,
}

/// A validator and what the bench records of it, whatever runs it (a task of its own, or a
/// core's reactor): it handles one input at a time and hands each frame it sends to the caller.
pub(super) struct Driver {
    pub(super) v: Validator,
    pub(super) shared: Arc<Shared>,
    pub(super) me: u16,
    /// How many peers a broadcast goes to.
    pub(super) peers: usize,
    pub(super) until_tick: u64,
    pub(super) mesh: bool,
}

impl Driver {
    pub(super) fn new(v: Validator, shared: Arc<Shared>, until_tick: u64, links: Links) -> Driver {
        let me = v.index().expect("every bench node is a validator").0;
        let peers = v.keys().len().saturating_sub(1);
        Driver { v, shared, me, peers, until_tick, mesh: links == Links::Mesh }
    }

    pub(super) fn micros(&self) -> u64 {
        self.shared.start.elapsed().as_micros() as u64
    }

    /// When the validator next wants a timeout input (µs on the bench's clock), if ever.
    pub(super) fn deadline(&self) -> Option<u64> {
        self.v.poll_timeout()
    }

    pub(super) fn encode(&self, m: Message) -> Frame {
        if self.mesh {
            Arc::new(metatopia_node::net::wire::NodeMsg::Consensus { epoch: 0, msg: m }.encode())
        } else {
            Arc::new(m.encode())
        }
    }

    /// Handle `input`, timing and recording it, then pass each frame the validator sends to
    /// `send` (for one peer, or for all with `None`). `false` once it has committed its last tick.
    pub(super) fn step(&mut self, input: Input, send: &mut impl FnMut(Option<u16>, &Frame)) -> bool {
        let (me, shared) = (self.me, self.shared.clone());
        // Only the handling is timed (not the wait for the input).
        let t0 = Instant::now();
        let started = shared.start.elapsed();
        let kind = match input {
            Input::Message(from, msg) => {
                let kind = msg.kind();
                self.v.handle_message(self.micros(), from, *msg);
                kind
            }
            Input::Events(batch) => {
                self.v.submit_events(self.micros(), batch);
                "submit"
            }
            Input::Timeout => {
                self.v.handle_timeout(self.micros());
                "timeout"
            }
        };
        let took = t0.elapsed();
        shared.inputs.lock().expect("not poisoned").push((me, started, started + took, kind));
        {
            let mut h = shared.handling.lock().expect("not poisoned");
            let e = h.entry(kind).or_insert((0, Duration::ZERO, Duration::ZERO));
            e.0 += 1;
            e.1 += took;
            e.2 = e.2.max(took);
        }
        let count = |kind: &'static str, frames: usize, len: usize| {
            let mut sent = shared.sent.lock().expect("not poisoned");
            let e = sent.entry(kind).or_insert((0, 0));
            e.0 += frames as u64;
            e.1 += (frames * len) as u64;
        };
        let sending = shared.start.elapsed();
        let mut proposing = false;
        let mut more = true;
        while let Some(o) = self.v.poll_output() {
            let at = shared.start.elapsed();
            proposing |= matches!(&o, Output::Broadcast(m) if m.kind() == "propose");
            match o {
                Output::Broadcast(m) => {
                    if let Some(vote) = m.vote().filter(|_| m.kind() == "propose") {
                        // The leader's own notarize vote names the block's digest.
                        shared.proposed.lock().expect("not poisoned").insert(vote.digest, (at, vote.signer.0));
                    }
                    let kind = m.kind();
                    if let Some(vote) = m.vote().filter(|_| matches!(kind, "notarize" | "finalize")) {
                        // (For `--timeline`, and for finding the vote that finalizes.)
                        let sent = if kind == "finalize" { "finalize sent" } else { "notarize sent" };
                        shared.inputs.lock().expect("not poisoned").push((me, at, at, sent));
                        if kind == "finalize" {
                            shared.finalize_sent.lock().expect("not poisoned").push((me, vote.digest, at));
                        }
                    }
                    let frame = self.encode(m);
                    count(kind, self.peers, frame.len());
                    send(None, &frame);
                }
                Output::Send(to, m) => {
                    if let Some(vote) = m.vote().filter(|_| m.kind() == "propose") {
                        // (Full to some peers, compact to others: one proposal.)
                        shared.proposed.lock().expect("not poisoned").entry(vote.digest).or_insert((at, vote.signer.0));
                    }
                    let kind = m.kind();
                    let frame = self.encode(m);
                    count(kind, 1, frame.len());
                    send(Some(to.0), &frame);
                }
                Output::Finalized { digest, .. } => {
                    shared.finalized.lock().expect("not poisoned").push((me, digest, at))
                }
                Output::Committed(c) => {
                    shared.committed.lock().expect("not poisoned").push((me, c.block.tick.0, at, c.block.events.len()));
                    if c.block.tick.0 >= self.until_tick {
                        more = false;
                        break;
                    }
                }
                Output::RootMismatch { .. } | Output::Evidence(_) => {}
            }
        }
        if proposing {
            // (For `--timeline`: the leader encoding and queueing its proposal.)
            shared.inputs.lock().expect("not poisoned").push((me, sending, shared.start.elapsed(), "send"));
        }
        more
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Idle {
    Spin,
    Block,
}
