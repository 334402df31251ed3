//! Authenticators and lazy checks: votes counted on their MACs and their signatures checked later off the commit path, late votes, and this validator's own signatures.

use super::*;

impl Validator {
    /// This validator's own vote or proposal with an authenticator: the vote's MAC under the
    /// pairwise key of each validator, by index. Anything else as it is.
    pub fn authenticate(&self, m: Message) -> Message {
        if self.mac_keys.is_empty() || m.vote().is_none_or(|v| Some(v.signer) != self.me) {
            return m;
        }
        match Signed::from_message(m) {
            Ok(inner) => {
                let macs = inner.vote().macs(&self.genesis, &self.mac_keys);
                Message::Authenticated { inner: Box::new(inner), macs }
            }
            Err(m) => *m,
        }
    }

    /// A vote whose MAC for this validator checks is its signer's: it counts at once, and its
    /// signature is checked at `unchecked_due` (see [`Validator::check_unchecked`]).
    pub(super) fn note_authenticated(&mut self, now: Micros, vote: &Vote, macs: &[Mac]) {
        let (Some(me), Some(key)) = (self.me, self.mac_keys.get(vote.signer.0 as usize)) else { return };
        if vote.signer == me
            || self.mac_banned.contains(&vote.signer)
            || macs.len() != self.keys.len()
            || macs.get(me.0 as usize) != Some(&vote.mac(&self.genesis, key))
            || self.unchecked.len() >= UNCHECKED_MAX
        {
            return;
        }
        // A second, different vote of the signer's for the same (view, kind) is not taken on its
        // MAC: it is verified before it counts (it is evidence), and it never replaces the first
        // here, which may be in a tally already and must still have its signature checked.
        self.unchecked.entry((vote.view, vote.kind, vote.signer)).or_insert_with(|| vote.clone());
        self.unchecked_due.get_or_insert(now + self.cfg.period_us / 16);
    }

    /// Whether a vote counts: it came with a valid authenticator (its signature is checked
    /// later), or its signature verifies.
    pub(super) fn vote_ok(&self, v: &Vote) -> bool {
        self.unchecked.get(&(v.view, v.kind, v.signer)).is_some_and(|u| u == v)
            || v.verify(&self.genesis, &self.keys, &self.cfg.sig_cache)
    }

    pub(super) fn has_unchecked(&self, c: &Certificate) -> bool {
        !self.unchecked.is_empty() && c.votes.iter().any(|v| self.unchecked.contains_key(&(v.view, v.kind, v.signer)))
    }

    /// Check the signatures of the votes counted on their authenticators. A signer whose MAC
    /// was good and signature bad is Byzantine: its vote is taken out of the tallies and of the
    /// certificates that held it (each is rebuilt from the other votes, or waits for one more).
    /// Then the certificates formed meanwhile are passed on, and commits advance.
    pub(super) fn check_unchecked(&mut self, now: Micros) {
        self.unchecked_due = None;
        let votes = std::mem::take(&mut self.unchecked);
        for v in votes.into_values() {
            if !v.verify(&self.genesis, &self.keys, &self.cfg.sig_cache) {
                self.mac_banned.insert(v.signer);
                self.discard_vote(&v);
            }
        }
        for (kind, view) in std::mem::take(&mut self.provisional) {
            if let Some(c) = self.certified(kind).get(&view) {
                self.out.push_back(Output::Broadcast(Message::Certificate(c.clone())));
            }
        }
        self.advance_commits(now);
    }

    /// Take a vote with a bad signature out of its tally and out of the certificate holding it.
    pub(super) fn discard_vote(&mut self, v: &Vote) {
        let quorum = self.quorum;
        let Some(s) = self.views.get_mut(&v.view) else { return };
        if s.first.get(&(v.kind, v.signer)) == Some(v) {
            s.first.remove(&(v.kind, v.signer));
        }
        let tally = match v.kind {
            VoteKind::Notarize => s.notarize.get_mut(&v.digest),
            VoteKind::Nullify => Some(&mut s.nullify),
            VoteKind::Finalize => s.finalize.get_mut(&v.digest),
        };
        let Some(tally) = tally else { return };
        if tally.get(&v.signer) == Some(v) {
            tally.remove(&v.signer);
        }
        let rest: Vec<Vote> = tally.values().take(quorum).cloned().collect();
        let certs = self.certified_mut(v.kind);
        if certs.get(&v.view).is_some_and(|c| c.votes.contains(v)) {
            if rest.len() >= quorum {
                certs.entry(v.view).and_modify(|c| c.votes = rest);
            } else {
                // Formed again when one more vote comes (it is not "late" meanwhile). The others
                // may lack the same votes: send ours again.
                certs.remove(&v.view);
                self.repair.insert((v.kind, v.view));
                self.resend_own(v.kind, v.view);
            }
        }
    }

