//! oscontent-server: publishes an oscontainer's ostree repo as a complete
//! ostree remote over HTTP. See ARCHITECTURE.md for the code map.

pub mod cache;
pub mod cli;
pub mod clients;
/// The Range and conditional request headers (in `oscontent-parse`, which
/// the fuzz targets build).
pub use oscontent_parse::conditional;
pub mod deltas;
pub mod fsutil;
pub mod http;
pub mod images;
pub mod listen;
pub mod metrics;
pub mod mirror;
pub mod prepared;
pub mod publish;
pub mod redact;
pub mod redirect;
pub mod serve;
pub mod served;
pub mod signing;
pub mod slots;
pub mod source;
pub mod state;
pub mod verify;

pub use http::{app, AppState, HttpConfig};

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
    let saturation = state.saturation.clone();
    let idle = state.clone();
    let app = listen::App::new(app(state.clone()), state, Arc::new(move || idle.idle()));
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
