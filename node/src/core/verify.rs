//! Signatures of client events checked ahead, on their own thread, while the events travel
//! (submitted here, gossiped by peers, proposed in a block), so that executing a committed tick
//! finds its verdicts ready instead of checking every signature on the loop that also carries
//! the votes. A verdict is a pure function of the event's bytes: where it was computed never
//! changes a result, and a verdict that is not ready is computed at execution as before.

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

use metatopia_consensus::EventBytes;
use metatopia_sim::SignedEvent;

use crate::core::limits::MAX_BLOCK_EVENT_BYTES;

/// Verdicts remembered (the oldest are forgotten first).
const KEEP: usize = 1 << 17;
/// Lists of events waiting for the thread; more are dropped (execution checks them itself).
const QUEUE: usize = 1_024;

type Key = [u8; 32];

#[derive(Debug, Default)]
struct Verdicts {
    by_key: BTreeMap<Key, bool>,
    order: VecDeque<Key>,
}

impl Verdicts {
    fn insert(&mut self, key: Key, ok: bool) {
        if self.by_key.insert(key, ok).is_none() {
            self.order.push_back(key);
            while self.order.len() > KEEP {
                if let Some(old) = self.order.pop_front() {
                    self.by_key.remove(&old);
                }
            }
        }
    }
}

/// The cache and the thread that fills it.
#[derive(Debug, Clone)]
pub struct Verifier {
    verdicts: Arc<Mutex<Verdicts>>,
    queue: Option<SyncSender<Vec<EventBytes>>>,
}

/// The key of an event's verdict: a hash of its encoding, signature included.
fn key_of(bytes: &[u8]) -> Key {
    *blake3::keyed_hash(b"metatopia/node/verdict/v1_______", bytes).as_bytes()
}

impl Verifier {
    /// A cache only: verdicts recorded with [`Verifier::record`], nothing checked ahead.
    pub fn cache() -> Verifier {
        Verifier { verdicts: Arc::default(), queue: None }
    }

    /// A cache and a thread that checks what [`Verifier::ahead`] hands it. The thread ends
    /// when the last clone of the verifier is dropped.
    pub fn start() -> Verifier {
        let verdicts: Arc<Mutex<Verdicts>> = Arc::default();
        let (tx, rx) = sync_channel::<Vec<EventBytes>>(QUEUE);
        let shared = verdicts.clone();
        let spawned = std::thread::Builder::new().name("verify".into()).spawn(move || {
            for list in rx {
                for bytes in list {
                    let key = key_of(&bytes);
                    if shared.lock().unwrap_or_else(|e| e.into_inner()).by_key.contains_key(&key) {
                        continue;
                    }
                    // Undecodable bytes have no verdict: execution skips them the same way.
                    if let Ok(e) = SignedEvent::decode(&bytes, MAX_BLOCK_EVENT_BYTES) {
                        let ok = e.verify();
                        shared.lock().unwrap_or_else(|e| e.into_inner()).insert(key, ok);
                    }
                }
            }
        });
        match spawned {
            Ok(_) => Verifier { verdicts, queue: Some(tx) },
            Err(e) => {
                tracing::warn!("no verifier thread ({e}); signatures are checked when ticks execute");
                Verifier { verdicts, queue: None }
            }
        }
    }

    /// Check these encoded events on the thread, if it keeps up (never blocks).
    pub fn ahead(&self, events: &[EventBytes]) {
        if let Some(q) = &self.queue
            && !events.is_empty()
            && let Err(TrySendError::Full(_)) = q.try_send(events.to_vec())
        {
            metrics::counter!("metatopia_verify_ahead_dropped_total").increment(events.len() as u64);
        }
    }

    /// Remember a verdict computed elsewhere (at the door, for a submission).
    pub fn record(&self, bytes: &[u8], ok: bool) {
        self.verdicts.lock().unwrap_or_else(|e| e.into_inner()).insert(key_of(bytes), ok);
    }

    /// The verdict on an event, if known.
    pub fn verdict(&self, e: &SignedEvent) -> Option<bool> {
        let key = key_of(&metatopia_sim::codec::encode(e));
        self.verdicts.lock().unwrap_or_else(|e| e.into_inner()).by_key.get(&key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metatopia_sim::{Payload, SimId};

    #[test]
    fn verdicts_computed_ahead_match_checking_in_line_and_forged_ones_stay_forged() {
        let key = metatopia_sim::genesis::demo_key(5, 1);
        let good = SignedEvent::new(
            &key,
            SimId(1),
            1,
            Payload::Chat { channel: 0, range: metatopia_sim::ChatRange::Say, text: "hi".into() },
        );
        let mut forged = good.clone();
        forged.body.nonce = 2; // the signature no longer covers the body
        let v = Verifier::start();
        assert_eq!(v.verdict(&good), None, "nothing known yet");
        v.ahead(&[
            metatopia_sim::codec::encode(&good).into(),
            metatopia_sim::codec::encode(&forged).into(),
            vec![1, 2, 3].into(),
        ]);
        let t0 = std::time::Instant::now();
        while v.verdict(&forged).is_none() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the thread checked nothing");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(v.verdict(&good), Some(true));
        assert_eq!(v.verdict(&forged), Some(false));
        assert_eq!(v.verdict(&good), Some(good.verify()));
        // Recorded verdicts are found by the event's encoding.
        let c = Verifier::cache();
        let other = SignedEvent::new(&key, SimId(1), 3, Payload::Logout);
        c.record(&metatopia_sim::codec::encode(&other), true);
        assert_eq!(c.verdict(&other), Some(true));
    }
}
