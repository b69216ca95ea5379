//! The listener's threads: nginx's shape, not a work-stealing pool. Each
//! worker is an OS thread with a single-threaded runtime that accepts from
//! its own descriptor of the one listening socket and serves what it
//! accepted until the connection closes. A connection's tasks, timers and
//! wake-ups then stay on one thread: with tokio's multi-threaded runtime,
//! every wake-up could hand a task to the other core (futex waits,
//! stealing, 14-15 context switches a pull), and a 32-node delta wave cost
//! 1.3× nginx's CPU (`cargo xtask bench fleet`, HISTORY.md).
//!
//! The socket is shared rather than bound once per worker with
//! `SO_REUSEPORT`: that would let any later process of the same user bind
//! the same port and silently take a share of the connections, where one
//! socket makes a second server fail with "address in use", as before. An
//! idle worker wakes for each new connection and finds it taken (one
//! `accept4` that returns `EAGAIN`); a new connection goes to whichever
//! worker is free first, so a busy one is not handed more.

use super::Shared;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};

/// tokio's default for one runtime's blocking pool, here split across the
/// workers so that the process's bound stays what it was (up to 32
/// workers; past that, each keeps the floor below).
const BLOCKING_THREADS: usize = 512;
/// The least blocking pool a worker gets, however many there are.
const MIN_BLOCKING_THREADS: usize = 16;

/// Serves on `workers` threads until `shutdown`, then has each stop
/// accepting and waits for all their connections to finish. A worker that
/// ends before that (it could not start, or panicked) is the error at once.
pub(super) async fn run(
    listener: TcpListener,
    workers: NonZeroUsize,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Off this runtime's reactor: each worker registers its own copy with
    // its own.
    let listener = listener.into_std()?;
    let (stop, stopping) = watch::channel(false);
    let (done_tx, mut done) = mpsc::unbounded_channel();
    let blocking = (BLOCKING_THREADS / workers.get()).max(MIN_BLOCKING_THREADS);
    for i in 0..workers.get() {
        let mine = listener.try_clone()?;
        let (shared, stopping, done_tx) = (shared.clone(), stopping.clone(), done_tx.clone());
        std::thread::Builder::new()
            .name(format!("http-{i}"))
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    worker(i, mine, blocking, shared, stopping)
                }))
                .unwrap_or_else(|_| {
                    Err(std::io::Error::other(format!("HTTP worker {i} panicked")))
                });
                let _ = done_tx.send(r);
            })?;
    }
    drop(done_tx);
    drop(listener);
    tokio::pin!(shutdown);
    tokio::select! {
        () = &mut shutdown => {}
        Some(r) = done.recv() => {
            // It could not start, or it panicked: serving on fewer threads
            // than asked is not what was asked. Returning drops `stop`,
            // which has the others stop accepting too.
            return Err(r.err().unwrap_or_else(|| {
                std::io::Error::other("an HTTP worker stopped unasked")
            }));
        }
    }
    let _ = stop.send(true);
    // Every worker reports once, after its last connection closed.
    let mut result = Ok(());
    while let Some(r) = done.recv().await {
        if result.is_ok() {
            result = r;
        }
    }
    result
}

/// One worker: its runtime, serving until `stopping` and every connection
/// it accepted has ended.
fn worker(
    i: usize,
    listener: std::net::TcpListener,
    blocking: usize,
    shared: Arc<Shared>,
    stopping: watch::Receiver<bool>,
) -> std::io::Result<()> {
    // Sockets and timers only: the signal and process drivers (the main
    // runtime's, `serve::signals`) would be checked at every wake.
    let idle = shared.app.idle.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(blocking)
        .thread_name(format!("http-{i}-blocking"))
        // Writes the access log's queued lines (`http/access_log.rs`).
        .on_thread_park(move || idle())
        .build()?;
    let r = rt.block_on(async move {
        let listener = TcpListener::from_std(listener)?;
        super::accept_loop(listener, shared, stopping).await;
        Ok(())
    });
    // Its connections have ended; a blocking read still running for one
    // that was cut off must not hold the thread.
    rt.shutdown_background();
    r
}
