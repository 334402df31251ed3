//! A region as the sim's physics stage ([`PhysicsStage`]): what a sim runs for its own square.
//!
//! The layout comes from the world: a sim without neighbours is one walled region; a sim whose
//! world lists neighbour sims ([`metatopia_sim::links`]) is region `RegionId(sim)` with those
//! neighbours, walled around the whole world. Each step's messages for a neighbour become that
//! neighbour's mail ([`PhysicsOutput::mail`], a postcard `Vec<Envelope>`), and certified mail
//! from a neighbour comes back in through [`PhysicsStage::deliver`] before the step.
//!
//! **Names across sims.** Object ids are per sim (a slot in the sim's Merkle tree), so a
//! neighbour's body cannot keep its id here. A body named `id` by the neighbour `r` is called
//! `foreign(r, id)` in this region: the slot's top bit set, then 9 bits of `r` and the 22 bits
//! of the neighbour's slot (sims have at most `MAX_SLOTS` = 2^22 slots), generation unchanged.
//! No real object has such a slot, the mapping needs no table, and it is undone exactly when a
//! message about the neighbour's body goes back to it. A body that arrives by handoff is then
//! renamed to the id its new world gives it, in the same tick ([`PhysicsStage::rename`]).
//! Messages name bodies by kind: `Ghosts`, `Offer` and `Transfer` name the sender's bodies;
//! `Accept`, `Reject` and `Done` name the receiver's. Anything else is dropped (a body just
//! arrived, still under its foreign name, is left out of that one tick's feed and offers).

use std::collections::BTreeMap;

use metatopia_sim::host::{Border, PhysicsCommand, PhysicsError, PhysicsOutput, PhysicsStage};
use metatopia_sim::links::{MAX_MAIL_BYTES, MAX_NEIGHBOUR_SIM};
use metatopia_sim::state::MAX_SLOTS;
use metatopia_sim::{Fx, Hash32, ObjectId, SimId, World, codec};

use crate::msg::{Envelope, Msg, RegionId};
use crate::region::{Crossing, Region, RegionConfig};

const FOREIGN: u32 = 1 << 31;
const SLOT_BITS: u32 = 22;
const _: () = assert!(MAX_SLOTS == 1 << SLOT_BITS && MAX_NEIGHBOUR_SIM == 1 << 9);

/// This region's name for the body `id` of the neighbour `from`.
pub fn foreign(from: RegionId, id: ObjectId) -> Option<ObjectId> {
    if from.0 >= MAX_NEIGHBOUR_SIM || id.slot() >= MAX_SLOTS {
        return None;
    }
    Some(ObjectId::new(FOREIGN | (from.0 << SLOT_BITS) | id.slot(), id.generation()))
}

/// The neighbour and its id behind a foreign name.
pub fn origin(id: ObjectId) -> Option<(RegionId, ObjectId)> {
    let slot = id.slot();
    if slot & FOREIGN == 0 {
        return None;
    }
    let region = RegionId((slot & !FOREIGN) >> SLOT_BITS);
    Some((region, ObjectId::new(slot & (MAX_SLOTS - 1), id.generation())))
}

fn is_local(id: ObjectId) -> bool {
    id.slot() & FOREIGN == 0
}

/// A message from neighbour `from`, in this region's names (None: malformed, dropped).
fn inbound(from: RegionId, mut env: Envelope) -> Option<Envelope> {
    let theirs = |id: ObjectId| if is_local(id) { foreign(from, id) } else { None };
    let ours = |id: ObjectId| is_local(id).then_some(id);
    match &mut env.msg {
        Msg::Ghosts(bodies) => {
            for b in bodies.iter_mut() {
                b.object = theirs(b.object)?;
            }
        }
        Msg::Offer { body, .. } | Msg::Transfer { body, .. } => body.object = theirs(body.object)?,
        Msg::Accept { object, .. } | Msg::Reject { object, .. } | Msg::Done { object, .. } => {
            *object = ours(*object)?;
        }
    }
    Some(env)
}

/// A message for neighbour `to`, in its names (None: not sendable this tick).
fn outbound(mut env: Envelope) -> Option<Envelope> {
    let to = env.to;
    let back = |id: ObjectId| origin(id).filter(|(r, _)| *r == to).map(|(_, id)| id);
    match &mut env.msg {
        Msg::Ghosts(bodies) => bodies.retain(|b| is_local(b.object)),
        Msg::Offer { body, .. } | Msg::Transfer { body, .. } => {
            if !is_local(body.object) {
                return None;
            }
        }
        Msg::Accept { object, .. } | Msg::Reject { object, .. } | Msg::Done { object, .. } => *object = back(*object)?,
    }
    Some(env)
}

/// The sim's physics stage, backed by one [`Region`].
#[derive(Debug)]
pub struct RegionStage {
    config: Option<RegionConfig>,
    region: Option<Region>,
    /// Mail refused since the stage was built (malformed, or not from a neighbour).
    refused: u64,
}

impl RegionStage {
    /// A stage whose layout comes from the world it loads (see the module docs).
    pub fn single() -> RegionStage {
        RegionStage { config: None, region: None, refused: 0 }
    }

