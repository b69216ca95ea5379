//! Starts the delta compiler's process (`compile.rs`) for one pair and
//! waits for it within its bounds: its resident memory (`--delta-memory`,
//! what the pod's cgroup counts, read from `/proc` every few
//! milliseconds), its time (`--delta-timeout`); past either it is killed
//! with SIGKILL. An address-space ceiling it sets on itself stops a single
//! huge allocation before the next look. Its temporary files go to
//! `TMPDIR` inside the scratch repo, on the state volume, never the
//! image's read-only `/var/tmp`. What it wrote is the caller's to remove
//! on failure.

use oscontent_format::DeltaName;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How often the waiting thread looks at the process: what it can touch
/// between two looks is the overshoot of the memory bound.
const POLL: Duration = Duration::from_millis(5);
/// The address-space ceiling is this many times the memory bound, and at
/// least `MIN_ADDRESS_SPACE`: a backstop against one huge allocation, not
/// the bound itself. liblzma's encoder alone reserves about 400 MiB it
/// mostly never touches, and the small fixtures' delta (125 MiB resident)
/// maps more than 1 GiB, so a ceiling near the resident bound would
/// refuse ordinary deltas.
const ADDRESS_SPACE_FACTOR: u64 = 8;
const MIN_ADDRESS_SPACE: u64 = 4 << 30;
/// The end of the compiler's stderr kept for the error.
const STDERR_TAIL: usize = 4096;

/// The bounds of one compilation.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// The compiler: this server's own executable.
    pub exe: PathBuf,
    /// Resident memory, in bytes.
    pub memory: u64,
    pub timeout: Duration,
}

/// Why a compilation produced no delta.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("{} took longer than --delta-timeout ({}s) and was killed", pair(.name), .timeout.as_secs())]
    Timeout { name: DeltaName, timeout: Duration },
    #[error("{} was stopped by its --delta-memory bound ({} MiB): {detail}", pair(.name), .memory >> 20)]
    Memory {
        name: DeltaName,
        memory: u64,
        detail: String,
    },
    #[error("{} failed ({status}): {detail}", pair(.name))]
    Failed {
        name: DeltaName,
        status: ExitStatus,
        detail: String,
    },
    #[error("starting the delta compiler {}: {source}", .exe.display())]
    Spawn {
        exe: PathBuf,
        source: std::io::Error,
    },
    #[error("waiting for the delta compiler: {0}")]
    Wait(std::io::Error),
}

fn pair(name: &DeltaName) -> String {
    match name.from {
        Some(f) => format!(
            "compiling the static delta from commit {f} to commit {}",
            name.to
        ),
        None => format!("compiling the static delta to commit {}", name.to),
    }
}

/// How a compilation that produced a delta went.
#[derive(Debug, Clone, Copy)]
pub struct Compiled {
    /// The most resident memory seen.
    pub peak_rss: u64,
}

/// Why the waiting thread ended the process.
enum Killed {
    Timeout,
    Memory(u64),
}

// long-fn: the child's whole life in order (spawned under its bounds, watched, reaped, judged), each step using the last
/// Compiles `name` in the scratch repo `repo` (its delta left under
/// `repo/deltas/`), with `tmpdir` as the compiler's `TMPDIR`.
pub fn compile(
    bounds: &Bounds,
    repo: &Path,
    tmpdir: &Path,
    name: &DeltaName,
) -> Result<Compiled, CompileError> {
    let address_space = bounds
        .memory
        .saturating_mul(ADDRESS_SPACE_FACTOR)
        .max(MIN_ADDRESS_SPACE);
    let mut cmd = Command::new(&bounds.exe);
    cmd.arg("delta-compile")
        .arg("--repo")
        .arg(repo)
        .arg("--to")
        .arg(name.to.to_hex())
        .arg("--address-space")
        .arg(address_space.to_string())
        .env("TMPDIR", tmpdir)
        .env("OSCONTENT_LOG_FORMAT", "text")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(f) = name.from {
        cmd.arg("--from").arg(f.to_hex());
    }
    let mut child = cmd.spawn().map_err(|source| CompileError::Spawn {
        exe: bounds.exe.clone(),
        source,
    })?;
    let tail = child.stderr.take().map(|s| {
        std::thread::Builder::new()
            .name("delta-stderr".into())
            .spawn(move || read_tail(s))
    });
    let started = Instant::now();
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak_rss = 0;
    let outcome = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if started.elapsed() >= bounds.timeout => break Err(Killed::Timeout),
            Ok(None) => {
                // Gone between the two looks: the next try_wait says how.
                let rss = std::fs::read_to_string(&status_path)
                    .ok()
                    .and_then(|t| vm_rss(&t))
                    .unwrap_or(0);
                peak_rss = peak_rss.max(rss);
                if rss > bounds.memory {
                    break Err(Killed::Memory(rss));
                }
                std::thread::sleep(POLL);
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(CompileError::Wait(e));
            }
        }
    };
    if outcome.is_err() {
        // SIGKILL: bsdiff never looks at a cancellable.
        let _ = child.kill();
        child.wait().map_err(CompileError::Wait)?;
    }
    // The pipe closes when the process ends.
    let detail = match tail {
        Some(Ok(h)) => h.join().unwrap_or_default(),
        _ => String::new(),
    };
    let status = match outcome {
        Ok(s) => s,
        Err(Killed::Timeout) => {
            return Err(CompileError::Timeout {
                name: *name,
                timeout: bounds.timeout,
            })
        }
        Err(Killed::Memory(rss)) => {
            return Err(CompileError::Memory {
                name: *name,
                memory: bounds.memory,
                detail: format!("it held {} MiB and was killed", rss >> 20),
            })
        }
    };
    if status.success() {
        return Ok(Compiled { peak_rss });
    }
    let detail = if detail.is_empty() {
        "no message".to_owned()
    } else {
        detail
    };
    Err(if out_of_memory(status, &detail) {
        CompileError::Memory {
            name: *name,
            memory: bounds.memory,
            detail,
        }
    } else {
        CompileError::Failed {
            name: *name,
            status,
            detail,
        }
    })
}

