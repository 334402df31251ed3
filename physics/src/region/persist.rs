//! A region's saved form (what a snapshot carries of it), its restore and checks, and the
//! hashes of its state: the same bytes and roots on every machine.

use super::*;

#[derive(Serialize)]
struct SavedRef<'a> {
    version: u16,
    config: &'a RegionConfig,
    tick: u64,
    world: &'a PhysicsWorld,
    bodies: &'a BTreeMap<ObjectId, Body>,
    arriving: &'a BTreeMap<ObjectId, Arriving>,
    released: &'a BTreeMap<ObjectId, Released>,
    targets: &'a BTreeMap<ObjectId, Target>,
    stopping: &'a BTreeSet<ObjectId>,
    drives: &'a BTreeMap<ObjectId, Vec2>,
    next_nonce: u64,
    full_digest: Hash32,
    last_feed: &'a BTreeMap<RegionId, u64>,
}

#[derive(Deserialize)]
struct Saved {
    version: u16,
    config: RegionConfig,
    tick: u64,
    world: PhysicsWorld,
    bodies: BTreeMap<ObjectId, Body>,
    arriving: BTreeMap<ObjectId, Arriving>,
    released: BTreeMap<ObjectId, Released>,
    targets: BTreeMap<ObjectId, Target>,
    stopping: BTreeSet<ObjectId>,
    drives: BTreeMap<ObjectId, Vec2>,
    next_nonce: u64,
    full_digest: Hash32,
    last_feed: BTreeMap<RegionId, u64>,
}

impl Region {
    /// Restore a region from [`Region::save`]'s bytes; `config` must be the saved one.
    pub fn restore(config: &RegionConfig, bytes: &[u8]) -> Result<Region, RegionError> {
        if bytes.len() as u64 > u64::from(MAX_SAVED_BYTES) {
            return Err(RegionError::Decode(format!("{} bytes, the limit is {MAX_SAVED_BYTES}", bytes.len())));
        }
        let (saved, rest): (Saved, _) =
            postcard::take_from_bytes(bytes).map_err(|e| RegionError::Decode(e.to_string()))?;
        if !rest.is_empty() {
            return Err(RegionError::Decode(format!("{} trailing bytes", rest.len())));
        }
        if saved.version != SAVE_VERSION {
            return Err(RegionError::Version { found: saved.version });
        }
        if &saved.config != config {
            return Err(RegionError::ConfigMismatch { saved: saved.config.summary(), configured: config.summary() });
        }
        let full_tick = saved.tick > 0 && saved.tick.is_multiple_of(FULL_ROOT_EVERY);
        let region = Region {
            config: saved.config,
            tick: saved.tick,
            world: saved.world,
            bodies: saved.bodies,
            arriving: saved.arriving,
            released: saved.released,
            targets: saved.targets,
            stopping: saved.stopping,
            drives: saved.drives,
            next_nonce: saved.next_nonce,
            full_digest: saved.full_digest,
            full_stale: false,
            last_feed: saved.last_feed,
            inbox: Vec::new(),
        };
        region.check()?;
        // At a full-hash tick the root covers every byte of the carried state: check it.
        if full_tick && region.full_hash() != region.full_digest {
            return Err(RegionError::Inconsistent(format!(
                "the state saved at tick {} does not match its full hash (tampered or corrupt)",
                region.tick
            )));
        }
        Ok(region)
    }

    /// The ownership table agrees with the rapier world.
    pub(super) fn check(&self) -> Result<(), RegionError> {
        let bad = |m: String| Err(RegionError::Inconsistent(m));
        let mut handles = BTreeSet::new();
        for (id, b) in &self.bodies {
            let Some(rb) = self.world.bodies.get(b.handle) else {
                return bad(format!("body {id} has no rapier body"));
            };
            if !handles.insert(b.handle.into_raw_parts()) {
                return bad(format!("body {id} shares its rapier body"));
            }
            if rb.user_data != u128::from(id.0) {
                return bad(format!("body {id}'s rapier body belongs to another object"));
            }
            let made_here = matches!(
                rb.body_type(),
                RigidBodyType::Dynamic | RigidBodyType::Fixed | RigidBodyType::KinematicVelocityBased
            );
            if !made_here {
                return bad(format!("body {id}'s rapier body is of a kind this region does not make"));
            }
            if rb.colliders().len() != 1 {
                return bad(format!("body {id} has {} colliders", rb.colliders().len()));
            }
        }
        if self.world.bodies.len() != self.bodies.len() {
            return bad(format!("{} rapier bodies for {} table entries", self.world.bodies.len(), self.bodies.len()));
        }
        for id in self.targets.keys().chain(&self.stopping).chain(self.drives.keys()) {
            if !self.bodies.get(id).is_some_and(|b| b.role.is_owner()) {
                return bad(format!("target for {id}, which is not owned"));
            }
        }
        Ok(())
    }

