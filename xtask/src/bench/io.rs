//! `cargo xtask bench io` (issue 5): how much an OS update hurts an
//! etcd-like neighbour that shares its filesystem, for stock `ostree pull`,
//! `ostree pull --per-object-fsync` and `oscontent pull` in each of its
//! `--io-mode`s, against the neighbour alone, all in the same run.
//!
//! # Setup (not measured)
//!
//! - Fixtures: the full-scale (or `--scale small`) oscontainers, v1 and v2,
//!   with v2 rewriting 30% (the headline) and/or 5% of v1's files.
//! - A template: a fresh XFS filesystem image whose `repo/` (bare-user by
//!   default, `--mode`) was pulled to v1 by stock `ostree pull` from our
//!   server. Made once, kept under `target/bench/io-templates`.
//! - One `oscontent-server serve --oscontainer V2` on 127.0.0.1 per update.
//!
//! # One trial
//!
//! 1. A fresh [`ScratchFs`]: XFS on a direct-io loop device whose backing
//!    file (on the host disk, not on the loop fs) is a sparse copy of the
//!    template. The remote URL is set, the neighbour's file preallocated.
//! 2. Drop the page cache (before an update's first trial, or every trial
//!    with `--drop-caches-each-trial`; the freshly mounted trial fs is cold
//!    anyway), read the served v2 repo (the server stands for a remote
//!    machine: its reads should not hit the node's disk), then `sync`.
//! 3. The neighbour starts ([`neighbour`]: 2300-byte writes + fdatasync,
//!    each timed), and runs alone for `--warmup`.
//! 4. The update window: the pull, bounded by `--arm-timeout` (the
//!    baseline arm just waits as long as a typical update). Device counters
//!    are read at its start and end.
//! 5. `syncfs` on the loop fs, timed: the work the pull left behind.
//! 6. One more second of neighbour, then it stops; the ref is checked, and
//!    the objects the pull added are listed (their st_size and st_blocks).
//!
//! The arms alternate order between repetitions (even runs: the pulls then
//! the baseline; odd runs: reversed), so drift (host disk, temperature,
//! other engineers' builds) spreads over all arms. `--solo-runs` adds
//! trials without the neighbour, where the device counters are the pull's
//! alone.
//!
//! # Report
//!
//! For every trial, the neighbour's fdatasync p50/p99/p99.9/max and IOPS
//! over the ops that *complete* inside the update window, each divided by
//! the median, over the baseline trials, of the same statistic in a
//! baseline window of the same length at the same offset; the update's
//! wall time; the post-pull sync time; the bytes the loop device wrote
//! from the window's start until that sync returned, against the new
//! objects' apparent and allocated sizes. With the neighbour running, its
//! own writes are in the device counters: the report subtracts its ops ×
//! the baseline's bytes per op ("corrected"), and the solo trials give the
//! uncontaminated figure, which the bytes target uses when present.

pub mod chart;
pub mod etcd;
pub mod neighbour;
pub mod repo;
pub mod stats;

use self::neighbour::{Neighbour, NeighbourLog, Op};
use self::repo::{NewObjects, RepoMode, Server, Template};
use self::stats::{Ratios, WindowStats};
use super::scratch::{DiskStats, ScratchFs, ScratchOptions};
use super::{check_interrupted, run_bounded, Summary, Tool};
use crate::fixtures::{self, FixtureSpec, Scale};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

/// Target: neighbour fdatasync p99 in the window / baseline's.
pub const P99_TARGET: f64 = 1.5;
/// Target: neighbour fdatasync max in the window / baseline's.
pub const MAX_TARGET: f64 = 3.0;
/// Target: update wall time / stock `ostree pull`'s.
pub const TIME_TARGET: f64 = 1.3;
/// Target: bytes written to the device / new objects' allocated size.
pub const BYTES_TARGET: f64 = 1.1;
/// The io-modes the client is expected to offer (team brief), used when
/// its `--help` lists none.
pub const DEFAULT_IO_MODES: &[&str] = &["paced", "stock-like", "per-object-fsync"];
/// The neighbour keeps running this long after the post-pull sync.
const TAIL: Duration = Duration::from_secs(1);
/// The neighbour's file is preallocated to this size (writing wraps to the
/// start after it, which the trial records).
const NEIGHBOUR_FILE_MAX: u64 = 1 << 30;
/// A fast device's fdatasync rate, for sizing the neighbour's file.
const NEIGHBOUR_MAX_IOPS: f64 = 4000.0;
/// The shortest baseline window, by scale, before any update was timed.
const MIN_BASELINE_SMALL: f64 = 5.0;
const MIN_BASELINE_FULL: f64 = 20.0;
/// Baseline windows are this much longer than the longest update so far.
const BASELINE_MARGIN: f64 = 1.2;

pub const FIO: Tool = Tool {
    command: "fio",
    package: "fio",
};
pub const OSTREE: Tool = Tool {
    command: "ostree",
    package: "ostree",
};
pub const ETCD: Tool = Tool {
    command: "etcd",
    package: "etcd-server",
};
pub const ETCDCTL: Tool = Tool {
    command: "etcdctl",
    package: "etcd-client",
};

/// Which update(s) to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Updates {
    /// v2 rewrites 30% of v1's files (the headline case).
    #[value(name = "30")]
    Thirty,
    /// v2 rewrites 5% (the fixtures' default).
    #[value(name = "5")]
    Five,
    /// 30% then 5%.
    Both,
}

impl Updates {
    pub fn shares(self) -> Vec<f64> {
        match self {
            Updates::Thirty => vec![0.3],
            Updates::Five => vec![fixtures::DEFAULT_UPDATE_SHARE],
            Updates::Both => vec![0.3, fixtures::DEFAULT_UPDATE_SHARE],
        }
    }
}

/// Options of `cargo xtask bench io`.
#[derive(Debug, Clone)]
pub struct IoOptions {
    pub scale: Scale,
    pub updates: Updates,
    /// Repetitions of every arm.
    pub runs: usize,
    /// Extra trials of every pulling arm without the neighbour.
    pub solo_runs: usize,
    /// Arms to run (names, `oscontent` for every mode); None: all.
    pub arms: Option<Vec<String>>,
    /// The client's io-modes to benchmark; None: what `pull --help` lists.
    pub io_modes: Option<Vec<String>>,
    pub mode: RepoMode,
    pub server_bin: Option<PathBuf>,
    pub client_bin: Option<PathBuf>,
    pub arm_timeout: Duration,
    pub warmup: Duration,
    /// Fixed baseline window, seconds; None: adaptive.
    pub baseline_secs: Option<f64>,
    /// Seconds of fio alone vs the built-in neighbour alone; 0 skips.
    pub calibrate_secs: u64,
    /// Also run a real etcd (with a put loop) as a second neighbour.
    pub etcd: bool,
    /// Drop the page cache before every trial, not once per update.
    pub drop_caches_each_trial: bool,
    pub strict: bool,
}

// ---------------------------------------------------------------------------
// Arms
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Arm {
    /// The neighbour alone.
    Baseline,
    /// Stock `ostree pull`.
    Ostree,
    /// `ostree pull --per-object-fsync`.
    OstreePerObjectFsync,
    /// `oscontent pull --io-mode MODE`.
    Oscontent(String),
}

impl Arm {
    pub fn name(&self) -> String {
        match self {
            Arm::Baseline => "baseline".into(),
            Arm::Ostree => "ostree".into(),
            Arm::OstreePerObjectFsync => "ostree-per-object-fsync".into(),
            Arm::Oscontent(m) => format!("oscontent:{m}"),
        }
    }

