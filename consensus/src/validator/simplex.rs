//! Simplex, R1–R5 (the crate docs state them): proposals, votes, certificates, views. The rest of the validator serves these rules.

use super::*;

/// Blocks not handed out yet that [`Validator::unexecuted`] walks past at most: a longer chain
/// of them counts as if they were not there (the leader proposes).
const MAX_WALK_PAST: u64 = 64;

/// What holds a validator back from proposing in the current view.
enum Hold {
    NotLeading,
    Proposed,
    /// It nullified the view (its timer fired before it could propose).
    TimedOut,
    /// A view between the parent and this one has no certificate here.
    NoCertificate,
    /// The parent's block (of this view) is not here.
    NoParent(View),
    EpochOver,
    /// Blocks handed out for execution and not executed yet, from tick `executed` on.
    Execution {
        blocks: u64,
        executed: Tick,
    },
}

impl Validator {
    /// The certificates of a kind held here, by view.
    pub(super) fn certified(&self, kind: VoteKind) -> &BTreeMap<View, Certificate> {
        match kind {
            VoteKind::Notarize => &self.notarized,
            VoteKind::Nullify => &self.nullified,
            VoteKind::Finalize => &self.finalized,
        }
    }

    pub(super) fn certified_mut(&mut self, kind: VoteKind) -> &mut BTreeMap<View, Certificate> {
        match kind {
            VoteKind::Notarize => &mut self.notarized,
            VoteKind::Nullify => &mut self.nullified,
            VoteKind::Finalize => &mut self.finalized,
        }
    }

    /// Broadcast this validator's own vote of a kind in a view again, if it cast one.
    pub(super) fn resend_own(&mut self, kind: VoteKind, view: View) {
        let Some(s) = self.views.get(&view) else { return };
        let mine = match kind {
            VoteKind::Notarize => &s.my_notarize,
            VoteKind::Nullify => &s.my_nullify,
            VoteKind::Finalize => &s.my_finalize,
        };
        if let Some(v) = mine.clone() {
            self.out.push_back(Output::Broadcast(Message::Vote(v)));
        }
    }

    /// The parent a proposal for `view` must extend: the highest notarized view below it with
    /// every view in between nullified (R1). `None` if a certificate is missing.
    pub(super) fn parent_for(&self, view: View) -> Option<Parent> {
        let mut w = view.0;
        while w > 0 {
            w -= 1;
            if w == 0 {
                return Some(Parent { view: View(0), digest: self.root_parent() });
            }
            if let Some(c) = self.notarized.get(&View(w)) {
                return Some(Parent { view: View(w), digest: c.digest });
            }
            if !self.nullified.contains_key(&View(w)) {
                return None;
            }
        }
        Some(Parent { view: View(0), digest: self.root_parent() })
    }

    pub(super) fn parent_time_tick(&self, parent: &Parent) -> Option<(u64, Tick)> {
        if parent.view == View(0) {
            return Some(match &self.cfg.anchor {
                Some(a) => (a.block.time_ms, a.block.tick.next()),
                None => (self.cfg.genesis_time_ms, Tick::ZERO),
            });
        }
        self.blocks.get(&parent.digest).map(|s| (s.block.time_ms, s.block.tick.next()))
    }

    /// When this validator, as leader of the current view, may propose.
    pub(super) fn propose_at(&self) -> Option<Micros> {
        self.propose_when().ok()
    }

    /// Why this validator, leader of the current view, has not proposed and will not yet (for
    /// an operator's `describe`); `None` when it is not the leader, has proposed, or will.
    pub(super) fn not_proposing(&self) -> Option<String> {
        Some(match self.propose_when().err()? {
            Hold::NotLeading | Hold::Proposed => return None,
            Hold::TimedOut => "the view timed out here first".into(),
            Hold::NoCertificate => "a certificate of an earlier view is missing".into(),
            Hold::NoParent(view) => format!("the parent block (view {}) is missing", view.0),
            Hold::EpochOver => "the epoch is over".into(),
            Hold::Execution { blocks, executed } => {
                format!("waits for execution ({blocks} blocks handed out from tick {executed} on, not executed)")
            }
        })
    }

