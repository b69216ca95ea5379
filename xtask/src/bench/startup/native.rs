//! `cargo xtask bench startup --native`: the native-image arms. How long
//! `oscontent-server serve --image` of an ostree-native image (v2 of the
//! `native-*` fixture, made by ostree-ext's encapsulator) takes to be
//! ready, and the bytes it writes, from the local registry and from an
//! OCI layout; against what a user would otherwise run to serve the same
//! commit over HTTP: ostree-ext's importer into a bare-user repo (the
//! encapsulator project's `import`), then `ostree pull-local` into an
//! archive repo, from the same two sources, in the same run.
//!
//! Each trial gets a fresh XFS [`ScratchFs`] (the page cache dropped
//! before it unless `--warm`); the arms rotate their order from run to
//! run. Times exclude the `syncfs` after the arm (reported apart); bytes
//! are the loop device's write counter across the arm and that sync.
//!
//! Targets: oscontent's median time ≤ 1.0× the import +
//! pull-local median from the same source, and its median bytes written
//! ≤ 1.05× the archive repo's size on disk (allocated blocks, measured on
//! the anchor's own archive repo).

use super::arms;
use super::StartupOptions;
use crate::bench::scratch::{self, ScratchFs, ScratchOptions};
use crate::bench::{check_interrupted, report, run_bounded, Summary};
use anyhow::{ensure, Context, Result};
use oscontent_testkit::fixtures::{ensure_native, native_default_dir, FixtureSpec};
use oscontent_testkit::registry::Registry;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

/// How long pushing the fixture may take.
const PUSH_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// The arms, each with its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NativeArm {
    OscontentRegistry,
    OscontentLayout,
    ImportRegistry,
    ImportLayout,
}

impl NativeArm {
    const ALL: [NativeArm; 4] = [
        NativeArm::OscontentRegistry,
        NativeArm::OscontentLayout,
        NativeArm::ImportRegistry,
        NativeArm::ImportLayout,
    ];

    pub fn label(self) -> &'static str {
        match self {
            NativeArm::OscontentRegistry => "oscontent --image docker://",
            NativeArm::OscontentLayout => "oscontent --image oci:",
            NativeArm::ImportRegistry => "import + pull-local (registry)",
            NativeArm::ImportLayout => "import + pull-local (oci:)",
        }
    }

    /// The anchor an oscontent arm is compared with (same source).
    fn anchor(self) -> Option<NativeArm> {
        match self {
            NativeArm::OscontentRegistry => Some(NativeArm::ImportRegistry),
            NativeArm::OscontentLayout => Some(NativeArm::ImportLayout),
            _ => None,
        }
    }
}

/// One arm of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NativeTrial {
    pub arm: NativeArm,
    pub run: usize,
    /// Spawn to ready (oscontent), or import + pull-local.
    pub time_s: f64,
    /// Of the anchor: the import alone.
    pub import_s: Option<f64>,
    pub sync_s: f64,
    pub written_bytes: u64,
    /// Anchor: the archive repo's allocated bytes (what is served).
    pub archive_allocated_bytes: Option<u64>,
}

/// One arm's medians.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NativeSummary {
    pub arm: NativeArm,
    pub time_s: Summary,
    pub written_bytes: Summary,
}

/// oscontent against its anchor.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Ratio {
    pub arm: NativeArm,
    /// Median time / the anchor's median time (target ≤ 1.0).
    pub time: f64,
    /// Median bytes written / the archive repo's median allocated size
    /// (target ≤ 1.05).
    pub written_over_archive: f64,
}

/// The JSON written to `target/bench/startup-native-<stamp>.json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NativeReport {
    pub benchmark: &'static str,
    pub started: String,
    pub git: Option<String>,
    pub scale: String,
    pub runs: usize,
    pub drop_caches: bool,
    pub server_profile: String,
    pub version: String,
    pub commit: String,
    pub image_bytes: u64,
    pub layers: usize,
    pub load_before: f64,
    pub load_after: f64,
    pub cpus: usize,
    pub kernel: String,
    pub trials: Vec<NativeTrial>,
    pub summaries: Vec<NativeSummary>,
    pub archive_allocated_bytes: Summary,
    pub ratios: Vec<Ratio>,
}

/// What every trial reads from.
struct Sources {
    server: PathBuf,
    registry: Registry,
    docker: String,
    layout: String,
    commit: String,
    logs: PathBuf,
}

