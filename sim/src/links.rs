//! Cross-sim links (DESIGN §7): a sim's neighbour sims, the mail between them, and the objects
//! in transit across a border.
//!
//! Every tick a sim's physics stage writes mail for each neighbour sim (ghost feeds and handoff
//! messages, opaque bytes here) and the pipeline attaches the records (object, script, source)
//! of the objects it has handed over and not yet seen settled. Every node of the sim computes
//! the same mail; each *validator* of the sim signs it as an event
//! ([`crate::Payload::Mail`]) for the neighbour, whose nodes take it into their pool like a
//! client's event. The receiving sim counts distinct signers from the sender's validator set
//! per (sender, tick, digest of the mail) and delivers the mail in the tick whose batch brings
//! the (f+1)-th matching copy: at least one honest validator of the sender vouches that the
//! sender committed it (DESIGN §7). Each (sender, tick) is delivered at most once; copies after
//! that are accepted and do nothing.
//!
//! Bounds, against a Byzantine signer of the neighbour: mail bodies are at most
//! [`MAX_MAIL_BYTES`]; a copy older than [`MAIL_WINDOW`] ticks behind the newest delivered
//! tick of its sender is refused; an undelivered entry expires [`MAIL_WINDOW`] of our ticks
//! after it was first seen; and a signer holds at most [`MAX_PENDING_PER_SIGNER`] undelivered
//! entries per neighbour, so junk from one signer blocks nobody else.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::ids::{AccountId, Hash32, ObjectId, SimId, Tick};
use crate::state::types::{Object, Region, RejectReason, ScriptInstance, ScriptSource};
use crate::vec2::Vec2;

/// How far (in ticks) mail may lag behind the newest mail delivered from the same sim, and
/// how long an undelivered entry waits for its quorum.
pub const MAIL_WINDOW: u64 = 1024;
/// The most bytes one mail body may have.
pub const MAX_MAIL_BYTES: u32 = 1 << 20;
/// Undelivered (sender tick) entries one signer may hold open per neighbour.
pub const MAX_PENDING_PER_SIGNER: usize = 256;
/// Neighbour sim ids must be below this (the physics stage names a neighbour's objects with
/// ids derived from the sim id; see `metatopia_physics::stage`).
pub const MAX_NEIGHBOUR_SIM: u32 = 512;
/// Validators a neighbour's mail may name (a larger set is ignored).
pub const MAX_NEIGHBOUR_VALIDATORS: usize = 1024;

/// A neighbour sim: where it is, and whose signatures vouch for its mail.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Neighbour {
    pub region: Region,
    pub validators: BTreeSet<AccountId>,
}

impl Neighbour {
    /// Matching copies needed: f + 1 of n = 3f + 1 (at least one honest signer).
    pub fn quorum(&self) -> usize {
        self.validators.len().saturating_sub(1) / 3 + 1
    }
}

/// An object on its way to another sim: everything the receiver needs to continue it.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ObjectRecord {
    pub object: Object,
    pub script: Option<(ScriptInstance, ScriptSource)>,
}

/// What a sim sends a neighbour for one tick.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct MailBody {
    /// The physics stage's messages (its own encoding).
    pub physics: Vec<u8>,
    /// Records of the objects handed to the receiver and not yet settled.
    pub records: Vec<ObjectRecord>,
    /// The sender's validators after the tick that produced it (the ones that sign it). The
    /// receiver counts copies signed by the validators it knows for the sender; once this mail
    /// is delivered — f + 1 of those vouched for it — and is the newest delivered from the
    /// sender, these are the ones it knows: a neighbour's set may change at its epoch
    /// boundaries (one admitted or removed validator at a time keeps f + 1 of the old signing).
    pub validators: Vec<AccountId>,
}

impl MailBody {
    pub fn encode(&self) -> Vec<u8> {
        codec::encode(self)
    }

    /// Decode a delivered body (bounded; a quorum-signed body is still checked).
    pub fn decode(bytes: &[u8]) -> Result<MailBody, codec::DecodeError> {
        codec::decode(bytes, MAX_MAIL_BYTES)
    }
}

/// Mail for a neighbour, as one tick produced it (the node signs and sends it).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OutMail {
    pub to: SimId,
    /// The tick that produced it.
    pub tick: Tick,
    /// [`MailBody`], encoded.
    pub body: Vec<u8>,
}

