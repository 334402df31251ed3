//! The scenario file format (TOML; documented in `scenarios/README.md`): a world, its
//! validators, accounts, scripted objects, bots, client steps at ticks, faults, and what must
//! hold. Unknown keys and bad values are errors that name the line.

use std::collections::BTreeSet;
use std::fmt;

use serde::Deserialize;
use toml::Spanned;

/// A parsed, checked scenario.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The default seed (`--seed` overrides).
    #[serde(default = "one")]
    pub seed: u64,
    /// Virtual seconds to run.
    pub duration_secs: f64,
    #[serde(default)]
    pub world: WorldSpec,
    #[serde(default)]
    pub validators: ValidatorsSpec,
    #[serde(default)]
    pub network: NetworkSpec,
    #[serde(default)]
    pub bots: BotsSpec,
    #[serde(default)]
    pub accounts: Vec<Spanned<AccountSpec>>,
    #[serde(default)]
    pub objects: Vec<Spanned<ObjectSpec>>,
    #[serde(default)]
    pub steps: Vec<Spanned<StepSpec>>,
    #[serde(default)]
    pub faults: Vec<Spanned<FaultSpec>>,
    #[serde(default)]
    pub expect: Vec<Spanned<Expect>>,
}

fn one() -> u64 {
    1
}

/// When scenarios start unless they say otherwise: 2026-11-18T22:13:20Z.
pub const DEFAULT_START_UNIX_MS: u64 = 1_795_000_000_000;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorldSpec {
    /// Sims side by side, on a grid of `columns` columns (default: as square as it gets),
    /// numbered 1, 2, … row by row from the south-west; sim k's validators are nodes
    /// (k-1)·n … k·n-1. Each sim runs one `region_size` square; bodies cross between them.
    pub sims: u32,
    pub columns: Option<u32>,
    /// Side of the square region, metres.
    pub region_size: i64,
    pub tick_rate_hz: u32,
    /// Random prims and players (the bots' accounts) of the seeded demo world, besides the
    /// named objects and accounts.
    pub random_objects: u32,
    pub random_players: u32,
    /// Per mille of random prims that start moving.
    pub moving_per_mille: u32,
    /// Sim milliseconds per BFT millisecond (governance days pass faster).
    pub time_scale: u64,
    /// The Unix time (milliseconds) the nodes' clocks read when the scenario starts, and its
    /// sims' genesis time: a real-looking date by default, as outside the lab (0 runs it at the
    /// epoch).
    pub start_unix_ms: u64,
    /// `kinematic` or `rapier`.
    pub physics: String,
    /// Settings (DESIGN §10): X and Y in days, the validator epoch, the kick cooldown.
    pub admin_absent_days: Option<u32>,
    pub temp_admin_active_days: Option<u32>,
    pub epoch_ticks: Option<u64>,
    pub kick_cooldown_secs: Option<u64>,
    pub aoi_radius_m: Option<u32>,
}

impl Default for WorldSpec {
    fn default() -> WorldSpec {
        WorldSpec {
            sims: 1,
            columns: None,
            region_size: 64,
            tick_rate_hz: 20,
            random_objects: 0,
            random_players: 0,
            moving_per_mille: 0,
            time_scale: 1,
            start_unix_ms: DEFAULT_START_UNIX_MS,
            physics: "kinematic".into(),
            admin_absent_days: None,
            temp_admin_active_days: None,
            epoch_ticks: None,
            kick_cooldown_secs: None,
            aoi_radius_m: None,
        }
    }
}