    /// When this validator may propose in the current view, or what holds it back.
    fn propose_when(&self) -> Result<Micros, Hold> {
        if Some(self.leader(self.view)) != self.me {
            return Err(Hold::NotLeading);
        }
        match self.views.get(&self.view) {
            Some(s) if s.proposed => return Err(Hold::Proposed),
            Some(s) if s.my_nullify.is_some() => return Err(Hold::TimedOut),
            _ => {}
        }
        let parent = self.parent_for(self.view).ok_or(Hold::NoCertificate)?;
        let (time_ms, tick) = self.parent_time_tick(&parent).ok_or(Hold::NoParent(parent.view))?;
        if self.cfg.last_tick.is_some_and(|last| tick > last) {
            return Err(Hold::EpochOver);
        }
        if let Some(lag) = self.cfg.max_exec_lag {
            let executed = self.root.map_or(Tick::ZERO, |r| r.tick.next());
            let blocks = self.unexecuted(&parent, executed, lag);
            if blocks > lag {
                // The application's next report retries.
                return Err(Hold::Execution { blocks, executed });
            }
        }
        let after_parent = time_ms * 1_000;
        let due = self.due(tick).unwrap_or(after_parent + self.cfg.period_us);
        if self.fills(&parent) {
            // R1 fills: the parent's tick's events, a lead before the next tick is due.
            return Ok(due.saturating_sub(self.fill_lead()).max(after_parent + 1_000).max(self.view_started));
        }
        let opened = self.opened_ms(&parent, time_ms) * 1_000;
        Ok(due.max(opened + self.cfg.period_us / 2).max(self.view_started))
    }

    /// How long before a tick is due a fill proposes the tick before's events (R1 fills): the
    /// configured lead, or a round and a half if the recent notarizations took longer (the
    /// fill must be notarized by then for the next tick's block to extend it), at most half a
    /// period; 0: fills are off.
    fn fill_lead(&self) -> Micros {
        if self.cfg.fill_lead_us == 0 {
            return 0;
        }
        self.cfg.fill_lead_us.max(self.round_us * 3 / 2).min(self.cfg.period_us / 2)
    }

    /// Whether a block may fill `parent`'s tick (R1 fills): the parent is an empty block of a
    /// view (not the root an epoch starts from) and its tick is not the epoch's last. A fill
    /// carries events, so it is never filled in turn: at most two blocks a tick.
    pub(super) fn fillable(&self, parent: &Parent) -> bool {
        parent.view > View(0)
            && self
                .blocks
                .get(&parent.digest)
                .is_some_and(|s| s.block.events.is_empty() && self.cfg.last_tick != Some(s.block.tick))
    }

    /// Whether this leader fills `parent`'s tick in the current view: fills are on, the parent
    /// may be filled, and the leader has not found its pool empty in this view.
    fn fills(&self, parent: &Parent) -> bool {
        self.fill_lead() > 0 && self.no_fill != Some(self.view) && self.fillable(parent)
    }

    /// Whether this leader's block of `tick` opens the tick empty, for a fill to carry its
    /// events: fills are on, the tick is not the epoch's last (which nothing fills), and the
    /// recent notarizations came soon enough after their blocks for the block and its fill to
    /// be notarized within a period. (Across a longer round trip every block carries events,
    /// as without fills.)
    fn opens(&self, tick: Tick) -> bool {
        self.fill_lead() > 0 && self.cfg.last_tick != Some(tick) && self.round_us * 2 < self.cfg.period_us
    }

    /// The BFT time of the block that opened `parent`'s tick: the parent's own (`parent_ms`),
    /// or its parent's if the parent fills that one's tick. Half a period after it, at least,
    /// a leader proposes the next tick.
    fn opened_ms(&self, parent: &Parent, parent_ms: u64) -> u64 {
        self.blocks
            .get(&parent.digest)
            .and_then(|s| self.blocks.get(&s.block.parent.digest).filter(|g| g.block.tick == s.block.tick))
            .map_or(parent_ms, |g| g.block.time_ms)
    }

