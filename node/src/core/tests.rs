//! The core's own duties, over an agreement the test plays.

use std::collections::VecDeque;

use metatopia_consensus::{
    Block, Certificate, Commit, Digest, Message, Micros, Output, Parent, Tick, ValidatorIndex, View, VoteKind,
};
use metatopia_scripting::RhaiHost;
use metatopia_sim::genesis::{DemoSpec, demo_world};
use metatopia_sim::{Sim, Snapshot};

use super::{Agreement, CoreOutput, NodeCore};
use crate::world::AnyPhysics;

/// An agreement that hands out the commits the test queued, all at once; the validators in
/// `reported` reported a root for every tick.
#[derive(Default)]
struct Queued(VecDeque<Output>, Vec<ValidatorIndex>);

impl Agreement for Queued {
    fn handle_message(&mut self, _: Micros, _: ValidatorIndex, _: Message) {}
    fn handle_timeout(&mut self, _: Micros) {}
    fn submit_events(&mut self, _: Micros, _: Vec<Vec<u8>>) {}
    fn poll_output(&mut self) -> Option<Output> {
        self.0.pop_front()
    }
    fn poll_timeout(&self) -> Option<Micros> {
        None
    }
    fn report_root(&mut self, _: Tick, _: Digest) {}
    fn validators(&self) -> usize {
        4
    }
    fn peer_roots(&self, _: Tick) -> Vec<(ValidatorIndex, Digest)> {
        self.1.iter().map(|v| (*v, Digest([0; 32]))).collect()
    }
}

/// An empty commit of `tick`, 50 ms of agreed time after the one before.
fn commit(tick: u64, start_ms: u64) -> Output {
    let certificate =
        Certificate { kind: VoteKind::Notarize, view: View(tick), digest: Digest([1; 32]), votes: Vec::new() };
    let block = Block {
        view: View(tick + 1),
        leader: ValidatorIndex(0),
        parent: Parent { view: View(tick), digest: Digest([0; 32]) },
        tick: Tick(tick),
        time_ms: start_ms + 50 * tick,
        events: Vec::new(),
        parent_certificate: None,
    };
    let finalization = certificate.clone();
    let seed = Digest([tick as u8; 32]);
    Output::Committed(Box::new(Commit {
        block,
        filler: false,
        digest: Digest([2; 32]),
        certificate,
        seed,
        finalization,
        opener: None,
    }))
}

/// A node's executions are deferred and can run several ticks in one go (commits that arrived
/// together); the snapshot must still be of the tick it is handed out for, a multiple of the
/// physics' full-hash interval, whose root covers every byte: any bit flipped in it is refused.
/// (Taken by the node's loop when it got to the tick's output, it held a later tick whose root
/// leaves the solver's caches out: in a real run 518 of 879 flips spread over one loaded.)
#[test]
fn a_snapshot_is_of_its_tick_even_when_several_ticks_execute_at_once_and_every_flipped_bit_is_refused() {
    let demo = demo_world(DemoSpec { objects: 120, players: 8, moving_per_mille: 500, ..DemoSpec::default() });
    let start_ms = demo.world.governance().genesis_ms;
    let sim = Sim::new(demo.world, RhaiHost::default(), AnyPhysics::of("rapier"), 1).unwrap();
    let every = metatopia_physics::region::FULL_ROOT_EVERY;
    let mut core = NodeCore::new(Queued::default(), sim, 1).defer_execution().snapshots_every(every);
    // Ten ticks at a time, across the snapshot's tick.
    let mut snapshots = Vec::new();
    let ticks = every + 16;
    for first in (0..ticks).step_by(10) {
        core.agreement_mut().0.extend((first..ticks.min(first + 10)).map(|t| commit(t, start_ms)));
        core.handle_timeout(1);
        core.execute_deferred(1);
        while let Some(o) = core.poll_output() {
            if let CoreOutput::Snapshot { tick, bytes } = o {
                snapshots.push((tick, bytes));
            }
        }
    }
    assert_eq!(core.sim().world().tick().0, ticks, "every commit executed");
    let [(tick, bytes)] = &snapshots[..] else { panic!("one snapshot, not {}", snapshots.len()) };
    assert_eq!(tick.0, every);
    let snap = Snapshot::decode(bytes, 1 << 30).unwrap();
    assert_eq!(snap.world.tick().0, every, "the snapshot handed out for tick {every} holds another tick");
    let restore = |b: &[u8]| {
        let s = Snapshot::decode(b, 1 << 30).map_err(|e| e.to_string())?;
        Sim::restore(s, RhaiHost::default(), AnyPhysics::of("rapier"), 1).map(|_| ()).map_err(|e| e.to_string())
    };
    restore(bytes).unwrap();
    let accepted: Vec<usize> = (0..bytes.len())
        .step_by(61)
        .filter(|&at| {
            let mut b = bytes.clone();
            b[at] ^= 0x40;
            restore(&b).is_ok()
        })
        .collect();
    assert!(accepted.is_empty(), "{} flipped bits loaded, at offsets {accepted:?} of {}", accepted.len(), bytes.len());
}

