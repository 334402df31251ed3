//! The block store and fetches: missing blocks asked for and taken, commits advanced in order, old blocks pruned within the budget.

use super::*;

/// A known block with what is derived from it once: shared, never copied per use.
#[derive(Clone, Debug)]
pub(super) struct Stored {
    pub(super) block: std::sync::Arc<Block>,
    pub(super) ids: std::sync::Arc<Vec<Digest>>,
    /// What holding it costs, about: its events' bytes, 64 for each event (its id, its pointer and
    /// the pointer's count) and 512 for the header and certificate.
    pub(super) bytes: u64,
}

impl Stored {
    /// `ids[i]` is `event_id(&block.events[i])`.
    pub(super) fn with_ids(block: Block, ids: Vec<Digest>) -> Stored {
        let bytes = block.events.iter().map(|e| e.len() as u64 + 64).sum::<u64>() + 512;
        Stored { block: std::sync::Arc::new(block), ids: std::sync::Arc::new(ids), bytes }
    }
}

/// The known blocks by digest (read through `Deref`), and by tick, so dropping the ones
/// below a tick costs what is dropped. (Pruning by scanning every block read each block's
/// tick behind its `Arc`: 2,048 scattered reads per commit once `keep_blocks` were held.)
#[derive(Debug, Default)]
pub(super) struct Blocks {
    pub(super) by_digest: BTreeMap<Digest, Stored>,
    pub(super) by_tick: BTreeSet<(Tick, Digest)>,
    /// The sum of the blocks' `Stored::bytes`.
    pub(super) bytes: u64,
}

impl std::ops::Deref for Blocks {
    type Target = BTreeMap<Digest, Stored>;

    fn deref(&self) -> &Self::Target {
        &self.by_digest
    }
}

impl Blocks {
    /// (A digest covers its block's tick, so a digest inserted again keeps its index entry.)
    pub(super) fn insert(&mut self, digest: Digest, stored: Stored) {
        self.by_tick.insert((stored.block.tick, digest));
        self.bytes += stored.bytes;
        if let Some(old) = self.by_digest.insert(digest, stored) {
            self.bytes -= old.bytes;
        }
    }

    /// The highest tick of a known block.
    pub(super) fn newest_tick(&self) -> Option<Tick> {
        self.by_tick.last().map(|(t, _)| *t)
    }

    /// Forget the blocks of ticks below `tick`.
    pub(super) fn prune_below(&mut self, tick: Tick) {
        let kept = self.by_tick.split_off(&(tick, Digest::default()));
        for (_, d) in std::mem::replace(&mut self.by_tick, kept) {
            self.remove(&d);
        }
    }

    /// Forget the oldest blocks, of ticks below `below` only, while they hold more than
    /// `budget` bytes.
    pub(super) fn prune_to_budget(&mut self, budget: u64, below: Tick) {
        while self.bytes > budget
            && let Some(&(tick, d)) = self.by_tick.first()
            && tick < below
        {
            self.by_tick.pop_first();
            self.remove(&d);
        }
    }

    pub(super) fn remove(&mut self, digest: &Digest) {
        if let Some(old) = self.by_digest.remove(digest) {
            self.bytes -= old.bytes;
        }
    }
}

impl Validator {
    /// A block neither known, nor asked for, nor the root.
    pub(super) fn wanted(&self, d: &Digest) -> bool {
        *d != self.genesis && *d != self.root_parent() && !self.blocks.contains_key(d) && !self.fetching.contains_key(d)
    }

    pub(super) fn fetch(&mut self, now: Micros, d: Digest) {
        if !self.wanted(&d) {
            return;
        }
        self.fetching.insert(d, now + self.cfg.retry_us);
        self.out.push_back(Output::Broadcast(Message::Fetch(d)));
    }

