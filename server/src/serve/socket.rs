//! The HTTP side of `serve` on one socket: the router (`http`) behind our
//! own listener (`listen`), which owns the connection reasons it counts.

use crate::http::{self, AppState};
use crate::listen;
use std::future::Future;
use std::sync::Arc;

/// Serves `state` on `listener` (HTTP/1.1 keep-alive, and HTTP/2 with prior
/// knowledge on the same port) from `workers` threads under `limits` until
/// `shutdown` resolves, then stops accepting and lets in-flight requests
/// finish.
pub async fn run(
    listener: tokio::net::TcpListener,
    workers: std::num::NonZeroUsize,
    state: AppState,
    limits: listen::limits::Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let metrics = state.metrics.clone();
    metrics.connections.name_reasons(
        &listen::limits::Refusal::ALL.map(listen::limits::Refusal::label),
        &listen::watch::Expiry::ALL.map(listen::watch::Expiry::label),
    );
    let saturation = state.saturation.clone();
    let idle = state.clone();
    let app = listen::App::new(
        http::app(state.clone()),
        state,
        Arc::new(move || idle.idle()),
    );
    listen::serve(
        listener,
        workers,
        app,
        (limits, saturation),
        metrics,
        shutdown,
    )
    .await
}
