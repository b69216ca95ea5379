//! What every failure must look like: nothing staged, nothing served,
//! nothing written outside the state dir, and a retry.

use super::ERROR_TIMEOUT;
use oscontent_testkit::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

/// Names under `dir` (none if it does not exist).
pub fn names(dir: &Path) -> BTreeSet<String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
        Err(e) => panic!("{}: {e}", dir.display()),
    }
}

/// `staging-*` directories under STATE/images.
pub fn staging_dirs(state: &Path) -> Vec<String> {
    names(&state.join("images"))
        .into_iter()
        .filter(|n| n.starts_with("staging-"))
        .collect()
}

/// Paths that must not be served while no image is verified.
fn unserved_paths(commits: &[&str], refs: &[&str]) -> Vec<String> {
    let mut paths: Vec<String> = ["/summary", "/summary.sig", "/config"]
        .iter()
        .map(|p| (*p).to_owned())
        .collect();
    for r in refs {
        paths.push(format!("/refs/heads/{r}"));
    }
    for c in commits {
        paths.push(object_url_path(c, "commit"));
        paths.push(object_url_path(c, "commitmeta"));
    }
    paths
}

/// Asserts that nothing is served: `/readyz` 503, and every repo path
/// (summary, config, `refs`, the commits' objects) 404 or 503 without the
/// commits in the body.
pub fn assert_nothing_served(server: &Server, commits: &[&str], refs: &[&str]) {
    let r = server.get("/readyz").unwrap();
    assert_eq!(r.status, 503, "/readyz while no image is verified");
    for p in unserved_paths(commits, refs) {
        let r = server.get(&p).unwrap();
        assert!(
            r.status == 404 || r.status == 503,
            "{p} answered {} while no image is verified",
            r.status
        );
        let body = String::from_utf8_lossy(&r.body);
        for c in commits {
            assert!(!body.contains(c), "{p} mentions commit {c}: {body}");
        }
    }
}

/// What STATE/images and STATE/generations held just after the `n`th
/// error line appeared, and whether that sample is conclusive: taken less
/// than [`SAMPLE_WINDOW`] after the line was last seen absent, so well
/// within the one-second backoff, before any retry could create anything.
pub struct Sample {
    pub line: String,
    pub images: BTreeSet<String>,
    pub generations: BTreeSet<String>,
    pub conclusive: bool,
}

/// See [`Sample`]: the retry starts a second after the error is logged.
pub const SAMPLE_WINDOW: Duration = Duration::from_millis(600);

pub fn sample_after_error(server: &mut Server, n: usize) -> Sample {
    let deadline = Instant::now() + ERROR_TIMEOUT;
    let mut absent_at = Instant::now();
    for _ in 0..100_000 {
        let lines = server.stderr_lines(" ERROR ");
        if lines.len() >= n {
            let images = names(&server.state_dir.join("images"));
            let generations = names(&server.state_dir.join("generations"));
            return Sample {
                line: lines[n - 1].clone(),
                images,
                generations,
                conclusive: absent_at.elapsed() < SAMPLE_WINDOW,
            };
        }
        assert!(
            server.is_running(),
            "the server exited instead of logging error {n}:\n{}",
            server.stderr()
        );
        assert!(
            Instant::now() < deadline,
            "no error {n} logged within {ERROR_TIMEOUT:?}:\n{}",
            server.stderr()
        );
        absent_at = Instant::now();
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no error {n} logged");
}

/// A failing server: for its first error line (or the next one, if this
/// test process was too slow to look within [`SAMPLE_WINDOW`]), asserts
/// that STATE/images and STATE/generations were empty when it was logged
/// (no staging leftovers), that it names every `needle` (and the attempt),
/// that nothing is served, and that nothing but the state dir and the
/// access log appeared next to the state dir; then that another error line
/// follows (the retry). Returns the first error line.
pub fn assert_fails_cleanly(
    server: &mut Server,
    needles: &[&str],
    commits: &[&str],
    refs: &[&str],
) -> String {
    let mut checked = 0;
    for n in 1..=4 {
        let s = sample_after_error(server, n);
        if n == 1 {
            eprintln!("failure as logged: {}", s.line);
        }
        for needle in needles
            .iter()
            .copied()
            .chain([format!("attempt={n}").as_str()])
        {
            assert!(
                s.line.contains(needle),
                "error {n} should mention {needle:?}:\n{}\nstderr:\n{}",
                s.line,
                server.stderr()
            );
        }
        if !s.conclusive {
            eprintln!("error {n} seen too late to sample the state dir; next one");
            continue;
        }
        assert!(
            s.images.is_empty(),
            "after the error {:?}, STATE/images holds {:?} (staging leftovers)",
            s.line,
            s.images
        );
        assert!(
            s.generations.is_empty(),
            "after the error {:?}, STATE/generations holds {:?}",
            s.line,
            s.generations
        );
        checked = n;
        break;
    }
    assert!(
        checked > 0,
        "could not sample the state dir in time after 4 errors"
    );
    assert_nothing_served(server, commits, refs);
    assert_only_state_written(server);
    // It keeps trying, with backoff.
    let again = sample_after_error(server, checked + 1);
    for needle in needles {
        assert!(
            again.line.contains(needle),
            "the retry fails the same way: {}",
            again.line
        );
    }
    assert!(
        server.is_running(),
        "a failed fetch must not stop the server"
    );
    assert_nothing_served(server, commits, refs);
    assert_only_state_written(server);
    server.stderr_lines(" ERROR ")[0].clone()
}

/// Next to the state dir (the harness's own temporary dir) there is only
/// the state dir and the access log.
pub fn assert_only_state_written(server: &Server) {
    let parent = server.state_dir.parent().unwrap();
    let state_name = server
        .state_dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let found = names(parent);
    let allowed: BTreeSet<String> = [state_name, "access.log".to_owned()].into();
    assert!(
        found.is_subset(&allowed),
        "files appeared next to the state dir {}: {:?}",
        server.state_dir.display(),
        found.difference(&allowed).collect::<Vec<_>>()
    );
    // Inside the state dir, only the server's own directories.
    let top = names(&server.state_dir);
    let allowed: BTreeSet<String> = ["images", "generations", "deltas"]
        .map(str::to_owned)
        .into();
    assert!(
        top.is_subset(&allowed),
        "unexpected entries in the state dir: {top:?}"
    );
}

/// `/etc/passwd`'s bytes and metadata, to compare before and after.
pub fn passwd_state() -> (Vec<u8>, String) {
    let m = std::fs::symlink_metadata("/etc/passwd").unwrap();
    use std::os::unix::fs::MetadataExt;
    (
        std::fs::read("/etc/passwd").unwrap(),
        format!("{} {} {} {}", m.ino(), m.size(), m.mtime(), m.mtime_nsec()),
    )
}
