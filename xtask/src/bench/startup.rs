//! `cargo xtask bench startup` (issue 3): how long `oscontent-server`
//! takes from spawn to `/readyz` = 200 when it streams an oscontainer from
//! a registry, and how many bytes that writes to the disk, against the
//! pull-and-extract way (`skopeo copy` to an OCI layout, then `umoci
//! unpack`), measured in the same run.
//!
//! Setup (not timed): the fixture (v2 of the chosen scale) is pushed with
//! skopeo to a real `docker-registry` on 127.0.0.1 whose storage is on the
//! normal disk. Each trial gets a fresh XFS [`ScratchFs`]; the page cache
//! is dropped before it, so both arms read the registry's blobs cold. The
//! arms alternate order from run to run.
//!
//! - **oscontent**: `oscontent-server serve --image docker://… --state-dir
//!   SCRATCH/state`; timed from spawn to the first 200 from `/readyz`.
//! - **anchor**: `skopeo copy docker://… oci:SCRATCH/layout:TAG`, then
//!   `umoci unpack --image SCRATCH/layout:TAG SCRATCH/bundle`; the two
//!   times summed.
//!
//! After each arm: `syncfs` on the scratch filesystem (timed, reported
//! apart: it is the work the arm left behind), then the loop device's
//! sectors written since the arm started × 512.
//!
//! Targets (issue 3): oscontent's bytes written ≤ 1.05 × the unpacked repo
//! size on disk (every file rounded up to the filesystem block, computed
//! from the fixture; the ratio to the apparent size is reported too), and
//! its time to ready ≤ the anchor's.

use super::scratch::{self, DiskStats, ScratchFs, ScratchOptions, Usage};
use super::{check_interrupted, http_status, run_bounded, Stopper, Summary};
use crate::fixtures::{self, FixtureSpec, Release, Scale};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Target: bytes written / unpacked repo size.
pub const BYTES_TARGET: f64 = 1.05;
/// Target: oscontent time to ready / anchor time.
pub const TIME_TARGET: f64 = 1.0;
/// Repository the fixture is pushed to.
const REPO: &str = "oscontent/fixture";
/// How long the server may take to print its address.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(60);
/// `/readyz` polling period (the resolution of time to ready).
const POLL: Duration = Duration::from_millis(20);

/// Options of `cargo xtask bench startup`.
#[derive(Debug, Clone)]
pub struct StartupOptions {
    pub scale: Scale,
    /// Trials per arm.
    pub runs: usize,
    /// Longest an arm may take to become ready.
    pub ready_timeout: Duration,
    /// Use this server binary instead of building the release one.
    pub server_bin: Option<PathBuf>,
    /// Drop the page cache before each arm.
    pub drop_caches: bool,
    /// Exit non-zero when a target is missed.
    pub strict: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    Oscontent,
    /// skopeo copy + umoci unpack.
    PullExtract,
}

impl Arm {
    fn label(self) -> &'static str {
        match self {
            Arm::Oscontent => "oscontent",
            Arm::PullExtract => "skopeo+umoci",
        }
    }
}

