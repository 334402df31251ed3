//! Three sims in a row as real processes (four `metatopia run` nodes each, over libp2p), and
//! native clients. One walks its avatar across the border from sim 1 into sim 2: the client is
//! handed to a node of sim 2 with its avatar intact and acts there, and sim 1 routes the
//! account's clients to sim 2 from then on. Another logs in at sim 1 and is then given a node
//! of sim 3 — not sim 1's neighbour — as its bootstrap: it is routed to sim 1. The nodes know
//! the other sims' validators by key only (the world's genesis): they find them through Raynet,
//! and a new account asking to enter at a point is routed, through Raynet, to that point's sim.
use crate::support;

use std::time::Duration;

use metatopia_client::Client;
use metatopia_client::proto::{NodeAddr, ServerMsg};
use metatopia_sim::SigningKey;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_follow_their_avatar_across_a_border_and_far_bootstraps_route_to_its_sim() {
    let cluster = support::Cluster::world("sims-walk", "three-sims.toml", 3);
    let join: Vec<NodeAddr> = cluster.join.iter().map(|j| j.parse().unwrap()).collect();
    let (sim1, sim2, sim3) = (&join[..4], &join[4..8], &join[8..]);
    let on = |nodes: &[NodeAddr], c: &Client| nodes.iter().any(|n| Some(&n.key) == c.node().map(|x| &x.key));
    // The nodes' configs name the other sims' validators by key only, and bootstrap from node 0:
    // every node finds all its neighbour sims' validators through Raynet.
    let t0 = std::time::Instant::now();
    let found = |i: usize| {
        cluster.status(i).map(|s| (s.neighbours.clone(), s.neighbour_validators_found.clone(), s.raynet_known))
    };
    loop {
        let all: Vec<_> = (0..12).map(found).collect();
        let done = all.iter().all(|f| {
            f.as_ref().is_some_and(|(n, v, _)| !n.is_empty() && v.len() == n.len() && v.iter().all(|c| *c == 4))
        });
        if done {
            // Sim 2 (in the middle) has two neighbours; and each node holds cards of other sims' nodes.
            assert!(all[4].as_ref().is_some_and(|(n, _, known)| n == &[1, 3] && *known >= 8), "{:?}", all[4]);
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "neighbours' validators not all found through Raynet in 60 s: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let key = SigningKey::from_bytes(&[42; 32]);
    let mut c = Client::connect(&sim1[1], key.clone()).await.unwrap();
    assert_eq!(c.sim(), 1);
    c.login("walker").await.unwrap();
    assert!(c.account_view().await.unwrap().unwrap().avatar.is_some(), "logged in with an avatar in sim 1");
    // From the centre of sim 1 (12, 12) east at 3 m/s: across x = 24 in about four seconds.
    c.walk(3, 0).await.unwrap();
    let moved = c.run_until(Duration::from_secs(60), |_, m| matches!(m, ServerMsg::Moved { sim: 2, .. })).await;
    assert!(moved, "the client was never told its avatar crossed into sim 2");
    assert_eq!((c.sim(), c.crossings), (2, 1));
    assert!(on(sim2, &c), "now on {:?}, not a node of sim 2", c.node());
    // The avatar is there under the same account and name, and still walking east.
    let avatar = c.account_view().await.unwrap().unwrap().avatar.expect("an avatar in sim 2");
    let o = c.object(&avatar).await.unwrap().expect("the avatar's object");
    assert_eq!(o.name, "walker");
    let ([x, _], [vx, _]) = o.motion_mm();
    assert!(x > 24_000, "the avatar is at x = {x} mm, not in sim 2");
    assert!(vx > 2_000, "still walking east: {vx} mm/s");
    // The client's acts now go to sim 2 (its nonce there starts afresh) and execute.
    c.say(0, "hello from sim 2").await.unwrap();
    c.walk(0, 0).await.unwrap();
    // Sim 1 sends the account's clients to sim 2 from now on.
    let again = Client::connect(&sim1[0], key).await.unwrap();
    assert_eq!(again.sim(), 2, "a client bootstrapped at sim 1 is routed to the avatar's sim");
    let st = cluster.status(0).unwrap();
    assert!(st.departures >= 1 && st.neighbours == [2], "{st:?}");
    // An avatar in sim 1, and a bootstrap node in sim 3 (not sim 1's neighbour): sim 3's node
    // asks the other sims' nodes and routes the client to sim 1.
    let other = SigningKey::from_bytes(&[43; 32]);
    let mut home = Client::connect(&sim1[2], other.clone()).await.unwrap();
    assert_eq!(home.sim(), 1, "no avatar anywhere yet: the bootstrap's own sim");
    home.login("stay-at-home").await.unwrap();
    // Sim 3's node asks two of sim 1's nodes: wait until all four have executed the login (on
    // a loaded machine one can trail the node the client is on by many ticks).
    let accounts = cluster.status(2).unwrap().accounts;
    let t1 = std::time::Instant::now();
    while !(0..4).all(|i| cluster.status(i).is_some_and(|s| s.accounts >= accounts)) {
        assert!(t1.elapsed() < Duration::from_secs(30), "sim 1's nodes did not all execute the login in 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let far = Client::connect(&sim3[3], other).await.unwrap();
    assert_eq!(far.sim(), 1, "a far bootstrap routes the client to the sim its avatar is in");
    assert!(on(sim1, &far), "on {:?}, not a node of sim 1", far.node());
    assert_eq!(cluster.status(8).unwrap().neighbours, [2], "sim 3's only neighbour is sim 2");
    // A new account that asks to enter at a point of sim 3's square (x 48..72), through a node
    // of sim 1: that node looks the point up through Raynet and routes the client to sim 3.
    let newcomer = Client::connect_at(&sim1[0], SigningKey::from_bytes(&[44; 32]), Some([60, 12])).await.unwrap();
    assert_eq!(newcomer.sim(), 3, "routed to the sim whose square holds (60, 12)");
    assert!(on(sim3, &newcomer), "on {:?}, not a node of sim 3", newcomer.node());
    let local = Client::connect_at(&sim1[0], SigningKey::from_bytes(&[45; 32]), Some([5, 5])).await.unwrap();
    assert_eq!(local.sim(), 1, "a point of the bootstrap's own sim");
    // An account with an avatar goes to its avatar, wherever it asks to enter.
    let home_again = Client::connect_at(&sim3[0], SigningKey::from_bytes(&[43; 32]), Some([60, 12])).await.unwrap();
    assert_eq!(home_again.sim(), 1, "the avatar is in sim 1");
    // Roaming bots (the devnet's client load) walk past borders and follow their avatars.
    use metatopia_client::bots::{BotPlan, BotReport};
    let report = std::sync::Arc::new(BotReport::default());
    let plan = BotPlan {
        count: 3,
        run_for: Duration::from_secs(60),
        wander_every: Duration::from_secs(3),
        chat_every: Duration::ZERO,
        seed: 7,
        roam_one_in: 1,
        ..BotPlan::default()
    };
    let bots = tokio::spawn(metatopia_client::bots::run(sim2[0].clone(), plan, report.clone()));
    let t0 = std::time::Instant::now();
    while BotReport::get(&report.crossings) == 0 && t0.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bots.abort();
    let g = |a: &std::sync::atomic::AtomicU64| BotReport::get(a);
    assert!(
        g(&report.crossings) >= 1,
        "no roaming bot crossed a border in 60 s: {} logged in, {} acts submitted, {} executed, {} refused",
        g(&report.logged_in),
        g(&report.submitted),
        g(&report.executed),
        g(&report.refused)
    );
    assert_eq!(BotReport::get(&report.failed), 0);
}
