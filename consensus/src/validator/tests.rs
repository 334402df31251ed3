use super::*;
use crate::types::event_id;

const PERIOD: Micros = 50_000;

fn four() -> Vec<Validator> {
    let keys: Vec<SigningKey> = (0..4u8).map(|i| SigningKey::from_bytes(&[i + 1; 32])).collect();
    let vks: Vec<VerifyingKey> = keys.iter().map(|k| k.verifying_key()).collect();
    let cfg = Config {
        period_us: PERIOD,
        leader_timeout_us: 10_000_000,
        notarize_timeout_us: 20_000_000,
        retry_us: 10_000_000,
        ..Config::default()
    };
    keys.into_iter().map(|k| Validator::new(cfg.clone(), k, vks.clone(), 0)).collect()
}

/// Deliver every message until quiet (firing timers due at `now` first); the proposals seen.
fn run(vs: &mut [Validator], now: Micros) -> Vec<(Block, Vec<Digest>)> {
    for v in vs.iter_mut() {
        if v.poll_timeout().is_some_and(|t| t <= now) {
            v.handle_timeout(now);
        }
    }
    let mut proposals = Vec::new();
    loop {
        let mut mail = Vec::new();
        for (i, v) in vs.iter_mut().enumerate() {
            while let Some(o) = v.poll_output() {
                match o {
                    Output::Broadcast(m) => mail.extend((0..4).filter(|j| *j != i).map(|j| (i, j, m.clone()))),
                    Output::Send(to, m) => mail.push((i, to.0 as usize, m)),
                    _ => {}
                }
            }
        }
        if mail.is_empty() {
            return proposals;
        }
        for (from, to, m) in mail {
            if to == (from + 1) % 4
                && let Some(p) = compact(&vs[from], &m)
            {
                proposals.push(p);
            }
            vs[to].handle_message(now, ValidatorIndex(from as u16), m);
        }
    }
}

/// A compact proposal's header and ids (those of a proposal by runs, from its leader `v`).
fn compact(v: &Validator, m: &Message) -> Option<(Block, Vec<Digest>)> {
    let Message::Authenticated { inner, .. } = m else { return None };
    match &**inner {
        Signed::ProposeIds { block, ids, .. } => Some((block.clone(), ids.clone())),
        Signed::ProposeRefs { block, vote, .. } => Some((block.clone(), (*v.blocks.get(&vote.digest)?.ids).clone())),
        _ => None,
    }
}

/// Everything a validator sent since last asked: (broadcast?, recipient, message).
fn sent(v: &mut Validator) -> Vec<Message> {
    let mut out = Vec::new();
    while let Some(o) = v.poll_output() {
        if let Output::Broadcast(m) | Output::Send(_, m) = o {
            out.push(m);
        }
    }
    out
}

fn gossip_in(ms: &[Message]) -> Vec<EventBytes> {
    ms.iter().filter_map(|m| if let Message::Events(es) = m { Some(es.clone()) } else { None }).flatten().collect()
}

/// Four validators with view 1 proposed and voted for by one follower only, `f`, for whom it
/// is then in flight: (validators, leader, f, another follower, the proposal, f's vote).
fn in_flight_at_one() -> (Vec<Validator>, usize, usize, usize, Message, Vec<Message>) {
    let mut vs = four();
    run(&mut vs, 0);
    let lead = vs[0].leader(View(1)).0 as usize;
    let (f, g) = ((lead + 1) % 4, (lead + 2) % 4);
    vs[lead].handle_timeout(PERIOD);
    let proposal = sent(&mut vs[lead]);
    assert_eq!(proposal.len(), 1, "view 1 proposed");
    assert!(!vs[f].busy());
    vs[f].handle_message(PERIOD, ValidatorIndex(lead as u16), proposal[0].clone());
    let vote = sent(&mut vs[f]);
    assert!(vs[f].busy(), "voted for view 1, not finalized");
    (vs, lead, f, g, proposal[0].clone(), vote)
}

