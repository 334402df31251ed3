//! `metatopia sim new` and `metatopia sim show`: a sim its operator owns (DESIGN §10).
//!
//! `sim new` makes the genesis of a new sim: its admin is a key the operator holds (made here
//! into `admin.key`, or given as a public key), its world comes from a world file (or is empty),
//! its BFT time starts now, and its validators are the nodes named. The genesis goes into
//! `genesis.bin` (with a hash every node checks) and into each `--node` data directory.

use std::path::PathBuf;

use crate::config::NodeConfig;
use crate::store::{DataDir, read_key, write_key};
use crate::world::genesis::{Contact, Genesis, NewSim, WorldFile};
use anyhow::Context;
use metatopia_sim::{AccountId, SimId};

#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// Where `genesis.bin` goes, and `admin.key` unless --admin is given.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The admin's public key (64 hex digits), if the operator already has one. Without it the
    /// admin key is OUT/admin.key (made now if it is not there): whoever holds it owns the sim.
    #[arg(long, value_name = "PUBKEY")]
    admin: Option<String>,
    /// The world: a TOML file with `[world]` (region_size, tick_rate_hz, physics, settings) and
    /// `[[objects]]` (with `script = "FILE"` beside it), as in a scenario file. Default: an empty
    /// 256 m sim with rapier physics at 20 Hz.
    #[arg(long, value_name = "FILE")]
    world: Option<PathBuf>,
    /// The sim's id (distinct per sim of a world; in every signed event).
    #[arg(long, default_value_t = 1)]
    sim_id: u32,
    /// A validator's data directory that `metatopia init` made (repeatable): its key and
    /// addresses go into the genesis, and the genesis is installed there.
    #[arg(long = "data-dir", value_name = "DIR")]
    nodes: Vec<PathBuf>,
    /// A validator elsewhere, by its join address KEY@HOST:PORT (repeatable); its operator
    /// installs the genesis with `metatopia init --genesis OUT/genesis.bin`.
    #[arg(long = "validator", value_name = "KEY@HOST:PORT")]
    validators: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// A genesis file (`genesis.bin`), or a data directory holding one.
    path: PathBuf,
}

pub fn new(args: NewArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.sim_id >= 1, "--sim-id must be at least 1");
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let (admin, admin_note) = match &args.admin {
        Some(hex) => {
            let key = crate::config::parse_public(hex).context("--admin")?;
            (AccountId(key.to_bytes()), "its key is yours, as given".to_owned())
        }
        None => {
            let path = args.out.join("admin.key");
            let key = match read_key(&path)? {
                Some(k) => k,
                None => {
                    let k = crate::store::fresh_key()?;
                    write_key(&path, &k)?;
                    k
                }
            };
            let id = AccountId(key.verifying_key().to_bytes());
            (id, format!("its key is {} (mode 0600): whoever holds it owns the sim", path.display()))
        }
    };
    let mut contacts = Vec::new();
    let mut dirs = Vec::new();
    for d in &args.nodes {
        let dir = DataDir::open(d)?;
        let cfg = NodeConfig::load(&dir.config_path())
            .with_context(|| format!("{} is not a node made by `metatopia init`", d.display()))?;
        let key = dir.key()?.verifying_key().to_bytes();
        contacts.push(Contact { key, address: cfg.listen, quic: cfg.quic });
        dirs.push((dir, cfg));
    }
    for (i, v) in args.validators.iter().enumerate() {
        let (key, address) = crate::config::parse_join(v).with_context(|| format!("--validator {} ({v})", i + 1))?;
        contacts.push(Contact { key: key.to_bytes(), address, quic: None });
    }
    let world = match &args.world {
        Some(p) => Some((WorldFile::load(p)?, p.clone())),
        None => None,
    };
    let default_world = WorldFile {
        world: metatopia_scenarios::spec::WorldSpec {
            region_size: 256,
            physics: "rapier".into(),
            ..Default::default()
        },
        objects: Vec::new(),
    };
    let (wf, path) = match &world {
        Some((wf, p)) => (wf, p.as_path()),
        None => (&default_world, std::path::Path::new(".")),
    };
    let genesis = crate::world::genesis::new_sim(NewSim {
        sim: SimId(args.sim_id),
        admin,
        validators: contacts,
        world: Some((wf, path)),
        time_ms: crate::unix_ms(),
    })?;
    let file = genesis.write(&args.out)?;
    println!("a new sim: {}", genesis.describe());
    println!("the admin: {}; {admin_note}", metatopia_sim::ids::hex(&admin.0));
    println!("genesis: {} (hash {})", file.display(), genesis.hash);
    for (dir, mut cfg) in dirs {
        crate::shell::setup::install_genesis(&dir, &mut cfg, &genesis)?;
        crate::store::write_atomic(&dir.config_path(), cfg.commented().as_bytes())?;
        println!(
            "installed in {}: start it with `metatopia run --data-dir {}`",
            dir.root().display(),
            dir.root().display()
        );
    }
    if !args.validators.is_empty() {
        println!(
            "the other validators' operators install it with `metatopia init --data-dir DIR --listen HOST:PORT --genesis {}`",
            file.display()
        );
    }
    Ok(())
}

pub fn show(args: ShowArgs) -> anyhow::Result<()> {
    let path = if args.path.is_dir() { args.path.join(crate::world::genesis::FILE) } else { args.path.clone() };
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let g = Genesis::decode(&bytes).with_context(|| format!("reading {}", path.display()))?;
    println!("{}", g.describe());
    for c in &g.contacts {
        println!("validator {}@{}", metatopia_sim::ids::hex(&c.key), c.address);
    }
    Ok(())
}
