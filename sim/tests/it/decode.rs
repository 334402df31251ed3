//! Bad input to every decoder of untrusted bytes: random, truncated, oversized and corrupted
//! bytes give errors, never a panic, never a silently different state.
use crate::common;

use metatopia_sim::codec::{self, DecodeError};
use metatopia_sim::genesis::{DemoSpec, EventGen, demo_world};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::rules::RuleHost;
use metatopia_sim::snapshot::{MAX_SNAPSHOT_BYTES, SNAPSHOT_VERSION};
use metatopia_sim::{Batch, SignedEvent, Sim, Snapshot, SnapshotError, VerifiedBatch};
use proptest::prelude::*;

const EVENT_MAX: u32 = 96 * 1024;

fn sample_events() -> Vec<SignedEvent> {
    let demo = demo_world(DemoSpec { seed: 4, objects: 50, players: 8, ..DemoSpec::default() });
    let mut g = EventGen::new(&demo, 4);
    g.batch(&demo.world, demo.world.tick(), 64).events
}

fn sample_snapshot() -> Vec<u8> {
    let demo = demo_world(DemoSpec { seed: 5, objects: 60, players: 6, ..DemoSpec::default() });
    let mut sim = common::sim_of(&demo, 1);
    let mut g = EventGen::new(&demo, 5);
    common::run(&mut sim, &mut g, 5, 10);
    sim.snapshot().encode()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let _ = SignedEvent::decode(&bytes, EVENT_MAX);
        let _ = codec::decode::<Batch>(&bytes, EVENT_MAX);
        if let Ok(s) = Snapshot::decode(&bytes, MAX_SNAPSHOT_BYTES) {
            // Whatever decodes must still be refused unless its root matches its content.
            let claimed = s.root;
            match Sim::restore(s, RuleHost::default(), KinematicPhysics::default(), 1) {
                Ok(mut sim) => prop_assert_eq!(sim.root(), claimed),
                Err(e) => {
                    let refused = matches!(e, SnapshotError::RootMismatch { .. } | SnapshotError::Invalid { .. });
                    prop_assert!(refused, "unexpected error {}", e);
                }
            }
        }
    }

    #[test]
    fn truncated_events_are_errors(i in 0usize..64, cut in 0usize..10_000) {
        let events = sample_events();
        let bytes = codec::encode(&events[i % events.len()]);
        let cut = cut % bytes.len();
        prop_assert!(SignedEvent::decode(&bytes[..cut], EVENT_MAX).is_err());
        prop_assert_eq!(SignedEvent::decode(&bytes, EVENT_MAX).ok(), Some(events[i % events.len()].clone()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn corrupted_snapshots_are_refused(pos in any::<usize>(), bit in 0u8..8) {
        let good = sample_snapshot();
        let mut bad = good.clone();
        let pos = pos % bad.len();
        bad[pos] ^= 1 << bit;
        let original_root = Snapshot::decode(&good, MAX_SNAPSHOT_BYTES).unwrap().root;
        match Snapshot::decode(&bad, MAX_SNAPSHOT_BYTES) {
            Err(_) => {}
            Ok(s) => match Sim::restore(s, RuleHost::default(), KinematicPhysics::default(), 1) {
                Err(_) => {}
                // Only a flip that decodes to the very same state may be accepted.
                Ok(mut sim) => prop_assert_eq!(sim.root(), original_root, "byte {} bit {} accepted", pos, bit),
            },
        }
    }

    #[test]
    fn truncated_snapshots_are_errors(cut in any::<usize>()) {
        let good = sample_snapshot();
        let cut = cut % good.len();
        prop_assert!(Snapshot::decode(&good[..cut], MAX_SNAPSHOT_BYTES).is_err());
    }
}

#[test]
fn oversized_inputs_are_refused_before_decoding() {
    let e = &sample_events()[0];
    let bytes = codec::encode(e);
    assert!(matches!(SignedEvent::decode(&bytes, 10), Err(DecodeError::TooLarge { max: 10, .. })));
    let snap = sample_snapshot();
    assert!(matches!(Snapshot::decode(&snap, 100), Err(SnapshotError::Decode(DecodeError::TooLarge { .. }))));
}

#[test]
fn a_tampered_snapshot_is_refused_with_a_clear_error() {
    let good = sample_snapshot();
    let mut s = Snapshot::decode(&good, MAX_SNAPSHOT_BYTES).unwrap();
    s.root.0[0] ^= 1;
    let err = Sim::restore(s, RuleHost::default(), KinematicPhysics::default(), 1).unwrap_err();
    assert!(matches!(err, SnapshotError::RootMismatch { .. }));
    assert!(err.to_string().contains("claims root"), "{err}");
    let mut wrong_version = good.clone();
    wrong_version[0] = 9;
    assert_eq!(
        Snapshot::decode(&wrong_version, MAX_SNAPSHOT_BYTES).unwrap_err(),
        SnapshotError::Version { got: 9, supported: SNAPSHOT_VERSION }
    );
}

#[test]
fn batches_of_garbage_events_do_not_stop_the_tick() {
    let demo = demo_world(DemoSpec { seed: 6, objects: 50, players: 8, ..DemoSpec::default() });
    let mut sim = common::sim_of(&demo, 2);
    let mut events = sample_events();
    for (i, e) in events.iter_mut().enumerate() {
        e.signature.0[i % 32] ^= 0x10;
    }
    let batch = Batch { tick: sim.world().tick(), time_ms: 0, seed: Default::default(), events };
    let r = sim.step(&VerifiedBatch::new(batch, 2)).unwrap();
    assert_eq!(r.accepted, 0);
    assert_eq!(r.rejected.len(), 64);
    assert!(r.rejected.iter().all(|x| x.reason == metatopia_sim::RejectReason::BadSignature));
}
