//! What every hostile-peer suite (upstream, bundle, image) shares: a state
//! dir inside a sentinel parent that must stay otherwise empty, a check
//! that what the server offers verifies with stock ostree, and the tally.
//!
//! An attack is *stopped* when the server refused it (its log names what
//! was wrong), still serves exactly the genuine release (or nothing, if
//! the attack came first), that release pulls and fscks with stock
//! ostree, and nothing appeared beside the state dir.

use oscontent_testkit::proxy::Rule;
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long one refusal may take to show (a refresh of a tiny repo is
/// well under a second; the first fetch retries after one).
pub const REFUSAL_TIMEOUT: Duration = Duration::from_secs(60);
/// Paths listed around the state dir before giving up (the tree is the
/// test's own).
const MAX_LISTED: usize = 10_000;

/// A parent dir holding only the server's state dir; anything else that
/// appears in it was written outside the state dir.
pub struct Sentinel {
    parent: tempfile::TempDir,
}

impl Sentinel {
    pub fn new() -> Sentinel {
        let parent = tempdir();
        std::fs::create_dir(parent.path().join("state")).unwrap();
        Sentinel { parent }
    }

    pub fn state(&self) -> PathBuf {
        self.parent.path().join("state")
    }

    /// Where a traversal would land if a remote path were ever joined
    /// onto the state dir: inside the parent, so the diff sees it.
    pub fn escaped(&self) -> PathBuf {
        self.parent.path().join("escaped")
    }

    /// `../` enough to climb out of any state layout, then `escaped()`.
    pub fn traversal(&self) -> String {
        let abs = self.escaped();
        format!(
            "{}{}",
            "../".repeat(32),
            abs.strip_prefix("/").unwrap().display()
        )
    }

    /// Everything in the parent besides the state dir.
    pub fn outside(&self) -> Vec<String> {
        let state = self.state();
        let mut out = Vec::new();
        let mut stack = vec![self.parent.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p == state {
                    continue;
                }
                out.push(p.display().to_string());
                if p.is_dir() && !p.is_symlink() && out.len() < MAX_LISTED {
                    stack.push(p);
                }
            }
        }
        out
    }
}

/// A proxy rule that can be changed while the proxy runs: the genuine
/// peer first, the attack once the genuine release is published.
#[derive(Clone, Default)]
pub struct Switch(Arc<Mutex<Option<Rule>>>);

impl Switch {
    pub fn rule(&self) -> Rule {
        let slot = self.0.clone();
        Arc::new(move |p: &str| slot.lock().unwrap().as_ref().and_then(|r| r(p)))
    }

    pub fn set(&self, rule: Option<Rule>) {
        *self.0.lock().unwrap() = rule;
    }
}

/// What the server publishes now: every `/refs/heads/…` it names in its
/// summary, with their commits.
pub fn served_refs(server: &Server) -> Result<Vec<(String, String)>, String> {
    let s = server.summary().map_err(|e| format!("summary: {e:#}"))?;
    Ok(s.refs
        .iter()
        .map(|r| (r.name.clone(), r.commit.to_hex()))
        .collect())
}

/// The server serves exactly `want` (ref, commit), and stock ostree pulls
/// and fscks each commit from it.
pub fn serves_only(server: &Server, want: &[(&str, &str)]) -> Result<(), String> {
    let got = served_refs(server)?;
    let want_owned: Vec<(String, String)> = want
        .iter()
        .map(|(r, c)| (r.to_string(), c.to_string()))
        .collect();
    if got != want_owned {
        return Err(format!("serves {got:?}, not {want_owned:?}"));
    }
    let mut pulled = Vec::new();
    for (r, c) in want {
        let body = server
            .get(&format!("/refs/heads/{r}"))
            .map_err(|e| format!("{e:#}"))?
            .body;
        if String::from_utf8_lossy(&body).trim() != *c {
            return Err(format!("/refs/heads/{r} is not {c}"));
        }
        // Once per commit, by its first ref: a commit bound to one ref
        // (ostree.ref-binding) is pulled by that one, not its version ref.
        if !pulled.contains(c) {
            stock_pull(server, r, c)?;
            pulled.push(*c);
        }
    }
    Ok(())
}