/// While a view it voted for is in flight, a validator holds back taking in events (a
/// peer's gossip, its clients'): they are pooled, and its clients' passed on, a
/// thirty-second of a period after the view is finalized, or at the latest an eighth of a
/// period after they came.
#[test]
fn events_wait_while_a_view_is_in_flight_and_are_pooled_after_it_is_finalized_or_after_max_hold() {
    let ev = |s: &str| -> EventBytes { s.as_bytes().into() };
    for finalize in [true, false] {
        let (mut vs, lead, f, g, proposal, vote) = in_flight_at_one();
        let before = vs[f].pool_len();
        vs[f].handle_message(PERIOD + 1, ValidatorIndex(g as u16), Message::Events(vec![ev("gossiped")]));
        vs[f].submit_events(PERIOD + 2, vec![ev("client")]);
        assert_eq!(vs[f].pool_len(), before, "held");
        assert!(gossip_in(&sent(&mut vs[f])).is_empty(), "not passed on yet");
        let max_hold = PERIOD / 8;
        assert_eq!(vs[f].bulk_due, Some(PERIOD + 1 + max_hold), "due at the latest max_hold after");
        assert!(vs[f].poll_timeout().is_some_and(|t| t <= PERIOD + 1 + max_hold));
        if finalize {
            // The others get the proposal and f's vote: view 1 is finalized everywhere.
            let now = PERIOD + 3;
            for (_, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != lead && *i != f) {
                v.handle_message(now, ValidatorIndex(lead as u16), proposal.clone());
            }
            for (_, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != f) {
                for m in &vote {
                    v.handle_message(now, ValidatorIndex(f as u16), m.clone());
                }
            }
            run(&mut vs, now);
            assert!(vs[f].finalized.contains_key(&View(1)) && !vs[f].busy());
            // Done after_final later (the others may still be finalizing), its client's
            // event passed on.
            let after_final = PERIOD / 32;
            assert_eq!(vs[f].bulk_due, Some(now + after_final), "due after_final after the finalization");
            run(&mut vs, now + after_final - 1);
            assert_eq!(vs[f].pool_len(), before, "not yet");
            run(&mut vs, now + after_final);
            assert!(vs[g].pool.get(&event_id(b"client")).is_some(), "passed on once pooled");
        } else {
            vs[f].handle_timeout(PERIOD + 1 + max_hold - 1);
            assert_eq!(vs[f].pool_len(), before, "not yet");
            vs[f].handle_timeout(PERIOD + 1 + max_hold);
            assert!(vs[f].busy(), "view 1 still in flight");
            assert_eq!(gossip_in(&sent(&mut vs[f])), vec![ev("client")]);
        }
        assert_eq!(vs[f].pool_len(), before + 2, "both pooled");
        assert!(vs[f].bulk.is_empty() && vs[f].bulk_due.is_none());
    }
}

/// A validator holds back no more events than its pool takes: a peer flooding it with
/// gossip while a view is in flight has them pooled (and bounded) at once.
#[test]
fn held_events_beyond_what_the_pool_takes_are_pooled_at_once() {
    let (mut vs, _, f, g, ..) = in_flight_at_one();
    vs[f].cfg.max_pool_events = 5;
    let batch = |k: u32| Message::Events((0..3).map(|i| format!("flood {k} {i}").into_bytes().into()).collect());
    vs[f].handle_message(PERIOD + 1, ValidatorIndex(g as u16), batch(0));
    assert_eq!((vs[f].bulk.len(), vs[f].pool_len()), (1, 0), "3 held");
    vs[f].handle_message(PERIOD + 2, ValidatorIndex(g as u16), batch(1));
    assert!(vs[f].bulk.is_empty(), "6 held would be more than the pool takes");
    assert_eq!(vs[f].pool_len(), 5, "pooled up to its bound");
    assert!(vs[f].busy());
}

/// [`run`] with every message to `skip` kept back (and returned) instead of delivered.
fn run_but(vs: &mut [Validator], now: Micros, skip: usize) -> Vec<Message> {
    for (i, v) in vs.iter_mut().enumerate() {
        if i != skip && v.poll_timeout().is_some_and(|t| t <= now) {
            v.handle_timeout(now);
        }
    }
    let mut kept = Vec::new();
    loop {
        let mut mail = Vec::new();
        for (i, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != skip) {
            for m in sent(v) {
                mail.extend((0..4).filter(|j| *j != i).map(|j| (i, j, m.clone())));
            }
        }
        if mail.is_empty() {
            return kept;
        }
        for (from, to, m) in mail {
            if to == skip {
                kept.push(m);
            } else {
                vs[to].handle_message(now, ValidatorIndex(from as u16), m);
            }
        }
    }
}

