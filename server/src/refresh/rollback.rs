//! No rollback on refresh: a moved tag or a new upstream summary whose ref
//! goes back in time would make every fresh node install the old release,
//! so a new generation that moves any published ref to an older commit
//! (older timestamp, or lower `version`) is refused unless the operator
//! allowed it (`--allow-rollback`). Decided per ref: a ref that appears or
//! disappears is not a rollback, only one that moves back.
//!
//! What a publication records becomes the mark, so a release nothing
//! verified may not be dated far ahead of the local clock
//! ([`oscontent_format::age::mark_refusal`], `--max-future-skew`): one
//! forged timestamp would otherwise hold back every later release.

use super::marks::{self, MarksFile};
use crate::metrics::Metrics;
use crate::served::Generation;
use anyhow::{Context, Result};
use oscontent_format::age::{downgrade_reason_from, mark_refusal, Vouched};
use oscontent_format::Checksum;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::ages::RefAge;

/// A ref the next generation would move back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    pub name: String,
    pub from: Checksum,
    pub to: Checksum,
    pub why: String,
}

impl std::fmt::Display for Rollback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ref {} would move back from {} to {}: {}",
            self.name, self.from, self.to, self.why
        )
    }
}

/// What vouches for the marks, and how far an unverified one's date and
/// version reach ([`oscontent_format::age::downgrade_reason_from`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub vouched: Vouched,
    pub max_future_skew: u64,
}

impl Bound {
    /// Verified marks: every signal holds for good.
    pub const VERIFIED: Bound = Bound {
        vouched: Vouched::Verified,
        max_future_skew: oscontent_format::age::DEFAULT_MAX_FUTURE_SKEW,
    };
}

/// Every ref that `next` moves to an older commit than `served` has
/// (pure).
pub fn rollbacks(served: &[RefAge], next: &[RefAge], bound: Bound) -> Vec<Rollback> {
    next.iter()
        .filter_map(|n| {
            let s = served.iter().find(|s| s.name == n.name)?;
            if s.commit == n.commit {
                return None;
            }
            let why =
                downgrade_reason_from(&s.age(), bound.vouched, &n.age(), bound.max_future_skew)?;
            Some(Rollback {
                name: n.name.clone(),
                from: s.commit,
                to: n.commit,
                why,
            })
        })
        .collect()
}

/// The refs a generation publishes, with their commits' ages (reads each
/// commit, verified by its checksum; blocking).
pub fn ref_ages(g: &Generation) -> Result<Vec<RefAge>> {
    g.derived_refs
        .iter()
        .map(|(name, commit)| {
            let c = g
                .commit(commit)
                .with_context(|| format!("reading the commit of ref {name}"))?;
            Ok(RefAge {
                name: name.clone(),
                commit: *commit,
                timestamp: c.timestamp,
                version: c.version(),
            })
        })
        .collect()
}

/// What to do with a generation that moves a ref back in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RollbackPolicy {
    Refuse,
    /// Published, with a warning (`--allow-rollback`).
    Allow,
}

/// Logs and counts what `found` moves back; whether to publish anyway.
pub fn judge(policy: RollbackPolicy, found: &[Rollback], metrics: &Metrics) -> bool {
    judge_serving(
        policy,
        found,
        metrics,
        "still serving the previous generation",
    )
}

/// [`judge`], saying what is served instead when refused.
pub fn judge_serving(
    policy: RollbackPolicy,
    found: &[Rollback],
    metrics: &Metrics,
    serving: &str,
) -> bool {
    for r in found {
        match policy {
            RollbackPolicy::Allow => {
                metrics.rollbacks.with_label_values(&["allowed"]).inc();
                tracing::warn!("{r}; publishing it (--allow-rollback)");
            }
            RollbackPolicy::Refuse => {
                metrics.rollbacks.with_label_values(&["refused"]).inc();
                tracing::error!("{r}: refused, {serving} (--allow-rollback publishes it)");
            }
        }
    }
    found.is_empty() || policy == RollbackPolicy::Allow
}

/// The policy and the high-water marks it judges against (loaded from
/// the state dir, so the first publication after a restart is judged
/// too), shared by the publisher that checks and records.
#[derive(Debug)]
pub struct RollbackGuard {
    policy: RollbackPolicy,
    file: MarksFile,
    marks: Mutex<BTreeMap<String, RefAge>>,
    metrics: Arc<Metrics>,
    /// Whether what this server publishes is verified or pinned.
    vouched: Vouched,
    /// `--max-future-skew`, in seconds.
    max_future_skew: u64,
}

impl RollbackGuard {
    /// Loads the state dir's marks (blocking); a corrupt file is an error.
    pub fn load(state_dir: &Path, policy: RollbackPolicy, metrics: Arc<Metrics>) -> Result<Self> {
        let file = MarksFile::new(state_dir);
        let marks = file.load()?;
        tracing::info!(
            marks = marks.len(),
            file = %file.path().display(),
            "rollback marks: newest release of each ref published from this state dir"
        );
        metrics
            .rollback_allowed
            .set(i64::from(policy == RollbackPolicy::Allow));
        Ok(Self {
            policy,
            file,
            marks: Mutex::new(marks),
            metrics,
            vouched: Vouched::Unverified,
            max_future_skew: oscontent_format::age::DEFAULT_MAX_FUTURE_SKEW,
        })
    }

    /// What vouches for the releases published, and how far ahead of the
    /// clock an unverified one may be dated.
    pub fn bounding(mut self, vouched: Vouched, max_future_skew: u64) -> Self {
        self.vouched = vouched;
        self.max_future_skew = max_future_skew;
        self
    }

