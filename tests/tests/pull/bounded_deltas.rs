//! Static delta generation under its bounds (`--delta-memory`,
//! `--delta-timeout`): two releases of a `--repo` differing in one large
//! file, the kind of pair whose bsdiff held 696 MiB and ran 279 s inside
//! the serving process whatever the timeout. The compiler is a process of
//! its own, killed past either bound; the server stays up, says which
//! pair hit which bound, counts it, leaves nothing of it on disk, and
//! nodes update through loose objects. Within its bounds the delta is
//! published and used.

use oscontent_testkit::process::poll;
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The changed file of the big pair (the audit's 40 MB).
const BIG: usize = 40 << 20;
/// The changed file of the pair that compiles within generous bounds
/// quickly enough for the suite.
const SMALL: usize = 4 << 20;
/// Bound on a round's failure or success to show in the metrics.
const ROUND_WAIT: Duration = Duration::from_secs(300);
const READY_WAIT: Duration = Duration::from_secs(120);

/// A repo with `version/1` and `version/2`, whose trees differ only in
/// `usr/lib/big` (`len` bytes of noise, every 4 KiB page changed by one
/// byte, so that libostree compiles it with bsdiff): the repo and both
/// commits.
struct Pair {
    _dir: tempfile::TempDir,
    repo: PathBuf,
    v1: String,
    v2: String,
}

fn make_pair(len: usize) -> Pair {
    let dir = tempdir();
    let repo = dir.path().join("repo");
    let r = Ostree::init(&repo, "archive").unwrap();
    let mut data = noise(len, 7);
    let mut commits = Vec::new();
    for version in ["1", "2"] {
        let tree = dir.path().join(format!("tree-{version}"));
        std::fs::create_dir_all(tree.join("usr/lib")).unwrap();
        std::fs::write(tree.join("usr/lib/big"), &data).unwrap();
        std::fs::write(
            tree.join("usr/lib/os-release"),
            format!("VERSION={version}\n"),
        )
        .unwrap();
        let c = r
            .run([
                "commit".to_owned(),
                format!("--branch=version/{version}"),
                "--no-xattrs".into(),
                format!("--tree=dir={}", tree.display()),
                format!("--add-metadata-string=version={version}"),
            ])
            .unwrap();
        commits.push(c.trim().to_owned());
        for b in data.iter_mut().step_by(4096) {
            *b ^= 0x5a;
        }
    }
    let v2 = commits.pop().unwrap();
    let v1 = commits.pop().unwrap();
    Pair {
        _dir: dir,
        repo,
        v1,
        v2,
    }
}

/// Made once for the tests that share it.
fn big_pair() -> &'static Pair {
    static PAIR: OnceLock<Pair> = OnceLock::new();
    PAIR.get_or_init(|| make_pair(BIG))
}

fn serve(pair: &Pair, state: &Path, extra: &[&str]) -> Server {
    let mut server = Server::repo(&pair.repo)
        .state_dir(state)
        .args(extra.iter().copied())
        .spawn()
        .unwrap();
    server
        .wait_ready(READY_WAIT)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr()));
    server
}

/// A stock bare-user node holding v1 as `os:version/2`, so that `ostree
/// pull os version/2` looks for the v1 → v2 delta; pulls, checks that it
/// went through a delta or not as `want_delta` says, and fscks.
fn node_update(pair: &Pair, url: &str, dir: &Path, want_delta: bool) {
    let node = Ostree::init(dir, "bare-user").unwrap();
    let src = pair.repo.display().to_string();
    node.run(["pull-local", "--untrusted", &src, &pair.v1])
        .unwrap();
    node.remote_add("os", url, &[]).unwrap();
    node.run(["refs", "--create", "os:version/2", &pair.v1])
        .unwrap();
    let out = node.pull(&["os", "version/2"]).unwrap();
    assert_eq!(out.contains("delta parts"), want_delta, "{out}");
    assert_eq!(node.rev_parse("os:version/2").unwrap(), pair.v2);
    node.fsck().unwrap();
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ...
        let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let ppid = after.split_whitespace().nth(1).unwrap_or_default();
        if ppid == pid.to_string() {
            out.push(stat);
        }
    }
    out
}

