//! Helpers shared by the pull suites.

use anyhow::{ensure, Context, Result};
use oscontent_testkit::proxy::{Action, Proxy};
use oscontent_testkit::*;
use serde_json::Value;
use sha2::Digest;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// Bound on one client run (a small-fixture pull takes seconds).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(180);

/// `oscontent ARGS...` with local-only networking, not yet run.
pub fn client<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(client_bin());
    local_only(&mut cmd).args(args).env("RUST_BACKTRACE", "0");
    cmd
}

/// Runs the client; returns its output whatever the exit status.
pub fn run_client<S: AsRef<OsStr>>(args: &[S]) -> Output {
    run_bounded(&mut client(args), CLIENT_TIMEOUT).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `--json` events; every line must be a JSON object with an "event".
pub fn events(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
            assert!(v["event"].is_string(), "no \"event\" field: {l}");
            v
        })
        .collect()
}

/// The one event named `name` (panics if absent or repeated).
pub fn event<'a>(evs: &'a [Value], name: &str) -> &'a Value {
    let found: Vec<&Value> = evs.iter().filter(|e| e["event"] == name).collect();
    assert_eq!(found.len(), 1, "want one {name:?} event in {evs:#?}");
    found[0]
}

/// Asserts success and returns the events.
pub fn expect_ok(out: &Output, what: &str) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{what}: exit {:?}\nstderr:\n{}\nstdout:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    events(out)
}

/// Asserts the exit code.
pub fn expect_code(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: stderr:\n{}\nstdout:\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `pull --repo REPO --url URL --ref REF --json EXTRA...`.
pub fn pull_args(repo: &Path, url: &str, r: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "pull".to_owned(),
        "--repo".into(),
        repo.display().to_string(),
        "--url".into(),
        url.to_owned(),
        "--ref".into(),
        r.to_owned(),
        "--json".into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Object requests answered 200, as (kind, checksum), from access-log
/// entries.
pub fn fetched_objects(log: &[AccessEntry]) -> BTreeSet<(String, String)> {
    log.iter()
        .filter(|e| e.status == 200)
        .filter_map(|e| e.object().map(|(c, ext)| (object_kind(&ext).to_owned(), c)))
        .filter(|(k, _)| k != "commitmeta")
        .collect()
}

/// A checked-out tree, path → description (type, permission bits, size,
/// content digest or symlink target). Owners are left out: checkouts are
/// made with `--user-mode`.
pub fn tree_digest(root: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("listing {}", d.display()))? {
            let e = e?;
            let p = e.path();
            let m = std::fs::symlink_metadata(&p)?;
            let rel = p.strip_prefix(root)?.display().to_string();
            let desc = if m.is_dir() {
                stack.push(p.clone());
                format!("dir {:o}", m.mode() & 0o7777)
            } else if m.file_type().is_symlink() {
                format!("symlink {}", std::fs::read_link(&p)?.display())
            } else {
                let bytes = std::fs::read(&p)?;
                format!(
                    "file {:o} {} {}",
                    m.mode() & 0o7777,
                    bytes.len(),
                    hex::encode(sha2::Sha256::digest(&bytes))
                )
            };
            out.insert(rel, desc);
        }
    }
    Ok(out)
}

/// `ostree checkout --user-mode COMMIT DEST` and its digest.
pub fn checkout_digest(repo: &Ostree, commit: &str, dest: &Path) -> BTreeMap<String, String> {
    repo.run([
        "checkout",
        "--user-mode",
        commit,
        &dest.display().to_string(),
    ])
    .unwrap_or_else(|e| panic!("{e:#}"));
    tree_digest(dest).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The commit a ref points at, if any.
pub fn ref_target(repo: &Ostree, r: &str) -> Option<String> {
    repo.output(["rev-parse", r])
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
}

/// A bare-user repo holding v1 at `REF` (local ref), copied with stock
/// `ostree pull-local` from the fixture.
pub fn repo_at_v1(path: &Path) -> Result<Ostree> {
    let r = Ostree::init(path, "bare-user")?;
    r.run([
        "pull-local",
        "--untrusted",
        &v1().repo.display().to_string(),
        &v1().commit,
    ])?;
    r.run(["refs", "--create", fixture_ref(), &v1().commit])?;
    ensure!(ref_target(&r, fixture_ref()).as_deref() == Some(v1().commit.as_str()));
    Ok(r)
}

/// A server that lies: `root` (a repo directory) served as stock ostree
/// lays it out, except where `rule` says otherwise.
pub fn serve_lying(root: &Path, rule: oscontent_testkit::proxy::Rule) -> Proxy {
    Proxy::serve_dir(root, rule).unwrap()
}

/// [`serve_lying`] rewriting exactly `path`.
pub fn serve_lying_about(root: &Path, path: &str, action: Action) -> Proxy {
    serve_lying(root, oscontent_testkit::proxy::only(path, action))
}

/// Runs `run` while sampling the free space of each of `paths` (every
/// 5 ms, for at most [`CLIENT_TIMEOUT`]); returns its result and the
/// lowest free space seen on each: how much a pull wrote at its peak,
/// temporary files included.
pub fn lowest_free_while<T>(paths: &[&Path], run: impl FnOnce() -> T) -> (T, Vec<u64>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let free = |p: &Path| {
        let st = rustix::fs::statvfs(p).unwrap();
        st.f_bavail * st.f_frsize
    };
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let owned: Vec<std::path::PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
    let watcher = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut low = vec![u64::MAX; owned.len()];
            let rounds = CLIENT_TIMEOUT.as_millis() / 5;
            for _ in 0..rounds {
                for (l, p) in low.iter_mut().zip(&owned) {
                    *l = (*l).min(free(p));
                }
                if done.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            low
        })
    };
    let out = run();
    done.store(true, Ordering::SeqCst);
    (out, watcher.join().unwrap())
}