    /// A notarization of a known block came in at `now`: how long after the block's BFT time,
    /// smoothed over the recent ones (`round_us`, for `opens`).
    pub(super) fn note_round(&mut self, now: Micros, digest: &Digest) {
        if let Some(s) = self.blocks.get(digest) {
            let sample = now.saturating_sub(s.block.time_ms * 1_000).min(10 * self.cfg.period_us.max(1));
            self.round_us = self.round_us - self.round_us / 4 + sample / 4;
        }
    }

    /// The blocks from `parent` back whose ticks reach `executed` (the next tick the application
    /// executes) and were handed out, counted up to `limit + 1`: with a block a tick, the ticks
    /// execution trails. Blocks not handed out yet do not count: they wait for agreement (a
    /// block's ticks go out once a child of it commits), not for execution. Counting them let
    /// a chain of notarized blocks that were not finalized (their views also nullified, under
    /// load) hold every leader back for an execution that was itself waiting for the next
    /// block: the sim stopped for good.
    fn unexecuted(&self, parent: &Parent, executed: Tick, limit: u64) -> u64 {
        // A joining validator hands nothing out until it has the state: every block counts.
        let handed_out = |tick: Tick| self.held || self.output_tick.is_some_and(|t| tick <= t);
        let (mut n, mut walked) = (0, 0);
        let mut d = parent.digest;
        let mut counted = None;
        // The walk passes the blocks not handed out (a few) on its way; bounded all the same.
        // A tick of two blocks (R1 fills) counts once.
        while n <= limit && walked <= limit + MAX_WALK_PAST {
            match self.blocks.get(&d) {
                Some(s) if s.block.tick >= executed => {
                    if counted != Some(s.block.tick) && handed_out(s.block.tick) {
                        n += 1;
                        counted = Some(s.block.tick);
                    }
                    walked += 1;
                    d = s.block.parent.digest;
                }
                _ => break,
            }
        }
        n
    }

    /// The most ticks one block may cover (R1 spans).
    pub(super) fn max_span(&self) -> u64 {
        (self.cfg.max_span_us / self.cfg.period_us.max(1)).max(1)
    }

    /// R1 spans: a block after a parent of BFT time `parent_ms` covering ticks `first..=tick`
    /// with BFT time `time_ms` covers at least one tick, at most `max_span`, at most one more
    /// than whole periods of BFT time passed since the parent (so its empty ticks have BFT
    /// times from the parent's on), and an epoch's last tick only alone.
    pub(super) fn span_ok(&self, first: Tick, tick: Tick, parent_ms: u64, time_ms: u64) -> bool {
        if tick < first {
            return false;
        }
        let span = tick.since(first) + 1;
        span <= self.max_span()
            && span <= self.periods_between(parent_ms, time_ms) + 1
            && (self.cfg.last_tick != Some(tick) || span == 1)
    }

    /// Whole tick periods from BFT time `from_ms` to `to_ms`.
    fn periods_between(&self, from_ms: u64, to_ms: u64) -> u64 {
        to_ms.saturating_sub(from_ms).saturating_mul(1_000) / self.cfg.period_us.max(1)
    }

    /// The last tick a leader's block covers: every tick due by `now` on its schedule from
    /// `first`, within the span rules, and no more than two spans of ticks past what this
    /// validator has executed (when execution is slow, ticks come later, as with one tick a
    /// block); an epoch's last tick in a block of its own.
    pub(super) fn span_end(&self, now: Micros, first: Tick, parent_ms: u64, time_ms: u64) -> Tick {
        let max = self.max_span();
        let period = self.cfg.period_us.max(1);
        let Some(due) = self.due(first).filter(|&d| max > 1 && d <= now) else { return first };
        let mut span = ((now - due) / period + 1).min(max);
        span = span.min(self.periods_between(parent_ms, time_ms) + 1);
        if self.cfg.max_exec_lag.is_some() {
            // Two spans: the blocks in flight, not yet handed out for execution (about five
            // one-way delays), may hold one long span already (after a view that failed).
            let executed = self.root.map_or(first.saturating_sub(1), |r| r.tick);
            span = span.min((executed + 2 * max + 1).since(first)).max(1);
        }
        let end = first + (span.max(1) - 1);
        match self.cfg.last_tick {
            Some(last) if end >= last && first < last => last.saturating_sub(1),
            Some(last) if end >= last => last,
            _ => end,
        }
    }

