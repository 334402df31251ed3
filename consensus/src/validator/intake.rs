//! Events in: submitted and gossiped events pooled or held while a view is in flight, and the bulk work (pool upkeep, pruning) scheduled off the commit path.

use super::*;

impl Validator {
    /// Take the client events still waiting in the pool (an epoch hands them to the next).
    pub fn drain_pool(&mut self) -> Vec<EventBytes> {
        self.settle();
        for b in std::mem::take(&mut self.bulk) {
            let (Bulk::Gossiped(events) | Bulk::Submitted(events)) = b;
            self.pool_events(0, events, true);
        }
        (self.bulk_due, self.bulk_events) = (None, 0);
        self.pool.take(usize::MAX, usize::MAX, &[])
    }

    /// A client event for the pool; disseminated to the other validators when new.
    pub fn submit_event(&mut self, now: Micros, event: impl Into<EventBytes>) {
        self.submit_events(now, vec![event]);
    }

    /// Client events for the pool, disseminated together (one message) to the others.
    pub fn submit_events<E: Into<EventBytes>>(&mut self, now: Micros, events: Vec<E>) {
        self.bulk_if_due(now);
        let events = events.into_iter().map(Into::into).collect();
        if self.holding() {
            self.hold(now, Bulk::Submitted(events));
        } else {
            self.submitted(now, events);
        }
        self.schedule_bulk(now);
        self.try_propose(now);
    }

    /// Pool clients' events and pass the new ones on to the other validators.
    pub(super) fn submitted(&mut self, now: Micros, mut events: Vec<EventBytes>) {
        // A message carries at most a batch's worth (the others cut longer ones short, and
        // each message is a gossip batch, named as it came).
        while !events.is_empty() {
            let rest = events.split_off(events.len().min(self.cfg.max_batch_events));
            let new = self.pool_events(now, events, false);
            if !new.is_empty() {
                self.out.push_back(Output::Broadcast(Message::Events(new)));
                if !self.incomplete.is_empty() {
                    self.retry_incomplete(now);
                }
            }
            events = rest;
        }
        self.make_room();
    }

    /// Pool peers' gossiped events.
    pub(super) fn gossiped(&mut self, now: Micros, events: Vec<EventBytes>) {
        self.pool_events(now, events, true);
        if !self.incomplete.is_empty() {
            self.retry_incomplete(now);
        }
        self.make_room();
    }

    /// Make the spare room for the next proposal's ids and events, if it is missing or too
    /// small for the recent blocks (with an eighth to spare). Done where events are pooled:
    /// off the commit's path, and whenever there are events to propose.
    pub(super) fn make_room(&mut self) {
        let n = (self.recent_events + self.recent_events / 8).min(self.cfg.max_batch_events);
        if n > 0 && self.spare.ids.capacity() < n {
            self.spare = Spare::with_room(n);
        }
    }

    /// A block of `n` events was taken in: about how many the recent blocks held (the largest
    /// lately, forgotten by an eighth a block).
    pub(super) fn note_events(&mut self, n: usize) {
        self.recent_events = n.max(self.recent_events - self.recent_events / 8);
    }

    /// Whether a view of this validator's is in flight: it voted to notarize it (or proposed
    /// it), did not nullify it, and no finalization has reached it yet. Until one does, its
    /// votes are on the commit's path, and the bulk work of taking in client events (hashing
    /// a thousand, looking each up in the tables of committed ids) and of forgetting the
    /// committed ones waits: done in the middle of a view, it held back this validator's next
    /// vote, or, on a shared core, another validator's (`bench agreement`: ~0.3 ms a tick
    /// each). It waits at most `Validator::max_hold`.
    pub fn busy(&self) -> bool {
        self.me.is_some()
            && self.views.range(self.tip.0.next()..).any(|(_, s)| s.my_notarize.is_some() && s.my_nullify.is_none())
    }

    /// Whether new bulk work waits: a view is in flight, or work held before it is not done
    /// (events are pooled in the order they came).
    pub(super) fn holding(&self) -> bool {
        !self.bulk.is_empty() || self.busy()
    }

