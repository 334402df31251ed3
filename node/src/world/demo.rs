//! Demo sims, for devnets and tests only: a genesis built from a config marked
//! `world.demo = true` (a seeded demo world, or a scenario file's world), whose keys, the
//! admin's included, anyone can derive from the seed. `run` reaches this only for such a config;
//! a real sim's genesis comes from `metatopia sim new` ([`crate::world::genesis`](mod@crate::world::genesis)).

use std::path::Path;

use crate::config::NodeConfig;
use crate::world::error::{Result, WorldError, ensure};
use metatopia_sim::SimId;
use metatopia_sim::genesis::{DemoSpec, DemoWorld};

/// The genesis world a demo config describes (`world.demo`): the seeded demo world (or the
/// scenario file's), with the config's validators and tick rate in its governance state; and
/// its physics. Its keys are demo keys anyone can derive: devnets and tests only.
pub fn demo_of(cfg: &NodeConfig) -> Result<(DemoWorld, String)> {
    ensure!(cfg.world.demo, "a demo world needs world.demo = true (devnets and tests only)");
    // The genesis set is the validators, not the observers (they vote once admitted).
    let keys = cfg.genesis_validators()?;
    let validators: Vec<metatopia_sim::AccountId> =
        keys.iter().map(|k| metatopia_sim::AccountId(k.to_bytes())).collect();
    let (mut demo, physics) = match &cfg.world.scenario {
        Some(path) => {
            let (spec, _) = crate::world::load(path)?;
            let scripts_dir =
                cfg.world.scripts.clone().unwrap_or_else(|| path.parent().unwrap_or(Path::new(".")).join("../scripts"));
            let opts = crate::world::Options { seed: cfg.world.seed, scripts_dir, timeline: false };
            let place = if spec.world.sims > 1 { Some(place_in_world(cfg, &spec, &validators)?) } else { None };
            let g = crate::world::genesis_in(&spec, cfg.world.seed, &opts, &validators, place.as_ref())?;
            (DemoWorld { world: g.world, admin: g.demo.admin, players: g.demo.players }, spec.world.physics)
        }
        None => {
            // One prim in ten carries an example rhai script.
            let demo = crate::world::rhai_demo_world(
                DemoSpec {
                    seed: cfg.world.seed,
                    sim: SimId(cfg.world.sim_id),
                    objects: cfg.world.objects,
                    players: cfg.world.players,
                    ..DemoSpec::default()
                },
                10,
            )?;
            (demo, "rapier".to_owned())
        }
    };
    demo.world.set_genesis_validators(validators);
    let settings = metatopia_sim::Settings { tick_rate_hz: cfg.tick_rate_hz, ..demo.world.settings().clone() };
    demo.world.set_genesis_settings(settings);
    Ok((demo, physics))
}

