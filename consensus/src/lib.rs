//! Per-tick BFT agreement for a sim: Simplex (Chan & Pass, 2023), sans-IO.
//!
//! `n = 3f + 1` validators with ed25519 keys; quorum `q = 2f + 1`. Time is divided into
//! **views**; view `v` has leader `v mod n`. Each block carries one batch of events for its
//! tick, and covers a **span** of ticks: those after its parent's up to its own, the ones
//! before its own empty. Rules (cited in the code as `R1`…):
//!
//! - **R1 (valid proposal).** A block for view `v` extends a parent at view `p < v` that is
//!   genesis or notarized (the block embeds the parent's notarization), every view in `(p, v)`
//!   is nullified, its BFT time is above the parent's and at most `max_drift` ahead of the
//!   voter's clock, its batch is within limits, and its tick follows the parent's within a
//!   span: at least one tick, at most `max_span_us` of them (one with the default), at most one
//!   more than the whole periods of BFT time since the parent, and an epoch's last tick only
//!   alone. So ticks are not bound to agreement rounds: a round trip longer than a period, or a
//!   view lost to a dead leader, makes the next block cover the ticks due meanwhile, and the
//!   sim keeps its rate on agreed time whatever the latency. A leader covers the ticks due on
//!   its schedule (below), and no more than `max_span_us` of ticks past what its application
//!   executed (when execution is what is slow, ticks come later: time dilation). A block cut
//!   short by its epoch's end is stamped when its ticks were due rather than now, so the blocks
//!   after it cover the rest (a new epoch goes on with the schedule of the one before). The leader
//!   proposes once it has such a parent and its clock reaches the tick's due time on its
//!   schedule (one period after the tick before; the schedule follows the chain's BFT times,
//!   see `Validator::due`), and never sooner than half a period after the parent: so the chain
//!   advances one tick per period on average, never faster, and the delays of proposals sent
//!   late do not add up (the pipeline: proposing the next block needs only the notarization
//!   of its parent).
//! - **R1 fills.** A block may instead carry its parent's tick (a *fill*): its parent is an
//!   empty block of a view (not the root an epoch starts from), its tick is not the epoch's
//!   last, and it carries events (so a fill is never filled: at most two blocks a tick). The
//!   tick's events are the fill's, handed out once, with the fill's seed, when a block of a
//!   later tick commits ([`Commit::opener`] names the empty block). A leader whose recent
//!   notarizations came within half a period of their blocks (`fill_lead_us` on) opens each
//!   tick with an empty block when it is due, and the next leader fills it a lead before the
//!   next tick is due (the configured lead or a round and a half, at most half a period), so
//!   the next tick's block, which seeds this one, follows the fill by that lead: an event
//!   waits about half a period for its block and the lead and a round more for its hand-out,
//!   instead of a whole period more (the seed rule below). A leader with no events to fill
//!   with proposes the next tick when due; across longer round trips every block carries
//!   events, as without fills. Voters check only the rule above.
//! - **R2 (notarize).** In its current view, a validator notarizes the first valid proposal,
//!   unless it already nullified the view. The leader's proposal carries its own notarize vote.
//! - **R3 (advance + finalize).** On `q` notarize votes for `(v, B)` (a notarization), a
//!   validator passes the certificate on, sends `finalize(v, B)` unless it nullified `v`, and
//!   enters `v + 1`.
//! - **R4 (timeout).** If the current view has no proposal after `leader_timeout` (a compact
//!   proposal whose events are still being fetched counts: its leader was heard from), or no
//!   notarization after `notarize_timeout`, the validator nullifies it; on `q` nullify votes
//!   (a nullification) everyone enters `v + 1`. A crashed, slow or lying leader costs one
//!   timeout. While stuck, a validator re-sends its votes and its latest certificates; it
//!   also sends its latest certificates with each nullify vote of a view it timed out (so a
//!   restarted peer learns the last finalization even while the views time out one after
//!   another and never stay stuck long enough for a re-send). Timeouts adapt (partial
//!   synchrony needs them to outgrow the actual delays): a view nullified with more than f
//!   views since the last finalized one raises the validator's patience by one (timeouts
//!   `1 + patience` times the configured ones, at most 8), and 32 finalized views in a row
//!   lower it by one.
//! - **R5 (commit).** On `q` finalize votes for `(v, B)`, `B` and its ancestors are committed.
//!
//! Safety: an honest validator never both finalizes and nullifies a view, and never notarizes
//! two blocks in one view; any two quorums share an honest validator. So a finalized block's
//! view is never nullified nor has a second notarized block, and every later valid block
//! descends from it.
//!
//! **Deviations and additions.**
//! - The *seed* of tick `t`'s canonical order (DESIGN §4) is `blake3(digest_t ‖ hash of the
//!   notarization of block t embedded in block t+1)`. A node's own set of 2f+1 signatures
//!   differs from its peers', so only the copy embedded in the committed chain is unique; and
//!   it is unknown to the leader of `t` when it proposes. The price: tick `t` is handed out
//!   (as [`Commit`]) when block `t+1` is committed, one tick period after its own finality
//!   (with R1 fills, a fill's lead after the fill's).
//!   The empty ticks of a block's span are handed out just before it, each as a `filler`
//!   [`Commit`] with a BFT time one period before the next and a seed derived from the block's
//!   ([`span_seed`]).
//! - Votes carry the voter's latest executed tick and state root; a mismatch with ours is an
//!   [`Output::RootMismatch`] (divergence detected within a tick).
//! - Conflicting votes from one signer are reported as [`Output::Evidence`].
//! - Missing blocks are fetched from peers by digest; blocks are self-authenticating. A
//!   validator that sees a notarize vote for a block of its current view whose proposal has not
//!   reached it fetches the block a quarter period later; the answer carries the leader's
//!   notarize vote, and the block is taken as the proposal (R2). Without it, on a lossy network
//!   with f Byzantine validators, a proposal lost to one honest validator failed its view.
//! - Client events are disseminated to every validator's pool on submission; each leader
//!   proposes the oldest pooled events not already in the uncommitted ancestors, so an event
//!   known to the honest validators is proposed within `f + 1` views.
//! - Proposals are compact: the header and the events named as runs of the gossip batches
//!   they came in, each batch named by the hash of its events' ids, or by id where a batch is
//!   not recent ([`Message::ProposeRefs`]; [`Message::ProposeIds`] names every event by id); a
//!   validator rebuilds the block from the batches it holds and its pool, and one missing a
//!   batch or an event waits a quarter period for the gossip, then fetches the block (and is
//!   also sent full proposals for 64 views). A block's digest is over its header and its
//!   events' ids, so every form is signed alike; a run beyond its batch gets no vote.
//! - A validator that voted to notarize a block signs its finalize vote for it and checks the
//!   leader's vote's signature while the others' votes are on their way (`work_ahead`: the
//!   same bytes ed25519 would sign later, used only if still wanted); signatures are checked
//!   with `verify_strict`'s verdicts from a table kept per key ([`strict`]).
//! - Votes and proposals carry an authenticator, one MAC per validator under pairwise keys
//!   (X25519 of the ed25519 keys; [`Message::Authenticated`], as PBFT's authenticators): a vote
//!   whose MAC checks counts at once and its signature is checked `period / 16` later. No
//!   certificate leaves a validator, goes into a block or commits before its signatures are
//!   checked; a signer caught with a good MAC on a bad signature is taken out of what it was
//!   counted in and verified first from then on. Safety needs only that a counted vote is its
//!   signer's, which the MAC shows the receiver; signatures make certificates transferable.
//! - A vote for a (view, kind, block) already certified here is verified a quarter period
//!   later (it only carries a root report and possible evidence), off the commit's path.
//! - Crash recovery: every vote cast is durable before it is sent ([`Validator::persist`]), and
//!   a restored validator counts its own restored votes in its tallies again, as when it cast
//!   them (with f validators down, every vote of the others and its own is needed). The
//!   persisted state keeps only the blocks not yet handed out; the blocks handed out before
//!   are given back from the application's commit log ([`Validator::recall`]), so that after
//!   a whole sim stopped, a validator that was down then can still fetch the blocks it lacks.
//! - Validator-set changes (governance, at epoch boundaries) happen above this crate: an epoch
//!   is a new `Validator` with the new set, started at the boundary tick.

#![forbid(unsafe_code)]

#[cfg(feature = "mocks")]
pub mod mocks;
mod pool;
pub mod strict;
pub mod types;
mod validator;

pub use types::{
    Block, Certificate, CertificateError, DecodeError, Digest, EventBytes, Logged, Mac, Message, Micros, Opener,
    Parent, Piece, RootReport, Sig, SigCache, Signed, Tick, ValidatorIndex, View, Vote, VoteKind, event_id, pair_key,
};
pub use validator::{
    Anchor, Commit, Config, Evidence, Output, ProposalError, Validator, epoch_digest, genesis_digest, seed_of,
    span_seed,
};

/// Re-exported so callers build keys with the same ed25519 the core verifies with.
pub use ed25519_dalek::{SigningKey, VerifyingKey};