/// What the state dir's deltas directory holds, once the round's scratch
/// repo is gone (removed right after the round counts its failure).
fn settled_deltas(state: &Path) -> Vec<String> {
    let list = || -> Vec<String> {
        std::fs::read_dir(state.join("deltas"))
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    poll(Duration::from_secs(30), || {
        let l = list();
        Ok::<_, ()>(l.is_empty().then_some(l))
    })
    .unwrap()
    .unwrap_or_else(list)
}

/// A failed round as a bounded compilation leaves it: the bound named
/// with both commits, counted, the compiler gone, nothing on disk, the
/// server ready, and a node updated through loose objects.
fn assert_bounded_failure(pair: &Pair, server: &mut Server, state: &Path, bound: &str, says: &str) {
    server
        .wait_metric(
            "oscontent_delta_bounds_hit_total",
            &[("bound", bound)],
            1.0,
            ROUND_WAIT,
        )
        .unwrap();
    server
        .wait_metric(
            "oscontent_deltas_total",
            &[("result", "failed")],
            1.0,
            ROUND_WAIT,
        )
        .unwrap();
    let lines = server.stderr_lines("static delta not generated");
    assert_eq!(lines.len(), 1, "{}", server.stderr());
    let line = &lines[0];
    for want in [pair.v1.as_str(), pair.v2.as_str(), says] {
        assert!(line.contains(want), "{want:?} not in {line}");
    }
    assert!(server.is_running(), "{}", server.stderr());
    let pid = server.pid().unwrap();
    assert_eq!(
        children(pid),
        Vec::<String>::new(),
        "the compiler outlived its bound"
    );
    assert_eq!(
        settled_deltas(state),
        Vec::<String>::new(),
        "left in the state dir"
    );
    let m = server.metrics().unwrap();
    assert_eq!(m.get("oscontent_deltas_published", &[]), Some(0.0));
    assert_eq!(m.get("oscontent_ready", &[]), Some(1.0));
    let tmp = tempdir();
    node_update(pair, &server.url, &tmp.path().join("node"), false);
}

#[test]
fn big_changed_file_delta_generation_is_bounded_by_memory() {
    let pair = big_pair();
    let tmp = tempdir();
    let state = tmp.path().join("state");
    // bsdiff of 40 MB holds several hundred MiB; a tiny delta's compiler
    // under 100.
    let mut server = serve(pair, &state, &["--delta-memory", "160M"]);
    assert_bounded_failure(
        pair,
        &mut server,
        &state,
        "memory",
        "--delta-memory bound (160 MiB)",
    );
    assert_eq!(
        server
            .metrics()
            .unwrap()
            .get("oscontent_delta_bounds_hit_total", &[("bound", "time")]),
        Some(0.0)
    );
}

#[test]
fn big_changed_file_delta_generation_is_killed_at_its_timeout() {
    let pair = big_pair();
    let tmp = tempdir();
    let state = tmp.path().join("state");
    let mut server = serve(
        pair,
        &state,
        &["--delta-memory", "4G", "--delta-timeout", "2"],
    );
    assert_bounded_failure(
        pair,
        &mut server,
        &state,
        "time",
        "--delta-timeout (2s) and was killed",
    );
    assert_eq!(
        server
            .metrics()
            .unwrap()
            .get("oscontent_delta_bounds_hit_total", &[("bound", "memory")]),
        Some(0.0)
    );
}

#[test]
fn changed_file_delta_within_its_bounds_is_published_and_used() {
    let pair = make_pair(SMALL);
    let tmp = tempdir();
    let state = tmp.path().join("state");
    let server = serve(
        &pair,
        &state,
        &["--delta-memory", "1G", "--delta-timeout", "600"],
    );
    server
        .wait_metric("oscontent_deltas_published", &[], 1.0, ROUND_WAIT)
        .unwrap();
    let m = server.metrics().unwrap();
    assert_eq!(
        m.get("oscontent_deltas_total", &[("result", "failed")]),
        Some(0.0)
    );
    let lines = server.stderr_lines("the delta compiler ended");
    assert_eq!(lines.len(), 1, "{}", server.stderr());
    assert!(lines[0].contains("peak_rss_bytes"), "{}", lines[0]);
    node_update(&pair, &server.url, &tmp.path().join("node"), true);
}
