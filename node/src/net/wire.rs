//! What nodes of a sim send each other: consensus messages, and snapshots for a node that must
//! resync (or join).

use metatopia_consensus::Message;
use metatopia_sim::Tick;
use serde::{Deserialize, Serialize};

/// A message between the nodes of a sim.
// Consensus messages are nearly all the traffic; boxing them would add an allocation to each.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum NodeMsg {
    /// A consensus message of validator epoch `epoch` (0 until the set first changes).
    Consensus {
        epoch: u64,
        msg: Message,
    },
    /// "Send me your newest state": from a node that diverged (or joins).
    SnapshotRequest,
    /// The sender's state after executing ticks `0..tick` (an encoded `Snapshot`). Trusted by
    /// the receiver only when its root is the one 2f+1 validators reported for `tick - 1`.
    Snapshot {
        tick: Tick,
        bytes: Vec<u8>,
    },
    /// "Send me what a new node of this sim needs to start": from `run --join`.
    SimInfoRequest,
    /// The sim's description: its config (`config.toml` without this node's own settings) and
    /// its genesis file (`genesis.bin`), which the joiner checks against the hash it was given.
    SimInfo {
        config: String,
        #[serde(with = "serde_bytes")]
        genesis: Vec<u8>,
    },
    /// "Send me your state and where your agreement is": from a node joining the running sim.
    JoinRequest,
    /// The answer: a snapshot as in `Snapshot`, and the sender's agreement state (its epoch and
    /// view) to follow from. The joiner trusts the snapshot only when its root is the one f+1
    /// validators of that epoch reported.
    JoinSnapshot {
        tick: Tick,
        bytes: Vec<u8>,
        agreement: Vec<u8>,
    },
    /// A neighbour sim's mail for this sim: a signed event (`Payload::Mail`) from one of its
    /// validators, for this sim's pool (DESIGN §7).
    Mail(Vec<u8>),
    /// From another sim's node: "is this account's avatar in your sim?" (a client asked it
    /// for a route). Always answered, so the asker need not wait for silence.
    Locate {
        account: [u8; 32],
    },
    Located {
        account: [u8; 32],
        here: bool,
    },
    /// A Raynet message (any node of the world), with the cards of the nodes it names.
    Raynet {
        msg: metatopia_raynet::Msg,
        cards: Vec<crate::net::card::Card>,
    },
    /// Cards (the sender's own first when it sends a hello); `reply`: "send me yours".
    Cards {
        cards: Vec<crate::net::card::Card>,
        reply: bool,
    },
    /// "Send me the cards of this sim's nodes that you know."
    SimCards {
        sim: u32,
    },
}

impl NodeMsg {
    /// Whether the sender asks to follow the sim (a node outside the config gets the sim's
    /// broadcasts once it does): a join, a snapshot, or a consensus message (a vote, or a
    /// follower's fetch).
    pub fn asks_for_the_sim(&self) -> bool {
        matches!(
            self,
            NodeMsg::Consensus { .. } | NodeMsg::SnapshotRequest | NodeMsg::SimInfoRequest | NodeMsg::JoinRequest
        )
    }
}

/// Why bytes are not a node message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "malformed node message: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

impl NodeMsg {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("encoding into a Vec cannot fail")
    }

    /// Bounded decoding of untrusted bytes.
    pub fn decode(bytes: &[u8], max_bytes: usize) -> Result<NodeMsg, DecodeError> {
        if bytes.len() > max_bytes {
            return Err(DecodeError(format!("{} bytes, the limit is {max_bytes}", bytes.len())));
        }
        let (m, rest) = postcard::take_from_bytes(bytes).map_err(|e| DecodeError(e.to_string()))?;
        if !rest.is_empty() {
            return Err(DecodeError(format!("{} trailing bytes", rest.len())));
        }
        Ok(m)
    }

    /// A short name, for traces and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            NodeMsg::Consensus { msg, .. } => msg.kind(),
            NodeMsg::SnapshotRequest => "snapshot-request",
            NodeMsg::Snapshot { .. } => "snapshot",
            NodeMsg::SimInfoRequest => "sim-info-request",
            NodeMsg::SimInfo { .. } => "sim-info",
            NodeMsg::JoinRequest => "join-request",
            NodeMsg::JoinSnapshot { .. } => "join-snapshot",
            NodeMsg::Mail(_) => "mail",
            NodeMsg::Locate { .. } => "locate",
            NodeMsg::Located { .. } => "located",
            NodeMsg::Raynet { .. } => "raynet",
            NodeMsg::Cards { .. } => "cards",
            NodeMsg::SimCards { .. } => "sim-cards",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        for m in [
            NodeMsg::Mail(vec![9; 40]),
            NodeMsg::Locate { account: [3; 32] },
            NodeMsg::Located { account: [3; 32], here: true },
            NodeMsg::SimCards { sim: 4 },
            NodeMsg::Raynet {
                msg: metatopia_raynet::Msg::Arrived {
                    target: metatopia_raynet::Point::new(1.0, 2.0),
                    closest: metatopia_raynet::Entry { id: 7, pos: metatopia_raynet::Point::new(3.0, 4.0), age: 1 },
                    purpose: metatopia_raynet::Purpose::Lookup(9),
                    hops: 2,
                },
                cards: Vec::new(),
            },
        ] {
            assert_eq!(NodeMsg::decode(&m.encode(), 1 << 20), Ok(m.clone()), "{}", m.kind());
        }
        let m = NodeMsg::Snapshot { tick: Tick(7), bytes: vec![1, 2, 3] };
        assert_eq!(NodeMsg::decode(&m.encode(), 1 << 20), Ok(m.clone()));
        assert!(NodeMsg::decode(&m.encode(), 4).is_err());
        let mut trailing = m.encode();
        trailing.push(0);
        assert!(NodeMsg::decode(&trailing, 1 << 20).is_err());
        // Arbitrary bytes never panic, whatever they claim.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for len in 0..2_000 {
            let bytes: Vec<u8> = (0..len % 97)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = NodeMsg::decode(&bytes, 1 << 20);
        }
    }
}
