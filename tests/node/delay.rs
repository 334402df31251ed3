//! A delay stage on the network path, in user space (this kernel has no netem).
//!
//! The test process reaches the test network through a router namespace instead of a plain
//! link: its packets go to the router over a veth pair, the router's policy routes send
//! everything it forwards (both ways) into a TUN device whose other end is this module, which
//! holds each IPv4 packet for the delay of the test host it is to or from and writes it back
//! into the device; the router then forwards it on. So every packet between this process and a
//! host waits that host's one-way delay each way, whatever the protocol (QUIC, TCP), as on a
//! longer path. Nothing is rewritten: the hosts route the test process's subnet back through
//! the router. Everything is removed with the test's namespaces.

use std::collections::{BTreeMap, BinaryHeap};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Packets held at once at most; beyond it a packet is dropped (as a full queue would).
const MAX_HELD: usize = 20_000;

/// A packet due at a time (the earliest first; equal times in arrival order).
struct Held {
    due: Instant,
    seq: u64,
    bytes: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.seq) == (o.due, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.due, o.seq).cmp(&(self.due, self.seq))
    }
}

/// The running stage: two threads (one reads and stamps, one writes when due), stopped when
/// dropped.
pub struct DelayStage {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Packets held and passed so far.
    pub passed: Arc<std::sync::atomic::AtomicU64>,
}

impl Drop for DelayStage {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The host an IPv4 packet is to or from, if it is one of `delays`, and its delay.
fn delay_of(packet: &[u8], delays: &BTreeMap<Ipv4Addr, Duration>) -> Duration {
    if packet.len() < 20 || packet[0] >> 4 != 4 {
        return Duration::ZERO;
    }
    let addr = |at: usize| Ipv4Addr::new(packet[at], packet[at + 1], packet[at + 2], packet[at + 3]);
    delays.get(&addr(16)).or_else(|| delays.get(&addr(12))).copied().unwrap_or(Duration::ZERO)
}

/// Make the TUN device `name` (in this process's namespace; the caller moves it to the router)
/// and start holding what comes out of it for `delays` (one way, by host address).
pub fn start(name: &str, delays: BTreeMap<Ipv4Addr, Duration>) -> DelayStage {
    let mut config = tun::Configuration::default();
    config.tun_name(name).mtu(1500);
    let dev = Arc::new(tun::create(&config).unwrap_or_else(|e| panic!("TUN device {name}: {e}")));
    let stop = Arc::new(AtomicBool::new(false));
    let passed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let queue = Arc::new((Mutex::new(BinaryHeap::<Held>::new()), Condvar::new()));
    let reader = {
        let (dev, stop, queue) = (dev.clone(), stop.clone(), queue.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n = match dev.recv_timeout(&mut buf, Duration::from_millis(100)) {
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => continue,
                    // The device went with its namespace.
                    Err(_) => return,
                };
                let due = Instant::now() + delay_of(&buf[..n], &delays);
                let (held, more) = &*queue;
                let mut held = held.lock().unwrap();
                if held.len() < MAX_HELD {
                    seq += 1;
                    held.push(Held { due, seq, bytes: buf[..n].to_vec() });
                    more.notify_one();
                }
            }
        })
    };
    let writer = {
        let (stop, queue, passed) = (stop.clone(), queue.clone(), passed.clone());
        std::thread::spawn(move || {
            let (held, more) = &*queue;
            let mut q = held.lock().unwrap();
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                match q.peek().map(|h| h.due) {
                    Some(due) if due <= now => {
                        let h = q.pop().expect("peeked");
                        drop(q);
                        // A packet the router cannot take is lost, as on a real link.
                        let _ = dev.send(&h.bytes);
                        passed.fetch_add(1, Ordering::Relaxed);
                        q = held.lock().unwrap();
                    }
                    Some(due) => q = more.wait_timeout(q, due - now).unwrap().0,
                    None => q = more.wait_timeout(q, Duration::from_millis(100)).unwrap().0,
                }
            }
        })
    };
    DelayStage { stop, threads: vec![reader, writer], passed }
}
