//! A region as the sim's physics stage ([`PhysicsStage`]): what a sim runs for its own square.
//!
//! Messages from neighbour sims are delivered with [`RegionStage::deliver`] before the step (the
//! node takes them from the committed batch) and the step's outbox and border crossings are
//! taken with [`RegionStage::take_mail`] after it (the node sends them over the overlay).

use metatopia_sim::host::{PhysicsCommand, PhysicsError, PhysicsOutput, PhysicsStage};
use metatopia_sim::{Fx, Hash32, World};

use crate::msg::{Envelope, RegionId};
use crate::region::{Crossing, Region, RegionConfig};

/// The sim's physics stage, backed by one [`Region`].
#[derive(Debug)]
pub struct RegionStage {
    config: Option<RegionConfig>,
    region: Option<Region>,
    mail: Vec<Envelope>,
    crossings: Vec<Crossing>,
}

impl RegionStage {
    /// A stage for a lone sim: its area is the world's region, walled at the edges.
    pub fn single() -> RegionStage {
        RegionStage { config: None, region: None, mail: Vec::new(), crossings: Vec::new() }
    }

    /// A stage with an explicit layout (neighbours, margins, material); its area must be the
    /// world's region.
    pub fn with_config(config: RegionConfig) -> RegionStage {
        RegionStage { config: Some(config), ..RegionStage::single() }
    }

    pub fn region(&self) -> Option<&Region> {
        self.region.as_ref()
    }

    /// Messages from neighbours for the next step.
    pub fn deliver(&mut self, messages: impl IntoIterator<Item = Envelope>) {
        if let Some(r) = self.region.as_mut() {
            r.deliver(messages);
        }
    }

    /// Messages for neighbours and the border crossings of the steps since the last call.
    pub fn take_mail(&mut self) -> (Vec<Envelope>, Vec<Crossing>) {
        (std::mem::take(&mut self.mail), std::mem::take(&mut self.crossings))
    }

    fn config_for(&self, world: &World) -> Result<RegionConfig, PhysicsError> {
        let config = self.config.clone().unwrap_or_else(|| RegionConfig::single(RegionId(0), *world.region()));
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
                    r.spawn(o.id, o.shape, o.position, o.rotation, o.velocity);
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
        self.mail.clear();
        self.crossings.clear();
        Ok(())
    }

    fn step(&mut self, world: &World, commands: &[PhysicsCommand], dt: Fx) -> PhysicsOutput {
        let Some(region) = self.region.as_mut() else { return PhysicsOutput::default() };
        let out = region.step(commands, dt);
        self.mail.extend(out.outbox);
        self.crossings.extend(out.crossings);
        let bodies = out
            .bodies
            .into_iter()
            .filter(|b| {
                world
                    .object(b.object)
                    .is_none_or(|o| o.position != b.position || o.rotation != b.rotation || o.velocity != b.velocity)
            })
            .collect();
        PhysicsOutput { bodies, events: out.events }
    }

    fn save(&self) -> Vec<u8> {
        self.region.as_ref().map(Region::save).unwrap_or_default()
    }

    fn root(&self) -> Hash32 {
        self.region.as_ref().map(Region::root).unwrap_or(Hash32([0; 32]))
    }
}
