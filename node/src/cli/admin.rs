//! `metatopia stats` and `metatopia admin`: clients of a node's HTTP service.

use std::path::PathBuf;
use std::time::Duration;

use crate::api::http::{AccountView, Client, GovernanceView, Status, parse_hash};
use crate::core::Outcome;
use anyhow::Context;
use metatopia_sim::{AccountId, AdminAct, ObjectId, Payload, SignedEvent, SimId};

#[derive(Debug, clap::Args)]
pub struct NodeArg {
    /// A node's HTTP address (`metatopia devnet` prints them; a node serves on its peer port + 1000).
    #[arg(long, env = "METATOPIA_NODE", default_value = "127.0.0.1:8400")]
    pub node: String,
}

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    #[command(flatten)]
    node: NodeArg,
    /// Print again every second until Ctrl-C.
    #[arg(long)]
    watch: bool,
}

/// `metatopia stats`, like OpenSimulator's `show stats`.
pub fn stats(args: StatsArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.node.node);
    loop {
        let s: Status = client.get("/v1/status")?.context("the node has no /v1/status")?;
        print!("{}", render_stats(&s));
        if !args.watch {
            return Ok(());
        }
        println!();
        std::thread::sleep(Duration::from_secs(1));
    }
}

pub fn render_stats(s: &Status) -> String {
    let root = s.root.get(..16).unwrap_or(&s.root);
    let desync = s.desynced.map(|t| format!("\nDIVERGED at tick {t}: this node stopped executing")).unwrap_or_default();
    let neighbours = if s.neighbours.is_empty() {
        String::new()
    } else {
        let sims: Vec<String> = s.neighbours.iter().map(u32::to_string).collect();
        let found: Vec<String> = s.neighbour_validators_found.iter().map(u32::to_string).collect();
        format!(
            "neighbour sims     {} · mail {} signed, {} taken in, {} late copies dropped\n\
             raynet             {} nodes known, {} Voronoi neighbours; neighbours' validators found {}\n\
             crossings          {} left, {} arrived, {} in transit\n",
            sims.join(", "),
            s.mail_sent,
            s.mail_received,
            s.mail_late,
            s.raynet_known,
            s.raynet_neighbours,
            found.join(", "),
            s.departures,
            s.arrivals,
            s.in_transit.len()
        )
    };
    let text = format!(
        "sim {} · node {} of {} · tick {} · root {root}…{desync}\n\
         tick rate          {} Hz\n\
         agreement          epoch {}, view {}, committed to tick {}{}\n\
         time dilation      {:.2}\n\
         commit latency     p50 {:.1} ms, p99 {:.1} ms (block time to commit); proposal to commit p50 {} µs, p99 {} µs\n\
         input latency      p50 {} µs, p99 {} µs (an event taken in here to its execution here)\n\
         tick time          {:.2} ms (scripts {:.2} ms, physics {:.2} ms)\n\
         objects            {}\n\
         scripts            {} ({} operations in the last tick)\n\
         accounts           {}\n\
         events             {} accepted, {} refused by the sim, {} refused at the door, {} waiting\n\
         validators         {} of {} connected{}\n\
         peers              {} (nodes of any sim){}\n\
         reachability       {}\n",
        s.sim,
        s.node,
        s.validators,
        s.tick,
        s.tick_rate_hz,
        s.epoch,
        s.view,
        s.agreed_tick.map_or_else(|| "none yet".to_string(), |t| t.to_string()),
        if s.filled_ticks > 0 { format!(" ({} ticks filled)", s.filled_ticks) } else { String::new() },
        s.dilation,
        s.commit_latency_p50_ms,
        s.commit_latency_p99_ms,
        s.proposal_to_commit_p50_us,
        s.proposal_to_commit_p99_us,
        s.input_to_execution_p50_us,
        s.input_to_execution_p99_us,
        s.execute_ms,
        s.script_ms,
        s.physics_ms,
        s.objects,
        s.scripts,
        s.script_operations,
        s.accounts,
        s.accepted,
        s.rejected,
        s.refused_submissions,
        s.pool_events,
        s.validators_connected,
        s.validators,
        if s.validators_missing.is_empty() {
            String::new()
        } else {
            format!(" (unreachable: {})", s.validators_missing.join(", "))
        },
        s.peers,
        paths(&s.peer_paths),
        reachability(s),
    );
    text + neighbours.as_str()
}

