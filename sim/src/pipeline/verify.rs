//! Step 1, verify: signatures (verdicts computed ahead), sim id, size, account, ban, nonce and
//! field limits. Deterministic: the batch is first put in canonical order (author, nonce, id),
//! so the arrival order consensus saw never matters, and a bad event is dropped with the same
//! recorded reason on every node.

use std::collections::BTreeMap;

use crate::event::{AdminAct, Checked, ObjectEdit, Payload, VerifiedBatch};
use crate::ids::AccountId;
use crate::state::{Limits, RejectReason, Rejection, World};

/// Events that passed, and the rest with their reasons.
#[derive(Debug, Default)]
pub(crate) struct Verdicts<'a> {
    pub accepted: Vec<&'a Checked>,
    pub rejected: Vec<Rejection>,
    /// The highest nonce used up per author: accepted, or refused in a way that uses it up
    /// ([`consumes_nonce`]).
    pub nonces: BTreeMap<AccountId, u64>,
    /// Neighbours' mail with good signatures, for the links to count (in canonical order).
    pub mail: Vec<&'a Checked>,
}

/// Mail needs no account or nonce: the links count its copies per signer.
fn check_mail(world: &World, c: &Checked) -> Result<(), RejectReason> {
    if !c.signature_ok {
        return Err(RejectReason::BadSignature);
    }
    if c.size > crate::links::MAX_MAIL_BYTES {
        return Err(RejectReason::TooLarge { bytes: c.size, max: crate::links::MAX_MAIL_BYTES });
    }
    if c.event.body.sim != world.sim {
        return Err(RejectReason::WrongSim { expected: world.sim, got: c.event.body.sim });
    }
    Ok(())
}

pub(crate) fn check<'a>(world: &World, batch: &'a VerifiedBatch) -> Verdicts<'a> {
    let mut events: Vec<&Checked> = batch.events.iter().collect();
    events.sort_by(|a, b| {
        (a.event.body.author, a.event.body.nonce, a.id).cmp(&(b.event.body.author, b.event.body.nonce, b.id))
    });
    let mut v = Verdicts::default();
    for c in events {
        if let Payload::Mail { .. } = c.event.body.payload {
            match check_mail(world, c) {
                Ok(()) => v.mail.push(c),
                Err(reason) => v.rejected.push(Rejection { event: c.id, author: c.event.body.author, reason }),
            }
            continue;
        }
        match check_one(world, batch.time_ms, c, &v.nonces) {
            Ok(()) => {
                v.nonces.insert(c.event.body.author, c.event.body.nonce);
                v.accepted.push(c);
            }
            Err(reason) => {
                if consumes_nonce(world, c, &reason, &v.nonces) {
                    v.nonces.insert(c.event.body.author, c.event.body.nonce);
                }
                v.rejected.push(Rejection { event: c.id, author: c.event.body.author, reason })
            }
        }
    }
    v
}

fn check_one(world: &World, now_ms: u64, c: &Checked, nonces: &BTreeMap<AccountId, u64>) -> Result<(), RejectReason> {
    let body = &c.event.body;
    let limits = &world.settings.limits;
    if !c.signature_ok {
        return Err(RejectReason::BadSignature);
    }
    if c.size > limits.max_event_bytes {
        return Err(RejectReason::TooLarge { bytes: c.size, max: limits.max_event_bytes });
    }
    if body.sim != world.sim {
        return Err(RejectReason::WrongSim { expected: world.sim, got: body.sim });
    }
    let account = world.accounts.get(&body.author);
    if account.is_none() && !matches!(body.payload, Payload::Login { .. }) {
        return Err(RejectReason::UnknownAccount);
    }
    if world.governance.banned.contains(&body.author) {
        return Err(RejectReason::Banned);
    }
    if let Some(&until_ms) = world.governance.kicked_until_ms.get(&body.author)
        && now_ms < until_ms
    {
        return Err(RejectReason::Kicked { until_ms });
    }
    let last = nonces.get(&body.author).copied().or(account.map(|a| a.last_nonce)).unwrap_or(0);
    nonce_after(last, body.nonce)?;
    check_fields(&body.payload, limits)
}

/// A nonce must be above the last one used and at most [`MAX_NONCE_STEP`] above it.
fn nonce_after(last: u64, got: u64) -> Result<(), RejectReason> {
    if got <= last {
        return Err(RejectReason::StaleNonce { last, got });
    }
    if got - last > MAX_NONCE_STEP {
        return Err(RejectReason::InvalidValue {
            field: format!("nonce (at most {MAX_NONCE_STEP} above the last, {last})"),
        });
    }
    Ok(())
}