/// Stock ostree pulls `r` from the server into a fresh repo: it must land
/// on `commit` and fsck clean (every object it was offered verified).
pub fn stock_pull(server: &Server, r: &str, commit: &str) -> Result<(), String> {
    let tmp = tempdir();
    let node = Ostree::init(&tmp.path().join("repo"), "bare-user").map_err(|e| e.to_string())?;
    node.remote_add("os", &server.url, &[])
        .map_err(|e| e.to_string())?;
    node.pull(&["os", r])
        .map_err(|e| format!("stock pull of {r}: {e:#}"))?;
    let at = node
        .rev_parse(&format!("os:{r}"))
        .map_err(|e| e.to_string())?;
    if at != commit {
        return Err(format!("os:{r} pulled {at}, not {commit}"));
    }
    node.fsck().map_err(|e| format!("fsck: {e:#}"))?;
    Ok(())
}

/// The sum of `oscontent_source_checks_total{result="failed"}` and
/// `oscontent_rollbacks_total{result="refused"}`: what a refusal moves.
pub fn refusals(server: &Server) -> f64 {
    let Ok(m) = server.metrics() else { return 0.0 };
    m.get("oscontent_source_checks_total", &[("result", "failed")])
        .unwrap_or(0.0)
        + m.get("oscontent_rollbacks_total", &[("result", "refused")])
            .unwrap_or(0.0)
}

/// Waits until the server refused once more than `before`, and its log
/// says `says`.
pub fn wait_refused(server: &Server, before: f64, says: &str) -> Result<(), String> {
    let found = poll(REFUSAL_TIMEOUT, || -> anyhow::Result<Option<()>> {
        Ok((refusals(server) > before && !server.stderr_lines(says).is_empty()).then_some(()))
    })
    .map_err(|e| format!("{e:#}"))?;
    found.ok_or_else(|| {
        format!(
            "no refusal saying {says:?} within {REFUSAL_TIMEOUT:?}; stderr:\n{}",
            server.stderr()
        )
    })
}

/// One row's verdict, for the tally.
pub struct Verdict {
    pub id: &'static str,
    pub what: &'static str,
    pub result: Result<(), String>,
}

/// Runs every row of a peer's table (`name` gives a row's id and what it
/// tries; `run` its verdict, given its index), then [`tally`]s them.
pub fn try_each<A>(
    peer: &str,
    attacks: &[A],
    name: impl Fn(&A) -> (&'static str, &'static str),
    run: impl Fn(usize, &A) -> Result<(), String>,
) {
    let verdicts: Vec<Verdict> = attacks
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let (id, what) = name(a);
            Verdict {
                id,
                what,
                result: run(i, a),
            }
        })
        .collect();
    tally(peer, &verdicts);
}

/// The controls' check: a refresh publishes `r` at `commit` within the
/// refusal timeout, the server then serves only that, and nothing was
/// written outside the sentinel's state dir.
pub fn published_only(server: &Server, r: &str, commit: &str, sentinel: &Sentinel) {
    let moved = poll(REFUSAL_TIMEOUT, || -> anyhow::Result<Option<()>> {
        let refs = served_refs(server).map_err(anyhow::Error::msg)?;
        Ok(refs
            .iter()
            .any(|(n, c)| n == r && c == commit)
            .then_some(()))
    })
    .unwrap();
    assert!(moved.is_some(), "{}", server.stderr());
    serves_only(server, &[(r, commit)]).unwrap();
    nothing_outside(sentinel).unwrap();
}

/// Prints `<peer>: N attacks tried, N stopped` and every row, then fails
/// on any attack that was not stopped.
pub fn tally(peer: &str, verdicts: &[Verdict]) {
    let stopped = verdicts.iter().filter(|v| v.result.is_ok()).count();
    let mut report = format!(
        "{peer}: {} attacks tried, {stopped} stopped\n",
        verdicts.len()
    );
    for v in verdicts {
        let state = match &v.result {
            Ok(()) => "stopped".to_owned(),
            Err(e) => format!("NOT STOPPED: {e}"),
        };
        report.push_str(&format!("  {} {}: {state}\n", v.id, v.what));
    }
    eprintln!("{report}");
    assert_eq!(stopped, verdicts.len(), "{report}");
}

/// The sentinel's verdict, added to a row's.
pub fn nothing_outside(s: &Sentinel) -> Result<(), String> {
    let stray = s.outside();
    if stray.is_empty() {
        Ok(())
    } else {
        Err(format!("written outside the state dir: {stray:?}"))
    }
}

/// A copy of `src` in a fresh temporary dir (the pristine peer stays as
/// built, for the next row).
pub fn fresh_copy(src: &Path) -> (tempfile::TempDir, PathBuf) {
    let t = tempdir();
    let dst = t.path().join("copy");
    copy_dir(src, &dst).unwrap();
    (t, dst)
}
