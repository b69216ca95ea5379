//! `cargo xtask bench io`: how much an OS update hurts an
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
//! 1. A fresh [`ScratchFs`](crate::bench::scratch::ScratchFs): XFS on a direct-io loop device whose backing
//!    file (on the host disk, not on the loop fs) is a sparse copy of the
//!    template. The remote URL is set, the neighbour's file preallocated.
//! 2. Drop the page cache (before an update's first trial, or every trial
//!    with `--drop-caches-each-trial`; the freshly mounted trial fs is cold
//!    anyway), read the served v2 repo (the server stands for a remote
//!    machine: its reads should not hit the node's disk), then `sync`.
//! 3. The neighbour starts ([`neighbour`]: 2300-byte writes + fdatasync,
//!    each timed), and runs alone for `--warmup`.
//! 4. The update window: the pull, bounded by `--arm-timeout` (the
//!    baseline arm burns the CPU a typical update's client and server
//!    used, as long as a typical update took). Device counters
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

//!
//! # Modules
//!
//! This file runs the benchmark as a sequence of steps; [`arms`] says what
//! is compared, [`trial`] runs one trial, [`analyse`] turns an update's
//! trials into its [`UpdateReport`], [`mod@render`] prints the table and draws
//! the [`chart`], and [`results`] holds what is written to the JSON.

pub mod analyse;
pub mod arms;
pub mod bootstrap;
pub mod burner;
pub mod chart;
pub mod etcd;
pub mod judge;
pub mod neighbour;
pub mod render;
pub mod repo;
pub mod results;
pub mod small;
pub mod stats;
pub mod timeweighted;
pub mod trial;

pub use self::arms::{parse_io_modes, select_arms, Arm, DEFAULT_IO_MODES};
pub use self::render::render;
pub use self::results::{ArmSummary, Calibration, EtcdTrial, Report, Target, Trial, UpdateReport};

use self::arms::Client;
use self::repo::{RepoMode, Server, Template};
use super::Tool;
use crate::bench::{check_interrupted, report};
use crate::fixtures::{self, FixtureSpec, Fixtures, Scale};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Target: neighbour fdatasync p99 in the window / baseline's.
pub const P99_TARGET: f64 = 1.5;
/// Target: neighbour fdatasync max in the window / baseline's.
pub const MAX_TARGET: f64 = 3.0;
/// Target: update wall time / stock `ostree pull`'s (an update
/// stock finishes in seconds may take up to twice as long).
pub const TIME_TARGET: f64 = 2.0;
/// Target: bytes written to the device / new objects' allocated size.
pub const BYTES_TARGET: f64 = 1.1;
/// Repetitions every update gets, whatever `--seconds` says: the fewest
/// a bootstrap interval means anything with.
pub const MIN_RUNS: usize = 3;
/// The neighbour keeps running this long after the post-pull sync.
pub(super) const TAIL: Duration = Duration::from_secs(1);
/// The neighbour's file is preallocated to this size (writing wraps to the
/// start after it, which the trial records).
pub(super) const NEIGHBOUR_FILE_MAX: u64 = 1 << 30;
/// A fast device's fdatasync rate, for sizing the neighbour's file.
pub(super) const NEIGHBOUR_MAX_IOPS: f64 = 4000.0;
/// The shortest baseline window, by scale, before any update was timed.
const MIN_BASELINE_SMALL: f64 = 5.0;
const MIN_BASELINE_FULL: f64 = 20.0;
/// Baseline windows are this much longer than the longest update so far.
pub(super) const BASELINE_MARGIN: f64 = 1.2;

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

/// Which update(s) to run (`--update small,5,30`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Updates {
    /// About 60 MiB of new small files in 1,600 new directories over the
    /// 5% fixture's v1 (a burst that ends before feedback; [`small`]).
    Small,
    /// v2 rewrites 5% of v1's files (the fixtures' default).
    #[value(name = "5")]
    Five,
    /// v2 rewrites 30% (the biggest).
    #[value(name = "30")]
    Thirty,
    /// 30 then 5.
    Both,
}