    fn color(&self, i: usize) -> (u8, u8, u8) {
        match self {
            Arm::Baseline => (60, 60, 60),
            Arm::Ostree => (200, 90, 0),
            Arm::OstreePerObjectFsync => (160, 0, 120),
            Arm::Oscontent(_) => [(0, 90, 200), (0, 140, 70), (90, 60, 200), (0, 150, 160)][i % 4],
        }
    }
}

/// The arms `filter` selects from everything available (`oscontent`
/// selects every mode; `ostree-fsync` is short for the per-object-fsync
/// arm). An unknown name is an error that lists the known ones.
pub fn select_arms(filter: Option<&[String]>, modes: &[String]) -> Result<Vec<Arm>> {
    let mut all = vec![Arm::Baseline, Arm::Ostree, Arm::OstreePerObjectFsync];
    all.extend(modes.iter().cloned().map(Arm::Oscontent));
    let Some(filter) = filter else {
        return Ok(all);
    };
    let mut out: Vec<Arm> = Vec::new();
    for f in filter {
        let f = f.trim();
        let picked: Vec<Arm> = match f {
            "oscontent" => all
                .iter()
                .filter(|a| matches!(a, Arm::Oscontent(_)))
                .cloned()
                .collect(),
            "ostree-fsync" => vec![Arm::OstreePerObjectFsync],
            _ => all.iter().filter(|a| a.name() == f).cloned().collect(),
        };
        if picked.is_empty() {
            bail!(
                "unknown arm {f:?}; known: {}, oscontent, ostree-fsync",
                all.iter().map(Arm::name).collect::<Vec<_>>().join(", ")
            );
        }
        for a in picked {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    Ok(out)
}

/// The io-modes and the default one that `oscontent pull --help` lists
/// for `--io-mode`, from clap's short (`[possible values: a, b]`) or long
/// (`Possible values:` then `- a: …` lines) help. None if the help has no
/// `--io-mode` option.
pub fn parse_io_modes(help: &str) -> Option<(Vec<String>, Option<String>)> {
    let start = help.find("--io-mode")?;
    let rest = &help[start + "--io-mode".len()..];
    // The option's block ends where the next option begins.
    let end = rest
        .match_indices("\n")
        .map(|(i, _)| i)
        .find(|&i| {
            let line = rest[i + 1..].trim_start();
            line.starts_with("--")
                || (line.starts_with('-')
                    && line.chars().nth(1).is_some_and(|c| c.is_ascii_alphabetic())
                    && line.chars().nth(2) == Some(','))
        })
        .unwrap_or(rest.len());
    let block = &rest[..end];
    let mut modes = Vec::new();
    if let Some(i) = block.find("[possible values:") {
        let list = &block[i + "[possible values:".len()..];
        let list = &list[..list.find(']').unwrap_or(list.len())];
        modes.extend(
            list.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty()),
        );
    } else if let Some(i) = block.find("Possible values:") {
        for line in block[i..].lines().skip(1) {
            let Some(item) = line.trim().strip_prefix("- ") else {
                if line.trim().is_empty() {
                    continue;
                }
                break;
            };
            let name = item.split(':').next().unwrap_or("").trim();
            if !name.is_empty() {
                modes.push(name.to_owned());
            }
        }
    }
    let default = block.find("[default: ").map(|i| {
        let d = &block[i + "[default: ".len()..];
        d[..d.find(']').unwrap_or(d.len())].trim().to_owned()
    });
    Some((modes, default))
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

/// One arm of one repetition.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Trial {
    pub arm: String,
    /// 0-based repetition (solo trials count on from `runs`).
    pub run: usize,
    /// Position within its repetition.
    pub position: usize,
    /// Without the neighbour.
    pub solo: bool,
    /// 1-minute load average when the window opened.
    pub load1: f64,
    /// The loop device did direct I/O to its backing file.
    pub direct_io: bool,
    /// The window, in seconds since the neighbour started.
    pub window_start_s: f64,
    pub window_end_s: f64,
    /// When the post-pull sync returned.
    pub sync_end_s: f64,
    /// Update wall time (0 for the baseline).
    pub update_s: f64,
    /// `syncfs` right after the pull.
    pub sync_s: f64,
    /// CPU seconds (user + system) of the pulling process.
    pub cpu_s: f64,
    /// The server's CPU seconds over the window.
    pub server_cpu_s: f64,
    /// Loop device counters from the window's start until the sync returned.
    pub device: DiskStats,
    pub written_bytes: u64,
    /// `written_bytes` minus the neighbour's ops in that span × the
    /// baseline's bytes per op (None for solo and baseline trials).
    pub written_bytes_corrected: Option<u64>,
    /// Device bytes written during the pull only (before the sync).
    pub written_in_window_bytes: u64,
    pub new_objects: NewObjects,
    /// The neighbour over the window, and over the window plus the sync.
    pub neighbour: Option<WindowStats>,
    pub neighbour_with_sync: Option<WindowStats>,
    /// The baseline reference for this window's length.
    pub reference: Option<WindowStats>,
    /// `neighbour` / `reference`.
    pub ratios: Option<Ratios>,
    /// The neighbour's file wrapped (its writes became overwrites).
    pub neighbour_wraps: u32,
    pub log: PathBuf,
    pub ops_csv: Option<PathBuf>,
    /// The client's last `--json` event (its governor's own figures).
    pub client_last_event: Option<serde_json::Value>,
    /// The etcd neighbour (`--etcd`).
    pub etcd: Option<EtcdTrial>,
}

/// What the etcd neighbour saw in a trial's update window.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EtcdTrial {
    /// Put latencies (client side), like the built-in neighbour's
    /// fdatasyncs (the `*_ms` fields are put latencies).
    pub puts: WindowStats,
    pub reference: Option<WindowStats>,
    pub ratios: Option<Ratios>,
    /// etcd's own histograms over the window.
    pub server: etcd::EtcdWindow,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct ArmSummary {
    pub arm: String,
    pub trials: usize,
    pub solo_trials: usize,
    pub p50_ratio: Summary,
    pub p99_ratio: Summary,
    pub p999_ratio: Summary,
    pub max_ratio: Summary,
    pub iops_ratio: Summary,
    pub p99_ms: Summary,
    pub max_ms: Summary,
    /// The same, over the window plus the post-pull sync.
    pub p99_ratio_with_sync: Summary,
    pub max_ratio_with_sync: Summary,
    pub update_s: Summary,
    /// Median update_s / stock ostree pull's median (with neighbour).
    pub time_vs_ostree: f64,
    pub sync_s: Summary,
    pub cpu_s: Summary,
    pub new_objects: Summary,
    pub new_apparent_bytes: Summary,
    pub new_allocated_bytes: Summary,
    /// Device bytes / new objects' allocated bytes: raw (neighbour's writes
    /// included), corrected, and from the solo trials.
    pub written_over_allocated_raw: Summary,
    pub written_over_allocated_corrected: Summary,
    pub written_over_allocated_solo: Summary,
    pub written_over_apparent_solo: Summary,
    pub update_s_solo: Summary,
    pub sync_s_solo: Summary,
    /// `--etcd`: put latency ratios and etcd's wal fsync p99 bucket.
    pub etcd_put_p99_ratio: Summary,
    pub etcd_put_max_ratio: Summary,
    pub etcd_wal_fsync_p99_le_ms: Summary,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Target {
    pub update: String,
    pub name: String,
    pub value: f64,
    pub limit: f64,
    /// PASS, MISS, or NOT RUN (the default mode's arm was not run).
    pub verdict: &'static str,
}

/// One update (share) of the run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UpdateReport {
    pub share: f64,
    pub fixture: PathBuf,
    pub v1_commit: String,
    pub v2_commit: String,
    pub v2_repo_bytes: u64,
    pub template: PathBuf,
    pub template_objects: usize,
    pub server_url: String,
    /// Median device bytes per neighbour op in the baseline windows.
    pub baseline_bytes_per_op: f64,
    pub trials: Vec<Trial>,
    pub summaries: Vec<ArmSummary>,
    pub targets: Vec<Target>,
    pub chart: Option<PathBuf>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Calibration {
    pub seconds: u64,
    /// fio's own numbers (json+ `sync` section) for the job.
    pub fio: neighbour::FioSync,
    /// The built-in neighbour over the same length, alone.
    pub builtin: WindowStats,
}

/// The JSON written to `target/bench/io-<stamp>.json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub benchmark: &'static str,
    pub started: String,
    pub finished: String,
    pub git: Option<String>,
    pub scale: Scale,
    pub repo_mode: RepoMode,
    pub runs: usize,
    pub solo_runs: usize,
    pub warmup_s: f64,
    pub arms: Vec<String>,
    pub io_modes: Vec<String>,
    pub default_io_mode: Option<String>,
    pub server_binary: PathBuf,
    pub client_binary: Option<PathBuf>,
    pub load_before: f64,
    pub load_after: f64,
    pub cpus: usize,
    pub kernel: String,
    pub scratch_fs_bytes: u64,
    pub scratch_direct_io: bool,
    pub neighbour: String,
    pub calibration: Option<Calibration>,
    pub updates: Vec<UpdateReport>,
    pub logs: PathBuf,
}

// ---------------------------------------------------------------------------
// The benchmark
// ---------------------------------------------------------------------------

pub fn io(opts: &IoOptions) -> Result<()> {
    super::interrupt()?;
    let mut tools = super::SCRATCH_TOOLS.to_vec();
    tools.extend([FIO, OSTREE]);
    if opts.etcd {
        tools.push(ETCD);
    }
    super::require(&tools)?;
    anyhow::ensure!(opts.runs >= 1, "--runs must be at least 1");
    let started = SystemTime::now();
    let stamp = super::utc_stamp(started);
    let bench = super::bench_dir()?;
    let logs = bench.join(format!("io-{stamp}.logs"));
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;

    let server_bin = match &opts.server_bin {
        Some(p) => std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))?,
        None => super::server_binary()?.0,
    };
    anyhow::ensure!(
        server_bin.is_file(),
        "no server binary at {}",
        server_bin.display()
    );

    // Which arms: the oscontent ones need a client with `pull`.
    let wants_client = opts.arms.as_ref().is_none_or(|f| {
        f.iter()
            .any(|a| a.trim() == "oscontent" || a.trim().starts_with("oscontent:"))
    });
    let (client_bin, modes, default_mode) = if wants_client {
        let bin = client_binary(opts.client_bin.as_deref())?;
        let (listed, default) = client_modes(&bin)?;
        let modes = match &opts.io_modes {
            Some(m) => {
                if !listed.is_empty() {
                    for x in m {
                        anyhow::ensure!(
                            listed.contains(x),
                            "--io-modes: {bin} has no io-mode {x:?} (it lists: {})",
                            listed.join(", "),
                            bin = bin.display()
                        );
                    }
                }
                m.clone()
            }
            None if !listed.is_empty() => listed,
            None => DEFAULT_IO_MODES.iter().map(|s| (*s).to_owned()).collect(),
        };
        let default = default.or_else(|| modes.first().cloned());
        (Some(bin), modes, default)
    } else {
        (None, Vec::new(), None)
    };
    let arms = select_arms(opts.arms.as_deref(), &modes)?;
    anyhow::ensure!(!arms.is_empty(), "no arms selected");
    let pulling: Vec<Arm> = arms
        .iter()
        .filter(|a| **a != Arm::Baseline)
        .cloned()
        .collect();
    let shares = opts.updates.shares();
    eprintln!(
        "xtask: bench io: arms {}; {} trials per update x {} update(s) ({} runs + {} solo)",
        arms.iter().map(Arm::name).collect::<Vec<_>>().join(", "),
        opts.runs * arms.len() + opts.solo_runs * pulling.len(),
        shares.len(),
        opts.runs,
        opts.solo_runs
    );

    let (load_before, cpus) = super::load();
    let mut updates = Vec::new();
    let mut calibration = None;
    let mut fs_bytes = 0;
    let mut direct_io = true;
    for (ui, share) in shares.into_iter().enumerate() {
        check_interrupted()?;
        let spec = FixtureSpec {
            update_share: share,
            ..FixtureSpec::new(opts.scale)
        };
        eprintln!(
            "xtask: building (or reusing) the {} fixture with a {:.0}% update",
            opts.scale,
            share * 100.0
        );
        let fx = fixtures::ensure(&spec, &fixtures::default_dir(&spec))?;
        let (v1, v2) = (&fx.releases[0], &fx.releases[1]);
        let ulogs = logs.join(format!("update-{:.0}", share * 100.0));
        std::fs::create_dir_all(&ulogs)?;

        // Room for v1 unpacked, the update, the neighbour's file, and slack.
        let size = (2 * v1.tree_bytes + v2.tree_bytes / 2 + 2 * NEIGHBOUR_FILE_MAX)
            .max(super::scratch::MIN_SIZE);
        let size = size.div_ceil(1 << 30) << 30;
        let template = repo::template(
            &bench.join("io-templates"),
            &server_bin,
            v1,
            &spec.ref_name,
            opts.mode,
            size,
            &ulogs,
            opts.arm_timeout,
        )?;
        fs_bytes = template.meta.fs_bytes;

        let state = tempfile::Builder::new()
            .prefix("server-state-")
            .tempdir_in(&ulogs)
            .context("creating the server's state dir")?;
        let server = Server::start(
            &server_bin,
            &v2.oscontainer,
            state.path(),
            &ulogs.join("server.log"),
        )?;
        eprintln!("xtask: serving v2 {} at {}", v2.version, server.url);

        if ui == 0 && opts.calibrate_secs > 0 {
            calibration = Some(calibrate(&template, opts.calibrate_secs, &ulogs)?);
        }

        let ctx = Ctx {
            opts,
            template: &template,
            server: &server,
            served_repo: &v2.repo,
            ref_name: &spec.ref_name,
            v2_commit: &v2.commit,
            client_bin: client_bin.as_deref(),
            logs: &ulogs,
            dropped: std::cell::Cell::new(false),
        };
        let mut trials: Vec<(Trial, NeighbourLog)> = Vec::new();
        let min_baseline = match opts.scale {
            Scale::Small => MIN_BASELINE_SMALL,
            Scale::Full => MIN_BASELINE_FULL,
        };
        for run in 0..opts.runs {
            let mut order = pulling.clone();
            if arms.contains(&Arm::Baseline) {
                order.push(Arm::Baseline);
            }
            if run % 2 == 1 {
                order.reverse();
            }
            for (position, arm) in order.into_iter().enumerate() {
                check_interrupted()?;
                let longest = trials
                    .iter()
                    .filter(|(t, _)| !t.solo && t.arm != "baseline")
                    .map(|(t, _)| t.update_s)
                    .fold(0.0f64, f64::max);
                let baseline_len = opts
                    .baseline_secs
                    .unwrap_or((longest * BASELINE_MARGIN).max(min_baseline));
                let (trial, log) = ctx
                    .trial(&arm, run, position, false, baseline_len)
                    .with_context(|| {
                        format!(
                            "update {:.0}%, run {run}, arm {}",
                            share * 100.0,
                            arm.name()
                        )
                    })?;
                direct_io &= trial.direct_io;
                progress(&trial, share, opts.runs);
                trials.push((trial, log));
            }
        }
        for s in 0..opts.solo_runs {
            for (position, arm) in pulling.iter().enumerate() {
                check_interrupted()?;
                let (trial, log) = ctx
                    .trial(arm, opts.runs + s, position, true, 0.0)
                    .with_context(|| {
                        format!("update {:.0}%, solo {s}, arm {}", share * 100.0, arm.name())
                    })?;
                progress(&trial, share, opts.runs);
                trials.push((trial, log));
            }
        }
        let server_url = server.url.clone();
        drop(server);

        let mut report = analyse(share, trials, &arms, default_mode.as_deref(), &ulogs);
        report.fixture = fx.root.clone();
        report.v1_commit = v1.commit.clone();
        report.v2_commit = v2.commit.clone();
        report.v2_repo_bytes = v2.repo_bytes;
        report.template = template.image.clone();
        report.template_objects = template.objects.len();
        report.server_url = server_url;
        updates.push(report);
    }
    let (load_after, _) = super::load();

    let report = Report {
        benchmark: "io",
        started: stamp,
        finished: super::utc_stamp(SystemTime::now()),
        git: super::git_state(),
        scale: opts.scale,
        repo_mode: opts.mode,
        runs: opts.runs,
        solo_runs: opts.solo_runs,
        warmup_s: opts.warmup.as_secs_f64(),
        arms: arms.iter().map(Arm::name).collect(),
        io_modes: modes,
        default_io_mode: default_mode,
        server_binary: server_bin,
        client_binary: client_bin,
        load_before,
        load_after,
        cpus,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        scratch_fs_bytes: fs_bytes,
        scratch_direct_io: direct_io,
        neighbour: format!(
            "built-in: {}-byte write + fdatasync loop on a fallocated file (fio --rw=write --ioengine=sync --fdatasync=1 --bs={} equivalent; see calibration)",
            neighbour::BLOCK,
            neighbour::BLOCK
        ),
        calibration,
        updates,
        logs,
    };
    let path = super::results_path("io", started)?;
    let mut json = serde_json::to_string_pretty(&report)?;
    json.push('\n');
    std::fs::write(&path, json).with_context(|| format!("writing {}", path.display()))?;
    print!("{}", render(&report));
    println!("results: {}", path.display());
    let missed: Vec<&Target> = report
        .updates
        .iter()
        .flat_map(|u| &u.targets)
        .filter(|t| t.verdict != "PASS")
        .collect();
    if opts.strict && !missed.is_empty() {
        bail!(
            "{} target(s) missed or not evaluated: {}",
            missed.len(),
            missed
                .iter()
                .map(|t| format!("{} ({}: {})", t.name, t.update, t.verdict))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    Ok(())
}

fn progress(t: &Trial, share: f64, runs: usize) {
    let r = t.ratios.unwrap_or_default();
    eprintln!(
        "xtask: {:.0}% run {}/{}{} {:<28} update {:>7.2}s sync {:>6.2}s written {:>10} new {:>6} objs ({})  load {:.2}{}",
        share * 100.0,
        t.run + 1,
        runs,
        if t.solo { " solo" } else { "" },
        t.arm,
        t.update_s,
        t.sync_s,
        super::mib(t.written_bytes as f64),
        t.new_objects.count,
        super::mib(t.new_objects.allocated_bytes as f64),
        t.load1,
        match &t.neighbour {
            Some(n) => format!(
                "  neighbour p99 {:.2}ms max {:.1}ms iops {:.0}{}",
                n.p99_ms,
                n.max_ms,
                n.iops,
                if r.p99.is_finite() && r.p99 > 0.0 {
                    format!(" (x{:.2} p99)", r.p99)
                } else {
                    String::new()
                }
            ),
            None => String::new(),
        }
    );
}

/// The client binary: the given one, or a release build of the workspace's.
fn client_binary(given: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = given {
        let p = std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))?;
        anyhow::ensure!(p.is_file(), "no client binary at {}", p.display());
        return Ok(p);
    }
    crate::testrun::cargo(&["build", "--release", "--quiet", "-p", "oscontent"])
        .context("building the oscontent client (release)")?;
    Ok(crate::testrun::target_dir().join("release/oscontent"))
}