/// The digest the copies of one mail are counted under.
pub fn mail_digest(body: &[u8]) -> Hash32 {
    Hash32(*blake3::keyed_hash(&crate::merkle::keys::MAIL, body).as_bytes())
}

#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub(crate) struct Pending {
    /// Our tick when the first copy came.
    pub first_seen: Tick,
    pub votes: BTreeMap<Hash32, BTreeSet<AccountId>>,
}

/// An object handed over and not yet settled: its record goes with every mail to `to`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct Departed {
    pub to: SimId,
    pub record: ObjectRecord,
}

/// The cross-sim part of a world's state.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct Links {
    pub neighbours: BTreeMap<SimId, Neighbour>,
    /// Walls around the whole world (south-west and north-east corners), when there are
    /// neighbours; a sim without neighbours is walled at its own edges.
    pub bounds: Option<(Vec2, Vec2)>,
    pub(crate) pending: BTreeMap<(SimId, Tick), Pending>,
    /// Delivered sender ticks, per neighbour, within the window of the newest.
    pub(crate) delivered: BTreeMap<SimId, BTreeSet<Tick>>,
    pub(crate) departed: BTreeMap<ObjectId, Departed>,
}

/// What the mail of one batch did.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// Mail that reached its quorum this tick, in (sender, tick) order.
    pub delivered: Vec<(SimId, Tick, Result<MailBody, String>)>,
}

impl Links {
    pub fn is_empty(&self) -> bool {
        *self == Links::default()
    }

    /// Objects handed over and not yet settled, by id.
    pub fn departed(&self) -> &BTreeMap<ObjectId, Departed> {
        &self.departed
    }