/// A compact proposal naming events this validator holds back (gossip that came while its
/// last view was in flight) is rebuilt at once: the held events are pooled first, and it
/// votes without waiting for a fetch.
#[test]
fn a_compact_proposal_of_held_events_takes_them_in_and_is_voted_for_at_once() {
    let mut vs = four();
    run(&mut vs, 0);
    let lead1 = vs[0].leader(View(1)).0 as usize;
    let lead2 = vs[0].leader(View(2)).0 as usize;
    let f = (0..4).find(|i| *i != lead1 && *i != lead2).expect("a follower of both");
    let g = (0..4).find(|i| *i != lead1 && *i != lead2 && *i != f).expect("another");
    // f votes for view 1; the event a client gives g reaches f while that view is in flight.
    vs[lead1].handle_timeout(PERIOD);
    let p1 = sent(&mut vs[lead1]);
    vs[f].handle_message(PERIOD, ValidatorIndex(lead1 as u16), p1[0].clone());
    let f_vote = sent(&mut vs[f]);
    vs[g].submit_events(PERIOD + 1, vec![b"held".to_vec()]);
    let gossip = sent(&mut vs[g]);
    vs[f].handle_message(PERIOD + 1, ValidatorIndex(g as u16), gossip[0].clone());
    assert_eq!(vs[f].bulk.len(), 1, "held");
    for (i, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != f && *i != g) {
        v.handle_message(PERIOD + 1, ValidatorIndex(g as u16), gossip[0].clone());
        if i != lead1 {
            v.handle_message(PERIOD + 1, ValidatorIndex(lead1 as u16), p1[0].clone());
        }
    }
    vs[g].handle_message(PERIOD + 1, ValidatorIndex(lead1 as u16), p1[0].clone());
    for (_, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != f) {
        v.handle_message(PERIOD + 1, ValidatorIndex(f as u16), f_vote[0].clone());
    }
    // The others finalize view 1; f sees its notarization only, and enters view 2 with view
    // 1 still in flight.
    let to_f = run_but(&mut vs, PERIOD + 1, f);
    for m in to_f.iter().filter(|m| m.vote().is_some_and(|v| v.kind == VoteKind::Notarize && v.view == View(1))) {
        let from = m.vote().expect("a vote").signer;
        vs[f].handle_message(PERIOD + 2, from, m.clone());
    }
    assert_eq!(vs[f].view(), View(2));
    assert!(vs[f].busy() && !vs[f].bulk.is_empty());
    let _ = sent(&mut vs[f]);
    // View 2's leader proposes the held event (pooled there a period before).
    let to_f = run_but(&mut vs, 2 * PERIOD, f);
    let lead2 = vs[0].leader(View(2)).0 as usize;
    let p2 = to_f.iter().find(|m| compact(&vs[lead2], m).is_some()).expect("view 2 proposed");
    let (_, ids) = compact(&vs[lead2], p2).expect("compact");
    assert_eq!(ids, vec![event_id(b"held")]);
    // Named as a run of the gossip batch it came in, which f holds back.
    let Message::Authenticated { inner, .. } = p2 else { unreachable!() };
    assert!(
        matches!(&**inner, Signed::ProposeRefs { pieces, .. } if matches!(pieces[..], [Piece::Run { len: 1, .. }]))
    );
    // f takes it before the held work is due.
    assert!(vs[f].bulk_due.is_some_and(|due| PERIOD + 3 < due));
    vs[f].handle_message(PERIOD + 3, ValidatorIndex(lead2 as u16), p2.clone());
    assert!(vs[f].bulk.is_empty() && vs[f].incomplete.is_empty() && vs[f].fetching.is_empty());
    let votes: Vec<Vote> = sent(&mut vs[f]).iter().filter_map(|m| m.vote().cloned()).collect();
    assert!(votes.iter().any(|v| v.kind == VoteKind::Notarize && v.view == View(2)), "voted for view 2");
}

/// A leader proposes the events pooled at least a sixteenth of a period before: later ones
/// wait for the next block, so that the others have their gossip when its compact
/// proposal comes and need not wait for it to vote.
#[test]
fn a_leader_leaves_events_pooled_in_the_last_sixteenth_of_a_period_to_the_next_block() {
    let ev = |s: &str| s.as_bytes().to_vec();
    let mut vs = four();
    run(&mut vs, 0);
    let lead = vs[0].leader(View(1)).0 as usize;
    let fresh_by = PERIOD - PERIOD / 16;
    vs[lead].submit_events(fresh_by, vec![ev("old enough")]);
    vs[lead].submit_events(fresh_by + 1, vec![ev("fresh")]);
    run(&mut vs, fresh_by + 1);
    let p1 = run(&mut vs, PERIOD);
    assert_eq!(p1.len(), 1, "view 1 proposed");
    assert_eq!(p1[0].1, vec![event_id(b"old enough")]);
    let p2 = run(&mut vs, 2 * PERIOD);
    assert_eq!(p2.len(), 1, "view 2 proposed, by another leader");
    assert_ne!(p2[0].0.leader.0 as usize, lead);
    assert_eq!(p2[0].1, vec![event_id(b"fresh")]);
}

/// A validator that timed out its view alone (no peer heard it) and was restored counts its
/// own nullify vote again: with one validator down, the view needs it and both others'.
#[test]
fn a_restored_validator_counts_its_own_votes_and_describes_where_it_stands() {
    let mut vs = four();
    let v = &mut vs[2]; // not view 1's leader
    let view = v.view;
    v.handle_timeout(10_000_001);
    while v.poll_output().is_some() {}
    let mine = format!("view {}: mine .X., certs ..., proposal no, votes n[] x1 f0", view.0);
    let said = v.describe();
    assert!(said.starts_with(&format!("view {} (leader {}, chosen ", view.0, v.leader(view).0)), "{said}");
    assert!(said.contains(&mine), "{said}");
    let restored = Validator::restore(v.cfg.clone(), v.key.clone(), v.keys.clone(), 20_000_000, &v.persist())
        .expect("its own state");
    let said = restored.describe();
    assert!(said.contains(&mine), "restored without its own vote counted: {said}");
    assert_eq!(restored.views[&view].nullify.keys().copied().collect::<Vec<_>>(), vec![ValidatorIndex(2)]);
}

