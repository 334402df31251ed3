//! Validator epochs: the agreement whose validator set follows the sim's governance (DESIGN
//! §10: validators are admitted and removed by admin acts, at epoch boundaries).
//!
//! The sim applies pending validator changes after executing tick `kL - 1` (`L` =
//! `epoch_ticks`). Consensus runs one instance per epoch: epoch `e` decides ticks up to its last
//! tick `E = kL`, then goes quiet. Block `E - 1` is committed once `E` is finalized; once this
//! node has executed it, the set for the next epoch is the sim's validator set at that point —
//! the same on every node — and the next instance starts, anchored on `E` (its first block, tick
//! `E + 1`, carries a notarization of `E` by the old set, and so commits `E` with its seed). A node
//! that executed `E - 1` before its own agreement finalized `E` (a joiner executing blocks it
//! fetched) keeps the set as of `E - 1` and starts the next instance once `E` is final here. A key
//! in the new set votes from then on; a key no longer in it follows as an observer. Events still
//! in the old pool move to the new one. Messages carry their epoch: the previous instance still
//! answers laggards, the next one's messages wait until this node gets there.

use std::collections::VecDeque;

use metatopia_consensus::{
    Anchor, Config, Digest, Message, Micros, Output, SigningKey, Tick, Validator, ValidatorIndex, VerifyingKey,
};
use metatopia_sim::World;
use serde::{Deserialize, Serialize};

use crate::core::agreement::Agreement;

/// Senders that are not in an epoch's set get indices from here on (so a fetch can be answered).
const OUTSIDE: u16 = 0x8000;
/// Messages of the next epoch kept until this node gets there.
const MAX_EARLY: usize = 8_192;
/// The shortest epoch consensus accepts (the sim's `epoch_ticks` may say less).
const MIN_EPOCH: u64 = 8;

struct Instance {
    epoch: u64,
    keys: Vec<VerifyingKey>,
    validator: Validator,
    last_tick: Tick,
    /// The tick period this epoch runs at.
    period_us: Micros,
}

impl Instance {
    fn local(&self, peers: &[Option<VerifyingKey>], from: ValidatorIndex) -> ValidatorIndex {
        let key = peers.get(usize::from(from.0)).and_then(Option::as_ref);
        match key.and_then(|k| self.keys.iter().position(|x| x == k)) {
            Some(i) => ValidatorIndex(i as u16),
            None => ValidatorIndex(OUTSIDE.saturating_add(from.0)),
        }
    }

    fn peer(&self, peers: &[Option<VerifyingKey>], local: ValidatorIndex) -> Option<ValidatorIndex> {
        if local.0 >= OUTSIDE {
            return Some(ValidatorIndex(local.0 - OUTSIDE));
        }
        let key = self.keys.get(usize::from(local.0))?;
        peers.iter().position(|k| k.as_ref() == Some(key)).map(|i| ValidatorIndex(i as u16))
    }
}

/// An epoch: its number, validator set, last tick, tick period and anchor.
#[derive(Serialize, Deserialize)]
struct EpochDef {
    epoch: u64,
    keys: Vec<[u8; 32]>,
    last_tick: Tick,
    period_us: Micros,
    anchor: Option<Anchor>,
}

impl EpochDef {
    fn of(inst: &Instance) -> EpochDef {
        EpochDef {
            epoch: inst.epoch,
            keys: inst.keys.iter().map(|k| k.to_bytes()).collect(),
            last_tick: inst.last_tick,
            period_us: inst.period_us,
            anchor: inst.validator.anchor().cloned(),
        }
    }

    /// The set as keys, and the agreement's config for the epoch; `None` if a key is malformed.
    fn config(self, cfg: &Config) -> Option<(Vec<VerifyingKey>, Config)> {
        let keys: Vec<VerifyingKey> = self.keys.iter().filter_map(|k| VerifyingKey::from_bytes(k).ok()).collect();
        (keys.len() == self.keys.len()).then(|| {
            (
                keys,
                Config {
                    last_tick: Some(self.last_tick),
                    anchor: self.anchor,
                    period_us: self.period_us,
                    ..cfg.clone()
                },
            )
        })
    }
}

/// What survives a restart (the same bytes as the flat struct it was before).
#[derive(Serialize, Deserialize)]
struct Saved {
    def: EpochDef,
    validator: Vec<u8>,
}

