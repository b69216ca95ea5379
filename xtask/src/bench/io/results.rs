//! What `bench io` records: its trials, per-arm summaries, targets, and
//! the JSON report (`target/bench/io-<stamp>.json`) that holds them.

use super::bootstrap::Interval;
use super::etcd;
use super::neighbour;
use super::repo::{NewObjects, RepoMode};
use super::stats::{Ratios, WindowStats};
use crate::bench::scratch::DiskStats;
use crate::bench::Summary;
use crate::fixtures::Scale;
use std::path::PathBuf;

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
    /// The baseline's CPU burner (baseline trials).
    pub baseline_load: Option<super::burner::Load>,
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
    /// The server's, over the same windows (what the baseline's burner
    /// matches beside the client's).
    pub server_cpu_s: Summary,
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
    /// How `value` must compare with `limit` to pass (`<=` or `>`).
    pub rule: &'static str,
    /// PASS, MISS, NOT RUN (the arm was not run), or CANNOT JUDGE.
    pub verdict: &'static str,
}

impl Target {
    /// A target passed when `value <= limit`.
    pub fn at_most(update: &str, name: String, value: f64, limit: f64) -> Target {
        Target {
            update: update.to_owned(),
            name,
            value,
            limit,
            rule: "<=",
            verdict: if !value.is_finite() {
                "NOT RUN"
            } else if value <= limit {
                "PASS"
            } else {
                "MISS"
            },
        }
    }
}

/// One update (share) of the run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct UpdateReport {
    /// The fixture's update share (the small update starts from its v1).
    pub share: f64,
    /// `small`, `5%`, `30%`.
    pub update: String,
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
    /// Intervals and time-weighted figures, arm by arm.
    pub judgements: Vec<ArmJudgement>,
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

/// One arm's judgement over its trials with the neighbour.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ArmJudgement {
    pub arm: String,
    pub trials: usize,
    /// Ratios of medians to the baseline's, with 95% bootstrap intervals.
    pub p99: Interval,
    pub max: Interval,
    pub expected: Interval,
    /// Share of the window with an fdatasync in flight > 10, 50, 100 ms.
    pub stall_share: [Summary; 3],
    pub min_ops_per_slice: Summary,
    /// Median stall share (> 10 ms) over stock `ostree pull`'s.
    pub stall_vs_ostree: f64,
}
