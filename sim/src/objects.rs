//! The objects of a world, held by slot.
//!
//! An object's id is its slot and the slot's generation ([`ObjectId`]); a slot holds at most
//! one object at a time. So the objects live in a vector indexed by slot, and a lookup is an
//! index and a generation check: the state root and the tick look up every changed object,
//! and in a `BTreeMap` of 15,000 objects those lookups cost more than the hashing they fed.
//! Iteration is in slot order, which is id order (ids order by slot first), so everything
//! that iterated the map iterates the same objects in the same order.
//!
//! Objects are boxed: a slot costs 8 bytes, so a snapshot from a peer that names one object
//! at a high slot allocates at most [`MAX_SLOTS`] × 8 bytes (32 MiB) before it is validated.
//! Beside each object its box holds the digest of its fixed part, which the state root keeps
//! (see `World::subsystem_roots`): the root reads an object and its digest in one place.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::ObjectId;
use crate::state::types::{MAX_SLOTS, Object};

/// The objects of a world in id order.
#[derive(Clone, Default)]
pub struct Objects {
    slots: Vec<Option<Box<Entry>>>,
    len: usize,
}

/// An object, and the digest of its fixed part as the state root last computed it (a cache:
/// neither compared nor encoded).
#[derive(Clone)]
struct Entry {
    object: Object,
    fixed: [u8; 32],
}

impl Objects {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The object in `id`'s slot, if it is of `id`'s generation.
    pub fn get(&self, id: &ObjectId) -> Option<&Object> {
        self.by_slot(id.slot()).filter(|o| o.id == *id)
    }

    pub fn contains_key(&self, id: &ObjectId) -> bool {
        self.get(id).is_some()
    }

    /// Whatever object holds a slot.
    pub fn by_slot(&self, slot: u32) -> Option<&Object> {
        self.slots.get(slot as usize).and_then(|e| e.as_deref()).map(|e| &e.object)
    }

    /// The object in a slot and the digest of its fixed part kept beside it.
    pub(crate) fn with_fixed(&self, slot: u32) -> Option<(&Object, &[u8; 32])> {
        self.slots.get(slot as usize).and_then(|e| e.as_deref()).map(|e| (&e.object, &e.fixed))
    }

    /// Keep the digest of the fixed part of the object in `slot`, if any.
    pub(crate) fn set_fixed(&mut self, slot: u32, digest: [u8; 32]) {
        if let Some(e) = self.slots.get_mut(slot as usize).and_then(|e| e.as_deref_mut()) {
            e.fixed = digest;
        }
    }

    pub(crate) fn get_mut(&mut self, id: &ObjectId) -> Option<&mut Object> {
        self.slots
            .get_mut(id.slot() as usize)
            .and_then(|e| e.as_deref_mut())
            .map(|e| &mut e.object)
            .filter(|o| o.id == *id)
    }

    /// Put an object in its slot, replacing whatever object held it (of any generation). The
    /// digest kept beside it is cleared, unless `same_fixed` says the object replaced has the
    /// same fixed part.
    pub(crate) fn insert(&mut self, o: Object, same_fixed: bool) {
        let slot = o.id.slot() as usize;
        assert!(slot < MAX_SLOTS as usize, "object slot {slot} beyond the limit");
        if slot >= self.slots.len() {
            self.slots.resize_with(slot + 1, || None);
        }
        match &mut self.slots[slot] {
            Some(e) => {
                e.object = o;
                if !same_fixed {
                    e.fixed = [0; 32];
                }
            }
            empty => {
                *empty = Some(Box::new(Entry { object: o, fixed: [0; 32] }));
                self.len += 1;
            }
        }
    }

    pub(crate) fn remove(&mut self, id: &ObjectId) -> Option<Object> {
        let entry = self.slots.get_mut(id.slot() as usize)?;
        if entry.as_ref().is_none_or(|e| e.object.id != *id) {
            return None;
        }
        self.len -= 1;
        entry.take().map(|e| e.object)
    }

    /// The objects, in id order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Object> + Clone {
        self.slots.iter().filter_map(|e| e.as_deref()).map(|e| &e.object)
    }

    /// The objects' ids, in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &ObjectId> + Clone {
        self.values().map(|o| &o.id)
    }

    /// `(id, object)` pairs, in id order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&ObjectId, &Object)> + Clone {
        self.values().map(|o| (&o.id, o))
    }
}

impl<'a> IntoIterator for &'a Objects {
    type Item = (&'a ObjectId, &'a Object);
    type IntoIter = Box<dyn DoubleEndedIterator<Item = (&'a ObjectId, &'a Object)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// Equal when they hold the same objects (the digests kept beside them are a cache).
impl PartialEq for Objects {
    fn eq(&self, other: &Objects) -> bool {
        self.len == other.len && self.values().eq(other.values())
    }
}

impl Eq for Objects {}

impl fmt::Debug for Objects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Encoded as the map from id to object it replaced (the same bytes).
impl Serialize for Objects {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.len))?;
        for (id, o) in self.iter() {
            map.serialize_entry(id, o)?;
        }
        map.end()
    }
}