impl WorldSpec {
    /// Columns and rows of the grid of sims.
    pub fn layout(&self) -> (u32, u32) {
        let sims = self.sims.max(1);
        let cols = self.columns.unwrap_or_else(|| (1..=sims).find(|c| c * c >= sims).unwrap_or(1)).clamp(1, sims);
        (cols, sims.div_ceil(cols))
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidatorsSpec {
    pub count: u16,
    /// Nodes that follow without voting (numbered after the validators); an admin's
    /// `admit_validator` makes one vote from the next epoch boundary.
    pub observers: u16,
}

impl Default for ValidatorsSpec {
    fn default() -> ValidatorsSpec {
        ValidatorsSpec { count: 4, observers: 0 }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkSpec {
    pub delay_min_ms: f64,
    pub delay_max_ms: f64,
    pub loss_percent: f64,
    pub duplicate_percent: f64,
}

impl Default for NetworkSpec {
    fn default() -> NetworkSpec {
        NetworkSpec { delay_min_ms: 0.3, delay_max_ms: 5.0, loss_percent: 0.0, duplicate_percent: 0.0 }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BotsSpec {
    /// Signed random events per tick (from the demo world's players), through `node`.
    pub events_per_tick: u32,
    pub node: u16,
}

/// A named account; its key is derived from the name (scenarios only).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountSpec {
    pub name: String,
    /// The sim's permanent admin at genesis (at most one; default: the demo admin).
    #[serde(default)]
    pub admin: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectSpec {
    pub name: String,
    pub at: [f64; 2],
    /// `box` (half sizes `size`) or `circle` (radius `size[0]`).
    #[serde(default = "box_shape")]
    pub shape: String,
    #[serde(default = "half")]
    pub size: [f64; 2],
    /// RRGGBBAA hex.
    #[serde(default = "grey")]
    pub color: String,
    #[serde(default)]
    pub text: String,
    /// An account name (default: the admin).
    pub owner: Option<String>,
    /// A file of `scenarios/scripts/`, attached at genesis.
    pub script: Option<String>,
    #[serde(default = "agpl")]
    pub licence: String,
    #[serde(default)]
    pub velocity: Option<[f64; 2]>,
    /// `static` (anchored), `kinematic` (moved by its script) or `dynamic` (physics). Default:
    /// `dynamic` if it has a `velocity`, else `static`.
    #[serde(default)]
    pub body: Option<String>,
}

fn box_shape() -> String {
    "box".into()
}
fn half() -> [f64; 2] {
    [0.5, 0.5]
}
fn grey() -> String {
    "808080ff".into()
}
fn agpl() -> String {
    "AGPL-3.0-or-later".into()
}

/// What a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Login,
    Logout,
    Chat,
    Touch,
    Move,
    Deploy,
    Kick,
    Ban,
    Unban,
    TransferAdmin,
    AdmitValidator,
    RemoveValidator,
    RemoveObject,
    /// Submit this account's previous signed event again, byte for byte.
    Replay,
}

/// A client's signed input at a tick.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    /// Submitted once the `via` node has executed up to this tick.
    pub at_tick: u64,
    /// The account that signs.
    pub by: String,
    #[serde(rename = "do")]
    pub action: Action,
    /// The node it is submitted through.
    #[serde(default)]
    pub via: u16,
    /// A name for expectations (`outcome`).
    pub label: Option<String>,
    pub text: Option<String>,
    #[serde(default)]
    pub channel: i32,
    /// `whisper`, `say` or `shout`.
    pub range: Option<String>,
    /// An object name (touch, deploy, remove_object).
    pub object: Option<String>,
    pub velocity: Option<[f64; 2]>,
    pub script: Option<String>,
    /// An account name (kick, ban, unban, transfer_admin).
    pub account: Option<String>,
    /// A validator index (admit_validator, remove_validator); may be beyond the running ones.
    pub validator: Option<u16>,
}

/// A fault.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultSpec {
    /// `crash` (`kill -9`: the node's disk keeps everything written), `power_loss` (of `node`, or
    /// of every node when it is not given: what their disks had not synced is lost, writes in
    /// flight torn), `disk_full` (the node's disk fills at `at_secs`; at `until_secs` there is
    /// room again and the node is started again), `bit_flip` (a bit of `file` flips on the
    /// node's disk; it shows at the next restart), `partition`, `skew`, `byzantine`, `twin` (a second node with the same key)
    /// or `diverge` (the node starts from a different world and must notice).
    pub kind: String,
    pub node: Option<u16>,
    /// Seconds of virtual time.
    #[serde(default)]
    pub at_secs: f64,
    /// crash, power_loss, disk_full: restart at; partition: heal at.
    pub until_secs: Option<f64>,
    pub groups: Option<Vec<Vec<u16>>>,
    pub skew_ms: Option<i64>,
    /// `equivocate`, `double_vote`, `invalid_signatures` or `withhold`.
    pub behaviour: Option<String>,
    /// bit_flip: `log` (a commit-log segment) or `snapshot` (the newest snapshot).
    pub file: Option<String>,
}

/// What must hold at the end of a run: an `[[expect]]` table, its `kind` naming the variant and
/// its other keys the variant's fields (a missing or unknown one is an error naming its line).
/// Every runner judges these with [`crate::judge`].
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Expect {
    /// The honest nodes (of each sim) have the same root wherever two executed the same tick.
    RootsEqual,
    /// Every honest node up at the end executed at least `ticks` ticks.
    MinTicks { ticks: u64 },
    /// The world holds `count` objects at the end.
    Objects { count: u64 },
    /// Every honest node saw a chat line containing `text`.
    ChatSeen { text: String },
    /// `account` has `role` at tick `at_tick`.
    Role { account: String, role: ExpectedRole, at_tick: u64 },
    /// The step labelled `step` was executed, or refused with `reason` in its reason, the same
    /// on every honest node.
    Outcome {
        step: String,
        status: ExpectedStatus,
        #[serde(default)]
        reason: String,
    },
    /// No honest node diverged.
    NoDesync,
    /// Node `node` noticed it diverged.
    Desync { node: u16 },
    /// Node `node` resynced from a certified snapshot and agrees since.
    Resynced { node: u16 },
    /// Node `node` joined from a certified snapshot and agrees since.
    Joined { node: u16 },
    /// Node `node` votes at the end.
    Validator { node: u16 },
    /// Node `node` only follows at the end.
    Observer { node: u16 },
    /// The object named `object` shows `text`.
    ObjectText { object: String, text: String },
    /// With several sims: at least `count` bodies crossed between sims, each exactly once.
    Handoffs { count: u64 },
    /// With several sims: the object named `object` ends in sim `sim`.
    InSim { object: String, sim: u32 },
    /// No tick cost more than `max_operations` script operations (all objects together, the
    /// host's count: the same on every node, unlike a stopwatch) nor queued more than
    /// `max_queued` inputs for the next tick (messages, chat heard, collisions).
    TickCost {
        max_operations: u64,
        #[serde(default)]
        max_queued: Option<u64>,
    },
    /// The named object's script is suspended at the end (it failed too often).
    Suspended { object: String },
    /// Every honest node's world passes its structural check at the end: each collection
    /// within its bound (the one a snapshot must pass).
    StateValid,
    /// On every honest node that took clients' events in (at least one), the median time from an
    /// event taken in to its execution there (the node's own figure, over its recent events) is
    /// at most `p50_ms` milliseconds, and its 99th percentile at most `p99_ms` where given.
    InputLatency {
        p50_ms: u64,
        #[serde(default)]
        p99_ms: Option<u64>,
    },
}

/// A role an `role` expectation names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectedRole {
    Admin,
    TempAdmin,
    Member,
}

/// What an `outcome` expectation wants of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectedStatus {
    Executed,
    Refused,
}

impl Expect {
    /// Its `kind`, as the file says it.
    pub fn kind(&self) -> &'static str {
        match self {
            Expect::RootsEqual => "roots_equal",
            Expect::MinTicks { .. } => "min_ticks",
            Expect::Objects { .. } => "objects",
            Expect::ChatSeen { .. } => "chat_seen",
            Expect::Role { .. } => "role",
            Expect::Outcome { .. } => "outcome",
            Expect::NoDesync => "no_desync",
            Expect::Desync { .. } => "desync",
            Expect::Resynced { .. } => "resynced",
            Expect::Joined { .. } => "joined",
            Expect::Validator { .. } => "validator",
            Expect::Observer { .. } => "observer",
            Expect::ObjectText { .. } => "object_text",
            Expect::Handoffs { .. } => "handoffs",
            Expect::InSim { .. } => "in_sim",
            Expect::TickCost { .. } => "tick_cost",
            Expect::Suspended { .. } => "suspended",
            Expect::StateValid => "state_valid",
            Expect::InputLatency { .. } => "input_latency",
        }
    }