/// The io-modes `BIN pull --help` lists, and its default; fails clearly if
/// the binary has no `pull` or `pull` has no `--io-mode`.
fn client_modes(bin: &Path) -> Result<(Vec<String>, Option<String>)> {
    let out = Command::new(bin)
        .args(["pull", "--help"])
        .output()
        .with_context(|| format!("running {} pull --help", bin.display()))?;
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{} has no working `pull` subcommand ({}): {}\nThe oscontent arms need the client from issue 5; run only the ostree arms with --arms baseline,ostree,ostree-per-object-fsync, or point --client-bin at a build that has `pull`.",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let Some((modes, default)) = parse_io_modes(&help) else {
        bail!(
            "`{} pull --help` lists no --io-mode option; the oscontent arms compare io-modes. Use --arms to run without them.",
            bin.display()
        );
    };
    Ok((modes, default))
}

/// Everything a trial needs.
struct Ctx<'a> {
    opts: &'a IoOptions,
    template: &'a Template,
    server: &'a Server,
    served_repo: &'a Path,
    ref_name: &'a str,
    v2_commit: &'a str,
    client_bin: Option<&'a Path>,
    logs: &'a Path,
    /// The page cache was dropped for this update.
    dropped: std::cell::Cell<bool>,
}

impl Ctx<'_> {
    fn trial(
        &self,
        arm: &Arm,
        run: usize,
        position: usize,
        solo: bool,
        baseline_len: f64,
    ) -> Result<(Trial, NeighbourLog)> {
        let opts = self.opts;
        let fs = ScratchFs::create_with(&ScratchOptions {
            template: Some(self.template.image.clone()),
            ..ScratchOptions::new(0)
        })?;
        let repo_path = fs.path().join(repo::REPO_DIR);
        repo::set_remote(&repo_path, &self.server.url)?;
        let wal = fs.path().join("neighbour").join("wal");
        let limit = opts.warmup + opts.arm_timeout + Duration::from_secs(600);
        let with_neighbour = !solo;
        if with_neighbour {
            let need = neighbour::file_bytes(limit.as_secs_f64(), NEIGHBOUR_MAX_IOPS);
            neighbour::prepare(&wal, need.min(NEIGHBOUR_FILE_MAX))?;
        }
        // etcd initialises its data dir before the caches are dropped.
        let etcd = if opts.etcd && with_neighbour {
            Some(etcd::Etcd::start(
                &fs.path().join("etcd"),
                &self.logs.join(format!(
                    "run{run}-{}-etcd.log",
                    arm.name().replace(':', "-")
                )),
            )?)
        } else {
            None
        };
        // The trial's filesystem was just mounted, so its cache is cold.
        // The page cache is dropped before the first trial of an update
        // (or every trial with --drop-caches-each-trial); the served repo
        // is then read back in, so the server (a remote machine in
        // production) does not compete for the node's disk, and a sync
        // leaves nothing dirty (the template's copy above) for the window.
        if opts.drop_caches_each_trial || !self.dropped.get() {
            super::drop_caches()?;
            self.dropped.set(true);
        }
        repo::warm(self.served_repo)?;
        rustix::fs::sync();
        let tag = format!(
            "run{run}-{}{}",
            arm.name().replace(':', "-"),
            if solo { "-solo" } else { "" }
        );
        let log = self.logs.join(format!("{tag}.log"));

        let epoch = Instant::now();
        let nb = if with_neighbour {
            Some(Neighbour::start(&wal, epoch, limit)?)
        } else {
            None
        };
        let load = match &etcd {
            Some(e) => Some(etcd::Load::start(e.client, epoch, limit)?),
            None => None,
        };
        super::sleep(opts.warmup)?;
        let load1 = super::load().0;
        let children_cpu = || super::cpu_seconds(std::process::id()).map_or(0.0, |(_, c)| c);
        let server_cpu = || super::cpu_seconds(self.server.process.id()).map_or(0.0, |(o, _)| o);
        let (cpu0, scpu0) = (children_cpu(), server_cpu());
        let m0 = etcd.as_ref().map(etcd::Etcd::metrics).transpose()?;
        let dev0 = fs.stats()?;
        let t_start = epoch.elapsed();
        match arm {
            Arm::Baseline => super::sleep(Duration::from_secs_f64(baseline_len))?,
            Arm::Ostree | Arm::OstreePerObjectFsync => {
                let mut cmd = Command::new("ostree");
                cmd.arg(format!("--repo={}", repo_path.display()))
                    .arg("pull");
                if *arm == Arm::OstreePerObjectFsync {
                    cmd.arg("--per-object-fsync");
                }
                cmd.args([repo::REMOTE, self.ref_name]);
                run_bounded(&mut cmd, &log, opts.arm_timeout)?;
            }
            Arm::Oscontent(mode) => {
                let bin = self.client_bin.context("no client binary")?;
                let mut cmd = Command::new(bin);
                cmd.args(["pull", "--repo"])
                    .arg(&repo_path)
                    .args(["--remote", repo::REMOTE, "--ref", self.ref_name])
                    .args(["--io-mode", mode, "--json"]);
                run_bounded(&mut cmd, &log, opts.arm_timeout)?;
            }
        }
        let t_end = epoch.elapsed();
        let dev1 = fs.stats()?;
        let m1 = etcd.as_ref().map(etcd::Etcd::metrics).transpose()?;
        let (cpu1, scpu1) = (children_cpu(), server_cpu());
        let sync = fs.syncfs()?;
        let t_sync = epoch.elapsed();
        let dev2 = fs.stats()?;
        let mut log_nb = match nb {
            Some(nb) => {
                super::sleep(TAIL)?;
                nb.finish()?
            }
            None => NeighbourLog::default(),
        };
        if let Some(load) = load {
            log_nb.etcd_ops = load.finish()?;
        }
        drop(etcd);
        let etcd_server = m0.zip(m1).map(|(a, b)| etcd::EtcdWindow::between(&a, &b));
        let new_objects = if *arm == Arm::Baseline {
            NewObjects::default()
        } else {
            let head = repo::ref_commit(&repo_path, self.ref_name);
            anyhow::ensure!(
                head.as_deref() == Some(self.v2_commit),
                "after {}, the ref {} is at {:?}, expected v2 {}",
                arm.name(),
                self.ref_name,
                head,
                self.v2_commit
            );
            repo::new_objects(&repo_path, &self.template.objects)?
        };
        let ops_csv = if with_neighbour {
            let p = self.logs.join(format!("{tag}.ops.csv"));
            neighbour::write_csv(&p, &log_nb.ops)?;
            Some(p)
        } else {
            None
        };
        let device = dev2.since(&dev0);
        let trial = Trial {
            arm: arm.name(),
            run,
            position,
            solo,
            load1,
            direct_io: fs.direct_io(),
            window_start_s: t_start.as_secs_f64(),
            window_end_s: t_end.as_secs_f64(),
            sync_end_s: t_sync.as_secs_f64(),
            update_s: if *arm == Arm::Baseline {
                0.0
            } else {
                (t_end - t_start).as_secs_f64()
            },
            sync_s: sync.as_secs_f64(),
            cpu_s: cpu1 - cpu0,
            server_cpu_s: scpu1 - scpu0,
            written_bytes: device.written_bytes(),
            written_in_window_bytes: dev1.since(&dev0).written_bytes(),
            device,
            written_bytes_corrected: None,
            new_objects,
            neighbour: None,
            neighbour_with_sync: None,
            reference: None,
            ratios: None,
            neighbour_wraps: log_nb.wraps,
            client_last_event: matches!(arm, Arm::Oscontent(_))
                .then(|| last_json_line(&log))
                .flatten(),
            log,
            ops_csv,
            etcd: etcd_server.map(|server| EtcdTrial {
                server,
                ..Default::default()
            }),
        };
        // Quick per-trial figures for the progress line (ratios come later).
        let mut trial = trial;
        if with_neighbour {
            let (a, b) = window_ns(&trial);
            trial.neighbour = Some(stats::window(&log_nb.ops, a, b));
        }
        drop(fs);
        Ok((trial, log_nb))
    }
}