/// Whether a compiler that ended so hit its address-space bound: an
/// allocation refused shows as a message naming it (Rust's, GLib's,
/// liblzma's, `ENOMEM`), or as an abort of a library that does not check.
fn out_of_memory(status: ExitStatus, stderr: &str) -> bool {
    use std::os::unix::process::ExitStatusExt;
    let s = stderr.to_ascii_lowercase();
    let said = ["alloc", "out of memory", "cannot allocate memory", "enomem"]
        .iter()
        .any(|w| s.contains(w));
    let aborted = matches!(status.signal(), Some(6 | 5 | 11 | 7));
    said || aborted
}

/// `VmRSS` of a `/proc/PID/status`, in bytes.
fn vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kb = line.trim().strip_suffix("kB")?.trim();
    kb.parse::<u64>().ok()?.checked_mul(1024)
}

/// The last `STDERR_TAIL` bytes of `r`, read to its end, as one line.
fn read_tail(mut r: impl Read) -> String {
    let mut tail: Vec<u8> = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > STDERR_TAIL {
                    tail.drain(..tail.len() - STDERR_TAIL);
                }
            }
        }
    }
    String::from_utf8_lossy(&tail)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn what_counts_as_the_memory_bound() {
        let exited = |code: i32| ExitStatus::from_raw(code << 8);
        let signalled = ExitStatus::from_raw;
        let cases: &[(ExitStatus, &str, bool)] = &[
            (
                exited(1),
                "error: libostree's delta compiler: bsdiff: Cannot allocate memory",
                true,
            ),
            (
                signalled(6),
                "memory allocation of 1048576 bytes failed",
                true,
            ),
            (signalled(6), "", true),
            (
                signalled(5),
                "GLib: failed to allocate 41943040 bytes",
                true,
            ),
            (
                exited(1),
                "error: opening /x: No such file or directory",
                false,
            ),
            (signalled(9), "", false),
        ];
        for (status, stderr, want) in cases {
            assert_eq!(
                out_of_memory(*status, stderr),
                *want,
                "{status:?} {stderr:?}"
            );
        }
    }

    #[test]
    fn resident_memory_from_proc_status() {
        let cases: &[(&str, Option<u64>)] = &[
            (
                "Name:\tx\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nRssAnon: 1 kB\n",
                Some(1234 * 1024),
            ),
            ("VmRSS:\t0 kB\n", Some(0)),
            ("Name:\tzombie\nState:\tZ\n", None),
            ("VmRSS:\t12 MB\n", None),
            ("VmRSS:\tlots kB\n", None),
            ("VmRSS:\t99999999999999999999 kB\n", None),
        ];
        for (text, want) in cases {
            assert_eq!(vm_rss(text), *want, "{text:?}");
        }
    }

    #[test]
    fn the_tail_keeps_the_end_on_one_line() {
        let long = format!("{}\nthe end\n", "x".repeat(10_000));
        let t = read_tail(long.as_bytes());
        assert!(t.ends_with("the end"), "{t}");
        assert!(t.len() <= STDERR_TAIL, "{}", t.len());
        assert_eq!(read_tail(&b"a\n  b\n"[..]), "a b");
    }
}
