//! `--threads reactor`: one thread to a core, running the validators placed there on one event
//! loop instead of as tasks: a single future on a single-threaded tokio runtime that owns all
//! their sockets, as a busy-polling runtime such as Seastar's runs the shards of a core.
//!
//! A validator's links are a TCP connection to each peer, or with `--transport udp` one UDP
//! socket (a frame longer than a datagram in numbered pieces: `Port`).
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

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use metatopia_consensus::{Message, ValidatorIndex};
use metatopia_node::net::frames::MAX_FRAME;
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::mpsc;

use super::driver::{Driver, Frame, Input, Shared};

/// What a validator's messages travel over, as set up before its thread starts.
pub(super) enum Setup {
    /// A TCP connection to each peer.
    Tcp(Vec<(u16, std::net::TcpStream)>),
    /// One UDP socket, and each peer's address.
    Udp(std::net::UdpSocket, BTreeMap<u16, SocketAddr>),
}

/// A validator the reactor runs: its links and its clients' events.
pub(super) struct Member {
    pub driver: Driver,
    pub net: Setup,
    pub events: mpsc::UnboundedReceiver<Vec<Vec<u8>>>,
}

/// One end of a link: a validator's connection to a peer, with what was read of it and not yet
/// framed, and what is to be written to it and not yet taken by the socket.
struct Link {
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

    /// (Inside a runtime: the stream is registered with its driver.)
    fn new(peer: u16, s: std::net::TcpStream) -> std::io::Result<Link> {
        s.set_nonblocking(true)?;
        let stream = TcpStream::from_std(s)?;
        let (inbound, outbound) = (Vec::with_capacity(1 << 16), Vec::with_capacity(1 << 16));
        Ok(Link { peer, stream, inbound, outbound, written: 0, open: true })
    }

    fn into_std(self) -> std::io::Result<std::net::TcpStream> {
        self.stream.into_std()
    }
}

/// The bytes of one UDP datagram at most, after its header: a frame longer than this goes in
/// pieces (a loopback datagram carries up to 65,507 bytes).
const PIECE: usize = 60_000;
/// Frames in pieces kept per peer while their other pieces are awaited, and the bytes of their
/// pieces held, at most (the oldest frames are dropped beyond: UDP may lose a piece, and the
/// protocol asks again for what it misses).
const PARTIAL_MAX: usize = 16;
const PARTIAL_BYTES: usize = MAX_FRAME as usize;

/// A validator's UDP socket. Each datagram is `[seq u32][piece u16][pieces u16]` and a piece of
/// one frame (`seq` numbers this socket's frames), read from known peers' addresses only.
struct Port {
    socket: UdpSocket,
    peers: BTreeMap<u16, SocketAddr>,
    by_addr: BTreeMap<SocketAddr, u16>,
    /// Datagrams the socket did not take yet, in order.
    pending: VecDeque<(SocketAddr, Rc<[u8]>)>,
    next_seq: u32,
    /// Frames in pieces: (peer, seq) -> (pieces, those received), the oldest first.
    partial: BTreeMap<(u16, u32), Pieces>,
    /// The bytes of the pieces held, per peer.
    held: BTreeMap<u16, usize>,
}

/// A frame's count of pieces, and the pieces received, by index.
type Pieces = (u16, BTreeMap<u16, Vec<u8>>);

impl Port {
    fn new(socket: std::net::UdpSocket, peers: BTreeMap<u16, SocketAddr>) -> std::io::Result<Port> {
        socket.set_nonblocking(true)?;
        let by_addr = peers.iter().map(|(p, a)| (*a, *p)).collect();
        let socket = UdpSocket::from_std(socket)?;
        let (pending, partial, held) = (VecDeque::new(), BTreeMap::new(), BTreeMap::new());
        Ok(Port { socket, peers, by_addr, pending, next_seq: 0, partial, held })
    }

