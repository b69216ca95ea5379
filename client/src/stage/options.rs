//! What a stage is asked to do ([`StageOptions`]), and its I/O profiles.
//! A leaf: `mod.rs` runs the stage with these.

use super::image::PinnedImage;
use crate::governor::IoMode;
use crate::pull::error::{PullError, PullResult};
use crate::pull::{Output, Source, MAX_CONCURRENCY};
use anyhow::anyhow;
use std::path::PathBuf;
use std::time::Duration;

/// What to stage.
#[derive(Debug, Clone)]
pub enum StageTarget {
    /// `--image REFERENCE@sha256:DIGEST`: the digest is the trust root.
    Image(PinnedImage),
    /// `--ref REF`: the image the remote stages for the commit at REF.
    Ref(String),
}

/// `--io-profile`: how hard a stage may lean on the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IoProfile {
    /// Hours ahead of a rollout, beside etcd: the idle I/O class, writeback
    /// in small chunks one at a time steered toward a 5 ms flush latency,
    /// at most 16 MiB/s, two requests in flight (default).
    Background,
    /// What `pull` does by default: paced toward 10 ms, no rate ceiling,
    /// eight requests in flight.
    Foreground,
}

/// The I/O settings a profile gives, each overridable on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoSettings {
    pub mode: IoMode,
    pub latency_target: Duration,
    pub max_rate: Option<u64>,
    pub concurrency: usize,
}

impl IoProfile {
    pub fn settings(self) -> IoSettings {
        match self {
            IoProfile::Background => IoSettings {
                mode: IoMode::Paced,
                latency_target: Duration::from_millis(5),
                max_rate: Some(16 << 20),
                concurrency: 2,
            },
            IoProfile::Foreground => IoSettings {
                mode: IoMode::Paced,
                latency_target: Duration::from_millis(10),
                max_rate: None,
                concurrency: 8,
            },
        }
    }
}

/// The profile with the flags given on top of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoChoice {
    pub profile: IoProfile,
    pub mode: Option<IoMode>,
    pub latency_target: Option<Duration>,
    pub max_rate: Option<u64>,
    pub concurrency: Option<usize>,
}

impl IoChoice {
    /// The settings, the concurrency checked as `pull` checks it.
    pub fn checked(&self) -> PullResult<IoSettings> {
        let base = self.profile.settings();
        let s = IoSettings {
            mode: self.mode.unwrap_or(base.mode),
            latency_target: self.latency_target.unwrap_or(base.latency_target),
            max_rate: self.max_rate.or(base.max_rate),
            concurrency: self.concurrency.unwrap_or(base.concurrency),
        };
        if !(1..=MAX_CONCURRENCY).contains(&s.concurrency) {
            return Err(PullError::Usage(anyhow!(
                "--concurrency must be 1 to {MAX_CONCURRENCY}, not {}",
                s.concurrency
            )));
        }
        Ok(s)
    }
}

#[derive(Debug, Clone)]
pub struct StageOptions {
    pub repo: PathBuf,
    pub source: Source,
    pub target: StageTarget,
    pub trusted_keys: Option<PathBuf>,
    pub io: IoChoice,
    /// Fetching (everything before the barrier) must end within this.
    pub timeout: Duration,
    pub http1_only: bool,
    pub output: Output,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_profile_one_by_one() {
        let choice = |mode, rate, conc| IoChoice {
            profile: IoProfile::Background,
            mode,
            latency_target: None,
            max_rate: rate,
            concurrency: conc,
        };
        let table = [
            (
                choice(None, None, None),
                Ok((IoMode::Paced, Some(16 << 20), 2)),
            ),
            (
                choice(Some(IoMode::StockLike), None, None),
                Ok((IoMode::StockLike, Some(16 << 20), 2)),
            ),
            (
                choice(None, Some(1 << 20), Some(4)),
                Ok((IoMode::Paced, Some(1 << 20), 4)),
            ),
            (choice(None, None, Some(0)), Err(())),
            (choice(None, None, Some(65)), Err(())),
        ];
        for (c, want) in table {
            let got = c
                .checked()
                .map(|s| (s.mode, s.max_rate, s.concurrency))
                .map_err(|_| ());
            assert_eq!(got, want, "{c:?}");
        }
        let fg = IoProfile::Foreground.settings();
        assert_eq!((fg.max_rate, fg.concurrency), (None, 8));
    }
}