/// ": 3 direct, 1 relayed (ab12…)" when some peers are reached through a relay.
fn paths(p: &std::collections::BTreeMap<String, String>) -> String {
    let relayed: Vec<&str> = p.iter().filter(|(_, v)| *v == "relayed").map(|(k, _)| &k[..k.len().min(8)]).collect();
    if p.is_empty() {
        return String::new();
    }
    let direct = p.len() - relayed.len();
    if relayed.is_empty() {
        format!(": {direct} direct")
    } else {
        format!(": {direct} direct, {} relayed ({}…)", relayed.len(), relayed.join("…, "))
    }
}

/// "public" or "private, through relays ab12…, cd34…", with hole punching and the relay served.
fn reachability(s: &Status) -> String {
    let mut r = if s.reachability.is_empty() { "unknown".to_owned() } else { s.reachability.clone() };
    if !s.relays.is_empty() {
        let short: Vec<&str> = s.relays.iter().map(|k| &k[..k.len().min(8)]).collect();
        r += &format!(", reachable through relays {}…", short.join("…, "));
        if s.card_relayed.len() != s.relays.len() {
            r += &format!(" ({} named in its card so far)", s.card_relayed.len());
        }
    }
    if s.hole_punched + s.hole_punch_failed > 0 {
        r += &format!("; hole punching {} direct, {} failed", s.hole_punched, s.hole_punch_failed);
    }
    let [reservations, circuits] = s.relay_serving;
    if reservations + circuits + s.relay_refused > 0 {
        r += &format!(
            "; relaying for others: {reservations} reservations, {circuits} circuits, {} refused",
            s.relay_refused
        );
    }
    r
}

#[derive(Debug, clap::Args)]
pub struct AdminArgs {
    #[command(flatten)]
    node: NodeArg,
    /// The signing key (64 hex digits of secret key in a file); `devnet` writes the demo admin's.
    #[arg(long, env = "METATOPIA_KEY")]
    key: Option<PathBuf>,
    /// Seconds to wait for the act to execute.
    #[arg(long, default_value_t = 15)]
    wait: u64,
    #[command(subcommand)]
    act: AdminCmd,
}

#[derive(Debug, clap::Subcommand)]
enum AdminCmd {
    /// The admin, days since the admin's last login, the temp admin and why, validators.
    Status,
    /// Log in as the key's account (an admin's login resets its days of absence).
    Login {
        #[arg(default_value = "admin")]
        name: String,
    },
    /// Disconnect an account; it may not log in again for the sim's kick cooldown.
    Kick {
        account: String,
    },
    /// Ban an account: no login, no inputs.
    Ban {
        account: String,
    },
    Unban {
        account: String,
    },
    /// Remove any object (written `SLOTvGEN`, as `stats` and the clients show ids).
    RemoveObject {
        object: String,
    },
    /// Remove an object's script.
    RemoveScript {
        object: String,
    },
    /// Return an object to its owner: out of the world, kept in the owner's account (with its
    /// script's source) until the owner rezzes it again.
    ReturnObject {
        object: String,
    },
    /// Admit a validator key; it starts voting at the next epoch boundary.
    AdmitValidator {
        key: String,
    },
    /// Remove a validator key at the next epoch boundary.
    RemoveValidator {
        key: String,
    },
    /// Make another account the permanent admin.
    TransferAdmin {
        account: String,
    },
    /// Change settings (unnamed ones stay as they are).
    Settings {
        /// X: days without a login after which the admin counts as absent.
        #[arg(long)]
        admin_absent_days: Option<u32>,
        /// Y: a temp admin must have logged in within this many days.
        #[arg(long)]
        temp_admin_active_days: Option<u32>,
        #[arg(long)]
        tick_rate_hz: Option<u32>,
        #[arg(long)]
        epoch_ticks: Option<u64>,
        #[arg(long)]
        kick_cooldown_secs: Option<u64>,
        /// How far around its avatar a client sees, metres.
        #[arg(long)]
        aoi_radius_m: Option<u32>,
        #[arg(long)]
        max_objects: Option<u32>,
        /// Script limits: a script's persisted state, its source, the outputs (chat, messages,
        /// commands) it may emit per tick, and the failing ticks in a row that suspend it.
        #[arg(long)]
        max_script_state_bytes: Option<u32>,
        #[arg(long)]
        max_source_bytes: Option<u32>,
        #[arg(long)]
        max_script_outputs: Option<u32>,
        #[arg(long)]
        script_failure_limit: Option<u32>,
        /// Creators' budgets and quotas: script operations one object, and one account's
        /// objects together, may use per tick; objects and bytes of script one account may have.
        #[arg(long)]
        operations_per_object_tick: Option<u64>,
        #[arg(long)]
        operations_per_account_tick: Option<u64>,
        #[arg(long)]
        max_objects_per_account: Option<u32>,
        #[arg(long)]
        max_script_bytes_per_account: Option<u32>,
    },
}

