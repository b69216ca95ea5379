//! One trial of `bench io` (steps 1 to 6 of the module doc), the order of
//! an update's trials, and the calibration of the neighbour against fio.

use super::arms::Arm;
use super::burner::{self, Load};
use super::neighbour::{self, Neighbour, NeighbourLog};
use super::repo::{self, NewObjects, Server, Template};
use super::results::{Calibration, EtcdTrial, Trial};
use super::{etcd, stats, IoOptions, NEIGHBOUR_FILE_MAX, NEIGHBOUR_MAX_IOPS, TAIL};
use crate::bench::scratch::{self, DiskStats, ScratchFs, ScratchOptions};
use crate::bench::{check_interrupted, run_bounded};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Everything a trial needs.
pub(super) struct Ctx<'a> {
    pub opts: &'a IoOptions,
    pub template: &'a Template,
    pub server: &'a Server,
    pub served_repo: &'a Path,
    pub ref_name: &'a str,
    pub v2_commit: &'a str,
    pub client_bin: Option<&'a Path>,
    pub logs: &'a Path,
    /// The page cache was dropped for this update.
    pub dropped: std::cell::Cell<bool>,
    /// The arm whose CPU use the baseline's burner matches (the default
    /// io-mode's); None: every pulling arm, at nice 0.
    pub cpu_match: Option<String>,
}

/// The client's `paced` nice value (`governor::PACED_NICE`).
const PACED_NICE: i32 = 10;

/// A trial's filesystem and the paths in it.
struct TrialFs {
    fs: ScratchFs,
    repo: PathBuf,
    wal: PathBuf,
}

/// The neighbours of one trial, running from `epoch`.
struct Neighbours {
    epoch: Instant,
    builtin: Option<Neighbour>,
    etcd: Option<etcd::Etcd>,
    etcd_load: Option<etcd::Load>,
}

/// What one update window measured, on the neighbours' clock.
struct Window {
    load1: f64,
    start: Duration,
    end: Duration,
    /// When the post-pull sync returned, and how long it took.
    sync_end: Duration,
    sync: Duration,
    cpu_s: f64,
    server_cpu_s: f64,
    /// Device counters at the window's start, its end, and after the sync.
    dev0: DiskStats,
    dev1: DiskStats,
    dev2: DiskStats,
    etcd: Option<etcd::EtcdWindow>,
}

