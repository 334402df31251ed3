//! The node's place in the overlay: its Raynet peer on the mesh ([`reach`]), its neighbour sims'
//! squares, and the Raynet lookups a client's route asks (which sim holds a point; where an
//! avatar is: `crate::core::locate`).

use anyhow::Context;

use crate::api::hub::Hub;
use crate::config::NodeConfig;
use crate::net::{Mesh, PeerAddr};
use crate::overlay::reach::Reach;
use metatopia_sim::SimId;

/// Raynet lookups for clients' routes waiting at most (more are answered "none" at once).
pub(super) const MAX_FINDING: usize = 1_024;

/// How long a client's route waits for a Raynet lookup before it is answered "none" (and the
/// client enters at the bootstrap's own sim). A lookup crosses several nodes, possibly of other
/// sims and over connections dialled on the way; one second was too short on a loaded machine.
pub(super) const FIND_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The node's Raynet peer on the mesh: its card (a point of its sim's square), its neighbour
/// sims (their squares and genesis validators, from the world's genesis) and its contacts (its
/// own sim's nodes, `[raynet] bootstrap`, `[[sims]]` validators listed with an address).
pub(super) fn reach(
    cfg: &NodeConfig,
    key: &metatopia_consensus::SigningKey,
    mesh: &Mesh,
    w: &metatopia_sim::World,
    peers: &[PeerAddr],
    hub: std::sync::Arc<Hub>,
) -> anyhow::Result<Reach> {
    use crate::overlay::{Card, CardBody, Overlay, node_point};
    let square =
        |r: &metatopia_sim::state::Region| ([r.origin.x.floor_int(), r.origin.y.floor_int()], r.size.floor_int());
    let (origin, size) = square(w.region());
    let me = key.verifying_key().to_bytes();
    let card = Card::sign(
        key,
        CardBody {
            key: me,
            sim: cfg.world.sim_id,
            pos: node_point(&me, origin, size),
            addr: cfg.listen,
            quic: cfg.quic,
            since_ms: crate::unix_ms(),
            http: cfg.http,
            relayed: Vec::new(),
        },
    );
    let links = w.links();
    let radius = match links.bounds {
        Some((a, b)) => (b.x - a.x).floor_int().max((b.y - a.y).floor_int()) as f64,
        None => size as f64,
    };
    let mut r = Reach::new(Overlay::new(card, radius), mesh.clone(), neighbour_squares(w), Some(hub));
    for p in peers {
        r.contact(p.clone());
    }
    for (i, b) in cfg.raynet.bootstrap.iter().enumerate() {
        let (key, addr) = crate::config::parse_join(b).with_context(|| format!("raynet.bootstrap[{i}]"))?;
        r.contact(PeerAddr::direct(key, Some(addr), None));
    }
    for s in &cfg.sims {
        for v in s.validators.iter().filter(|v| v.address.is_some() || v.quic.is_some()) {
            let key = crate::config::parse_public(&v.key)?;
            r.contact_outsider(PeerAddr::direct(key, v.address, v.quic));
        }
    }
    Ok(r)
}

/// The world's neighbour sims: the centre of each one's square, and its validators (as the
/// world knows them: from genesis, then from their mail).
pub(super) fn neighbour_squares(
    w: &metatopia_sim::World,
) -> std::collections::BTreeMap<SimId, ([i64; 2], std::collections::BTreeSet<[u8; 32]>)> {
    w.links()
        .neighbours
        .iter()
        .map(|(s, n)| {
            let (o, size) = (n.region.origin, n.region.size.floor_int());
            (*s, ([o.x.floor_int() + size / 2, o.y.floor_int() + size / 2], n.validators.iter().map(|a| a.0).collect()))
        })
        .collect()
}

/// A Raynet lookup for a client's route: its query, where the answer goes, and until when.
pub(super) type Finding =
    (u64, tokio::sync::oneshot::Sender<Option<(u32, metatopia_client::proto::NodeAddr)>>, std::time::Instant);