fn account(s: &str) -> anyhow::Result<AccountId> {
    parse_hash(s).map(AccountId).with_context(|| format!("{s:?} is not an account id (64 hex digits)"))
}

fn object(s: &str) -> anyhow::Result<ObjectId> {
    metatopia_client::conn::parse_object(s).with_context(|| format!("{s:?} is not an object id like 12v0"))
}

/// `metatopia admin`.
pub fn admin(args: AdminArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.node.node);
    let gov: GovernanceView = client.get("/v1/governance")?.context("the node has no /v1/governance")?;
    let payload = match args.act {
        AdminCmd::Status => {
            print!("{}", render_governance(&gov));
            return Ok(());
        }
        AdminCmd::Login { name } => Payload::Login { name },
        AdminCmd::Kick { account: a } => Payload::Admin(AdminAct::Kick { account: account(&a)? }),
        AdminCmd::Ban { account: a } => Payload::Admin(AdminAct::Ban { account: account(&a)? }),
        AdminCmd::Unban { account: a } => Payload::Admin(AdminAct::Unban { account: account(&a)? }),
        AdminCmd::RemoveObject { object: o } => Payload::Admin(AdminAct::RemoveObject { object: object(&o)? }),
        AdminCmd::RemoveScript { object: o } => Payload::Admin(AdminAct::RemoveScript { object: object(&o)? }),
        AdminCmd::ReturnObject { object: o } => Payload::Admin(AdminAct::ReturnObject { object: object(&o)? }),
        AdminCmd::AdmitValidator { key } => Payload::Admin(AdminAct::AdmitValidator { key: account(&key)? }),
        AdminCmd::RemoveValidator { key } => Payload::Admin(AdminAct::RemoveValidator { key: account(&key)? }),
        AdminCmd::TransferAdmin { account: a } => Payload::Admin(AdminAct::TransferAdmin { to: account(&a)? }),
        AdminCmd::Settings {
            admin_absent_days,
            temp_admin_active_days,
            tick_rate_hz,
            epoch_ticks,
            kick_cooldown_secs,
            aoi_radius_m,
            max_objects,
            max_script_state_bytes,
            max_source_bytes,
            max_script_outputs,
            script_failure_limit,
            operations_per_object_tick,
            operations_per_account_tick,
            max_objects_per_account,
            max_script_bytes_per_account,
        } => {
            let mut s = gov.settings.clone();
            s.admin_absent_days = admin_absent_days.unwrap_or(s.admin_absent_days);
            s.temp_admin_active_days = temp_admin_active_days.unwrap_or(s.temp_admin_active_days);
            s.tick_rate_hz = tick_rate_hz.unwrap_or(s.tick_rate_hz);
            s.epoch_ticks = epoch_ticks.unwrap_or(s.epoch_ticks);
            s.kick_cooldown_ms = kick_cooldown_secs.map_or(s.kick_cooldown_ms, |x| x.saturating_mul(1000));
            s.aoi_radius_m = aoi_radius_m.unwrap_or(s.aoi_radius_m);
            s.limits.max_objects = max_objects.unwrap_or(s.limits.max_objects);
            s.limits.max_script_state_bytes = max_script_state_bytes.unwrap_or(s.limits.max_script_state_bytes);
            s.limits.max_source_bytes = max_source_bytes.unwrap_or(s.limits.max_source_bytes);
            s.limits.max_script_outputs = max_script_outputs.unwrap_or(s.limits.max_script_outputs);
            s.limits.script_failure_limit = script_failure_limit.unwrap_or(s.limits.script_failure_limit);
            let l = &mut s.limits;
            l.operations_per_object_tick = operations_per_object_tick.unwrap_or(l.operations_per_object_tick);
            l.operations_per_account_tick = operations_per_account_tick.unwrap_or(l.operations_per_account_tick);
            l.max_objects_per_account = max_objects_per_account.unwrap_or(l.max_objects_per_account);
            l.max_script_bytes_per_account = max_script_bytes_per_account.unwrap_or(l.max_script_bytes_per_account);
            // The sim refuses the same way; saying so here names the setting before anything is signed.
            s.check().map_err(|e| anyhow::anyhow!("settings: {e}; nothing was submitted"))?;
            Payload::Admin(AdminAct::SetSettings(s))
        }
    };
    let key = signing_key(args.key)?;
    act(&client, &key, payload, args.wait).map(|_| ())
}

