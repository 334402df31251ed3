//! Length-prefixed frames over tokio streams (`bench agreement`'s plain TCP between validators;
//! the node's mesh frames its libp2p streams the same way, in `net`), and busy-polling for the
//! runtimes that read them ([`busy`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

/// Largest frame accepted from a peer.
pub const MAX_FRAME: u32 = 16 << 20;

/// Write queued frames to `w` until the queue closes or the stream fails, flushing once per
/// burst (whatever is queued goes out in one write).
pub async fn write_frames(w: impl AsyncWriteExt + Unpin, queue: mpsc::UnboundedReceiver<Arc<Vec<u8>>>) {
    write_outbox(w, Inbox { queue, queued: Arc::default() }).await;
}

/// The bytes a peer's [`Outbox`] holds at most (more only as its one frame): a peer that reads
/// slower than frames come for it loses the newest frames, not this node its memory.
pub const MAX_QUEUED: u64 = 2 * MAX_FRAME as u64;

/// A peer's queue of frames to write, bounded in bytes ([`MAX_QUEUED`]).
#[derive(Clone, Debug)]
pub struct Outbox {
    queue: mpsc::UnboundedSender<Arc<Vec<u8>>>,
    queued: Arc<AtomicU64>,
}

/// The writing end of an [`Outbox`] ([`write_outbox`]).
#[derive(Debug)]
pub struct Inbox {
    queue: mpsc::UnboundedReceiver<Arc<Vec<u8>>>,
    queued: Arc<AtomicU64>,
}

/// A bounded queue of frames for one peer.
pub fn outbox() -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicU64::new(0));
    (Outbox { queue: tx, queued: queued.clone() }, Inbox { queue: rx, queued })
}

impl Outbox {
    /// Queue a frame; `false` (and the frame dropped) when the queue holds [`MAX_QUEUED`] bytes
    /// with it, or its writer has gone. An empty queue takes any frame.
    pub fn push(&self, frame: Arc<Vec<u8>>) -> bool {
        let len = frame.len() as u64;
        let held = self.queued.load(Ordering::Relaxed);
        if held > 0 && held + len > MAX_QUEUED {
            return false;
        }
        self.queued.fetch_add(len, Ordering::Relaxed);
        self.queue.send(frame).is_ok()
    }

    /// The bytes queued and not yet written.
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }
}

impl Inbox {
    /// The same queue with its frames passed through `stage` first (the mesh's test delay):
    /// they count as queued until written.
    pub fn through(
        self,
        stage: impl FnOnce(mpsc::UnboundedReceiver<Arc<Vec<u8>>>) -> mpsc::UnboundedReceiver<Arc<Vec<u8>>>,
    ) -> Inbox {
        Inbox { queue: stage(self.queue), queued: self.queued }
    }
}

/// [`write_frames`] from an [`Outbox`]'s queue, counting each frame out once written.
pub async fn write_outbox(w: impl AsyncWriteExt + Unpin, mut inbox: Inbox) {
    let mut w = BufWriter::new(w);
    let written = |f: &Arc<Vec<u8>>| inbox.queued.fetch_sub(f.len() as u64, Ordering::Relaxed);
    while let Some(f) = inbox.queue.recv().await {
        if write_frame(&mut w, &f).await.is_err() {
            return;
        }
        written(&f);
        while let Ok(f) = inbox.queue.try_recv() {
            if write_frame(&mut w, &f).await.is_err() {
                return;
            }
            written(&f);
        }
        if w.flush().await.is_err() {
            return;
        }
    }
}

/// One length-prefixed frame (u32 LE length, at most [`MAX_FRAME`] bytes). The buffer grows
/// as the bytes arrive: a peer that sends a large length and little else costs at most
/// `FIRST_READ` bytes, not the length it claims.
pub async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> Result<Vec<u8>, FrameError> {
    let len = r.read_u32_le().await?;
    if len > MAX_FRAME {
        return Err(FrameError::TooLong(len));
    }
    let mut buf = Vec::with_capacity((len as usize).min(FIRST_READ));
    let got = r.take(u64::from(len)).read_to_end(&mut buf).await?;
    if got != len as usize {
        return Err(FrameError::Short { got, len });
    }
    Ok(buf)
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("reading: {0}")]
    Io(#[from] std::io::Error),
    #[error("a frame of {0} bytes is over the limit")]
    TooLong(u32),
    #[error("the stream ended {got} bytes into a frame of {len}")]
    Short { got: usize, len: u32 },
}

/// What a frame's buffer starts at (it grows as the frame's bytes come).
const FIRST_READ: usize = 64 << 10;

pub async fn write_frame(w: &mut (impl AsyncWriteExt + Unpin), f: &[u8]) -> std::io::Result<()> {
    w.write_u32_le(f.len() as u32).await?;
    w.write_all(f).await
}

/// Await `f`; with `spin`, without sleeping: between polls of `f` the thread does not wait in
/// the kernel for a socket or timer to be ready, it yields to its runtime's other tasks
/// (which then polls its sockets and timers at once) and then its core to any other thread
/// that wants it. A message is then picked up at the receiver's next turn instead of after
/// the wake-up of a thread asleep on an idle core: in the VMs of our 2-vCPU machines that
/// wake-up took 50-100 µs of every hop (an idle vCPU halts at once there, and waking it is
/// the hypervisor's work). The price is the thread's whole core, all the time, as with any
/// busy-polling runtime (DPDK's, Seastar's): for machines whose cores are their validator's.
pub async fn busy<F: std::future::Future>(f: F, spin: bool) -> F::Output {
    if !spin {
        return f.await;
    }
    tokio::pin!(f);
    loop {
        tokio::select! {
            biased;
            out = &mut f => return out,
            () = tokio::task::yield_now() => {
                // (Fails only where the OS has no such call: the turn is then shorter.)
                let _ = nix::sched::sched_yield();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer that does not read holds at most `MAX_QUEUED` bytes of this node's memory; once
    /// its frames are written the queue takes more again.
    #[tokio::test]
    async fn a_peers_queue_is_bounded_in_bytes_and_drains_as_it_is_written() {
        let (out, inbox) = outbox();
        let big = Arc::new(vec![7u8; MAX_FRAME as usize]);
        assert!(out.push(big.clone()), "an empty queue takes any frame");
        assert!(out.push(big.clone()), "two of the largest fit");
        assert!(!out.push(big.clone()), "a third is dropped");
        assert!(!out.push(Arc::new(vec![1; 10])), "so is anything more");
        assert_eq!(out.queued(), 2 * u64::from(MAX_FRAME));
        // The writer takes them (a sink that reads everything).
        let writer = tokio::spawn(write_outbox(tokio::io::sink(), inbox));
        let t0 = std::time::Instant::now();
        while out.queued() > 0 {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{} bytes still queued", out.queued());
            tokio::task::yield_now().await;
        }
        assert!(out.push(big));
        drop(out);
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn frames_round_trip_and_a_short_one_is_an_error_not_a_big_allocation() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello").await.unwrap();
        assert_eq!(read_frame(&mut wire.as_slice()).await.unwrap(), b"hello");
        // A header that claims the largest frame, then ten bytes and the end of the stream.
        let mut short = MAX_FRAME.to_le_bytes().to_vec();
        short.extend_from_slice(&[7; 10]);
        let e = read_frame(&mut short.as_slice()).await.unwrap_err().to_string();
        assert!(e.contains("ended 10 bytes into a frame"), "{e}");
        let over = (MAX_FRAME + 1).to_le_bytes();
        assert!(read_frame(&mut over.as_slice()).await.unwrap_err().to_string().contains("over the limit"));
    }
}