/// Where a joining node's agreement starts: the serving node's current epoch and view.
#[derive(Serialize, Deserialize)]
struct EpochStart {
    def: EpochDef,
    view: u64,
}

/// The agreement of a sim whose validators change at epoch boundaries.
pub struct Epochs {
    cfg: Config,
    key: SigningKey,
    /// Every node this one talks to, by peer index (the transport's numbering; the indices it
    /// gave nodes of other sims are holes).
    peers: Vec<Option<VerifyingKey>>,
    current: Instance,
    previous: Option<Instance>,
    early: VecDeque<(ValidatorIndex, u64, Message)>,
    out: VecDeque<(u64, Output)>,
    last_root: Option<(Tick, Digest)>,
    /// Each epoch runs at the sim's `tick_rate_hz` setting as of its start (a real node);
    /// otherwise at `cfg.period_us` throughout (the simulated cluster's scenarios).
    follow_rate: bool,
    /// Stranded in an epoch its peers have left ([`Agreement::rejoin`]): it takes only a later
    /// epoch from a peer's answer, never its own again (it may have voted there).
    rejoining: bool,
    /// The next epoch as the world gave it, waiting for the current epoch's last block to be
    /// final here (see [`NextEpoch`]).
    switching: Option<NextEpoch>,
}

/// What the next epoch takes from the world after the tick before the current epoch's last:
/// its validator set, length and rate. Taken then and kept while the epoch's last block is not
/// final here yet (a node that joined mid-epoch may execute that tick from the blocks it
/// fetched before its own agreement finalizes the last block), so the switch made once the
/// block is final is the one every node made, whatever the world executed meanwhile.
#[derive(Debug)]
struct NextEpoch {
    keys: Vec<VerifyingKey>,
    epoch_ticks: u64,
    tick_rate_hz: u32,
}

impl NextEpoch {
    fn of(world: &World, current: &[VerifyingKey]) -> NextEpoch {
        let mut keys: Vec<VerifyingKey> =
            world.governance().validators.iter().filter_map(|a| VerifyingKey::from_bytes(&a.0).ok()).collect();
        if keys.len() < 4 {
            // A set too small for BFT would stop the sim: keep the old one (the same on every node).
            tracing::warn!(validators = keys.len(), "the sim's validator set is below 4; keeping the old one");
            keys = current.to_vec();
        }
        NextEpoch { keys, epoch_ticks: world.settings().epoch_ticks, tick_rate_hz: world.settings().tick_rate_hz }
    }
}

impl std::fmt::Debug for Epochs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epochs")
            .field("epoch", &self.current.epoch)
            .field("validators", &self.current.keys.len())
            .field("last_tick", &self.current.last_tick)
            .finish_non_exhaustive()
    }
}

fn next_end(after: Tick, epoch_ticks: u64) -> Tick {
    let l = epoch_ticks.max(MIN_EPOCH);
    let mut end = (after.0 / l + 1) * l;
    if end < after.0 + 2 {
        end += l;
    }
    Tick(end)
}

impl Epochs {
    /// At genesis: `keys` is the genesis validator set, `epoch_ticks` the genesis world's.
    pub fn new(
        cfg: Config,
        key: SigningKey,
        peers: Vec<VerifyingKey>,
        keys: Vec<VerifyingKey>,
        epoch_ticks: u64,
        now: Micros,
    ) -> Epochs {
        let last_tick = next_end(Tick::ZERO, epoch_ticks);
        let c = Config { last_tick: Some(last_tick), anchor: None, ..cfg.clone() };
        let validator = Validator::new(c, key.clone(), keys.clone(), now);
        let current = Instance { epoch: 0, keys, validator, last_tick, period_us: cfg.period_us };
        Epochs {
            cfg,
            key,
            peers: peers.into_iter().map(Some).collect(),
            current,
            previous: None,
            early: VecDeque::new(),
            out: VecDeque::new(),
            last_root: None,
            follow_rate: false,
            rejoining: false,
            switching: None,
        }
    }

    /// From the next epoch on, run at the sim's `tick_rate_hz` setting (the admin's `settings`
    /// act changes the rate at an epoch boundary, the same on every node).
    pub fn following_tick_rate(mut self) -> Epochs {
        self.follow_rate = true;
        self
    }

