//! `metatopia object` and `metatopia script`: building the world from the command line, through
//! any node's HTTP service, with the same signed events the clients send. Each act waits for its
//! outcome and says "executed at tick T" or "refused at tick T: why" (a compile error with its
//! line and column, a licence not on the copyleft list, an object that is not yours).

use std::path::{Path, PathBuf};

use anyhow::Context;
use metatopia_sim::state::{BodyKind, Shape, Surface};
use metatopia_sim::{Fx, ObjectEdit, ObjectId, Payload, ScriptId, Vec2};

use crate::api::http::{AccountView, Client, ObjectView};
use crate::cli::admin::{NodeArg, act, signing_key};

use metatopia_client::fork::FORK_HEADER;

#[derive(Debug, clap::Args)]
pub struct ActArgs {
    #[command(flatten)]
    node: NodeArg,
    /// Your account's signing key (64 hex digits of secret key in a file; `metatopia client`
    /// makes one at $METATOPIA_HOME/client.key).
    #[arg(long, env = "METATOPIA_KEY")]
    key: Option<PathBuf>,
    /// Seconds to wait for the act to execute.
    #[arg(long, default_value_t = 15)]
    wait: u64,
    /// The name your account logs in with if it has never been in this sim.
    #[arg(long, default_value = "builder")]
    login_as: String,
}