/// The key in `--key`'s file, with an error that says what is missing.
pub(crate) fn signing_key(path: Option<PathBuf>) -> anyhow::Result<metatopia_sim::SigningKey> {
    let path = path.context("--key (or METATOPIA_KEY): the file with the signing key is needed to act")?;
    crate::store::read_key(&path)?.with_context(|| format!("no key file at {}", path.display()))
}

/// Sign `payload` with the account's next nonce, submit it through the node and wait for its
/// outcome: the tick it executed at, or an error "refused at tick T: why".
pub(crate) fn act(
    client: &Client,
    key: &metatopia_sim::SigningKey,
    payload: Payload,
    wait: u64,
) -> anyhow::Result<metatopia_sim::Tick> {
    let me = metatopia_sim::event::account_of(key);
    let status: Status = client.get("/v1/status")?.context("the node has no /v1/status")?;
    // The next nonce: above the last one the sim accepted from this account.
    let last = client.get::<AccountView>(&format!("/v1/accounts/{me}"))?.map_or(0, |a| a.last_nonce);
    let event = SignedEvent::new(key, SimId(status.sim), last + 1, payload);
    let what = describe(&event.body.payload);
    let id = client.submit(&metatopia_sim::codec::encode(&event))?;
    println!("submitted {what} as {} (event {})", me.short(), &id[..16]);
    match client.wait_outcome(&id, Duration::from_secs(wait))? {
        Some(Outcome::Executed { tick }) => {
            println!("executed at tick {tick}");
            Ok(tick)
        }
        Some(Outcome::Refused { tick, reason }) => anyhow::bail!("refused at tick {tick}: {reason}"),
        None => anyhow::bail!("not executed within {wait} s (is the sim running? `metatopia stats`)"),
    }
}

fn describe(p: &Payload) -> String {
    match p {
        Payload::Admin(a) => a.name().to_owned(),
        Payload::Login { .. } => "login".to_owned(),
        Payload::Rez { name, .. } => format!("rez {name:?}"),
        Payload::Derez { object } => format!("derez {object}"),
        Payload::Touch { object } => format!("touch {object}"),
        Payload::DeployScript { object, licence, .. } => format!("deploy a script ({licence}) on {object}"),
        other => format!("{other:?}"),
    }
}