    /// Refuses a generation that would record a mark nothing vouches for
    /// (an unverified release dated past `--max-future-skew`): an error
    /// naming the ref, its commit and why, before anything is recorded.
    pub fn admit(&self, next: &[RefAge]) -> Result<()> {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let refused: Vec<String> = next
            .iter()
            .filter_map(|n| {
                let why = mark_refusal(&n.age(), self.vouched, now, self.max_future_skew)?;
                Some(format!("ref {} at {}: {why}", n.name, n.commit))
            })
            .collect();
        if refused.is_empty() {
            return Ok(());
        }
        self.metrics
            .rollbacks
            .with_label_values(&["future"])
            .inc_by(refused.len() as u64);
        anyhow::bail!(
            "{}; not published and not recorded as the rollback mark (fix the build's \
             clock, or verify releases with --trusted-keys or pin the image by digest; \
             --max-future-skew widens the bound)",
            refused.join("; ")
        )
    }

    pub fn policy(&self) -> RollbackPolicy {
        self.policy
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Every ref `next` would move back from its mark (not yet judged).
    pub fn found(&self, next: &[RefAge]) -> Vec<Rollback> {
        let marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        let marked: Vec<RefAge> = next
            .iter()
            .filter_map(|n| marks.get(&n.name).cloned())
            .collect();
        let bound = Bound {
            vouched: self.vouched,
            max_future_skew: self.max_future_skew,
        };
        rollbacks(&marked, next, bound)
    }

    /// Moves the marks to what `published` publishes and writes them
    /// durably (blocking); on error they stay as they were, in memory and
    /// on disk, and the caller must not publish.
    pub fn record(&self, published: &[RefAge]) -> Result<()> {
        let mut marks = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        let mut next = marks.clone();
        marks::advance(&mut next, published);
        if next != *marks {
            self.file.store(&next)?;
            *marks = next;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(n: u8) -> Checksum {
        Checksum::from_bytes(&[n; 32]).expect("32 bytes")
    }

    fn r(name: &str, commit: u8, timestamp: u64, version: Option<&str>) -> RefAge {
        RefAge {
            name: name.to_owned(),
            commit: c(commit),
            timestamp,
            version: version.map(str::to_owned),
        }
    }

    /// What, the refs served, the refs next, the refs refused.
    type Case = (
        &'static str,
        Vec<RefAge>,
        Vec<RefAge>,
        &'static [&'static str],
    );

    #[test]
    fn decided_per_ref() {
        const A: &str = "os/x86_64/stable";
        const B: &str = "os/aarch64/stable";
        let (a, b) = (A, B);
        let cases: &[Case] = &[
            (
                "forward in time",
                vec![r(a, 1, 100, None)],
                vec![r(a, 2, 200, None)],
                &[],
            ),
            (
                "back in time",
                vec![r(a, 1, 200, None)],
                vec![r(a, 2, 100, None)],
                &[A],
            ),
            (
                "same commit",
                vec![r(a, 1, 200, None)],
                vec![r(a, 1, 200, None)],
                &[],
            ),
            (
                "same second, higher version",
                vec![r(a, 1, 100, Some("41.2"))],
                vec![r(a, 2, 100, Some("41.10"))],
                &[],
            ),
            (
                "newer timestamp, lower version (a rebuilt old release)",
                vec![r(a, 1, 100, Some("41.3"))],
                vec![r(a, 2, 200, Some("41.2"))],
                &[A],
            ),
            (
                "a new ref is not a rollback",
                vec![r(a, 1, 200, None)],
                vec![r(a, 1, 200, None), r(b, 2, 1, None)],
                &[],
            ),
            (
                "a ref removed is not a rollback",
                vec![r(a, 1, 200, None), r(b, 2, 300, None)],
                vec![r(a, 1, 200, None)],
                &[],
            ),
            (
                "only the ref that moved back",
                vec![r(a, 1, 200, None), r(b, 2, 200, None)],
                vec![r(a, 3, 300, None), r(b, 4, 100, None)],
                &[B],
            ),
            ("nothing served yet", vec![], vec![r(a, 1, 1, None)], &[]),
        ];
        for (what, served, next, want) in cases {
            let got: Vec<String> = rollbacks(served, next, Bound::VERIFIED)
                .into_iter()
                .map(|r| r.name)
                .collect();
            assert_eq!(got, *want, "{what}");
        }
    }

    #[test]
    fn an_unverified_marks_version_holds_back_only_within_the_skew() {
        let day = oscontent_format::age::DEFAULT_MAX_FUTURE_SKEW;
        let unverified = Bound {
            vouched: Vouched::Unverified,
            max_future_skew: day,
        };
        let mark = [r("x", 1, 100, Some("9999"))];
        let soon = [r("x", 2, 100 + day, Some("41.1"))];
        let later = [r("x", 3, 101 + day, Some("41.1"))];
        assert_eq!(
            rollbacks(&mark, &soon, unverified).len(),
            1,
            "within the skew"
        );
        assert!(rollbacks(&mark, &later, unverified).is_empty(), "past it");
        assert_eq!(
            rollbacks(&mark, &later, Bound::VERIFIED).len(),
            1,
            "verified"
        );
    }

    #[test]
    fn the_refusal_names_the_ref_and_both_commits() {
        let got = rollbacks(
            &[r("x", 1, 200, None)],
            &[r("x", 2, 100, None)],
            Bound::VERIFIED,
        );
        let text = got[0].to_string();
        for want in ["ref x", &c(1).to_hex(), &c(2).to_hex(), "older"] {
            assert!(text.contains(want), "{text:?} lacks {want:?}");
        }
    }
}