    /// When tick `tick` is due on this validator's schedule: one period after the tick before.
    ///
    /// A leader proposes when its tick is due rather than a period after its parent's BFT time:
    /// a proposal is never sent at the very microsecond it was due (the timer, the wake-up),
    /// and counting each period from the last proposal added those delays up, tick after tick
    /// (a devnet with no load ran at 0.97 of its rate). The schedule is local (voters check
    /// only R1's bounds), follows the chain (`note_schedule`), and never asks for more than
    /// [`MAX_DEBT_PERIODS`] of lost time back, nor a proposal sooner than half a period
    /// after its parent.
    pub(super) fn due(&self, tick: Tick) -> Option<Micros> {
        let (at_tick, at) = self.schedule?;
        let period = self.cfg.period_us;
        Some(if tick >= at_tick {
            at.saturating_add(tick.since(at_tick).saturating_mul(period))
        } else {
            at.saturating_sub(at_tick.since(tick).saturating_mul(period))
        })
    }

    /// A valid block of `tick` with BFT time `time_ms`, seen at `now`: keep the schedule on the
    /// chain. A block earlier than its tick was due here (by more than the millisecond a BFT
    /// time is rounded down by) moves the schedule back to it; one later than that by more than [`MAX_DEBT_PERIODS`] moves it forward
    /// (the time lost, in a view change say, is not made up). Blocks timed ahead of this
    /// validator's clock are not followed. (With spans, "more than a span" rather than
    /// [`MAX_DEBT_PERIODS`]: the ticks a span could not cover are covered by the next.)
    pub(super) fn note_schedule(&mut self, now: Micros, tick: Tick, time_ms: u64) {
        let at = time_ms * 1_000;
        if at > now + 1_000 {
            return;
        }
        // A BFT time is in whole milliseconds, rounded down: up to 1 ms early is on time. A block
        // late by up to a span is followed: the next blocks cover the ticks it could not (an
        // epoch's end, execution behind); more is time lost.
        let behind = MAX_DEBT_PERIODS.max(self.max_span()) * self.cfg.period_us;
        match self.due(tick) {
            Some(due) if at + 1_000 > due && at <= due + behind => {}
            _ => self.schedule = Some((tick, at)),
        }
    }