    fn queue(&mut self, to: Option<u16>, frame: &[u8]) {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let pieces = frame.len().div_ceil(PIECE).max(1);
        let Ok(count) = u16::try_from(pieces) else { return };
        let targets: Vec<SocketAddr> = match to {
            None => self.peers.values().copied().collect(),
            Some(p) => self.peers.get(&p).copied().into_iter().collect(),
        };
        for i in 0..pieces {
            let body = &frame[(i * PIECE).min(frame.len())..((i + 1) * PIECE).min(frame.len())];
            let mut d = Vec::with_capacity(8 + body.len());
            d.extend_from_slice(&seq.to_le_bytes());
            d.extend_from_slice(&(i as u16).to_le_bytes());
            d.extend_from_slice(&count.to_le_bytes());
            d.extend_from_slice(body);
            // (One datagram's bytes for all its targets.)
            let d: Rc<[u8]> = d.into();
            for &addr in &targets {
                self.pending.push_back((addr, d.clone()));
            }
        }
    }

    fn flush(&mut self) {
        while let Some((addr, d)) = self.pending.front() {
            match self.socket.try_send_to(d, *addr) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // (A datagram refused, say to a peer gone: lost, as UDP may lose it anyway.)
                Err(_) => {}
            }
            self.pending.pop_front();
        }
    }

    /// The whole frames received so far (nothing, without a system call, unless the runtime's
    /// driver saw the socket readable since the last read found it empty), with their senders.
    fn receive(&mut self, buf: &mut [u8], mut each: impl FnMut(u16, &[u8])) {
        loop {
            let (n, from) = match self.socket.try_recv_from(buf) {
                Ok(got) => got,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // WouldBlock: nothing more. Anything else (say an ICMP error reported for an
                // earlier send) ends this turn's reading too; the socket is still readable for
                // the runtime, so the next turn reads on.
                Err(_) => return,
            };
            let Some(&peer) = self.by_addr.get(&from) else { continue };
            if let Some(frame) = self.piece(peer, &buf[..n]) {
                each(peer, &frame);
            }
        }
    }

    /// Take one datagram: the frame it completes, if any (a frame of one piece is the
    /// datagram's own bytes, not copied).
    fn piece<'d>(&mut self, peer: u16, d: &'d [u8]) -> Option<Cow<'d, [u8]>> {
        if d.len() < 8 {
            return None;
        }
        let seq = u32::from_le_bytes(d[..4].try_into().expect("4 bytes"));
        let index = u16::from_le_bytes(d[4..6].try_into().expect("2 bytes"));
        let count = u16::from_le_bytes(d[6..8].try_into().expect("2 bytes"));
        let body = &d[8..];
        if count == 0 || index >= count || count as usize > MAX_FRAME as usize / PIECE + 1 {
            return None;
        }
        if count == 1 {
            return Some(Cow::Borrowed(body));
        }
        let (want, got) = self.partial.entry((peer, seq)).or_insert_with(|| (count, BTreeMap::new()));
        if *want != count {
            return None;
        }
        let held = self.held.entry(peer).or_default();
        *held += body.len();
        if let Some(old) = got.insert(index, body.to_vec()) {
            *held -= old.len();
        }
        if got.len() == usize::from(count) {
            let (_, got) = self.partial.remove(&(peer, seq)).expect("just seen");
            let frame: Vec<u8> = got.into_values().flatten().collect();
            *held -= frame.len();
            return Some(Cow::Owned(frame));
        }
        loop {
            let mine: Vec<(u16, u32)> = self.partial.keys().filter(|(p, _)| *p == peer).copied().collect();
            let held = self.held.entry(peer).or_default();
            if mine.len() <= PARTIAL_MAX && *held <= PARTIAL_BYTES {
                return None;
            }
            if let Some((_, got)) = self.partial.remove(&mine[0]) {
                *held -= got.values().map(Vec::len).sum::<usize>();
            }
        }
    }

    fn into_std(self) -> std::io::Result<std::net::UdpSocket> {
        self.socket.into_std()
    }
}

/// A validator's links, live on the reactor's runtime.
enum Net {
    Tcp(BTreeMap<u16, Link>),
    Udp(Port),
}