/// Runs the native arms and writes the report.
pub fn run(opts: &StartupOptions) -> Result<()> {
    crate::bench::interrupt()?;
    let mut tools = vec![crate::bench::DOCKER_REGISTRY, crate::bench::SKOPEO];
    tools.extend_from_slice(crate::bench::SCRATCH_TOOLS);
    crate::bench::require(&tools)?;
    ensure!(opts.runs >= 1, "--runs must be at least 1");
    let started = SystemTime::now();
    let logs = report::logs_dir("startup-native", started)?;
    let (server, server_profile) = report::server(opts.server_bin.as_deref())?;
    let spec = FixtureSpec::new(opts.scale);
    let f = ensure_native(&spec, &native_default_dir(&spec))?;
    let v2 = f
        .releases
        .last()
        .context("native fixture without releases")?;
    let registry = Registry::builder()
        .storage_in(&crate::bench::bench_dir()?.join("tmp"))
        .start()?;
    let docker = registry.try_push(
        &f.oci_layout,
        &v2.version,
        &format!("native:{}", v2.version),
        &[],
        PUSH_TIMEOUT,
    )?;
    let src = Sources {
        server,
        registry,
        docker,
        layout: f.image_ref(v2),
        commit: v2.commit.clone(),
        logs,
    };
    let (load_before, cpus) = crate::bench::load();
    let trials = measure(opts, &src, (v2.image_bytes + v2.tree_bytes) * 4)?;
    let (load_after, _) = crate::bench::load();
    let (summaries, archive, ratios) = analyse(&trials);
    let report = NativeReport {
        benchmark: "startup-native",
        started: crate::bench::utc_stamp(started),
        git: crate::bench::git_state(),
        scale: opts.scale.to_string(),
        runs: opts.runs,
        drop_caches: opts.drop_caches,
        server_profile,
        version: v2.version.clone(),
        commit: v2.commit.clone(),
        image_bytes: v2.image_bytes,
        layers: v2.layers.len(),
        load_before,
        load_after,
        cpus,
        kernel: report::kernel(),
        trials,
        summaries,
        archive_allocated_bytes: archive,
        ratios,
    };
    report::publish("startup-native", started, &report, &render(&report))?;
    Ok(())
}

/// `--runs` runs of every arm, the order rotated from run to run.
fn measure(opts: &StartupOptions, src: &Sources, fs_size: u64) -> Result<Vec<NativeTrial>> {
    let mut trials = Vec::new();
    for run in 0..opts.runs {
        let mut order = NativeArm::ALL;
        order.rotate_left(run % NativeArm::ALL.len());
        for arm in order {
            check_interrupted()?;
            let fs = ScratchFs::create_with(&ScratchOptions::new(fs_size.max(scratch::MIN_SIZE)))?;
            if opts.drop_caches {
                crate::bench::drop_caches()?;
            }
            let log = src.logs.join(format!(
                "run{run}-{}.log",
                format!("{arm:?}").to_lowercase()
            ));
            let t = one_arm(opts, src, arm, &fs, &log)
                .with_context(|| format!("run {run}, {} (log: {})", arm.label(), log.display()))?;
            eprintln!(
                "xtask: run {}/{} {:<32} {:>8.2}s  sync {:>6.2}s  written {:>11}",
                run + 1,
                opts.runs,
                arm.label(),
                t.time_s,
                t.sync_s,
                crate::bench::mib(t.written_bytes as f64)
            );
            trials.push(NativeTrial { run, ..t });
        }
    }
    Ok(trials)
}

fn one_arm(
    opts: &StartupOptions,
    src: &Sources,
    arm: NativeArm,
    fs: &ScratchFs,
    log: &Path,
) -> Result<NativeTrial> {
    let host = src.registry.host();
    let oscontent = |image: &str| -> Result<NativeTrial> {
        let t = arms::oscontent(&src.server, image, &host, fs, log, opts.ready_timeout)?;
        Ok(NativeTrial {
            arm,
            run: 0,
            time_s: t.time_to_ready_s,
            import_s: None,
            sync_s: t.sync_s,
            written_bytes: t.written_bytes,
            archive_allocated_bytes: None,
        })
    };
    match arm {
        NativeArm::OscontentRegistry => oscontent(&src.docker),
        NativeArm::OscontentLayout => oscontent(&src.layout),
        NativeArm::ImportRegistry => import_pull_local(arm, &src.docker, src, fs, log, opts),
        NativeArm::ImportLayout => import_pull_local(arm, &src.layout, src, fs, log, opts),
    }
}