    pub(super) fn try_propose(&mut self, now: Micros) {
        let Some(at) = self.propose_at() else { return };
        if now < at {
            self.prepare(now);
            return;
        }
        if !self.unchecked.is_empty() {
            // The block embeds certificates: they must verify (this is rare: the checks are due
            // long before the next proposal).
            self.check_unchecked(now);
            if self.propose_at().is_none_or(|at| now < at) {
                return;
            }
        }
        // A batch must not repeat events committed in this same input.
        self.settle();
        let view = self.view;
        let parent = self.parent_for(view).expect("propose_at checked");
        let (parent_time, first) = self.parent_time_tick(&parent).expect("propose_at checked");
        let mut time_ms = (now / 1_000).max(parent_time + 1);
        // R1 fills: the parent's tick's events, unless the next tick is due already.
        let fill = self.fills(&parent) && self.due(first).is_some_and(|due| now < due);
        let tick = if fill { Tick(first.0 - 1) } else { self.span_end(now, first, parent_time, time_ms) };
        if !fill && self.cfg.last_tick.is_some_and(|last| tick.next() >= last) {
            // Cut short by the epoch's end (its last tick comes alone): stamped when its own
            // ticks were due, not now, so the BFT time it could not cover is covered by the
            // blocks after it (their spans reach back to their parent's time).
            let span_ms = (tick.since(first) + 1).saturating_mul(self.cfg.period_us).div_ceil(1_000);
            time_ms = time_ms.min(parent_time + span_ms).max(parent_time + 1);
        }
        let (ancestors, exclude) = self.uncommitted(&parent);
        let mut batch = if !fill && self.opens(tick) {
            // Opened empty: a fill carries the tick's events (the prepared batch waits for it).
            Batch::empty()
        } else {
            match self.prepared.take() {
                Some(p) if p.fits(&parent, &ancestors) => p.batch,
                _ => {
                    let exclude: Vec<&[Digest]> = exclude.iter().map(|ids| ids.as_slice()).collect();
                    self.pool.batch(self.cfg.max_batch_events, self.cfg.max_batch_bytes, &exclude)
                }
            }
        };
        // The events pooled in the last moments wait for the next block: their gossip may not
        // have reached the others yet, who would then have to wait for it before they could
        // rebuild this compact proposal and vote (at 1,000 events a tick arriving just before
        // each proposal, every proposal did, ~0.2 ms on the commit's path).
        batch.pooled_by(now.saturating_sub(self.fresh_us()));
        if fill && batch.ids.is_empty() {
            // Nothing to fill with: the next tick's block, when due.
            self.no_fill = Some(view);
            return;
        }
        let Batch { events, ids, sources, .. } = batch;
        let Some(me) = self.me else { return };
        let mut block = Block {
            view,
            leader: me,
            parent,
            tick,
            time_ms,
            events: Vec::new(),
            parent_certificate: if parent.view > View(0) {
                self.notarized.get(&parent.view).cloned()
            } else {
                self.cfg.anchor.as_ref().map(|a| a.notarization.clone())
            },
        };
        self.note_schedule(now, tick, block.time_ms);
        let digest = block.header_digest(&ids);
        let nullifications: Vec<Certificate> =
            self.nullified.range(parent.view.next()..view).map(|(_, c)| c.clone()).collect();
        let vote = self.sign(me, VoteKind::Notarize, view, digest);
        let s = self.views.entry(view).or_default();
        s.proposed = true;
        s.proposal = Some(digest);
        s.my_notarize = Some(vote.clone());
        let header = block.clone();
        block.events = events;
        self.full_for.retain(|_, until| *until > view);
        let full = |block: &Block| Message::Propose {
            block: block.clone(),
            vote: vote.clone(),
            nullifications: nullifications.clone(),
        };
        if !self.cfg.compact_proposals {
            self.out.push_back(Output::Broadcast(full(&block)));
        } else {
            let compact = Message::ProposeRefs {
                block: header,
                pieces: self.pieces(&ids, &sources),
                vote: vote.clone(),
                nullifications: nullifications.clone(),
            };
            // To everyone (observers too), and in full to the peers that could not rebuild a
            // recent one (they take whichever comes first).
            self.out.push_back(Output::Broadcast(compact));
            for &peer in self.full_for.keys() {
                self.out.push_back(Output::Send(peer, full(&block)));
            }
        }
        self.note_events(ids.len());
        self.blocks.insert(digest, Stored::with_ids(block, ids));
        self.on_vote(now, vote);
        self.ahead = Some((now, view, digest));
    }

    /// A proposal with its events (`ids[i]` is the id of `block.events[i]`).
    pub(super) fn on_full_proposal(
        &mut self,
        now: Micros,
        block: Block,
        ids: Vec<Digest>,
        vote: Vote,
        nulls: Vec<Certificate>,
    ) {
        let view = block.view;
        let digest = block.digest_with_ids(&ids);
        if !self.leader_vote_ok(&block, digest, &vote) {
            return;
        }
        for c in nulls {
            self.on_certificate(now, c);
        }
        if view > self.view {
            if view.0 <= self.view.0 + FUTURE_VIEWS {
                self.buffered.insert(view, (block, vote, Vec::new()));
            }
            return;
        }
        let stored = Stored::with_ids(block, ids);
        match self.check_block_ids(now, &stored.block, &stored.ids) {
            Ok(()) => {}
            Err(ProposalError::UnknownParent) => {
                self.fetch(now, stored.block.parent.digest);
                self.buffered.insert(view, ((*stored.block).clone(), vote, Vec::new()));
                return;
            }
            Err(_) => return,
        }
        // The schedule follows the chain: a block of a view the finalized tip has passed counts
        // only if it is that view's finalized block. (A validator restarted after a long stop
        // proposes in the view it stopped in, stamped now: followed, that stale block moved the
        // schedule forward by the whole stop, and every leader waited that long.)
        if view > self.tip.0 || self.finalized.get(&view).is_some_and(|c| c.digest == digest) {
            self.note_schedule(now, stored.block.tick, stored.block.time_ms);
        }
        self.note_events(stored.ids.len());
        self.blocks.insert(digest, stored);
        if view <= self.tip.0 {
            // Finalized before its proposal arrived: it may be the block a commit waits for.
            self.advance_commits(now);
        }
        let s = self.views.entry(view).or_default();
        match s.proposal {
            Some(d) if d != digest => return, // the leader equivocated; its votes are evidence
            _ => s.proposal = Some(digest),
        }
        // R2: notarize the first valid proposal of the current view, unless it timed out.
        if let Some(me) = self.me
            && view == self.view
            && s.my_notarize.is_none()
            && s.my_nullify.is_none()
        {
            let mine = self.sign(me, VoteKind::Notarize, view, digest);
            let s = self.views.entry(view).or_default();
            s.my_notarize = Some(mine.clone());
            self.out.push_back(Output::Broadcast(Message::Vote(mine.clone())));
            self.on_vote(now, mine);
            self.ahead = Some((now, view, digest));
        }
        self.on_vote(now, vote);
    }