#[test]
fn a_leader_builds_its_next_batch_as_events_arrive_and_proposes_it_without_its_parents_events() {
    let mut vs = four();
    let ev = |s: &str| s.as_bytes().to_vec();
    let first: Vec<Vec<u8>> = (0..3).map(|i| ev(&format!("first {i}"))).collect();
    vs[1].submit_events(0, first.clone());
    run(&mut vs, 0);
    // View 1 is proposed and notarized: view 2's leader knows its parent and starts its batch
    // at its next input, without view 1's events (pooled, not committed yet).
    let p1 = run(&mut vs, PERIOD);
    assert_eq!(p1.len(), 1, "view 1 proposed");
    assert_eq!(p1[0].1, first.iter().map(|e| event_id(e)).collect::<Vec<_>>());
    let lead2 = vs[0].leader(View(2)).0 as usize;
    let second: Vec<Vec<u8>> = (0..5).map(|i| ev(&format!("second {i}"))).collect();
    // Not in the first eighth of the view (the others are still finalizing view 1 then).
    let later = PERIOD + PERIOD / 8;
    vs[lead2].submit_events(PERIOD + 1, Vec::<Vec<u8>>::new());
    assert!(vs[lead2].prepared.is_none(), "no batch started while view 1 is being finalized");
    // Two events arrive at another validator (gossiped to the leader), then three more and a
    // late copy of one of view 1's events at the leader itself.
    vs[(lead2 + 1) % 4].submit_events(later, second[..2].to_vec());
    run(&mut vs, later);
    let prepared = vs[lead2].prepared.as_ref().expect("the leader started its next batch");
    assert_eq!(prepared.batch.events.len(), 2);
    let mut more = second[2..].to_vec();
    more.push(first[1].clone());
    vs[lead2].submit_events(later + 1, more);
    assert_eq!(vs[lead2].prepared.as_ref().expect("still").batch.events.len(), 5);
    // The proposal is the prepared batch, taken whole.
    let p2 = run(&mut vs, 2 * PERIOD);
    assert!(vs[lead2].prepared.is_none(), "taken by the proposal");
    assert_eq!(p2.len(), 1, "view 2 proposed");
    assert_eq!(p2[0].0.view, View(2));
    assert_eq!(p2[0].1, second.iter().map(|e| event_id(e)).collect::<Vec<_>>());
    // And what the pool would give for that parent is the same.
    let (_, exclude) = vs[lead2].uncommitted(&p2[0].0.parent);
    let exclude: Vec<&[Digest]> = exclude.iter().map(|l| l.as_slice()).collect();
    assert_eq!(vs[lead2].pool.batch(1_000, 1 << 20, &exclude).ids, p2[0].1);
}

/// A leader names its events as runs of the gossip batches they came in while those are
/// recent, and by id once a batch is older than the newest half of what it keeps (the
/// others may have dropped it); the others rebuild the block either way.
#[test]
fn a_leader_names_events_of_old_batches_by_id_and_of_recent_ones_by_runs() {
    let mut vs = four();
    for v in &mut vs {
        // Blocks of 4 events; batches kept up to 16 events, named while within the newest 8.
        v.cfg.max_batch_events = 4;
        v.pool = Pool::with_batches(&[9; 32], 16, 1 << 20);
    }
    let lead = vs[0].leader(View(1)).0 as usize;
    let ev = |s: String| s.into_bytes();
    // Batch A (3 events), then three batches of 3 after it: 9 events stored after A, so A
    // is no longer recent; 6 or fewer after each of the others.
    vs[lead].submit_events(0, (0..3).map(|i| ev(format!("a {i}"))).collect());
    for k in 0..3 {
        vs[(lead + 1 + k % 3) % 4].submit_events(0, (0..3).map(|i| ev(format!("b{k} {i}"))).collect());
    }
    run(&mut vs, 0);
    // The leader's proposal, as sent.
    vs[lead].handle_timeout(PERIOD);
    let out = sent(&mut vs[lead]);
    let proposal = out.iter().find(|m| m.kind() == "propose").expect("view 1 proposed").clone();
    let Message::Authenticated { inner, .. } = &proposal else { panic!("authenticated") };
    let Signed::ProposeRefs { pieces, vote, .. } = &**inner else { panic!("by refs: {inner:?}") };
    let a: Vec<Digest> = (0..3).map(|i| event_id(format!("a {i}").as_bytes())).collect();
    assert!(matches!(&pieces[..], [Piece::Ids(ids), Piece::Run { len: 1, .. }] if *ids == a), "{pieces:?}");
    for m in out {
        for j in (0..4).filter(|j| *j != lead) {
            vs[j].handle_message(PERIOD, ValidatorIndex(lead as u16), m.clone());
        }
    }
    run(&mut vs, PERIOD);
    for (i, v) in vs.iter().enumerate() {
        assert!(v.finalized.values().any(|c| c.digest == vote.digest), "validator {i} finalized it");
    }
}

