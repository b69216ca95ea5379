//! `cargo xtask bench startup`: how long `oscontent-server`
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
//! Targets: oscontent's bytes written ≤ 1.05 × the unpacked repo
//! size on disk (every file rounded up to the filesystem block, computed
//! from the fixture; the ratio to the apparent size is reported too), and
//! its time to ready ≤ the anchor's.

//!
//! [`arms`] runs the two arms, [`results`] holds what the JSON records and
//! [`mod@render`] prints the table; this file orders the steps.

pub mod arms;
pub mod native;
pub mod render;
pub mod results;

pub use self::render::render;
pub use self::results::{Arm, ArmSummary, Report, Target, Trial};

/// Target: bytes written / unpacked repo size.
pub const BYTES_TARGET: f64 = 1.05;
/// Target: oscontent time to ready / anchor time.
pub const TIME_TARGET: f64 = 1.0;
/// Repository the fixture is pushed to.
pub(super) const REPO: &str = "oscontent/fixture";
/// How long pushing the fixture may take (a 1 GiB image on a slow disk).
const PUSH_TIMEOUT: Duration = Duration::from_secs(20 * 60);
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
    /// The ostree-native arms ([`native`]) instead of the legacy ones.
    pub native: bool,
}

use crate::bench::scratch::{self, ScratchFs, ScratchOptions};
use crate::bench::{check_interrupted, report, Summary};
use crate::fixtures::{self, FixtureSpec, Release, Scale};
use anyhow::{bail, Context, Result};
use oscontent_testkit::registry::Registry;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// The fixture in the registry, and the server that is benchmarked.
struct Setup {
    server_bin: PathBuf,
    release: Release,
    image: String,
    registry: Registry,
    logs: PathBuf,
}

/// The arms compared: summaries, ratios (oscontent / anchor, and
/// oscontent's bytes against the repo) and targets.
struct Analysis {
    trials: Vec<Trial>,
    summaries: Vec<ArmSummary>,
    time_ratio: f64,
    bytes_ratio: f64,
    over_repo: f64,
    repo_rounded_bytes: u64,
    over_rounded: f64,
    over_allocated: f64,
    targets: Vec<Target>,
}

/// The trials, and what the scratch filesystems were.
struct Measured {
    trials: Vec<Trial>,
    direct_io: bool,
    fs_bytes: u64,
    block_size: u64,
}

/// Runs the benchmark: checks what it needs, pushes the fixture to a
/// registry, runs both arms `--runs` times in alternating order, then
/// writes and prints the report (failing with `--strict` on a miss).
pub fn startup(opts: &StartupOptions) -> Result<()> {
    if opts.native {
        return native::run(opts);
    }
    crate::bench::interrupt()?;
    crate::bench::require(&[
        crate::bench::MKFS_XFS,
        crate::bench::LOSETUP,
        crate::bench::MOUNT,
        crate::bench::UMOUNT,
        crate::bench::DOCKER_REGISTRY,
        crate::bench::SKOPEO,
        crate::bench::UMOCI,
    ])?;
    anyhow::ensure!(opts.runs >= 1, "--runs must be at least 1");
    let started = SystemTime::now();
    let logs = report::logs_dir("startup", started)?;
    let (server_bin, profile) = report::server(opts.server_bin.as_deref())?;
    let setup = setup(opts, server_bin, logs)?;
    let (load_before, cpus) = crate::bench::load();
    let measured = measure(opts, &setup)?;
    let Setup {
        server_bin,
        release,
        image,
        registry,
        logs,
    } = setup;
    drop(registry);
    let (load_after, _) = crate::bench::load();
    let a = analyse(&release, measured.trials, measured.block_size)?;
    let report = Report {
        benchmark: "startup",
        started: crate::bench::utc_stamp(started),
        git: crate::bench::git_state(),
        scale: opts.scale,
        runs: opts.runs,
        drop_caches: opts.drop_caches,
        server_binary: server_bin,
        server_profile: profile,
        image,
        scratch_fs_bytes: measured.fs_bytes,
        scratch_direct_io: measured.direct_io,
        load_before,
        load_after,
        cpus,
        kernel: report::kernel(),
        trials: a.trials,
        summaries: a.summaries,
        time_ratio: a.time_ratio,
        bytes_ratio: a.bytes_ratio,
        oscontent_written_over_repo: a.over_repo,
        block_size: measured.block_size,
        repo_rounded_bytes: a.repo_rounded_bytes,
        oscontent_written_over_rounded: a.over_rounded,
        oscontent_written_over_allocated: a.over_allocated,
        targets: a.targets,
        logs,
        release,
    };
    report::publish("startup", started, &report, &render(&report))?;
    if opts.strict && report.targets.iter().any(|t| !t.pass) {
        bail!("a startup target was missed");
    }
    Ok(())
}

