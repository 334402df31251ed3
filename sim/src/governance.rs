//! Governance (DESIGN §10): roles as pure functions of state and BFT time, and the governance
//! unit of the tick (logins, object lifecycle, admin acts).
//!
//! The temp-admin rule, with settings X (`admin_absent_days`) and Y (`temp_admin_active_days`):
//! if the admin's last login is more than X days ago, the temp admin is the account with the
//! earliest `joined_at` (ties: smallest account id) among those, other than the admin and not
//! banned, whose last login is within Y days; otherwise there is none. Roles are recomputed from
//! state at every tick; every admin act of tick t is checked against the roles of `World_t` at
//! the batch's BFT time, so acts within one tick never depend on each other's order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::{AdminAct, Checked, Payload};
use crate::fx::Fx;
use crate::host::PhysicsCommand;
use crate::ids::{AccountId, ObjectId};
use crate::state::{
    BodyKind, DAY_MS, MAX_RETURNED, Object, ObjectKind, RejectReason, Rejection, Returned, Shape, World,
};

/// An account's standing in a sim.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Role {
    Admin,
    TempAdmin,
    Member,
}

/// Why the roles are what they are, for `admin status`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct RoleReport {
    pub admin: AccountId,
    /// Whole days since the admin's last login (or since genesis if never).
    pub admin_days_absent: u64,
    pub admin_absent: bool,
    pub temp_admin: Option<AccountId>,
    /// The rule that decided, in words.
    pub reason: String,
}

/// BFT time of the admin's last login; the genesis time if the admin never logged in.
pub fn admin_last_seen_ms(world: &World) -> u64 {
    let g = &world.governance;
    world.accounts.get(&g.admin).map_or(g.genesis_ms, |a| a.last_login_ms)
}

/// Whether the admin counts as absent at `now_ms` (more than X days since the last login).
pub fn admin_absent(world: &World, now_ms: u64) -> bool {
    let x_ms = u64::from(world.settings.admin_absent_days).saturating_mul(DAY_MS);
    now_ms.saturating_sub(admin_last_seen_ms(world)) > x_ms
}

/// The temp admin at `now_ms`, if any.
pub fn temp_admin(world: &World, now_ms: u64) -> Option<AccountId> {
    if !admin_absent(world, now_ms) {
        return None;
    }
    let y_ms = u64::from(world.settings.temp_admin_active_days).saturating_mul(DAY_MS);
    let g = &world.governance;
    world
        .accounts
        .values()
        .filter(|a| a.id != g.admin && !g.banned.contains(&a.id))
        .filter(|a| now_ms.saturating_sub(a.last_login_ms) <= y_ms)
        .min_by_key(|a| (a.joined_at_ms, a.id))
        .map(|a| a.id)
}

/// An account's role at `now_ms`.
pub fn role_of(world: &World, account: &AccountId, now_ms: u64) -> Role {
    if *account == world.governance.admin {
        Role::Admin
    } else if temp_admin(world, now_ms) == Some(*account) {
        Role::TempAdmin
    } else {
        Role::Member
    }
}

/// The roles and the reason, for display.
pub fn report(world: &World, now_ms: u64) -> RoleReport {
    let admin = world.governance.admin;
    let absent_ms = now_ms.saturating_sub(admin_last_seen_ms(world));
    let absent = admin_absent(world, now_ms);
    let temp = temp_admin(world, now_ms);
    let (x, y) = (world.settings.admin_absent_days, world.settings.temp_admin_active_days);
    let reason = match (absent, temp) {
        (false, _) => format!("the admin logged in within {x} days: no temp admin"),
        (true, Some(_)) => format!(
            "the admin has been absent more than {x} days: the temp admin is the earliest-joined account active within {y} days"
        ),
        (true, None) => {
            format!("the admin has been absent more than {x} days, but no account was active within {y} days")
        }
    };
    RoleReport { admin, admin_days_absent: absent_ms / DAY_MS, admin_absent: absent, temp_admin: temp, reason }
}

/// What the governance unit sends on.
#[derive(Debug, Default)]
pub(crate) struct GovernanceOut {
    pub rejected: Vec<Rejection>,
    pub physics: Vec<PhysicsCommand>,
}

