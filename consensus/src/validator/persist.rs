//! What survives a crash: the validator's votes and certificates persisted and restored, and the blocks it handed out recalled from the commit log.

use super::*;

impl Validator {
    /// Continue after a crash from what [`Validator::persist`] returned.
    pub fn restore(
        cfg: Config,
        key: SigningKey,
        keys: Vec<VerifyingKey>,
        now: Micros,
        saved: &[u8],
    ) -> Result<Validator, crate::types::DecodeError> {
        let p: Persisted =
            postcard::from_bytes(saved).map_err(|e| crate::types::DecodeError::Malformed(e.to_string()))?;
        let mut v = Validator::new(cfg, key, keys, now);
        v.view = p.view;
        for (view, (n, x, f)) in p.votes {
            let lead = Some(v.leader(view)) == v.me;
            let s = v.views.entry(view).or_default();
            // Its own votes count in its tallies, as when they were cast: a validator that
            // counted only its peers' after a restart needed one vote more than there could be
            // with f validators down (three restored with their nullify votes of one view, the
            // fourth down, each saw two and that view never ended).
            for vote in [&n, &x, &f].into_iter().flatten() {
                s.tally_mut(vote.kind, vote.digest).insert(vote.signer, vote.clone());
                s.first.insert((vote.kind, vote.signer), vote.clone());
            }
            s.my_notarize = n;
            s.my_nullify = x;
            s.my_finalize = f;
            s.proposed = s.my_notarize.is_some() && lead;
        }
        v.tip = p.tip;
        v.output_tick = p.output_tick;
        for b in p.blocks {
            let ids = event_ids(&b.events);
            v.blocks.insert(b.digest_with_ids(&ids), Stored::with_ids(b, ids));
        }
        for c in p.notarized {
            v.notarized.insert(c.view, c);
        }
        for c in p.nullified {
            v.nullified.insert(c.view, c);
        }
        for c in p.finalized {
            v.finalized.insert(c.view, c);
        }
        // A certificate formed on its votes' MACs is saved only once their signatures are
        // checked, a few milliseconds later. When every validator stopped inside that window
        // (a whole sim stopped at once), nobody has it, and nobody sent its votes of a past view
        // again: no later view could be built on, and every view timed out from then on. So
        // this validator's votes whose certificate it lacks are sent again while it is stuck
        // (as `resend` does for certificates that lost a vote), until the certificate forms.
        let holes: Vec<(VoteKind, View)> = v
            .views
            .iter()
            .flat_map(|(view, s)| {
                [
                    (VoteKind::Notarize, s.my_notarize.is_some()),
                    (VoteKind::Nullify, s.my_nullify.is_some()),
                    (VoteKind::Finalize, s.my_finalize.is_some()),
                ]
                .into_iter()
                .filter(|(_, mine)| *mine)
                .map(move |(kind, _)| (kind, *view))
            })
            .filter(|(kind, view)| !v.certified(*kind).contains_key(view))
            .collect();
        v.repair.extend(holes);
        Ok(v)
    }