    /// A stage with an explicit layout (neighbours, margins, material); its area must be the
    /// world's region.
    pub fn with_config(config: RegionConfig) -> RegionStage {
        RegionStage { config: Some(config), ..RegionStage::single() }
    }

    pub fn region(&self) -> Option<&Region> {
        self.region.as_ref()
    }

    /// Mail (or messages in it) refused so far.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    fn config_for(&self, world: &World) -> Result<RegionConfig, PhysicsError> {
        let links = world.links();
        let config = match &self.config {
            Some(c) => c.clone(),
            None if links.neighbours.is_empty() => RegionConfig::single(RegionId(0), *world.region()),
            None => RegionConfig {
                neighbours: links.neighbours.iter().map(|(sim, n)| (RegionId(sim.0), n.region)).collect(),
                walls: links.bounds,
                ..RegionConfig::single(RegionId(world.sim().0), *world.region())
            },
        };
        if config.area != *world.region() {
            return Err(PhysicsError(format!(
                "the region's area {:?} is not the world's {:?}",
                config.area,
                world.region()
            )));
        }
        Ok(config)
    }
}

impl PhysicsStage for RegionStage {
    fn load(&mut self, world: &World, saved: Option<&[u8]>) -> Result<(), PhysicsError> {
        let config = self.config_for(world)?;
        let region = match saved {
            None => {
                let mut r = Region::new(config).map_err(|e| PhysicsError(e.to_string()))?;
                for o in world.objects().values() {
                    r.spawn(o.id, o.shape, o.position, o.rotation, o.velocity, o.body, o.surface);
                }
                r
            }
            Some(bytes) => {
                let r = Region::restore(&config, bytes).map_err(|e| PhysicsError(e.to_string()))?;
                if let Some(id) = r.owned().find(|id| world.object(*id).is_none()) {
                    return Err(PhysicsError(format!("saved body {id} is not in the world")));
                }
                r
            }
        };
        self.region = Some(region);
        Ok(())
    }

    fn step(&mut self, world: &World, commands: &[PhysicsCommand], dt: Fx) -> PhysicsOutput {
        let Some(region) = self.region.as_mut() else { return PhysicsOutput::default() };
        let out = region.step(commands, dt);
        let bodies = out
            .bodies
            .into_iter()
            .filter(|b| {
                world
                    .object(b.object)
                    .is_none_or(|o| o.position != b.position || o.rotation != b.rotation || o.velocity != b.velocity)
            })
            .collect();
        let borders = out
            .crossings
            .into_iter()
            .filter_map(|c| match c {
                Crossing::Left { object, to } => Some(Border::Left { object, to: SimId(to.0) }),
                Crossing::Settled { object, to } => Some(Border::Settled { object, to: SimId(to.0) }),
                Crossing::Arrived { object, from } => {
                    let (_, origin) = origin(object)?;
                    Some(Border::Arrived { object, from: SimId(from.0), origin })
                }
            })
            .collect();
        let mut mail: BTreeMap<RegionId, Vec<Envelope>> = BTreeMap::new();
        for env in out.outbox.into_iter().filter_map(outbound) {
            mail.entry(env.to).or_default().push(env);
        }
        let mail = mail.into_iter().map(|(to, envs)| (SimId(to.0), codec::encode(&envs))).collect();
        PhysicsOutput { bodies, events: out.events, borders, mail }
    }

    fn save(&self) -> Vec<u8> {
        self.region.as_ref().map(Region::save).unwrap_or_default()
    }

    fn root(&self) -> Hash32 {
        self.region.as_ref().map(Region::root).unwrap_or(Hash32([0; 32]))
    }

    fn deliver(&mut self, from: SimId, mail: &[u8]) {
        let Some(region) = self.region.as_mut() else { return };
        let from = RegionId(from.0);
        let Ok(envelopes) = codec::decode::<Vec<Envelope>>(mail, MAX_MAIL_BYTES) else {
            self.refused += 1;
            return;
        };
        let mut good = Vec::with_capacity(envelopes.len());
        for env in envelopes {
            match inbound(from, env).filter(|e| e.from == from && e.to == region.id()) {
                Some(e) => good.push(e),
                None => self.refused += 1,
            }
        }
        region.deliver(good);
    }

    fn rename(&mut self, from: ObjectId, to: ObjectId) {
        if let Some(r) = self.region.as_mut() {
            r.rename(from, to);
        }
    }

    fn despawn(&mut self, object: ObjectId) {
        if let Some(r) = self.region.as_mut() {
            r.despawn(object);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_names_round_trip_and_never_look_local() {
        for (r, slot, generation) in [(0, 0, 0), (3, 17, 2), (511, MAX_SLOTS - 1, u32::MAX)] {
            let id = ObjectId::new(slot, generation);
            let f = foreign(RegionId(r), id).unwrap();
            assert!(!is_local(f));
            assert!(f.slot() >= MAX_SLOTS);
            assert_eq!(origin(f), Some((RegionId(r), id)));
        }
        assert_eq!(foreign(RegionId(512), ObjectId::new(1, 0)), None);
        assert_eq!(foreign(RegionId(1), ObjectId::new(MAX_SLOTS, 0)), None);
        assert_eq!(origin(ObjectId::new(5, 5)), None);
    }
}