/// The last line of `log` that is a JSON object.
fn last_json_line(log: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .find(serde_json::Value::is_object)
}

/// The update window of a trial on its neighbour's clock, in ns.
fn window_ns(t: &Trial) -> (u64, u64) {
    (
        (t.window_start_s * 1e9) as u64,
        (t.window_end_s * 1e9) as u64,
    )
}

/// fio alone, then the built-in neighbour alone, on trial filesystems.
fn calibrate(template: &Template, secs: u64, logs: &Path) -> Result<Calibration> {
    eprintln!("xtask: calibration: fio alone for {secs}s, then the built-in neighbour alone");
    let size = neighbour::file_bytes(secs as f64, NEIGHBOUR_MAX_IOPS).min(NEIGHBOUR_FILE_MAX);
    let fio = {
        let fs = ScratchFs::create_with(&ScratchOptions {
            template: Some(template.image.clone()),
            ..ScratchOptions::new(0)
        })?;
        super::drop_caches()?;
        neighbour::fio_alone(
            &fs.path().join("fio"),
            secs,
            size,
            &logs.join("calibration-fio.log"),
        )?
    };
    let builtin = {
        let fs = ScratchFs::create_with(&ScratchOptions {
            template: Some(template.image.clone()),
            ..ScratchOptions::new(0)
        })?;
        let wal = fs.path().join("neighbour").join("wal");
        neighbour::prepare(&wal, size)?;
        super::drop_caches()?;
        let epoch = Instant::now();
        let nb = Neighbour::start(&wal, epoch, Duration::from_secs(secs + 60))?;
        super::sleep(Duration::from_secs(secs))?;
        let end = epoch.elapsed().as_nanos() as u64;
        let log = nb.finish()?;
        stats::window(&log.ops, 0, end)
    };
    eprintln!(
        "xtask: calibration: fio p50 {:.2}ms p99 {:.2}ms max {:.1}ms {:.0} IOPS; built-in p50 {:.2}ms p99 {:.2}ms max {:.1}ms {:.0} IOPS",
        fio.p50_ms, fio.p99_ms, fio.max_ms, fio.iops, builtin.p50_ms, builtin.p99_ms, builtin.max_ms, builtin.iops
    );
    Ok(Calibration {
        seconds: secs,
        fio,
        builtin,
    })
}