    /// The tick period of the current epoch.
    pub fn period_us(&self) -> Micros {
        self.current.period_us
    }

    /// Continue after a crash from what [`Agreement::persist`] returned.
    pub fn restore(
        cfg: Config,
        key: SigningKey,
        peers: Vec<VerifyingKey>,
        now: Micros,
        saved: &[u8],
    ) -> Option<Epochs> {
        let s: Saved = postcard::from_bytes(saved).ok()?;
        let (epoch, last_tick, period_us) = (s.def.epoch, s.def.last_tick, s.def.period_us);
        let (keys, c) = s.def.config(&cfg)?;
        let validator = Validator::restore(c, key.clone(), keys.clone(), now, &s.validator).ok()?;
        let current = Instance { epoch, keys, validator, last_tick, period_us };
        Some(Epochs {
            cfg,
            key,
            peers: peers.into_iter().map(Some).collect(),
            current,
            previous: None,
            early: VecDeque::new(),
            out: VecDeque::new(),
            last_root: None,
            follow_rate: false,
            rejoining: false,
            switching: None,
        })
    }

    pub fn epoch(&self) -> u64 {
        self.current.epoch
    }

    /// The current validator set.
    pub fn keys(&self) -> &[VerifyingKey] {
        &self.current.keys
    }

    /// This node's index in the current set (`None`: it only follows).
    pub fn index(&self) -> Option<ValidatorIndex> {
        self.current.validator.index()
    }

    fn drain(&mut self) {
        for inst in self.previous.iter_mut().chain(std::iter::once(&mut self.current)) {
            while let Some(o) = inst.validator.poll_output() {
                let o = match o {
                    Output::Send(to, m) => match inst.peer(&self.peers, to) {
                        Some(p) => Output::Send(p, m),
                        None => continue,
                    },
                    Output::RootMismatch { tick, mine, theirs, validator } => match inst.peer(&self.peers, validator) {
                        Some(p) => Output::RootMismatch { tick, mine, theirs, validator: p },
                        None => continue,
                    },
                    other => other,
                };
                self.out.push_back((inst.epoch, o));
            }
        }
    }

    /// The switch: after executing the tick before the epoch's last, start the next epoch as
    /// `switching` says, once the epoch's last block is final here (at once, as a rule; a node
    /// that joined mid-epoch may finalize it a little later: it switches then).
    fn next_epoch(&mut self, now: Micros) {
        if self.switching.is_none() {
            return;
        }
        let Some((block, notarization)) = self.current.validator.final_block() else {
            return;
        };
        let Some(NextEpoch { keys, epoch_ticks, tick_rate_hz }) = self.switching.take() else { return };
        let anchor = Anchor {
            epoch: self.current.epoch + 1,
            block,
            notarization,
            prev_keys: self.current.keys.iter().map(|k| k.to_bytes()).collect(),
            prev_chain: self.current.validator.genesis(),
        };
        let last_tick = next_end(anchor.block.tick, epoch_ticks);
        let period_us =
            if self.follow_rate { 1_000_000 / u64::from(tick_rate_hz.clamp(1, 240)) } else { self.cfg.period_us };
        // A validator that the old epoch's chain shows failed and silent starts demoted (it
        // leads again once the chain shows it alive), so a crash costs no timeouts per epoch.
        let demoted = self.current.validator.demoted();
        let c = Config { last_tick: Some(last_tick), anchor: Some(anchor), period_us, demoted, ..self.cfg.clone() };
        let mut validator = Validator::new(c, self.key.clone(), keys.clone(), now);
        validator.continue_schedule(&self.current.validator);
        if let Some((tick, root)) = self.last_root {
            validator.report_root(tick, root);
        }
        let pending = self.current.validator.drain_pool();
        if !pending.is_empty() {
            validator.submit_events(now, pending);
        }
        let next = Instance { epoch: self.current.epoch + 1, keys, validator, last_tick, period_us };
        tracing::info!(
            epoch = next.epoch,
            validators = next.keys.len(),
            until_tick = next.last_tick.0,
            period_us = next.period_us,
            "a new validator epoch"
        );
        self.previous = Some(std::mem::replace(&mut self.current, next));
        // What arrived early for this epoch.
        let early = std::mem::take(&mut self.early);
        for (from, epoch, msg) in early {
            self.route(now, from, epoch, msg);
        }
        self.current.validator.handle_timeout(now);
    }