    /// The carried state: rapier's world (bodies, colliders, islands, broad and narrow phase,
    /// contacts), the ownership table, handoffs in flight, targets and feed ticks.
    pub fn save(&self) -> Vec<u8> {
        self.encode(self.current_full_digest())
    }

    /// A change made between steps (by the sim, after the step that took the full hash):
    /// at a full-hash tick the digest must cover it, or a snapshot taken at this tick would
    /// not match its own full hash.
    pub(super) fn touched(&mut self) {
        if self.tick > 0 && self.tick.is_multiple_of(FULL_ROOT_EVERY) {
            self.full_stale = true;
        }
    }

    /// The full digest as of now: the stored one, or, after a change at a full-hash tick, the
    /// hash of the state as it is.
    pub(super) fn current_full_digest(&self) -> Hash32 {
        if self.full_stale { self.full_hash() } else { self.full_digest }
    }

    pub(super) fn encode(&self, full_digest: Hash32) -> Vec<u8> {
        let saved = SavedRef {
            version: SAVE_VERSION,
            config: &self.config,
            tick: self.tick,
            world: &self.world,
            bodies: &self.bodies,
            arriving: &self.arriving,
            released: &self.released,
            targets: &self.targets,
            stopping: &self.stopping,
            drives: &self.drives,
            next_nonce: self.next_nonce,
            full_digest,
            last_feed: &self.last_feed,
        };
        postcard::to_allocvec(&saved).expect("a region's state encodes")
    }

    /// The hash of the whole carried state ([`Region::save`], with the stored full digest left
    /// out so that it can be checked against the state it describes).
    pub fn full_hash(&self) -> Hash32 {
        Hash32(*blake3::keyed_hash(&keys::SUBSYSTEM, &self.encode(Hash32([0; 32]))).as_bytes())
    }

    /// The physics root: every tick, each body's exact state (pose, velocities, sleep), its
    /// role and epoch, and the handoff tables; and, through `full_digest`, the whole carried
    /// state (contacts, islands, broad phase, solver caches) as of the last multiple of
    /// [`FULL_ROOT_EVERY`] ticks. Hashing the whole state every tick cost more than the step
    /// itself at 4,000 bodies; a divergence there shows in the bodies within a tick or two,
    /// and in the full hash within [`FULL_ROOT_EVERY`] ticks.
    pub fn root(&self) -> Hash32 {
        let mut h = blake3::Hasher::new_keyed(&keys::SUBSYSTEM);
        h.update(b"metatopia/physics/root/v1");
        h.update(&self.tick.to_le_bytes());
        h.update(&self.current_full_digest().0);
        h.update(&(self.bodies.len() as u64).to_le_bytes());
        // One buffer, one hasher call: 4,000 small updates cost more than the hashing.
        let mut buf = Vec::with_capacity(self.bodies.len() * 46);
        for (id, b) in &self.bodies {
            buf.extend_from_slice(&id.0.to_le_bytes());
            let (tag, peer) = match b.role {
                Role::Owned => (0u8, 0u32),
                Role::Departing { to, .. } => (1, to.0),
                Role::Ghost { from } => (2, from.0),
            };
            buf.push(tag);
            buf.extend_from_slice(&peer.to_le_bytes());
            buf.extend_from_slice(&b.epoch.to_le_bytes());
            if let Some(rb) = self.world.bodies.get(b.handle) {
                let (p, r, v) = (rb.translation(), rb.rotation(), rb.linvel());
                for x in [p.x, p.y, r.cos(), r.sin(), v.x, v.y, rb.angvel()] {
                    buf.extend_from_slice(&x.to_bits().to_le_bytes());
                }
                buf.push(u8::from(rb.is_sleeping()));
            }
        }
        h.update(&buf);
        let tables = (
            &self.arriving,
            &self.released,
            &self.targets,
            &self.stopping,
            &self.drives,
            self.next_nonce,
            &self.last_feed,
        );
        h.update(&postcard::to_allocvec(&tables).expect("tables encode"));
        Hash32(*h.finalize().as_bytes())
    }
}