/// Run the governance unit: its events in canonical order, on the world being merged.
/// `temp` is the temp admin of `World_t` at the batch time.
pub(crate) fn apply(world: &mut World, events: &[&Checked], temp: Option<AccountId>, now_ms: u64) -> GovernanceOut {
    let admin = world.governance.admin;
    let mut out = GovernanceOut::default();
    // Prims per owner, counted once the tick's first rez needs it and kept up to date after.
    let mut prims: Option<BTreeMap<AccountId, u64>> = None;
    for c in events {
        let author = c.event.body.author;
        if matches!(c.event.body.payload, Payload::Rez { .. } | Payload::RezReturned { .. })
            && let Err(reason) = prim_quota(world, &mut prims, author)
        {
            out.rejected.push(Rejection { event: c.id, author, reason });
            continue;
        }
        let result = match &c.event.body.payload {
            Payload::Login { name } => login(world, author, name, now_ms, &mut out),
            Payload::Logout => {
                let avatar = world.accounts.get(&author).and_then(|a| a.avatar);
                if let Some(id) = avatar {
                    despawn(world, id, &mut out);
                }
                Ok(())
            }
            Payload::Rez { name, shape, position, color, text, body } => {
                if !world.region.contains(*position) {
                    Err(RejectReason::InvalidValue { field: "position".into() })
                } else {
                    let (shape, position, color, body) = (*shape, *position, *color, *body);
                    let new = NewObject { kind: ObjectKind::Prim, name, shape, position, color, text, body };
                    spawn(world, author, new, &mut out).map(|_| count_prim(&mut prims, author, true))
                }
            }
            Payload::RezReturned { index, position } => {
                let got = world.accounts.get(&author).and_then(|a| a.returned.get(*index as usize)).cloned();
                match got {
                    None => Err(RejectReason::InvalidValue { field: "index (no such returned object)".into() }),
                    Some(_) if !world.region.contains(*position) => {
                        Err(RejectReason::InvalidValue { field: "position".into() })
                    }
                    Some(r) => {
                        // A returned object comes back anchored (as a rezzed prim does).
                        let new = NewObject {
                            kind: ObjectKind::Prim,
                            name: &r.name,
                            shape: r.shape,
                            position: *position,
                            color: r.color,
                            text: &r.text,
                            body: BodyKind::Static,
                        };
                        spawn(world, author, new, &mut out).map(|_| {
                            count_prim(&mut prims, author, true);
                            if let Some(a) = world.account_mut(&author) {
                                a.returned.remove(*index as usize);
                            }
                        })
                    }
                }
            }
            Payload::Derez { object } => match world.objects.get(object) {
                None => Err(RejectReason::NoSuchObject { object: *object }),
                Some(o) if o.owner != author => Err(RejectReason::NotOwner { object: *object }),
                Some(o) => {
                    if o.kind == ObjectKind::Prim {
                        count_prim(&mut prims, author, false);
                    }
                    despawn(world, *object, &mut out);
                    Ok(())
                }
            },
            Payload::Admin(act) => {
                // Admin acts may remove or return anyone's objects: count again if needed.
                prims = None;
                if author == admin || Some(author) == temp {
                    admin_act(world, act, now_ms, &mut out)
                } else {
                    Err(RejectReason::NotAuthorized { act: act.name().into() })
                }
            }
            other => unreachable!("routed a non-governance payload to governance: {other:?}"),
        };
        if let Err(reason) = result {
            out.rejected.push(Rejection { event: c.id, author, reason });
        }
    }
    out
}

/// Refuse a rez that would take `author` past `max_objects_per_account` prims.
fn prim_quota(
    world: &World,
    prims: &mut Option<BTreeMap<AccountId, u64>>,
    author: AccountId,
) -> Result<(), RejectReason> {
    let counts = prims.get_or_insert_with(|| {
        let mut m = BTreeMap::new();
        for o in world.objects.values().filter(|o| o.kind == ObjectKind::Prim) {
            *m.entry(o.owner).or_default() += 1;
        }
        m
    });
    let used = counts.get(&author).copied().unwrap_or(0);
    let max = u64::from(world.settings.limits.max_objects_per_account);
    if used >= max { Err(RejectReason::AccountQuota { what: "objects".into(), used, max }) } else { Ok(()) }
}

fn count_prim(prims: &mut Option<BTreeMap<AccountId, u64>>, owner: AccountId, added: bool) {
    if let Some(n) = prims.as_mut().map(|m| m.entry(owner).or_default()) {
        *n = if added { n.saturating_add(1) } else { n.saturating_sub(1) };
    }
}

/// How long an avatar stays in the world after its account last logged in (BFT time). A client
/// keeps its session by logging in again every [`SESSION_REFRESH_MS`]; one that quits, is
/// killed or loses its network stops, and its avatar is gone a minute later on every node.
pub const SESSION_GRACE_MS: u64 = 60_000;
/// How often a connected client refreshes its session (a `Login` while its avatar is in the
/// world only refreshes `last_login`): three refreshes fit in the grace period.
pub const SESSION_REFRESH_MS: u64 = 20_000;