/// Ratios against the baseline, corrected bytes, summaries, targets, chart.
fn analyse(
    share: f64,
    mut trials: Vec<(Trial, NeighbourLog)>,
    arms: &[Arm],
    default_mode: Option<&str>,
    logs: &Path,
) -> UpdateReport {
    let baselines: Vec<(&[Op], u64, f64)> = trials
        .iter()
        .filter(|(t, _)| t.arm == "baseline")
        .map(|(t, l)| {
            (
                l.ops.as_slice(),
                window_ns(t).0,
                t.window_end_s - t.window_start_s,
            )
        })
        .collect();
    // Device bytes per neighbour op, from the baseline windows (which hold
    // nothing but the neighbour).
    let per_op = Summary::of(
        &trials
            .iter()
            .filter(|(t, _)| t.arm == "baseline")
            .map(|(t, l)| {
                let n = l
                    .ops
                    .iter()
                    .filter(|o| {
                        let e = o.end_ns() as f64 / 1e9;
                        e >= t.window_start_s && e < t.sync_end_s
                    })
                    .count();
                t.written_bytes as f64 / n.max(1) as f64
            })
            .collect::<Vec<_>>(),
    )
    .median;
    let mut computed = Vec::new();
    for (t, l) in &trials {
        if t.solo {
            computed.push((None, None, None, None, None));
            continue;
        }
        let (a, b) = window_ns(t);
        let sync_end = (t.sync_end_s * 1e9) as u64;
        let w = stats::window(&l.ops, a, b);
        let ws = stats::window(&l.ops, a, sync_end);
        let reference = stats::baseline_reference(&baselines, w.seconds);
        let ratios = reference.as_ref().map(|r| Ratios::of(&w, r));
        let ref_sync = stats::baseline_reference(&baselines, ws.seconds);
        let ratios_sync = ref_sync.as_ref().map(|r| Ratios::of(&ws, r));
        let corrected = (t.arm != "baseline" && per_op.is_finite())
            .then(|| (t.written_bytes as f64 - ws.ops as f64 * per_op).max(0.0) as u64);
        computed.push((Some((w, ws)), reference, ratios, ratios_sync, corrected));
    }
    let etcd_baselines: Vec<(&[Op], u64, f64)> = trials
        .iter()
        .filter(|(t, _)| t.arm == "baseline" && t.etcd.is_some())
        .map(|(t, l)| {
            (
                l.etcd_ops.as_slice(),
                window_ns(t).0,
                t.window_end_s - t.window_start_s,
            )
        })
        .collect();
    let etcd_computed: Vec<Option<(WindowStats, Option<WindowStats>)>> = trials
        .iter()
        .map(|(t, l)| {
            t.etcd.as_ref()?;
            let (a, b) = window_ns(t);
            let w = stats::window(&l.etcd_ops, a, b);
            Some((w, stats::baseline_reference(&etcd_baselines, w.seconds)))
        })
        .collect();
    for ((t, _), c) in trials.iter_mut().zip(etcd_computed) {
        if let (Some(e), Some((w, reference))) = (t.etcd.as_mut(), c) {
            e.puts = w;
            e.ratios = reference.as_ref().map(|r| Ratios::of(&w, r));
            e.reference = reference;
        }
    }
    let mut sync_ratios: Vec<Option<Ratios>> = Vec::new();
    for ((t, _), (w, reference, ratios, rs, corrected)) in trials.iter_mut().zip(computed) {
        if let Some((w, ws)) = w {
            t.neighbour = Some(w);
            t.neighbour_with_sync = Some(ws);
        }
        t.reference = reference;
        t.ratios = ratios;
        t.written_bytes_corrected = corrected;
        sync_ratios.push(rs);
    }

    let ostree_time = Summary::of(
        &trials
            .iter()
            .filter(|(t, _)| t.arm == "ostree" && !t.solo)
            .map(|(t, _)| t.update_s)
            .collect::<Vec<_>>(),
    )
    .median;
    let mut summaries = Vec::new();
    for arm in arms {
        let name = arm.name();
        let pick = |solo: bool| {
            trials
                .iter()
                .zip(&sync_ratios)
                .filter(|((t, _), _)| t.arm == name && t.solo == solo)
                .map(|((t, _), rs)| (t, rs))
                .collect::<Vec<_>>()
        };
        let with = pick(false);
        let solo = pick(true);
        let of = |v: &[(&Trial, &Option<Ratios>)], f: &dyn Fn(&Trial, &Option<Ratios>) -> f64| {
            Summary::of(&v.iter().map(|(t, r)| f(t, r)).collect::<Vec<_>>())
        };
        let r = |f: fn(&Ratios) -> f64| {
            move |t: &Trial, _: &Option<Ratios>| t.ratios.as_ref().map_or(f64::NAN, f)
        };
        let rs = |f: fn(&Ratios) -> f64| {
            move |_: &Trial, s: &Option<Ratios>| s.as_ref().map_or(f64::NAN, f)
        };
        let pulling = *arm != Arm::Baseline;
        let over = |bytes: f64, t: &Trial| {
            if pulling {
                bytes / t.new_objects.allocated_bytes as f64
            } else {
                f64::NAN
            }
        };
        let update_s = of(&with, &|t, _| if pulling { t.update_s } else { f64::NAN });
        summaries.push(ArmSummary {
            arm: name.clone(),
            trials: with.len(),
            solo_trials: solo.len(),
            p50_ratio: of(&with, &r(|x| x.p50)),
            p99_ratio: of(&with, &r(|x| x.p99)),
            p999_ratio: of(&with, &r(|x| x.p999)),
            max_ratio: of(&with, &r(|x| x.max)),
            iops_ratio: of(&with, &r(|x| x.iops)),
            p99_ms: of(&with, &|t, _| t.neighbour.map_or(f64::NAN, |n| n.p99_ms)),
            max_ms: of(&with, &|t, _| t.neighbour.map_or(f64::NAN, |n| n.max_ms)),
            p99_ratio_with_sync: of(&with, &rs(|x| x.p99)),
            max_ratio_with_sync: of(&with, &rs(|x| x.max)),
            time_vs_ostree: update_s.median / ostree_time,
            update_s,
            sync_s: of(&with, &|t, _| t.sync_s),
            cpu_s: of(&with, &|t, _| if pulling { t.cpu_s } else { f64::NAN }),
            new_objects: of(&with, &|t, _| t.new_objects.count as f64),
            new_apparent_bytes: of(&with, &|t, _| t.new_objects.apparent_bytes as f64),
            new_allocated_bytes: of(&with, &|t, _| t.new_objects.allocated_bytes as f64),
            written_over_allocated_raw: of(&with, &|t, _| over(t.written_bytes as f64, t)),
            written_over_allocated_corrected: of(&with, &|t, _| {
                t.written_bytes_corrected
                    .map_or(f64::NAN, |b| over(b as f64, t))
            }),
            written_over_allocated_solo: of(&solo, &|t, _| over(t.written_bytes as f64, t)),
            written_over_apparent_solo: of(&solo, &|t, _| {
                t.written_bytes as f64 / t.new_objects.apparent_bytes as f64
            }),
            update_s_solo: of(&solo, &|t, _| t.update_s),
            sync_s_solo: of(&solo, &|t, _| t.sync_s),
            etcd_put_p99_ratio: of(&with, &|t, _| {
                t.etcd
                    .as_ref()
                    .and_then(|e| e.ratios)
                    .map_or(f64::NAN, |r| r.p99)
            }),
            etcd_put_max_ratio: of(&with, &|t, _| {
                t.etcd
                    .as_ref()
                    .and_then(|e| e.ratios)
                    .map_or(f64::NAN, |r| r.max)
            }),
            etcd_wal_fsync_p99_le_ms: of(&with, &|t, _| {
                t.etcd
                    .as_ref()
                    .map_or(f64::NAN, |e| e.server.wal_fsync_p99_le_ms)
            }),
        });
    }
    let update = format!("{:.0}%", share * 100.0);
    let targets = targets(&update, &summaries, default_mode);
    let chart = draw_chart(&update, &trials, arms, logs);
    UpdateReport {
        share,
        fixture: PathBuf::new(),
        v1_commit: String::new(),
        v2_commit: String::new(),
        v2_repo_bytes: 0,
        template: PathBuf::new(),
        template_objects: 0,
        server_url: String::new(),
        baseline_bytes_per_op: per_op,
        trials: trials.into_iter().map(|(t, _)| t).collect(),
        summaries,
        targets,
        chart,
    }
}

