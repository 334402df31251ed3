//! A small real physics stage: kinematic movement with bounces at the region's edges and
//! move-to-target. `sim` uses it for its own tests; `physics` (rapier2d) replaces it.
//!
//! Carried state: the set of moving bodies and their targets, saved in snapshots and hashed.

use std::collections::{BTreeMap, BTreeSet};

use crate::codec;
use crate::fx::Fx;
use crate::host::{BodyState, PhysicsCommand, PhysicsError, PhysicsOutput, PhysicsStage};
use crate::ids::{Hash32, ObjectId};
use crate::state::World;
use crate::vec2::Vec2;

/// Kinematic bodies: position += velocity × dt; edges reflect.
#[derive(Clone, Debug, Default)]
pub struct KinematicPhysics {
    moving: BTreeSet<ObjectId>,
    targets: BTreeMap<ObjectId, (Vec2, Fx)>,
}

type Saved = (BTreeSet<ObjectId>, BTreeMap<ObjectId, (Vec2, Fx)>);

impl KinematicPhysics {
    pub fn moving(&self) -> usize {
        self.moving.len()
    }
}

impl PhysicsStage for KinematicPhysics {
    fn load(&mut self, world: &World, saved: Option<&[u8]>) -> Result<(), PhysicsError> {
        match saved {
            None => {
                self.moving = world.objects().values().filter(|o| !o.velocity.is_zero()).map(|o| o.id).collect();
                self.targets.clear();
            }
            Some(bytes) => {
                let (moving, targets): Saved =
                    codec::decode(bytes, 64 << 20).map_err(|e| PhysicsError(e.to_string()))?;
                if let Some(id) = moving.iter().chain(targets.keys()).find(|id| world.object(**id).is_none()) {
                    return Err(PhysicsError(format!("saved body {id} is not in the world")));
                }
                self.moving = moving;
                self.targets = targets;
            }
        }
        Ok(())
    }

    fn step(&mut self, world: &World, commands: &[PhysicsCommand], dt: Fx) -> PhysicsOutput {
        let mut vel: BTreeMap<ObjectId, Vec2> = BTreeMap::new();
        let current = |vel: &BTreeMap<ObjectId, Vec2>, id: ObjectId| {
            vel.get(&id).copied().or_else(|| world.object(id).map(|o| o.velocity))
        };
        for c in commands {
            match *c {
                PhysicsCommand::Spawn { object, velocity, .. } => {
                    // A spawn also places an existing body afresh (an owner's edit).
                    self.targets.remove(&object);
                    if velocity.is_zero() {
                        vel.remove(&object);
                        self.moving.remove(&object);
                    } else {
                        vel.insert(object, velocity);
                        self.moving.insert(object);
                    }
                }
                PhysicsCommand::Despawn { object } => {
                    vel.remove(&object);
                    self.moving.remove(&object);
                    self.targets.remove(&object);
                }
                // Nothing bumps a body here: holding a velocity is setting it.
                PhysicsCommand::SetVelocity { object, velocity } | PhysicsCommand::Drive { object, velocity } => {
                    if world.object(object).is_some() {
                        vel.insert(object, velocity);
                        self.targets.remove(&object);
                        self.moving.insert(object);
                    }
                }
                PhysicsCommand::Impulse { object, impulse } => {
                    if let Some(v) = current(&vel, object) {
                        vel.insert(object, v + impulse);
                        self.moving.insert(object);
                    }
                }
                PhysicsCommand::SetTarget { object, target, speed } => {
                    if world.object(object).is_some() {
                        self.targets.insert(object, (target, speed));
                        self.moving.insert(object);
                    }
                }
            }
        }
        let mut out = PhysicsOutput::default();
        let region = world.region();
        let lo = region.origin;
        let hi = region.origin + Vec2::new(region.size, region.size);
        let mut stopped = Vec::new();
        for &id in &self.moving {
            let Some(o) = world.object(id) else {
                stopped.push(id);
                continue;
            };
            let mut v = vel.get(&id).copied().unwrap_or(o.velocity);
            let mut p = o.position;
            if let Some(&(target, speed)) = self.targets.get(&id) {
                let d = target - p;
                if d.length() <= speed * dt {
                    p = target;
                    v = Vec2::ZERO;
                    self.targets.remove(&id);
                } else {
                    v = d.normalize().scale(speed);
                    p += v.scale(dt);
                }
            } else {
                p += v.scale(dt);
            }
            reflect(&mut p.x, &mut v.x, lo.x, hi.x);
            reflect(&mut p.y, &mut v.y, lo.y, hi.y);
            if v.is_zero() {
                stopped.push(id);
            }
            if p != o.position || v != o.velocity {
                out.bodies.push(BodyState { object: id, position: p, rotation: o.rotation, velocity: v });
            }
        }
        for id in stopped {
            self.moving.remove(&id);
        }
        out
    }

    fn save(&self) -> Vec<u8> {
        codec::encode(&(&self.moving, &self.targets))
    }

    fn root(&self) -> Hash32 {
        Hash32(*blake3::keyed_hash(&crate::merkle::keys::SUBSYSTEM, &self.save()).as_bytes())
    }

    // One lone region: it has no neighbours, so nothing crosses.
    fn deliver(&mut self, _from: crate::ids::SimId, _mail: &[u8]) {}

    fn rename(&mut self, _from: ObjectId, _to: ObjectId) {}

    fn despawn(&mut self, _object: ObjectId) {}
}

/// Keep a coordinate in `[lo, hi)`, reflecting it and its velocity at the edges.
fn reflect(p: &mut Fx, v: &mut Fx, lo: Fx, hi: Fx) {
    if *p < lo {
        *p = (lo + (lo - *p)).min(hi - Fx::DELTA);
        *v = v.abs();
    } else if *p >= hi {
        *p = (hi - (*p - hi) - Fx::DELTA).max(lo);
        *v = -v.abs();
    }
}