/// One arm of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Trial {
    pub arm: Arm,
    /// 0-based run number.
    pub run: usize,
    /// 0 if this arm went first in its run.
    pub position: usize,
    /// Spawn to ready (oscontent), or copy + unpack (anchor).
    pub time_to_ready_s: f64,
    /// Named phases, in seconds since the start of the arm (oscontent:
    /// `listening`, `staged`, `published`, `ready`; anchor: `copy`, `unpack`
    /// as durations).
    pub phases: BTreeMap<String, f64>,
    /// The `syncfs` right after ready.
    pub sync_s: f64,
    /// Device counters over the arm, the sync included.
    pub device: DiskStats,
    pub written_bytes: u64,
    /// What the arm left on the filesystem.
    pub usage: Usage,
    /// The server's own `written_bytes` (file content it wrote), if logged.
    pub reported_written_bytes: Option<u64>,
    /// CPU seconds (user + system) until ready: the server's own, or
    /// skopeo's and umoci's.
    pub cpu_s: Option<f64>,
    /// (seconds since the start, device bytes written so far), sampled
    /// about every 250 ms while waiting for ready (oscontent only).
    pub timeline: Vec<(f64, u64)>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ArmSummary {
    pub arm: Arm,
    pub time_to_ready_s: Summary,
    pub sync_s: Summary,
    pub cpu_s: Summary,
    pub written_bytes: Summary,
    pub written_over_repo: Summary,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Target {
    pub name: &'static str,
    pub value: f64,
    pub limit: f64,
    pub pass: bool,
}

/// The JSON written to `target/bench/startup-<stamp>.json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub benchmark: &'static str,
    pub started: String,
    pub git: Option<String>,
    pub scale: Scale,
    pub runs: usize,
    pub drop_caches: bool,
    pub server_binary: PathBuf,
    pub server_profile: String,
    pub release: Release,
    pub image: String,
    pub scratch_fs_bytes: u64,
    pub scratch_direct_io: bool,
    pub load_before: f64,
    pub load_after: f64,
    pub cpus: usize,
    pub kernel: String,
    pub trials: Vec<Trial>,
    pub summaries: Vec<ArmSummary>,
    /// Medians: oscontent / anchor.
    pub time_ratio: f64,
    pub bytes_ratio: f64,
    /// Median oscontent bytes written / `release.repo_bytes`.
    pub oscontent_written_over_repo: f64,
    /// The scratch filesystem's block size.
    pub block_size: u64,
    /// The repo's files each rounded up to `block_size`: the floor for
    /// any one-file-per-object copy of it.
    pub repo_rounded_bytes: u64,
    /// Median oscontent bytes written / `repo_rounded_bytes`.
    pub oscontent_written_over_rounded: f64,
    /// Median oscontent bytes written / what its state dir occupies
    /// (allocated blocks) after the run.
    pub oscontent_written_over_allocated: f64,
    pub targets: Vec<Target>,
    pub logs: PathBuf,
}

