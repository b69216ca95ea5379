//! Ctrl-C handling: signals become a flag that every wait loop polls, so
//! the `Drop`s that unmount, detach and kill still run.

use anyhow::{bail, Context, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

static INTERRUPTED: OnceLock<Arc<AtomicBool>> = OnceLock::new();

/// Turns SIGINT, SIGTERM and SIGHUP into a flag that [`check_interrupted`]
/// reports, instead of killing the process before its `Drop`s run (which
/// would leave mounts and loop devices behind). A second signal while the
/// first is being handled exits at once (status 1), for a stuck cleanup.
/// Idempotent.
pub fn interrupt() -> Result<()> {
    if INTERRUPTED.get().is_some() {
        return Ok(());
    }
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        // Order matters: the conditional shutdown sees the flag as the
        // previous signal left it.
        signal_hook::flag::register_conditional_shutdown(sig, 1, Arc::clone(&flag))
            .context("installing a signal handler")?;
        signal_hook::flag::register(sig, Arc::clone(&flag))
            .context("installing a signal handler")?;
    }
    let _ = INTERRUPTED.set(flag);
    Ok(())
}

/// Whether a signal arrived since [`interrupt`].
pub fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(Ordering::Relaxed))
}

/// An error if a signal arrived: call it in every wait loop.
pub fn check_interrupted() -> Result<()> {
    if interrupted() {
        bail!("interrupted; cleaning up");
    }
    Ok(())
}

/// Sleeps `d` in short steps, returning early with an error on a signal.
pub fn sleep(d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    loop {
        check_interrupted()?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}
