//! Helpers shared by the sim integration tests.
#![allow(dead_code)]

use metatopia_sim::genesis::{DemoSpec, DemoWorld, EventGen, demo_world, tick_seed, tick_time_ms};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::rules::RuleHost;
use metatopia_sim::{Batch, Hash32, Payload, SignedEvent, SigningKey, Sim, Tick, VerifiedBatch};

pub type TestSim = Sim<RuleHost, KinematicPhysics>;

pub fn sim_of(demo: &DemoWorld, workers: u32) -> TestSim {
    Sim::new(demo.world.clone(), RuleHost::default(), KinematicPhysics::default(), workers)
        .expect("genesis physics loads")
}

/// Run `ticks` ticks of generated events; returns the root after each tick.
pub fn run(sim: &mut TestSim, gen_: &mut EventGen, ticks: u64, events_per_tick: usize) -> Vec<Hash32> {
    (0..ticks)
        .map(|_| {
            let tick = sim.world().tick();
            let batch = gen_.batch(sim.world(), tick, events_per_tick);
            let workers = sim.workers();
            sim.step(&VerifiedBatch::new(batch, workers)).expect("batch is for this tick").root
        })
        .collect()
}

pub fn small_demo(seed: u64) -> DemoWorld {
    demo_world(DemoSpec { seed, objects: 200, players: 12, ..DemoSpec::default() })
}

/// A batch of hand-made events for the sim's next tick.
pub fn batch_of(sim: &TestSim, events: Vec<SignedEvent>) -> VerifiedBatch {
    let tick = sim.world().tick();
    let rate = sim.world().settings().tick_rate_hz;
    VerifiedBatch::new(Batch { tick, time_ms: tick_time_ms(tick, rate), seed: tick_seed(tick), events }, 2)
}

/// A batch at an explicit BFT time.
pub fn batch_at(sim: &TestSim, time_ms: u64, events: Vec<SignedEvent>) -> VerifiedBatch {
    let tick = sim.world().tick();
    VerifiedBatch::new(Batch { tick, time_ms, seed: tick_seed(tick), events }, 2)
}

/// Signs events for one key with increasing nonces.
#[derive(Debug)]
pub struct Signer {
    pub key: SigningKey,
    pub nonce: u64,
}

impl Signer {
    pub fn new(key: SigningKey, sim: &TestSim) -> Signer {
        let id = metatopia_sim::event::account_of(&key);
        let nonce = sim.world().account(&id).map_or(0, |a| a.last_nonce);
        Signer { key, nonce }
    }

    pub fn id(&self) -> metatopia_sim::AccountId {
        metatopia_sim::event::account_of(&self.key)
    }

    pub fn sign(&mut self, sim: &TestSim, payload: Payload) -> SignedEvent {
        self.nonce += 1;
        SignedEvent::new(&self.key, sim.world().sim(), self.nonce, payload)
    }
}

pub fn step(sim: &mut TestSim, events: Vec<SignedEvent>) -> metatopia_sim::TickReport {
    let b = batch_of(sim, events);
    sim.step(&b).expect("batch is for this tick")
}

pub fn idle(sim: &mut TestSim, ticks: u64) {
    for _ in 0..ticks {
        step(sim, Vec::new());
    }
}

pub fn tick_of(sim: &TestSim) -> Tick {
    sim.world().tick()
}
