//! The one place `sim` uses threads: an order-preserving parallel map over chunks.
//!
//! Parallelism never changes results (DESIGN §5): work is split into contiguous chunks and the
//! outputs are concatenated in input order, never in completion order.
//!
//! The chunks run on rayon's pool, whose threads stay up between ticks. Spawning threads per
//! stage (the first version) cost about 150 µs a spawn here, and a freshly spawned thread
//! often ran on its parent's core, so two "parallel" chunks ran one after the other.
//!
//! Waking a sleeping pool thread from outside the pool is not free either (on these VMs: p50
//! 15–60 µs, p90 150 µs, `cargo run --release -p metatopia-sim --example parallel`), so a
//! whole stage sequence enters the pool once ([`on_pool`]); inside it the calling thread works
//! on its own chunk while the others are stolen, so a late wake-up costs nothing but the help.

use rayon::prelude::*;

/// Run `f` on a thread of the pool when `workers > 1` (one hand-over; the parallel stages
/// inside then start at once), or right here.
pub fn on_pool<R: Send>(workers: u32, f: impl FnOnce() -> R + Send) -> R {
    if workers <= 1 || rayon::current_thread_index().is_some() {
        return f();
    }
    rayon::scope(|_| f())
}

/// Apply `f` to contiguous chunks of `items` (at most `workers` chunks, each of at least
/// `min_chunk` items) in parallel and concatenate the results in input order. `workers`
/// decides the split; the pool (one thread per core) decides how many run at once.
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
    let parts: Vec<Vec<R>> = items.par_chunks(chunk).map(&f).collect();
    let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for part in parts {
        out.extend(part);
    }
    out
}

/// Run `f` on every job, `workers` at a time at most (in any order: each job owns what it
/// writes, so the order cannot change a result).
pub fn for_each<J, F>(jobs: Vec<J>, workers: u32, f: F)
where
    J: Send,
    F: Fn(J) + Sync + Send,
{
    if workers <= 1 || jobs.len() <= 1 {
        jobs.into_iter().for_each(f);
    } else {
        jobs.into_par_iter().with_max_len(1).for_each(f);
    }
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
