//! Length-prefixed frames over tokio streams (`bench agreement`'s plain TCP between validators;
//! the node's mesh frames its libp2p streams the same way, in `net`).

use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

pub use crate::net::MAX_FRAME;

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