pub fn render_governance(g: &GovernanceView) -> String {
    let named = |id: &str, name: &Option<String>| match name {
        Some(n) => format!("{id} ({n})"),
        None => id.to_owned(),
    };
    let mut out = format!(
        "tick {} at {} (sim time)\n\
         admin              {}\n\
         admin last seen    {} days ago ({})\n\
         temp admin         {}\n\
         why                {}\n\
         rules              X = {} days (admin absent), Y = {} days (temp admin active)\n",
        g.tick,
        crate::when::date(g.time_ms),
        named(&g.admin, &g.admin_name),
        g.admin_days_absent,
        if g.admin_absent { "absent" } else { "present" },
        g.temp_admin.as_deref().map_or("none".to_owned(), |t| named(t, &g.temp_admin_name)),
        g.reason,
        g.admin_absent_days,
        g.temp_admin_active_days,
    );
    let l = &g.settings.limits;
    out += &format!(
        "creators           {} script operations an object, {} an account, a tick; {} objects and {} bytes of script an account\n",
        l.operations_per_object_tick,
        l.operations_per_account_tick,
        l.max_objects_per_account,
        l.max_script_bytes_per_account
    );
    out += &format!("validators         {}\n", g.validators.len());
    for v in &g.validators {
        out += &format!("  {v}\n");
    }
    for (k, admit) in &g.pending_validators {
        out += &format!("  {} {k} at tick {}\n", if *admit { "admitting" } else { "removing" }, g.next_epoch_tick);
    }
    if !g.banned.is_empty() {
        out += &format!("banned             {}\n", g.banned.len());
        for b in &g.banned {
            out += &format!("  {b}\n");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_show_the_neighbour_sims_only_in_a_world_of_several() {
        let mut s = Status {
            sim: 2,
            tick: metatopia_sim::Tick(7),
            root: "ab".repeat(32),
            tick_rate_hz: 20,
            ..Status::default()
        };
        let one = render_stats(&s);
        assert!(one.starts_with("sim 2 · node 0 of 0 · tick 7") && !one.contains("neighbour"), "{one}");
        assert!(one.contains("agreement          epoch 0, view 0, committed to tick none yet\n"), "{one}");
        (s.epoch, s.view, s.agreed_tick) = (1, 930, Some(metatopia_sim::Tick(9)));
        assert!(render_stats(&s).contains("agreement          epoch 1, view 930, committed to tick 9\n"));
        s.neighbours = vec![1, 3];
        (s.mail_sent, s.mail_received, s.mail_late) = (40, 80, 20);
        (s.departures, s.arrivals, s.in_transit) = (2, 1, vec!["ball".into()]);
        let several = render_stats(&s);
        assert!(
            several.contains("neighbour sims     1, 3 · mail 40 signed, 80 taken in, 20 late copies dropped\n"),
            "{several}"
        );
        assert!(several.ends_with("crossings          2 left, 1 arrived, 1 in transit\n"), "{several}");
    }

    #[test]
    fn stats_say_how_each_peer_is_reached_and_whether_the_node_is_behind_a_nat() {
        let mut s = Status { peers: 2, reachability: "public".into(), ..Status::default() };
        s.peer_paths = [("aa".repeat(32), "quic".to_owned()), ("bb".repeat(32), "quic".to_owned())].into();
        let out = render_stats(&s);
        assert!(out.contains("peers              2 (nodes of any sim): 2 direct\n"), "{out}");
        assert!(out.contains("reachability       public\n"), "{out}");
        s.peer_paths.insert("cc".repeat(32), "relayed".into());
        s.reachability = "private".into();
        s.relays = vec!["dd".repeat(32)];
        s.card_relayed = vec!["/ip4/10.0.0.1/udp/7000/quic-v1/p2p/RELAY/p2p-circuit/p2p/ME".into()];
        (s.hole_punched, s.hole_punch_failed) = (1, 2);
        let out = render_stats(&s);
        assert!(out.contains("2 direct, 1 relayed (cccccccc…)"), "{out}");
        assert!(
            out.contains(
                "reachability       private, reachable through relays dddddddd…; hole punching 1 direct, 2 failed\n"
            ),
            "{out}"
        );
        // Relays held but not yet in the signed card (it is signed again at the next round).
        let pending = Status { card_relayed: Vec::new(), ..s.clone() };
        assert!(
            render_stats(&pending).contains("dddddddd… (0 named in its card so far);"),
            "{}",
            render_stats(&pending)
        );
        s.relay_serving = [2, 1];
        assert!(render_stats(&s).contains("relaying for others: 2 reservations, 1 circuits, 0 refused"));
    }
}