/// What a user runs to serve a native image over HTTP without oscontent:
/// import into bare-user, then `ostree pull-local` into an archive repo.
fn import_pull_local(
    arm: NativeArm,
    image: &str,
    src: &Sources,
    fs: &ScratchFs,
    log: &Path,
    opts: &StartupOptions,
) -> Result<NativeTrial> {
    let (bare, archive) = (fs.path().join("bare-user"), fs.path().join("archive"));
    let before = fs.stats()?;
    let start = Instant::now();
    let imported = oscontent_testkit::encapsulate::import(&bare, image, true)?;
    ensure!(
        imported.commit == src.commit,
        "the importer got commit {}, not {}",
        imported.commit,
        src.commit
    );
    let import_s = start.elapsed();
    let ostree = |args: &[&str]| {
        let left = opts.ready_timeout.saturating_sub(start.elapsed());
        run_bounded(Command::new("ostree").args(args), log, left)
    };
    let repo = format!("--repo={}", archive.display());
    ostree(&["init", "--mode=archive", &repo])?;
    let bare_path = bare.display().to_string();
    ostree(&["pull-local", &repo, &bare_path, &src.commit])?;
    let time = start.elapsed();
    let sync = fs.syncfs()?;
    let device = fs.stats()?.since(&before);
    Ok(NativeTrial {
        arm,
        run: 0,
        time_s: time.as_secs_f64(),
        import_s: Some(import_s.as_secs_f64()),
        sync_s: sync.as_secs_f64(),
        written_bytes: device.written_bytes(),
        archive_allocated_bytes: Some(scratch::usage(&archive)?.allocated_bytes),
    })
}

/// Per-arm medians, the archive repo's size, and oscontent's ratios.
fn analyse(trials: &[NativeTrial]) -> (Vec<NativeSummary>, Summary, Vec<Ratio>) {
    let of = |arm: NativeArm, f: &dyn Fn(&NativeTrial) -> f64| {
        let v: Vec<f64> = trials.iter().filter(|t| t.arm == arm).map(f).collect();
        Summary::of(&v)
    };
    let summaries: Vec<NativeSummary> = NativeArm::ALL
        .iter()
        .map(|&arm| NativeSummary {
            arm,
            time_s: of(arm, &|t| t.time_s),
            written_bytes: of(arm, &|t| t.written_bytes as f64),
        })
        .collect();
    let archive: Vec<f64> = trials
        .iter()
        .filter_map(|t| t.archive_allocated_bytes.map(|b| b as f64))
        .collect();
    let archive = Summary::of(&archive);
    let median = |arm: NativeArm| summaries.iter().find(|s| s.arm == arm).cloned();
    let ratios = NativeArm::ALL
        .iter()
        .filter_map(|&arm| {
            let (own, anchor) = (median(arm)?, median(arm.anchor()?)?);
            Some(Ratio {
                arm,
                time: own.time_s.median / anchor.time_s.median,
                written_over_archive: own.written_bytes.median / archive.median,
            })
        })
        .collect();
    (summaries, archive, ratios)
}

/// The table printed at the end.
pub fn render(r: &NativeReport) -> String {
    let mut out = format!(
        "bench startup --native: {} {} ({}, {} layers), {} runs, {} server, load {:.1} -> {:.1} on {} CPUs\n\n",
        r.scale,
        r.version,
        crate::bench::mib(r.image_bytes as f64),
        r.layers,
        r.runs,
        r.server_profile,
        r.load_before,
        r.load_after,
        r.cpus
    );
    out.push_str("| arm | time (median, min–max) | written (median) |\n|---|---|---|\n");
    for s in &r.summaries {
        out.push_str(&format!(
            "| {} | {:.1} s ({:.1}–{:.1}) | {} |\n",
            s.arm.label(),
            s.time_s.median,
            s.time_s.min,
            s.time_s.max,
            crate::bench::mib(s.written_bytes.median)
        ));
    }
    out.push_str(&format!(
        "\narchive repo on disk (allocated, median): {}\n",
        crate::bench::mib(r.archive_allocated_bytes.median)
    ));
    for x in &r.ratios {
        out.push_str(&format!(
            "{}: time {:.2}x the import + pull-local (target <= 1.0: {}), written {:.3}x the archive repo (target <= 1.05: {})\n",
            x.arm.label(),
            x.time,
            if x.time <= 1.0 { "met" } else { "missed" },
            x.written_over_archive,
            if x.written_over_archive <= 1.05 { "met" } else { "missed" },
        ));
    }
    out
}