/// A node asked to stop after a tick executes nothing past it, says it waits for its peers,
/// and is told to stop once all four reported that tick's root and the linger passed; a node
/// without commits says so every ten seconds. On the core's clock, at a real-looking time.
#[test]
fn a_node_stops_after_its_last_tick_once_its_peers_executed_it_and_says_when_commits_stop() {
    use super::finish::{FINISH_LINGER_US, Finish, STALL_WARN_US};
    const T0: Micros = 1_764_000_000_000_000;
    let demo = demo_world(DemoSpec { objects: 20, players: 2, ..DemoSpec::default() });
    let start_ms = demo.world.governance().genesis_ms;
    let sim = Sim::new(demo.world, RhaiHost::default(), AnyPhysics::of("rapier"), 1).unwrap();
    // As the node runs it: execution deferred until the votes left.
    let mut core = NodeCore::new(Queued::default(), sim, 1).defer_execution().execute_until(Some(Tick(9)));
    core.agreement_mut().0.extend((0..12).map(|t| commit(t, start_ms)));
    let drain = |core: &mut NodeCore<Queued, _, _>| std::iter::from_fn(|| core.poll_output()).collect::<Vec<_>>();
    core.handle_timeout(T0);
    while core.has_deferred() {
        core.execute_deferred(T0);
    }
    let out = drain(&mut core);
    let executed: Vec<u64> = out
        .iter()
        .filter_map(|o| if let CoreOutput::Executed { tick, .. } = o { Some(tick.0) } else { None })
        .collect();
    assert_eq!(executed, (0..10).collect::<Vec<_>>(), "ticks 0-9 executed, none past the last");
    let said: Vec<&Finish> =
        out.iter().filter_map(|o| if let CoreOutput::Finishing(f) = o { Some(f) } else { None }).collect();
    assert_eq!(said, [&Finish::Waiting { tick: Tick(9) }]);
    // Three of four reported: still waiting, and no stall said while finishing.
    core.agreement_mut().1 = (0..3).map(ValidatorIndex).collect();
    core.handle_timeout(T0 + 2 * STALL_WARN_US);
    assert!(drain(&mut core).is_empty());
    // All four: leaving after the linger.
    core.agreement_mut().1 = (0..4).map(ValidatorIndex).collect();
    core.handle_timeout(T0 + 2 * STALL_WARN_US + 1);
    assert!(drain(&mut core).is_empty());
    let at = core.poll_timeout().expect("a wake-up for the linger's end");
    assert_eq!(at, T0 + 2 * STALL_WARN_US + 1 + FINISH_LINGER_US);
    core.handle_timeout(at);
    assert!(drain(&mut core).iter().any(|o| matches!(o, CoreOutput::Finishing(Finish::Done))));

    // No commit at all: said after ten seconds, and again after twenty.
    let demo = demo_world(DemoSpec { objects: 20, players: 2, ..DemoSpec::default() });
    let sim = Sim::new(demo.world, RhaiHost::default(), AnyPhysics::of("rapier"), 1).unwrap();
    let mut quiet = NodeCore::new(Queued::default(), sim, 1);
    quiet.handle_timeout(T0);
    assert_eq!(quiet.poll_timeout(), Some(T0 + STALL_WARN_US));
    for n in 1..=2 {
        quiet.handle_timeout(T0 + n * STALL_WARN_US);
        let stalls: Vec<u64> = drain(&mut quiet)
            .iter()
            .filter_map(|o| if let CoreOutput::Stalled { quiet_us, .. } = o { Some(*quiet_us) } else { None })
            .collect();
        assert_eq!(stalls, [n * STALL_WARN_US]);
    }
}