/// One update to measure: the fixture share whose v1 it starts from, and
/// whether v2 is that fixture's or the [`small`] one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Update {
    pub share: f64,
    pub small: bool,
}

impl Update {
    /// `small`, `5%`, `30%`.
    pub fn label(&self) -> String {
        if self.small {
            "small".into()
        } else {
            format!("{:.0}%", self.share * 100.0)
        }
    }
}

/// The updates of a `--update` list, in order, each once.
pub fn expand(list: &[Updates]) -> Vec<Update> {
    let five = fixtures::DEFAULT_UPDATE_SHARE;
    let mut out: Vec<Update> = Vec::new();
    for u in list {
        let add: &[(f64, bool)] = match u {
            Updates::Small => &[(five, true)],
            Updates::Five => &[(five, false)],
            Updates::Thirty => &[(0.3, false)],
            Updates::Both => &[(0.3, false), (five, false)],
        };
        for &(share, small) in add {
            let u = Update { share, small };
            if !out.contains(&u) {
                out.push(u);
            }
        }
    }
    out
}

/// Options of `cargo xtask bench io`.
#[derive(Debug, Clone)]
pub struct IoOptions {
    pub scale: Scale,
    pub updates: Vec<Updates>,
    /// Repetitions of every arm.
    pub runs: usize,
    /// `--seconds`: no repetition starts once an update has used its
    /// share of this budget (after at least [`MIN_RUNS`]).
    pub budget: Option<Duration>,
    /// Extra trials of every pulling arm without the neighbour.
    pub solo_runs: usize,
    /// Arms to run (names, `oscontent` for every mode, `NAME@ram` for an
    /// in-RAM twin); None: all but the twins.
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

/// What every update of a run shares: when it started, where its logs
/// go, the binaries and the arms.
struct Setup {
    started: SystemTime,
    logs: PathBuf,
    server_bin: PathBuf,
    client: Client,
    arms: Vec<Arm>,
    /// `arms` without the baseline.
    pulling: Vec<Arm>,
}

/// What the updates measured, besides their own reports.
#[derive(Default)]
struct Measured {
    updates: Vec<UpdateReport>,
    calibration: Option<Calibration>,
    fs_bytes: u64,
    direct_io: bool,
}

/// Runs the benchmark: checks what it needs, sets up the binaries and
/// arms, measures each update, then writes and prints the report (failing
/// with `--strict` if a target was missed).
pub fn io(opts: &IoOptions) -> Result<()> {
    preconditions(opts)?;
    let setup = setup(opts)?;
    announce(opts, &setup);
    let (load_before, cpus) = super::load();
    let measured = measure(opts, &setup)?;
    let (load_after, _) = super::load();
    let report = Report {
        benchmark: "io",
        started: super::utc_stamp(setup.started),
        finished: super::utc_stamp(SystemTime::now()),
        git: super::git_state(),
        scale: opts.scale,
        repo_mode: opts.mode,
        runs: opts.runs,
        solo_runs: opts.solo_runs,
        warmup_s: opts.warmup.as_secs_f64(),
        arms: setup.arms.iter().map(Arm::name).collect(),
        io_modes: setup.client.modes,
        default_io_mode: setup.client.default_mode,
        server_binary: setup.server_bin,
        client_binary: setup.client.bin,
        load_before,
        load_after,
        cpus,
        kernel: report::kernel(),
        scratch_fs_bytes: measured.fs_bytes,
        scratch_direct_io: measured.direct_io,
        neighbour: format!(
            "built-in: {}-byte write + fdatasync loop on a fallocated file (fio --rw=write --ioengine=sync --fdatasync=1 --bs={} equivalent; see calibration)",
            neighbour::BLOCK,
            neighbour::BLOCK
        ),
        calibration: measured.calibration,
        updates: measured.updates,
        logs: setup.logs,
    };
    report::publish("io", setup.started, &report, &render(&report))?;
    check_targets(opts.strict, &report)
}

/// Signals become a flag; root, the tools and `--runs` are checked.
fn preconditions(opts: &IoOptions) -> Result<()> {
    super::interrupt()?;
    let mut tools = super::SCRATCH_TOOLS.to_vec();
    tools.extend([FIO, OSTREE]);
    if opts.etcd {
        tools.push(ETCD);
    }
    super::require(&tools)?;
    anyhow::ensure!(opts.runs >= 1, "--runs must be at least 1");
    Ok(())
}

/// The logs directory, the server binary, the client and its io-modes
/// (when an oscontent arm is wanted), and the arms.
fn setup(opts: &IoOptions) -> Result<Setup> {
    let started = SystemTime::now();
    let logs = report::logs_dir("io", started)?;
    let (server_bin, _) = report::server(opts.server_bin.as_deref())?;
    let client = Client::resolve(
        opts.arms.as_deref(),
        opts.client_bin.as_deref(),
        opts.io_modes.as_deref(),
    )?;
    let arms = select_arms(opts.arms.as_deref(), &client.modes)?;
    anyhow::ensure!(!arms.is_empty(), "no arms selected");
    let pulling = arms
        .iter()
        .filter(|a| **a != Arm::Baseline)
        .cloned()
        .collect();
    Ok(Setup {
        started,
        logs,
        server_bin,
        client,
        arms,
        pulling,
    })
}

/// The arms and how many trials they make.
fn announce(opts: &IoOptions, setup: &Setup) {
    eprintln!(
        "xtask: bench io: arms {}; {} trials per update x {} update(s) ({} runs + {} solo)",
        setup
            .arms
            .iter()
            .map(Arm::name)
            .collect::<Vec<_>>()
            .join(", "),
        opts.runs * setup.arms.len()
            + opts.solo_runs * setup.pulling.iter().filter(|a| a.runs_solo()).count(),
        expand(&opts.updates).len(),
        opts.runs,
        opts.solo_runs
    );
}

/// Every update in turn (calibrating before the first, with
/// `--calibrate-secs`).
fn measure(opts: &IoOptions, setup: &Setup) -> Result<Measured> {
    let mut m = Measured {
        direct_io: true,
        ..Measured::default()
    };
    for (ui, u) in expand(&opts.updates).into_iter().enumerate() {
        check_interrupted()?;
        let report = update(opts, setup, ui == 0, u, &mut m)?;
        m.updates.push(report);
    }
    Ok(m)
}

/// One update: its fixture and template, a server for v2, the trials,
/// then their analysis.
fn update(
    opts: &IoOptions,
    setup: &Setup,
    first: bool,
    u: Update,
    m: &mut Measured,
) -> Result<UpdateReport> {
    let spec = FixtureSpec {
        update_share: u.share,
        ..FixtureSpec::new(opts.scale)
    };
    eprintln!(
        "xtask: building (or reusing) the {} fixture with a {:.0}% update",
        opts.scale,
        u.share * 100.0
    );
    let mut fx = fixtures::ensure(&spec, &fixtures::default_dir(&spec))?;
    if u.small {
        let dir = super::bench_dir()?.join("io-small");
        fx.releases[1] = small::ensure(&dir, &fx.releases[0], &spec.ref_name)?;
    }
    let (v1, v2) = (&fx.releases[0], &fx.releases[1]);
    let label = u.label();
    let ulogs = setup
        .logs
        .join(format!("update-{}", label.trim_end_matches('%')));
    std::fs::create_dir_all(&ulogs).with_context(|| format!("creating {}", ulogs.display()))?;
    let template = template(opts, setup, &fx, &spec.ref_name, &ulogs)?;
    m.fs_bytes = template.meta.fs_bytes;

    let state = tempfile::Builder::new()
        .prefix("server-state-")
        .tempdir_in(&ulogs)
        .context("creating the server's state dir")?;
    let server = Server::start(
        &setup.server_bin,
        &v2.oscontainer,
        state.path(),
        &ulogs.join("server.log"),
    )?;
    eprintln!("xtask: serving v2 {} at {}", v2.version, server.url);
    if first && opts.calibrate_secs > 0 {
        m.calibration = Some(trial::calibrate(&template, opts.calibrate_secs, &ulogs)?);
    }
    let ctx = trial::Ctx {
        opts,
        template: &template,
        server: &server,
        served_repo: &v2.repo,
        ref_name: &spec.ref_name,
        v2_commit: &v2.commit,
        client_bin: setup.client.bin.as_deref(),
        logs: &ulogs,
        dropped: std::cell::Cell::new(false),
        cpu_match: setup
            .client
            .default_mode
            .as_ref()
            .map(|m| format!("oscontent:{m}"))
            .filter(|a| setup.arms.iter().any(|x| &x.name() == a)),
    };
    let min_baseline = match opts.scale {
        Scale::Small => MIN_BASELINE_SMALL,
        Scale::Full => MIN_BASELINE_FULL,
    };
    let (trials, direct_io) = ctx.trials(&label, &setup.arms, &setup.pulling, min_baseline)?;
    m.direct_io &= direct_io;
    let server_url = server.url.clone();
    drop(server);

    let default_mode = setup.client.default_mode.as_deref();
    let mut report = analyse::analyse(u, trials, &setup.arms, default_mode, &ulogs);
    report.fixture = fx.root.clone();
    report.v1_commit = v1.commit.clone();
    report.v2_commit = v2.commit.clone();
    report.v2_repo_bytes = v2.repo_bytes;
    report.template = template.image.clone();
    report.template_objects = template.objects.len();
    report.server_url = server_url;
    Ok(report)
}

/// The seeded v1 repo image, on a filesystem with room for v1 unpacked,
/// the update, the neighbour's file, and slack.
fn template(
    opts: &IoOptions,
    setup: &Setup,
    fx: &Fixtures,
    ref_name: &str,
    ulogs: &Path,
) -> Result<Template> {
    let (v1, v2) = (&fx.releases[0], &fx.releases[1]);
    let size = (2 * v1.tree_bytes + v2.tree_bytes / 2 + 2 * NEIGHBOUR_FILE_MAX)
        .max(super::scratch::MIN_SIZE);
    let size = size.div_ceil(1 << 30) << 30;
    repo::template(
        &super::bench_dir()?.join("io-templates"),
        &repo::Seed {
            server_bin: &setup.server_bin,
            v1,
            ref_name,
            mode: opts.mode,
            fs_bytes: size,
        },
        ulogs,
        opts.arm_timeout,
    )
}

/// With `--strict`, an error naming every target not passed.
fn check_targets(strict: bool, report: &Report) -> Result<()> {
    let missed: Vec<&Target> = report
        .updates
        .iter()
        .flat_map(|u| &u.targets)
        .filter(|t| t.verdict != "PASS")
        .collect();
    if strict && !missed.is_empty() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn update_lists() {
        let five = fixtures::DEFAULT_UPDATE_SHARE;
        // (--update list, expected labels)
        let cases: &[(&[Updates], &[&str])] = &[
            (
                &[Updates::Small, Updates::Five, Updates::Thirty],
                &["small", "5%", "30%"],
            ),
            (&[Updates::Both], &["30%", "5%"]),
            (
                &[Updates::Five, Updates::Both, Updates::Small],
                &["5%", "30%", "small"],
            ),
        ];
        for (list, want) in cases {
            let got: Vec<String> = expand(list).iter().map(Update::label).collect();
            assert_eq!(got, *want, "{list:?}");
        }
        assert_eq!(expand(&[Updates::Small])[0].share, five);
    }
}
