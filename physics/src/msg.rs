//! Messages between regions: plain values, so the node can carry them between sims over the
//! overlay (and accept them only with proof that the sending sim committed them, DESIGN §7).

use metatopia_sim::ObjectId;
use metatopia_sim::state::{BodyKind, Shape, Surface};
use serde::{Deserialize, Serialize};

/// A region (a physics sim) in the world's layout.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct RegionId(pub u32);

impl std::fmt::Display for RegionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// A body's full dynamic state, bit-exact (rapier's `f32`s), so the receiver continues it
/// exactly where the sender left off.
#[derive(Clone, Copy, PartialEq, Debug, Serialize, Deserialize)]
pub struct BodyMsg {
    pub object: ObjectId,
    pub shape: Shape,
    pub position: [f32; 2],
    /// cos, sin.
    pub rotation: [f32; 2],
    pub linvel: [f32; 2],
    pub angvel: f32,
    /// How it moves: a kinematic body crossing stays kinematic (a static one never crosses).
    pub kind: BodyKind,
    /// Its own surface, if its owner set one (else the region's material).
    pub surface: Option<Surface>,
}

impl BodyMsg {
    /// Finite numbers, a valid shape, a unit rotation: anything else is refused.
    pub fn is_sane(&self) -> bool {
        let all = [
            self.position[0],
            self.position[1],
            self.rotation[0],
            self.rotation[1],
            self.linvel[0],
            self.linvel[1],
            self.angvel,
        ];
        let norm = self.rotation[0] * self.rotation[0] + self.rotation[1] * self.rotation[1];
        all.iter().all(|x| x.is_finite() && x.abs() < 1.0e7) && self.shape.is_valid() && (norm - 1.0).abs() < 1.0e-3
    }
}

/// What one region tells a neighbour.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub enum Msg {
    /// Every tick: the sender's owned bodies within the margin of the receiver's area. The
    /// receiver mirrors exactly these as kinematic ghosts (the newest feed wins).
    Ghosts(Vec<BodyMsg>),
    /// Phase 1: "this body is crossing into your area; take it?" The sender keeps authority.
    Offer { epoch: u32, body: BodyMsg },
    /// The receiver has recorded the arrival (named by `nonce`) and will take the body.
    Accept { object: ObjectId, epoch: u32, nonce: u64 },
    /// Nothing current matches: with `nonce` 0 the offer is refused (the sender keeps the
    /// body); otherwise the named arrival is void (the receiver forgets it).
    Reject { object: ObjectId, epoch: u32, nonce: u64 },
    /// Phase 2: authority moves with this message, carrying the body's state at release. Only
    /// the arrival named by `nonce` turns it into ownership; any other copy is answered `Done`.
    Transfer { epoch: u32, nonce: u64, body: BodyMsg, target: Option<Target> },
    /// The new owner has the body: the old owner forgets the handoff.
    Done { object: ObjectId, epoch: u32 },
}

/// A move-to-target in progress, carried across a handoff.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Target {
    pub target: metatopia_sim::Vec2,
    pub speed: metatopia_sim::Fx,
}

/// A message on its way from one region to another.
#[derive(Clone, PartialEq, Debug, Serialize, Deserialize)]
pub struct Envelope {
    pub from: RegionId,
    pub to: RegionId,
    /// The sender's tick when it sent this.
    pub tick: u64,
    pub msg: Msg,
}

impl Envelope {
    /// The order a region handles its inbox in (any arrival order gives the same result).
    pub(crate) fn order_key(&self) -> (u32, u64, u8, u64, u32) {
        let (kind, object, epoch) = match &self.msg {
            Msg::Ghosts(_) => (0, 0, 0),
            Msg::Offer { epoch, body } => (1, body.object.0, *epoch),
            Msg::Accept { object, epoch, .. } => (2, object.0, *epoch),
            Msg::Reject { object, epoch, .. } => (3, object.0, *epoch),
            Msg::Transfer { epoch, body, .. } => (4, body.object.0, *epoch),
            Msg::Done { object, epoch } => (5, object.0, *epoch),
        };
        (self.from.0, self.tick, kind, object, epoch)
    }
}
