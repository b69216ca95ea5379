//! `cargo xtask fuzz`: one build of every coverage-guided fuzz target
//! (`tests/fuzz`, cargo-fuzz on the nightly toolchain), then each run for
//! a bounded time under libFuzzer's own limits, so that a crash, a hang
//! or an out-of-memory fails the command with the input that caused it.
//!
//! Built without a sanitizer: every parser is safe Rust (the workspace
//! denies `unsafe_code`), and the C underneath (glib's GVariant and
//! GKeyFile) is the system's uninstrumented library, which AddressSanitizer
//! could not see into anyway; ASan would double the build and slow every
//! execution for nothing it could find. What safe Rust can get wrong
//! (panics, overflow on hostile sizes with debug assertions on, hangs,
//! unbounded allocation) libFuzzer catches without it, and a signal in
//! glib still counts as a crash.

mod stats;

pub use stats::Stats;

use crate::cargo::target_dir;
use crate::fixtures;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The fuzz crate (its own workspace and lock file).
pub const FUZZ_DIR: &str = "tests/fuzz";
/// The target triple cargo-fuzz builds for.
const TRIPLE: &str = "x86_64-unknown-linux-gnu";
/// Memory one target may use (`-rss_limit_mb`): every parser bounds its
/// input far below this, so more is a finding.
const RSS_LIMIT_MB: u64 = 2048;
/// One input running longer than this is a hang (`-timeout`, seconds).
const INPUT_TIMEOUT_SECS: u64 = 10;
/// What CI spends running targets, all together, shared out equally: at
/// most three minutes, and less, because the cold build comes
/// first in the same 15 minutes. Three seconds replays every seed and
/// mutates around it (about 100k inputs for most targets), which catches a
/// parser change that breaks on real files; the long runs are `cargo xtask
/// fuzz`'s. Every second here is a second of one core that the test suites
/// running beside it wait for.
pub const CI_BUDGET: Duration = Duration::from_secs(51);
/// The least a target runs in CI, whatever the budget.
const CI_FLOOR_SECS: u64 = 3;
/// Past its `-max_total_time`, how long a target may take to load its
/// corpus and write its report before it is killed.
const RUN_GRACE: Duration = Duration::from_secs(90);
/// Longest the build of every target may take (a cold one is minutes).
const BUILD_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seconds each target runs.
    pub seconds: u64,
    /// Targets to run (all when empty).
    pub targets: Vec<String>,
    /// A line per target as it ends (off in the test runner, which prints
    /// the report once the job ends, as it does a suite's log).
    pub progress: bool,
}

/// One target's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub target: String,
    pub took: Duration,
    pub seeds: usize,
    pub stats: Stats,
    /// Why the run failed (a finding, or the process misbehaving).
    pub failure: Option<String>,
}

/// `tests/fuzz` in this checkout.
fn fuzz_dir() -> PathBuf {
    fixtures::workspace_root().join(FUZZ_DIR)
}

/// Where builds, working corpora, artifacts and logs go.
fn work_dir() -> PathBuf {
    target_dir().join("fuzz")
}

/// The fuzz targets: one file each in `tests/fuzz/fuzz_targets`, sorted.
pub fn targets() -> Result<Vec<String>> {
    let dir = fuzz_dir().join("fuzz_targets");
    let mut names = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = e
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        if path.extension().is_some_and(|x| x == "rs") {
            if let Some(stem) = path.file_stem() {
                names.push(stem.to_string_lossy().into_owned());
            }
        }
    }
    names.sort();
    anyhow::ensure!(!names.is_empty(), "no fuzz targets in {}", dir.display());
    Ok(names)
}

/// Niceness of a build started early ([`prebuild`]): the lowest, so it
/// takes only the CPU the rest leaves idle.
const PREBUILD_NICENESS: &str = "19";

/// The build [`prebuild`] started, which [`ci`] waits for.
static PREBUILD: Mutex<Option<Prebuild>> = Mutex::new(None);

struct Prebuild {
    thread: JoinHandle<Result<PathBuf>>,
    /// The cargo process group, once started (0 before).
    group: Arc<AtomicI32>,
}

/// Starts building every target now, in the background at niceness 19:
/// `cargo xtask test` calls it first, so the build runs in what the lints,
/// the workspace build and the fixtures leave idle (link steps, one big
/// crate at a time, downloads, fixture I/O) instead of adding minutes
/// after them. [`ci`] waits for it.
pub fn prebuild() {
    let group = Arc::new(AtomicI32::new(0));
    let shared = group.clone();
    let thread = std::thread::spawn(move || build_as(Some(&shared)));
    if let Ok(mut p) = PREBUILD.lock() {
        *p = Some(Prebuild { thread, group });
    }
}