/// Where a validator pools events (off the commit's path) it makes room for the next
/// proposal's ids and events, as many as the recent blocks held and an eighth more, and a
/// follower rebuilds the compact proposal into it; a proposal larger than the room gets
/// memory of its own, and the room stays.
#[test]
fn a_follower_rebuilds_a_compact_proposal_into_room_made_before_it_came() {
    let mut vs = four();
    let ev = |s: String| s.into_bytes();
    // Tick 1: 16 events, four batches of four.
    for (k, v) in vs.iter_mut().enumerate() {
        v.submit_events(0, (0..4).map(|i| ev(format!("one {k} {i}"))).collect());
    }
    run(&mut vs, 0);
    assert!(vs.iter().all(|v| v.spare.ids.capacity() == 0), "no room before a block held events");
    let mut proposed = run(&mut vs, PERIOD);
    assert_eq!(proposed.pop().map(|(_, ids)| ids.len()), Some(16));
    // Tick 2's events: pooled, and the room made.
    for (k, v) in vs.iter_mut().enumerate() {
        v.submit_events(PERIOD + 10, (0..4).map(|i| ev(format!("two {k} {i}"))).collect());
    }
    run(&mut vs, PERIOD + 10);
    for v in &vs {
        assert_eq!((v.spare.ids.capacity(), v.spare.events.capacity()), (18, 18), "16 and an eighth");
    }
    let lead = vs[0].leader(vs[0].view()).0 as usize;
    vs[lead].handle_timeout(2 * PERIOD);
    let out = sent(&mut vs[lead]);
    let proposal = out.iter().find(|m| m.kind() == "propose").expect("view 2 proposed").clone();
    let digest = proposal.vote().expect("the leader's vote").digest;
    let f = (lead + 1) % 4;
    vs[f].handle_message(2 * PERIOD, ValidatorIndex(lead as u16), proposal.clone());
    let stored = vs[f].blocks.get(&digest).expect("rebuilt");
    assert_eq!(stored.ids.len(), 16);
    assert_eq!((stored.ids.capacity(), stored.block.events.capacity()), (18, 18), "in the room");
    assert_eq!(vs[f].spare.ids.capacity(), 0, "taken");
    // A proposal larger than the room: rebuilt all the same, and the next room is made.
    let g = (lead + 2) % 4;
    vs[g].spare = Spare::with_room(8);
    vs[g].handle_message(2 * PERIOD, ValidatorIndex(lead as u16), proposal.clone());
    let stored = vs[g].blocks.get(&digest).expect("rebuilt");
    assert_eq!(stored.ids.len(), 16);
    assert_eq!(vs[g].spare.ids.capacity(), 8, "the room stays");
    // f's next events wait while its view is in flight, and are pooled (the room made) once
    // the view is finalized.
    vs[f].submit_events(2 * PERIOD + 10, vec![ev("three".to_string())]);
    assert_eq!(vs[f].spare.ids.capacity(), 0, "not while the view is in flight");
    for j in (0..4).filter(|j| *j != lead && *j != f && *j != g) {
        vs[j].handle_message(2 * PERIOD + 10, ValidatorIndex(lead as u16), proposal.clone());
    }
    run(&mut vs, 2 * PERIOD + 10);
    assert!(vs[f].finalized.values().any(|c| c.digest == digest));
    run(&mut vs, 2 * PERIOD + 10 + PERIOD / 32);
    assert_eq!(vs[f].spare.ids.capacity(), 18, "made again");
}

#[test]
fn committed_blocks_are_kept_for_keep_blocks_ticks_then_dropped() {
    const KEEP: u64 = 8;
    let mut vs = four();
    for v in &mut vs {
        v.cfg.keep_blocks = KEEP;
    }
    let mut proposed = 0;
    for k in 0..40u64 {
        vs[(k % 4) as usize].submit_events(k * PERIOD, vec![format!("event {k}").into_bytes()]);
        proposed += run(&mut vs, k * PERIOD).len();
    }
    assert!(proposed >= 38, "the chain went on: {proposed} proposals");
    for v in &vs {
        let out = v.output_tick.expect("ticks were output").0;
        assert!(out >= 30, "output up to tick {out}");
        let ticks: Vec<u64> = v.blocks.values().map(|s| s.block.tick.0).collect();
        let index: Vec<u64> = v.blocks.by_tick.iter().map(|(t, _)| t.0).collect();
        assert_eq!(v.blocks.by_tick.len(), v.blocks.len(), "one index entry per block");
        assert!(v.blocks.by_tick.iter().all(|(t, d)| v.blocks[d].block.tick == *t));
        // Every block from `keep_blocks` below the output tick up is kept; none older.
        let oldest = *index.first().expect("blocks are kept");
        assert_eq!(oldest, out - KEEP, "{ticks:?}");
        assert!((oldest..=out).all(|t| ticks.contains(&t)), "{ticks:?}");
        assert!(v.blocks.len() as u64 <= KEEP + 4, "{} blocks held", v.blocks.len());
    }
}

