//! Dissemination and compact proposals: a leader names its batch's events by id and by runs of a peer's gossip; a follower rebuilds the batch from its pool, fetching what it lacks.

use super::*;

/// Room for the ids and events of a compact proposal, made in idle time: a follower rebuilding
/// one wrote its 1,000 ids and events into memory fresh from the allocator, and the first
/// touch of each page (a fault, the page cleared) was about half of the rebuild (~30 of ~60
/// µs at 1,000 events a tick, most of it on the commit's path). A block keeps what it is
/// given, so this is made again for every proposal.
#[derive(Debug, Default)]
pub(super) struct Spare {
    pub(super) ids: Vec<Digest>,
    pub(super) events: Vec<EventBytes>,
}

impl Spare {
    /// Room for `n` of each, every page of it written once (zeros into the unused capacity:
    /// filling the events' room with clones of one value, and dropping them, cost two atomic
    /// operations an event).
    pub(super) fn with_room(n: usize) -> Spare {
        let mut spare = Spare { ids: Vec::with_capacity(n), events: Vec::with_capacity(n) };
        touch(spare.ids.spare_capacity_mut());
        touch(spare.events.spare_capacity_mut());
        spare
    }
}

/// Write zeros over memory not yet in use, one value in each 4 KiB page, so that its pages
/// are faulted in now.
pub(super) fn touch<T>(room: &mut [std::mem::MaybeUninit<T>]) {
    let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for slot in room.iter_mut().step_by(step) {
        *slot = std::mem::MaybeUninit::zeroed();
    }
    std::hint::black_box(room);
}

/// A compact proposal waiting for events its validator's pool lacks.
#[derive(Clone, Debug)]
pub(super) struct Incomplete {
    pub(super) header: Block,
    pub(super) pieces: Vec<Piece>,
    /// The gossip batches not held, and the events named by id not pooled (piece, position),
    /// when last looked for.
    pub(super) batches: Vec<Digest>,
    pub(super) ids: Vec<(u32, u32)>,
    pub(super) vote: Vote,
    pub(super) nulls: Vec<Certificate>,
}

/// What a compact proposal's pieces give.
pub(super) enum Resolved {
    /// The events and their ids.
    Complete(Vec<Digest>, Vec<EventBytes>),
    Missing {
        batches: Vec<Digest>,
        ids: Vec<(u32, u32)>,
    },
    /// More events than a block holds, or a run beyond its batch: no vote.
    Invalid,
}

/// The batch of the next proposal of this validator, started as soon as it leads a view whose
/// parent is known and joined by each event pooled after, so that proposing takes it whole:
/// walking the pool for 1,000 events cost the commit's path 120 µs. It is taken only if the
/// parent and the uncommitted blocks before it (whose events it excludes) are still the same.
#[derive(Clone, Debug)]
pub(super) struct Prepared {
    pub(super) parent: Parent,
    /// The blocks from the parent back to the last output one, whose events are excluded.
    pub(super) ancestors: Vec<Digest>,
    pub(super) batch: Batch,
}

impl Prepared {
    /// Whether this batch is the one for `parent` with these uncommitted blocks behind it. A
    /// block committed since is left out of them (its events have left the pool), so the
    /// blocks the batch excludes need only begin with them.
    pub(super) fn fits(&self, parent: &Parent, ancestors: &[Digest]) -> bool {
        self.parent == *parent && self.ancestors.starts_with(ancestors)
    }
}

impl Validator {
    /// The ids of a block held here (the Byzantine mocks rewrite this validator's proposals).
    #[cfg(feature = "mocks")]
    pub(crate) fn block_ids(&self, digest: &Digest) -> Option<Vec<Digest>> {
        self.blocks.get(digest).map(|s| (*s.ids).clone())
    }

    /// As the leader of the current view before its proposal is due: start (or restart, if its
    /// parent changed) the batch of that proposal ([`Prepared`]). Not before the parent is
    /// finalized here (or half a period has passed): until then this validator's votes for
    /// the parent are on the commit's path, and starting a batch takes ~50-100 µs. Nor in the
    /// first eighth of the view: the others are still finalizing the parent then, and on a
    /// machine shared with one of them it held that one back.
    pub(super) fn prepare(&mut self, now: Micros) {
        let Some(parent) = self.parent_for(self.view) else { return };
        if now < self.view_started + self.cfg.period_us / 8
            || !self.finalized.contains_key(&parent.view) && now < self.view_started + self.cfg.period_us / 2
        {
            return;
        }
        // Events committed in this input must not be in it.
        self.settle();
        let (ancestors, exclude) = self.uncommitted(&parent);
        if self.prepared.as_ref().is_some_and(|p| p.fits(&parent, &ancestors)) {
            return;
        }
        let exclude: Vec<&[Digest]> = exclude.iter().map(|ids| ids.as_slice()).collect();
        let batch = self.pool.batch(self.cfg.max_batch_events, self.cfg.max_batch_bytes, &exclude);
        self.prepared = Some(Prepared { parent, ancestors, batch });
    }