#[derive(Debug, clap::Subcommand)]
pub enum ObjectCmd {
    /// Rez a new object you own; prints its id. It stays where it is put (`--static`, the
    /// default) unless made `--kinematic` (its script moves it) or `--dynamic` (physics).
    Rez {
        #[command(flatten)]
        act: ActArgs,
        #[arg(long)]
        name: String,
        /// Where, in world metres: X,Y (inside the sim the node serves).
        #[arg(long, value_name = "X,Y", allow_hyphen_values = true)]
        at: String,
        /// `box` or `circle`.
        #[arg(long, default_value = "box")]
        shape: String,
        /// Metres: a box's width,height or a circle's diameter.
        #[arg(long, default_value = "1")]
        size: String,
        /// RRGGBBAA.
        #[arg(long, default_value = "808080ff")]
        color: String,
        /// Its floating text.
        #[arg(long, default_value = "")]
        text: String,
        #[command(flatten)]
        body: BodyArg,
    },
    /// Change one of your objects: each option given replaces what it had. A new place, shape
    /// or body kind puts it there at rest.
    Edit {
        #[command(flatten)]
        act: ActArgs,
        object: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        text: Option<String>,
        /// RRGGBBAA.
        #[arg(long)]
        color: Option<String>,
        /// `box` or `circle` (with `--size`).
        #[arg(long, requires = "size")]
        shape: Option<String>,
        /// Metres: a box's width,height or a circle's diameter (with `--shape`).
        #[arg(long, requires = "shape")]
        size: Option<String>,
        /// Where to put it, in world metres: X,Y (inside the same sim).
        #[arg(long, value_name = "X,Y", allow_hyphen_values = true)]
        at: Option<String>,
        #[command(flatten)]
        body: BodyArg,
        /// Its surface, all three together: friction 0..10, restitution (bounce) 0..1, and
        /// damping (slowing, per second) 0..100; e.g. `--friction 0.5 --restitution 0.1
        /// --damping 2`.
        #[arg(long, requires_all = ["restitution", "damping"])]
        friction: Option<f64>,
        #[arg(long, requires_all = ["friction", "damping"])]
        restitution: Option<f64>,
        #[arg(long, requires_all = ["friction", "restitution"])]
        damping: Option<f64>,
    },
    /// Take one of your objects out of the world.
    Derez {
        #[command(flatten)]
        act: ActArgs,
        /// The object's id (`SLOTvGEN`, as `rez` and the viewer show it).
        object: String,
    },
    /// Touch an object (its script's `on_touch` runs).
    Touch {
        #[command(flatten)]
        act: ActArgs,
        object: String,
    },
    /// An object as the sim has it: name, owner, place, text, and whether it has a script.
    Show {
        #[command(flatten)]
        node: NodeArg,
        object: String,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum ScriptCmd {
    /// Attach a script (rhai source in FILE) to one of your objects; a file `script fork` wrote
    /// records the script it derives from.
    Deploy {
        #[command(flatten)]
        act: ActArgs,
        file: PathBuf,
        #[arg(long)]
        object: String,
        /// A copyleft SPDX licence (AGPL-3.0-or-later, GPL-3.0-or-later, LGPL-3.0-or-later,
        /// MPL-2.0, CC-BY-SA-4.0, …).
        #[arg(long, default_value = "AGPL-3.0-or-later")]
        licence: String,
    },
    /// The script of an object: its source, licence, author and provenance.
    Show {
        #[command(flatten)]
        node: NodeArg,
        object: String,
    },
    /// Write an object's script to FILE to edit and deploy as your own: a header names what it
    /// derives from, which `script deploy` records.
    Fork {
        #[command(flatten)]
        node: NodeArg,
        object: String,
        #[arg(long)]
        out: PathBuf,
    },
}

/// How an object moves (at most one).
#[derive(Debug, clap::Args)]
#[group(multiple = false)]
pub struct BodyArg {
    /// Anchored: only its owner's edit moves it (the default for a new object).
    #[arg(long = "static")]
    anchored: bool,
    /// Moved by its script or owner (velocity, targets); collisions do not push it.
    #[arg(long)]
    kinematic: bool,
    /// Physics: pushed by collisions, bounces, rolls.
    #[arg(long)]
    dynamic: bool,
}

impl BodyArg {
    fn kind(&self) -> Option<BodyKind> {
        match (self.anchored, self.kinematic, self.dynamic) {
            (true, _, _) => Some(BodyKind::Static),
            (_, true, _) => Some(BodyKind::Kinematic),
            (_, _, true) => Some(BodyKind::Dynamic),
            _ => None,
        }
    }
}

fn place(at: &str) -> anyhow::Result<Vec2> {
    let (x, y) = at.split_once(',').context("--at is X,Y in metres")?;
    Ok(Vec2::new(metres(x, "--at")?, metres(y, "--at")?))
}

fn shape_of(shape: &str, size: &str) -> anyhow::Result<Shape> {
    Ok(match shape {
        "circle" => Shape::Circle { radius: metres(size, "--size")? / Fx::from_int(2) },
        "box" => {
            let (w, h) = size.split_once(',').unwrap_or((size, size));
            let half = |v: &str| -> anyhow::Result<Fx> { Ok(metres(v, "--size")? / Fx::from_int(2)) };
            Shape::Box { half_width: half(w)?, half_height: half(h)? }
        }
        other => anyhow::bail!("--shape is box or circle, not {other:?}"),
    })
}

fn colour(color: &str) -> anyhow::Result<u32> {
    let hex = color.trim_start_matches('#');
    u32::from_str_radix(hex, 16)
        .ok()
        .filter(|_| hex.len() == 8)
        .with_context(|| format!("--color is RRGGBBAA hex, not {color:?}"))
}

fn fx_of(x: f64) -> anyhow::Result<Fx> {
    anyhow::ensure!(x.is_finite() && x.abs() <= 1.0e6, "{x} is out of range");
    Ok(crate::world::fx(x))
}

fn object_id(s: &str) -> anyhow::Result<ObjectId> {
    metatopia_client::conn::parse_object(s)
        .with_context(|| format!("{s:?} is not an object id (SLOTvGEN, as `rez` prints)"))
}

fn metres(s: &str, what: &str) -> anyhow::Result<Fx> {
    let x: f64 = s.trim().parse().with_context(|| format!("{what}: {s:?} is not a number of metres"))?;
    anyhow::ensure!(x.is_finite() && x.abs() <= 1.0e9, "{what}: {s:?} is out of range");
    Ok(crate::world::fx(x))
}

/// Log the account in once if the sim has never seen it (rezzing needs an account).
fn ensure_account(client: &Client, key: &metatopia_sim::SigningKey, a: &ActArgs) -> anyhow::Result<()> {
    let me = metatopia_sim::event::account_of(key);
    if client.get::<AccountView>(&format!("/v1/accounts/{me}"))?.is_none() {
        println!("your account is new to this sim: logging in as {:?}", a.login_as);
        act(client, key, Payload::Login { name: a.login_as.clone() }, a.wait)?;
    }
    Ok(())
}

fn objects(client: &Client) -> anyhow::Result<Vec<ObjectView>> {
    Ok(client.get("/v1/objects")?.unwrap_or_default())
}

pub fn object(cmd: ObjectCmd) -> anyhow::Result<()> {
    match cmd {
        ObjectCmd::Rez { act: a, name, at, shape, size, color, text, body } => {
            let position = place(&at)?;
            let shape = shape_of(&shape, &size)?;
            let color = colour(&color)?;
            let body = body.kind().unwrap_or(BodyKind::Static);
            let client = Client::new(&a.node.node);
            let key = signing_key(a.key.clone())?;
            ensure_account(&client, &key, &a)?;
            let before: std::collections::BTreeSet<String> = objects(&client)?.into_iter().map(|o| o.id).collect();
            act(&client, &key, Payload::Rez { name: name.clone(), shape, position, color, text, body }, a.wait)?;
            let me = metatopia_sim::event::account_of(&key).to_string();
            let new =
                objects(&client)?.into_iter().find(|o| o.owner == me && o.name == name && !before.contains(&o.id));
            match new {
                Some(o) => println!("object {} ({name:?}) at {}, {}", o.id, o.position[0], o.position[1]),
                None => println!("(its id: `metatopia object show` once the node has it)"),
            }
            Ok(())
        }
        ObjectCmd::Edit {
            act: a,
            object,
            name,
            text,
            color,
            shape,
            size,
            at,
            body,
            friction,
            restitution,
            damping,
        } => {
            let object = object_id(&object)?;
            let edit = ObjectEdit {
                name,
                text,
                color: color.as_deref().map(colour).transpose()?,
                shape: match (shape, size) {
                    (Some(shape), Some(size)) => Some(shape_of(&shape, &size)?),
                    _ => None,
                },
                position: at.as_deref().map(place).transpose()?,
                body: body.kind(),
                surface: match (friction, restitution, damping) {
                    (Some(f), Some(r), Some(d)) => {
                        let s = Surface { friction: fx_of(f)?, restitution: fx_of(r)?, damping: fx_of(d)? };
                        s.check().map_err(|what| anyhow::anyhow!("the surface's {what} is out of range"))?;
                        Some(s)
                    }
                    _ => None,
                },
            };
            anyhow::ensure!(
                edit != ObjectEdit::default(),
                "nothing to change: give --name, --text, --color, --shape and --size, --at, or a body kind"
            );
            let client = Client::new(&a.node.node);
            act(&client, &signing_key(a.key.clone())?, Payload::Edit { object, edit }, a.wait).map(|_| ())
        }
        ObjectCmd::Derez { act: a, object } => {
            let object = object_id(&object)?;
            let client = Client::new(&a.node.node);
            act(&client, &signing_key(a.key.clone())?, Payload::Derez { object }, a.wait).map(|_| ())
        }
        ObjectCmd::Touch { act: a, object } => {
            let object = object_id(&object)?;
            let client = Client::new(&a.node.node);
            let key = signing_key(a.key.clone())?;
            ensure_account(&client, &key, &a)?;
            act(&client, &key, Payload::Touch { object }, a.wait).map(|_| ())
        }
        ObjectCmd::Show { node, object } => {
            let o = fetch(&node, &object)?;
            println!("object {} {:?}", o.id, o.name);
            println!("owner  {}", o.owner);
            println!("at     {}, {} m (moving {}, {} m/s)", o.position[0], o.position[1], o.velocity[0], o.velocity[1]);
            println!(
                "shape  {} · colour {} · {}{}",
                o.shape,
                o.color,
                o.body,
                if o.surface.is_empty() { String::new() } else { format!(" · {}", o.surface) }
            );
            println!("text   {:?}", o.text);
            println!("script {}", if o.scripted { "yes (`metatopia script show`)" } else { "none" });
            Ok(())
        }
    }
}

/// A script's provenance back to its original: "ID (by AUTHOR) ← … ← an original", from the
/// scripts the sim holds (at most 16 steps).
fn provenance(node: &NodeArg, mut next: Option<String>) -> String {
    let client = Client::new(&node.node);
    let mut steps = Vec::new();
    while let Some(id) = next.take() {
        if steps.len() == 16 {
            steps.push("…".to_owned());
            return steps.join(" ← ");
        }
        match client.get::<metatopia_client::proto::ScriptView>(&format!("/v1/scripts/{id}")) {
            Ok(Some(s)) => {
                steps.push(format!("{id} (by {}…)", &s.author[..s.author.len().min(16)]));
                next = s.derived_from;
            }
            _ => {
                steps.push(format!("{id} (not held by this sim)"));
                return steps.join(" ← ");
            }
        }
    }
    steps.push("an original".to_owned());
    if steps.len() == 1 { "nothing (an original)".to_owned() } else { steps.join(" ← ") }
}

fn fetch(node: &NodeArg, object: &str) -> anyhow::Result<ObjectView> {
    let id = object_id(object)?;
    Client::new(&node.node)
        .get(&format!("/v1/objects/{id}"))?
        .with_context(|| format!("no object {object} in this sim"))
}

/// The script it derives from, if the source starts with a fork's header.
fn derived_from(source: &str) -> anyhow::Result<Option<ScriptId>> {
    metatopia_client::fork::derived_from(source).map_err(anyhow::Error::msg)
}

pub fn script(cmd: ScriptCmd) -> anyhow::Result<()> {
    match cmd {
        ScriptCmd::Deploy { act: a, file, object, licence } => {
            let object = object_id(&object)?;
            let source = read_source(&file)?;
            let derived_from = derived_from(&source)?;
            if let Some(d) = derived_from {
                println!("derived from script {d}");
            }
            let client = Client::new(&a.node.node);
            let payload = Payload::DeployScript { object, source, licence, derived_from };
            act(&client, &signing_key(a.key.clone())?, payload, a.wait).map(|_| ())
        }
        ScriptCmd::Show { node, object } => {
            let o = fetch(&node, &object)?;
            let s = o.script.with_context(|| format!("object {object} has no script"))?;
            println!("script {} on object {} {:?}", s.id, o.id, o.name);
            println!("licence {} · author {}", s.licence, s.author);
            println!("derived from {}", provenance(&node, s.derived_from.clone()));
            println!("---");
            print!("{}", s.source);
            if !s.source.ends_with('\n') {
                println!();
            }
            Ok(())
        }
        ScriptCmd::Fork { node, object, out } => {
            let o = fetch(&node, &object)?;
            let s = o.script.with_context(|| format!("object {object} has no script"))?;
            anyhow::ensure!(!out.exists(), "{} exists: not overwritten", out.display());
            // The header replaces an older fork header, so a fork of a fork names its parent.
            let body = match s.source.lines().next() {
                Some(first) if first.starts_with(FORK_HEADER) => s.source.split_once('\n').map_or("", |(_, b)| b),
                _ => s.source.as_str(),
            };
            let text =
                format!("{FORK_HEADER}{} (object {} {:?}, by {}, {})\n{body}", s.id, o.id, o.name, s.author, s.licence);
            std::fs::write(&out, text).with_context(|| format!("writing {}", out.display()))?;
            println!(
                "wrote {}: script {} under {}; deploy it with `metatopia script deploy`",
                out.display(),
                s.id,
                s.licence
            );
            Ok(())
        }
    }
}

fn read_source(file: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fork_header_names_its_parent_and_nothing_else_does() {
        let id = "ab".repeat(32);
        let forked =
            format!("{FORK_HEADER}{id} (object 3v0 \"door\", by cd, AGPL-3.0-or-later)\nfn on_touch(who) {{}}\n");
        assert_eq!(derived_from(&forked).unwrap(), Some(ScriptId(crate::api::http::parse_hash(&id).unwrap())));
        assert_eq!(derived_from("fn on_touch(who) {}\n").unwrap(), None);
        assert!(derived_from(&format!("{FORK_HEADER}nothex")).is_err());
        assert!(object_id("3v0").is_ok() && object_id("door").is_err());
        assert!(metres("1.5", "x").is_ok() && metres("inf", "x").is_err() && metres("x", "x").is_err());
    }
}