pub fn startup(opts: &StartupOptions) -> Result<()> {
    super::interrupt()?;
    super::require(&[
        super::MKFS_XFS,
        super::LOSETUP,
        super::MOUNT,
        super::UMOUNT,
        super::DOCKER_REGISTRY,
        super::SKOPEO,
        super::UMOCI,
    ])?;
    anyhow::ensure!(opts.runs >= 1, "--runs must be at least 1");
    let started = SystemTime::now();
    let bench = super::bench_dir()?;
    let logs = bench.join(format!("startup-{}.logs", super::utc_stamp(started)));
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    let (server_bin, profile) = match &opts.server_bin {
        Some(p) => (
            std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))?,
            "given".to_owned(),
        ),
        None => {
            let (p, prof) = super::server_binary()?;
            (p, prof.to_owned())
        }
    };
    anyhow::ensure!(
        server_bin.is_file(),
        "no server binary at {}",
        server_bin.display()
    );

    let spec = FixtureSpec::new(opts.scale);
    eprintln!("xtask: building (or reusing) the {} fixture", opts.scale);
    let fx = fixtures::ensure(&spec, &fixtures::default_dir(&spec))?;
    let release = fx
        .releases
        .last()
        .context("fixture without releases")?
        .clone();
    check_interrupted()?;

    let registry = super::registry::Registry::start(&bench.join("tmp"))?;
    eprintln!(
        "xtask: pushing {} ({}) to the registry at {} (not timed)",
        release.version,
        super::mib(release.image_bytes as f64),
        registry.host()
    );
    let image = registry.push_oci(&fx.oci_layout, &release.version, REPO)?;

    let fs_size = (3 * release.image_bytes.max(release.repo_bytes)).max(scratch::MIN_SIZE);
    let (load_before, cpus) = super::load();
    let mut trials = Vec::new();
    let mut direct_io = true;
    let mut fs_bytes = fs_size;
    let mut block_size = 4096;
    for run in 0..opts.runs {
        let order = if run % 2 == 0 {
            [Arm::Oscontent, Arm::PullExtract]
        } else {
            [Arm::PullExtract, Arm::Oscontent]
        };
        for (position, arm) in order.into_iter().enumerate() {
            check_interrupted()?;
            let fs = ScratchFs::create_with(&ScratchOptions::new(fs_size))?;
            direct_io &= fs.direct_io();
            fs_bytes = fs.size();
            block_size = fs.block_size()?;
            if opts.drop_caches {
                super::drop_caches()?;
            }
            let log = logs.join(format!("run{run}-{}.log", arm.label().replace('+', "-")));
            let trial = match arm {
                Arm::Oscontent => oscontent_arm(
                    &server_bin,
                    &image,
                    &registry.host(),
                    &fs,
                    &log,
                    opts.ready_timeout,
                ),
                Arm::PullExtract => {
                    pull_extract_arm(&image, &release.version, &fs, &log, opts.ready_timeout)
                }
            }
            .with_context(|| format!("run {run}, arm {} (log: {})", arm.label(), log.display()))?;
            let trial = Trial {
                run,
                position,
                ..trial
            };
            eprintln!(
                "xtask: run {}/{} {:<13} ready {:>7.2}s  sync {:>6.2}s  written {:>11} ({:.3}x repo)",
                run + 1,
                opts.runs,
                arm.label(),
                trial.time_to_ready_s,
                trial.sync_s,
                super::mib(trial.written_bytes as f64),
                trial.written_bytes as f64 / release.repo_bytes as f64
            );
            trials.push(trial);
            drop(fs);
        }
    }
    drop(registry);
    let (load_after, _) = super::load();

    let summarize = |arm: Arm| {
        let of = |f: &dyn Fn(&Trial) -> f64| {
            let v: Vec<f64> = trials.iter().filter(|t| t.arm == arm).map(f).collect();
            Summary::of(&v)
        };
        ArmSummary {
            arm,
            time_to_ready_s: of(&|t| t.time_to_ready_s),
            sync_s: of(&|t| t.sync_s),
            cpu_s: of(&|t| t.cpu_s.unwrap_or(f64::NAN)),
            written_bytes: of(&|t| t.written_bytes as f64),
            written_over_repo: of(&|t| t.written_bytes as f64 / release.repo_bytes as f64),
        }
    };
    let osc = summarize(Arm::Oscontent);
    let anchor = summarize(Arm::PullExtract);
    let time_ratio = osc.time_to_ready_s.median / anchor.time_to_ready_s.median;
    let bytes_ratio = osc.written_bytes.median / anchor.written_bytes.median;
    let over_repo = osc.written_over_repo.median;
    let repo_rounded_bytes = super::rounded_size(&release.repo, block_size)?;
    let osc_allocated = Summary::of(
        &trials
            .iter()
            .filter(|t| t.arm == Arm::Oscontent)
            .map(|t| t.usage.allocated_bytes as f64)
            .collect::<Vec<_>>(),
    )
    .median;
    // The unpacked repo's size is its size on disk: each file occupies
    // whole blocks, so no way of writing 30k small objects as files can go
    // below the rounded size. It comes from the fixture, not from what
    // oscontent left, so the denominator does not flatter the arm. The
    // apparent-size ratio is reported beside it.
    let over_rounded = osc.written_bytes.median / repo_rounded_bytes as f64;
    let targets = vec![
        Target {
            name: "oscontent bytes written / unpacked repo size on disk (files in whole fs blocks)",
            value: over_rounded,
            limit: BYTES_TARGET,
            pass: over_rounded <= BYTES_TARGET,
        },
        Target {
            name: "oscontent time to ready / pull-and-extract time",
            value: time_ratio,
            limit: TIME_TARGET,
            pass: time_ratio <= TIME_TARGET,
        },
    ];
    let report = Report {
        benchmark: "startup",
        started: super::utc_stamp(started),
        git: super::git_state(),
        scale: opts.scale,
        runs: opts.runs,
        drop_caches: opts.drop_caches,
        server_binary: server_bin,
        server_profile: profile,
        release,
        image,
        scratch_fs_bytes: fs_bytes,
        scratch_direct_io: direct_io,
        load_before,
        load_after,
        cpus,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        trials,
        summaries: vec![osc.clone(), anchor],
        time_ratio,
        bytes_ratio,
        oscontent_written_over_repo: over_repo,
        block_size,
        repo_rounded_bytes,
        oscontent_written_over_rounded: over_rounded,
        oscontent_written_over_allocated: osc.written_bytes.median / osc_allocated,
        targets,
        logs,
    };
    let path = super::results_path("startup", started)?;
    let mut json = serde_json::to_string_pretty(&report)?;
    json.push('\n');
    std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    print!("{}", render(&report));
    println!("results: {}", path.display());
    if opts.strict && report.targets.iter().any(|t| !t.pass) {
        bail!("a startup target was missed");
    }
    Ok(())
}