    /// Ask for a block certified here before its proposal arrived, unless the proposal comes
    /// within a quarter period: the leader's proposal is sent before anyone votes for it, but
    /// a big one can arrive after the votes, and asking at once would send it twice.
    pub(super) fn fetch_soon(&mut self, now: Micros, d: Digest) {
        if !self.wanted(&d) {
            return;
        }
        self.fetching.insert(d, now + self.cfg.period_us / 4);
    }

    pub(super) fn on_fetched(
        &mut self,
        now: Micros,
        block: Block,
        notarization: Option<Certificate>,
        leader_vote: Option<Box<Vote>>,
    ) {
        let ids = event_ids(&block.events);
        let d = block.digest_with_ids(&ids);

        if self.fetching.remove(&d).is_none() {
            return; // unsolicited
        }
        if let Some(c) = notarization {
            self.on_certificate(now, c);
        }
        if block.parent.view != View(0) && d != self.root_parent() && !self.blocks.contains_key(&block.parent.digest) {
            self.fetch(now, block.parent.digest);
        }
        let stored = Stored::with_ids(block, ids);
        self.blocks.insert(d, stored.clone());
        let leader = stored.block.leader;
        if let Some(Incomplete { vote, nulls, .. }) = self.incomplete.remove(&d) {
            // The block of a compact proposal this validator could not rebuild.
            self.on_proposal(now, leader, (*stored.block).clone(), vote, nulls);
        } else if let Some(vote) = leader_vote
            .filter(|v| v.kind == VoteKind::Notarize && v.view == self.view && v.digest == d && v.signer == leader)
            && self.views.get(&self.view).is_none_or(|s| s.proposal.is_none())
        {
            // A proposal of the current view whose copy to this validator was lost (others'
            // votes for it named it, see `on_vote`): taken as it came, with its leader's vote.
            self.on_proposal(now, leader, (*stored.block).clone(), *vote, Vec::new());
        }
        if let Some((view, _)) =
            self.buffered.iter().find(|(_, (b, _, _))| b.parent.digest == d).map(|(v, x)| (*v, x.0.view))
            && view == self.view
            && let Some((b, v, n)) = self.buffered.remove(&view)
        {
            self.on_proposal(now, b.leader, b, v, n);
        }
        self.advance_commits(now);
    }