    /// Blocks this validator handed out as committed before a restart, oldest first, from the
    /// application's commit log: kept again (as if never pruned) to answer peers' fetches.
    /// [`Validator::persist`] keeps only the blocks not yet handed out, so without this, once
    /// a whole sim had stopped, no validator would hold the blocks that one down at the time
    /// still needs, and it could never commit again.
    ///
    /// Each block is rebuilt from its record and the notarization of the block before it (an
    /// epoch's first block, from the genesis or the anchor), and kept only when its digest and
    /// view are its notarization's. Records of ticks not handed out yet, before this epoch, or
    /// more than `keep_blocks` below the committed tick are skipped, and the byte budget
    /// applies as to any finalized block. Returns how many blocks were kept.
    pub fn recall(&mut self, logged: impl IntoIterator<Item = Logged>) -> usize {
        let Some(out) = self.output_tick else { return 0 };
        let first_tick = self.cfg.anchor.as_ref().map_or(Tick::ZERO, |a| a.block.tick + 1);
        let keep_from = out.saturating_sub(self.cfg.keep_blocks).max(first_tick);
        let mut prev: Option<(Tick, Certificate)> = None;
        let mut kept = 0;
        let mut logged = logged.into_iter().peekable();
        while let Some(start) = logged.next() {
            // A block's span: the empty ticks before its own share its notarization (R1 spans).
            let from = start.tick;
            let mut rec = start;
            while let Some(next) = logged.next_if(|n| n.tick == rec.tick + 1 && n.notarization == rec.notarization) {
                rec = next;
            }
            let parent = if from == first_tick {
                let anchor = self.cfg.anchor.as_ref().map(|a| a.notarization.clone());
                Some((Parent { view: View(0), digest: self.root_parent() }, anchor))
            } else {
                prev.take()
                    .filter(|(tick, _)| *tick + 1 == from)
                    .map(|(_, c)| (Parent { view: c.view, digest: c.digest }, Some(c)))
            };
            let n = rec.notarization;
            if let Some((mut parent, mut parent_certificate)) = parent
                && (keep_from..=out).contains(&rec.tick)
                && n.kind == VoteKind::Notarize
            {
                if let Some(o) = rec.opener {
                    // The empty block that opened the tick this one fills (R1 fills).
                    let opener = Block {
                        view: o.notarization.view,
                        leader: self.leader(o.notarization.view),
                        parent,
                        tick: rec.tick,
                        time_ms: o.time_ms,
                        events: Vec::new(),
                        parent_certificate,
                    };
                    kept += usize::from(self.rebuild(opener, &o.notarization));
                    parent = Parent { view: o.notarization.view, digest: o.notarization.digest };
                    parent_certificate = Some(o.notarization);
                }
                let block = Block {
                    view: n.view,
                    leader: self.leader(n.view),
                    parent,
                    tick: rec.tick,
                    time_ms: rec.time_ms,
                    events: rec.events,
                    parent_certificate,
                };
                kept += usize::from(self.rebuild(block, &n));
            }
            prev = Some((rec.tick, n));
        }
        self.prune();
        kept
    }

    /// Keep a block rebuilt from the log if it is the one `n` notarizes (the log does not
    /// name the leader: the one this validator would choose now, else each validator in turn,
    /// as it may lack the chain its choice then came from). Whether it was kept.
    fn rebuild(&mut self, mut block: Block, n: &Certificate) -> bool {
        if let Some(s) = self.blocks.get(&n.digest) {
            // Held already: the journal keeps the last block handed out (the parent of the
            // next). What the chain tells of it is recorded all the same: skipped, it left a
            // hole in the leaders' history, which then started over after the restart, and
            // this validator chose leaders by round robin while its peers chose by reputation.
            let held = s.block.clone();
            if Some(n.digest) != self.anchor_digest {
                self.leaders.committed_block(&held);
            }
            return false;
        }
        let ids = event_ids(&block.events);
        let expected = block.leader;
        let others = (0..self.keys.len() as u16).map(ValidatorIndex).filter(|i| *i != expected);
        let leader = std::iter::once(expected).chain(others).find(|l| {
            block.leader = *l;
            block.digest_with_ids(&ids) == n.digest
        });
        let Some(l) = leader else { return false };
        block.leader = l;
        // What the chain tells of who led and who voted, as when it was committed.
        if Some(n.digest) != self.anchor_digest {
            self.leaders.committed_block(&block);
        }
        self.blocks.insert(n.digest, Stored::with_ids(block, ids));
        true
    }

    /// The state that must be durable before this step's outputs are sent.
    pub fn persist(&self) -> Vec<u8> {
        let from = self.tip.0;
        let p = Persisted {
            view: self.view,
            votes: self
                .views
                .range(from..)
                .map(|(v, s)| (*v, (s.my_notarize.clone(), s.my_nullify.clone(), s.my_finalize.clone())))
                .collect(),
            tip: self.tip,
            output_tick: self.output_tick,
            blocks: self.unoutput_chain_blocks(),
            // (Certificates with unchecked votes are formed again after a restart.)
            notarized: self.checked(&self.notarized, from),
            nullified: self.checked(&self.nullified, from),
            finalized: self.checked(&self.finalized, from),
        };
        postcard::to_allocvec(&p).expect("encoding into a Vec cannot fail")
    }

    pub(super) fn checked(&self, certs: &BTreeMap<View, Certificate>, from: View) -> Vec<Certificate> {
        certs.range(from..).map(|(_, c)| c).filter(|c| !self.has_unchecked(c)).cloned().collect()
    }

    pub(super) fn unoutput_chain_blocks(&self) -> Vec<Block> {
        let after = self.output_tick;
        self.blocks.values().filter(|s| after.is_none_or(|t| s.block.tick >= t)).map(|s| (*s.block).clone()).collect()
    }
}