/// The targets for the default io-mode's arm.
fn targets(update: &str, summaries: &[ArmSummary], default_mode: Option<&str>) -> Vec<Target> {
    let arm = default_mode.map(|m| format!("oscontent:{m}"));
    let s = arm
        .as_ref()
        .and_then(|a| summaries.iter().find(|s| &s.arm == a && s.trials > 0));
    let bytes = |s: &ArmSummary| {
        if s.written_over_allocated_solo.n > 0 {
            s.written_over_allocated_solo.median
        } else {
            s.written_over_allocated_corrected.median
        }
    };
    let arm_label = arm
        .clone()
        .unwrap_or_else(|| "oscontent (default mode)".into());
    let rows: [(String, Option<f64>, f64); 4] = [
        (
            format!("{arm_label}: neighbour fdatasync p99 / baseline"),
            s.map(|s| s.p99_ratio.median),
            P99_TARGET,
        ),
        (
            format!("{arm_label}: neighbour fdatasync max / baseline max"),
            s.map(|s| s.max_ratio.median),
            MAX_TARGET,
        ),
        (
            format!("{arm_label}: update wall time / stock ostree pull"),
            s.map(|s| s.time_vs_ostree),
            TIME_TARGET,
        ),
        (
            format!(
                "{arm_label}: device bytes written / new objects' allocated size{}",
                if s.is_some_and(|s| s.written_over_allocated_solo.n > 0) {
                    " (solo trials)"
                } else {
                    " (neighbour-corrected)"
                }
            ),
            s.map(bytes),
            BYTES_TARGET,
        ),
    ];
    rows.into_iter()
        .map(|(name, value, limit)| {
            let value = value.unwrap_or(f64::NAN);
            Target {
                update: update.to_owned(),
                name,
                value,
                limit,
                verdict: if !value.is_finite() {
                    "NOT RUN"
                } else if value <= limit {
                    "PASS"
                } else {
                    "MISS"
                },
            }
        })
        .collect()
}

