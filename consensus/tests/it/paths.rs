//! The commit path's shortcuts, each checked message by message on four validators driven by
//! hand: compact proposals (rebuilt from the pool, fetched when gossip was missed, full ones
//! for a peer that missed), votes arriving after their quorum (verified later, at the timer),
//! and blocks certified before their proposal arrived (fetched only if it does not come); votes
//! counted on their authenticators (MACs), with a Byzantine signer's bad signature caught after.
//! The tests of the other shortcuts run with authenticators off, so each path is seen alone.

use std::sync::Arc;

use metatopia_consensus::{
    Block, Certificate, Config, Digest, Message, Output, Parent, Piece, SigCache, Signed, SigningKey, Tick, Validator,
    ValidatorIndex, View, Vote, VoteKind, event_id,
};

const PERIOD: u64 = 50_000;

fn key(i: u16) -> SigningKey {
    let mut b = [5u8; 32];
    b[..2].copy_from_slice(&i.to_le_bytes());
    SigningKey::from_bytes(&b)
}

/// A message in flight: (from, to, message).
type Mail = (usize, usize, Message);

struct Net {
    vs: Vec<Validator>,
    now: u64,
    /// Every message delivered so far.
    log: Vec<Mail>,
    /// Held back by the filter, in order.
    held: Vec<Mail>,
    /// Outputs other than messages, per validator.
    other: Vec<Vec<Output>>,
}

impl Net {
    /// Signatures checked before votes count (authenticators off).
    fn new() -> Net {
        Net::with_macs(false)
    }

    fn with_macs(vote_macs: bool) -> Net {
        let keys: Vec<_> = (0..4).map(|i| key(i).verifying_key()).collect();
        let vs = (0..4)
            .map(|i| {
                // Each validator verifies for itself (its own signature cache), as on separate machines.
                let cfg = Config {
                    period_us: PERIOD,
                    leader_timeout_us: 10_000_000,
                    notarize_timeout_us: 20_000_000,
                    retry_us: 1_000_000,
                    sig_cache: Arc::new(SigCache::new()),
                    vote_macs,
                    ..Config::default()
                };
                Validator::new(cfg, key(i), keys.clone(), 0)
            })
            .collect();
        Net { vs, now: 0, log: Vec::new(), held: Vec::new(), other: vec![Vec::new(); 4] }
    }

    fn leader(&self, view: u64) -> usize {
        self.vs[0].leader(View(view)).0 as usize
    }

    /// Outputs of every validator into mail, the rest kept in `other`.
    fn collect(&mut self) -> Vec<Mail> {
        let mut mail = Vec::new();
        for (i, v) in self.vs.iter_mut().enumerate() {
            while let Some(o) = v.poll_output() {
                match o {
                    Output::Broadcast(m) => mail.extend((0..4).filter(|j| *j != i).map(|j| (i, j, m.clone()))),
                    Output::Send(to, m) => mail.push((i, to.0 as usize, m)),
                    o => self.other[i].push(o),
                }
            }
        }
        mail
    }

    /// Deliver until quiet; `hold` keeps matching messages back (in `held`).
    fn run(&mut self, hold: &dyn Fn(&Mail) -> bool) {
        loop {
            let mail = self.collect();
            if mail.is_empty() {
                return;
            }
            for m in mail {
                if hold(&m) {
                    self.held.push(m);
                } else {
                    let (from, to, msg) = m.clone();
                    self.vs[to].handle_message(self.now, ValidatorIndex(from as u16), msg);
                    self.log.push(m);
                }
            }
        }
    }

    /// Move the clock and fire every validator's due timers.
    fn tick_to(&mut self, now: u64, hold: &dyn Fn(&Mail) -> bool) {
        self.now = now;
        for v in &mut self.vs {
            if v.poll_timeout().is_some_and(|t| t <= now) {
                v.handle_timeout(now);
            }
        }
        self.run(hold);
    }