    /// R1: the block extends a notarized parent over nullified views, with a span of ticks, a
    /// bounded BFT time and a bounded batch.
    pub fn check_block(&self, now: Micros, b: &Block) -> Result<(), ProposalError> {
        let ids = event_ids(&b.events);
        self.check_block_ids(now, b, &ids)
    }

    pub(super) fn check_block_ids(&self, now: Micros, b: &Block, ids: &[Digest]) -> Result<(), ProposalError> {
        let p = b.parent;
        if p.view >= b.view {
            return Err(ProposalError::BadParent);
        }
        if let Some(last) = self.cfg.last_tick
            && b.tick > last
        {
            return Err(ProposalError::BeyondEpoch(b.tick));
        }
        if p.view == View(0) {
            if p.digest != self.root_parent() {
                return Err(ProposalError::BadParent);
            }
            let ok = match (&self.cfg.anchor, &b.parent_certificate) {
                (None, None) => true,
                // An epoch's first block carries a notarization of the anchor by the previous set.
                (Some(a), Some(c)) => {
                    let prev: Vec<VerifyingKey> =
                        a.prev_keys.iter().filter_map(|k| VerifyingKey::from_bytes(k).ok()).collect();
                    let quorum = 2 * (prev.len().saturating_sub(1) / 3) + 1;
                    c.kind == VoteKind::Notarize
                        && c.digest == p.digest
                        && prev.len() == a.prev_keys.len()
                        && c.verify(&a.prev_chain, &prev, quorum, &self.cfg.sig_cache).is_ok()
                }
                _ => false,
            };
            if !ok {
                return Err(ProposalError::BadParent);
            }
        } else {
            let cert_ok = match &b.parent_certificate {
                Some(c) => {
                    c.kind == VoteKind::Notarize
                        && c.view == p.view
                        && c.digest == p.digest
                        && (self.holds_checked(c)
                            || c.verify(&self.genesis, &self.keys, self.quorum, &self.cfg.sig_cache).is_ok())
                }
                None => false,
            };
            if !cert_ok {
                return Err(ProposalError::BadParent);
            }
        }
        if (p.view.0 + 1..b.view.0).any(|w| !self.nullified.contains_key(&View(w))) {
            return Err(ProposalError::BadParent);
        }
        let Some((parent_time, tick)) = self.parent_time_tick(&p) else {
            return Err(ProposalError::UnknownParent);
        };
        let now_ms = now / 1_000;
        if b.time_ms <= parent_time || b.time_ms > now_ms + self.cfg.max_drift_ms {
            return Err(ProposalError::BadTime { got: b.time_ms, parent: parent_time, now: now_ms });
        }
        let fill = b.tick.next() == tick;
        let ok = if fill {
            self.fillable(&p) && !b.events.is_empty()
        } else {
            self.span_ok(tick, b.tick, parent_time, b.time_ms)
        };
        if !ok {
            return Err(ProposalError::BadTick { expected: tick, got: b.tick });
        }
        let bytes: usize = b.events.iter().map(|e| e.len()).sum();
        if b.events.len() > self.cfg.max_batch_events
            || bytes > self.cfg.max_batch_bytes
            || ids.len() != b.events.len()
            || !all_distinct(ids)
            || b.events.iter().any(|e| e.len() > self.cfg.max_event_bytes)
        {
            return Err(ProposalError::BadBatch);
        }
        Ok(())
    }

