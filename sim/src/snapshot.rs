//! Snapshots: a versioned postcard encoding of the whole state with its root.
//!
//! Decoding is for untrusted bytes (a joining node fetches snapshots from peers): the size is
//! capped, the version is read first, the world is validated structurally (so no later step
//! can panic or allocate without limit on it), and [`crate::Sim::restore`] recomputes the root
//! and refuses a snapshot whose content does not match the root it claims.

use serde::{Deserialize, Serialize};

use crate::codec::{self, DecodeError};
use crate::ids::Hash32;
use crate::state::World;

/// The encoding version this build writes and reads.
pub const SNAPSHOT_VERSION: u16 = 4;
/// Default cap on an encoded snapshot.
pub const MAX_SNAPSHOT_BYTES: u32 = 1 << 30;

/// The whole state of a sim at a tick boundary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u16,
    pub world: World,
    /// The physics stage's carried state.
    pub physics: Vec<u8>,
    /// The state root the snapshot claims.
    pub root: Hash32,
}

/// Why a snapshot was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot does not decode: {0}")]
    Decode(#[from] DecodeError),
    #[error("snapshot version {got} is not supported (this build reads version {supported})")]
    Version { got: u16, supported: u16 },
    #[error("snapshot is inconsistent: {reason}")]
    Invalid { reason: String },
    #[error("snapshot content hashes to {actual}, but it claims root {claimed}")]
    RootMismatch { claimed: Hash32, actual: Hash32 },
}

impl Snapshot {
    pub fn new(world: World, physics: Vec<u8>, root: Hash32) -> Snapshot {
        Snapshot { version: SNAPSHOT_VERSION, world, physics, root }
    }

    pub fn encode(&self) -> Vec<u8> {
        codec::encode(self)
    }

    /// Decode and validate untrusted bytes (at most `max_bytes`).
    pub fn decode(bytes: &[u8], max_bytes: u32) -> Result<Snapshot, SnapshotError> {
        if bytes.len() as u64 > u64::from(max_bytes) {
            return Err(DecodeError::TooLarge { len: bytes.len() as u64, max: max_bytes }.into());
        }
        let (version, _) = postcard::take_from_bytes::<u16>(bytes)
            .map_err(|e| DecodeError::Malformed { what: "snapshot header", reason: e.to_string() })?;
        if version != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version { got: version, supported: SNAPSHOT_VERSION });
        }
        let mut snap: Snapshot = codec::decode(bytes, max_bytes)?;
        snap.world.validate().map_err(|reason| SnapshotError::Invalid { reason })?;
        snap.world.invalidate_caches();
        Ok(snap)
    }
}