    /// The leader's own notarize vote, sent with its proposal, is for this block.
    pub(super) fn leader_vote_ok(&self, block: &Block, digest: Digest, vote: &Vote) -> bool {
        vote.kind == VoteKind::Notarize
            && vote.view == block.view
            && vote.digest == digest
            && vote.signer == block.leader
            && self.vote_ok(vote)
    }

    /// Whether a certificate is made of a quorum of votes this validator counted and checked
    /// (each in its tally and not waiting for its signature check: verified, or its own), which
    /// makes it valid without a signature lookup. A leader's proposal embeds the parent's
    /// notarization, usually of votes every follower counted itself; looking its three
    /// signatures up in the cache cost a follower ~20 µs of its proposal handling.
    pub(super) fn holds_checked(&self, c: &Certificate) -> bool {
        let Some(s) = self.views.get(&c.view) else { return false };
        let tally = match c.kind {
            VoteKind::Notarize => s.notarize.get(&c.digest),
            VoteKind::Nullify => Some(&s.nullify),
            VoteKind::Finalize => s.finalize.get(&c.digest),
        };
        let Some(tally) = tally else { return false };
        let mut signers = BTreeSet::new();
        c.votes.iter().all(|v| {
            v.kind == c.kind
                && v.view == c.view
                && v.digest == c.digest
                && tally.get(&v.signer) == Some(v)
                && !self.unchecked.contains_key(&(v.view, v.kind, v.signer))
                && signers.insert(v.signer)
        }) && signers.len() >= self.quorum
    }

    /// Sign a vote of this validator's; its signature is remembered as valid, so a certificate
    /// that carries it back is not verified again here.
    pub(super) fn sign(&mut self, me: ValidatorIndex, kind: VoteKind, view: View, digest: Digest) -> Vote {
        let root = self.root;
        let ahead =
            |p: &mut Vote| p.signer == me && p.kind == kind && p.view == view && p.digest == digest && p.root == root;
        if let Some(vote) = self.presigned.take_if(ahead) {
            return vote;
        }
        let vote = Vote::sign(&self.key, &self.genesis, me, kind, view, digest, self.root);
        vote.remember_valid(&self.genesis, &self.keys, &self.cfg.sig_cache);
        vote
    }

    /// The work for a view this validator voted to notarize that can be done while the others'
    /// votes are on their way (~40 µs of the ~70 a notarization took to finalize on): its
    /// finalize vote signed (the same bytes as signed later: ed25519 is deterministic, and the
    /// vote is used only if its root report is still the latest), and the leader's vote,
    /// counted on its MAC, checked (the verdict is cached: the check before finalizing finds
    /// it). Nothing is sent or decided here.
    pub(super) fn work_ahead(&mut self) {
        let Some((_, view, digest)) = self.ahead.take() else { return };
        let Some(me) = self.me else { return };
        if self.notarized.contains_key(&view) {
            return; // finalized on already (or not to be)
        }
        let leader = self.leader(view);
        if let Some(v) = self.unchecked.get(&(view, VoteKind::Notarize, leader)) {
            let _ = v.verify(&self.genesis, &self.keys, &self.cfg.sig_cache);
        }
        let s = self.views.get(&view);
        if s.is_some_and(|s| s.my_nullify.is_none() && s.my_finalize.is_none()) {
            let vote = Vote::sign(&self.key, &self.genesis, me, VoteKind::Finalize, view, digest, self.root);
            vote.remember_valid(&self.genesis, &self.keys, &self.cfg.sig_cache);
            self.presigned = Some(vote);
        }
    }

    /// A vote for a (view, kind, digest) already certified here, from a signer with no other
    /// vote of that kind in the view: it cannot change what this validator does (only its root
    /// report and a later equivocation need it), so verifying it can wait.
    pub(super) fn is_late(&self, v: &Vote) -> bool {
        self.certified(v.kind).get(&v.view).is_some_and(|c| c.digest == v.digest)
            && self
                .views
                .get(&v.view)
                .and_then(|s| s.first.get(&(v.kind, v.signer)))
                .is_none_or(|first| first.digest == v.digest)
    }

    /// Verify the late votes and take in the valid ones (root reports, evidence).
    pub(super) fn verify_late(&mut self, now: Micros) {
        self.late_due = None;
        for v in std::mem::take(&mut self.late) {
            if self.vote_ok(&v) {
                self.on_vote(now, v);
            }
        }
    }
}
