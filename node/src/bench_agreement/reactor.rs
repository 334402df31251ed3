//! `--threads reactor`: one thread to a core, running the validators placed there on one event
//! loop instead of as tasks: a single future on a single-threaded tokio runtime that owns all
//! their sockets, as a busy-polling runtime such as Seastar's runs the shards of a core.
//!
//! Every turn the loop yields to the runtime, whose driver then polls the sockets (epoll, no
//! wait), reads whatever arrived on any of its validators' links, and handles one input: the
//! earliest message that arrived for any of them (votes, proposals and certificates before
//! gossiped client events, as each validator's own inbox orders them), else a batch of client
//! events, else a timer that is due. What the input made the validator send is written to its
//! sockets at once, one write per peer. So two validators sharing a core take turns input by
//! input in the order their inputs came, with no OS scheduler deciding which thread runs and no
//! task queue between a socket and the validator: a vote that arrives while the other validator
//! handles an input is read right after that input.

use std::collections::{BTreeMap, VecDeque};
use std::io::ErrorKind;
use std::time::Duration;

use metatopia_consensus::{Message, ValidatorIndex};
use metatopia_node::frames::MAX_FRAME;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::{Driver, Frame, Input, Shared};

/// A validator the reactor runs: its links (each to one peer, non-blocking) and its clients'
/// events.
pub(super) struct Member {
    pub driver: Driver,
    pub links: Vec<(u16, std::net::TcpStream)>,
    pub events: mpsc::UnboundedReceiver<Vec<Vec<u8>>>,
}

/// One end of a link: a validator's connection to a peer, with what was read of it and not yet
/// framed, and what is to be written to it and not yet taken by the socket.
struct Link {
    owner: usize,
    peer: u16,
    stream: TcpStream,
    inbound: Vec<u8>,
    outbound: Vec<u8>,
    written: usize,
    open: bool,
}

impl Link {
    /// Queue a frame (length-prefixed, as `frames::write_frame` writes it).
    fn queue(&mut self, frame: &[u8]) {
        if self.open {
            self.outbound.extend_from_slice(&(frame.len() as u32).to_le_bytes());
            self.outbound.extend_from_slice(frame);
        }
    }

    /// Write what is queued, as far as the socket takes it now.
    fn flush(&mut self) {
        while self.open && self.written < self.outbound.len() {
            match self.stream.try_write(&self.outbound[self.written..]) {
                Ok(0) => self.open = false,
                Ok(n) => self.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.open = false,
            }
        }
        self.outbound.clear();
        self.written = 0;
    }

    /// Read everything the socket holds into `inbound` (nothing, without a system call, unless
    /// the runtime's driver saw it readable since the last read found it empty).
    fn read_all(&mut self, buf: &mut [u8]) {
        while self.open {
            match self.stream.try_read(buf) {
                Ok(0) => self.open = false,
                Ok(n) => self.inbound.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.open = false,
            }
        }
    }

    /// Pass each whole frame read so far to `each`, and forget it (a length over the limit ends
    /// the link).
    fn frames_raw(&mut self, mut each: impl FnMut(&[u8])) {
        let mut at = 0;
        while self.inbound.len() - at >= 4 {
            let len = u32::from_le_bytes(self.inbound[at..at + 4].try_into().expect("4 bytes"));
            if len > MAX_FRAME {
                tracing::warn!(peer = self.peer, "a frame of {len} bytes is over the limit: link closed");
                self.open = false;
                break;
            }
            let end = at + 4 + len as usize;
            if self.inbound.len() < end {
                break;
            }
            each(&self.inbound[at + 4..end]);
            at = end;
        }
        self.inbound.drain(..at);
    }

    /// The whole frames read so far, decoded (a frame that does not decode is dropped, as the
    /// tokio readers drop it).
    fn frames(&mut self) -> Vec<Message> {
        let mut out = Vec::new();
        let peer = self.peer;
        self.frames_raw(|f| match Message::decode(f, MAX_FRAME as usize) {
            Ok(m) => out.push(m),
            Err(e) => tracing::warn!(peer, "dropping a bad frame: {e}"),
        });
        out
    }

    /// (Inside a runtime: the stream is registered with its driver.)
    fn new(owner: usize, peer: u16, s: std::net::TcpStream) -> std::io::Result<Link> {
        s.set_nonblocking(true)?;
        let stream = TcpStream::from_std(s)?;
        let (inbound, outbound) = (Vec::with_capacity(1 << 16), Vec::with_capacity(1 << 16));
        Ok(Link { owner, peer, stream, inbound, outbound, written: 0, open: true })
    }

    fn into_std(self) -> std::io::Result<std::net::TcpStream> {
        self.stream.into_std()
    }
}

/// The end of a turn: the runtime's driver polls the sockets (and the core goes to any other
/// thread that wants it when there was nothing to do).
async fn turn(idle: bool) {
    if idle {
        // (Fails only where the OS has no such call: the turn is then shorter.)
        let _ = nix::sched::sched_yield();
    }
    tokio::task::yield_now().await;
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_io().build()
}