/// One panel per arm: its trial with the median p99 ratio (the baseline's
/// first trial), the window shaded, the baseline's p99 and max drawn.
fn draw_chart(
    update: &str,
    trials: &[(Trial, NeighbourLog)],
    arms: &[Arm],
    logs: &Path,
) -> Option<PathBuf> {
    let mut panels = Vec::new();
    let mut mode_i = 0;
    for arm in arms {
        let name = arm.name();
        let mut mine: Vec<&(Trial, NeighbourLog)> = trials
            .iter()
            .filter(|(t, _)| t.arm == name && !t.solo)
            .collect();
        if mine.is_empty() {
            continue;
        }
        mine.sort_by(|a, b| {
            let k = |x: &(Trial, NeighbourLog)| x.0.ratios.map_or(f64::NAN, |r| r.p99);
            k(a).total_cmp(&k(b))
        });
        let (t, l) = mine[mine.len() / 2];
        let n = t.neighbour.unwrap_or_default();
        let title = match arm {
            Arm::Baseline => format!(
                "baseline (run {}): p99 {:.2} ms, max {:.1} ms, {:.0} IOPS over the shaded {:.1}s window",
                t.run + 1,
                n.p99_ms,
                n.max_ms,
                n.iops,
                n.seconds
            ),
            _ => {
                let r = t.ratios.unwrap_or_default();
                format!(
                    "{name} (run {}): update {:.1}s + sync {:.2}s; p99 {:.2} ms (x{:.2}), max {:.1} ms (x{:.2}), IOPS x{:.2}",
                    t.run + 1,
                    t.update_s,
                    t.sync_s,
                    n.p99_ms,
                    r.p99,
                    n.max_ms,
                    r.max,
                    r.iops
                )
            }
        };
        let mut references = Vec::new();
        if let Some(r) = t.reference.filter(|_| *arm != Arm::Baseline) {
            references.push((format!("baseline p99 {:.2} ms", r.p99_ms), r.p99_ms));
            references.push((format!("baseline max {:.1} ms", r.max_ms), r.max_ms));
        }
        if matches!(arm, Arm::Oscontent(_)) {
            mode_i += 1;
        }
        panels.push(chart::Panel {
            title,
            points: l
                .ops
                .iter()
                .map(|o| (o.end_ns() as f64 / 1e9, f64::from(o.sync_ns) / 1e6))
                .collect(),
            window: (t.window_start_s, t.window_end_s.max(t.window_start_s)),
            sync: (*arm != Arm::Baseline).then_some((t.window_end_s, t.sync_end_s)),
            references,
            color: arm.color(mode_i),
        });
    }
    if panels.is_empty() {
        return None;
    }
    let path = logs.join(format!("io-{}.svg", update.trim_end_matches('%')));
    let title = format!(
        "bench io, {update} update: neighbour fdatasync latency (blue: update window, orange: post-pull sync)"
    );
    match chart::draw(&path, &title, &panels) {
        Ok(()) => Some(path),
        Err(e) => {
            eprintln!("xtask: WARNING: no chart: {e:#}");
            None
        }
    }
}

