//! Helpers: a sim with the rhai host and kinematic physics, players that sign events.
#![allow(dead_code)]

use metatopia_scripting::RhaiHost;
use metatopia_sim::event::account_of;
use metatopia_sim::genesis::{DemoSpec, demo_key, demo_world, tick_seed, tick_time_ms};
use metatopia_sim::kinematic::KinematicPhysics;
use metatopia_sim::state::Shape;
use metatopia_sim::{
    AccountId, Batch, Fx, ObjectId, Payload, SignedEvent, SigningKey, Sim, TickReport, Vec2, VerifiedBatch,
};

pub type RhaiSim = Sim<RhaiHost, KinematicPhysics>;

pub fn script(name: &str) -> String {
    let path = format!("{}/../scenarios/scripts/{name}.rhai", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[derive(Debug)]
pub struct Player {
    pub key: SigningKey,
    pub nonce: u64,
}

impl Player {
    pub fn id(&self) -> AccountId {
        account_of(&self.key)
    }
    pub fn sign(&mut self, sim: &RhaiSim, payload: Payload) -> SignedEvent {
        self.nonce += 1;
        SignedEvent::new(&self.key, sim.world().sim(), self.nonce, payload)
    }
    pub fn avatar(&self, sim: &RhaiSim) -> ObjectId {
        sim.world().account(&self.id()).and_then(|a| a.avatar).expect("logged in")
    }
}

pub fn step(sim: &mut RhaiSim, events: Vec<SignedEvent>) -> TickReport {
    let tick = sim.world().tick();
    let rate = sim.world().settings().tick_rate_hz;
    let b = Batch { tick, time_ms: tick_time_ms(tick, rate), seed: tick_seed(tick), events };
    let w = sim.workers();
    sim.step(&VerifiedBatch::new(b, w)).expect("batch for this tick")
}

pub fn idle(sim: &mut RhaiSim, ticks: u64) -> Vec<TickReport> {
    (0..ticks).map(|_| step(sim, vec![])).collect()
}

/// An empty region with `n` players logged in (avatars at the centre).
pub fn world_with_players(n: u64) -> (RhaiSim, Vec<Player>) {
    let demo = demo_world(DemoSpec { seed: 21, objects: 0, players: 0, ..DemoSpec::default() });
    let mut sim = Sim::new(demo.world, RhaiHost::default(), KinematicPhysics::default(), 2).expect("physics");
    let mut players: Vec<Player> = (1..=n).map(|i| Player { key: demo_key(31, i), nonce: 0 }).collect();
    let logins = players
        .iter_mut()
        .enumerate()
        .map(|(i, p)| p.sign(&sim, Payload::Login { name: format!("player{i}") }))
        .collect();
    let r = step(&mut sim, logins);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    (sim, players)
}

/// Rez a prim at an offset from the region centre and deploy a script on it.
pub fn scripted_prim(sim: &mut RhaiSim, owner: &mut Player, offset: Vec2, source: &str) -> (ObjectId, TickReport) {
    let before: Vec<ObjectId> = sim.world().objects().keys().copied().collect();
    let at = sim.world().region().centre() + offset;
    let rez = owner.sign(
        sim,
        Payload::Rez {
            name: "prim".into(),
            shape: Shape::Circle { radius: Fx::HALF },
            position: at,
            color: 0xffffffff,
            text: String::new(),
            body: metatopia_sim::state::BodyKind::Dynamic,
        },
    );
    let r = step(sim, vec![rez]);
    assert!(r.rejected.is_empty(), "{:?}", r.rejected);
    let id = *sim.world().objects().keys().find(|id| !before.contains(id)).expect("new prim");
    let deploy = owner.sign(
        sim,
        Payload::DeployScript {
            object: id,
            source: source.into(),
            licence: "AGPL-3.0-or-later".into(),
            derived_from: None,
        },
    );
    let r = step(sim, vec![deploy]);
    (id, r)
}
