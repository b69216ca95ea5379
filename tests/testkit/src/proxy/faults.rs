//! Transient faults a client must retry past, as a [`super::Rule`]:
//! `503`s for the first requests of chosen paths, and responses cut
//! mid-body.

use super::{Action, Rule};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Which faults to inject. Counts are over requests whose path starts with
/// `prefix` (default `/objects/`).
#[derive(Debug, Clone)]
pub struct Faults {
    pub prefix: String,
    /// Answer the first N matching requests with `503`, without forwarding.
    pub fail_first: usize,
    /// Answer the first `fail_each` requests of every `fail_path_every`-th
    /// distinct matching path with `503` (0: never).
    pub fail_path_every: usize,
    pub fail_each: usize,
    /// Cut every Nth forwarded matching response half-way (0: never),
    /// counting from 1; the proxy counts the cuts it made
    /// ([`Proxy::cuts`](super::Proxy::cuts)).
    pub reset_every: usize,
    /// Cut the first N forwarded matching responses half-way too. With
    /// `prefix` one large object's path, the cut comes after its head
    /// has gone out, whatever the order of a client's requests.
    pub reset_first: usize,
    /// The status injected (503 unless set).
    pub status: u16,
    /// The `Retry-After` the injected answers carry (none if `None`).
    pub retry_after: Option<String>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            prefix: "/objects/".into(),
            fail_first: 0,
            fail_path_every: 0,
            fail_each: 0,
            reset_every: 0,
            reset_first: 0,
            status: 503,
            retry_after: None,
        }
    }
}

/// What the fault rule decided.
#[derive(Debug, Default)]
pub struct FaultStats {
    /// Matching requests seen (including failed ones).
    pub matched: AtomicUsize,
    /// Matching requests forwarded (cut or not).
    pub forwarded: AtomicUsize,
    /// Answers injected (503 or the status asked for).
    pub injected_503: AtomicUsize,
    /// Distinct matching paths: (order of first appearance, requests).
    per_path: Mutex<HashMap<String, (usize, usize)>>,
}

impl FaultStats {
    pub fn forwarded(&self) -> usize {
        self.forwarded.load(Ordering::SeqCst)
    }
}

impl Faults {
    /// The rule, and the counters it keeps.
    pub fn rule(self) -> (Rule, Arc<FaultStats>) {
        let stats = Arc::new(FaultStats::default());
        let s = stats.clone();
        let rule: Rule = Arc::new(move |path: &str| self.decide(&s, path));
        (rule, stats)
    }

    /// An HTTP/1.1-only proxy in front of `upstream` injecting these
    /// faults, and the rule's counters.
    pub fn start(self, upstream: &str) -> anyhow::Result<(super::Proxy, Arc<FaultStats>)> {
        let (rule, stats) = self.rule();
        let proxy = super::Proxy::builder(upstream)
            .rule(rule)
            .http1_only()
            .start()?;
        Ok((proxy, stats))
    }

    fn decide(&self, stats: &FaultStats, path: &str) -> Option<Action> {
        if !path.starts_with(&self.prefix) {
            return None;
        }
        let n = stats.matched.fetch_add(1, Ordering::SeqCst) + 1;
        let (index, requests) = {
            let mut m = stats.per_path.lock().unwrap();
            let next = m.len();
            let e = m.entry(path.to_owned()).or_insert((next, 0));
            e.1 += 1;
            *e
        };
        let path_fails = self.fail_path_every > 0
            && index % self.fail_path_every == self.fail_path_every - 1
            && requests <= self.fail_each;
        if n <= self.fail_first || path_fails {
            stats.injected_503.fetch_add(1, Ordering::SeqCst);
            return Some(match &self.retry_after {
                None => Action::Status(self.status),
                Some(after) => Action::Later {
                    status: self.status,
                    retry_after: after.clone(),
                },
            });
        }
        let fwd = stats.forwarded.fetch_add(1, Ordering::SeqCst) + 1;
        let cut = (self.reset_every > 0 && fwd % self.reset_every == 0) || fwd <= self.reset_first;
        Some(if cut { Action::Cut } else { Action::Forward })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(faults: Faults, paths: &[&str]) -> Vec<String> {
        let (rule, _) = faults.rule();
        paths.iter().map(|p| format!("{:?}", rule(p))).collect()
    }

    #[test]
    fn plans() {
        let table: &[(Faults, &[&str], &[&str])] = &[
            (
                Faults {
                    fail_first: 2,
                    ..Default::default()
                },
                &["/config", "/objects/a", "/objects/a", "/objects/a"],
                &[
                    "None",
                    "Some(Status(503))",
                    "Some(Status(503))",
                    "Some(Forward)",
                ],
            ),
            (
                Faults {
                    fail_path_every: 2,
                    fail_each: 1,
                    ..Default::default()
                },
                &["/objects/a", "/objects/b", "/objects/b", "/objects/c"],
                &[
                    "Some(Forward)",
                    "Some(Status(503))",
                    "Some(Forward)",
                    "Some(Forward)",
                ],
            ),
            (
                Faults {
                    reset_every: 2,
                    ..Default::default()
                },
                &["/objects/a", "/objects/b", "/objects/c", "/objects/d"],
                &["Some(Forward)", "Some(Cut)", "Some(Forward)", "Some(Cut)"],
            ),
            (
                Faults {
                    prefix: "/objects/b".into(),
                    reset_first: 1,
                    ..Default::default()
                },
                &["/objects/a", "/objects/b", "/objects/b"],
                &["None", "Some(Cut)", "Some(Forward)"],
            ),
            (
                Faults {
                    fail_first: 1,
                    retry_after: Some("7".into()),
                    ..Default::default()
                },
                &["/objects/a", "/objects/a"],
                &[
                    "Some(Later { status: 503, retry_after: \"7\" })",
                    "Some(Forward)",
                ],
            ),
        ];
        for (faults, paths, want) in table {
            assert_eq!(run(faults.clone(), paths), *want, "{faults:?}");
        }
    }
}