    pub(super) fn on_vote(&mut self, now: Micros, vote: Vote) {
        let view = vote.view;
        if view.0 > self.view.0 + FUTURE_VIEWS || view < self.tip.0 {
            return;
        }
        if let Some(r) = vote.root {
            self.note_root(vote.signer, r);
        }
        if self.conflicts(&vote) {
            return;
        }
        let (kind, digest) = (vote.kind, vote.digest);
        if kind == VoteKind::Notarize
            && view == self.view
            && self.views.get(&view).is_none_or(|s| s.proposal.is_none() && s.my_nullify.is_none())
            && !self.incomplete.contains_key(&digest)
        {
            // A vote for a proposal of this view that has not come here: it may have been lost
            // on the way. Asked for if it has not come in a quarter period (the answer carries
            // the leader's vote, and the block is then taken as the proposal: `on_fetched`). On a
            // lossy network a view whose proposal one honest validator missed otherwise timed
            // out whenever every honest vote was needed (the seed sweeps' schedules with f
            // Byzantine validators and 10-15 % loss, after heal).
            self.fetch_soon(now, digest);
        }
        let tally = self.views.entry(view).or_default().tally_mut(kind, digest);
        tally.insert(vote.signer, vote);
        if tally.len() >= self.quorum {
            let cert = Certificate { kind, view, digest, votes: tally.values().take(self.quorum).cloned().collect() };
            self.on_certified(now, cert);
        }
    }

    /// Remember a signer's first vote of each kind in a view; a second, different one is
    /// evidence of equivocation (reported, and not counted).
    pub(super) fn conflicts(&mut self, vote: &Vote) -> bool {
        let s = self.views.entry(vote.view).or_default();
        match s.first.get(&(vote.kind, vote.signer)) {
            Some(first) if first.digest != vote.digest => {
                let e = Evidence { first: first.clone(), second: vote.clone() };
                self.out.push_back(Output::Evidence(Box::new(e)));
                true
            }
            Some(_) => false,
            None => {
                s.first.insert((vote.kind, vote.signer), vote.clone());
                false
            }
        }
    }

    pub(super) fn on_certificate(&mut self, now: Micros, c: Certificate) {
        let known = self.certified(c.kind).contains_key(&c.view);
        if c.view.0 > self.view.0 + FUTURE_VIEWS || c.view < self.tip.0 {
            return;
        }
        if known {
            // Already certified here: only a vote that contradicts one we hold needs checking,
            // as evidence (a leader's other proposal shows up this way).
            for v in &c.votes {
                let differs = self
                    .views
                    .get(&v.view)
                    .and_then(|s| s.first.get(&(v.kind, v.signer)))
                    .is_some_and(|first| first.digest != v.digest);
                if differs && v.verify(&self.genesis, &self.keys, &self.cfg.sig_cache) {
                    let _ = self.conflicts(v);
                }
            }
            return;
        }
        let c = self.with_own_vote(c);
        if !self.holds_checked(&c) && c.verify(&self.genesis, &self.keys, self.quorum, &self.cfg.sig_cache).is_err() {
            return;
        }
        for v in &c.votes {
            let _ = self.conflicts(v);
        }
        self.on_certified(now, c);
    }

    /// A certificate without this validator's vote, when it cast the same one: its own vote
    /// takes the place of one of the others, one signature fewer to check (a validator behind
    /// its peers gets their certificate before it has its own quorum, and checked all three
    /// signatures of it).
    pub(super) fn with_own_vote(&self, mut c: Certificate) -> Certificate {
        let Some(me) = self.me else { return c };
        let Some(s) = self.views.get(&c.view) else { return c };
        let mine = match c.kind {
            VoteKind::Notarize => &s.my_notarize,
            VoteKind::Nullify => &s.my_nullify,
            VoteKind::Finalize => &s.my_finalize,
        };
        let Some(mine) = mine.as_ref().filter(|v| v.digest == c.digest) else { return c };
        if c.votes.iter().any(|v| v.signer == me) || c.votes.len() < self.quorum {
            return c;
        }
        c.votes.truncate(self.quorum - 1);
        c.votes.insert(0, mine.clone());
        c
    }

