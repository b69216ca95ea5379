//! What a pull tells its operator: `--json` line-delimited events on
//! stdout (each a JSON object with an `"event"` field), or an indicatif
//! progress bar on a TTY, or a few plain lines otherwise.

use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Progress lines in `--json` mode are at most this frequent.
pub const JSON_PROGRESS_INTERVAL: Duration = Duration::from_millis(500);
/// Progress bar refresh.
pub const BAR_INTERVAL: Duration = Duration::from_millis(100);

/// How to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Json,
    /// Progress bar if stderr is a terminal, else plain lines.
    Human,
}

/// Object counters for progress.
#[derive(Debug, Default)]
pub struct Progress {
    /// Objects found missing locally and queued to fetch.
    pub needed: AtomicU64,
    /// Objects fetched, verified and written.
    pub written: AtomicU64,
    /// Objects found already present locally (not fetched).
    pub present: AtomicU64,
    pub metadata_written: AtomicU64,
    pub content_written: AtomicU64,
    /// Present objects checked because an interrupted pull may have left
    /// them torn, and those of them found damaged (fetched again).
    pub rechecked: AtomicU64,
    pub repaired: AtomicU64,
}

#[derive(Debug)]
pub struct Reporter {
    output: Output,
    bar: Option<indicatif::ProgressBar>,
    out: Mutex<std::io::Stdout>,
    started: Instant,
    /// The last failure that was retried: what a pull that runs out of
    /// time was waiting on.
    last_retry: Mutex<Option<String>>,
}

impl Reporter {
    pub fn new(output: Output) -> Self {
        let bar = (output == Output::Human && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::with_draw_target(
                Some(0),
                indicatif::ProgressDrawTarget::stderr_with_hz(10),
            );
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} objects {msg} ETA {eta}",
                )
                .expect("valid template"),
            );
            b
        });
        Self {
            output,
            bar,
            out: Mutex::new(std::io::stdout()),
            started: Instant::now(),
            last_retry: Mutex::new(None),
        }
    }

    pub fn is_json(&self) -> bool {
        self.output == Output::Json
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Emits one event: a JSON line in `--json` mode, else a human line for
    /// the events an operator should see.
    pub fn event(&self, name: &str, mut fields: Value, human: Option<String>) {
        if self.is_json() {
            if let Value::Object(m) = &mut fields {
                m.insert("event".into(), name.into());
                m.insert(
                    "elapsed_ms".into(),
                    json!(self.started.elapsed().as_millis() as u64),
                );
            }
            let mut out = self.out.lock().expect("stdout lock");
            // A closed stdout must not fail the pull; the exit code says it all.
            let _ = writeln!(out, "{fields}").and_then(|_| out.flush());
        } else if let Some(line) = human {
            match &self.bar {
                // Once finished, a bar printed through would be drawn again
                // below the line.
                Some(b) if !b.is_finished() => b.println(line),
                _ => eprintln!("{line}"),
            }
        }
    }

    pub fn retry(&self, path: &str, attempt: u32, err: &dyn std::fmt::Display, delay: Duration) {
        *self
            .last_retry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(err.to_string());
        self.event(
            "retry",
            json!({"path": path, "attempt": attempt, "error": err.to_string(), "delay_ms": delay.as_millis() as u64}),
            Some(format!("retrying {path} in {delay:?} (attempt {attempt} failed: {err})")),
        );
    }

    /// The last failure that was retried, if any.
    pub fn last_retry(&self) -> Option<String> {
        self.last_retry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// One progress update (JSON line, or the bar).
    pub fn progress(&self, p: &Progress, bytes: u64, requests: u64) {
        let needed = p.needed.load(Ordering::Relaxed);
        let written = p.written.load(Ordering::Relaxed);
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        if self.is_json() {
            self.event(
                "progress",
                json!({
                    "objects_needed": needed,
                    "objects_written": written,
                    "objects_present": p.present.load(Ordering::Relaxed),
                    "bytes_downloaded": bytes,
                    "requests": requests,
                    "bytes_per_sec": (bytes as f64 / secs) as u64,
                }),
                None,
            );
        } else if let Some(b) = &self.bar {
            b.set_length(needed);
            b.set_position(written);
            b.set_message(format!(
                "{} at {}/s",
                indicatif::HumanBytes(bytes),
                indicatif::HumanBytes((bytes as f64 / secs) as u64)
            ));
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    pub fn progress_interval(&self) -> Duration {
        if self.is_json() {
            JSON_PROGRESS_INTERVAL
        } else {
            BAR_INTERVAL
        }
    }
}
