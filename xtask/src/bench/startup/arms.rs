//! The two ways to get a repo onto the node that `bench startup`
//! compares: oscontent-server streaming the image, and pull-and-extract.

use super::results::{Arm, Trial};
use crate::bench::scratch::{self, DiskStats, ScratchFs, Usage};
use crate::bench::{check_interrupted, http_status, run_bounded, stopper, Stopper};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the server may take to print its address.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);
/// `/readyz` polling period (the resolution of time to ready).
const POLL: Duration = Duration::from_millis(20);

/// What the server's stderr told us, with arrival times since spawn.
#[derive(Debug, Default)]
struct ServerEvents {
    staged: Option<(Duration, Option<u64>)>,
    published: Option<Duration>,
    error: Option<String>,
}

/// oscontent-server streaming `image` into a state dir on `fs`, timed
/// from spawn to the first 200 from `/readyz`; then the sync, the device
/// counters and what it left on disk.
pub(super) fn oscontent(
    bin: &Path,
    image: &str,
    host: &str,
    fs: &ScratchFs,
    log: &Path,
    timeout: Duration,
) -> Result<Trial> {
    let state = fs.path().join("state");
    let before = fs.stats()?;
    let start = Instant::now();
    let child = Command::new(bin)
        .args(["--log-format", "json", "serve", "--image"])
        .arg(image)
        .arg("--state-dir")
        .arg(&state)
        .args(["--listen", "127.0.0.1:0", "--insecure-registry", host])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut server = stopper(child, "oscontent-server");
    let stdout = server.child_mut().stdout.take().context("server stdout")?;
    let stderr = server.child_mut().stderr.take().context("server stderr")?;
    let address = first_line(stdout);
    let log_file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let (events, reader) = watch_events(stderr, log_file, start);
    let addr = wait_listening(&address, start, log)?;
    let listening = start.elapsed();
    let probe = Probe {
        fs,
        before,
        start,
        log,
    };
    let ready = wait_ready(&mut server, &events, addr, &probe, timeout)?;
    let cpu = crate::bench::cpu_seconds(server.id()).map(|(own, _)| own);
    let mut timeline = ready.timeline;
    timeline.push((
        ready.at.as_secs_f64(),
        fs.stats()?.since(&probe.before).written_bytes(),
    ));
    let sync = fs.syncfs()?;
    let device = fs.stats()?.since(&probe.before);
    let usage = scratch::usage(&state)?;
    let status = server.stop();
    drop(server);
    let _ = reader.join();
    if status.is_some_and(|s| !s.success()) {
        eprintln!("xtask: warning: server exited with {status:?} after SIGTERM");
    }
    let e = events.lock().unwrap_or_else(|p| p.into_inner());
    Ok(Trial {
        arm: Arm::Oscontent,
        run: 0,
        position: 0,
        time_to_ready_s: ready.at.as_secs_f64(),
        phases: phases(listening, &e, ready.at),
        sync_s: sync.as_secs_f64(),
        written_bytes: device.written_bytes(),
        device,
        usage,
        reported_written_bytes: e.staged.and_then(|(_, b)| b),
        cpu_s: cpu,
        timeline,
    })
}

/// The server's stdout: the first line (its address) is sent; the rest
/// is drained.
fn first_line(stdout: std::process::ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    rx
}

/// The server's stderr: copied to the log; the lines that mark phases
/// (and the first error) are noted with their time since `start`.
fn watch_events(
    stderr: std::process::ChildStderr,
    mut log_file: File,
    start: Instant,
) -> (Arc<Mutex<ServerEvents>>, std::thread::JoinHandle<()>) {
    let events = Arc::new(Mutex::new(ServerEvents::default()));
    let ev = Arc::clone(&events);
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let at = start.elapsed();
            let _ = writeln!(log_file, "{line}");
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let fields = if v["fields"].is_object() {
                &v["fields"]
            } else {
                &v
            };
            let msg = fields["message"].as_str().unwrap_or("");
            let mut e = ev.lock().unwrap_or_else(|p| p.into_inner());
            if v["level"] == "ERROR" && e.error.is_none() {
                e.error = Some(msg.to_owned());
            } else if msg == "image verified and staged" && e.staged.is_none() {
                e.staged = Some((at, fields["written_bytes"].as_u64()));
            } else if msg == "published" && e.published.is_none() {
                e.published = Some(at);
            }
        }
    });
    (events, reader)
}

/// The address the server prints first, within [`LISTEN_TIMEOUT`].
fn wait_listening(
    address: &mpsc::Receiver<String>,
    start: Instant,
    log: &Path,
) -> Result<SocketAddr> {
    loop {
        check_interrupted()?;
        match address.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => match oscontent_testkit::parse_listening(&line) {
                Some((_, addr)) => return Ok(addr),
                None => bail!(
                    "server printed {line:?} instead of its address; log:\n{}",
                    crate::bench::tail(log, 20)
                ),
            },
            Err(mpsc::RecvTimeoutError::Timeout) if start.elapsed() < LISTEN_TIMEOUT => {}
            Err(_) => bail!(
                "server did not print its address within {LISTEN_TIMEOUT:?}; log:\n{}",
                crate::bench::tail(log, 20)
            ),
        }
    }
}