    /// A certificate is new and valid: record it, pass it on, and act (R3–R5).
    pub(super) fn on_certified(&mut self, now: Micros, c: Certificate) {
        let view = c.view;
        match c.kind {
            VoteKind::Notarize => {
                if self.notarized.contains_key(&view) {
                    return;
                }
                self.notarized.insert(view, c.clone());
                self.pass_on(&c);
                if self.has_unchecked(&c) {
                    // R3 finalizes on a notarization, and a validator that finalized a view never
                    // nullifies it: on one counted on a forged vote's MAC, the view could then be
                    // neither notarized (the forger withholds a good vote, an honest validator
                    // refused its proposal) nor nullified, and no later view could be built on
                    // (found by the seed sweep, seed 1001817). So its signatures are checked now.
                    self.check_unchecked(now);
                    if self.notarized.get(&view).is_none_or(|n| n.digest != c.digest) {
                        return; // it fell apart: formed again when a good vote comes
                    }
                }
                if !self.blocks.contains_key(&c.digest) {
                    self.fetch_soon(now, c.digest);
                }
                self.note_round(now, &c.digest);
                // R3: seeing the notarization, finalize unless this view timed out, and move on.
                let s = self.views.entry(view).or_default();
                // (Safe for any view: finalize and nullify quorums would meet in an honest
                // validator that did both, which never happens.)
                if let Some(me) = self.me
                    && s.my_nullify.is_none()
                    && s.my_finalize.is_none()
                {
                    let fin = self.sign(me, VoteKind::Finalize, view, c.digest);
                    let s = self.views.entry(view).or_default();
                    s.my_finalize = Some(fin.clone());
                    self.out.push_back(Output::Broadcast(Message::Vote(fin.clone())));
                    self.on_vote(now, fin);
                }
                self.enter_view(now, view.next());
            }
            VoteKind::Nullify => {
                if self.nullified.contains_key(&view) {
                    return;
                }
                self.nullified.insert(view, c.clone());
                self.pass_on(&c);
                // More than f views in a row without a finalization: not only faulty leaders'.
                if view.0.saturating_sub(self.tip.0.0) > self.f() as u64 && self.patience < MAX_PATIENCE {
                    self.patience += 1;
                    self.calm = 0;
                }
                self.enter_view(now, view.next());
            }
            VoteKind::Finalize => {
                if self.finalized.contains_key(&view) {
                    return;
                }
                self.finalized.insert(view, c.clone());
                self.finalized_at = now;
                self.out.push_back(Output::Finalized { view, digest: c.digest });
                self.pass_on(&c);
                if view > self.tip.0 {
                    self.tip = (view, c.digest);
                    self.calm += 1;
                    if self.calm >= CALM_VIEWS && self.patience > 0 {
                        self.patience -= 1;
                        self.calm = 0;
                    }
                }
                if !self.blocks.contains_key(&c.digest) {
                    self.fetch_soon(now, c.digest);
                }
                self.enter_view(now, view.next());
                self.advance_commits(now);
            }
        }
    }

    /// Pass a new certificate on to the others, or, if it holds votes whose signatures are
    /// not checked yet, once they are (a certificate that leaves is always verifiable).
    pub(super) fn pass_on(&mut self, c: &Certificate) {
        if self.has_unchecked(c) {
            self.provisional.push((c.kind, c.view));
        } else {
            self.out.push_back(Output::Broadcast(Message::Certificate(c.clone())));
        }
    }

    pub(super) fn enter_view(&mut self, now: Micros, view: View) {
        if view <= self.view {
            return;
        }
        self.view = view;
        self.view_started = now;
        self.last_retry = now;
        self.leaders.fix(view);
        if let Some((b, v, n)) = self.buffered.remove(&view) {
            self.on_proposal(now, b.leader, b, v, n);
        }
        self.buffered.retain(|w, _| *w > view);
        self.try_propose(now);
    }
}
