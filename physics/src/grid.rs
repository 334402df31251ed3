//! A grid of regions stepped together in one process, each tick's mail delivered at the next
//! tick (what the node does between sims, minus the network). Benches and tests drive it.

use std::collections::BTreeMap;

use metatopia_sim::host::PhysicsCommand;
use metatopia_sim::{Fx, ObjectId};

use crate::msg::{Envelope, RegionId};
use crate::region::{Crossing, Region, RegionConfig, RegionError};

/// `cols` × `rows` regions of `size` metres.
#[derive(Debug)]
pub struct Grid {
    pub regions: Vec<Region>,
    mail: Vec<Envelope>,
}

/// What a grid step produced, summed over its regions.
#[derive(Clone, Debug, Default)]
pub struct GridStep {
    pub collisions: u32,
    pub crossings: Vec<(RegionId, Crossing)>,
    pub messages: u32,
}

impl Grid {
    pub fn new(cols: u32, rows: u32, size: Fx, tune: impl Fn(&mut RegionConfig)) -> Result<Grid, RegionError> {
        let mut regions = Vec::new();
        for row in 0..rows {
            for col in 0..cols {
                let mut c = RegionConfig::grid(cols, rows, size, col, row);
                tune(&mut c);
                regions.push(Region::new(c)?);
            }
        }
        Ok(Grid { regions, mail: Vec::new() })
    }

    /// The region whose area holds `p`.
    pub fn region_at(&self, p: metatopia_sim::Vec2) -> Option<usize> {
        self.regions.iter().position(|r| r.config().area.contains(p))
    }

    /// Deliver last tick's mail, step every region with its commands.
    pub fn step(&mut self, commands: &BTreeMap<RegionId, Vec<PhysicsCommand>>, dt: Fx) -> GridStep {
        let mut by_region: BTreeMap<RegionId, Vec<Envelope>> = BTreeMap::new();
        for m in std::mem::take(&mut self.mail) {
            by_region.entry(m.to).or_default().push(m);
        }
        let mut report = GridStep::default();
        for r in &mut self.regions {
            r.deliver(by_region.remove(&r.id()).unwrap_or_default());
            let out = r.step(commands.get(&r.id()).map(Vec::as_slice).unwrap_or(&[]), dt);
            report.collisions += out.events.len() as u32;
            report.messages += out.outbox.len() as u32;
            report.crossings.extend(out.crossings.into_iter().map(|c| (r.id(), c)));
            self.mail.extend(out.outbox);
        }
        report
    }

    /// Who holds each object: the owning regions plus the regions with it released whose
    /// `Transfer` nobody has taken yet. Epochs grow along the chain of owners, so a transfer of
    /// epoch `e` has been taken once some region owns the object at an epoch `>= e`, or has
    /// itself released it at a later epoch.
    pub fn holders(&self) -> BTreeMap<ObjectId, Vec<RegionId>> {
        let mut h: BTreeMap<ObjectId, Vec<RegionId>> = BTreeMap::new();
        let mut latest: BTreeMap<ObjectId, u32> = BTreeMap::new();
        for r in &self.regions {
            for id in r.owned() {
                h.entry(id).or_default().push(r.id());
                let e = r.owned_epoch(id).unwrap_or(0);
                latest.entry(id).and_modify(|x| *x = (*x).max(e)).or_insert(e);
            }
        }
        let released: Vec<(RegionId, ObjectId, u32)> =
            self.regions.iter().flat_map(|r| r.in_transfer().map(|(id, _, e)| (r.id(), id, e))).collect();
        let mut newest: BTreeMap<ObjectId, u32> = BTreeMap::new();
        for (_, id, e) in &released {
            newest.entry(*id).and_modify(|x| *x = (*x).max(*e)).or_insert(*e);
        }
        for (region, id, e) in released {
            let owned_later = latest.get(&id).is_some_and(|x| *x >= e);
            let released_later = newest.get(&id).is_some_and(|x| *x > e);
            if !owned_later && !released_later {
                h.entry(id).or_default().push(region);
            }
        }
        h
    }
}