/// Waits for [`prebuild`]'s build, if one was started, at normal priority
/// from now on (it is what the caller waits for): raising it back needs
/// root, as in CI; elsewhere it finishes at niceness 19.
fn finish_prebuild() -> Result<()> {
    let Some(p) = PREBUILD.lock().ok().and_then(|mut p| p.take()) else {
        return Ok(());
    };
    if let Some(pid) = rustix::process::Pid::from_raw(p.group.load(Ordering::SeqCst)) {
        let _ = rustix::process::setpriority_pgrp(Some(pid), 0);
    }
    p.thread
        .join()
        .map_err(|_| anyhow::anyhow!("the fuzz build thread panicked"))?
        .map(drop)
}

/// Builds every target in one cargo invocation (shared dependencies, one
/// link each), its output in `logs/build.log`. Returns the binaries' dir.
pub fn build() -> Result<PathBuf> {
    build_as(None)
}

/// [`build`], at niceness 19 when `group` is given (a [`prebuild`]), which
/// then holds the build's process group for [`finish_prebuild`].
fn build_as(group: Option<&AtomicI32>) -> Result<PathBuf> {
    crate::deps::ensure_cargo_fuzz(group.is_some().then_some(PREBUILD_NICENESS))?;
    let work = work_dir();
    let logs = work.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let log = logs.join("build.log");
    // A fresh log per build: run_logged appends.
    std::fs::write(&log, b"").with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = match group {
        Some(_) => {
            let mut c = Command::new("nice");
            c.args(["-n", PREBUILD_NICENESS, "cargo"]);
            c
        }
        None => Command::new("cargo"),
    };
    cmd.args(["+nightly", "fuzz", "build", "--fuzz-dir", FUZZ_DIR])
        .args(["--sanitizer", "none", "--debug-assertions"])
        // cargo-fuzz's default of one codegen unit serialises the big
        // crates of a cold build; 16 costs a little execution speed.
        .args(["--codegen-units", "16"])
        .arg("--target-dir")
        .arg(&work)
        .env("RUSTFLAGS", deny_warnings())
        .current_dir(fixtures::workspace_root())
        // The outer cargo's (stable) toolchain must not leak into the
        // nightly one rustup selects.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC");
    eprintln!("xtask: building the fuzz targets (log: {})", log.display());
    let start = Instant::now();
    run_group(&mut cmd, &log, BUILD_TIMEOUT, group)
        .context("building the fuzz targets (cargo +nightly fuzz build)")?;
    eprintln!(
        "xtask: fuzz targets built in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    Ok(work.join(TRIPLE).join("release"))
}

/// `-D warnings` after any RUSTFLAGS of the caller's (cargo-fuzz appends
/// its own). This is the one build of oscontent-format without openpgp
/// that `cargo xtask test` makes, so a warning only that configuration
/// has fails it here. Cargo caps the lints of registry dependencies, so
/// only our path crates are held to it.
fn deny_warnings() -> String {
    match std::env::var("RUSTFLAGS") {
        Ok(f) if !f.trim().is_empty() => format!("{f} -D warnings"),
        _ => "-D warnings".to_owned(),
    }
}

/// Runs `cmd` in its own process group, output appended to `log`, and
/// kills the whole group if it outlives `timeout`: cargo-fuzz dies on
/// SIGTERM without passing it on, and the cargo under it would go on
/// building (and holding the target dir's lock) as an orphan.
/// Its process group id goes to `group` when given.
fn run_group(
    cmd: &mut Command,
    log: &Path,
    timeout: Duration,
    group: Option<&AtomicI32>,
) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting {cmd:?}"))?;
    let pgid = rustix::process::Pid::from_child(&child);
    if let Some(g) = group {
        g.store(pgid.as_raw_nonzero().get(), Ordering::SeqCst);
    }
    let mut child = oscontent_testkit::process::Stopper::new(child, "cargo fuzz build");
    let status = child.wait_bounded(timeout);
    // Whatever is left of the group (nothing, after a clean exit).
    let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    let status = status?;
    anyhow::ensure!(
        status.success(),
        "{status}; last lines of {}:\n{}",
        log.display(),
        oscontent_testkit::process::tail(log, 20)
    );
    Ok(())
}