/// Decoded from untrusted bytes: ids strictly increasing, each object under its own id, slots
/// below [`MAX_SLOTS`], so two objects never share a slot.
impl<'de> Deserialize<'de> for Objects {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Objects, D::Error> {
        struct ObjectsVisitor;
        impl<'de> Visitor<'de> for ObjectsVisitor {
            type Value = Objects;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from object id to object, in increasing slot order")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Objects, A::Error> {
                use serde::de::Error;
                let mut objects = Objects::default();
                let mut last: Option<u32> = None;
                while let Some((id, o)) = map.next_entry::<ObjectId, Object>()? {
                    if o.id != id {
                        return Err(A::Error::custom(format!("object {} is stored under id {id}", o.id)));
                    }
                    if id.slot() >= MAX_SLOTS || last.is_some_and(|l| l >= id.slot()) {
                        return Err(A::Error::custom(format!("object {id}: slots out of order or beyond the limit")));
                    }
                    last = Some(id.slot());
                    objects.insert(o, false);
                }
                Ok(objects)
            }
        }
        d.deserialize_map(ObjectsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec;
    use crate::fx::Fx;
    use crate::ids::AccountId;
    use crate::state::{ObjectKind, Shape};
    use crate::vec2::Vec2;

    fn object(slot: u32, generation: u32) -> Object {
        Object {
            id: ObjectId::new(slot, generation),
            kind: ObjectKind::Prim,
            owner: AccountId([7; 32]),
            name: format!("o{slot}"),
            shape: Shape::Circle { radius: Fx::ONE },
            position: Vec2::new(Fx::from_int(i64::from(slot)), Fx::ZERO),
            rotation: Fx::ZERO,
            velocity: Vec2::new(Fx::ZERO, Fx::ZERO),
            color: slot,
            text: String::new(),
            body: crate::state::BodyKind::Dynamic,
            surface: None,
        }
    }

    /// Map entries as they would be encoded, in any order: postcard writes a map as its length
    /// and its pairs, the same bytes as a sequence of pairs.
    fn encoded(pairs: &[(ObjectId, Object)]) -> Vec<u8> {
        codec::encode(&pairs.to_vec())
    }

    #[test]
    fn encodes_as_the_map_it_replaced_and_decodes_back() {
        let mut objects = Objects::default();
        let mut map = std::collections::BTreeMap::new();
        for (slot, generation) in [(5, 0), (0, 3), (9, 1)] {
            objects.insert(object(slot, generation), false);
            map.insert(ObjectId::new(slot, generation), Box::new(object(slot, generation)));
        }
        let bytes = codec::encode(&objects);
        assert_eq!(bytes, codec::encode(&map), "the same bytes as the BTreeMap of boxed objects");
        let back: Objects = codec::decode(&bytes, 1 << 20).unwrap();
        assert_eq!(back, objects);
        assert_eq!(back.keys().map(|id| id.slot()).collect::<Vec<_>>(), vec![0, 5, 9]);
        assert_eq!(back.get(&ObjectId::new(5, 0)).map(|o| o.color), Some(5));
        assert!(back.get(&ObjectId::new(5, 1)).is_none(), "another generation of the slot is not there");
    }

    #[test]
    fn untrusted_entries_out_of_order_repeated_misfiled_or_beyond_the_limit_are_errors() {
        let cases: Vec<(&str, Vec<(ObjectId, Object)>)> = vec![
            ("out of order", vec![(ObjectId::new(4, 0), object(4, 0)), (ObjectId::new(2, 0), object(2, 0))]),
            ("one slot twice", vec![(ObjectId::new(4, 0), object(4, 0)), (ObjectId::new(4, 1), object(4, 1))]),
            ("stored under another id", vec![(ObjectId::new(3, 0), object(4, 0))]),
            ("beyond the slot limit", vec![(ObjectId::new(MAX_SLOTS, 0), object(MAX_SLOTS, 0))]),
        ];
        for (what, pairs) in cases {
            let err = codec::decode::<Objects>(&encoded(&pairs), 1 << 20).expect_err(what);
            assert!(matches!(err, codec::DecodeError::Malformed { .. }), "{what}: {err}");
        }
    }

    #[test]
    fn a_replaced_object_keeps_its_fixed_digest_only_when_told_its_fixed_part_is_the_same() {
        let mut objects = Objects::default();
        objects.insert(object(1, 0), false);
        objects.set_fixed(1, [9; 32]);
        objects.insert(object(1, 0), true);
        assert_eq!(objects.with_fixed(1).map(|(_, f)| *f), Some([9; 32]));
        objects.insert(object(1, 0), false);
        assert_eq!(objects.with_fixed(1).map(|(_, f)| *f), Some([0; 32]));
        assert_eq!(objects.len(), 1);
        assert_eq!(objects.remove(&ObjectId::new(1, 1)), None, "not the generation held");
        assert!(objects.remove(&ObjectId::new(1, 0)).is_some());
        assert!(objects.is_empty() && objects.by_slot(1).is_none());
    }
}
