//! Points and the ray-cast estimate of a Voronoi cell (DESIGN §9).
//!
//! A ray from p in direction u leaves p's cell at t(u) = min over candidates s with
//! (s−p)·u > 0 of |s−p|² / (2 (s−p)·u), and the s that gives the minimum is the neighbour it
//! hits. Rays are cast at stratified random angles; between two consecutive rays that hit
//! different neighbours the angle is bisected again (`refine_depth` times), which finds every
//! edge wider than 2π / (rays · 2^depth) of the cell as seen from p. (The boundary between two
//! rays hitting the same neighbour is that neighbour's edge: the cell is convex.)

use crate::rng::SplitMix;

/// A position in the world plane, in metres. Floats are fine here: the overlay's choices never
/// enter a sim's state.
#[derive(Clone, Copy, PartialEq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Point {
    pub x: f64,
    pub y: f64,
}

impl Point {
    pub fn new(x: f64, y: f64) -> Point {
        Point { x, y }
    }
    pub fn dist2(self, o: Point) -> f64 {
        let (dx, dy) = (self.x - o.x, self.y - o.y);
        dx * dx + dy * dy
    }
}

/// Which candidate a ray from `p` at `angle` hits first, if any.
pub fn cast(p: Point, cands: &[crate::Entry], angle: f64) -> Option<usize> {
    let (ux, uy) = (angle.cos(), angle.sin());
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in cands.iter().enumerate() {
        let (dx, dy) = (c.pos.x - p.x, c.pos.y - p.y);
        let dot = dx * ux + dy * uy;
        if dot > 1e-12 {
            let t = (dx * dx + dy * dy) / (2.0 * dot);
            if best.is_none_or(|(_, bt)| t < bt) {
                best = Some((i, t));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// Indices of the candidates whose edges the rays found, in candidate order.
pub fn estimate_cell(p: Point, cands: &[crate::Entry], rays: usize, depth: u32, rng: &mut SplitMix) -> Vec<usize> {
    use std::f64::consts::TAU;
    if cands.is_empty() || rays == 0 {
        return Vec::new();
    }
    let offset = rng.unit();
    let angles: Vec<f64> = (0..rays).map(|k| (k as f64 + offset) / rays as f64 * TAU).collect();
    let hits: Vec<Option<usize>> = angles.iter().map(|a| cast(p, cands, *a)).collect();
    let mut found = vec![false; cands.len()];
    for h in hits.iter().flatten() {
        found[*h] = true;
    }
    for k in 0..rays {
        let (a, b) = (angles[k], if k + 1 < rays { angles[k + 1] } else { angles[0] + TAU });
        refine(p, cands, (a, hits[k]), (b, hits[(k + 1) % rays]), depth, &mut found);
    }
    found.iter().enumerate().filter(|(_, f)| **f).map(|(i, _)| i).collect()
}

fn refine(
    p: Point,
    cands: &[crate::Entry],
    (a, ha): (f64, Option<usize>),
    (b, hb): (f64, Option<usize>),
    depth: u32,
    found: &mut [bool],
) {
    if depth == 0 || ha == hb {
        return;
    }
    let m = (a + b) / 2.0;
    let hm = cast(p, cands, m);
    if let Some(h) = hm {
        found[h] = true;
    }
    refine(p, cands, (a, ha), (m, hm), depth - 1, found);
    refine(p, cands, (m, hm), (b, hb), depth - 1, found);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Entry;

    fn e(id: u64, x: f64, y: f64) -> Entry {
        Entry { id, pos: Point::new(x, y), age: 0 }
    }

    #[test]
    fn rays_find_exactly_the_voronoi_neighbours() {
        // Four peers around the origin, and two hidden behind them.
        let cands = [e(1, 1.0, 0.0), e(2, -1.0, 0.0), e(3, 0.0, 1.0), e(4, 0.0, -1.0), e(5, 3.0, 0.0), e(6, 0.0, -4.0)];
        let mut rng = SplitMix::new(1);
        let hits = estimate_cell(Point::new(0.0, 0.0), &cands, 8, 6, &mut rng);
        assert_eq!(hits, vec![0, 1, 2, 3]);
        // A ray straight at a neighbour leaves the cell at half the distance: it hits it.
        assert_eq!(cast(Point::new(0.0, 0.0), &cands, 0.0), Some(0));
        // A narrow edge between two rays is found by refinement.
        let narrow = [e(1, 1.0, 0.05), e(2, 1.0, -0.05), e(3, 1.02, 0.0)];
        let hits = estimate_cell(Point::new(0.0, 0.0), &narrow, 4, 8, &mut rng);
        assert!(hits.contains(&0) && hits.contains(&1), "{hits:?}");
    }
}
