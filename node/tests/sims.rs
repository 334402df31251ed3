//! Two sims side by side as real processes (four `metatopia run` nodes each, over libp2p), and a
//! native client whose avatar walks across the border: the client is handed to a node of the
//! next sim with its avatar intact, acts there, and a client of the same account bootstrapped at
//! the first sim is routed to the second; so is one whose avatar was never in the first (its
//! node asks the neighbours).

mod common;

use std::time::Duration;

use metatopia_client::Client;
use metatopia_client::proto::{NodeAddr, ServerMsg};
use metatopia_sim::SigningKey;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_walking_across_a_border_is_handed_to_the_next_sims_node_with_its_avatar() {
    let cluster = common::Cluster::world("sims-walk", "border-crossing.toml", 2);
    let join: Vec<NodeAddr> = cluster.join.iter().map(|j| j.parse().unwrap()).collect();
    let (sim1, sim2) = (&join[..4], &join[4..]);
    let key = SigningKey::from_bytes(&[42; 32]);
    let mut c = Client::connect(&sim1[1], key.clone()).await.unwrap();
    assert_eq!(c.sim(), 1);
    c.login("walker").await.unwrap();
    let before = c.account_view().await.unwrap().unwrap();
    assert!(before.avatar.is_some(), "logged in with an avatar in sim 1");
    // From the centre of sim 1 (16, 16) east at 4 m/s: across x = 32 in about four seconds.
    c.walk(4, 0).await.unwrap();
    let moved = c.run_until(Duration::from_secs(60), |_, m| matches!(m, ServerMsg::Moved { sim: 2, .. })).await;
    assert!(moved, "the client was never told its avatar crossed into sim 2");
    assert_eq!((c.sim(), c.crossings), (2, 1));
    let node = c.node().unwrap().clone();
    assert!(sim2.iter().any(|n| n.key == node.key), "now on {node}, not a node of sim 2");
    // The avatar is there under the same account and name, and still walking east.
    let after = c.account_view().await.unwrap().unwrap();
    let avatar = after.avatar.clone().expect("an avatar in sim 2");
    let o = c.object(&avatar).await.unwrap().expect("the avatar's object");
    assert_eq!(o.name, "walker");
    let ([x, _], [vx, _]) = o.motion_mm();
    assert!(x > 32_000, "the avatar is at x = {x} mm, not in sim 2");
    assert!(vx > 3_000, "still walking east: {vx} mm/s");
    // The client's acts now go to sim 2 (its nonce there starts afresh) and execute.
    c.say(0, "hello from sim 2").await.unwrap();
    c.walk(0, 0).await.unwrap();
    // Sim 1 sends the account's clients to sim 2 from now on.
    let again = Client::connect(&sim1[0], key).await.unwrap();
    assert_eq!(again.sim(), 2, "a client bootstrapped at sim 1 is routed to the avatar's sim");
    let st = cluster.status(0).unwrap();
    assert!(st.departures >= 1 && st.neighbours == [2], "{st:?}");
    // An avatar that was never in sim 1: sim 1's node asks its neighbours where it is.
    let other = SigningKey::from_bytes(&[43; 32]);
    let mut local = Client::connect(&sim2[2], other.clone()).await.unwrap();
    assert_eq!(local.sim(), 2, "no avatar anywhere yet: the bootstrap's own sim");
    local.login("stay-at-home").await.unwrap();
    let far = Client::connect(&sim1[3], other).await.unwrap();
    assert_eq!(far.sim(), 2, "a far bootstrap routes the client to the sim its avatar is in");
    assert!(sim2.iter().any(|n| Some(&n.key) == far.node().map(|x| &x.key)));
}