/// Remove the avatars whose accounts have not logged in for [`SESSION_GRACE_MS`]: sessions
/// that ended without a logout. The despawns for physics.
pub(crate) fn expire_sessions(world: &mut World, now_ms: u64) -> Vec<PhysicsCommand> {
    let stale: Vec<ObjectId> = world
        .accounts
        .values()
        .filter(|a| now_ms.saturating_sub(a.last_login_ms) > SESSION_GRACE_MS)
        .filter_map(|a| a.avatar)
        .collect();
    let mut out = GovernanceOut::default();
    for id in stale {
        despawn(world, id, &mut out);
    }
    out.physics
}

fn login(
    world: &mut World,
    author: AccountId,
    name: &str,
    now_ms: u64,
    out: &mut GovernanceOut,
) -> Result<(), RejectReason> {
    match world.account_mut(&author) {
        Some(a) => {
            a.last_login_ms = now_ms;
            a.name = name.to_string();
        }
        None => {
            world.create_account(author, name.to_string(), now_ms);
        }
    }
    let has_avatar = world.accounts.get(&author).and_then(|a| a.avatar).is_some();
    // An avatar on its way into a neighbour (handed over, not yet settled) is still the
    // account's one avatar: a login sent while it was here (a client keeping its session) keeps
    // the session and spawns no second one.
    let in_transit = || {
        world
            .links
            .departed
            .values()
            .any(|d| d.record.object.owner == author && d.record.object.kind == ObjectKind::Avatar)
    };
    if has_avatar || in_transit() {
        return Ok(());
    }
    let at = landing_spot(world);
    let shape = Shape::Circle { radius: Fx::HALF };
    let avatar = NewObject {
        kind: ObjectKind::Avatar,
        name,
        shape,
        position: at,
        color: 0xffff_ffff,
        text: "",
        body: BodyKind::Dynamic,
    };
    let id = spawn(world, author, avatar, out)?;
    if let Some(a) = world.account_mut(&author) {
        a.avatar = Some(id);
    }
    Ok(())
}

/// Spacing of the landing spots around the region's centre (an avatar is 1 m across).
const LANDING_STEP_BITS: i64 = 5 << 14; // 1.25 m
/// Rings of landing spots tried around the centre (33 × 33 around it, 4,225 spots, 40 m).
const LANDING_RINGS: i64 = 32;

/// Where a logging-in avatar appears: the region's centre, or the free spot nearest to it on
/// a grid of [`LANDING_STEP_BITS`] around it when other avatars stand there (no two overlap,
/// so a crowd arriving together stands side by side instead of being thrown apart by the
/// physics). Ties go to the lower ring, then row, then column; the same on every node. When the
/// rings are full, the centre.
fn landing_spot(world: &World) -> crate::vec2::Vec2 {
    use crate::vec2::Vec2;
    let centre = world.region.centre();
    let step = LANDING_STEP_BITS;
    let reach = Fx::from_bits(step * (LANDING_RINGS + 2));
    // The avatars near the centre, by grid cell.
    let mut near: BTreeMap<(i64, i64), Vec<Vec2>> = BTreeMap::new();
    for o in world.objects().values().filter(|o| o.kind == ObjectKind::Avatar) {
        let d = o.position - centre;
        if d.x.abs() <= reach && d.y.abs() <= reach {
            let cell = (d.x.to_bits().div_euclid(step), d.y.to_bits().div_euclid(step));
            near.entry(cell).or_default().push(o.position);
        }
    }
    if near.is_empty() {
        return centre;
    }
    // Two avatars of radius ½ m overlap closer than 1 m (squared, in bits²).
    let apart = i128::from(Fx::ONE.to_bits()).pow(2);
    let free = |p: Vec2| {
        let d = p - centre;
        let (cx, cy) = (d.x.to_bits().div_euclid(step), d.y.to_bits().div_euclid(step));
        (cx - 1..=cx + 1).all(|x| {
            (cy - 1..=cy + 1).all(|y| {
                near.get(&(x, y)).is_none_or(|v| {
                    v.iter().all(|q| {
                        let (dx, dy) = (i128::from((p.x - q.x).to_bits()), i128::from((p.y - q.y).to_bits()));
                        dx * dx + dy * dy >= apart
                    })
                })
            })
        })
    };
    for ring in 0..=LANDING_RINGS {
        let mut spots: Vec<(i64, i64)> = (-ring..=ring)
            .flat_map(|i| (-ring..=ring).map(move |j| (i, j)))
            .filter(|(i, j)| i.abs().max(j.abs()) == ring)
            .collect();
        spots.sort_by_key(|&(i, j)| (i * i + j * j, i, j));
        for (i, j) in spots {
            let p = centre + Vec2::new(Fx::from_bits(i * step), Fx::from_bits(j * step));
            if world.region.contains(p) && free(p) {
                return p;
            }
        }
    }
    centre
}

