//! Length-prefixed frames over tokio streams (`bench agreement`'s plain TCP between validators;
//! the node's mesh frames its libp2p streams the same way, in `net`), and busy-polling for the
//! runtimes that read them ([`busy`]).

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

/// Largest frame accepted from a peer.
pub const MAX_FRAME: u32 = 16 << 20;

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

/// One length-prefixed frame (u32 LE length, at most [`MAX_FRAME`] bytes). The buffer grows
/// as the bytes arrive: a peer that sends a large length and little else costs at most
/// [`FIRST_READ`] bytes, not the length it claims.
pub async fn read_frame(r: &mut (impl AsyncReadExt + Unpin)) -> anyhow::Result<Vec<u8>> {
    let len = r.read_u32_le().await?;
    anyhow::ensure!(len <= MAX_FRAME, "a frame of {len} bytes is over the limit");
    let mut buf = Vec::with_capacity((len as usize).min(FIRST_READ));
    let got = r.take(u64::from(len)).read_to_end(&mut buf).await?;
    anyhow::ensure!(got == len as usize, "the stream ended {got} bytes into a frame of {len}");
    Ok(buf)
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