    /// Deliver the held messages matching `pick` (in order).
    fn release(&mut self, pick: &dyn Fn(&Mail) -> bool) {
        let (now, later): (Vec<Mail>, Vec<Mail>) = std::mem::take(&mut self.held).into_iter().partition(|m| pick(m));
        self.held = later;
        for (from, to, msg) in now {
            self.vs[to].handle_message(self.now, ValidatorIndex(from as u16), msg.clone());
            self.log.push((from, to, msg));
        }
    }

    fn finalized(&self, i: usize, view: u64) -> bool {
        self.other[i].iter().any(|o| matches!(o, Output::Finalized { view: v, .. } if v.0 == view))
    }
}

fn votes_of(log: &[Mail], who: usize, kind: VoteKind, view: u64) -> usize {
    log.iter()
        .filter(|(f, _, m)| *f == who && matches!(m, Message::Vote(v) if v.kind == kind && v.view.0 == view))
        .count()
}

const NONE: &dyn Fn(&Mail) -> bool = &|_| false;

#[test]
fn a_compact_proposal_waits_for_late_gossip_and_is_fetched_when_gossip_was_lost() {
    let event = b"an event the peer has not seen".to_vec();
    for gossip_comes in [true, false] {
        let mut net = Net::new();
        let lead = net.leader(1);
        let (miss, quiet) = ((lead + 1) % 4, (lead + 2) % 4);
        // An event reaches the leader; its gossip to `miss` is held back (late or lost).
        net.vs[lead].submit_event(0, event.clone());
        let gossip = move |(_, to, m): &Mail| *to == miss && matches!(m, Message::Events(_));
        net.run(&gossip);
        assert_eq!(net.held.len(), 1, "the gossip to the peer was held back");
        // `quiet` is cut off for a while, so the view needs the peer's vote.
        let cut = move |(f, to, _): &Mail| *f == quiet || *to == quiet;
        net.tick_to(PERIOD, &cut);
        // The leader named the event as a run of the gossip batch it came in, the same to
        // everyone.
        let proposals: Vec<&Mail> =
            net.log.iter().chain(&net.held).filter(|(f, _, m)| *f == lead && m.kind() == "propose").collect();
        assert_eq!(proposals.len(), 3);
        let digest = match &proposals[0].2 {
            Message::ProposeRefs { block, pieces, vote, .. } => {
                assert!(block.events.is_empty());
                assert!(matches!(pieces[..], [Piece::Run { start: 0, len: 1, .. }]), "{pieces:?}");
                assert_eq!(vote.digest, block.header_digest(&[event_id(&event)]));
                vote.digest
            }
            other => panic!("expected a compact proposal, got {other:?}"),
        };
        // The peer cannot rebuild it yet: no vote, and no fetch at once.
        let fetches = |net: &Net| {
            net.log.iter().chain(&net.held).filter(|(f, _, m)| *f == miss && *m == Message::Fetch(digest)).count()
        };
        assert_eq!(votes_of(&net.log, miss, VoteKind::Notarize, 1), 0);
        assert_eq!(fetches(&net), 0);
        assert!(!net.finalized(lead, 1), "the view waits for the peer");
        if gossip_comes {
            net.release(&gossip);
        } else {
            net.held.retain(|m| !gossip(m));
        }
        net.run(&cut);
        net.tick_to(PERIOD + PERIOD / 4, &cut);
        // Late gossip completes the proposal; lost gossip means the block is asked of everyone.
        assert_eq!(fetches(&net), if gossip_comes { 0 } else { 3 }, "gossip came: {gossip_comes}");
        let got_block = net.log.iter().any(|(_, to, m)| {
            *to == miss && matches!(m, Message::Block { block, .. } if block.events == vec![event.clone().into()])
        });
        assert_eq!(got_block, !gossip_comes);
        assert_eq!(votes_of(&net.log, miss, VoteKind::Notarize, 1), 2, "the peer voted (to the others but `quiet`)");
        assert!(net.finalized(lead, 1), "the view went on with the peer's vote");
        net.release(&|_| true);
        net.run(NONE);
        for i in 0..4 {
            if i != lead {
                assert_eq!(votes_of(&net.log, i, VoteKind::Notarize, 1), 3, "validator {i} notarized view 1");
            }
            assert!(net.finalized(i, 1), "validator {i} finalized view 1");
        }

        // The next leader that is not the peer sends it the full proposal too if it had to fetch.
        let (view, next) = (2..6).map(|v| (v, net.leader(v))).find(|(_, l)| *l != miss).expect("a leader");
        for v in 2..=view {
            net.tick_to(v * PERIOD, NONE);
        }
        let sent: Vec<(usize, &'static str)> = net
            .log
            .iter()
            .filter(|(f, _, m)| {
                *f == next
                    && matches!(m, Message::Propose { block, .. } | Message::ProposeRefs { block, .. } if block.view.0 == view)
            })
            .map(|(_, to, m)| (*to, if matches!(m, Message::Propose { .. }) { "full" } else { "compact" }))
            .collect();
        // Compact to everyone, and the full block too to the peer that had to fetch.
        let mut expect: Vec<(usize, &'static str)> = (0..4).filter(|i| *i != next).map(|i| (i, "compact")).collect();
        if !gossip_comes {
            expect.push((miss, "full"));
        }
        let mut sent = sent;
        sent.sort();
        expect.sort();
        assert_eq!(sent, expect, "proposals of view {view}");
        for i in 0..4 {
            assert!(net.finalized(i, view), "validator {i} finalized view {view}");
        }
    }
}

/// A header for view 1 by `lead`, on genesis (its events named apart).
fn view_one(lead: usize, genesis: Digest) -> Block {
    Block {
        view: View(1),
        leader: ValidatorIndex(lead as u16),
        parent: Parent { view: View(0), digest: genesis },
        tick: Tick(0),
        time_ms: 1,
        events: Vec::new(),
        parent_certificate: None,
    }
}

/// A gossip batch's name, as validators give it (the blake3 hash, key derived from "metatopia
/// consensus gossip batch v1", of its events' ids in order).
fn batch_name(events: &[Vec<u8>]) -> Digest {
    let mut h = blake3::Hasher::new_derive_key("metatopia consensus gossip batch v1");
    for e in events {
        h.update(&event_id(e).0);
    }
    Digest(*h.finalize().as_bytes())
}

#[test]
fn a_proposal_by_runs_and_ids_is_rebuilt_and_one_naming_more_than_its_batch_holds_gets_no_vote() {
    let mut net = Net::new();
    let lead = net.leader(1);
    let genesis = net.vs[0].genesis();
    // Three events reach the leader, and its gossip batch of them reaches everyone; a fourth
    // reaches another validator, whose batch also reaches everyone.
    let events: Vec<Vec<u8>> = (0..3).map(|i| format!("event {i}").into_bytes()).collect();
    let other = (lead + 1) % 4;
    let lone = b"a lone event".to_vec();
    net.vs[lead].submit_events(0, events.clone());
    net.vs[other].submit_event(0, lone.clone());
    net.run(NONE);
    net.now = 10_000;
    let block = view_one(lead, genesis);
    let sign = |ids: &[Digest]| {
        let d = block.header_digest(ids);
        Vote::sign(&key(lead as u16), &genesis, ValidatorIndex(lead as u16), VoteKind::Notarize, View(1), d, None)
    };
    let ids: Vec<Digest> = events.iter().map(|e| event_id(e)).collect();
    // First a lie: four events of a batch of three. Nobody votes, nobody fetches.
    let lie = Message::ProposeRefs {
        block: block.clone(),
        pieces: vec![Piece::Run { batch: batch_name(&events), start: 0, len: 4 }],
        vote: sign(&[ids.clone(), vec![ids[0]]].concat()),
        nullifications: Vec::new(),
    };
    // Then the events 2 and 1 of the batch (out of its order), the lone event by id, event 0.
    let want = vec![ids[1], ids[2], event_id(&lone), ids[0]];
    let honest = Message::ProposeRefs {
        block: block.clone(),
        pieces: vec![
            Piece::Run { batch: batch_name(&events), start: 1, len: 2 },
            Piece::Ids(vec![event_id(&lone)]),
            Piece::Run { batch: batch_name(&events), start: 0, len: 1 },
        ],
        vote: sign(&want),
        nullifications: Vec::new(),
    };
    for msg in [lie, honest] {
        for to in (0..4).filter(|i| *i != lead) {
            net.vs[to].handle_message(net.now, ValidatorIndex(lead as u16), msg.clone());
        }
    }
    // (The leader's own proposal is not sent: it is mute but for the two above.)
    net.run(&|(f, _, _): &Mail| *f == lead);
    net.tick_to(net.now + PERIOD / 4, &|(f, _, _): &Mail| *f == lead);
    let digest = block.header_digest(&want);
    for i in (0..4).filter(|i| *i != lead) {
        assert!(!net.log.iter().any(|(f, _, m)| *f == i && matches!(m, Message::Fetch(_))), "validator {i} fetched");
        let votes: Vec<Digest> = net
            .log
            .iter()
            .filter_map(|(f, _, m)| match m {
                Message::Vote(v) if *f == i && v.kind == VoteKind::Notarize && v.view == View(1) => Some(v.digest),
                _ => None,
            })
            .collect();
        assert!(!votes.is_empty() && votes.iter().all(|d| *d == digest), "validator {i} voted for the honest one");
    }
}

#[test]
fn a_compact_proposal_naming_unknown_events_gets_no_vote() {
    let mut net = Net::new();
    let lead = net.leader(1);
    let genesis = net.vs[0].genesis();
    // A lying leader names an event nobody has and never answers for it.
    let block = view_one(lead, genesis);
    let ids = vec![Digest([9; 32])];
    let digest = block.header_digest(&ids);
    let vote =
        Vote::sign(&key(lead as u16), &genesis, ValidatorIndex(lead as u16), VoteKind::Notarize, View(1), digest, None);
    let msg = Message::ProposeIds { block, ids, vote, nullifications: Vec::new() };
    net.now = 10_000;
    for to in (0..4).filter(|i| *i != lead) {
        net.vs[to].handle_message(net.now, ValidatorIndex(lead as u16), msg.clone());
    }
    // Nobody answers the fetch (the leader is mute).
    net.run(&|(_, to, _): &Mail| *to == lead);
    net.tick_to(net.now + PERIOD / 4, &|(_, to, _): &Mail| *to == lead);
    for i in (0..4).filter(|i| *i != lead) {
        assert!(net.log.iter().any(|(f, _, m)| *f == i && *m == Message::Fetch(digest)), "validator {i} asked for it");
        assert_eq!(votes_of(&net.log, i, VoteKind::Notarize, 1), 0, "validator {i} did not vote for it");
    }
}

#[test]
fn a_vote_after_its_quorum_is_verified_at_the_timer_and_its_root_is_checked() {
    let mut net = Net::new();
    let lead = net.leader(1);
    let (late, watcher) = ((lead + 1) % 4, (lead + 2) % 4);
    // Every validator executed tick 0; `late` reached another root.
    for (i, v) in net.vs.iter_mut().enumerate() {
        v.report_root(Tick(0), Digest([if i == late { 2 } else { 1 }; 32]));
    }
    let from_late = move |(f, to, m): &Mail| *f == late && *to == watcher && matches!(m, Message::Vote(_));
    net.tick_to(PERIOD, &from_late);
    assert!(net.finalized(watcher, 1), "the watcher finalized without the late validator's votes");
    assert_eq!(net.held.len(), 2, "the late validator's notarize and finalize votes");
    // A forged copy of a late vote (another root, the signature no longer matching).
    let mut forged = match &net.held[0].2 {
        Message::Vote(v) => v.clone(),
        other => panic!("{other:?}"),
    };
    forged.signer = ValidatorIndex(((late + 2) % 4) as u16);
    net.vs[watcher].handle_message(net.now, forged.signer, Message::Vote(forged));
    net.release(&|_| true);
    let mismatches = |net: &Net| net.other[watcher].iter().filter(|o| matches!(o, Output::RootMismatch { .. })).count();
    net.collect();
    assert_eq!(mismatches(&net), 0, "late votes wait for the timer");
    let due = net.vs[watcher].poll_timeout().expect("a timer");
    assert!(due <= net.now + PERIOD / 4, "due {due} at {}", net.now);
    net.tick_to(net.now + PERIOD / 4, NONE);
    let found: Vec<ValidatorIndex> = net.other[watcher]
        .iter()
        .filter_map(|o| match o {
            Output::RootMismatch { validator, tick: Tick(0), .. } => Some(*validator),
            _ => None,
        })
        .collect();
    assert!(!found.is_empty(), "the late votes' root was checked at the timer");
    assert!(
        found.iter().all(|v| v.0 as usize == late),
        "only the validator that diverged (not the forgery): {found:?}"
    );
}

/// A proposal lost on its way to one validator, in a view that needs that validator's vote
/// (the fourth is silent): the others' votes name the block, the validator asks for it a
/// quarter period later, takes the answer (which carries the leader's vote) as the proposal,
/// votes, and the view is notarized and finalized long before any timeout.
#[test]
fn a_lost_proposal_is_fetched_on_the_others_votes_and_voted_for() {
    let mut net = Net::new();
    let lead = net.leader(1);
    let (lost, mute) = ((lead + 1) % 4, (lead + 2) % 4);
    let proposal_to_lost = move |(f, to, m): &Mail| *f == lead && *to == lost && m.kind() == "propose";
    let mute_out = move |(f, to, _): &Mail| *f == mute || *to == mute;
    net.tick_to(PERIOD, &|m: &Mail| proposal_to_lost(m) || mute_out(m));
    net.held.retain(|m| !proposal_to_lost(m));
    assert!(!net.finalized(lead, 1), "the view needs the validator that lost the proposal");
    assert_eq!(votes_of(&net.log, lost, VoteKind::Notarize, 1), 0);
    // It asks a quarter period on, gets the block with the leader's vote, and votes.
    net.tick_to(PERIOD + PERIOD / 4, &mute_out);
    assert!(net.log.iter().any(|(f, _, m)| *f == lost && matches!(m, Message::Fetch(_))), "it asked for the block");
    assert!(
        net.log.iter().any(|(_, to, m)| *to == lost && matches!(m, Message::Block { leader_vote: Some(_), .. })),
        "the answer carries the leader's vote"
    );
    assert!(votes_of(&net.log, lost, VoteKind::Notarize, 1) > 0, "it voted for the fetched proposal");
    for i in (0..4).filter(|i| *i != mute) {
        assert!(net.finalized(i, 1), "validator {i} finalized view 1 within a period, without a timeout");
    }
}

#[test]
fn a_block_certified_before_its_proposal_is_fetched_only_if_the_proposal_does_not_come() {
    for proposal_comes in [true, false] {
        let mut net = Net::new();
        let lead = net.leader(1);
        let slow = (lead + 3) % 4;
        // The proposal to `slow` is held back, everything else flows.
        let proposal_to_slow = move |(_, to, m): &Mail| *to == slow && m.kind() == "propose";
        net.tick_to(PERIOD, &proposal_to_slow);
        assert_eq!(net.held.len(), 1);
        let asked = |net: &Net| net.log.iter().filter(|(f, _, m)| *f == slow && matches!(m, Message::Fetch(_))).count();
        assert!(net.finalized(slow, 1), "the slow validator saw the certificates");
        assert_eq!(asked(&net), 0, "no fetch at once: the proposal may be on its way");
        if proposal_comes {
            net.release(&|_| true);
        }
        let due = net.vs[slow].poll_timeout().expect("a timer");
        assert!(due <= PERIOD + PERIOD / 4, "due {due}");
        net.tick_to(PERIOD + PERIOD / 4, NONE);
        assert_eq!(asked(&net), usize::from(!proposal_comes) * 3, "proposal came: {proposal_comes}");
        // Either way the slow validator ends up with the block and commits it with the rest.
        for v in 2..=3 {
            net.tick_to(v * PERIOD, NONE);
        }
        let committed =
            |i: usize| net.other[i].iter().any(|o| matches!(o, Output::Committed(c) if c.block.view == View(1)));
        assert!((0..4).all(committed), "proposal came: {proposal_comes}");
    }
}

/// Votes go out with authenticators; a receiver counts a vote on its MAC and checks the
/// signature a sixteenth of a period later. A Byzantine validator that sends a good MAC on a bad
/// signature gets its vote counted once: the check takes it back out, no certificate holding it
/// leaves the validator or commits anything, the certificate is formed again from honest votes,
/// and from then on that signer's votes are verified before they count.
#[test]
fn a_good_mac_on_a_bad_signature_counts_once_and_is_caught_before_any_certificate_leaves() {
    let mut net = Net::with_macs(true);
    let lead = net.leader(1);
    let (byz, watcher, quiet) = ((lead + 1) % 4, (lead + 2) % 4, (lead + 3) % 4);
    let keys: Vec<_> = (0..4).map(|i| key(i).verifying_key()).collect();
    let genesis = net.vs[0].genesis();
    // `quiet` is cut off, so the watcher's quorum needs the Byzantine validator's votes; those
    // to the watcher are held, to be corrupted.
    let hold = move |(f, to, _): &Mail| *f == quiet || *to == quiet || (*f == byz && *to == watcher);
    net.tick_to(PERIOD, &hold);
    // Everything on the wire that carries a vote has an authenticator.
    assert!(net.log.iter().all(|(_, _, m)| m.vote().is_none() || matches!(m, Message::Authenticated { .. })));
    assert!(!net.finalized(watcher, 1), "the watcher waits for a third vote");
    // The Byzantine validator's votes to the watcher, with corrupted signatures and good MACs.
    let from_byz: Vec<Mail> = net.held.iter().filter(|(f, to, _)| *f == byz && *to == watcher).cloned().collect();
    net.held.retain(|(f, to, _)| !(*f == byz && *to == watcher));
    assert!(!from_byz.is_empty());
    let mut bad_digests = Vec::new();
    for (_, _, m) in from_byz {
        let Message::Authenticated { inner, .. } = m else { continue };
        let Signed::Vote(mut v) = *inner else { continue };
        v.sig.0[5] ^= 0x10;
        bad_digests.push((v.kind, v.view));
        let (kind, view) = (v.kind, v.view);
        let m = net.vs[byz].authenticate(Message::Vote(v));
        assert!(matches!(m, Message::Authenticated { .. }));
        net.vs[watcher].handle_message(net.now, ValidatorIndex(byz as u16), m);
        // Then a well-signed, authenticated vote of the same kind for another block: evidence,
        // and it must not stand in for the bad one when the signatures are checked.
        let other =
            Vote::sign(&key(byz as u16), &genesis, ValidatorIndex(byz as u16), kind, view, Digest([7; 32]), None);
        let m = net.vs[byz].authenticate(Message::Vote(other));
        net.vs[watcher].handle_message(net.now, ValidatorIndex(byz as u16), m);
    }
    net.run(&hold);
    assert!(net.finalized(watcher, 1), "counted on its MAC: the watcher finalized at once");
    let evidence = net.other[watcher].iter().filter(|o| matches!(o, Output::Evidence(_))).count();
    assert_eq!(evidence, 2, "its notarize and finalize votes each conflict with another");
    // Whatever certificates the watcher has sent so far, none holds the bad votes.
    let certificates_sent = |net: &Net| -> Vec<Certificate> {
        net.log
            .iter()
            .chain(&net.held)
            .filter(|(f, _, _)| *f == watcher)
            .filter_map(|(_, _, m)| match m {
                Message::Certificate(c) => Some(c.clone()),
                _ => None,
            })
            .collect()
    };
    for c in certificates_sent(&net) {
        assert!(c.verify(&genesis, &keys, 3, &SigCache::new()).is_ok(), "a certificate that left verifies: {c:?}");
    }
    // The check is due a sixteenth of a period on.
    let due = net.vs[watcher].poll_timeout().expect("a timer");
    assert!(due <= net.now + PERIOD / 16, "due {due} at {}", net.now);
    net.tick_to(due, &hold);
    for c in certificates_sent(&net) {
        assert!(c.verify(&genesis, &keys, 3, &SigCache::new()).is_ok(), "a certificate that left verifies: {c:?}");
    }
    // `quiet` comes back: the certificates are formed again from honest votes and the chain
    // goes on; every commit's certificates verify.
    net.release(&|_| true);
    net.run(NONE);
    for v in 2..=4 {
        net.tick_to(v * PERIOD, NONE);
    }
    for c in certificates_sent(&net) {
        assert!(c.verify(&genesis, &keys, 3, &SigCache::new()).is_ok(), "a certificate that left verifies: {c:?}");
    }
    let commits: Vec<_> = net.other[watcher]
        .iter()
        .filter_map(|o| match o {
            Output::Committed(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert!(commits.iter().any(|c| c.block.view == View(1)), "view 1 committed");
    for c in &commits {
        assert!(c.certificate.verify(&genesis, &keys, 3, &SigCache::new()).is_ok());
        assert!(c.finalization.verify(&genesis, &keys, 3, &SigCache::new()).is_ok());
    }
    // Caught once, the Byzantine validator's votes are verified before they count: its next
    // bad signature with a good MAC schedules no check (it was verified, and refused, at once),
    // where an honest validator's authenticated vote does.
    assert_eq!(bad_digests.len(), 2, "its notarize and finalize votes of view 1");
    net.tick_to(net.now + PERIOD / 8, NONE);
    let view = net.vs[watcher].view();
    let check_scheduled = |net: &Net| net.vs[watcher].poll_timeout().is_some_and(|t| t <= net.now + PERIOD / 16);
    assert!(!check_scheduled(&net));
    let mut forged = Vote::sign(
        &key(byz as u16),
        &genesis,
        ValidatorIndex(byz as u16),
        VoteKind::Nullify,
        view,
        Digest::default(),
        None,
    );
    forged.sig.1[0] ^= 1;
    let m = net.vs[byz].authenticate(Message::Vote(forged));
    net.vs[watcher].handle_message(net.now, ValidatorIndex(byz as u16), m);
    assert!(!check_scheduled(&net), "a caught signer's MAC is not taken");
    let honest = Vote::sign(
        &key(lead as u16),
        &genesis,
        ValidatorIndex(lead as u16),
        VoteKind::Nullify,
        view,
        Digest::default(),
        None,
    );
    let m = net.vs[lead].authenticate(Message::Vote(honest));
    net.vs[watcher].handle_message(net.now, ValidatorIndex(lead as u16), m);
    assert!(check_scheduled(&net), "an honest validator's MAC still counts");
}

/// Leaders keep the tick rate although every proposal goes out late: each validator's timer
/// fires `late` after its deadline (the wake-up on a real machine), with messages delivered at
/// once. Counting each period from the parent's proposal would add the delays up (a devnet with
/// no load ran at 0.97 of its rate); a leader proposes when its tick is due on a schedule kept
/// on the chain instead, and never sooner, so the chain keeps one tick per period.
#[test]
fn late_wake_ups_do_not_slow_the_tick_rate() {
    for late in [300, 4_000, 15_000] {
        let mut net = Net::with_macs(true);
        net.run(NONE);
        let periods = 400;
        let end = periods * PERIOD;
        while net.now < end {
            let Some(due) = net.vs.iter().filter_map(Validator::poll_timeout).min() else { break };
            let now = due.max(net.now) + late;
            net.now = now;
            for v in &mut net.vs {
                if v.poll_timeout().is_some_and(|t| t + late <= now) {
                    v.handle_timeout(now);
                }
            }
            net.run(NONE);
        }
        let blocks: Vec<(u64, u64)> = net.other[0]
            .iter()
            .filter_map(|o| match o {
                Output::Committed(c) => Some((c.block.tick.0, c.block.time_ms)),
                _ => None,
            })
            .collect();
        let ticks = blocks.len() as u64;
        // Tick t commits when t + 1 does, so the last one or two are not in yet.
        assert!(
            ticks + 3 >= periods && ticks <= periods,
            "{late} µs late: {ticks} ticks committed in {periods} periods"
        );
        // And never faster than the period: each tick's BFT time is due on the schedule.
        let first = blocks[0];
        for &(tick, time_ms) in &blocks {
            let due_ms = first.1 + (tick - first.0) * PERIOD / 1_000;
            assert!(time_ms + 1 >= due_ms, "{late} µs late: tick {tick} at {time_ms} ms, due at {due_ms} ms");
        }
    }
}