#[test]
fn a_restored_validator_recalls_the_blocks_it_handed_out_from_its_commit_log() {
    let mut vs = four();
    for k in 0..30u64 {
        vs[(k % 4) as usize].submit_events(k * PERIOD, vec![format!("event {k}").into_bytes()]);
        run(&mut vs, k * PERIOD);
    }
    let v = &vs[0];
    let out = v.output_tick.expect("ticks were output").0;
    assert!(out >= 20, "output up to tick {out}");
    // The chain as a commit log holds it: each block with the notarization its child carries.
    let at = |t: u64| {
        let (_, d) = v.blocks.by_tick.iter().find(|(tick, _)| tick.0 == t).expect("one block a tick");
        (*v.blocks[d].block).clone()
    };
    let chain: Vec<Block> = (0..=out + 1).map(at).collect();
    let log: Vec<Logged> = chain
        .windows(2)
        .map(|w| Logged {
            tick: w[0].tick,
            time_ms: w[0].time_ms,
            events: w[0].events.clone(),
            notarization: w[1].parent_certificate.clone().expect("a notarized parent"),
            opener: None,
        })
        .collect();
    let key = SigningKey::from_bytes(&[1; 32]);
    let restore = || Validator::restore(v.cfg.clone(), key.clone(), v.keys.clone(), 0, &v.persist()).unwrap();

    let mut r = restore();
    // Restored, it holds only the blocks not handed out before (from the output tick on).
    assert!(chain[..out as usize].iter().all(|b| !r.blocks.contains_key(&b.digest())));
    assert_eq!(r.recall(log.clone()), out as usize, "every block below the output tick");
    for b in &chain {
        assert_eq!(r.blocks.get(&b.digest()).map(|s| &*s.block), Some(b), "tick {}", b.tick);
    }
    // It answers a fetch of the oldest, as before the restart.
    r.handle_message(0, ValidatorIndex(1), Message::Fetch(chain[0].digest()));
    let answer = std::iter::from_fn(|| r.poll_output()).find_map(|o| match o {
        Output::Send(ValidatorIndex(1), Message::Block { block, .. }) => Some(block),
        _ => None,
    });
    assert_eq!(answer.as_ref(), Some(&chain[0]));

    // A record that does not hash to its notarization is not kept, nor one whose parent's
    // record is missing (its parent's notarization is unknown); the others are.
    let mut r = restore();
    let mut bad = log.clone();
    bad[5].events.push(EventBytes::from(&b"not what was committed"[..]));
    bad.remove(10);
    assert_eq!(r.recall(bad), out as usize - 3);
    let has = |t: usize| r.blocks.contains_key(&chain[t].digest());
    assert!(!has(5) && !has(10) && !has(11), "a forged record, a missing one and the one after it");
    assert!(has(4) && has(6) && has(9) && has(12));
    // Only the newest `keep_blocks` are kept.
    let mut r = restore();
    r.cfg.keep_blocks = 8;
    assert_eq!(r.recall(log), 8);
    assert!((out - 8..=out).all(|t| r.blocks.contains_key(&chain[t as usize].digest())));
}

#[test]
fn committed_blocks_are_dropped_oldest_first_beyond_keep_bytes_but_the_newest_are_kept() {
    const KEEP: u64 = 120;
    const MIN: u64 = 40;
    // A tight budget holds the newest `keep_blocks_min` whatever their size; a looser one
    // as many of the newest as fit.
    for budget in [1, 100 * 1_600] {
        let mut vs = four();
        for v in &mut vs {
            v.cfg.keep_blocks = KEEP;
            v.cfg.keep_bytes = budget;
            v.cfg.keep_blocks_min = MIN;
        }
        for k in 0..160u64 {
            vs[(k % 4) as usize].submit_events(k * PERIOD, vec![vec![k as u8; 1_000]]);
            run(&mut vs, k * PERIOD);
        }
        for v in &vs {
            let out = v.output_tick.expect("ticks were output").0;
            assert!(out >= 150, "output up to tick {out}");
            let held: u64 = v.blocks.values().map(|s| s.bytes).sum();
            assert_eq!(v.blocks.bytes, held, "the running total is the blocks' sum");
            let ticks: Vec<u64> = v.blocks.values().map(|s| s.block.tick.0).collect();
            let oldest = v.blocks.by_tick.first().expect("blocks are kept").0.0;
            assert!((oldest..=out).all(|t| ticks.contains(&t)), "the newest are kept without gaps: {ticks:?}");
            assert!(oldest <= out - MIN, "the newest {MIN} are kept: {oldest}..{out}");
            assert!(oldest > out - KEEP, "the budget dropped blocks that keep_blocks would keep: {oldest}..{out}");
            if budget == 1 {
                assert_eq!(oldest, out - MIN);
            } else {
                // Within the budget, and short of it by less than one more block's size.
                let up_to_out: u64 = v.blocks.values().filter(|s| s.block.tick.0 <= out).map(|s| s.bytes).sum();
                assert!(up_to_out <= budget, "{up_to_out} bytes held up to the output tick");
                assert!(v.blocks.bytes + 4 * 1_064 + 512 > budget, "{} bytes held, more fit", v.blocks.bytes);
            }
        }
    }
}