    /// How long an event must have been pooled before this validator proposes it: a
    /// sixteenth of a period (1 ms at 60 Hz), time for its gossip to reach the others. Only
    /// for compact proposals (a full proposal carries the events).
    pub(super) fn fresh_us(&self) -> Micros {
        if self.cfg.compact_proposals { self.cfg.period_us / 16 } else { 0 }
    }

    /// The longest bulk work is held back: an eighth of a tick period (2 ms at 60 Hz), far
    /// below the period after which the events held are proposed.
    pub(super) fn max_hold(&self) -> Micros {
        self.cfg.period_us / 8
    }

    /// How long after learning of a finalization the held bulk work waits: a thirty-second of
    /// a period (~0.5 ms at 60 Hz). The first validators to learn of it would otherwise start
    /// on their bulk work (~0.4 ms at 1,000 events a tick) while the others still wait for
    /// its last votes, and a validator sharing their core waited behind it (`bench
    /// agreement`, 4 validators on 2 cores: p99 0.78-0.88 ms with it, 1.05-1.10 ms without).
    pub(super) fn after_final(&self) -> Micros {
        self.cfg.period_us / 32
    }

    /// After an input: when the held bulk work is due. While a view is in flight, at most
    /// [`Validator::max_hold`] after it was first held; otherwise now (at the next input or
    /// timer: after this input's outputs have gone out), but not before
    /// [`Validator::after_final`] has passed since the last finalization.
    pub(super) fn schedule_bulk(&mut self, now: Micros) {
        if self.bulk.is_empty() && self.settle_later.is_empty() {
            self.bulk_due = None;
            return;
        }
        let at = if self.busy() {
            now + self.max_hold()
        } else {
            now.max(self.finalized_at.saturating_add(self.after_final()))
        };
        self.bulk_due = Some(self.bulk_due.map_or(at, |due| due.min(at)));
    }

    /// Hold back events, unless more are held than the pool takes: then the pool takes them
    /// now (it bounds what a validator keeps, whoever sends it events).
    pub(super) fn hold(&mut self, now: Micros, b: Bulk) {
        let (Bulk::Gossiped(events) | Bulk::Submitted(events)) = &b;
        self.bulk_events += events.len();
        self.bulk.push(b);
        if self.bulk_events > self.cfg.max_pool_events {
            self.do_bulk(now);
        }
    }

    /// Before an input: do the held bulk work if it is due.
    pub(super) fn bulk_if_due(&mut self, now: Micros) {
        if self.bulk_due.is_some_and(|due| now >= due) {
            self.do_bulk(now);
        }
    }

    /// The held bulk work: the pool forgets the committed events, then takes the held ones in
    /// the order they came.
    pub(super) fn do_bulk(&mut self, now: Micros) {
        self.bulk_due = None;
        self.bulk_events = 0;
        self.settle();
        for b in std::mem::take(&mut self.bulk) {
            match b {
                Bulk::Gossiped(events) => self.gossiped(now, events),
                Bulk::Submitted(events) => self.submitted(now, events),
            }
        }
    }

    /// Add client events to the pool (and to the prepared batch), in their order; the new ones.
    /// `gossip`: a peer's batch, kept whole; else this validator's clients' events, of which the
    /// new ones are the batch it sends.
    pub(super) fn pool_events(&mut self, now: Micros, mut events: Vec<EventBytes>, gossip: bool) -> Vec<EventBytes> {
        let max = self.cfg.max_event_bytes;
        events.retain(|e| e.len() <= max);
        let ids = if gossip {
            self.pool.insert_gossip(&events, self.cfg.max_pool_events, now)
        } else {
            self.pool.insert_submitted(&events, self.cfg.max_pool_events, now)
        };
        let mut new = Vec::with_capacity(events.len());
        for (e, id) in events.into_iter().zip(ids) {
            let Some((id, source)) = id else { continue };
            if let Some(p) = &mut self.prepared {
                p.batch.offer(&id, &e, now, source);
            }
            new.push(e);
        }
        new
    }
}