/// An object to put into the world.
struct NewObject<'a> {
    kind: ObjectKind,
    name: &'a str,
    shape: Shape,
    position: crate::vec2::Vec2,
    color: u32,
    text: &'a str,
    body: BodyKind,
}

fn spawn(
    world: &mut World,
    owner: AccountId,
    new: NewObject<'_>,
    out: &mut GovernanceOut,
) -> Result<ObjectId, RejectReason> {
    let max = world.settings.limits.max_objects;
    if world.object_count() >= max {
        return Err(RejectReason::ObjectLimit { max });
    }
    let NewObject { kind, name, shape, position, color, text, body } = new;
    let id = world.allocate_object_id();
    world.put_object(Object {
        id,
        kind,
        owner,
        name: name.to_string(),
        shape,
        position,
        rotation: Fx::ZERO,
        velocity: crate::vec2::Vec2::ZERO,
        color,
        text: text.to_string(),
        body,
        surface: None,
    });
    let velocity = crate::vec2::Vec2::ZERO;
    out.physics.push(PhysicsCommand::Spawn { object: id, position, velocity, shape, body, surface: None });
    Ok(id)
}

fn despawn(world: &mut World, id: ObjectId, out: &mut GovernanceOut) {
    if world.remove_object(id).is_some() {
        out.physics.push(PhysicsCommand::Despawn { object: id });
    }
}

fn remove_avatar(world: &mut World, account: &AccountId, out: &mut GovernanceOut) {
    if let Some(id) = world.accounts.get(account).and_then(|a| a.avatar) {
        despawn(world, id, out);
    }
}

fn admin_act(world: &mut World, act: &AdminAct, now_ms: u64, out: &mut GovernanceOut) -> Result<(), RejectReason> {
    let g_admin = world.governance.admin;
    match act {
        AdminAct::Kick { account } => {
            let until = now_ms.saturating_add(world.settings.kick_cooldown_ms);
            world.governance.kicked_until_ms.insert(*account, until);
            remove_avatar(world, account, out);
        }
        AdminAct::Ban { account } => {
            if *account == g_admin {
                return Err(RejectReason::InvalidValue { field: "account (the permanent admin)".into() });
            }
            world.governance.banned.insert(*account);
            remove_avatar(world, account, out);
        }
        AdminAct::Unban { account } => {
            world.governance.banned.remove(account);
        }
        AdminAct::SetSettings(s) => world.settings = s.clone(),
        AdminAct::RemoveObject { object } => {
            if !world.objects.contains_key(object) {
                return Err(RejectReason::NoSuchObject { object: *object });
            }
            despawn(world, *object, out);
        }
        AdminAct::ReturnObject { object } => {
            let Some(o) = world.objects.get(object) else {
                return Err(RejectReason::NoSuchObject { object: *object });
            };
            if o.kind == ObjectKind::Avatar {
                return Err(RejectReason::InvalidValue { field: "object (an avatar: kick instead)".into() });
            }
            let owner = o.owner;
            let returned = Returned {
                name: o.name.clone(),
                shape: o.shape,
                color: o.color,
                text: o.text.clone(),
                script: world.script_source(*object).cloned(),
                returned_at_ms: now_ms,
            };
            match world.accounts.get(&owner).map(|a| a.returned.len()) {
                None => {
                    return Err(RejectReason::InvalidValue { field: "object (its owner has no account here)".into() });
                }
                Some(n) if n >= MAX_RETURNED => {
                    return Err(RejectReason::InvalidValue {
                        field: "object (the owner's returned objects are full)".into(),
                    });
                }
                Some(_) => {}
            }
            despawn(world, *object, out);
            if let Some(a) = world.account_mut(&owner) {
                a.returned.push(returned);
            }
        }
        AdminAct::RemoveScript { object } => {
            if !world.scripts.contains_key(object) {
                return Err(RejectReason::NoSuchObject { object: *object });
            }
            world.remove_script(*object);
        }
        AdminAct::AdmitValidator { key } => {
            world.governance.pending_validators.insert(*key, true);
        }
        AdminAct::RemoveValidator { key } => {
            world.governance.pending_validators.insert(*key, false);
        }
        AdminAct::TransferAdmin { to } => world.governance.admin = *to,
    }
    Ok(())
}

/// At an epoch boundary, apply the pending validator changes.
pub(crate) fn end_of_tick(world: &mut World) {
    let epoch = world.settings.epoch_ticks.max(1);
    if world.tick.0.is_multiple_of(epoch) && !world.governance.pending_validators.is_empty() {
        let pending = std::mem::take(&mut world.governance.pending_validators);
        for (key, admit) in pending {
            if admit {
                world.governance.validators.insert(key);
            } else {
                world.governance.validators.remove(&key);
            }
        }
    }
}
