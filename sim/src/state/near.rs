//! Objects near a point, for scripts' `nearby`: a grid of the tick's world, built the first
//! time a script of the tick asks and shared by every unit of the tick (the world is read-only
//! while scripts run, `World_t`). A walk of every object per call made 190 scripts calling
//! `nearby` in a 15,000-object world cost 54 ms a tick.
//!
//! The answer is exactly the walk's: the objects whose centre is within the radius, in id
//! order, the first `max` of them. The grid only narrows down where to look: every object
//! within the radius lies in a cell the circle's bounding square covers.
//!
//! The grid is one vector sorted by cell (then id), searched by binary search: building it is
//! one pass and one sort, where a map of cells cost an allocation per cell and a tree search
//! per object (8 % of a node's time in that world with 50 clients).

use std::sync::OnceLock;

use super::World;
use crate::fx::{FRAC_BITS, Fx};
use crate::ids::ObjectId;
use crate::state::Object;
use crate::vec2::Vec2;

/// A cell is 2^CELL_SHIFT metres on a side (8 m).
const CELL_SHIFT: u32 = 3;
/// A search covering more cells than this walks every object instead (a huge radius).
const MAX_CELLS: i64 = 1_024;

type Cell = (i64, i64);

fn cell_of(x: Fx) -> i64 {
    x.to_bits() >> (FRAC_BITS + CELL_SHIFT) // an arithmetic shift: the floor, negatives too
}

/// One object in the grid: its cell, its id and centre.
#[derive(Clone, Copy, Debug)]
struct Entry {
    cell: Cell,
    id: ObjectId,
    at: Vec2,
}

/// The tick's grid of objects; empty until first asked. The pipeline makes a fresh
/// one every tick (`TickCtx`), so it never outlives the world it was built from.
#[derive(Debug, Default)]
pub struct Near {
    /// Every object of the world, ordered by cell, then id.
    grid: OnceLock<Vec<Entry>>,
}

impl Clone for Near {
    /// A clone shares nothing: it starts empty and is built again when asked.
    fn clone(&self) -> Near {
        Near::default()
    }
}

impl Near {
    /// The objects other than `skip` whose centre lies within `radius` of `centre`, in id
    /// order, at most `max` (the same as walking `World::objects_within`). `world` must be the
    /// world this grid was made for, unchanged since.
    pub fn within<'w>(
        &self,
        world: &'w World,
        centre: Vec2,
        radius: Fx,
        skip: ObjectId,
        max: usize,
    ) -> Vec<&'w Object> {
        let r = radius.abs();
        let (x0, x1) = (cell_of(centre.x.sub_sat(r)), cell_of(centre.x.add_sat(r)));
        let (y0, y1) = (cell_of(centre.y.sub_sat(r)), cell_of(centre.y.add_sat(r)));
        let walk = || world.objects_within(centre, radius).filter(|o| o.id != skip).take(max).collect();
        // A huge radius (over about 120 m: more than 32 × 32 cells) walks every object instead.
        if (x1 - x0 + 1).saturating_mul(y1 - y0 + 1) > MAX_CELLS {
            return walk();
        }
        let grid = self.grid.get_or_init(|| build(world));
        let columns: Vec<&[Entry]> = (x0..=x1)
            .map(|x| {
                let start = grid.partition_point(|e| e.cell < (x, y0));
                &grid[start..start + grid[start..].partition_point(|e| e.cell <= (x, y1))]
            })
            .collect();
        // The grid looks at every candidate in the square; a walk in id order stops at the
        // `max`th find, after about n × max / finds objects, and about 3/4 of the square's
        // candidates are finds. A wide search with a small `max` (`nearby(100)` in a crowd:
        // thousands of candidates, 64 wanted) walks.
        let candidates = columns.iter().map(|c| c.len() as u128).sum::<u128>();
        if grid.len() as u128 * max as u128 * 4 < candidates * candidates * 3 {
            return walk();
        }
        let mut found: Vec<ObjectId> = columns
            .iter()
            .flat_map(|c| c.iter())
            .filter(|e| e.id != skip && e.at.within(centre, radius))
            .map(|e| e.id)
            .collect();
        if found.len() > max {
            found.select_nth_unstable(max);
            found.truncate(max);
        }
        found.sort_unstable();
        found.iter().filter_map(|id| world.object(*id)).collect()
    }
}

