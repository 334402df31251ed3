//! The one place `sim` uses threads: a scoped, order-preserving parallel map.
//!
//! Parallelism never changes results (DESIGN §5): work is split into contiguous chunks and the
//! outputs are concatenated in input order, never in completion order.

/// Apply `f` to contiguous chunks of `items` on up to `workers` threads (chunks of at least
/// `min_chunk` items) and concatenate the results in input order.
pub fn map_chunks<T, R, F>(items: &[T], workers: u32, min_chunk: usize, f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&[T]) -> Vec<R> + Sync,
{
    let workers = workers.max(1) as usize;
    if workers == 1 || items.len() <= min_chunk.max(1) {
        return f(items);
    }
    let chunk = items.len().div_ceil(workers).max(min_chunk.max(1));
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items.chunks(chunk).map(|c| scope.spawn(move || f(c))).collect();
        let mut out = Vec::with_capacity(items.len());
        for h in handles {
            match h.join() {
                Ok(part) => out.extend(part),
                // A panic in a worker is a bug in sim code; surface it on the caller's thread.
                Err(payload) => std::panic::resume_unwind(payload),
            }
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_input_order_for_any_worker_count() {
        let items: Vec<u32> = (0..10_000).collect();
        let expect: Vec<u64> = items.iter().map(|&i| u64::from(i) * 3).collect();
        for workers in [1, 2, 3, 8, 64] {
            let got = map_chunks(&items, workers, 16, |c| c.iter().map(|&i| u64::from(i) * 3).collect());
            assert_eq!(got, expect, "workers = {workers}");
        }
    }
}