impl Net {
    /// (Inside a runtime: the sockets are registered with its driver.)
    fn new(setup: Setup) -> std::io::Result<Net> {
        Ok(match setup {
            Setup::Tcp(links) => {
                let mut by_peer = BTreeMap::new();
                for (peer, s) in links {
                    by_peer.insert(peer, Link::new(peer, s)?);
                }
                Net::Tcp(by_peer)
            }
            Setup::Udp(socket, peers) => Net::Udp(Port::new(socket, peers)?),
        })
    }

    fn into_setup(self) -> std::io::Result<Setup> {
        Ok(match self {
            Net::Tcp(links) => {
                Setup::Tcp(links.into_iter().map(|(p, l)| l.into_std().map(|s| (p, s))).collect::<Result<_, _>>()?)
            }
            Net::Udp(port) => {
                let peers = port.peers.clone();
                Setup::Udp(port.into_std()?, peers)
            }
        })
    }

    /// Queue a frame for one peer, or for all with `None`.
    fn queue(&mut self, to: Option<u16>, frame: &[u8]) {
        match self {
            Net::Tcp(links) => match to {
                None => links.values_mut().for_each(|l| l.queue(frame)),
                Some(p) => {
                    if let Some(l) = links.get_mut(&p) {
                        l.queue(frame);
                    }
                }
            },
            Net::Udp(port) => port.queue(to, frame),
        }
    }

    /// Write what is queued, as far as the sockets take it now.
    fn flush(&mut self) {
        match self {
            Net::Tcp(links) => links.values_mut().filter(|l| !l.outbound.is_empty()).for_each(Link::flush),
            Net::Udp(port) => port.flush(),
        }
    }

    /// The frames that came, with their senders.
    fn receive(&mut self, buf: &mut [u8], mut each: impl FnMut(u16, &[u8])) {
        match self {
            Net::Tcp(links) => {
                for l in links.values_mut().filter(|l| l.open) {
                    l.read_all(buf);
                    let peer = l.peer;
                    l.frames_raw(|f| each(peer, f));
                }
            }
            Net::Udp(port) => port.receive(buf, each),
        }
    }

