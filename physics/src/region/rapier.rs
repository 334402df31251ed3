//! The rapier side of a region: the walls around it, the square it tests positions against,
//! the collision events it collects, and the body kinds in rapier's terms.

use super::*;

/// A square grown by `by` metres on every side (shrunk if negative), in rapier's `f32`; the
/// tests against it are exact comparisons, the same on every machine.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rect {
    lo: Vector,
    hi: Vector,
}

impl Rect {
    pub(super) fn of(sq: &Square, by: Fx) -> Rect {
        let lo = sq.origin - Vec2::new(by, by);
        let side = sq.size.add_sat(by.mul_sat(Fx::TWO));
        Rect { lo: to_vector(lo), hi: to_vector(lo + Vec2::new(side, side)) }
    }

    pub(super) fn contains(&self, p: Vector) -> bool {
        p.x >= self.lo.x && p.y >= self.lo.y && p.x < self.hi.x && p.y < self.hi.y
    }
}

pub(super) fn add_walls(world: &mut PhysicsWorld, lo: Vec2, hi: Vec2) {
    let (lo, hi) = (to_vector(lo), to_vector(hi));
    let t = 1.0f32; // half thickness
    let (w, h) = ((hi.x - lo.x) / 2.0 + 2.0 * t, (hi.y - lo.y) / 2.0 + 2.0 * t);
    let (cx, cy) = ((lo.x + hi.x) / 2.0, (lo.y + hi.y) / 2.0);
    let walls = [
        (Vector::new(cx, lo.y - t), Vector::new(w, t)),
        (Vector::new(cx, hi.y + t), Vector::new(w, t)),
        (Vector::new(lo.x - t, cy), Vector::new(t, h)),
        (Vector::new(hi.x + t, cy), Vector::new(t, h)),
    ];
    for (centre, half) in walls {
        let c =
            ColliderBuilder::cuboid(half.x, half.y).translation(centre).restitution(1.0).user_data(NO_OBJECT).build();
        world.colliders.insert(c);
    }
}

/// Collects the pairs that started touching during a step.
#[derive(Default)]
pub(super) struct Collector(pub(super) Mutex<Vec<(ColliderHandle, ColliderHandle)>>);

impl EventHandler for Collector {
    fn handle_collision_event(
        &self,
        _bodies: &RigidBodySet,
        _colliders: &ColliderSet,
        event: CollisionEvent,
        _contact_pair: Option<&ContactPair>,
    ) {
        if let CollisionEvent::Started(a, b, _) = event {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push((a, b));
        }
    }

    fn handle_contact_force_event(
        &self,
        _dt: f32,
        _bodies: &RigidBodySet,
        _colliders: &ColliderSet,
        _contact_pair: &ContactPair,
        _total_force_magnitude: f32,
    ) {
    }

    fn handle_soft_body_tear_event(&self, _soft_bodies: &SoftBodySet, _event: &SoftBodyTearEvent) {}
}

/// The rapier body type of a body kind.
pub(super) fn rapier_type(kind: BodyKind) -> RigidBodyType {
    match kind {
        BodyKind::Static => RigidBodyType::Fixed,
        BodyKind::Kinematic => RigidBodyType::KinematicVelocityBased,
        BodyKind::Dynamic => RigidBodyType::Dynamic,
    }
}
