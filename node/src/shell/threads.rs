//! The threads of a node besides its loop: the client service's runtime, at a chosen priority.

use anyhow::Context;

/// The runtime of node `i`'s client service (the HTTP API, the WebSocket and QUIC gateways,
/// every session's deltas): its own threads, so that the client fan-out never shares a tokio run
/// queue with the mesh's tasks, at `nice` steps below the node's thread (`run --client-nice`).
/// With 1,000 clients on four nodes sharing two cores, 5 steps cut the agreement's commit
/// latency by a third with the bots inside the devnet's process, and starved a fifth of the
/// sessions with the bots in a process of their own (`docs/benchmarks.md`): a choice for the
/// operator, 0 by default.
pub(crate) fn client_runtime(i: usize, nice: i32) -> anyhow::Result<tokio::runtime::Runtime> {
    // The caller's priority (the node's thread) is the base: a thread the runtime starts from
    // one of its own (a blocking task's) inherits the lowered one and is set to the same.
    let node = rustix::process::getpriority_process(None).unwrap_or(0);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(format!("node-{i}-clients"))
        .on_thread_start(move || {
            // Linux keeps a nice value per thread; raising it needs no privilege.
            if nice > 0
                && let Err(e) = rustix::process::setpriority_process(None, node + nice)
            {
                tracing::debug!("lowering a client thread's priority: {e}");
            }
        })
        .enable_all()
        .build()
        .context("starting the client service's threads")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_services_threads_run_at_a_lower_priority_than_the_node() {
        let own = rustix::process::getpriority_process(None).unwrap();
        let rt = client_runtime(0, 5).unwrap();
        let nice = || rustix::process::getpriority_process(None).unwrap();
        let (worker, blocking) = rt.block_on(async move {
            let worker = tokio::spawn(async move { nice() }).await.unwrap();
            (worker, tokio::task::spawn_blocking(nice).await.unwrap())
        });
        // Nice values stop at 19.
        let lowered = (own + 5).min(19);
        assert_eq!(worker, lowered, "the node's thread is at {own}");
        assert_eq!(blocking, lowered, "a blocking task's thread, started by a worker");
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), own, "the caller's own priority is untouched");
    }
}
