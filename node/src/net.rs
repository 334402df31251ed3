//! The validators' mesh: one long-lived TCP stream per pair of validators, length-prefixed
//! consensus messages on it. The lower index accepts, the higher dials (and dials again after a
//! peer restarts); the dialer's first frame says which validator it is.
//!
//! This is the interim transport; libp2p (QUIC, TCP + noise + yamux) replaces it under the same
//! interface (DESIGN §11). Messages carry their own signatures (votes, proposals, events), so a
//! peer that lies about its index gains nothing but being ignored; the streams are not encrypted.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metatopia_consensus::ValidatorIndex;

use crate::wire::NodeMsg;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Largest frame accepted from a peer.
pub const MAX_FRAME: u32 = 16 << 20;

/// Per peer: the connection's number and its writer (a reconnect replaces both).
type Writers = Arc<Mutex<BTreeMap<u16, (u64, mpsc::UnboundedSender<Arc<Vec<u8>>>)>>>;

static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// This node's side of the mesh.
#[derive(Debug, Clone)]
pub struct Mesh {
    writers: Writers,
    me: u16,
}

impl Mesh {
    /// Listen on `listen`, dial every peer with a higher index, and hand inbound messages to the
    /// returned channel.
    pub async fn start(
        me: u16,
        listen: SocketAddr,
        peers: Vec<SocketAddr>,
    ) -> anyhow::Result<(Mesh, mpsc::UnboundedReceiver<(ValidatorIndex, NodeMsg)>)> {
        let listener = TcpListener::bind(listen).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let mesh = Mesh { writers: Arc::default(), me };
        {
            let mesh = mesh.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((mut stream, _)) = listener.accept().await else { continue };
                    let mesh = mesh.clone();
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let Ok(Ok(hello)) = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut stream)).await
                        else {
                            return;
                        };
                        let Ok(peer) = <[u8; 2]>::try_from(hello.as_slice()).map(u16::from_le_bytes) else { return };
                        mesh.serve(peer, stream, tx);
                    });
                }
            });
        }
        for (j, addr) in peers.into_iter().enumerate() {
            let j = j as u16;
            if j <= me {
                continue;
            }
            let mesh = mesh.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    if let Ok(mut s) = TcpStream::connect(addr).await
                        && write_frame(&mut s, &me.to_le_bytes()).await.is_ok()
                    {
                        let closed = mesh.serve(j, s, tx.clone());
                        let _ = closed.await;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        }
        Ok((mesh, rx))
    }

    /// Run a connection with `peer`; the returned receiver fires when it closes.
    fn serve(
        &self,
        peer: u16,
        stream: TcpStream,
        inbox: mpsc::UnboundedSender<(ValidatorIndex, NodeMsg)>,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let _ = stream.set_nodelay(true);
        let (mut r, w) = stream.into_split();
        let (wtx, wrx) = mpsc::unbounded_channel::<Arc<Vec<u8>>>();
        let conn = CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.writers.lock().expect("not poisoned").insert(peer, (conn, wtx));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(write_frames(w, wrx));
        let writers = self.writers.clone();
        tokio::spawn(async move {
            while let Ok(frame) = read_frame(&mut r).await {
                metrics::counter!("metatopia_net_bytes_in_total").increment(frame.len() as u64 + 4);
                match NodeMsg::decode(&frame, MAX_FRAME as usize) {
                    Ok(m) => {
                        if inbox.send((ValidatorIndex(peer), m)).is_err() {
                            break;
                        }
                    }
                    Err(e) => tracing::warn!(peer, "dropping a bad frame: {e}"),
                }
            }
            let mut w = writers.lock().expect("not poisoned");
            if w.get(&peer).is_some_and(|(c, _)| *c == conn) {
                w.remove(&peer);
            }
            drop(w);
            let _ = done_tx.send(());
        });
        done_rx
    }

    pub fn send(&self, to: u16, msg: &NodeMsg) {
        if to == self.me {
            return;
        }
        if let Some((_, w)) = self.writers.lock().expect("not poisoned").get(&to) {
            let frame = msg.encode();
            metrics::counter!("metatopia_net_bytes_out_total").increment(frame.len() as u64 + 4);
            let _ = w.send(Arc::new(frame));
        }
    }

    pub fn broadcast(&self, msg: &NodeMsg) {
        let frame = Arc::new(msg.encode());
        let writers = self.writers.lock().expect("not poisoned");
        metrics::counter!("metatopia_net_bytes_out_total").increment((frame.len() as u64 + 4) * writers.len() as u64);
        for (_, w) in writers.values() {
            let _ = w.send(frame.clone());
        }
    }

    /// Peers connected now.
    pub fn connected(&self) -> usize {
        self.writers.lock().expect("not poisoned").len()
    }
}

/// Write queued frames to `w` until the queue closes or the stream fails, flushing once per
/// burst (whatever is queued goes out in one write).
pub async fn write_frames(w: impl AsyncWriteExt + Unpin, mut queue: mpsc::UnboundedReceiver<Arc<Vec<u8>>>) {
    let mut w = BufWriter::new(w);
    while let Some(f) = queue.recv().await {
        if write_frame(&mut w, &f).await.is_err() {
            return;
        }
        while let Ok(f) = queue.try_recv() {
            if write_frame(&mut w, &f).await.is_err() {
                return;
            }
        }
        if w.flush().await.is_err() {
            return;
        }
    }
}

/// One length-prefixed frame (u32 LE length, at most [`MAX_FRAME`] bytes).
pub async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> anyhow::Result<Vec<u8>> {
    let len = r.read_u32_le().await?;
    anyhow::ensure!(len <= MAX_FRAME, "a frame of {len} bytes is over the limit");
    let mut buf = vec![0; len as usize];
    r.read_exact(&mut buf).await?;
    Ok(buf)
}

pub async fn write_frame(w: &mut (impl AsyncWriteExt + Unpin), f: &[u8]) -> std::io::Result<()> {
    w.write_u32_le(f.len() as u32).await?;
    w.write_all(f).await
}