    /// Delivered sender ticks from `from` (within the window).
    pub fn delivered_from(&self, from: SimId) -> impl Iterator<Item = Tick> + '_ {
        self.delivered.get(&from).into_iter().flatten().copied()
    }

    /// Whether `from`'s mail of `tick` was delivered, or is too old to be (a copy of it would
    /// do nothing).
    pub fn is_delivered(&self, from: SimId, tick: Tick) -> bool {
        self.delivered.get(&from).is_some_and(|d| {
            d.contains(&tick) || d.last().is_some_and(|newest| tick.0.saturating_add(MAIL_WINDOW) < newest.0)
        })
    }

    /// Delivered mail of `from`'s `tick` named the sender's validators: from now on they are
    /// the ones counted, if this is the newest mail delivered from it (an older one comes late
    /// and says less). A set that is empty, too large or not in order is ignored. Whether the
    /// set changed.
    pub(crate) fn update_validators(&mut self, from: SimId, tick: Tick, validators: &[AccountId]) -> bool {
        let newest = self.delivered.get(&from).and_then(|d| d.last()).copied();
        let Some(n) = self.neighbours.get_mut(&from) else { return false };
        let ordered = validators.windows(2).all(|w| w[0] < w[1]);
        if newest != Some(tick) || validators.is_empty() || validators.len() > MAX_NEIGHBOUR_VALIDATORS || !ordered {
            return false;
        }
        if n.validators.iter().eq(validators.iter()) {
            return false;
        }
        n.validators = validators.iter().copied().collect();
        true
    }

    /// Entries waiting for their quorum.
    pub fn pending_count(&self) -> usize {
        self.pending.len()
    }

    /// Structural checks for a world from untrusted bytes.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.neighbours.keys().any(|s| s.0 >= MAX_NEIGHBOUR_SIM) {
            return Err(format!("a neighbour sim id is not below {MAX_NEIGHBOUR_SIM}"));
        }
        if self.neighbours.values().any(|n| n.validators.is_empty()) {
            return Err("a neighbour sim has no validators".into());
        }
        Ok(())
    }

    /// Count one signed copy of `from`'s mail of `tick` (signature, sim and size already
    /// checked). `Ok` when it counted or was a harmless duplicate.
    pub(crate) fn vote(
        &mut self,
        now: Tick,
        from: SimId,
        tick: Tick,
        signer: AccountId,
        body: &[u8],
        out: &mut Received,
    ) -> Result<(), RejectReason> {
        let Some(n) = self.neighbours.get(&from) else {
            return Err(RejectReason::NotNeighbour { sim: from });
        };
        if !n.validators.contains(&signer) {
            return Err(RejectReason::NotNeighbourValidator { sim: from });
        }
        let quorum = n.quorum();
        let delivered = self.delivered.entry(from).or_default();
        if delivered.contains(&tick) {
            return Ok(()); // a late copy of delivered mail
        }
        if let Some(newest) = delivered.last()
            && tick.0.saturating_add(MAIL_WINDOW) < newest.0
        {
            return Err(RejectReason::MailTooOld { tick, newest: *newest });
        }
        let digest = mail_digest(body);
        let entry = self.pending.get(&(from, tick));
        if entry.is_some_and(|p| p.votes.values().any(|s| s.contains(&signer))) {
            return Ok(()); // this signer already counted for this tick
        }
        if entry.is_none() {
            let open = self
                .pending
                .range((from, Tick(0))..=(from, Tick(u64::MAX)))
                .filter(|(_, p)| p.votes.values().any(|s| s.contains(&signer)))
                .count();
            if open >= MAX_PENDING_PER_SIGNER {
                return Err(RejectReason::MailBacklog { sim: from });
            }
        }
        let p = self.pending.entry((from, tick)).or_insert_with(|| Pending { first_seen: now, votes: BTreeMap::new() });
        let signers = p.votes.entry(digest).or_default();
        signers.insert(signer);
        if signers.len() >= quorum {
            self.pending.remove(&(from, tick));
            let delivered = self.delivered.entry(from).or_default();
            delivered.insert(tick);
            out.delivered.push((from, tick, MailBody::decode(body).map_err(|e| e.to_string())));
        }
        Ok(())
    }

    /// End of tick: forget what fell out of the windows.
    pub(crate) fn prune(&mut self, now: Tick) {
        for ticks in self.delivered.values_mut() {
            if let Some(newest) = ticks.last().copied() {
                let floor = Tick(newest.0.saturating_sub(MAIL_WINDOW));
                *ticks = ticks.split_off(&floor);
            }
        }
        let delivered = &self.delivered;
        self.pending.retain(|(from, tick), p| {
            let fresh = p.first_seen.0.saturating_add(MAIL_WINDOW) >= now.0;
            let in_window = delivered
                .get(from)
                .and_then(|d| d.last())
                .is_none_or(|newest| tick.0.saturating_add(MAIL_WINDOW) >= newest.0);
            fresh && in_window
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acct(n: u8) -> AccountId {
        AccountId([n; 32])
    }

    fn links(validators: u8) -> Links {
        let mut l = Links::default();
        let region = Region { origin: Vec2::ZERO, size: crate::Fx::from_int(64) };
        l.neighbours.insert(SimId(1), Neighbour { region, validators: (1..=validators).map(acct).collect() });
        l
    }

    #[test]
    fn quorum_is_f_plus_one() {
        assert_eq!(links(1).neighbours[&SimId(1)].quorum(), 1);
        assert_eq!(links(4).neighbours[&SimId(1)].quorum(), 2);
        assert_eq!(links(7).neighbours[&SimId(1)].quorum(), 3);
    }

    #[test]
    fn mail_is_delivered_once_at_the_quorum_and_only_for_matching_copies() {
        let mut l = links(4);
        let body = MailBody::default().encode();
        let mut other = MailBody::default();
        other.physics.push(1);
        let other = other.encode();
        let mut out = Received::default();
        let (now, from, t) = (Tick(5), SimId(1), Tick(3));
        // A lone copy, and a different body from a second signer: no quorum.
        l.vote(now, from, t, acct(1), &body, &mut out).unwrap();
        l.vote(now, from, t, acct(2), &other, &mut out).unwrap();
        // The same signer again counts once.
        l.vote(now, from, t, acct(1), &body, &mut out).unwrap();
        assert!(out.delivered.is_empty());
        l.vote(now, from, t, acct(3), &body, &mut out).unwrap();
        assert_eq!(out.delivered.len(), 1);
        assert_eq!(out.delivered[0].2.as_ref().unwrap(), &MailBody::default());
        // Late copies do nothing (and a node can tell so before they cost a place in a batch).
        assert!(l.is_delivered(from, t) && !l.is_delivered(from, Tick(4)));
        l.vote(now, from, t, acct(4), &body, &mut out).unwrap();
        assert_eq!(out.delivered.len(), 1);
        assert_eq!(l.pending_count(), 0);
    }

    #[test]
    fn strangers_unknown_sims_old_and_flooding_signers_are_refused() {
        let mut l = links(4);
        let body = MailBody::default().encode();
        let mut out = Received::default();
        assert_eq!(
            l.vote(Tick(0), SimId(1), Tick(0), acct(9), &body, &mut out),
            Err(RejectReason::NotNeighbourValidator { sim: SimId(1) })
        );
        assert_eq!(
            l.vote(Tick(0), SimId(2), Tick(0), acct(1), &body, &mut out),
            Err(RejectReason::NotNeighbour { sim: SimId(2) })
        );
        for s in [1, 2] {
            l.vote(Tick(0), SimId(1), Tick(5000), acct(s), &body, &mut out).unwrap();
        }
        assert_eq!(out.delivered.len(), 1);
        assert!(matches!(
            l.vote(Tick(0), SimId(1), Tick(10), acct(1), &body, &mut out),
            Err(RejectReason::MailTooOld { .. })
        ));
        assert!(l.is_delivered(SimId(1), Tick(10)), "too old counts as done");
        // One signer alone fills its own backlog, and nobody else's.
        for t in 0..MAX_PENDING_PER_SIGNER as u64 {
            l.vote(Tick(0), SimId(1), Tick(6000 + t), acct(4), &body, &mut out).unwrap();
        }
        assert_eq!(
            l.vote(Tick(0), SimId(1), Tick(9000), acct(4), &body, &mut out),
            Err(RejectReason::MailBacklog { sim: SimId(1) })
        );
        l.vote(Tick(0), SimId(1), Tick(9000), acct(3), &body, &mut out).unwrap();
        // Undelivered entries expire.
        l.prune(Tick(MAIL_WINDOW + 1));
        assert_eq!(l.pending_count(), 0);
    }

    #[test]
    fn the_newest_delivered_mail_sets_the_neighbours_validators() {
        let mut l = links(4);
        let mut out = Received::default();
        let from = SimId(1);
        // Validator 5 admitted, then 1 removed: each set is vouched for by f + 1 of the last.
        let admitted: Vec<AccountId> = (1..=5).map(acct).collect();
        let rotated: Vec<AccountId> = (2..=5).map(acct).collect();
        let mail = |v: &[AccountId]| MailBody { validators: v.to_vec(), ..MailBody::default() }.encode();
        for s in [1, 2] {
            l.vote(Tick(0), from, Tick(10), acct(s), &mail(&admitted), &mut out).unwrap();
        }
        assert!(l.update_validators(from, Tick(10), &admitted));
        assert_eq!(l.neighbours[&from].validators.len(), 5);
        assert_eq!(l.neighbours[&from].quorum(), 2);
        // The new validator's copy counts now.
        for s in [5, 2] {
            l.vote(Tick(0), from, Tick(20), acct(s), &mail(&rotated), &mut out).unwrap();
        }
        // A set from mail older than the newest delivered is not taken, nor one out of order,
        // empty or too large; the newest is.
        assert!(!l.update_validators(from, Tick(10), &rotated));
        let mut unordered = rotated.clone();
        unordered.reverse();
        assert!(!l.update_validators(from, Tick(20), &unordered));
        assert!(!l.update_validators(from, Tick(20), &[]));
        let huge: Vec<AccountId> = (0..=MAX_NEIGHBOUR_VALIDATORS as u32)
            .map(|i| AccountId(*blake3::hash(&i.to_le_bytes()).as_bytes()))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        assert!(!l.update_validators(from, Tick(20), &huge));
        assert!(l.update_validators(from, Tick(20), &rotated));
        assert!(!l.update_validators(from, Tick(20), &rotated), "the same set again changes nothing");
        assert_eq!(
            l.vote(Tick(0), from, Tick(30), acct(1), &mail(&rotated), &mut out),
            Err(RejectReason::NotNeighbourValidator { sim: from })
        );
        // Not a neighbour: nothing.
        assert!(!l.update_validators(SimId(7), Tick(20), &rotated));
    }
}
