//! Raynet (Beaumont, Kermarrec, Rivière, OPODIS 2007): a Voronoi overlay, sans-IO (DESIGN §9).
//!
//! Each peer has an id and a position. Gossip (Cyclon) brings candidate peers; each peer
//! estimates its Voronoi cell by casting rays against its candidates ([`geometry`]) and keeps
//! the candidates the rays hit as its neighbours, in a bounded view; neighbours exchange their
//! neighbour lists, so second-hop candidates arrive quickly. Long-range links are found by
//! routing to a random point at a distance drawn with density ∝ 1/r (links ∝ 1/dist², Kleinberg
//! for d = 2). Greedy routing forwards to the known peer closest to the target, with a bounded
//! detour when views changed under a route. A joining peer routes to its own position; silent
//! peers time out; positions may move.
//!
//! Uses: a client finds the node nearest its avatar; a sim finds its neighbour sims; cross-sim
//! messages travel to the right sim. [`sim`] is the simulator that measures all this.

#![forbid(unsafe_code)]

pub mod geometry;
mod peer;
pub mod rng;
pub mod sim;

pub use geometry::Point;
pub use peer::{Config, Entry, Event, Msg, Peer, PeerId, Purpose};