/// Every object of `world` ordered by cell, then id: a counting sort by cell when the cells
/// the objects span are not many more than the objects (a world's usual shape), else a sort.
fn build(world: &World) -> Vec<Entry> {
    let mut g: Vec<Entry> = world
        .objects()
        .values()
        .map(|o| Entry { cell: (cell_of(o.position.x), cell_of(o.position.y)), id: o.id, at: o.position })
        .collect();
    let Some(first) = g.first() else { return g };
    let (mut lo, mut hi) = (first.cell, first.cell);
    for e in &g {
        lo = (lo.0.min(e.cell.0), lo.1.min(e.cell.1));
        hi = (hi.0.max(e.cell.0), hi.1.max(e.cell.1));
    }
    let (w, h) = ((hi.0 as i128 - lo.0 as i128 + 1) as u128, (hi.1 as i128 - lo.1 as i128 + 1) as u128);
    if w * h > 4 * g.len() as u128 + 4_096 {
        g.sort_unstable_by_key(|e| (e.cell, e.id));
        return g;
    }
    // Cell (x, y) is bucket (x - lo.x) × h + (y - lo.y): buckets in the tuple's order.
    let bucket = |e: &Entry| ((e.cell.0 - lo.0) as usize) * h as usize + (e.cell.1 - lo.1) as usize;
    let mut starts = vec![0u32; (w * h) as usize + 1];
    for e in &g {
        starts[bucket(e) + 1] += 1;
    }
    for k in 1..starts.len() {
        starts[k] += starts[k - 1];
    }
    let mut out = vec![*first; g.len()];
    for e in &g {
        let at = &mut starts[bucket(e)];
        out[*at as usize] = *e;
        *at += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::DetRng;

    #[test]
    fn the_grid_finds_what_walking_every_object_finds() {
        let world =
            crate::genesis::demo_world(crate::genesis::DemoSpec { objects: 3_000, players: 10, ..Default::default() })
                .world;
        same_as_the_walk(&world);
        // A few objects far away: the cells span far more than there are objects, so the grid
        // is built by a sort rather than by counting.
        let mut spread = world.clone();
        let o = world.objects().values().next().unwrap().clone();
        for (x, y) in [(-900_000, 3), (700_000, -650_000), (5, 800_000), (130, 129)] {
            let at = Vec2::from_ints(x, y);
            spread.add_genesis_object(o.kind, o.owner, "far".into(), o.shape, at, o.velocity, 0, String::new(), o.body);
        }
        same_as_the_walk(&spread);
    }

    fn same_as_the_walk(world: &World) {
        let ids: Vec<ObjectId> = world.objects().values().map(|o| o.id).collect();
        let near = Near::default();
        let mut rng = DetRng::from_u64(7);
        for i in 0..2_000 {
            let centre = Vec2::new(
                Fx::from_ratio(rng.range_i64(-20_000, 276_000), 1000),
                Fx::from_ratio(rng.range_i64(-20_000, 276_000), 1000),
            );
            // Radii from nothing to past the walk's threshold, some negative (`within` takes
            // the magnitude), some exactly on an object.
            let radius = match i % 5 {
                0 => Fx::from_ratio(rng.range_i64(0, 3_000), 1000),
                1 => Fx::from_ratio(rng.range_i64(0, 40_000), 1000),
                2 => -Fx::from_ratio(rng.range_i64(0, 20_000), 1000),
                3 => Fx::from_int(rng.range_i64(200, 2_000)),
                _ => {
                    let o = world.object(ids[rng.below(ids.len() as u64) as usize]).unwrap();
                    o.position.distance(centre)
                }
            };
            let skip = ids[rng.below(ids.len() as u64) as usize];
            let max = [1, 16, 64, usize::MAX][i % 4];
            let walked: Vec<ObjectId> =
                world.objects_within(centre, radius).filter(|o| o.id != skip).take(max).map(|o| o.id).collect();
            let grid: Vec<ObjectId> = near.within(world, centre, radius, skip, max).iter().map(|o| o.id).collect();
            assert_eq!(grid, walked, "centre {centre:?} radius {radius} max {max}");
        }
    }
}
