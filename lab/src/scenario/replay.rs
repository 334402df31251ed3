//! Recordings checked: [`replay_verify`] and [`synctest`].

use metatopia_consensus::{Digest, Message, Micros, Output, ValidatorIndex};
use metatopia_scripting::RhaiHost;
use metatopia_sim::{Sim, Snapshot};

use metatopia_node::core::{Agreement, NodeCore};
use metatopia_node::world::AnyPhysics;

use crate::scenario::common::Recording;

/// Agreement for re-execution alone: nothing to agree on.
#[derive(Debug, Default)]
pub struct NoAgreement;

impl Agreement for NoAgreement {
    fn handle_message(&mut self, _: Micros, _: ValidatorIndex, _: Message) {}
    fn handle_timeout(&mut self, _: Micros) {}
    fn submit_events(&mut self, _: Micros, _: Vec<Vec<u8>>) {}
    fn poll_output(&mut self) -> Option<Output> {
        None
    }
    fn poll_timeout(&self) -> Option<Micros> {
        None
    }
    fn report_root(&mut self, _: metatopia_consensus::Tick, _: Digest) {}
    fn validators(&self) -> usize {
        4
    }
}

/// A recording's core, on its genesis time (where its accelerated time counts from).
fn replay_core(r: &Recording, sim: Sim<RhaiHost, AnyPhysics>) -> NodeCore<NoAgreement, RhaiHost, AnyPhysics> {
    let anchor_ms = sim.world().governance().genesis_ms;
    NodeCore::new(NoAgreement, sim, 1).with_time_scale(r.time_scale, anchor_ms)
}

fn load_sim(r: &Recording) -> anyhow::Result<Sim<RhaiHost, AnyPhysics>> {
    let snap = Snapshot::decode(&r.genesis, 1 << 30).map_err(|e| anyhow::anyhow!("the recording's genesis: {e}"))?;
    Sim::restore(snap, RhaiHost::default(), AnyPhysics::of(&r.physics), 1).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Re-execute a recording from genesis; the number of ticks whose roots matched, or the first
/// that did not.
pub fn replay_verify(r: &Recording) -> anyhow::Result<usize> {
    let mut core = replay_core(r, load_sim(r)?);
    for (rec, root) in &r.ticks {
        let got = core.replay(rec).map_err(|e| anyhow::anyhow!("tick {}: {e}", rec.tick))?;
        anyhow::ensure!(got == *root, "tick {}: replayed root {got} differs from the recorded {root}", rec.tick);
    }
    Ok(r.ticks.len())
}

/// SyncTest: every tick is executed, then executed again from a snapshot of the state before
/// it; both roots must equal the recorded one.
pub fn synctest(r: &Recording) -> anyhow::Result<usize> {
    let mut core = replay_core(r, load_sim(r)?);
    for (rec, root) in &r.ticks {
        let before = core.snapshot();
        let first = core.replay(rec).map_err(|e| anyhow::anyhow!("tick {}: {e}", rec.tick))?;
        let sim = Sim::restore(before, RhaiHost::default(), AnyPhysics::of(&r.physics), 1)
            .map_err(|e| anyhow::anyhow!("tick {}: restoring the snapshot before it: {e}", rec.tick))?;
        let mut again = replay_core(r, sim);
        let second = again.replay(rec).map_err(|e| anyhow::anyhow!("tick {} again: {e}", rec.tick))?;
        anyhow::ensure!(
            first == second && first == *root,
            "tick {}: executed {first}, from the snapshot before it {second}, recorded {root}",
            rec.tick
        );
    }
    Ok(r.ticks.len())
}