/// What a wait watches: the device since `before`, time since `start`,
/// and the log it quotes on failure.
struct Probe<'a> {
    fs: &'a ScratchFs,
    before: DiskStats,
    start: Instant,
    log: &'a Path,
}

/// When the server became ready, and the device bytes sampled on the way.
struct Ready {
    at: Duration,
    /// (seconds since spawn, device bytes written so far).
    timeline: Vec<(f64, u64)>,
}

/// Polls `/readyz` every [`POLL`] until 200, sampling the device's bytes
/// written about every 250 ms; fails if the server exits, reports an
/// error, or is not ready within `timeout`.
fn wait_ready(
    server: &mut Stopper,
    events: &Mutex<ServerEvents>,
    addr: SocketAddr,
    p: &Probe<'_>,
    timeout: Duration,
) -> Result<Ready> {
    let (fs, before, start, log) = (p.fs, &p.before, p.start, p.log);
    let mut timeline = Vec::new();
    let mut next_sample = Instant::now();
    let at = loop {
        check_interrupted()?;
        if Instant::now() >= next_sample {
            timeline.push((
                start.elapsed().as_secs_f64(),
                fs.stats()?.since(before).written_bytes(),
            ));
            next_sample += Duration::from_millis(250);
        }
        if let Some(status) = server.try_wait()? {
            bail!(
                "server exited ({status}) before ready; log:\n{}",
                crate::bench::tail(log, 20)
            );
        }
        if let Some(e) = &events.lock().unwrap_or_else(|p| p.into_inner()).error {
            // The server would retry, but a benchmark with a failed
            // attempt in it measures nothing useful.
            bail!("server reported an error before ready: {e}");
        }
        if http_status(addr, "/readyz") == Some(200) {
            break start.elapsed();
        }
        if start.elapsed() > timeout {
            bail!(
                "server not ready within {timeout:?}; log:\n{}",
                crate::bench::tail(log, 20)
            );
        }
        std::thread::sleep(POLL);
    };
    Ok(Ready { at, timeline })
}

/// The oscontent arm's phases, in seconds since spawn.
fn phases(listening: Duration, e: &ServerEvents, ready: Duration) -> BTreeMap<String, f64> {
    let mut phases = BTreeMap::new();
    phases.insert("listening".to_owned(), listening.as_secs_f64());
    if let Some((at, _)) = e.staged {
        phases.insert("staged".to_owned(), at.as_secs_f64());
    }
    if let Some(at) = e.published {
        phases.insert("published".to_owned(), at.as_secs_f64());
    }
    phases.insert("ready".to_owned(), ready.as_secs_f64());
    phases
}

/// `skopeo copy` to an OCI layout on `fs`, then `umoci unpack`; the two
/// times summed.
pub(super) fn pull_extract(
    image: &str,
    tag: &str,
    fs: &ScratchFs,
    log: &Path,
    timeout: Duration,
) -> Result<Trial> {
    let layout = fs.path().join("layout");
    let bundle = fs.path().join("bundle");
    let before = fs.stats()?;
    let children_cpu = || crate::bench::cpu_seconds(std::process::id()).map(|(_, c)| c);
    let cpu_before = children_cpu();
    let copy = run_bounded(
        Command::new("skopeo")
            .args([
                "--insecure-policy",
                "copy",
                "--quiet",
                "--src-tls-verify=false",
            ])
            .arg(image)
            .arg(format!("oci:{}:{tag}", layout.display())),
        log,
        timeout,
    )?;
    let unpack = run_bounded(
        Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:{tag}", layout.display()))
            .arg(&bundle),
        log,
        timeout.saturating_sub(copy),
    )?;
    let cpu = children_cpu().zip(cpu_before).map(|(a, b)| a - b);
    let sync = fs.syncfs()?;
    let device = fs.stats()?.since(&before);
    let (a, b) = (scratch::usage(&layout)?, scratch::usage(&bundle)?);
    let usage = Usage {
        files: a.files + b.files,
        dirs: a.dirs + b.dirs,
        other: a.other + b.other,
        apparent_bytes: a.apparent_bytes + b.apparent_bytes,
        allocated_bytes: a.allocated_bytes + b.allocated_bytes,
    };
    let mut phases = BTreeMap::new();
    phases.insert("copy".to_owned(), copy.as_secs_f64());
    phases.insert("unpack".to_owned(), unpack.as_secs_f64());
    Ok(Trial {
        arm: Arm::PullExtract,
        run: 0,
        position: 0,
        time_to_ready_s: (copy + unpack).as_secs_f64(),
        phases,
        sync_s: sync.as_secs_f64(),
        written_bytes: device.written_bytes(),
        device,
        usage,
        reported_written_bytes: None,
        cpu_s: cpu,
        timeline: Vec::new(),
    })
}