    /// The node it names, if any.
    pub fn node(&self) -> Option<u16> {
        match self {
            Expect::Desync { node }
            | Expect::Resynced { node }
            | Expect::Joined { node }
            | Expect::Validator { node }
            | Expect::Observer { node } => Some(*node),
            _ => None,
        }
    }

    /// The object it names, if any.
    pub fn object(&self) -> Option<&str> {
        match self {
            Expect::ObjectText { object, .. } | Expect::InSim { object, .. } => Some(object),
            _ => None,
        }
    }
}

/// A scenario file error, with the line it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(l) => write!(f, "line {l}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for SpecError {}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count() + 1
}

const BEHAVIOURS: [&str; 4] = ["equivocate", "double_vote", "invalid_signatures", "withhold"];

impl Scenario {
    /// Parse and check a scenario file's text.
    pub fn parse(text: &str) -> Result<Scenario, SpecError> {
        let s: Scenario = toml::from_str(text).map_err(|e| SpecError {
            line: e.span().map(|r| line_of(text, r.start)),
            message: e.message().trim().to_owned(),
        })?;
        s.check(text)?;
        Ok(s)
    }

    fn check(&self, text: &str) -> Result<(), SpecError> {
        let at = |span: std::ops::Range<usize>, message: String| SpecError {
            line: Some(line_of(text, span.start)),
            message,
        };
        let top = |message: String| SpecError { line: None, message };
        let w = &self.world;
        if !(self.duration_secs > 0.0 && self.duration_secs <= 3_600.0) {
            return Err(top(format!("duration_secs must be in (0, 3600], not {}", self.duration_secs)));
        }
        if !(1..=16).contains(&w.sims) {
            return Err(top(format!("world.sims must be 1..=16, not {}", w.sims)));
        }
        if w.columns.is_some_and(|c| c == 0 || c > w.sims) {
            return Err(top(format!("world.columns must be 1..={}", w.sims)));
        }
        let several = w.sims > 1;
        if several {
            let unsupported = [
                (w.physics != "rapier", "world.physics = \"rapier\" (only rapier regions hand bodies over)"),
                (self.validators.observers > 0, "no observers"),
                (w.random_players > 0, "no random players"),
                (self.bots.events_per_tick > 0, "no bots"),
            ];
            if let Some((_, what)) = unsupported.iter().find(|(bad, _)| *bad) {
                return Err(top(format!("several sims (world.sims = {}) need {what}, for now", w.sims)));
            }
        }
        if !(1..=240).contains(&w.tick_rate_hz) {
            return Err(top(format!("world.tick_rate_hz must be 1..=240, not {}", w.tick_rate_hz)));
        }
        if !(8..=4096).contains(&w.region_size) {
            return Err(top(format!("world.region_size must be 8..=4096 metres, not {}", w.region_size)));
        }
        if w.time_scale == 0 {
            return Err(top("world.time_scale must be at least 1".into()));
        }
        if w.physics != "kinematic" && w.physics != "rapier" {
            return Err(top(format!("world.physics must be \"kinematic\" or \"rapier\", not {:?}", w.physics)));
        }
        let n = self.validators.count;
        if !(4..=31).contains(&n) {
            return Err(top(format!("validators.count must be 4..=31 (n = 3f + 1, f >= 1), not {n}")));
        }
        if self.validators.observers > 8 {
            return Err(top("validators.observers: at most 8".into()));
        }
        // Validators and observers: the nodes a step, crash or expectation may name.
        let total = if several { n * w.sims as u16 } else { n + self.validators.observers };
        let net = &self.network;
        if !(net.delay_min_ms >= 0.0 && net.delay_min_ms <= net.delay_max_ms && net.delay_max_ms <= 10_000.0) {
            return Err(top("network: need 0 <= delay_min_ms <= delay_max_ms <= 10000".into()));
        }
        for (k, v) in [("loss_percent", net.loss_percent), ("duplicate_percent", net.duplicate_percent)] {
            if !(0.0..=100.0).contains(&v) {
                return Err(top(format!("network.{k} must be 0..=100, not {v}")));
            }
        }
        if self.bots.events_per_tick > 0 && self.bots.node >= total {
            return Err(top(format!("bots.node {} is not a node (0..{total})", self.bots.node)));
        }
        let mut names = BTreeSet::new();
        let mut admins = 0;
        for a in &self.accounts {
            if !names.insert(a.get_ref().name.clone()) {
                return Err(at(a.span(), format!("account {:?} is defined twice", a.get_ref().name)));
            }
            admins += usize::from(a.get_ref().admin);
        }
        if admins > 1 {
            return Err(top("at most one account may be the admin".into()));
        }
        let account = |span: std::ops::Range<usize>, name: &str, what: &str| {
            if names.contains(name) {
                Ok(())
            } else {
                Err(at(span, format!("{what}: no account named {name:?} (define it under [[accounts]])")))
            }
        };
        let mut objects = BTreeSet::new();
        for o in &self.objects {
            let v = o.get_ref();
            if !objects.insert(v.name.clone()) {
                return Err(at(o.span(), format!("object {:?} is defined twice", v.name)));
            }
            if v.shape != "box" && v.shape != "circle" {
                return Err(at(o.span(), format!("shape must be \"box\" or \"circle\", not {:?}", v.shape)));
            }
            if v.color.len() != 8 || u32::from_str_radix(&v.color, 16).is_err() {
                return Err(at(o.span(), format!("color must be 8 hex digits RRGGBBAA, not {:?}", v.color)));
            }
            if let Some(owner) = &v.owner {
                account(o.span(), owner, "owner")?;
            }
            let (cols, rows) = w.layout();
            let (wx, wy) = ((i64::from(cols) * w.region_size) as f64, (i64::from(rows) * w.region_size) as f64);
            if !(v.at[0] >= 0.0 && v.at[1] >= 0.0 && v.at[0] < wx && v.at[1] < wy) {
                return Err(at(o.span(), format!("`at` {:?} is outside the world (0..{wx}, 0..{wy})", v.at)));
            }
        }
        let labels: BTreeSet<&str> = self.steps.iter().filter_map(|s| s.get_ref().label.as_deref()).collect();
        for s in &self.steps {
            let v = s.get_ref();
            account(s.span(), &v.by, "by")?;
            if v.via >= total {
                return Err(at(s.span(), format!("via {} is not a node (0..{total})", v.via)));
            }
            let need = |field: &str, present: bool| {
                if present { Ok(()) } else { Err(at(s.span(), format!("{:?} needs `{field}`", v.action))) }
            };
            match v.action {
                Action::Chat => need("text", v.text.is_some())?,
                Action::Touch | Action::RemoveObject => need("object", v.object.is_some())?,
                Action::Move => need("velocity", v.velocity.is_some())?,
                Action::Deploy => need("object and script", v.object.is_some() && v.script.is_some())?,
                Action::Kick | Action::Ban | Action::Unban | Action::TransferAdmin => {
                    need("account", v.account.is_some())?;
                    account(s.span(), v.account.as_deref().unwrap_or_default(), "account")?;
                }
                Action::AdmitValidator | Action::RemoveValidator => need("validator", v.validator.is_some())?,
                Action::Login | Action::Logout | Action::Replay => {}
            }
            if let Some(o) = &v.object
                && !objects.contains(o)
            {
                return Err(at(s.span(), format!("no object named {o:?} (define it under [[objects]])")));
            }
            if let Some(r) = &v.range
                && !["whisper", "say", "shout"].contains(&r.as_str())
            {
                return Err(at(s.span(), format!("range must be whisper, say or shout, not {r:?}")));
            }
        }
        let byzantine: usize = self
            .faults
            .iter()
            .filter(|f| ["byzantine", "twin", "diverge"].contains(&f.get_ref().kind.as_str()))
            .count();
        if byzantine > usize::from((n - 1) / 3) {
            return Err(top(format!("{byzantine} Byzantine nodes; n = {n} tolerates {}", (n - 1) / 3)));
        }
        for f in &self.faults {
            let v = f.get_ref();
            let node_ok = v.node.is_some_and(|x| x < total);
            let validator_ok = v.node.is_some_and(|x| x < n);
            match v.kind.as_str() {
                "crash" | "skew" | "diverge" if !node_ok => {
                    return Err(at(f.span(), format!("{} needs `node` in 0..{total}", v.kind)));
                }
                "byzantine" | "twin" | "diverge" | "join" if several => {
                    return Err(at(f.span(), format!("{} faults need a single sim, for now", v.kind)));
                }
                "byzantine" | "twin" if !validator_ok => {
                    return Err(at(f.span(), format!("{} needs a validator: `node` in 0..{n}", v.kind)));
                }
                "crash" => {
                    if v.until_secs.is_some_and(|u| u <= v.at_secs) {
                        return Err(at(f.span(), "until_secs (the restart) must be after at_secs".into()));
                    }
                }
                "disk_full" | "bit_flip" if !node_ok => {
                    return Err(at(f.span(), format!("{} needs `node` in 0..{total}", v.kind)));
                }
                "disk_full" => {
                    if v.until_secs.is_none_or(|u| u <= v.at_secs) {
                        return Err(at(f.span(), "disk_full needs until_secs (room again) after at_secs".into()));
                    }
                }
                "bit_flip" => {
                    if !matches!(v.file.as_deref(), Some("log" | "snapshot")) {
                        return Err(at(f.span(), "bit_flip needs file = \"log\" or \"snapshot\"".into()));
                    }
                }
                "power_loss" => {
                    if v.node.is_some() && !node_ok {
                        return Err(at(
                            f.span(),
                            format!("power_loss's `node` must be in 0..{total} (or left out: every node)"),
                        ));
                    }
                    if v.until_secs.is_none_or(|u| u <= v.at_secs) {
                        return Err(at(f.span(), "power_loss needs until_secs (the restart) after at_secs".into()));
                    }
                }
                "partition" => {
                    let groups = v.groups.as_ref().ok_or_else(|| at(f.span(), "partition needs `groups`".into()))?;
                    if groups.iter().flatten().any(|x| *x >= total) {
                        return Err(at(f.span(), format!("partition groups name nodes beyond 0..{total}")));
                    }
                    if v.until_secs.is_none_or(|u| u <= v.at_secs) {
                        return Err(at(f.span(), "partition needs until_secs after at_secs".into()));
                    }
                }
                "skew" => {
                    if v.skew_ms.is_none() {
                        return Err(at(f.span(), "skew needs `skew_ms`".into()));
                    }
                }
                "byzantine" => {
                    let b = v.behaviour.as_deref().unwrap_or_default();
                    if !BEHAVIOURS.contains(&b) {
                        return Err(at(f.span(), format!("behaviour must be one of {BEHAVIOURS:?}, not {b:?}")));
                    }
                }
                "twin" | "diverge" => {}
                "join" => {
                    if !v.node.is_some_and(|x| x >= n && x < total) {
                        return Err(at(
                            f.span(),
                            format!("join needs an observer: `node` in {n}..{total} (add [validators] observers)"),
                        ));
                    }
                }
                other => {
                    return Err(at(
                        f.span(),
                        format!(
                            "unknown fault kind {other:?}: crash, power_loss, disk_full, bit_flip, partition, skew, byzantine, twin, diverge or join"
                        ),
                    ));
                }
            }
        }
        for e in &self.expect {
            let v = e.get_ref();
            let single_only = [
                "validator",
                "observer",
                "joined",
                "resynced",
                "desync",
                "role",
                "outcome",
                "chat_seen",
                "input_latency",
            ];
            if several && single_only.contains(&v.kind()) {
                return Err(at(e.span(), format!("{} expectations need a single sim, for now", v.kind())));
            }
            match v {
                Expect::Handoffs { .. } | Expect::InSim { .. } if !several => {
                    return Err(at(e.span(), format!("{} needs several sims (world.sims > 1)", v.kind())));
                }
                Expect::InSim { sim, .. } if *sim == 0 || *sim > w.sims => {
                    return Err(at(e.span(), format!("sim must be 1..={}", w.sims)));
                }
                Expect::Role { account: a, .. } => account(e.span(), a, "account")?,
                Expect::Outcome { step, .. } if !labels.contains(step.as_str()) => {
                    return Err(at(e.span(), format!("no step labelled {step:?}")));
                }
                _ => {}
            }
            if let Some(node) = v.node()
                && node >= total
            {
                return Err(at(e.span(), format!("{} needs `node` in 0..{total}", v.kind())));
            }
            if let Some(o) = v.object()
                && !objects.contains(o)
            {
                return Err(at(e.span(), format!("no object named {o:?}")));
            }
        }
        Ok(())
    }

