//! The threads of a node besides its loop: the client service's runtime, at a lower priority.

use anyhow::Context;

/// How much lower than the node's own threads (its loop: agreement and execution; its mesh) the
/// threads serving clients run, in `nice` steps: on a machine short of cores a vote or a block
/// waits less behind a crowd's deltas (at 5, the scheduler gives the loop about three quarters
/// of a core the two contend for). With 1,000 clients on four nodes sharing two cores, nice 5
/// halved the agreement's commit latency and kept the logins; at 10 the sessions starved and a
/// tenth of the logins timed out (`docs/benchmarks.md`).
pub const CLIENT_THREADS_NICE: i32 = 5;

/// The runtime of node `i`'s client service (the HTTP API, the WebSocket and QUIC gateways,
/// every session's deltas): its own threads, at [`CLIENT_THREADS_NICE`], so that the client
/// fan-out never shares a run queue with the mesh's tasks nor a core on equal terms with the loop.
pub(crate) fn client_runtime(i: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    // The caller's priority (the node's thread) is the base: a thread the runtime starts from
    // one of its own (a blocking task's) inherits the lowered one and is set to the same.
    let node = rustix::process::getpriority_process(None).unwrap_or(0);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(format!("node-{i}-clients"))
        .on_thread_start(move || {
            // Linux keeps a nice value per thread; raising it needs no privilege.
            if let Err(e) = rustix::process::setpriority_process(None, node + CLIENT_THREADS_NICE) {
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
        let rt = client_runtime(0).unwrap();
        let nice = || rustix::process::getpriority_process(None).unwrap();
        let (worker, blocking) = rt.block_on(async move {
            let worker = tokio::spawn(async move { nice() }).await.unwrap();
            (worker, tokio::task::spawn_blocking(nice).await.unwrap())
        });
        // Nice values stop at 19.
        let lowered = (own + CLIENT_THREADS_NICE).min(19);
        assert_eq!(worker, lowered, "the node's thread is at {own}");
        assert_eq!(blocking, lowered, "a blocking task's thread, started by a worker");
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), own, "the caller's own priority is untouched");
    }
}
