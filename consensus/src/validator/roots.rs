//! Root reports: executed state roots reported with the votes, and peers' roots kept for desync detection.

use super::*;

impl Validator {
    /// The state roots other validators reported for `tick` in their votes (recent ticks).
    pub fn peer_roots(&self, tick: Tick) -> Option<&BTreeMap<ValidatorIndex, Digest>> {
        self.peer_roots.get(&tick)
    }

    /// The newest tick that f+1 other validators (at least one honest) report having executed,
    /// in their votes' root reports: how far the sim is, as seen from a node that lags.
    pub fn peers_executed(&self) -> Option<Tick> {
        let f = self.f();
        self.peer_roots
            .iter()
            .rev()
            .find(|(_, by)| by.keys().filter(|v| Some(**v) != self.me).count() > f)
            .map(|(t, _)| *t)
    }

    /// The application executed `tick` and reached `root`; carried in later votes.
    pub fn report_root(&mut self, tick: Tick, root: Digest) {
        self.root = Some(RootReport { tick, root });
        self.my_roots.insert(tick, root);
        if let Some(peers) = self.peer_roots.get(&tick) {
            for (v, r) in peers {
                if *r != root {
                    self.out.push_back(Output::RootMismatch { tick, mine: root, theirs: *r, validator: *v });
                }
            }
        }
        while self.my_roots.len() > 256 {
            self.my_roots.pop_first();
        }
        let horizon = tick.saturating_sub(256);
        self.peer_roots.retain(|t, _| *t >= horizon);
    }

    pub(super) fn note_root(&mut self, from: ValidatorIndex, r: RootReport) {
        if let Some(mine) = self.my_roots.get(&r.tick)
            && *mine != r.root
        {
            self.out.push_back(Output::RootMismatch { tick: r.tick, mine: *mine, theirs: r.root, validator: from });
        }
        let oldest = self.my_roots.first_key_value().map_or(Tick::ZERO, |(t, _)| *t);
        if r.tick >= oldest {
            self.peer_roots.entry(r.tick).or_default().insert(from, r.root);
            while self.peer_roots.len() > 512 {
                self.peer_roots.pop_first();
            }
        }
    }
}