impl Ctx<'_> {
    /// The paired trials of an update (`--runs` repetitions, every arm
    /// with the neighbour, alternating order), then the solo ones
    /// (pulling arms only). Returns them and whether every loop device
    /// did direct I/O.
    pub fn trials(
        &self,
        update: &str,
        arms: &[Arm],
        pulling: &[Arm],
        min_baseline: f64,
    ) -> Result<(Vec<(Trial, NeighbourLog)>, bool)> {
        let opts = self.opts;
        let mut trials: Vec<(Trial, NeighbourLog)> = Vec::new();
        let mut direct_io = true;
        let started = Instant::now();
        let n_updates = super::expand(&opts.updates).len().max(1) as u32;
        let budget = opts.budget.map(|b| b / n_updates);
        for run in 0..opts.runs {
            if run >= super::MIN_RUNS && budget.is_some_and(|b| started.elapsed() >= b) {
                eprintln!("xtask: update {update}: --seconds budget used after {run} runs");
                break;
            }
            for (position, arm) in run_order(run, arms, pulling).into_iter().enumerate() {
                check_interrupted()?;
                let baseline = (
                    baseline_len(opts, &trials, min_baseline),
                    self.baseline_load(&trials),
                );
                let (trial, log) = self
                    .trial(&arm, run, position, false, baseline)
                    .with_context(|| format!("update {update}, run {run}, arm {}", arm.name()))?;
                direct_io &= trial.direct_io;
                progress(&trial, update, opts.runs);
                trials.push((trial, log));
            }
        }
        let solo: Vec<&Arm> = pulling.iter().filter(|a| a.runs_solo()).collect();
        for s in 0..opts.solo_runs {
            for (position, arm) in solo.iter().copied().enumerate() {
                check_interrupted()?;
                let (trial, log) = self
                    .trial(arm, opts.runs + s, position, true, (0.0, Load::IDLE))
                    .with_context(|| format!("update {update}, solo {s}, arm {}", arm.name()))?;
                progress(&trial, update, opts.runs);
                trials.push((trial, log));
            }
        }
        Ok((trials, direct_io))
    }

    /// The baseline's CPU load: the matched arm's median CPU rates so far,
    /// its client's at its nice and its server's.
    fn baseline_load(&self, trials: &[(Trial, NeighbourLog)]) -> Load {
        let pulls: Vec<&Trial> = trials
            .iter()
            .map(|(t, _)| t)
            .filter(|t| !t.solo && t.arm != "baseline")
            .filter(|t| self.cpu_match.as_ref().is_none_or(|m| &t.arm == m))
            .collect();
        let cpu: Vec<f64> = pulls.iter().map(|t| t.cpu_s).collect();
        let server_cpu: Vec<f64> = pulls.iter().map(|t| t.server_cpu_s).collect();
        let wall: Vec<f64> = pulls.iter().map(|t| t.update_s).collect();
        let nice = match &self.cpu_match {
            Some(m) if m == "oscontent:paced" => PACED_NICE,
            _ => 0,
        };
        burner::matched(&cpu, &server_cpu, &wall, nice)
    }

    /// One arm of one repetition: a fresh filesystem from the template,
    /// cold caches, the neighbour(s) warmed up, the update window (or the
    /// baseline's seconds, with its CPU load), the sync, then what the
    /// pull added.
    fn trial(
        &self,
        arm: &Arm,
        run: usize,
        position: usize,
        solo: bool,
        baseline: (f64, Load),
    ) -> Result<(Trial, NeighbourLog)> {
        let opts = self.opts;
        let limit = opts.warmup + opts.arm_timeout + Duration::from_secs(600);
        let with_neighbour = !solo;
        let tfs = self.scratch(arm, with_neighbour, limit)?;
        // etcd initialises its data dir before the caches are dropped.
        let etcd = self.start_etcd(&tfs, arm, run, with_neighbour)?;
        self.cold_caches()?;
        let tag = format!(
            "run{run}-{}{}",
            arm.name().replace(':', "-"),
            if solo { "-solo" } else { "" }
        );
        let log = self.logs.join(format!("{tag}.log"));
        let neighbours = start_neighbours(&tfs.wal, etcd, with_neighbour, limit)?;
        crate::bench::sleep(opts.warmup)?;
        let window = self.window(&tfs, &neighbours, arm, baseline, &log)?;
        let log_nb = neighbours.finish()?;
        let new_objects = self.new_objects(arm, &tfs.repo)?;
        let ops_csv = if with_neighbour {
            let p = self.logs.join(format!("{tag}.ops.csv"));
            neighbour::write_csv(&p, &log_nb.ops)?;
            Some(p)
        } else {
            None
        };
        let mut trial = record(arm, run, position, solo, &tfs.fs, window, new_objects);
        if *arm == Arm::Baseline {
            trial.baseline_load = Some(baseline.1);
        }
        trial.neighbour_wraps = log_nb.wraps;
        trial.client_last_event = matches!(arm.on_disk(), Arm::Oscontent(_))
            .then(|| last_json_line(&log))
            .flatten();
        trial.log = log;
        trial.ops_csv = ops_csv;
        // Quick per-trial figures for the progress line (ratios come later).
        if with_neighbour {
            let (a, b) = window_ns(&trial);
            trial.neighbour = Some(stats::window(&log_nb.ops, a, b));
        }
        drop(tfs);
        Ok((trial, log_nb))
    }

    /// Step 1: a fresh filesystem from the template (an in-RAM twin's
    /// repo copied out of it to a tmpfs), the remote pointed at our
    /// server, the neighbour's file preallocated.
    fn scratch(&self, arm: &Arm, with_neighbour: bool, limit: Duration) -> Result<TrialFs> {
        let mut fs = ScratchFs::create_with(&ScratchOptions {
            template: Some(self.template.image.clone()),
            ..ScratchOptions::new(0)
        })?;
        let mut repo = fs.path().join(repo::REPO_DIR);
        if arm.in_ram() {
            // The filesystem's size bounds what the pull could write.
            let ram = fs.mount_ram(fs.size())?.join(repo::REPO_DIR);
            scratch::run(Command::new("cp").arg("-a").arg(&repo).arg(&ram))?;
            repo = ram;
        }
        repo::set_remote(&repo, &self.server.url)?;
        let wal = fs.path().join("neighbour").join("wal");
        if with_neighbour {
            let need = neighbour::file_bytes(limit.as_secs_f64(), NEIGHBOUR_MAX_IOPS);
            neighbour::prepare(&wal, need.min(NEIGHBOUR_FILE_MAX))?;
        }
        Ok(TrialFs { fs, repo, wal })
    }

    /// The etcd neighbour (`--etcd`, not in solo trials).
    fn start_etcd(
        &self,
        tfs: &TrialFs,
        arm: &Arm,
        run: usize,
        with_neighbour: bool,
    ) -> Result<Option<etcd::Etcd>> {
        if !(self.opts.etcd && with_neighbour) {
            return Ok(None);
        }
        let log = self.logs.join(format!(
            "run{run}-{}-etcd.log",
            arm.name().replace(':', "-")
        ));
        Ok(Some(etcd::Etcd::start(&tfs.fs.path().join("etcd"), &log)?))
    }

    /// Step 2. The trial's filesystem was just mounted, so its cache is
    /// cold. The page cache is dropped before the first trial of an update
    /// (or every trial with --drop-caches-each-trial); the served repo is
    /// then read back in, so the server (a remote machine in production)
    /// does not compete for the node's disk, and a sync leaves nothing
    /// dirty (the template's copy) for the window.
    fn cold_caches(&self) -> Result<()> {
        if self.opts.drop_caches_each_trial || !self.dropped.get() {
            crate::bench::drop_caches()?;
            self.dropped.set(true);
        }
        repo::warm(self.served_repo)?;
        rustix::fs::sync();
        Ok(())
    }

    /// Steps 4 and 5: the update window (counters, CPU and etcd's metrics
    /// read at both ends), then the timed `syncfs`.
    fn window(
        &self,
        tfs: &TrialFs,
        neighbours: &Neighbours,
        arm: &Arm,
        baseline: (f64, Load),
        log: &Path,
    ) -> Result<Window> {
        let load1 = crate::bench::load().0;
        let children_cpu = || crate::bench::cpu_seconds(std::process::id()).map_or(0.0, |(_, c)| c);
        let server_cpu =
            || crate::bench::cpu_seconds(self.server.process.id()).map_or(0.0, |(o, _)| o);
        let (cpu0, scpu0) = (children_cpu(), server_cpu());
        let etcd = neighbours.etcd.as_ref();
        let m0 = etcd.map(etcd::Etcd::metrics).transpose()?;
        let dev0 = tfs.fs.stats()?;
        let start = neighbours.epoch.elapsed();
        let burned = self.run_arm(arm, &tfs.repo, baseline, log)?;
        let end = neighbours.epoch.elapsed();
        let dev1 = tfs.fs.stats()?;
        let m1 = etcd.map(etcd::Etcd::metrics).transpose()?;
        let (cpu1, scpu1) = (children_cpu(), server_cpu());
        let sync = tfs.fs.syncfs()?;
        let sync_end = neighbours.epoch.elapsed();
        let dev2 = tfs.fs.stats()?;
        Ok(Window {
            load1,
            start,
            end,
            sync_end,
            sync,
            cpu_s: burned.unwrap_or(cpu1 - cpu0),
            server_cpu_s: scpu1 - scpu0,
            dev0,
            dev1,
            dev2,
            etcd: m0.zip(m1).map(|(a, b)| etcd::EtcdWindow::between(&a, &b)),
        })
    }

    /// What fills the window: the pull (bounded by `--arm-timeout`), or
    /// for the baseline, its seconds of CPU burning (returns the CPU
    /// seconds burned).
    fn run_arm(
        &self,
        arm: &Arm,
        repo_path: &Path,
        baseline: (f64, Load),
        log: &Path,
    ) -> Result<Option<f64>> {
        let timeout = self.opts.arm_timeout;
        match arm {
            Arm::Baseline => {
                let window = Duration::from_secs_f64(baseline.0);
                return burner::burn(baseline.1, window).map(Some);
            }
            Arm::Ostree | Arm::OstreePerObjectFsync => {
                let mut cmd = oscontent_testkit::Ostree::at(repo_path).command(["pull"]);
                if *arm == Arm::OstreePerObjectFsync {
                    cmd.arg("--per-object-fsync");
                }
                cmd.args([repo::REMOTE, self.ref_name]);
                run_bounded(&mut cmd, log, timeout)?;
            }
            Arm::InRam(a) => return self.run_arm(a, repo_path, baseline, log),
            Arm::Oscontent(mode) => {
                let bin = self.client_bin.context("no client binary")?;
                let mut cmd = Command::new(bin);
                cmd.args(["pull", "--repo"])
                    .arg(repo_path)
                    .args(["--remote", repo::REMOTE, "--ref", self.ref_name])
                    .args(["--io-mode", mode, "--json"]);
                run_bounded(&mut cmd, log, timeout)?;
            }
        }
        Ok(None)
    }

    /// Step 6: the ref must be at v2; the objects the pull added (none
    /// for the baseline).
    fn new_objects(&self, arm: &Arm, repo_path: &Path) -> Result<NewObjects> {
        if *arm == Arm::Baseline {
            return Ok(NewObjects::default());
        }
        let head = repo::ref_commit(repo_path, self.ref_name);
        anyhow::ensure!(
            head.as_deref() == Some(self.v2_commit),
            "after {}, the ref {} is at {:?}, expected v2 {}",
            arm.name(),
            self.ref_name,
            head,
            self.v2_commit
        );
        repo::new_objects(repo_path, &self.template.objects)
    }
}