/// The blocks beyond the budget are dropped with the held bulk work, not by the input
/// that commits (freeing a big block's events is slow, and that input can be on the
/// commit's path: the one that finalizes).
#[test]
fn blocks_beyond_the_budget_are_dropped_with_the_bulk_work_not_by_the_committing_input() {
    const MIN: u64 = 3;
    let mut vs = four();
    for v in &mut vs {
        (v.cfg.keep_bytes, v.cfg.keep_blocks_min) = (1, MIN);
    }
    let mut now = 0;
    for k in 0..12u64 {
        now = k * PERIOD;
        vs[(k % 4) as usize].submit_events(now, vec![vec![k as u8; 1_000]]);
        run(&mut vs, now);
    }
    let oldest = |v: &Validator| v.blocks.by_tick.first().expect("blocks are kept").0.0;
    for v in &mut vs {
        let out = v.output_tick.expect("ticks were output").0;
        assert!(out >= 8, "output up to tick {out}");
        assert_eq!(oldest(v), out - MIN, "pruned to the budget");
        // The last finalization commits once its votes' signatures are checked (a timer).
        let mut at = now;
        while v.output_tick == Some(Tick(out)) {
            at = v.poll_timeout().expect("the last finalization's commit is due");
            assert!(at < now + PERIOD, "committed before the next view");
            v.handle_timeout(at);
        }
        let committed = v.output_tick.expect("output").0;
        assert!(committed > out);
        assert_eq!(oldest(v), out - MIN, "the committing input drops nothing");
        assert_eq!(v.bulk_due, Some(at), "the bulk work is due at once");
        v.handle_timeout(at);
        assert_eq!(oldest(v), committed - MIN, "dropped with the bulk work");
        assert!(v.bulk_due.is_none() && v.settle_later.is_empty());
    }
}

#[test]
fn distinct_ids_are_told_from_repeats_also_when_their_first_bytes_agree() {
    let id = |head: u8, tail: u8| {
        let mut d = [tail; 32];
        d[..8].fill(head);
        Digest(d)
    };
    let many: Vec<Digest> = (0..200u8).map(|i| id(i, i)).collect();
    assert!(all_distinct(&many));
    assert!(all_distinct(&[]));
    // Same first 8 bytes, different rest: distinct (the slow path).
    assert!(all_distinct(&[id(1, 2), id(1, 3), id(4, 4)]));
    // A true repeat, found on either path.
    assert!(!all_distinct(&[id(1, 2), id(5, 5), id(1, 2)]));
    let mut repeat = many.clone();
    repeat.push(many[77]);
    assert!(!all_distinct(&repeat));
    // Ids ground to crowd one bucket (distinct first 8 bytes that the table's multiplier
    // maps to one slot): the probes run out, and sorting decides.
    let c = 0x9E37_79B9_7F4A_7C15_u64;
    let inverse = (0..6).fold(c, |x: u64, _| x.wrapping_mul(2u64.wrapping_sub(c.wrapping_mul(x))));
    assert_eq!(c.wrapping_mul(inverse), 1);
    let crowd = |k: u8| {
        let mut d = [k; 32];
        d[..8].copy_from_slice(&(2 * u64::from(k)).wrapping_mul(inverse).to_le_bytes());
        Digest(d)
    };
    let crowded: Vec<Digest> = (0..100u8).map(crowd).collect();
    assert!(all_distinct(&crowded));
    let mut crowded_repeat = crowded.clone();
    crowded_repeat.insert(40, crowded[90]);
    assert!(!all_distinct(&crowded_repeat));
    // Many random ids, distinct, and with one repeated.
    let random: Vec<Digest> = (0..2_000u32).map(|i| event_id(&i.to_le_bytes())).collect();
    assert!(all_distinct(&random));
    let mut random_repeat = random.clone();
    random_repeat.push(random[1_234]);
    assert!(!all_distinct(&random_repeat));
}

/// A compact proposal naming a gossip batch this validator never got (lost on the way) shows
/// its leader alive: the view waits for it as long as for a notarization, not the leader
/// timeout, so the batch (or the block, fetched: a round trip, which on a long path outlasts
/// the leader timeout) still comes in time to vote. Found by `latency-100ms-crash` (100 ms
/// one way, 1 % loss, one validator of four dead so every live vote is needed): 16–19 seeds of
/// 100 failed views of live leaders this way.
#[test]
fn a_compact_proposal_waiting_for_a_lost_batch_keeps_its_view_past_the_leader_timeout() {
    let mut vs = four();
    run(&mut vs, 0);
    let lead = vs[0].leader(View(1)).0 as usize;
    let (f, g) = ((lead + 1) % 4, (lead + 2) % 4);
    // g's gossip reaches everyone but f.
    vs[g].submit_events(1, vec![b"lost on the way to f".to_vec()]);
    let gossip = sent(&mut vs[g]);
    assert!(!gossip_in(&gossip).is_empty());
    for (_, v) in vs.iter_mut().enumerate().filter(|(i, _)| *i != f && *i != g) {
        for m in &gossip {
            v.handle_message(1, ValidatorIndex(g as u16), m.clone());
        }
    }
    vs[lead].handle_timeout(PERIOD);
    let proposal = sent(&mut vs[lead]);
    let (_, ids) = compact(&vs[lead], &proposal[0]).expect("a compact proposal");
    assert_eq!(ids, vec![event_id(b"lost on the way to f")]);
    vs[f].handle_message(PERIOD, ValidatorIndex(lead as u16), proposal[0].clone());
    assert_eq!(vs[f].incomplete.len(), 1, "waiting for the batch");
    let votes = |ms: &[Message], kind: VoteKind| ms.iter().filter_map(Message::vote).any(|v| v.kind == kind);
    // Past the leader timeout (the fetch it sent went unanswered): no nullify.
    let leader_timeout = vs[f].cfg.leader_timeout_us;
    let past = leader_timeout + PERIOD;
    vs[f].handle_timeout(past);
    let out = sent(&mut vs[f]);
    assert!(!votes(&out, VoteKind::Nullify), "a view whose leader was heard from waits longer");
    // The batch comes late (the transport sent it again): f votes for the proposal.
    for m in &gossip {
        vs[f].handle_message(past + 1, ValidatorIndex(g as u16), m.clone());
    }
    vs[f].handle_timeout(past + PERIOD);
    let out = sent(&mut vs[f]);
    assert!(votes(&out, VoteKind::Notarize), "voted once the batch came");
    assert!(vs[f].incomplete.is_empty());
}

