//! Wall-clock time spent in scripts and physics, for `stats` and `/metrics`.
//!
//! The sim is pure and never reads a clock (DESIGN §5); the node wraps the script host and the
//! physics stage it hands the sim in these timers instead. They change no result: they only
//! delegate and add up elapsed nanoseconds (scripts run on several threads at once, so their
//! figure is CPU time summed over threads).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use metatopia_sim::World;
use metatopia_sim::host::{
    Compiled, PhysicsCommand, PhysicsError, PhysicsOutput, PhysicsStage, ScriptCtx, ScriptHost, ScriptInput,
    ScriptOutput,
};
use metatopia_sim::state::{Limits, ScriptSource};
use metatopia_sim::{Fx, Hash32};

/// Running totals, shared between the wrappers and the node's loop.
#[derive(Clone, Debug, Default)]
pub struct StageTimes {
    script_ns: Arc<AtomicU64>,
    physics_ns: Arc<AtomicU64>,
}

impl StageTimes {
    /// Nanoseconds spent in scripts and in physics since the start.
    pub fn totals(&self) -> (u64, u64) {
        (self.script_ns.load(Ordering::Relaxed), self.physics_ns.load(Ordering::Relaxed))
    }
}

fn add(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// A script host that times its calls.
#[derive(Debug)]
pub struct TimedHost<H> {
    pub inner: H,
    times: StageTimes,
}

impl<H> TimedHost<H> {
    pub fn new(inner: H, times: &StageTimes) -> Self {
        TimedHost { inner, times: times.clone() }
    }
}

impl<H: ScriptHost> ScriptHost for TimedHost<H> {
    fn compile(&self, source: &ScriptSource, limits: &Limits) -> Result<Compiled, String> {
        let t = Instant::now();
        let r = self.inner.compile(source, limits);
        add(&self.times.script_ns, t);
        r
    }

    fn run(&self, ctx: &ScriptCtx<'_>, inputs: &[ScriptInput]) -> ScriptOutput {
        let t = Instant::now();
        let r = self.inner.run(ctx, inputs);
        add(&self.times.script_ns, t);
        r
    }
}

/// A physics stage that times its steps.
#[derive(Debug)]
pub struct TimedPhysics<P> {
    pub inner: P,
    times: StageTimes,
}

impl<P> TimedPhysics<P> {
    pub fn new(inner: P, times: &StageTimes) -> Self {
        TimedPhysics { inner, times: times.clone() }
    }
}

impl<P: PhysicsStage> PhysicsStage for TimedPhysics<P> {
    fn load(&mut self, world: &World, saved: Option<&[u8]>) -> Result<(), PhysicsError> {
        self.inner.load(world, saved)
    }

    fn step(&mut self, world: &World, commands: &[PhysicsCommand], dt: Fx) -> PhysicsOutput {
        let t = Instant::now();
        let r = self.inner.step(world, commands, dt);
        add(&self.times.physics_ns, t);
        r
    }

    fn save(&self) -> Vec<u8> {
        self.inner.save()
    }

    fn root(&self) -> Hash32 {
        self.inner.root()
    }

    fn deliver(&mut self, from: metatopia_sim::SimId, mail: &[u8]) {
        self.inner.deliver(from, mail)
    }

    fn rename(&mut self, from: metatopia_sim::ObjectId, to: metatopia_sim::ObjectId) {
        self.inner.rename(from, to)
    }

    fn despawn(&mut self, object: metatopia_sim::ObjectId) {
        self.inner.despawn(object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metatopia_sim::genesis::{DemoSpec, EventGen, demo_world};
    use metatopia_sim::kinematic::KinematicPhysics;
    use metatopia_sim::rules::RuleHost;
    use metatopia_sim::{Sim, VerifiedBatch};

    #[test]
    fn the_timers_change_no_result_and_count_time() {
        let demo = demo_world(DemoSpec { objects: 200, players: 8, scripted_per_mille: 500, ..DemoSpec::default() });
        let times = StageTimes::default();
        let mut plain = Sim::new(demo.world.clone(), RuleHost::default(), KinematicPhysics::default(), 1).unwrap();
        let mut timed = Sim::new(
            demo.world.clone(),
            TimedHost::new(RuleHost::default(), &times),
            TimedPhysics::new(KinematicPhysics::default(), &times),
            1,
        )
        .unwrap();
        let mut bots = EventGen::new(&demo, 9);
        for _ in 0..30 {
            let w = plain.world();
            let batch = VerifiedBatch::new(bots.batch(w, w.tick(), 20), 1);
            let a = plain.step(&batch).unwrap();
            let b = timed.step(&batch).unwrap();
            assert_eq!(a.root, b.root, "a timer changed the state at {}", a.tick);
        }
        let (script, physics) = times.totals();
        assert!(script > 0, "no script time counted");
        assert!(physics > 0, "no physics time counted");
    }
}