/// Step 3: the built-in neighbour (and etcd's put loop, with `--etcd`)
/// start on one clock; none in solo trials.
fn start_neighbours(
    wal: &Path,
    etcd: Option<etcd::Etcd>,
    with_neighbour: bool,
    limit: Duration,
) -> Result<Neighbours> {
    let epoch = Instant::now();
    let builtin = if with_neighbour {
        Some(Neighbour::start(wal, epoch, limit)?)
    } else {
        None
    };
    let etcd_load = match &etcd {
        Some(e) => Some(etcd::Load::start(e.client, epoch, limit)?),
        None => None,
    };
    Ok(Neighbours {
        epoch,
        builtin,
        etcd,
        etcd_load,
    })
}

impl Neighbours {
    /// One more [`TAIL`] of neighbour after the sync, then everything
    /// stops; their logs.
    fn finish(self) -> Result<NeighbourLog> {
        let mut log = match self.builtin {
            Some(nb) => {
                crate::bench::sleep(TAIL)?;
                nb.finish()?
            }
            None => NeighbourLog::default(),
        };
        if let Some(load) = self.etcd_load {
            log.etcd_ops = load.finish()?;
        }
        drop(self.etcd);
        Ok(log)
    }
}

/// The trial's record from its window; the neighbour's figures, ratios
/// and the corrected bytes are filled in later.
fn record(
    arm: &Arm,
    run: usize,
    position: usize,
    solo: bool,
    fs: &ScratchFs,
    w: Window,
    new_objects: NewObjects,
) -> Trial {
    let device = w.dev2.since(&w.dev0);
    Trial {
        arm: arm.name(),
        run,
        position,
        solo,
        load1: w.load1,
        direct_io: fs.direct_io(),
        window_start_s: w.start.as_secs_f64(),
        window_end_s: w.end.as_secs_f64(),
        sync_end_s: w.sync_end.as_secs_f64(),
        update_s: if *arm == Arm::Baseline {
            0.0
        } else {
            (w.end - w.start).as_secs_f64()
        },
        sync_s: w.sync.as_secs_f64(),
        cpu_s: w.cpu_s,
        server_cpu_s: w.server_cpu_s,
        written_bytes: device.written_bytes(),
        written_in_window_bytes: w.dev1.since(&w.dev0).written_bytes(),
        device,
        written_bytes_corrected: None,
        new_objects,
        neighbour: None,
        neighbour_with_sync: None,
        reference: None,
        ratios: None,
        neighbour_wraps: 0,
        log: PathBuf::new(),
        ops_csv: None,
        client_last_event: None,
        baseline_load: None,
        etcd: w.etcd.map(|server| EtcdTrial {
            server,
            ..Default::default()
        }),
    }
}