/// The human-readable table.
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    s += &format!(
        "\nbench io: {} fixture, {} target repo, {} run(s) (+{} solo) per arm, warm-up {:.0}s, git {}\n",
        r.scale,
        r.repo_mode.as_str(),
        r.runs,
        r.solo_runs,
        r.warmup_s,
        r.git.as_deref().unwrap_or("?")
    );
    s += &format!(
        "scratch: XFS on loop ({}), {}; load {:.2} -> {:.2} on {} CPUs; kernel {}\n",
        if r.scratch_direct_io {
            "direct-io"
        } else {
            "NO direct-io"
        },
        super::mib(r.scratch_fs_bytes as f64),
        r.load_before,
        r.load_after,
        r.cpus,
        r.kernel
    );
    s += &format!("neighbour: {}\n", r.neighbour);
    if let Some(c) = &r.calibration {
        s += &format!(
            "calibration ({}s alone): fio p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.1} ms, {:.0} IOPS | built-in p50 {:.2} p99 {:.2} p99.9 {:.2} max {:.1} ms, {:.0} IOPS\n",
            c.seconds,
            c.fio.p50_ms,
            c.fio.p99_ms,
            c.fio.p999_ms,
            c.fio.max_ms,
            c.fio.iops,
            c.builtin.p50_ms,
            c.builtin.p99_ms,
            c.builtin.p999_ms,
            c.builtin.max_ms,
            c.builtin.iops
        );
    }
    let med = |x: &Summary| x.median;
    for u in &r.updates {
        s += &format!(
            "\n== {:.0}% update (v2 {}), new objects (median): {:.0}, apparent {}, allocated {}; baseline {:.0} device bytes per neighbour op\n",
            u.share * 100.0,
            &u.v2_commit.get(..12).unwrap_or(""),
            u.summaries
                .iter()
                .find(|x| x.arm == "ostree")
                .or(u.summaries.iter().find(|x| x.arm != "baseline"))
                .map_or(f64::NAN, |x| med(&x.new_objects)),
            super::mib(u.summaries.iter().find(|x| x.arm != "baseline").map_or(f64::NAN, |x| med(&x.new_apparent_bytes))),
            super::mib(u.summaries.iter().find(|x| x.arm != "baseline").map_or(f64::NAN, |x| med(&x.new_allocated_bytes))),
            u.baseline_bytes_per_op
        );
        s += "neighbour fdatasync in the update window, as ratios to the baseline's same-length window (median [min..max] over trials)\n";
        s += &format!(
            "{:<26} {:>3} {:>18} {:>18} {:>18} {:>18} {:>8} {:>9} {:>9}\n",
            "arm", "n", "p50 x", "p99 x", "p99.9 x", "max x", "IOPS x", "p99 ms", "max ms"
        );
        let cell = |x: &Summary| {
            if x.n == 0 || !x.median.is_finite() {
                "-".to_owned()
            } else {
                format!("{:.2} [{:.2}..{:.2}]", x.median, x.min, x.max)
            }
        };
        for a in &u.summaries {
            s += &format!(
                "{:<26} {:>3} {:>18} {:>18} {:>18} {:>18} {:>8.2} {:>9.2} {:>9.1}\n",
                a.arm,
                a.trials,
                cell(&a.p50_ratio),
                cell(&a.p99_ratio),
                cell(&a.p999_ratio),
                cell(&a.max_ratio),
                a.iops_ratio.median,
                a.p99_ms.median,
                a.max_ms.median
            );
        }
        s += "\nupdate cost (medians; bytes are device bytes from the window's start to the end of the post-pull sync)\n";
        s += &format!(
            "{:<26} {:>9} {:>8} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10}\n",
            "arm",
            "update s",
            "x ostree",
            "sync s",
            "cpu s",
            "w/alloc",
            "w/alloc",
            "w/alloc",
            "w/appar",
            "solo s",
            "solo syn",
            "p99x+sync"
        );
        s += &format!(
            "{:<26} {:>9} {:>8} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10}\n",
            "", "", "", "", "", "raw", "corr.", "solo", "solo", "", "", ""
        );
        let f = |x: f64, p: usize| {
            if x.is_finite() {
                format!("{x:.p$}")
            } else {
                "-".to_owned()
            }
        };
        for a in u.summaries.iter().filter(|a| a.arm != "baseline") {
            s += &format!(
                "{:<26} {:>9} {:>8} {:>8} {:>7} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8} {:>10}\n",
                a.arm,
                f(a.update_s.median, 2),
                f(a.time_vs_ostree, 3),
                f(a.sync_s.median, 2),
                f(a.cpu_s.median, 1),
                f(a.written_over_allocated_raw.median, 3),
                f(a.written_over_allocated_corrected.median, 3),
                f(a.written_over_allocated_solo.median, 3),
                f(a.written_over_apparent_solo.median, 3),
                f(a.update_s_solo.median, 2),
                f(a.sync_s_solo.median, 2),
                f(a.p99_ratio_with_sync.median, 2),
            );
        }
        if u.summaries.iter().any(|a| a.etcd_put_p99_ratio.n > 0) {
            s += "\netcd neighbour (--etcd): put latency ratios to baseline, and etcd's wal fsync p99 (bucket bound)\n";
            for a in &u.summaries {
                s += &format!(
                    "{:<26} put p99 x{:>6}  put max x{:>6}  wal_fsync p99 <= {:>6} ms\n",
                    a.arm,
                    f(a.etcd_put_p99_ratio.median, 2),
                    f(a.etcd_put_max_ratio.median, 2),
                    f(a.etcd_wal_fsync_p99_le_ms.median, 1)
                );
            }
        }
        s += "\n";
        for t in &u.targets {
            s += &format!(
                "{:<7} {:<4} {:<90} {} (target <= {:.2})\n",
                t.verdict,
                t.update,
                t.name,
                f(t.value, 3),
                t.limit
            );
        }
        if let Some(c) = &u.chart {
            s += &format!("chart: {}\n", c.display());
        }
    }
    s += &format!("logs: {}\n", r.logs.display());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_modes_from_help() {
        let short = "Usage: oscontent pull [OPTIONS]\n\nOptions:\n      --io-mode <MODE>  How to write [default: paced] [possible values: paced, stock-like, per-object-fsync]\n      --json  Lines\n";
        let long = "Options:\n      --io-mode <IO_MODE>\n          How objects reach the disk\n\n          Possible values:\n          - paced:            incremental writeback\n          - stock-like:       one syncfs at the end\n          - per-object-fsync: fsync every object\n\n          [default: paced]\n\n      --io-latency-target <DUR>\n          [default: 10ms]\n";
        let no_values = "Options:\n      --io-mode <MODE>  free text\n      --json\n";
        // (help text, expected (modes, default)).
        type Case<'a> = (&'a str, Option<(Vec<&'a str>, Option<&'a str>)>);
        let cases: &[Case] = &[
            (
                short,
                Some((
                    vec!["paced", "stock-like", "per-object-fsync"],
                    Some("paced"),
                )),
            ),
            (
                long,
                Some((
                    vec!["paced", "stock-like", "per-object-fsync"],
                    Some("paced"),
                )),
            ),
            (no_values, Some((vec![], None))),
            ("Options:\n      --json\n", None),
        ];
        for (help, want) in cases {
            let got = parse_io_modes(help);
            let want = want.as_ref().map(|(m, d)| {
                (
                    m.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
                    d.map(str::to_owned),
                )
            });
            assert_eq!(got, want, "{help}");
        }
    }

    #[test]
    fn arm_filter() {
        let modes = vec!["paced".to_owned(), "stock-like".to_owned()];
        let names = |f: Option<&[String]>| {
            select_arms(f, &modes).map(|v| v.iter().map(Arm::name).collect::<Vec<_>>())
        };
        assert_eq!(names(None).unwrap().len(), 5);
        let f: Vec<String> = vec!["baseline".into(), "ostree-fsync".into(), "ostree".into()];
        assert_eq!(
            names(Some(&f)).unwrap(),
            ["baseline", "ostree-per-object-fsync", "ostree"]
        );
        let f: Vec<String> = vec!["oscontent".into(), "oscontent:paced".into()];
        assert_eq!(
            names(Some(&f)).unwrap(),
            ["oscontent:paced", "oscontent:stock-like"]
        );
        let f: Vec<String> = vec!["oscontent:turbo".into()];
        let e = names(Some(&f)).unwrap_err().to_string();
        assert!(
            e.contains("unknown arm") && e.contains("oscontent:paced"),
            "{e}"
        );
    }

    #[test]
    fn targets_need_the_default_arm() {
        let t = targets("30%", &[], Some("paced"));
        assert_eq!(t.len(), 4);
        assert!(t.iter().all(|t| t.verdict == "NOT RUN"));
    }
}