/// How far above its last accepted nonce an event's nonce may be: an account cannot lock itself
/// (or be locked by a stolen key's one event) out of every later nonce by using `u64::MAX`.
pub const MAX_NONCE_STEP: u64 = 1 << 20;

/// What a node checks before it takes a client's event into the pool: what execution would
/// refuse whatever the tick (its size, its fields, its nonce against the account's last, a
/// ban), so the pool never carries what can only be refused. (Kicks and roles depend on the
/// tick's time and are left to execution.)
pub fn check_at_door(world: &World, event: &crate::event::SignedEvent, size: u32) -> Result<(), RejectReason> {
    let body = &event.body;
    let limits = &world.settings.limits;
    if size > limits.max_event_bytes {
        return Err(RejectReason::TooLarge { bytes: size, max: limits.max_event_bytes });
    }
    if world.governance.banned.contains(&body.author) {
        return Err(RejectReason::Banned);
    }
    let last = world.accounts.get(&body.author).map_or(0, |a| a.last_nonce);
    nonce_after(last, body.nonce)?;
    check_fields(&body.payload, limits)
}

/// Whether a refused event still uses up its nonce: one its author really signed, for this sim,
/// with a fresh nonce, refused for what it asks or for its author's standing (kicked, banned, a
/// field too long). Its author's next try is then a new event with a new id, which gets an
/// outcome of its own once the cause is gone, while a replay of either stays stale. Events that
/// are not the author's (bad signature), not for this sim, or not new (stale nonce) use up
/// nothing: anyone could make those.
fn consumes_nonce(world: &World, c: &Checked, reason: &RejectReason, nonces: &BTreeMap<AccountId, u64>) -> bool {
    let body = &c.event.body;
    let by_standing_or_content = matches!(
        reason,
        RejectReason::Banned
            | RejectReason::Kicked { .. }
            | RejectReason::TooLarge { .. }
            | RejectReason::FieldTooLong { .. }
            | RejectReason::InvalidValue { .. }
    );
    let Some(account) = world.accounts.get(&body.author) else { return false };
    let last = nonces.get(&body.author).copied().unwrap_or(account.last_nonce);
    by_standing_or_content && c.signature_ok && body.sim == world.sim && nonce_after(last, body.nonce).is_ok()
}

fn too_long(field: &str, s: &str, max: u32) -> Result<(), RejectReason> {
    let len = s.len().min(u32::MAX as usize) as u32;
    if len > max { Err(RejectReason::FieldTooLong { field: field.into(), len, max }) } else { Ok(()) }
}

fn invalid(field: &str) -> RejectReason {
    RejectReason::InvalidValue { field: field.into() }
}

/// Limits that depend only on the payload and the settings.
fn check_fields(p: &Payload, l: &Limits) -> Result<(), RejectReason> {
    match p {
        Payload::Login { name } => too_long("name", name, l.max_name_bytes),
        Payload::Chat { text, .. } => too_long("text", text, l.max_chat_bytes),
        Payload::Rez { name, shape, text, .. } => {
            too_long("name", name, l.max_name_bytes)?;
            too_long("text", text, l.max_text_bytes)?;
            if shape.is_valid() { Ok(()) } else { Err(invalid("shape")) }
        }
        Payload::Edit { edit, .. } => {
            let ObjectEdit { name, text, color: _, shape, position: _, body: _, surface } = edit;
            name.as_deref().map_or(Ok(()), |n| too_long("name", n, l.max_name_bytes))?;
            text.as_deref().map_or(Ok(()), |t| too_long("text", t, l.max_text_bytes))?;
            surface.map_or(Ok(()), |s| s.check().map_err(invalid))?;
            if shape.is_none_or(|s| s.is_valid()) { Ok(()) } else { Err(invalid("shape")) }
        }
        Payload::DeployScript { source, licence, .. } => {
            too_long("source", source, l.max_source_bytes)?;
            too_long("licence", licence, 64)
        }
        Payload::Admin(AdminAct::SetSettings(s)) => s.check().map_err(|e| invalid(&format!("settings: {e}"))),
        Payload::Logout
        | Payload::Move { .. }
        | Payload::Touch { .. }
        | Payload::Derez { .. }
        | Payload::RezReturned { .. }
        | Payload::Mail { .. }
        | Payload::Admin(_) => Ok(()),
    }
}