/// The table.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    let rel = &r.release;
    s += &format!(
        "\nbench startup: {} fixture, {} ({} files, unpacked repo {}, image layers {}), {} run(s), server {} ({})\n",
        r.scale,
        rel.version,
        rel.tree_files,
        super::mib(rel.repo_bytes as f64),
        super::mib(rel.image_bytes as f64),
        r.runs,
        r.server_profile,
        r.git.as_deref().unwrap_or("?"),
    );
    s += &format!(
        "scratch: XFS on loop ({}), {}; caches dropped before each arm: {}; load {:.2} -> {:.2} on {} CPUs\n\n",
        if r.scratch_direct_io { "direct-io" } else { "NO direct-io" },
        super::mib(r.scratch_fs_bytes as f64),
        r.drop_caches,
        r.load_before,
        r.load_after,
        r.cpus
    );
    let secs = |x: &Summary| format!("{:.2} [{:.2}..{:.2}]", x.median, x.min, x.max);
    let mibs = |x: &Summary| {
        format!(
            "{:.1} [{:.1}..{:.1}]",
            x.median / 1048576.0,
            x.min / 1048576.0,
            x.max / 1048576.0
        )
    };
    s += &format!(
        "{:<14} {:>30} {:>8} {:>8} {:>34} {:>13}\n",
        "arm",
        "ready s: median [min..max]",
        "cpu s",
        "sync s",
        "written MiB: median [min..max]",
        "written/repo"
    );
    for a in &r.summaries {
        s += &format!(
            "{:<14} {:>30} {:>8.2} {:>8.2} {:>34} {:>12.3}x\n",
            a.arm.label(),
            secs(&a.time_to_ready_s),
            a.cpu_s.median,
            a.sync_s.median,
            mibs(&a.written_bytes),
            a.written_over_repo.median
        );
    }
    s += &format!(
        "\noscontent / pull-and-extract: time {:.3}x, bytes written {:.3}x\n",
        r.time_ratio, r.bytes_ratio
    );
    // Where oscontent's time and bytes went (medians over its trials).
    let osc: Vec<&Trial> = r
        .trials
        .iter()
        .filter(|t| t.arm == Arm::Oscontent)
        .collect();
    let med = |f: &dyn Fn(&Trial) -> Option<f64>| {
        let v: Vec<f64> = osc.iter().filter_map(|t| f(t)).collect();
        Summary::of(&v).median
    };
    let phase = |name: &'static str| med(&|t: &Trial| t.phases.get(name).copied());
    s += &format!(
        "oscontent phases (median s since spawn): listening {:.2}, staged {:.2}, published {:.2}, ready {:.2}\n",
        phase("listening"),
        phase("staged"),
        phase("published"),
        phase("ready")
    );
    s += &format!(
        "oscontent on disk (median): {} files, apparent {}, allocated {}; device writes {}, flushes {}\n",
        med(&|t| Some(t.usage.files as f64)),
        super::mib(med(&|t| Some(t.usage.apparent_bytes as f64))),
        super::mib(med(&|t| Some(t.usage.allocated_bytes as f64))),
        med(&|t| Some(t.device.writes as f64)),
        med(&|t| Some(t.device.flushes as f64)),
    );
    s += &format!(
        "oscontent bytes written / repo rounded up to {} B blocks ({}, the floor for one file per object): {:.3}x; / its allocated size on the scratch fs: {:.3}x\n",
        r.block_size,
        super::mib(r.repo_rounded_bytes as f64),
        r.oscontent_written_over_rounded,
        r.oscontent_written_over_allocated,
    );
    let anchor: Vec<&Trial> = r
        .trials
        .iter()
        .filter(|t| t.arm == Arm::PullExtract)
        .collect();
    let amed = |f: &dyn Fn(&Trial) -> Option<f64>| {
        let v: Vec<f64> = anchor.iter().filter_map(|t| f(t)).collect();
        Summary::of(&v).median
    };
    s += &format!(
        "pull-and-extract (median): copy {:.2}s + unpack {:.2}s; on disk apparent {}, allocated {}\n\n",
        amed(&|t| t.phases.get("copy").copied()),
        amed(&|t| t.phases.get("unpack").copied()),
        super::mib(amed(&|t| Some(t.usage.apparent_bytes as f64))),
        super::mib(amed(&|t| Some(t.usage.allocated_bytes as f64))),
    );
    for t in &r.targets {
        s += &format!(
            "{}  {:<50} {:.3}x (target <= {:.2}x)\n",
            if t.pass { "PASS" } else { "MISS" },
            t.name,
            t.value,
            t.limit
        );
    }
    s
}