/// The files of a directory (0 if it does not exist).
fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.flatten().count())
}

/// Runs one built target for `seconds` on its seed corpus (read only,
/// in the repo) and its working corpus (under the target dir, where new
/// inputs go), with its dictionary if it has one.
pub fn run_target(bins: &Path, target: &str, seconds: u64) -> Result<Outcome> {
    let work = work_dir();
    let corpus = work.join("corpus").join(target);
    let artifacts = work.join("artifacts").join(target);
    let logs = work.join("logs");
    for d in [&corpus, &artifacts, &logs] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let seeds = fuzz_dir().join("corpus").join(target);
    let dict = fuzz_dir().join("dict").join(format!("{target}.dict"));
    let log = logs.join(format!("{target}.log"));
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(bins.join(target));
    cmd.arg(&corpus)
        .arg(&seeds)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-rss_limit_mb={RSS_LIMIT_MB}"))
        .arg(format!("-timeout={INPUT_TIMEOUT_SECS}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1");
    if dict.is_file() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("starting fuzz target {target}"))?;
    let start = Instant::now();
    let mut child = oscontent_testkit::process::Stopper::new(child, target);
    let status = child.wait_bounded(Duration::from_secs(seconds) + RUN_GRACE);
    let took = start.elapsed();
    let stats = stats::parse(&std::fs::read_to_string(&log).unwrap_or_default());
    let failure = match (&status, &stats.finding) {
        (_, Some(f)) => Some(f.clone()),
        (Ok(s), None) if !s.success() => Some(format!("exited with {s} (log: {})", log.display())),
        (Ok(_), None) => None,
        (Err(e), None) => Some(format!("{e:#} (log: {})", log.display())),
    };
    Ok(Outcome {
        target: target.to_owned(),
        took,
        seeds: count_files(&seeds),
        stats,
        failure,
    })
}

/// Builds, runs each chosen target for `opts.seconds`, prints a line per
/// target and fails if any found something.
pub fn fuzz(opts: &Options) -> Result<Vec<Outcome>> {
    let all = targets()?;
    let chosen: Vec<String> = if opts.targets.is_empty() {
        all
    } else {
        for t in &opts.targets {
            anyhow::ensure!(
                all.contains(t),
                "no fuzz target {t:?} (targets: {})",
                all.join(", ")
            );
        }
        opts.targets.clone()
    };
    let bins = build()?;
    let mut outcomes = Vec::new();
    for t in &chosen {
        let o = run_target(&bins, t, opts.seconds)?;
        if opts.progress {
            eprintln!("{}", line(&o));
        }
        outcomes.push(o);
    }
    report(&outcomes);
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    if !failed.is_empty() {
        let names: Vec<&str> = failed.iter().map(|o| o.target.as_str()).collect();
        bail!("fuzz targets failed: {}", names.join(", "));
    }
    Ok(outcomes)
}

/// What CI runs: every target, [`CI_BUDGET`] shared out (at least
/// [`CI_FLOOR_SECS`] each).
pub fn ci() -> Result<Vec<Outcome>> {
    finish_prebuild()?;
    let n = targets()?.len() as u64;
    let seconds = (CI_BUDGET.as_secs() / n).max(CI_FLOOR_SECS);
    fuzz(&Options {
        seconds,
        targets: Vec::new(),
        progress: false,
    })
}

/// One target's report line.
pub fn line(o: &Outcome) -> String {
    let s = &o.stats;
    let verdict = match &o.failure {
        None => "ok".to_owned(),
        Some(f) => match &s.artifact {
            Some(a) => format!("FAILED: {f}; input: {}", a.display()),
            None => format!("FAILED: {f}"),
        },
    };
    format!(
        "    {:<16} {:>6.0} s {:>10} execs  corpus {:>5} ({} seeds)  cov {:>5}  ft {:>6}  {verdict}",
        o.target,
        o.took.as_secs_f64(),
        s.execs,
        s.corpus,
        o.seeds,
        s.coverage,
        s.features,
    )
}

/// Every target's line, and the totals.
pub fn report(outcomes: &[Outcome]) {
    let secs: f64 = outcomes.iter().map(|o| o.took.as_secs_f64()).sum();
    let execs: u64 = outcomes.iter().map(|o| o.stats.execs).sum();
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    eprintln!(
        "xtask: fuzzed {} targets for {secs:.0} s, {execs} executions, {failed} failed:",
        outcomes.len()
    );
    for o in outcomes {
        eprintln!("{}", line(o));
    }
}
