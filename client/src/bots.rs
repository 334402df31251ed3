//! Bots: headless clients that log in, wander and chat, for load. Each bot is a real [`Client`]
//! over QUIC with its own key and its own area of interest; what they measure (ticks seen,
//! ticks missed, bytes received, refusals, failovers) is summed into a [`BotReport`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use metatopia_sim::event::{ChatRange, Payload};
use metatopia_sim::{Fx, Vec2};

use crate::conn::Client;
use crate::proto::{NodeAddr, Outcome, ServerMsg};

/// What the bots do.
#[derive(Debug, Clone)]
pub struct BotPlan {
    pub count: usize,
    pub run_for: Duration,
    /// Each bot changes its walk every this long (jittered).
    pub wander_every: Duration,
    /// Each bot says something every this long (jittered); zero: never.
    pub chat_every: Duration,
    /// Bots connect this many per second (a thousand at once would be a thundering herd).
    pub connect_per_second: u32,
    /// Keys and choices follow from this seed.
    pub seed: u64,
    /// One walk in this many heads up to half a sim past the sim's border (into a neighbour
    /// sim if there is one: the client follows its avatar there); zero: bots stay in their sim.
    pub roam_one_in: u32,
    /// Bot n is named `bot{first_number + n}`: plans run side by side (one per node, say) give
    /// their bots distinct names.
    pub first_number: usize,
}

impl Default for BotPlan {
    fn default() -> BotPlan {
        BotPlan {
            count: 10,
            run_for: Duration::from_secs(30),
            wander_every: Duration::from_secs(10),
            chat_every: Duration::from_secs(10),
            connect_per_second: 100,
            seed: 1,
            roam_one_in: 0,
            first_number: 0,
        }
    }
}

/// Sums over all bots (live: read it while they run).
#[derive(Debug, Default)]
pub struct BotReport {
    pub connected: AtomicU64,
    pub logged_in: AtomicU64,
    pub failed: AtomicU64,
    /// `tick` messages received, and ticks skipped between consecutive ones.
    pub ticks: AtomicU64,
    pub missed_ticks: AtomicU64,
    pub bytes: AtomicU64,
    pub submitted: AtomicU64,
    pub executed: AtomicU64,
    pub refused: AtomicU64,
    pub chat_heard: AtomicU64,
    pub failovers: AtomicU64,
    /// Times a bot's avatar crossed into another sim (and the bot followed it there).
    pub crossings: AtomicU64,
    /// Bots that ran to the end and received a delta in their last [`FRESH_AT_END`].
    pub fresh_at_end: AtomicU64,
    /// Bots that ran to the end without a delta in their last [`FRESH_AT_END`] (starved).
    pub stale_at_end: AtomicU64,
}

/// How recent a bot's last delta must be, when its run ends, for it to count as still
/// receiving deltas.
pub const FRESH_AT_END: Duration = Duration::from_secs(5);

impl BotReport {
    pub fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }
}

/// A bot's key: from the seed and its number (bots are load, not identities worth keeping).
pub fn bot_key(seed: u64, n: usize) -> SigningKey {
    let mut b = [0xb0u8; 32];
    b[..8].copy_from_slice(&seed.to_le_bytes());
    b[8..16].copy_from_slice(&(n as u64).to_le_bytes());
    SigningKey::from_bytes(&b)
}

/// A small deterministic generator for the bots' choices.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const LINES: &[&str] = &["hello", "nice day in the sim", "anyone here?", "look at this door", "echo test"];

/// Run the plan against `bootstrap`; returns when every bot has stopped.
pub async fn run(bootstrap: NodeAddr, plan: BotPlan, report: Arc<BotReport>) {
    let mut tasks = tokio::task::JoinSet::new();
    let gap = Duration::from_secs(1) / plan.connect_per_second.max(1);
    let stop_at = Instant::now() + plan.run_for;
    // A UDP socket per hundred bots (one per bot would be a thousand sockets and drivers).
    let mut endpoints = Vec::new();
    for _ in 0..plan.count.div_ceil(100) {
        match Client::endpoint_for(&bootstrap) {
            Ok(e) => endpoints.push(e),
            Err(e) => {
                tracing::warn!("{e:#}");
                report.failed.fetch_add(plan.count as u64, Ordering::Relaxed);
                return;
            }
        }
    }
    for n in 0..plan.count {
        let (bootstrap, plan, report) = (bootstrap.clone(), plan.clone(), report.clone());
        let endpoint = endpoints[n / 100].clone();
        tasks.spawn(async move {
            if let Err(e) = bot(n, endpoint, &bootstrap, &plan, &report, stop_at).await {
                report.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(bot = n, "{e:#}");
            }
        });
        tokio::time::sleep(gap).await;
    }
    while tasks.join_next().await.is_some() {}
}