/// What the server's stderr told us, with arrival times since spawn.
#[derive(Debug, Default)]
struct ServerEvents {
    staged: Option<(Duration, Option<u64>)>,
    published: Option<Duration>,
    error: Option<String>,
}

fn oscontent_arm(
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
        .arg(format!("docker://{image}"))
        .arg("--state-dir")
        .arg(&state)
        .args(["--listen", "127.0.0.1:0", "--insecure-registry", host])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let mut server = Stopper::new(child, "oscontent-server");
    let stdout = server.child_mut().stdout.take().context("server stdout")?;
    let stderr = server.child_mut().stderr.take().context("server stderr")?;

    // stdout: the first line is the address; the rest is drained.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    // stderr: copied to the log; the lines that mark phases are noted.
    let events = Arc::new(Mutex::new(ServerEvents::default()));
    let mut log_file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
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

    let addr = loop {
        check_interrupted()?;
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => match line.trim().strip_prefix("listening on http://") {
                Some(a) => break a.to_owned(),
                None => bail!(
                    "server printed {line:?} instead of its address; log:\n{}",
                    super::tail(log, 20)
                ),
            },
            Err(mpsc::RecvTimeoutError::Timeout) if start.elapsed() < LISTEN_TIMEOUT => {}
            Err(_) => bail!(
                "server did not print its address within {LISTEN_TIMEOUT:?}; log:\n{}",
                super::tail(log, 20)
            ),
        }
    };
    let listening = start.elapsed();
    let addr: SocketAddr = addr
        .parse()
        .with_context(|| format!("server address {addr:?}"))?;

    let mut timeline = Vec::new();
    let mut next_sample = Instant::now();
    let ready = loop {
        check_interrupted()?;
        if Instant::now() >= next_sample {
            timeline.push((
                start.elapsed().as_secs_f64(),
                fs.stats()?.since(&before).written_bytes(),
            ));
            next_sample += Duration::from_millis(250);
        }
        if let Some(status) = server.try_wait()? {
            bail!(
                "server exited ({status}) before ready; log:\n{}",
                super::tail(log, 20)
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
                super::tail(log, 20)
            );
        }
        std::thread::sleep(POLL);
    };
    let cpu = super::cpu_seconds(server.id()).map(|(own, _)| own);
    timeline.push((
        ready.as_secs_f64(),
        fs.stats()?.since(&before).written_bytes(),
    ));
    let sync = fs.syncfs()?;
    let device = fs.stats()?.since(&before);
    let usage = scratch::usage(&state)?;
    let status = server.stop();
    drop(server);
    let _ = reader.join();
    if status.is_some_and(|s| !s.success()) {
        eprintln!("xtask: warning: server exited with {status:?} after SIGTERM");
    }

    let e = events.lock().unwrap_or_else(|p| p.into_inner());
    let mut phases = BTreeMap::new();
    phases.insert("listening".to_owned(), listening.as_secs_f64());
    if let Some((at, _)) = e.staged {
        phases.insert("staged".to_owned(), at.as_secs_f64());
    }
    if let Some(at) = e.published {
        phases.insert("published".to_owned(), at.as_secs_f64());
    }
    phases.insert("ready".to_owned(), ready.as_secs_f64());
    Ok(Trial {
        arm: Arm::Oscontent,
        run: 0,
        position: 0,
        time_to_ready_s: ready.as_secs_f64(),
        phases,
        sync_s: sync.as_secs_f64(),
        written_bytes: device.written_bytes(),
        device,
        usage,
        reported_written_bytes: e.staged.and_then(|(_, b)| b),
        cpu_s: cpu,
        timeline,
    })
}

fn pull_extract_arm(
    image: &str,
    tag: &str,
    fs: &ScratchFs,
    log: &Path,
    timeout: Duration,
) -> Result<Trial> {
    let layout = fs.path().join("layout");
    let bundle = fs.path().join("bundle");
    let before = fs.stats()?;
    let children_cpu = || super::cpu_seconds(std::process::id()).map(|(_, c)| c);
    let cpu_before = children_cpu();
    let copy = run_bounded(
        Command::new("skopeo")
            .args([
                "--insecure-policy",
                "copy",
                "--quiet",
                "--src-tls-verify=false",
            ])
            .arg(format!("docker://{image}"))
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
