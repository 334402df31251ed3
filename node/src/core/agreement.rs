//! The agreement a node core drives, behind one trait: the honest validator, the epochs over it,
//! or (in the lab) a Byzantine mock.

use metatopia_consensus::{Digest, Message, Micros, Output, Tick, Validator, ValidatorIndex, VerifyingKey};

/// The agreement a node runs: the honest [`Validator`] (one fixed set), [`crate::core::epochs::Epochs`]
/// (the set follows governance), or in tests and scenarios a Byzantine mock.
pub trait Agreement {
    fn handle_message(&mut self, now: Micros, from: ValidatorIndex, msg: Message);
    fn handle_timeout(&mut self, now: Micros);
    fn submit_events(&mut self, now: Micros, events: Vec<Vec<u8>>);
    fn poll_output(&mut self) -> Option<Output>;
    fn poll_timeout(&self) -> Option<Micros>;
    fn report_root(&mut self, tick: Tick, root: Digest);
    fn validators(&self) -> usize;
    /// What must survive a crash (consensus votes and certificates), if anything.
    fn persist(&self) -> Option<Vec<u8>> {
        None
    }
    /// The transport numbered a node outside the configured list `index` (it holds `key`): a
    /// node that joined, which governance may later admit as a validator.
    fn learn_peer(&mut self, _index: u16, _key: VerifyingKey) {}
    /// What a node joining the sim needs to follow the agreement from where this one is (its
    /// epoch and view), if this agreement can be joined.
    fn join_state(&self) -> Option<Vec<u8>> {
        None
    }
    /// Follow from a peer's [`Agreement::join_state`], outputting no commits until
    /// [`Agreement::commit_from`]; false if the state is malformed.
    fn join_from(&mut self, _now: Micros, _state: &[u8]) -> bool {
        false
    }
    /// The joining node has the state after tick `tick - 1`: commits from `tick` on.
    fn commit_from(&mut self, _now: Micros, _tick: Tick) {}
    /// A joining node: no commits until [`Agreement::commit_from`].
    fn hold(&mut self, _now: Micros) {}
    /// After a restart: the blocks handed out before, from the commit log (oldest first), kept
    /// again to answer peers' fetches ([`Validator::recall`]). Returns how many were kept.
    fn recall(&mut self, _logged: Vec<metatopia_consensus::Logged>) -> usize {
        0
    }
    /// Events waiting in the pool.
    fn pool_len(&self) -> usize {
        0
    }
    /// Where the agreement is: its validator epoch, its current view and the last tick it
    /// committed (shown in the status, so a sim that stops ticking shows where it waits).
    fn position(&self) -> (u64, u64, Option<Tick>) {
        (0, 0, None)
    }
    /// The roots other validators reported for `tick`.
    fn peer_roots(&self, _tick: Tick) -> Vec<(ValidatorIndex, Digest)> {
        Vec::new()
    }
    /// The newest tick f+1 other validators report having executed
    /// ([`Validator::peers_executed`]).
    fn peers_executed(&self) -> Option<Tick> {
        None
    }
    /// Where agreement stands, in one line, for a warning when commits stop.
    fn describe(&self) -> String {
        String::new()
    }
    /// Whether f+1 validators of this node's set speak for a later validator epoch: its own
    /// epoch is over, and peers may no longer answer for it.
    fn behind_epoch(&self) -> bool {
        false
    }
    /// Stranded in an epoch its peers have left: output no commits, and take a later epoch
    /// from a peer's [`Agreement::join_state`] as a joining node does.
    fn rejoin(&mut self, now: Micros) {
        self.hold(now);
    }
    /// A message of validator epoch `epoch` (a single-epoch agreement only knows epoch 0).
    fn handle_epoch_message(&mut self, now: Micros, from: ValidatorIndex, epoch: u64, msg: Message) {
        if epoch == 0 {
            self.handle_message(now, from, msg);
        }
    }
    /// The next output with the epoch it belongs to.
    fn poll_epoch_output(&mut self) -> Option<(u64, Output)> {
        self.poll_output().map(|o| (0, o))
    }
    /// The sim executed `tick` and is now `world` (epochs follow its validator set).
    fn on_executed(&mut self, _now: Micros, _tick: Tick, _world: &metatopia_sim::World) {}
}

impl Agreement for Validator {
    fn handle_message(&mut self, now: Micros, from: ValidatorIndex, msg: Message) {
        Validator::handle_message(self, now, from, msg);
    }
    fn handle_timeout(&mut self, now: Micros) {
        Validator::handle_timeout(self, now);
    }
    fn submit_events(&mut self, now: Micros, events: Vec<Vec<u8>>) {
        Validator::submit_events(self, now, events);
    }
    fn poll_output(&mut self) -> Option<Output> {
        Validator::poll_output(self)
    }
    fn poll_timeout(&self) -> Option<Micros> {
        Validator::poll_timeout(self)
    }
    fn report_root(&mut self, tick: Tick, root: Digest) {
        Validator::report_root(self, tick, root);
    }
    fn validators(&self) -> usize {
        self.keys().len()
    }
    fn persist(&self) -> Option<Vec<u8>> {
        Some(Validator::persist(self))
    }
    fn pool_len(&self) -> usize {
        Validator::pool_len(self)
    }
    fn position(&self) -> (u64, u64, Option<Tick>) {
        (0, self.view().0, self.committed_tick())
    }
    fn peer_roots(&self, tick: Tick) -> Vec<(ValidatorIndex, Digest)> {
        Validator::peer_roots(self, tick).map(|m| m.iter().map(|(v, d)| (*v, *d)).collect()).unwrap_or_default()
    }
    fn describe(&self) -> String {
        Validator::describe(self)
    }
    fn recall(&mut self, logged: Vec<metatopia_consensus::Logged>) -> usize {
        Validator::recall(self, logged)
    }
    fn peers_executed(&self) -> Option<Tick> {
        Validator::peers_executed(self)
    }
    fn hold(&mut self, now: Micros) {
        self.join_at(now, metatopia_consensus::View(0));
    }
    fn commit_from(&mut self, now: Micros, tick: Tick) {
        Validator::commit_from(self, now, tick);
    }
}