/// The fixture (v2 of the scale), pushed to a fresh registry (not timed).
fn setup(opts: &StartupOptions, server_bin: PathBuf, logs: PathBuf) -> Result<Setup> {
    let spec = FixtureSpec::new(opts.scale);
    eprintln!("xtask: building (or reusing) the {} fixture", opts.scale);
    let fx = fixtures::ensure(&spec, &fixtures::default_dir(&spec))?;
    let release = fx
        .releases
        .last()
        .context("fixture without releases")?
        .clone();
    check_interrupted()?;

    let registry = Registry::builder()
        .storage_in(&crate::bench::bench_dir()?.join("tmp"))
        .start()?;
    eprintln!(
        "xtask: pushing {} ({}) to the registry at {} (not timed)",
        release.version,
        crate::bench::mib(release.image_bytes as f64),
        registry.host()
    );
    let image = registry.try_push(
        &fx.oci_layout,
        &release.version,
        &format!("{REPO}:{}", release.version),
        &[],
        PUSH_TIMEOUT,
    )?;
    Ok(Setup {
        server_bin,
        release,
        image,
        registry,
        logs,
    })
}

/// `--runs` runs of both arms, each on a fresh filesystem, the first arm
/// alternating from run to run.
fn measure(opts: &StartupOptions, setup: &Setup) -> Result<Measured> {
    let rel = &setup.release;
    let fs_size = (3 * rel.image_bytes.max(rel.repo_bytes)).max(scratch::MIN_SIZE);
    let mut m = Measured {
        trials: Vec::new(),
        direct_io: true,
        fs_bytes: fs_size,
        block_size: 4096,
    };
    for run in 0..opts.runs {
        let order = if run % 2 == 0 {
            [Arm::Oscontent, Arm::PullExtract]
        } else {
            [Arm::PullExtract, Arm::Oscontent]
        };
        for (position, arm) in order.into_iter().enumerate() {
            check_interrupted()?;
            let fs = ScratchFs::create_with(&ScratchOptions::new(fs_size))?;
            m.direct_io &= fs.direct_io();
            m.fs_bytes = fs.size();
            m.block_size = fs.block_size()?;
            if opts.drop_caches {
                crate::bench::drop_caches()?;
            }
            let trial = Trial {
                run,
                position,
                ..run_arm(opts, setup, arm, run, &fs)?
            };
            eprintln!(
                "xtask: run {}/{} {:<13} ready {:>7.2}s  sync {:>6.2}s  written {:>11} ({:.3}x repo)",
                run + 1,
                opts.runs,
                arm.label(),
                trial.time_to_ready_s,
                trial.sync_s,
                crate::bench::mib(trial.written_bytes as f64),
                trial.written_bytes as f64 / rel.repo_bytes as f64
            );
            m.trials.push(trial);
            drop(fs);
        }
    }
    Ok(m)
}

/// One arm of run `run` on `fs`, its log under the run's logs.
fn run_arm(
    opts: &StartupOptions,
    setup: &Setup,
    arm: Arm,
    run: usize,
    fs: &ScratchFs,
) -> Result<Trial> {
    let log = setup
        .logs
        .join(format!("run{run}-{}.log", arm.label().replace('+', "-")));
    match arm {
        Arm::Oscontent => arms::oscontent(
            &setup.server_bin,
            &setup.image,
            &setup.registry.host(),
            fs,
            &log,
            opts.ready_timeout,
        ),
        Arm::PullExtract => arms::pull_extract(
            &setup.image,
            &setup.release.version,
            fs,
            &log,
            opts.ready_timeout,
        ),
    }
    .with_context(|| format!("run {run}, arm {} (log: {})", arm.label(), log.display()))
}

/// Per-arm summaries, the ratios and the targets.
fn analyse(release: &Release, trials: Vec<Trial>, block_size: u64) -> Result<Analysis> {
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
    let repo_rounded_bytes = crate::bench::rounded_size(&release.repo, block_size)?;
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
    Ok(Analysis {
        targets: targets(over_rounded, time_ratio),
        trials,
        summaries: vec![osc.clone(), anchor],
        time_ratio,
        bytes_ratio,
        over_repo,
        repo_rounded_bytes,
        over_rounded,
        over_allocated: osc.written_bytes.median / osc_allocated,
    })
}

/// The two targets.
fn targets(over_rounded: f64, time_ratio: f64) -> Vec<Target> {
    vec![
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
    ]
}
