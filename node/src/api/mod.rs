//! What a node serves to people and programs: [`http`] (health, readiness, metrics, the JSON API
//! of `stats` and `admin`, event submission), [`gateway`] (the client service: the web viewer's
//! WebSocket and the native clients' QUIC) and [`hub`] (what the node's loop feeds them).

pub mod gateway;
pub mod http;
pub mod hub;

use std::net::SocketAddr;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::get;

use crate::core::MAX_EVENT_BYTES;
use http::Service;

/// Every route: the HTTP API and the WebSocket gateway.
pub fn router(service: Service) -> Router {
    http::routes()
        .route("/v1/ws", get(gateway::upgrade))
        .layer(DefaultBodyLimit::max(MAX_EVENT_BYTES as usize))
        .with_state(service)
}

/// Serve until `stop` resolves, on the runtime `rt` (the node's client runtime: its connections
/// never share threads with the agreement's mesh).
pub fn serve(
    rt: &tokio::runtime::Handle,
    addr: SocketAddr,
    service: Service,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let listener = {
        let _in = rt.enter();
        tokio::net::TcpListener::from_std(listener)?
    };
    let app = router(service);
    // Small messages (a viewer's pong, a tick's delta) go out at once, not held for the
    // client's acknowledgement of the previous one (Nagle's algorithm): on a long path that
    // hold costs up to a round trip and a delayed ACK.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY on a client's connection: {e}");
        }
    });
    let task = rt.spawn(async move {
        if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop).await {
            tracing::error!(error = %e, "the HTTP service stopped");
        }
    });
    Ok((bound, task))
}