    /// The line of an item, from its span, for messages.
    pub fn line_of(text: &str, span: std::ops::Range<usize>) -> usize {
        line_of(text, span.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
name = "tiny"
duration_secs = 2
[[accounts]]
name = "alice"
[[objects]]
name = "door"
at = [10, 10]
script = "door.rhai"
[[steps]]
at_tick = 5
by = "alice"
do = "touch"
object = "door"
"#;

    #[test]
    fn a_good_scenario_parses_with_defaults() {
        let s = Scenario::parse(OK).unwrap();
        assert_eq!(s.validators.count, 4);
        assert_eq!(s.seed, 1);
        assert_eq!(s.steps[0].get_ref().action, Action::Touch);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_line() {
        let e = Scenario::parse(&OK.replace("at_tick = 5", "at_tick = 5\ncolour = 3")).unwrap_err();
        assert_eq!(e.line, Some(12), "{e}");
        assert!(e.message.contains("colour"), "{e}");
        let e = Scenario::parse(&OK.replace("do = \"touch\"", "do = \"dance\"")).unwrap_err();
        assert!(e.message.contains("dance") && e.line == Some(13), "{e}");
        let e = Scenario::parse(&OK.replace("object = \"door\"", "object = \"window\"")).unwrap_err();
        assert!(e.message.contains("window") && e.line.is_some(), "{e}");
        let e = Scenario::parse(&OK.replace("by = \"alice\"", "by = \"bob\"")).unwrap_err();
        assert!(e.message.contains("bob"), "{e}");
        let e = Scenario::parse(&format!("{OK}\n[[faults]]\nkind = \"meteor\"\nnode = 1\n")).unwrap_err();
        assert!(e.message.contains("meteor") && e.line == Some(16), "{e}");
        let e = Scenario::parse(&OK.replace("duration_secs = 2", "duration_secs = -1")).unwrap_err();
        assert!(e.message.contains("duration_secs"), "{e}");
        let two_byz = format!(
            "{OK}\n[[faults]]\nkind = \"byzantine\"\nnode = 1\nbehaviour = \"withhold\"\n[[faults]]\nkind = \"twin\"\nnode = 2\n"
        );
        assert!(Scenario::parse(&two_byz).unwrap_err().message.contains("tolerates 1"));
    }

    #[test]
    fn an_expectation_is_typed_by_its_kind_and_a_wrong_one_names_its_line() {
        let with = |e: &str| Scenario::parse(&format!("{OK}\n[[expect]]\n{e}\n"));
        let s = with("kind = \"min_ticks\"\nticks = 30").unwrap();
        assert_eq!(*s.expect[0].get_ref(), Expect::MinTicks { ticks: 30 });
        let s = with("kind = \"role\"\naccount = \"alice\"\nrole = \"temp_admin\"\nat_tick = 9").unwrap();
        let want = Expect::Role { account: "alice".into(), role: ExpectedRole::TempAdmin, at_tick: 9 };
        assert_eq!(*s.expect[0].get_ref(), want);
        // A missing field, a field of another kind, an unknown kind, a bad value: each names the
        // expectation's line (the table starts on line 16).
        for (bad, says) in [
            ("kind = \"min_ticks\"", "ticks"),
            ("kind = \"objects\"\ncount = 3\nticks = 9", "ticks"),
            ("kind = \"maxi_ticks\"", "maxi_ticks"),
            ("kind = \"role\"\naccount = \"alice\"\nrole = \"king\"\nat_tick = 9", "king"),
            ("kind = \"outcome\"\nstep = \"nope\"\nstatus = \"executed\"", "nope"),
        ] {
            let e = with(bad).unwrap_err();
            assert!(e.message.contains(says) && e.line.is_some_and(|l| l >= 16), "{bad}: {e}");
        }
    }
}