/// A repetition's order: the pulls then the baseline on even runs,
/// reversed on odd ones, so drift spreads over all arms.
fn run_order(run: usize, arms: &[Arm], pulling: &[Arm]) -> Vec<Arm> {
    let mut order = pulling.to_vec();
    if arms.contains(&Arm::Baseline) {
        order.push(Arm::Baseline);
    }
    if run % 2 == 1 {
        order.reverse();
    }
    order
}

/// The baseline window: `--baseline-secs`, else a margin over the longest
/// update so far (at least `min_baseline`).
fn baseline_len(opts: &IoOptions, trials: &[(Trial, NeighbourLog)], min_baseline: f64) -> f64 {
    let longest = trials
        .iter()
        .filter(|(t, _)| !t.solo && t.arm != "baseline")
        .map(|(t, _)| t.update_s)
        .fold(0.0f64, f64::max);
    opts.baseline_secs
        .unwrap_or((longest * super::BASELINE_MARGIN).max(min_baseline))
}

/// One line per trial on stderr.
fn progress(t: &Trial, update: &str, runs: usize) {
    let r = t.ratios.unwrap_or_default();
    eprintln!(
        "xtask: {} run {}/{}{} {:<28} update {:>7.2}s sync {:>6.2}s written {:>10} new {:>6} objs ({})  load {:.2}{}",
        update,
        t.run + 1,
        runs,
        if t.solo { " solo" } else { "" },
        t.arm,
        t.update_s,
        t.sync_s,
        crate::bench::mib(t.written_bytes as f64),
        t.new_objects.count,
        crate::bench::mib(t.new_objects.allocated_bytes as f64),
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

/// The last line of `log` that is a JSON object.
fn last_json_line(log: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .find(serde_json::Value::is_object)
}

/// The update window of a trial on its neighbour's clock, in ns.
pub(super) fn window_ns(t: &Trial) -> (u64, u64) {
    (
        (t.window_start_s * 1e9) as u64,
        (t.window_end_s * 1e9) as u64,
    )
}

/// fio alone, then the built-in neighbour alone, on trial filesystems.
pub(super) fn calibrate(template: &Template, secs: u64, logs: &Path) -> Result<Calibration> {
    eprintln!("xtask: calibration: fio alone for {secs}s, then the built-in neighbour alone");
    let size = neighbour::file_bytes(secs as f64, NEIGHBOUR_MAX_IOPS).min(NEIGHBOUR_FILE_MAX);
    let fio = {
        let fs = ScratchFs::create_with(&ScratchOptions {
            template: Some(template.image.clone()),
            ..ScratchOptions::new(0)
        })?;
        crate::bench::drop_caches()?;
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
        crate::bench::drop_caches()?;
        let epoch = Instant::now();
        let nb = Neighbour::start(&wal, epoch, Duration::from_secs(secs + 60))?;
        crate::bench::sleep(Duration::from_secs(secs))?;
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
