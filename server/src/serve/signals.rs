//! The signals `serve` handles.

use anyhow::{Context, Result};
use std::sync::Arc;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::Notify;

/// SIGTERM and SIGINT, both meaning "drain and exit"; SIGHUP, meaning
/// "check the source now", is forwarded to `hup` for as long as the
/// process runs.
pub(super) struct Signals {
    term: Signal,
    int: Signal,
    pub hup: Arc<Notify>,
}

impl Signals {
    pub fn install() -> Result<Self> {
        let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        let hup = Arc::new(Notify::new());
        let notify = hup.clone();
        tokio::spawn(async move {
            while sighup.recv().await.is_some() {
                // notify_one stores a permit: a SIGHUP during a fetch is not lost.
                notify.notify_one();
            }
        });
        Ok(Self {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            hup,
        })
    }

    /// Waits for SIGTERM or SIGINT.
    pub async fn stopped(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