    /// Every link gone (a UDP socket has none to lose).
    fn closed(&self) -> bool {
        match self {
            Net::Tcp(links) => links.values().all(|l| !l.open),
            Net::Udp(_) => false,
        }
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

/// The round trip of a 64-byte frame between two such event loops, over `a` (a validator's links,
/// with one to `b_id`) and `b` (with one to `a_id`), each loop on a thread of its own, polling
/// and yielding as the reactor does: the median of `rounds`. The links are handed back.
pub(super) fn round_trip(
    (a_id, a): (u16, Setup),
    (b_id, b): (u16, Setup),
    rounds: usize,
) -> anyhow::Result<(Duration, Setup, Setup)> {
    let echo = std::thread::spawn(move || -> anyhow::Result<Setup> {
        runtime()?.block_on(async move {
            let mut net = Net::new(b)?;
            let mut buf = vec![0u8; 1 << 16];
            let mut echoed = 0;
            while echoed < rounds {
                anyhow::ensure!(!net.closed(), "the round trip's link closed");
                let mut got = Vec::new();
                net.receive(&mut buf, |from, f| {
                    if from == a_id {
                        got.push(f.to_vec());
                    }
                });
                for f in &got {
                    net.queue(Some(a_id), f);
                    echoed += 1;
                }
                net.flush();
                turn(got.is_empty()).await;
            }
            Ok(net.into_setup()?)
        })
    });
    let (rtt, a) = runtime()?.block_on(async move {
        let mut net = Net::new(a)?;
        let mut buf = vec![0u8; 1 << 16];
        let mut samples = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let t = std::time::Instant::now();
            net.queue(Some(b_id), &[7u8; 64]);
            net.flush();
            let mut back = 0;
            while back == 0 {
                anyhow::ensure!(!net.closed(), "the round trip's link closed");
                turn(true).await;
                net.flush();
                net.receive(&mut buf, |from, _| back += usize::from(from == b_id));
            }
            samples.push(t.elapsed());
        }
        samples.sort();
        anyhow::Ok((samples[samples.len() / 2], net.into_setup()?))
    })?;
    let b = echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    Ok((rtt, a, b))
}

struct Slot {
    driver: Driver,
    net: Net,
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
    let mut slots: Vec<Slot> = Vec::new();
    for m in members {
        let deadline = m.driver.deadline();
        slots.push(Slot { net: Net::new(m.net)?, driver: m.driver, events: m.events, deadline, done: false });
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
        // What arrived (and what a full socket did not take last time).
        for (k, s) in slots.iter_mut().enumerate() {
            s.net.flush();
            let me = s.driver.me;
            s.net.receive(&mut buf, |peer, f| match (shared.start.elapsed(), Message::decode(f, MAX_FRAME as usize)) {
                (read, Ok(m)) => {
                    if m.kind() == "propose" {
                        // (For `--timeline`: the proposal read and decoded.)
                        let decoded = shared.start.elapsed();
                        shared.inputs.lock().expect("not poisoned").push((me, read, decoded, "read"));
                    }
                    let queue = if matches!(m, Message::Events(_)) { &mut gossip } else { &mut first };
                    queue.push_back((k, ValidatorIndex(peer), m));
                }
                (_, Err(e)) => tracing::warn!(peer, "dropping a bad frame: {e}"),
            });
            // (As a validator task ends once all its links are gone.)
            s.done |= s.net.closed();
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
        let Slot { driver, net, deadline, done, .. } = &mut slots[k];
        if *done {
            continue;
        }
        if !driver.step(input, &mut |to, frame: &Frame| net.queue(to, frame)) {
            *done = true;
        }
        *deadline = driver.deadline();
        net.flush();
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
        (Link::new(1, ours).expect("link"), peer)
    }

    /// The whole frames read so far, decoded (a frame that does not decode is dropped).
    fn frames(link: &mut Link) -> Vec<Message> {
        let mut out = Vec::new();
        link.frames_raw(|f| out.extend(Message::decode(f, MAX_FRAME as usize).ok()));
        out
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
            assert!(frames(&mut link).is_empty(), "half a frame is not a frame");
            // The rest, then a frame that is not a message, then the message again.
            peer.write_all(&bytes[5..]).expect("write");
            peer.write_all(&[3, 0, 0, 0, 0xff, 0xff, 0xff]).expect("write");
            peer.write_all(&bytes).expect("write");
            read_until(&mut link, |l| l.inbound.len() >= 2 * bytes.len() + 7).await;
            let got = frames(&mut link);
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
            assert!(frames(&mut link).is_empty());
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
        let (rtt, a, b) =
            round_trip((0, Setup::Tcp(vec![(1, a)])), (1, Setup::Tcp(vec![(0, b)])), 20).expect("round trip");
        assert!(rtt > Duration::ZERO && rtt < Duration::from_millis(100), "{rtt:?}");
        let (Setup::Tcp(mut a), Setup::Tcp(mut b)) = (a, b) else { panic!("TCP in, TCP out") };
        let ((1, mut a), (0, mut b)) = (a.remove(0), b.remove(0)) else { panic!("each with its peer") };
        // Still connected, to each other.
        a.set_nonblocking(false).expect("blocking");
        b.set_nonblocking(false).expect("blocking");
        a.write_all(b"ok").expect("write");
        let mut got = [0u8; 2];
        b.read_exact(&mut got).expect("read");
        assert_eq!(&got, b"ok");
    }

    /// Two UDP sockets on loopback, each knowing the other as its one peer.
    fn udp_pair() -> (Setup, Setup) {
        let a = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let b = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let (aa, ba) = (a.local_addr().expect("addr"), b.local_addr().expect("addr"));
        (Setup::Udp(a, BTreeMap::from([(1, ba)])), Setup::Udp(b, BTreeMap::from([(0, aa)])))
    }

    #[test]
    fn the_round_trip_over_udp_is_measured_and_the_sockets_come_back() {
        let (a, b) = udp_pair();
        let (rtt, a, b) = round_trip((0, a), (1, b), 20).expect("round trip");
        assert!(rtt > Duration::ZERO && rtt < Duration::from_millis(100), "{rtt:?}");
        let (Setup::Udp(a, pa), Setup::Udp(b, _)) = (a, b) else { panic!("UDP in, UDP out") };
        a.set_nonblocking(false).expect("blocking");
        b.set_nonblocking(false).expect("blocking");
        a.send_to(b"ok", pa[&1]).expect("send");
        let mut got = [0u8; 8];
        let (n, from) = b.recv_from(&mut got).expect("recv");
        assert_eq!((&got[..n], from), (&b"ok"[..], a.local_addr().expect("addr")));
    }

    #[test]
    fn a_frame_longer_than_a_datagram_goes_in_pieces_and_comes_whole() {
        runtime().expect("runtime").block_on(async {
            let (a, b) = udp_pair();
            let (mut a, mut b) = (Net::new(a).expect("net"), Net::new(b).expect("net"));
            let long: Vec<u8> = (0..2 * PIECE + 123).map(|i| (i % 251) as u8).collect();
            // A datagram from a socket that is not a peer's, first: dropped.
            let Net::Udp(port) = &b else { panic!("a UDP net") };
            let stranger = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
            stranger.send_to(&[0, 0, 0, 0, 0, 0, 1, 0, 42], port.socket.local_addr().expect("addr")).expect("send");
            a.queue(Some(1), &long);
            a.queue(None, b"short");
            let mut got = Vec::new();
            let mut buf = vec![0u8; 1 << 16];
            let t = std::time::Instant::now();
            while got.len() < 2 {
                assert!(t.elapsed() < Duration::from_secs(1), "only {} frames came", got.len());
                turn(true).await;
                a.flush();
                b.receive(&mut buf, |from, f| got.push((from, f.to_vec())));
            }
            assert_eq!(got, vec![(0, long), (0, b"short".to_vec())]);
        });
    }

    #[test]
    fn bad_datagrams_and_strangers_are_dropped_and_partial_frames_are_bounded() {
        let mut port = port();
        assert_eq!(port.piece(1, &[1, 2, 3]), None, "shorter than a header");
        assert_eq!(port.piece(1, &datagram(0, 0, 0, b"x")), None, "no pieces");
        assert_eq!(port.piece(1, &datagram(0, 2, 2, b"x")), None, "a piece past the last");
        assert_eq!(port.piece(1, &datagram(0, 0, u16::MAX, b"x")), None, "more pieces than a frame may have");
        assert_eq!(port.piece(1, &datagram(7, 0, 1, b"whole")), Some(Cow::from(&b"whole"[..])));
        // Pieces out of order, a duplicate, and a piece that disagrees on the count.
        assert_eq!(port.piece(1, &datagram(8, 1, 2, b"lo")), None);
        assert_eq!(port.piece(1, &datagram(8, 1, 3, b"??")), None);
        assert_eq!(port.piece(1, &datagram(8, 1, 2, b"lo")), None);
        assert_eq!(port.piece(1, &datagram(8, 0, 2, b"hel")), Some(Cow::from(&b"hello"[..])));
        // A peer that never finishes its frames holds at most PARTIAL_MAX of them.
        for seq in 100..200 {
            assert_eq!(port.piece(1, &datagram(seq, 0, 2, b"half")), None);
        }
        assert_eq!(port.partial.len(), PARTIAL_MAX);
        assert!(port.partial.keys().all(|(_, seq)| *seq >= 200 - PARTIAL_MAX as u32), "the newest kept");
        // Nor more than PARTIAL_BYTES of pieces: two long frames, neither finished.
        let body = vec![5u8; PIECE];
        for seq in [300, 301] {
            for i in 0..150 {
                assert_eq!(port.piece(2, &datagram(seq, i, 280, &body)), None);
                assert!(port.held[&2] <= PARTIAL_BYTES, "{}", port.held[&2]);
            }
        }
        assert!(!port.partial.contains_key(&(2, 300)), "the older one dropped");
        assert_eq!(port.partial[&(2, 301)].1.len(), 150);
        assert_eq!(port.held[&2], 150 * PIECE);
    }

    /// One datagram of the pieces format.
    fn datagram(seq: u32, index: u16, count: u16, body: &[u8]) -> Vec<u8> {
        let mut d = seq.to_le_bytes().to_vec();
        d.extend_from_slice(&index.to_le_bytes());
        d.extend_from_slice(&count.to_le_bytes());
        d.extend_from_slice(body);
        d
    }

    fn port() -> Port {
        let (a, _) = udp_pair();
        match runtime().expect("runtime").block_on(async { Net::new(a) }) {
            Ok(Net::Udp(port)) => port,
            _ => panic!("a UDP net"),
        }
    }

    use proptest::prelude::Strategy;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Whatever peers send, taking it in never panics, and what is held for unfinished
        /// frames stays within its bounds (counted right: the tally matches the pieces held).
        #[test]
        fn any_datagrams_leave_the_pieces_held_bounded(
            sent in proptest::collection::vec(
                (0u16..3, proptest::prop_oneof![
                    proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
                    (0u32..40, 0u16..8, 0u16..8, 0usize..3000)
                        .prop_map(|(seq, i, n, len)| datagram(seq, i, n, &vec![7; len])),
                    (0u32..40, 0u16..300, 200u16..300)
                        .prop_map(|(seq, i, n)| datagram(seq, i, n, &[9; 60_000])),
                ]),
                0..200,
            )
        ) {
            let mut port = port();
            for (peer, d) in &sent {
                if let Some(frame) = port.piece(*peer, d) {
                    proptest::prop_assert!(frame.len() <= 300 * 65_536);
                }
                for p in 0..3u16 {
                    let held: usize = port
                        .partial
                        .iter()
                        .filter(|((q, _), _)| *q == p)
                        .map(|(_, (_, got))| got.values().map(Vec::len).sum::<usize>())
                        .sum();
                    proptest::prop_assert_eq!(held, port.held.get(&p).copied().unwrap_or(0));
                    proptest::prop_assert!(held <= PARTIAL_BYTES);
                    proptest::prop_assert!(port.partial.keys().filter(|(q, _)| *q == p).count() <= PARTIAL_MAX);
                }
            }
        }

        /// A frame's pieces in any order, some twice, among another peer's pieces, make the
        /// frame once its last piece is in, and not before.
        #[test]
        fn pieces_in_any_order_make_the_frame_when_the_last_comes(
            frame in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            cuts in 1usize..6,
            order in proptest::collection::vec(0usize..100, 1..12),
        ) {
            let size = frame.len().div_ceil(cuts).max(1);
            let parts: Vec<&[u8]> = if frame.is_empty() { vec![&[][..]] } else { frame.chunks(size).collect() };
            let n = parts.len();
            let mut idx: Vec<usize> = (0..n).collect();
            for (k, o) in order.iter().enumerate() {
                idx.swap(k % n, o % n);
            }
            // Every piece but the last drawn, some of them again, then the last.
            let mut sent: Vec<usize> = idx[..n - 1].to_vec();
            if n > 1 {
                sent.extend(order.iter().map(|o| idx[o % (n - 1)]));
            }
            sent.push(idx[n - 1]);
            let mut port = port();
            let mut made = Vec::new();
            for (k, &i) in sent.iter().enumerate() {
                let other = datagram(5, 0, 2, b"other");
                proptest::prop_assert_eq!(port.piece(2, &other), None);
                if let Some(f) = port.piece(1, &datagram(77, i as u16, n as u16, parts[i])) {
                    made.push((k, f.into_owned()));
                }
            }
            proptest::prop_assert_eq!(made, vec![(sent.len() - 1, frame)]);
            proptest::prop_assert_eq!(port.held.get(&1).copied().unwrap_or(0), 0);
        }
    }
}