/// The round trip of a 64-byte frame between two such event loops, over `a` and `b` (each loop
/// on a thread of its own, polling and yielding as the reactor does): the median of `rounds`.
/// The streams are handed back.
pub(super) fn round_trip(
    a: std::net::TcpStream,
    b: std::net::TcpStream,
    rounds: usize,
) -> anyhow::Result<(Duration, std::net::TcpStream, std::net::TcpStream)> {
    let echo = std::thread::spawn(move || -> anyhow::Result<std::net::TcpStream> {
        runtime()?.block_on(async move {
            let mut link = Link::new(0, 0, b)?;
            let mut buf = vec![0u8; 1 << 12];
            let mut echoed = 0;
            while echoed < rounds {
                anyhow::ensure!(link.open, "the round trip's link closed");
                link.read_all(&mut buf);
                let mut got = Vec::new();
                link.frames_raw(|f| got.push(f.to_vec()));
                for f in &got {
                    link.queue(f);
                    echoed += 1;
                }
                link.flush();
                turn(got.is_empty()).await;
            }
            Ok(link.into_std()?)
        })
    });
    let (rtt, a) = runtime()?.block_on(async move {
        let mut link = Link::new(0, 1, a)?;
        let mut buf = vec![0u8; 1 << 12];
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = std::time::Instant::now();
            link.queue(&[7u8; 64]);
            link.flush();
            let mut back = 0;
            while back == 0 {
                anyhow::ensure!(link.open, "the round trip's link closed");
                turn(true).await;
                link.flush();
                link.read_all(&mut buf);
                link.frames_raw(|_| back += 1);
            }
            samples.push(t.elapsed());
        }
        samples.sort();
        anyhow::Ok((samples[samples.len() / 2], link.into_std()?))
    })?;
    let b = echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    Ok((rtt, a, b))
}

struct Slot {
    driver: Driver,
    /// Its link to each peer (an index into the reactor's links).
    to: BTreeMap<u16, usize>,
    events: mpsc::UnboundedReceiver<Vec<Vec<u8>>>,
    /// Its validator's next timer (`Validator::poll_timeout`, which depends on its state only:
    /// asked again after each input, not at every turn).
    deadline: Option<u64>,
    done: bool,
}

/// Run `members` on the calling thread until each has committed its last tick (or lost all its
/// links).
pub(super) fn run(members: Vec<Member>, shared: &Shared) -> anyhow::Result<()> {
    runtime()?.block_on(run_loop(members, shared))
}

