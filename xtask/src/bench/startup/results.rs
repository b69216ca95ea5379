//! What `bench startup` records: its trials, per-arm summaries, targets
//! and the JSON report (`target/bench/startup-<stamp>.json`).

use crate::bench::scratch::{DiskStats, Usage};
use crate::bench::Summary;
use crate::fixtures::{Release, Scale};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Arm {
    Oscontent,
    /// skopeo copy + umoci unpack.
    PullExtract,
}

impl Arm {
    pub fn label(self) -> &'static str {
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
