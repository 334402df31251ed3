//! The nearest node: a player's client measures the round trip to every node of its avatar's
//! sim (a `ping` on a fresh connection to each, at once) and uses the nearest; it measures
//! again every [`PROBE_EVERY`] and moves when another node is clearly nearer
//! ([`clearly_nearer`]), and after its node dies it tries the others nearest first.
//!
//! Nodes about as near as the nearest (within [`NEAR_ENOUGH_PERCENT`] and
//! [`NEAR_ENOUGH_MS`]) count as equally near: among them clients spread by account, so the
//! clients of one town do not all land on one node.

use std::time::Duration;

use crate::proto::{ClientMsg, MAX_SERVER_FRAME, NodeAddr, ServerMsg, read_frame, write_frame};
use crate::quic::{SERVER_NAME, client_config, parse_public};

/// How long one probe waits for its answer (a node that does not answer by then is not near).
pub const PROBE_WAIT: Duration = Duration::from_secs(2);
/// How often a connected client measures its sim's nodes again.
pub const PROBE_EVERY: Duration = Duration::from_secs(20);
/// Nodes probed at most (a sim has a handful of validators; its route lists them).
pub const MAX_PROBED: usize = 16;
/// Within this much of the nearest a node is as near.
pub const NEAR_ENOUGH_PERCENT: u32 = 25;
pub const NEAR_ENOUGH_MS: u64 = 5;

/// The round trip to `node`: a QUIC connection to it, then the time a `ping` takes (the
/// second of two, so the session's start is not counted). `None` when it does not answer.
pub async fn probe(endpoint: &quinn::Endpoint, node: &NodeAddr) -> Option<Duration> {
    let run = async {
        let addr = crate::quic::resolve(&node.addr).ok()?;
        let cfg = client_config(parse_public(&node.key).ok()?).ok()?;
        let conn = endpoint.connect_with(cfg, addr, SERVER_NAME).ok()?.await.ok()?;
        let (mut send, mut recv) = conn.open_bi().await.ok()?;
        let mut best: Option<Duration> = None;
        for r#ref in 1..=2u64 {
            let t0 = tokio::time::Instant::now();
            write_frame(&mut send, &ClientMsg::Ping { r#ref }).await.ok()?;
            loop {
                match read_frame::<ServerMsg, _>(&mut recv, MAX_SERVER_FRAME).await.ok()? {
                    ServerMsg::Pong { r#ref: got } if got == r#ref => break,
                    _ => {}
                }
            }
            let rtt = t0.elapsed();
            best = Some(best.map_or(rtt, |b| b.min(rtt)));
        }
        conn.close(0u32.into(), b"probe");
        best
    };
    tokio::time::timeout(PROBE_WAIT, run).await.ok().flatten()
}

/// [`probe`] every node (the first [`MAX_PROBED`]) at once; in the nodes' order.
pub async fn probe_all(endpoint: &quinn::Endpoint, nodes: &[NodeAddr]) -> Vec<Option<Duration>> {
    let mut set = tokio::task::JoinSet::new();
    for (i, n) in nodes.iter().take(MAX_PROBED).enumerate() {
        let (endpoint, node) = (endpoint.clone(), n.clone());
        set.spawn(async move { (i, probe(&endpoint, &node).await) });
    }
    let mut rtts = vec![None; nodes.len()];
    while let Some(Ok((i, rtt))) = set.join_next().await {
        rtts[i] = rtt;
    }
    rtts
}

/// Whether `rtt` counts as near as `best`.
fn as_near(rtt: Duration, best: Duration) -> bool {
    rtt <= best * (100 + NEAR_ENOUGH_PERCENT) / 100 + Duration::from_millis(NEAR_ENOUGH_MS)
}

/// The node to use: among the nodes as near as the nearest, the one this account's hash
/// picks. `None` when none answered.
pub fn choose(rtts: &[Option<Duration>], account_hash: u64) -> Option<usize> {
    let best = rtts.iter().flatten().min().copied()?;
    let near: Vec<usize> = (0..rtts.len()).filter(|i| rtts[*i].is_some_and(|r| as_near(r, best))).collect();
    Some(near[(account_hash % near.len() as u64) as usize])
}

/// Whether the client on node `current` should move to `to`: it is clearly nearer (not as
/// near, by the rule above), or the current node did not answer and `to` did.
pub fn clearly_nearer(rtts: &[Option<Duration>], current: usize, to: usize) -> bool {
    match (rtts.get(current).copied().flatten(), rtts.get(to).copied().flatten()) {
        (Some(cur), Some(new)) => new < cur && !as_near(cur, new),
        (None, Some(_)) => true,
        _ => false,
    }
}

/// The nodes to try after `current` failed, nearest first (unmeasured ones last, in order).
pub fn failover_order(rtts: &[Option<Duration>], current: Option<usize>, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).filter(|i| Some(*i) != current).collect();
    order.sort_by_key(|i| (rtts.get(*i).copied().flatten().unwrap_or(Duration::MAX), *i));
    // The failed node last: it may be back.
    order.extend(current.filter(|c| *c < n));
    order
}

/// The account's hash clients spread by.
pub fn spread_hash(account: &[u8; 32]) -> u64 {
    u64::from_le_bytes(account[..8].try_into().unwrap_or([0; 8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[Option<u64>]) -> Vec<Option<Duration>> {
        v.iter().map(|m| m.map(Duration::from_millis)).collect()
    }

    #[test]
    fn the_nearest_wins_and_equally_near_nodes_share_the_clients() {
        let far_and_near = ms(&[Some(80), Some(5), Some(40), None]);
        for h in 0..10 {
            assert_eq!(choose(&far_and_near, h), Some(1));
        }
        // On one machine every node is as near: clients spread by account.
        let equal = ms(&[Some(1), Some(2), Some(1), Some(3)]);
        let picks: std::collections::BTreeSet<usize> = (0..16).filter_map(|h| choose(&equal, h)).collect();
        assert_eq!(picks.len(), 4, "{picks:?}");
        assert_eq!(choose(&ms(&[None, None]), 3), None);
    }

    #[test]
    fn a_client_moves_only_to_a_clearly_nearer_node_and_fails_over_nearest_first() {
        let rtts = ms(&[Some(80), Some(5), Some(40), None]);
        assert!(clearly_nearer(&rtts, 0, 1));
        assert!(!clearly_nearer(&rtts, 1, 0));
        assert!(!clearly_nearer(&ms(&[Some(10), Some(9)]), 0, 1), "noise is not a reason to move");
        assert!(clearly_nearer(&ms(&[None, Some(50)]), 0, 1), "the current node stopped answering");
        assert_eq!(failover_order(&rtts, Some(1), 4), vec![2, 0, 3, 1]);
        assert_eq!(failover_order(&rtts, None, 4), vec![1, 2, 0, 3]);
    }
}
