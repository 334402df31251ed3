//! `metatopia client` (the terminal client) and `metatopia bot` (headless clients for load).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use metatopia_client::bots::{BotPlan, BotReport};
use metatopia_client::proto::NodeAddr;

#[derive(Debug, Args)]
pub struct ClientArgs {
    /// Any node, as its join address KEY@HOST:PORT (`metatopia init`, `run` and `devnet` print
    /// them); it routes the client to a node of the sim its avatar is in.
    #[arg(long = "join", env = "METATOPIA_JOIN", value_name = "KEY@HOST:PORT")]
    pub node: NodeAddr,
    /// The account key (made on first use): default `$METATOPIA_HOME/client.key`, else
    /// `./metatopia-client.key`.
    #[arg(long, env = "METATOPIA_CLIENT_KEY")]
    pub key: Option<PathBuf>,
    /// The avatar's name.
    #[arg(long, default_value = "guest")]
    pub name: String,
    /// Where to enter the world (`X,Y` in world metres) when the account has no avatar yet: the
    /// node asked finds the sim whose square holds it through Raynet. Default: the node's sim.
    #[arg(long, value_parser = parse_point, value_name = "X,Y")]
    pub at: Option<[i64; 2]>,
}

fn parse_point(s: &str) -> Result<[i64; 2], String> {
    let (x, y) = s.split_once(',').ok_or_else(|| format!("{s:?} is not X,Y (metres, e.g. 200,40)"))?;
    let n = |v: &str| v.trim().parse::<i64>().map_err(|e| format!("{v:?} in {s:?}: {e}"));
    Ok([n(x)?, n(y)?])
}

#[derive(Debug, Args)]
pub struct BotArgs {
    /// Any node, as its join address KEY@HOST:PORT.
    #[arg(long = "join", env = "METATOPIA_JOIN", value_name = "KEY@HOST:PORT")]
    pub node: NodeAddr,
    /// How many bots.
    #[arg(long, default_value_t = 10)]
    pub count: usize,
    /// How long they stay, seconds.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// Each bot picks a new point of the region to walk to about this often, seconds.
    #[arg(long, default_value_t = 10)]
    pub wander_every: u64,
    /// Each bot says something about this often, seconds (0: never).
    #[arg(long, default_value_t = 10)]
    pub chat_every: u64,
    /// Bots connecting per second.
    #[arg(long, default_value_t = 100)]
    pub connect_rate: u32,
    /// The bots' keys follow from this (the same seed: the same accounts).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// One walk in N heads up to half a sim past the sim's border, into neighbour sims (the
    /// bots follow their avatars there); 0: bots stay in their sim.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub roam_one_in: u32,
}

fn key_path(arg: Option<PathBuf>) -> PathBuf {
    arg.unwrap_or_else(|| match std::env::var_os("METATOPIA_HOME") {
        Some(home) => PathBuf::from(home).join("client.key"),
        None => PathBuf::from("metatopia-client.key"),
    })
}

pub fn client(args: ClientArgs) -> anyhow::Result<()> {
    let path = key_path(args.key);
    let key = metatopia_client::keys::load_or_create(&path)?;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        eprintln!("connecting to {} …", args.node);
        let mut c = metatopia_client::Client::connect_at(&args.node, key, args.at)
            .await
            .with_context(|| format!("connecting through {}", args.node))?;
        eprintln!(
            "on node {} of sim {}; logging in as {:?}",
            c.node().map_or_else(String::new, |n| n.addr.clone()),
            c.sim(),
            args.name
        );
        c.login(&args.name).await.context("logging in")?;
        Ok(metatopia_client::tui::run(c).await?)
    })
}

pub fn bot(args: BotArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.count > 0, "--count must be at least 1");
    let plan = BotPlan {
        count: args.count,
        run_for: Duration::from_secs(args.seconds),
        wander_every: Duration::from_secs(args.wander_every.max(1)),
        chat_every: Duration::from_secs(args.chat_every),
        connect_per_second: args.connect_rate.max(1),
        seed: args.seed,
        roam_one_in: args.roam_one_in,
        first_number: 0,
    };
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let report = Arc::new(BotReport::default());
        let started = std::time::Instant::now();
        let task = tokio::spawn(metatopia_client::bots::run(args.node.clone(), plan, report.clone()));
        let g = BotReport::get;
        let (mut last_bytes, mut last_ticks) = (0, 0);
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.tick().await;
        while !task.is_finished() {
            every.tick().await;
            let (bytes, ticks) = (g(&report.bytes), g(&report.ticks));
            let online = g(&report.logged_in).max(1);
            println!(
                "{:>4}s  bots {}/{} in ({} failed)  deltas/s per bot {:.1}  ticks missed {}  KB/s per bot {:.2}  executed {} refused {}  chat heard {}  failovers {}  crossings {}",
                started.elapsed().as_secs(),
                g(&report.logged_in),
                args.count,
                g(&report.failed),
                (ticks - last_ticks) as f64 / online as f64,
                g(&report.missed_ticks),
                (bytes - last_bytes) as f64 / 1024.0 / online as f64,
                g(&report.executed),
                g(&report.refused),
                g(&report.chat_heard),
                g(&report.failovers),
                g(&report.crossings),
            );
            (last_bytes, last_ticks) = (bytes, ticks);
        }
        task.await?;
        let secs = started.elapsed().as_secs_f64().max(1e-3);
        println!(
            "done: {} bots logged in of {}; {} received deltas to the end, {} had none in their last {} s; {} ticks received, {} missed; {:.2} KB/s per bot on average; {} events executed, {} refused",
            g(&report.logged_in),
            args.count,
            g(&report.fresh_at_end),
            g(&report.stale_at_end),
            metatopia_client::bots::FRESH_AT_END.as_secs(),
            g(&report.ticks),
            g(&report.missed_ticks),
            g(&report.bytes) as f64 / 1024.0 / secs / g(&report.logged_in).max(1) as f64,
            g(&report.executed),
            g(&report.refused)
        );
        anyhow::ensure!(g(&report.logged_in) > 0, "no bot could log in");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn points_parse_or_say_what_is_wrong() {
        assert_eq!(super::parse_point("200,-40"), Ok([200, -40]));
        assert_eq!(super::parse_point(" 3 , 4"), Ok([3, 4]));
        assert!(super::parse_point("200").unwrap_err().contains("X,Y"));
        assert!(super::parse_point("a,1").unwrap_err().contains("\"a\""));
    }
}
