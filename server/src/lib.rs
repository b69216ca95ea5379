//! oscontent-server: publishes an oscontainer's ostree repo as a complete
//! ostree remote over HTTP. See ARCHITECTURE.md for the code map.

pub mod cli;
pub mod conditional;
pub mod fsutil;
pub mod http;
pub mod images;
pub mod metrics;
pub mod mirror;
pub mod publish;
pub mod serve;
pub mod served;
pub mod signing;
pub mod source;
pub mod state;

pub use http::{app, AppState, HttpConfig};

use std::future::Future;

/// Serves `state` on `listener` (HTTP/1.1 keep-alive, and HTTP/2 with prior
/// knowledge on the same port) until `shutdown` resolves, then stops
/// accepting and lets in-flight requests finish.
pub async fn run(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    // Without TCP_NODELAY, Nagle plus the client's delayed ACK adds ~40 ms to
    // every small response on a keep-alive connection (ostree's curl sends
    // requests one after another on few connections).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
    });
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}