    fn route(&mut self, now: Micros, from: ValidatorIndex, epoch: u64, msg: Message) {
        if epoch == self.current.epoch {
            let local = self.current.local(&self.peers, from);
            self.current.validator.handle_message(now, local, msg);
        } else if epoch > self.current.epoch {
            if self.early.len() < MAX_EARLY {
                self.early.push_back((from, epoch, msg));
            }
        } else if let Some(p) = self.previous.as_mut().filter(|p| p.epoch == epoch) {
            let local = p.local(&self.peers, from);
            p.validator.handle_message(now, local, msg);
        }
    }
}

impl Agreement for Epochs {
    fn handle_message(&mut self, now: Micros, from: ValidatorIndex, msg: Message) {
        self.handle_epoch_message(now, from, self.current.epoch, msg);
    }
    fn learn_peer(&mut self, index: u16, key: VerifyingKey) {
        // The transport numbers nodes in order (also nodes of other sims, which the agreement
        // never hears of: holes), and gives an index an unlisted node left to the next one.
        let i = usize::from(index);
        if i >= self.peers.len() {
            self.peers.resize(i + 1, None);
        }
        self.peers[i] = Some(key);
    }
    fn handle_epoch_message(&mut self, now: Micros, from: ValidatorIndex, epoch: u64, msg: Message) {
        self.route(now, from, epoch, msg);
        self.next_epoch(now);
        self.drain();
    }
    fn handle_timeout(&mut self, now: Micros) {
        if let Some(p) = self.previous.as_mut() {
            p.validator.handle_timeout(now);
        }
        self.current.validator.handle_timeout(now);
        self.next_epoch(now);
        self.drain();
    }
    fn submit_events(&mut self, now: Micros, events: Vec<Vec<u8>>) {
        self.current.validator.submit_events(now, events);
        self.drain();
    }
    fn poll_output(&mut self) -> Option<Output> {
        self.poll_epoch_output().map(|(_, o)| o)
    }
    fn poll_epoch_output(&mut self) -> Option<(u64, Output)> {
        self.drain();
        self.out.pop_front()
    }
    fn poll_timeout(&self) -> Option<Micros> {
        let a = self.current.validator.poll_timeout();
        let b = self.previous.as_ref().and_then(|p| p.validator.poll_timeout());
        match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
    fn report_root(&mut self, tick: Tick, root: Digest) {
        self.last_root = Some((tick, root));
        self.current.validator.report_root(tick, root);
    }
    fn on_executed(&mut self, now: Micros, tick: Tick, world: &World) {
        if tick + 1 == self.current.last_tick {
            self.switching = Some(NextEpoch::of(world, &self.current.keys));
            self.next_epoch(now);
            if let Some(next) = &self.switching {
                tracing::warn!(
                    epoch = self.current.epoch,
                    validators = next.keys.len(),
                    "the epoch's last block is not final here yet: switching once it is"
                );
            }
            self.drain();
        }
    }
    fn validators(&self) -> usize {
        self.current.keys.len()
    }
    fn persist(&self) -> Option<Vec<u8>> {
        let s = Saved { def: EpochDef::of(&self.current), validator: self.current.validator.persist() };
        postcard::to_allocvec(&s).ok()
    }
    fn pool_len(&self) -> usize {
        self.current.validator.pool_len()
    }
    fn position(&self) -> (u64, u64, Option<Tick>) {
        let v = &self.current.validator;
        (self.current.epoch, v.view().0, v.committed_tick())
    }
    fn describe(&self) -> String {
        format!("epoch {}: {}", self.current.epoch, self.current.validator.describe())
    }
    fn join_state(&self) -> Option<Vec<u8>> {
        let s = EpochStart { def: EpochDef::of(&self.current), view: self.current.validator.view().0 };
        postcard::to_allocvec(&s).ok()
    }
    fn join_from(&mut self, now: Micros, state: &[u8]) -> bool {
        let Ok(s) = postcard::from_bytes::<EpochStart>(state) else { return false };
        if self.rejoining && s.def.epoch <= self.current.epoch {
            return false;
        }
        let (epoch, last_tick, period_us) = (s.def.epoch, s.def.last_tick, s.def.period_us);
        let Some((keys, c)) = s.def.config(&self.cfg).filter(|(k, _)| k.len() >= 4 && period_us > 0) else {
            return false;
        };
        let mut validator = Validator::new(c, self.key.clone(), keys.clone(), now);
        validator.join_at(now, metatopia_consensus::View(s.view));
        self.rejoining = false;
        tracing::info!(epoch, view = s.view, validators = keys.len(), "joining: following the sim's current epoch");
        self.current = Instance { epoch, keys, validator, last_tick, period_us };
        self.previous = None;
        self.switching = None;
        let early = std::mem::take(&mut self.early);
        for (from, epoch, msg) in early {
            self.route(now, from, epoch, msg);
        }
        self.drain();
        true
    }
    fn hold(&mut self, now: Micros) {
        self.current.validator.join_at(now, metatopia_consensus::View(0));
    }
    fn commit_from(&mut self, now: Micros, tick: Tick) {
        self.current.validator.commit_from(now, tick);
        self.next_epoch(now);
        self.drain();
    }
    fn recall(&mut self, logged: Vec<metatopia_consensus::Logged>) -> usize {
        self.current.validator.recall(logged)
    }
    fn peers_executed(&self) -> Option<Tick> {
        self.current.validator.peers_executed()
    }
    fn behind_epoch(&self) -> bool {
        let f = (self.current.keys.len() - 1) / 3;
        let mut ahead = std::collections::BTreeSet::new();
        for (from, _, _) in &self.early {
            let v = self.current.local(&self.peers, *from);
            if usize::from(v.0) < self.current.keys.len() && ahead.insert(v) && ahead.len() > f {
                return true;
            }
        }
        false
    }
    fn rejoin(&mut self, now: Micros) {
        self.rejoining = true;
        self.previous = None;
        self.switching = None;
        self.hold(now);
    }
    fn peer_roots(&self, tick: Tick) -> Vec<(ValidatorIndex, Digest)> {
        let inst = &self.current;
        inst.validator
            .peer_roots(tick)
            .map(|m| m.iter().filter_map(|(v, d)| inst.peer(&self.peers, *v).map(|p| (p, *d))).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_numbered_after_other_sims_nodes_is_known_by_its_key_until_its_index_is_taken_again() {
        use crate::core::agreement::Agreement as _;
        let keys: Vec<VerifyingKey> = (1..=5u8).map(|i| SigningKey::from_bytes(&[i; 32]).verifying_key()).collect();
        // Five validators; the mesh listed four, gave indices 4..=8 to nodes of other sims (the
        // agreement never hears of them) and 9 to the fifth validator when it connected.
        let mut e =
            Epochs::new(Config::default(), SigningKey::from_bytes(&[1; 32]), keys[..4].to_vec(), keys.clone(), 40, 0);
        e.learn_peer(9, keys[4]);
        assert_eq!(e.current.local(&e.peers, ValidatorIndex(9)), ValidatorIndex(4));
        assert_eq!(e.current.peer(&e.peers, ValidatorIndex(4)), Some(ValidatorIndex(9)));
        assert_eq!(e.current.local(&e.peers, ValidatorIndex(2)), ValidatorIndex(2));
        // A hole is nobody's.
        assert_eq!(e.current.local(&e.peers, ValidatorIndex(6)), ValidatorIndex(OUTSIDE + 6));
        // The fifth left and a stranger took its index: the index is the stranger's now.
        let stranger = SigningKey::from_bytes(&[9; 32]).verifying_key();
        e.learn_peer(9, stranger);
        assert_eq!(e.current.local(&e.peers, ValidatorIndex(9)), ValidatorIndex(OUTSIDE + 9));
        assert_eq!(e.current.peer(&e.peers, ValidatorIndex(4)), None);
    }

    #[test]
    fn epochs_end_on_multiples_of_the_length_at_least_two_ticks_on() {
        assert_eq!(next_end(Tick(0), 40), Tick(40));
        assert_eq!(next_end(Tick(40), 40), Tick(80));
        assert_eq!(next_end(Tick(79), 40), Tick(120));
        assert_eq!(next_end(Tick(0), 1), Tick(8));
        assert_eq!(next_end(Tick(39), 40), Tick(80));
    }
}