/// Why a bot stopped early.
#[derive(Debug, thiserror::Error)]
pub enum BotError {
    #[error(transparent)]
    Client(#[from] crate::conn::ClientError),
    #[error(transparent)]
    Act(#[from] crate::conn::ActError),
    #[error("logged in without an avatar")]
    NoAvatar,
    #[error("no node of the sim answers any more")]
    Gone,
    /// What the bot was doing when it failed.
    #[error("{step}: {source}")]
    At {
        step: &'static str,
        #[source]
        source: Box<BotError>,
    },
}

impl BotError {
    fn at(step: &'static str) -> impl FnOnce(BotError) -> BotError {
        move |e| BotError::At { step, source: Box::new(e) }
    }
}

async fn bot(
    n: usize,
    endpoint: quinn::Endpoint,
    bootstrap: &NodeAddr,
    plan: &BotPlan,
    report: &BotReport,
    stop_at: Instant,
) -> Result<(), BotError> {
    let mut rng =
        Rng(plan.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (n as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
    let mut c = Client::connect_on(endpoint, bootstrap, bot_key(plan.seed, n))
        .await
        .map_err(|e| BotError::at("connecting")(e.into()))?;
    // A bot draws nothing: it decodes every message but keeps only its own avatar's state.
    c.keep_own_objects_only();
    report.connected.fetch_add(1, Ordering::Relaxed);
    c.login(&format!("bot{}", plan.first_number + n)).await.map_err(|e| BotError::at("logging in")(e.into()))?;
    report.logged_in.fetch_add(1, Ordering::Relaxed);
    let mut avatar = c
        .avatar()
        .await
        .map_err(BotError::from)
        .and_then(|a| a.ok_or(BotError::NoAvatar))
        .map_err(BotError::at("asking for the avatar"))?;
    let mut crossings = c.crossings;
    let jitter = |rng: &mut Rng, d: Duration| d / 2 + Duration::from_millis(rng.below(d.as_millis() as u64 + 1));
    let mut next_walk = Instant::now();
    let mut next_chat = Instant::now() + jitter(&mut rng, plan.chat_every);
    let (mut last_tick, mut bytes_before) = (None::<metatopia_sim::Tick>, 0u64);
    let mut last_delta_at = None::<Instant>;
    let mut failovers = 0;
    while Instant::now() < stop_at {
        let now = Instant::now();
        if now >= next_walk {
            // Wander: walk towards a random point of the region, to arrive about when the next
            // choice is due (at most 3 m/s), so bots spread over the sim like visitors do.
            let period = jitter(&mut rng, plan.wander_every);
            next_walk = now + period;
            let me = c.view().avatar_of(c.account()).and_then(|a| c.view().metres_of(&a.id));
            let region = c.view().status.as_ref().map(|s| (s.region_origin, s.region_size.max(1)));
            let roam = plan.roam_one_in > 0 && rng.below(u64::from(plan.roam_one_in)) == 0;
            let velocity = match (me, region) {
                (Some(at), Some((origin, size))) => {
                    // Inside the square, 2 m from its edges; roaming, up to half a sim past them.
                    let (from, span) = if roam { (-size / 2, 2 * size) } else { (2, size - 4) };
                    let target = [
                        origin[0] + from + rng.below(span.max(1) as u64) as i64,
                        origin[1] + from + rng.below(span.max(1) as u64) as i64,
                    ];
                    let (dx, dy) = ((target[0] - at[0]) as f64, (target[1] - at[1]) as f64);
                    let dist = dx.hypot(dy).max(1e-3);
                    let speed = (dist / period.as_secs_f64().max(0.1)).min(3.0);
                    if roam {
                        // A roaming walk goes all the way (at most a minute), in sim time: in a
                        // sim running slow (time dilation below 1) it takes longer. Timed in
                        // wall seconds, a roaming bot of a slowed sim turned back half-way and
                        // seldom reached a border.
                        let dilation = c.view().status.as_ref().map_or(1.0, |s| s.dilation).clamp(0.1, 1.0);
                        next_walk = now + Duration::from_secs_f64((dist / speed / dilation).clamp(1.0, 60.0));
                    }
                    // Client side, so a float is fine here; the event carries exact fixed point.
                    let fx = |v: f64| Fx::from_bits((v * 65_536.0).round() as i64);
                    Vec2::new(fx(dx / dist * speed), fx(dy / dist * speed))
                }
                _ => Vec2::ZERO,
            };
            if c.submit(Payload::Move { object: avatar, velocity }).await.is_ok() {
                report.submitted.fetch_add(1, Ordering::Relaxed);
            }
        }
        if !plan.chat_every.is_zero() && now >= next_chat {
            next_chat = now + jitter(&mut rng, plan.chat_every);
            let text = LINES[rng.below(LINES.len() as u64) as usize].to_string();
            if c.submit(Payload::Chat { channel: 0, range: ChatRange::Say, text }).await.is_ok() {
                report.submitted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let wait = next_walk.min(next_chat).min(stop_at).saturating_duration_since(Instant::now());
        let Ok(m) = tokio::time::timeout(wait, c.next()).await else { continue };
        let Some(m) = m else { return Err(BotError::at("running")(BotError::Gone)) };
        if c.crossings != crossings {
            report.crossings.fetch_add(u64::from(c.crossings - crossings), Ordering::Relaxed);
            crossings = c.crossings;
            // In another sim the avatar has that sim's id, and ticks count from that sim's.
            if let Ok(Some(a)) = c.avatar().await {
                avatar = a;
            }
            (last_tick, bytes_before) = (None, 0);
        }
        if c.failovers != failovers {
            failovers = c.failovers;
            report.failovers.fetch_add(1, Ordering::Relaxed);
            (last_tick, bytes_before) = (None, 0);
        }
        match m {
            ServerMsg::Tick { tick, .. } => {
                report.ticks.fetch_add(1, Ordering::Relaxed);
                last_delta_at = Some(Instant::now());
                if let Some(t) = last_tick {
                    // Deltas come every `stride` ticks (the client asks for at most
                    // CLIENT_MAX_HZ); a longer gap is ticks this bot missed.
                    let rate = c.view().status.as_ref().map_or(20, |s| s.tick_rate_hz.max(1));
                    let stride = u64::from(rate.div_ceil(crate::proto::CLIENT_MAX_HZ));
                    report.missed_ticks.fetch_add(tick.since(t + stride), Ordering::Relaxed);
                }
                last_tick = Some(tick);
                let b = c.bytes_received();
                report.bytes.fetch_add(b.saturating_sub(bytes_before), Ordering::Relaxed);
                bytes_before = b;
            }
            ServerMsg::Chat(_) => {
                report.chat_heard.fetch_add(1, Ordering::Relaxed);
            }
            ServerMsg::Outcome { outcome: Outcome::Executed { .. }, .. } => {
                report.executed.fetch_add(1, Ordering::Relaxed);
            }
            ServerMsg::Outcome { outcome: Outcome::Refused { .. }, .. } => {
                report.refused.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
    let fresh = last_delta_at.is_some_and(|at| at.elapsed() <= FRESH_AT_END);
    (if fresh { &report.fresh_at_end } else { &report.stale_at_end }).fetch_add(1, Ordering::Relaxed);
    // Leave the sim tidy: stop walking, log out.
    let _ = c.submit(Payload::Move { object: avatar, velocity: Vec2::ZERO }).await;
    let _ = c.submit(Payload::Logout).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bot_keys_differ_per_bot_and_repeat_per_seed() {
        assert_eq!(bot_key(1, 5).to_bytes(), bot_key(1, 5).to_bytes());
        assert_ne!(bot_key(1, 5).to_bytes(), bot_key(1, 6).to_bytes());
        assert_ne!(bot_key(1, 5).to_bytes(), bot_key(2, 5).to_bytes());
        let mut r = Rng(7);
        let picks: Vec<u64> = (0..100).map(|_| r.below(5)).collect();
        assert!((0..5).all(|v| picks.contains(&v)), "{picks:?}");
    }
}