/// R1 fills: with `fill_lead_us` on, ticks are opened by empty blocks and filled by blocks of
/// the same tick with the events; each event is in one block; a fill must extend an empty block
/// and carry events (voters refuse others); a restored validator rebuilds both blocks of a
/// filled tick from its commit log.
#[test]
fn a_tick_opened_empty_is_filled_once_and_recalled_whole() {
    let mut vs = four();
    for v in vs.iter_mut() {
        v.cfg.fill_lead_us = 5_000;
    }
    for ms in 0..2_000u64 {
        if ms % 10 == 0 {
            vs[((ms / 10) % 4) as usize].submit_events(ms * 1_000, vec![format!("event {ms}").into_bytes()]);
        }
        run(&mut vs, ms * 1_000);
    }
    let v = &vs[0];
    let out = v.output_tick.expect("ticks were output").0;
    assert!(out >= 30, "output up to tick {out}");
    let of_tick = |t: u64| -> Vec<Block> {
        let mut bs: Vec<Block> = v
            .blocks
            .by_tick
            .iter()
            .filter(|(tick, _)| tick.0 == t)
            .map(|(_, d)| (*v.blocks[d].block).clone())
            .collect();
        bs.sort_by_key(|b| b.view);
        bs
    };
    let ticks: Vec<Vec<Block>> = (0..=out + 1).map(of_tick).collect();
    let filled: Vec<usize> = (0..=out as usize).filter(|&t| ticks[t].len() == 2).collect();
    assert!(filled.len() * 2 >= out as usize, "{} of {out} ticks filled", filled.len());
    for &t in &filled {
        let (opener, fill) = (&ticks[t][0], &ticks[t][1]);
        assert!(opener.events.is_empty() && !fill.events.is_empty(), "tick {t}");
        assert_eq!(fill.parent.digest, opener.digest(), "tick {t}: the fill extends its opener");
    }
    assert!(ticks.iter().all(|bs| bs.len() <= 2), "at most two blocks a tick");
    let events: Vec<&EventBytes> = ticks.iter().flatten().flat_map(|b| &b.events).collect();
    assert!(events.iter().enumerate().all(|(i, e)| !events[..i].contains(e)), "an event in two blocks");

    // Voters refuse a fill without events, and a block of its parent's tick after a fill.
    let t = filled[filled.len() / 2];
    let mut empty_fill = ticks[t][1].clone();
    empty_fill.events.clear();
    let far = 1_000_000_000;
    assert!(v.check_block(far, &ticks[t][1]).is_ok());
    assert!(matches!(v.check_block(far, &empty_fill), Err(ProposalError::BadTick { .. })));
    let mut fill_of_fill = ticks[t + 1][0].clone();
    assert_eq!(fill_of_fill.parent.digest, ticks[t][1].digest());
    fill_of_fill.tick = ticks[t][1].tick;
    fill_of_fill.events = vec![EventBytes::from(&b"one more"[..])];
    assert!(matches!(v.check_block(far, &fill_of_fill), Err(ProposalError::BadTick { .. })));

    // The commit log: a record a tick, naming the empty block that opened a filled one.
    let log: Vec<Logged> = (0..=out as usize)
        .map(|t| {
            let last = ticks[t].last().expect("a block a tick");
            Logged {
                tick: last.tick,
                time_ms: last.time_ms,
                events: last.events.clone(),
                notarization: ticks[t + 1][0].parent_certificate.clone().expect("a notarized parent"),
                opener: (ticks[t].len() == 2).then(|| Opener {
                    time_ms: ticks[t][0].time_ms,
                    notarization: last.parent_certificate.clone().expect("a notarized opener"),
                }),
            }
        })
        .collect();
    let key = SigningKey::from_bytes(&[1; 32]);
    let mut r = Validator::restore(v.cfg.clone(), key, v.keys.clone(), 0, &v.persist()).unwrap();
    let below: Vec<&Block> = ticks[..out as usize].iter().flatten().collect();
    assert!(below.iter().all(|b| !r.blocks.contains_key(&b.digest())));
    assert_eq!(r.recall(log), below.len(), "both blocks of every filled tick below the output tick");
    for b in ticks.iter().flatten() {
        assert_eq!(r.blocks.get(&b.digest()).map(|s| &*s.block), Some(b), "tick {}", b.tick);
    }
}