    /// Output every block whose committed child is known, in tick order (R5). A block is
    /// committed when it or a descendant is finalized; its seed comes from the certificate
    /// its child embeds, so the newest finalized block waits for its child.
    pub(super) fn advance_commits(&mut self, now: Micros) {
        if self.held {
            self.prune();
            return;
        }
        let (tip_view, tip) = self.tip;
        if tip_view == View(0) {
            return;
        }
        let Some(fin) = self.finalized.get(&tip_view).cloned() else { return };
        if self.has_unchecked(&fin) {
            // Committed once its votes' signatures are checked (`check_unchecked`).
            return;
        }
        // Walk back from the tip to the last output block, collecting the chain.
        let mut chain = Vec::new();
        let mut d = tip;
        loop {
            let Some(s) = self.blocks.get(&d) else {
                self.fetch(now, d);
                return;
            };
            if self.output_tick.is_some_and(|t| s.block.tick <= t) {
                break;
            }
            chain.push((d, s.clone()));
            let anchored = self.cfg.anchor.is_some();
            if (anchored && d == self.root_parent()) || (!anchored && s.block.parent.view == View(0)) {
                break;
            }
            d = s.block.parent.digest;
        }
        chain.reverse();
        let mut opener = None;
        for pair in chain.windows(2) {
            let ((digest, stored), (_, child)) = (&pair[0], &pair[1]);
            let Some(certificate) = child.block.parent_certificate.clone() else { return };
            let block = &stored.block;
            // The pool forgets these events with the held bulk work: at the next input, or
            // once the view in flight is finalized (see `schedule_bulk`).
            self.settle_later.push((block.tick, *digest, stored.ids.clone()));
            if child.block.tick == block.tick {
                // An empty block its child fills (R1 fills): the tick goes out once, as the
                // fill's, with the fill's seed (the fill's digest covers this block's).
                if Some(*digest) != self.anchor_digest {
                    self.leaders.committed_block(block);
                }
                opener = Some((Opener { time_ms: block.time_ms, notarization: certificate }, block.clone()));
                continue;
            }
            let seed = seed_of(digest, &certificate);
            // The empty ticks of the block's span first (R1 spans), each with a BFT time one
            // period after the one before, ending at the block's.
            // (A filled tick's span is its opener's: the empty ticks carry the opener's header.)
            let head = opener.as_ref().map_or(block, |(_, b)| b);
            let first = self.output_tick.map_or(0, |t| t.0 + 1);
            for tick in (first..block.tick.0).map(Tick) {
                let before_us = block.tick.since(tick).saturating_mul(self.cfg.period_us);
                let filler = Block {
                    view: head.view,
                    leader: head.leader,
                    parent: head.parent,
                    tick,
                    time_ms: block.time_ms.saturating_sub(before_us / 1_000),
                    events: Vec::new(),
                    parent_certificate: None,
                };
                self.out.push_back(Output::Committed(Box::new(Commit {
                    block: filler,
                    filler: true,
                    digest: *digest,
                    certificate: certificate.clone(),
                    seed: span_seed(&seed, tick),
                    finalization: fin.clone(),
                    opener: None,
                })));
            }
            self.output_tick = Some(block.tick);
            if Some(*digest) != self.anchor_digest {
                self.leaders.committed_block(block);
            }
            self.out.push_back(Output::Committed(Box::new(Commit {
                block: (**block).clone(),
                filler: false,
                digest: *digest,
                certificate,
                seed,
                finalization: fin.clone(),
                opener: opener.take().map(|(o, _)| o),
            })));
        }
        if chain.is_empty() {
            self.prune();
        }
        // Otherwise pruned with the held bulk work (`settle`): once `keep_bytes` are held, each
        // commit drops the oldest block and frees its thousand events, cold in memory, and in
        // the input that finalized that cost ~13 µs on average and stalls of milliseconds
        // (`bench agreement` at 1,000 events a tick, from ~26 s into a run: steady-state p50
        // 0.56-0.59 ms and p99 2.6-2.7 ms with it there, 0.48-0.50 and 0.88-1.10 without).
    }

    /// Let the pool forget the events of blocks committed since the last input, and drop the
    /// blocks beyond what is kept (see `advance_commits`). Whoever settles prunes: with the
    /// held bulk work, or a leader's batch that must leave out what was just committed.
    pub(super) fn settle(&mut self) {
        let committed = !self.settle_later.is_empty();
        for (tick, digest, ids) in std::mem::take(&mut self.settle_later) {
            if self.prepared.as_ref().is_some_and(|p| !p.ancestors.contains(&digest)) {
                // Committed off the prepared batch's chain (or a block it did not know of):
                // the batch may hold these events.
                self.prepared = None;
            }
            self.pool.committed(tick, &ids, self.cfg.dedup_window_ticks);
        }
        if committed {
            self.prune();
        }
    }

    pub(super) fn prune(&mut self) {
        // (A joining node that outputs nothing yet keeps the newest blocks only.)
        let newest = || self.held.then(|| self.blocks.newest_tick()).flatten();
        let Some(out) = self.output_tick.or_else(newest) else { return };
        let keep_from = out.saturating_sub(self.cfg.keep_blocks);
        self.blocks.prune_below(keep_from);
        self.blocks.prune_to_budget(self.cfg.keep_bytes, out.saturating_sub(self.cfg.keep_blocks_min));
        let tip_view = self.tip.0;
        let horizon = View(tip_view.0.saturating_sub(64));
        self.views.retain(|v, _| *v >= horizon);
        self.notarized.retain(|v, _| *v >= horizon);
        self.nullified.retain(|v, _| *v >= horizon);
        self.finalized.retain(|v, _| *v >= horizon);
        self.incomplete.retain(|_, x| x.header.view >= horizon);
    }
}