    /// A proposal's events named as runs of the gossip batches they came in, where a batch is
    /// held and recent enough for the others to hold it too, and by id elsewhere.
    pub(super) fn pieces(&self, ids: &[Digest], sources: &[Option<Source>]) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        for (id, source) in ids.iter().zip(sources) {
            let run = source.and_then(|s| Some((self.pool.batches.referable(s.seq)?, s.index)));
            match (run, out.last_mut()) {
                (Some((d, i)), Some(Piece::Run { batch, start, len })) if *batch == d && *start + *len == i => {
                    *len += 1
                }
                (Some((d, i)), _) => out.push(Piece::Run { batch: d, start: i, len: 1 }),
                (None, Some(Piece::Ids(v))) => v.push(*id),
                (None, _) => out.push(Piece::Ids(vec![*id])),
            }
        }
        out
    }

    /// The notarized-but-not-yet-output blocks from `parent` back, and their events' id lists
    /// (shared, not copied into a set: that cost a leader 100 µs at 1,000 events), which a new
    /// batch must not repeat.
    pub(super) fn uncommitted(&self, parent: &Parent) -> (Vec<Digest>, Vec<std::sync::Arc<Vec<Digest>>>) {
        let (mut blocks, mut lists) = (Vec::new(), Vec::new());
        let mut d = parent.digest;
        for _ in 0..64 {
            let Some(s) = self.blocks.get(&d) else { break };
            if self.output_tick.is_some_and(|t| s.block.tick <= t) {
                break;
            }
            blocks.push(d);
            lists.push(s.ids.clone());
            d = s.block.parent.digest;
        }
        (blocks, lists)
    }

    pub(super) fn on_proposal(
        &mut self,
        now: Micros,
        from: ValidatorIndex,
        block: Block,
        vote: Vote,
        nulls: Vec<Certificate>,
    ) {
        let view = block.view;
        if from != block.leader || block.leader != self.leader(view) {
            return;
        }
        let ids = event_ids(&block.events);
        self.on_full_proposal(now, block, ids, vote, nulls);
    }

    /// A compact proposal: the block is rebuilt from the gossip batches and the pool, or
    /// fetched when an event is missing (and then taken as the proposal, in `on_fetched`).
    pub(super) fn on_proposal_pieces(
        &mut self,
        now: Micros,
        from: ValidatorIndex,
        mut block: Block,
        pieces: Vec<Piece>,
        vote: Vote,
        nulls: Vec<Certificate>,
    ) {
        let view = block.view;
        if from != block.leader || block.leader != self.leader(view) || !block.events.is_empty() {
            return;
        }
        let mut resolved = self.resolve(&pieces);
        if matches!(resolved, Resolved::Missing { .. }) && self.bulk.iter().any(|b| matches!(b, Bulk::Gossiped(_))) {
            // The missing events may be among those held back: taken in now.
            self.do_bulk(now);
            resolved = self.resolve(&pieces);
        }
        let (batches, ids) = match resolved {
            Resolved::Complete(ids, events) => {
                block.events = events;
                return self.on_full_proposal(now, block, ids, vote, nulls);
            }
            Resolved::Invalid => return,
            Resolved::Missing { batches, ids } => (batches, ids),
        };
        // The digest the leader signed; over the ids when they are all named (it is checked
        // against them once the events are in).
        let digest = match pieces.as_slice() {
            [Piece::Ids(all)] => block.header_digest(all),
            _ => vote.digest,
        };
        if let Some(known) = self.blocks.get(&digest) {
            // Fetched already (its notarization came first).
            let (block, ids) = ((*known.block).clone(), (*known.ids).clone());
            return self.on_full_proposal(now, block, ids, vote, nulls);
        }
        if view.0 > self.view.0 + FUTURE_VIEWS || view < self.tip.0 || !self.leader_vote_ok(&block, digest, &vote) {
            return;
        }
        let missing = Incomplete { header: block, pieces, batches, ids, vote, nulls };
        self.incomplete.insert(digest, missing);
        while self.incomplete.len() > INCOMPLETE_MAX {
            // Keep the newest views.
            let oldest = self.incomplete.iter().min_by_key(|(_, x)| x.header.view).map(|(d, _)| *d);
            oldest.map(|d| self.incomplete.remove(&d));
        }
        // The missing gossip is usually on its way (it left its sender before the proposal,
        // on another link): the block is asked for only if it has not come in a quarter period.
        // Then it is asked of everyone: whoever rebuilt it answers, and every future leader
        // learns to send this validator full proposals.
        self.fetching.entry(digest).or_insert(now + self.cfg.period_us / 4);
    }

    /// A compact proposal's events (and their ids), from the gossip batches held and the pool;
    /// written into the spare room when it is large enough (and it is left as it was if the
    /// proposal is not complete).
    pub(super) fn resolve(&mut self, pieces: &[Piece]) -> Resolved {
        let mut total = 0usize;
        for p in pieces {
            total = total.saturating_add(p.len());
        }
        if total > self.cfg.max_batch_events {
            return Resolved::Invalid;
        }
        let mut room = if self.spare.ids.capacity() >= total && self.spare.events.capacity() >= total {
            std::mem::take(&mut self.spare)
        } else {
            Spare { ids: Vec::with_capacity(total), events: Vec::with_capacity(total) }
        };
        let resolved = self.resolve_into(pieces, &mut room);
        if !matches!(resolved, Resolved::Complete(..)) && room.ids.capacity() > self.spare.ids.capacity() {
            room.ids.clear();
            room.events.clear();
            self.spare = room;
        }
        resolved
    }

    /// (`resolve`, writing into `room`: taken from it when complete.)
    pub(super) fn resolve_into(&self, pieces: &[Piece], room: &mut Spare) -> Resolved {
        let Spare { ids, events } = room;
        let (mut no_batch, mut no_id) = (Vec::new(), Vec::new());
        for (p, piece) in pieces.iter().enumerate() {
            match piece {
                Piece::Run { batch, start, len } => {
                    let Some(g) = self.pool.batches.get(batch) else {
                        no_batch.push(*batch);
                        continue;
                    };
                    let (from, to) = (*start as usize, *start as usize + *len as usize);
                    if to > g.ids.len() {
                        return Resolved::Invalid;
                    }
                    ids.extend_from_slice(&g.ids[from..to]);
                    // Read before shared (as below).
                    let run = &g.events[from..to];
                    std::hint::black_box(run.iter().fold(0u8, |a, e| a ^ e.first().copied().unwrap_or(0)));
                    events.extend_from_slice(run);
                }
                Piece::Ids(named) => {
                    let found: Vec<Option<&EventBytes>> = named.iter().map(|id| self.pool.get(id)).collect();
                    // Each event's first byte is read before any is shared: sharing one is an
                    // atomic increment of its count, which waits for the cache line and holds
                    // back every load behind it, so a thousand misses came one at a time.
                    std::hint::black_box(found.iter().flatten().fold(0u8, |a, e| a ^ e.first().copied().unwrap_or(0)));
                    for (i, (id, e)) in named.iter().zip(found).enumerate() {
                        match e {
                            Some(e) => {
                                ids.push(*id);
                                events.push(e.clone());
                            }
                            None => no_id.push((p as u32, i as u32)),
                        }
                    }
                }
            }
        }
        if no_batch.is_empty() && no_id.is_empty() {
            Resolved::Complete(std::mem::take(ids), std::mem::take(events))
        } else {
            Resolved::Missing { batches: no_batch, ids: no_id }
        }
    }

    /// Take up the compact proposals whose missing events have arrived. Only what was missing
    /// is looked up again: the gossip a proposal waits for usually left its leader just before
    /// it (its clients' latest events), and is taken in right after it, since proposals are
    /// handled first. Looking the whole block up at each gossip message cost a follower a
    /// second rebuild on the commit's path.
    pub(super) fn retry_incomplete(&mut self, now: Micros) {
        let pool = &self.pool;
        let complete: Vec<Digest> = self
            .incomplete
            .iter_mut()
            .filter_map(|(d, x)| {
                x.batches.retain(|b| pool.batches.get(b).is_none());
                let pieces = &x.pieces;
                x.ids.retain(|&(p, i)| match &pieces[p as usize] {
                    Piece::Ids(named) => pool.get(&named[i as usize]).is_none(),
                    Piece::Run { .. } => false,
                });
                (x.batches.is_empty() && x.ids.is_empty()).then_some(*d)
            })
            .collect();
        for d in complete {
            let Some(mut x) = self.incomplete.remove(&d) else { continue };
            match self.resolve(&x.pieces) {
                Resolved::Complete(ids, events) => {
                    self.fetching.remove(&d);
                    x.header.events = events;
                    self.on_full_proposal(now, x.header, ids, x.vote, x.nulls);
                }
                Resolved::Missing { batches, ids } => {
                    // An event left the pool meanwhile (committed in another block), or a batch
                    // was dropped: the fetch already due takes over.
                    (x.batches, x.ids) = (batches, ids);
                    self.incomplete.insert(d, x);
                }
                Resolved::Invalid => {}
            }
        }
    }
}
