//! The overlay converges to the exact Delaunay neighbours, routes greedily to the right peer,
//! and keeps routing under churn (DESIGN §9).

use metatopia_raynet::Point;
use metatopia_raynet::sim::{Placement, SimConfig, Simulator};

fn converge(placement: Placement, seed: u64) -> (Simulator, Vec<metatopia_raynet::sim::RoundStats>) {
    let mut sim = Simulator::new(SimConfig::new(1_000, placement, seed));
    let mut stats = Vec::new();
    for _ in 0..40 {
        let s = sim.round();
        let done = s.recall >= 0.99 && s.precision >= 0.95;
        stats.push(s);
        if done && stats.len() >= 5 {
            break;
        }
    }
    (sim, stats)
}

#[test]
fn a_thousand_peers_converge_to_delaunay_and_route_greedily() {
    for placement in [Placement::Uniform, Placement::Clustered] {
        let (mut sim, stats) = converge(placement, 1);
        let last = stats.last().unwrap();
        for s in &stats {
            eprintln!("{placement:?} {}", s.csv());
        }
        assert!(last.recall >= 0.99, "{placement:?}: recall {} after {} rounds", last.recall, stats.len());
        assert!(last.precision >= 0.95, "{placement:?}: precision {}", last.precision);
        assert!(stats.len() <= 40);
        // Once converged, greedy routing reaches the nearest peer every time.
        let s = sim.measure();
        assert_eq!(s.route_success, 1.0, "{placement:?}: {s:?}");
        assert!(s.mean_hops < 20.0, "{placement:?}: {} hops", s.mean_hops);
    }
}

#[test]
fn routing_survives_ten_percent_churn_per_round() {
    let (mut sim, _) = converge(Placement::Uniform, 2);
    // Then replace 10% of the peers every round.
    sim.set_churn(100);
    let mut worst: f64 = 1.0;
    for _ in 0..10 {
        let s = sim.round();
        eprintln!("churn {}", s.csv());
        worst = worst.min(s.route_success);
    }
    assert!(worst >= 0.99, "routing success fell to {worst} under 10% churn");
}

#[test]
fn the_same_seed_gives_the_same_overlay() {
    let a = converge(Placement::Uniform, 9).1;
    let b = converge(Placement::Uniform, 9).1;
    assert_eq!(a, b);
}

#[test]
fn a_peer_that_moves_finds_its_new_neighbours() {
    let (mut sim, _) = converge(Placement::Uniform, 4);
    let id = *sim.peers().keys().nth(17).unwrap();
    let side = SimConfig::new(1_000, Placement::Uniform, 4).side();
    sim.move_peer(id, Point::new(side * 0.9, side * 0.1));
    for _ in 0..6 {
        sim.round();
    }
    let truth = sim.true_neighbours(id);
    let est: std::collections::BTreeSet<u64> = sim.peers()[&id].neighbours().map(|e| e.id).collect();
    assert_eq!(est, truth, "the moved peer's neighbours");
    // And the peers around its new position know it.
    let known_back = truth.iter().filter(|t| sim.peers()[*t].neighbours().any(|e| e.id == id)).count();
    assert_eq!(known_back, truth.len());
}