/// Where this node's sim is in a scenario's world of several sims, with its neighbours'
/// validators' keys from `[[sims]]`.
fn place_in_world(
    cfg: &NodeConfig,
    spec: &metatopia_scenarios::spec::Scenario,
    own: &[metatopia_sim::AccountId],
) -> Result<crate::world::Place> {
    let sims = spec.world.sims;
    let k = cfg.world.sim_id;
    ensure!(
        (1..=sims).contains(&k),
        "world.sim_id is {k}, but the scenario's world has sims 1..={sims}: set world.sim_id to this node's sim"
    );
    let mut accounts = Vec::new();
    for j in 1..=sims {
        let keys = if j == k {
            Some(own.to_vec())
        } else {
            cfg.sim_validators(j)?.map(|ks| ks.iter().map(|v| metatopia_sim::AccountId(v.to_bytes())).collect())
        };
        accounts.push(keys.unwrap_or_default());
    }
    let place = crate::world::place_of(&spec.world, k - 1, &accounts);
    if let Some((sim, _)) = place.neighbours.iter().find(|(_, n)| n.validators.is_empty()) {
        return Err(WorldError::Invalid(format!(
            "sim {} is a neighbour of this node's sim {k}: list its validators' keys under [[sims]] (sim_id = {})",
            sim.0, sim.0
        )));
    }
    Ok(place)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ValidatorEntry;

    #[test]
    fn observers_are_not_in_the_genesis_validator_set() {
        let keys: Vec<_> =
            (1..=5u8).map(|i| metatopia_consensus::SigningKey::from_bytes(&[i; 32]).verifying_key()).collect();
        let cfg = NodeConfig {
            listen: ([127, 0, 0, 1], 7000).into(),
            quic: None,
            http: None,
            tick_rate_hz: 20,
            snapshot_every: 640,
            genesis_hash: None,
            world: crate::config::WorldConfig::demo(1_795_700_000_000),
            bots: Default::default(),
            validators: keys
                .iter()
                .enumerate()
                .map(|(i, k)| ValidatorEntry {
                    key: metatopia_sim::ids::hex(k.as_bytes()),
                    address: ([127, 0, 0, 1], 7000 + i as u16).into(),
                    quic: None,
                    http: None,
                    observer: i == 4,
                })
                .collect(),
            join: None,
            sims: Vec::new(),
            raynet: Default::default(),
            network: Default::default(),
            sim_workers: None,
            block_history_mib: None,
        };
        let (demo, _) = demo_of(&cfg).unwrap();
        let set = &demo.world.governance().validators;
        assert_eq!(set.len(), 4, "{set:?}");
        assert!(!set.contains(&metatopia_sim::AccountId(keys[4].to_bytes())), "the observer votes only once admitted");
    }

    #[test]
    fn a_sim_of_several_needs_its_neighbours_validators_and_gets_them_into_its_world() {
        let entries = |from: u8| -> Vec<ValidatorEntry> {
            (from..from + 4)
                .map(|i| ValidatorEntry {
                    key: metatopia_sim::ids::hex(
                        metatopia_consensus::SigningKey::from_bytes(&[i; 32]).verifying_key().as_bytes(),
                    ),
                    address: ([127, 0, 0, 1], 7000 + u16::from(i)).into(),
                    quic: None,
                    http: None,
                    observer: false,
                })
                .collect()
        };
        let scenario = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scenarios/catalogue/border-crossing.toml")
            .canonicalize()
            .unwrap();
        let mut cfg = NodeConfig {
            listen: ([127, 0, 0, 1], 7001).into(),
            quic: None,
            http: None,
            tick_rate_hz: 20,
            snapshot_every: 640,
            genesis_hash: None,
            world: crate::config::WorldConfig {
                sim_id: 2,
                scenario: Some(scenario),
                ..crate::config::WorldConfig::demo(1_795_700_000_000)
            },
            bots: Default::default(),
            validators: entries(11),
            join: None,
            sims: Vec::new(),
            raynet: Default::default(),
            network: Default::default(),
            sim_workers: None,
            block_history_mib: None,
        };
        let e = format!("{:#}", demo_of(&cfg).unwrap_err());
        assert!(e.contains("sim 1 is a neighbour") && e.contains("[[sims]]"), "{e}");
        cfg.world.sim_id = 3;
        let e = format!("{:#}", demo_of(&cfg).unwrap_err());
        assert!(e.contains("sims 1..=2"), "{e}");
        cfg.world.sim_id = 2;
        cfg.sims.push(crate::config::SimEntry {
            sim_id: 1,
            validators: entries(1).iter().map(crate::config::SimValidator::key_of).collect(),
        });
        let (demo, _) = demo_of(&cfg).unwrap();
        let w = &demo.world;
        assert_eq!((w.sim(), w.region().origin.x), (SimId(2), metatopia_sim::Fx::from_int(32)));
        let n = &w.links().neighbours[&SimId(1)];
        assert_eq!(n.validators.len(), 4);
        // Sim 2 starts with the scenario's objects in its square only: the ball, not the counter.
        let names: Vec<&str> = w.objects().values().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["ball"]);
    }
}