async fn run_loop(members: Vec<Member>, shared: &Shared) -> anyhow::Result<()> {
    let mut links: Vec<Link> = Vec::new();
    let mut slots: Vec<Slot> = Vec::new();
    for (owner, m) in members.into_iter().enumerate() {
        let mut to = BTreeMap::new();
        for (peer, s) in m.links {
            to.insert(peer, links.len());
            links.push(Link::new(owner, peer, s)?);
        }
        let deadline = m.driver.deadline();
        slots.push(Slot { driver: m.driver, to, events: m.events, deadline, done: false });
    }
    // Peers' messages in arrival order, in two queues as each validator's inbox has them.
    let mut first: VecDeque<(usize, ValidatorIndex, Message)> = VecDeque::new();
    let mut gossip: VecDeque<(usize, ValidatorIndex, Message)> = VecDeque::new();
    let mut submits: VecDeque<(usize, Vec<Vec<u8>>)> = VecDeque::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut next_timer = 0;
    let mut idle = false;
    loop {
        turn(idle).await;
        if slots.iter().all(|s| s.done) {
            return Ok(());
        }
        for link in links.iter_mut().filter(|l| !l.outbound.is_empty()) {
            // (What a full socket did not take last time.)
            link.flush();
        }
        // What arrived.
        for link in links.iter_mut().filter(|l| l.open) {
            link.read_all(&mut buf);
            if link.inbound.is_empty() && link.open {
                continue;
            }
            let read = shared.start.elapsed();
            let (owner, peer) = (link.owner, link.peer);
            for m in link.frames() {
                if m.kind() == "propose" {
                    // (For `--timeline`: the proposal read and decoded.)
                    let me = slots[owner].driver.me;
                    shared.inputs.lock().expect("not poisoned").push((me, read, shared.start.elapsed(), "read"));
                }
                let queue = if matches!(m, Message::Events(_)) { &mut gossip } else { &mut first };
                queue.push_back((owner, ValidatorIndex(peer), m));
            }
        }
        for s in slots.iter_mut().filter(|s| !s.done) {
            // (As a validator task ends once all its links are gone.)
            s.done = s.to.values().all(|&l| !links[l].open);
        }
        for (k, s) in slots.iter_mut().enumerate() {
            while let Ok(batch) = s.events.try_recv() {
                submits.push_back((k, batch));
            }
        }
        // One input.
        let picked = first
            .pop_front()
            .or_else(|| gossip.pop_front())
            .map(|(k, from, m)| (k, Input::Message(from, Box::new(m))))
            .or_else(|| submits.pop_front().map(|(k, b)| (k, Input::Events(b))))
            .or_else(|| {
                // A due timer, the validators' in turn.
                let now = slots.first().map(|s| s.driver.micros())?;
                let n = slots.len();
                let k = (0..n)
                    .map(|j| (next_timer + j) % n)
                    .find(|&k| !slots[k].done && slots[k].deadline.is_some_and(|d| d <= now))?;
                next_timer = (k + 1) % n;
                Some((k, Input::Timeout))
            });
        idle = picked.is_none();
        let Some((k, input)) = picked else { continue };
        let slot = &mut slots[k];
        if slot.done {
            continue;
        }
        let to = &slot.to;
        let mut send = |peer: Option<u16>, frame: &Frame| match peer {
            None => to.values().for_each(|&l| links[l].queue(frame)),
            Some(p) => {
                if let Some(&l) = to.get(&p) {
                    links[l].queue(frame);
                }
            }
        };
        if !slot.driver.step(input, &mut send) {
            slot.done = true;
        }
        slot.deadline = slot.driver.deadline();
        for &l in slot.to.values() {
            links[l].flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// A loopback connection: the reactor's end (a link, inside the calling runtime) and the
    /// peer's.
    fn pair() -> (Link, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let peer = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (ours, _) = l.accept().expect("accept");
        (Link::new(0, 1, ours).expect("link"), peer)
    }

    /// Read what the peer sent (waiting for it up to a second), turn by turn as the loop does.
    async fn read_until(link: &mut Link, enough: impl Fn(&Link) -> bool) {
        let mut buf = vec![0u8; 1 << 12];
        let t = std::time::Instant::now();
        while !enough(link) && link.open {
            assert!(t.elapsed() < Duration::from_secs(1), "nothing came");
            turn(true).await;
            link.read_all(&mut buf);
        }
    }

    #[test]
    fn a_frame_split_over_two_writes_is_taken_whole_and_a_bad_one_is_dropped() {
        runtime().expect("runtime").block_on(async {
            let (mut link, mut peer) = pair();
            let vote = Message::Events(vec![metatopia_consensus::EventBytes::from(&[1u8, 2, 3][..])]).encode();
            let mut bytes = (vote.len() as u32).to_le_bytes().to_vec();
            bytes.extend_from_slice(&vote);
            peer.write_all(&bytes[..5]).expect("write");
            read_until(&mut link, |l| l.inbound.len() >= 5).await;
            assert!(link.frames().is_empty(), "half a frame is not a frame");
            // The rest, then a frame that is not a message, then the message again.
            peer.write_all(&bytes[5..]).expect("write");
            peer.write_all(&[3, 0, 0, 0, 0xff, 0xff, 0xff]).expect("write");
            peer.write_all(&bytes).expect("write");
            read_until(&mut link, |l| l.inbound.len() >= 2 * bytes.len() + 7).await;
            let got = link.frames();
            assert_eq!(got.len(), 2, "the two messages, the bad frame dropped");
            assert!(got.iter().all(|m| m.encode() == vote));
            assert!(link.open && link.inbound.is_empty());
        });
    }

    #[test]
    fn a_length_over_the_limit_closes_the_link_without_reading_on() {
        runtime().expect("runtime").block_on(async {
            let (mut link, mut peer) = pair();
            peer.write_all(&(MAX_FRAME + 1).to_le_bytes()).expect("write");
            peer.write_all(&[0; 64]).expect("write");
            read_until(&mut link, |l| l.inbound.len() >= 68).await;
            assert!(link.frames().is_empty());
            assert!(!link.open);
            // Nothing more is queued to a closed link.
            link.queue(&[1, 2, 3]);
            assert!(link.outbound.is_empty());
        });
    }

    #[test]
    fn queued_frames_reach_the_peer_framed_and_a_closed_peer_closes_the_link() {
        runtime().expect("runtime").block_on(async {
            let (mut link, mut peer) = pair();
            // (Writable once the driver has seen it so.)
            turn(false).await;
            link.queue(&[9; 10]);
            link.queue(&[]);
            link.flush();
            assert!(link.outbound.is_empty() && link.open);
            let mut got = [0u8; 18];
            peer.read_exact(&mut got).expect("read");
            assert_eq!(&got[..4], &10u32.to_le_bytes());
            assert_eq!(&got[4..14], &[9; 10]);
            assert_eq!(&got[14..], &0u32.to_le_bytes());
            drop(peer);
            read_until(&mut link, |_| false).await;
            assert!(!link.open);
        });
    }

    #[test]
    fn the_round_trip_is_measured_and_the_streams_come_back() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        let (rtt, mut a, mut b) = round_trip(a, b, 20).expect("round trip");
        assert!(rtt > Duration::ZERO && rtt < Duration::from_secs(1), "{rtt:?}");
        // Still connected, to each other.
        a.set_nonblocking(false).expect("blocking");
        b.set_nonblocking(false).expect("blocking");
        a.write_all(b"ok").expect("write");
        let mut got = [0u8; 2];
        b.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"ok");
    }
}
