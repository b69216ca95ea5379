//! `oscontent-server serve` refuses bad input with a clear error and a
//! non-zero exit, before it listens, and without touching the repo.

use oscontent_testkit::*;
use std::path::Path;

const TINY_REF: &str = "tiny/x86_64/stable";

fn tiny(dir: &Path, n: usize) -> Vec<String> {
    let versions = ["1.0", "2.0", "3.0"];
    let commits: Vec<TinyCommit> = (0..n)
        .map(|i| TinyCommit {
            version: versions[i],
            bind_ref: Some(TINY_REF),
            seed: i as u32,
        })
        .collect();
    tiny_repo(dir, &commits).unwrap()
}

fn assert_refused(b: ServerBuilder, needles: &[&str]) -> Refusal {
    let r = b.start_expect_failure().unwrap_or_else(|e| panic!("{e:#}"));
    let err = r.error();
    assert!(!err.is_empty(), "no `error:` line on stderr:\n{}", r.stderr);
    for n in needles {
        assert!(err.contains(n), "the error should mention {n:?}:\n{err}");
    }
    r
}

#[test]
fn refuses_repos_that_are_not_archive_mode() {
    let tmp = tempdir();
    for mode in ["bare", "bare-user", "bare-user-only"] {
        let repo = tmp.path().join(mode);
        Ostree::init(&repo, mode).unwrap();
        let before = snapshot(&repo).unwrap();
        assert_refused(Server::repo(&repo), &["archive"]);
        assert_unchanged(&repo, &before, &format!("refusing a {mode} repo"));
        // The same repo inside an oscontainer layout.
        let oc = tmp.path().join(format!("oc-{mode}"));
        std::fs::create_dir_all(oc.join("srv")).unwrap();
        copy_dir(&repo, &oc.join("srv/repo")).unwrap();
        assert_refused(Server::oscontainer(&oc), &["archive"]);
    }
}

#[test]
fn refuses_directories_that_are_not_repos() {
    let tmp = tempdir();
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("config"), "[core]\nmode=archive-z2\n").unwrap();
    let r = assert_refused(Server::repo(&empty), &[]);
    assert!(
        r.error().contains(&empty.display().to_string()),
        "names the directory: {}",
        r.error()
    );
    let missing = tmp.path().join("missing");
    let r = assert_refused(Server::repo(&missing), &[]);
    assert!(
        r.error().contains(&missing.display().to_string()),
        "names the directory: {}",
        r.error()
    );
    // An oscontainer root without srv/repo.
    let r = assert_refused(Server::oscontainer(&empty), &[]);
    assert!(
        r.error().contains("srv/repo"),
        "names srv/repo: {}",
        r.error()
    );
    // A file is not a repo either.
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    assert_refused(Server::repo(&file), &[]);
}

#[test]
fn refuses_to_guess_among_several_commits() {
    let tmp = tempdir();
    let repo = tmp.path().join("repo");
    let commits = tiny(&repo, 2);
    let r = assert_refused(Server::repo(&repo), &["--commit"]);
    for c in &commits {
        assert!(
            r.error().contains(c.as_str()),
            "lists the candidate {c}: {}",
            r.error()
        );
    }
    // Choosing one works and publishes it under its binding.
    let server = Server::repo(&repo)
        .arg("--commit")
        .arg(&commits[1])
        .start()
        .unwrap();
    let s = server.summary().unwrap();
    assert_eq!(s.refs.len(), 1);
    assert_eq!(s.refs[0].name, TINY_REF);
    assert_eq!(s.refs[0].commit.to_hex(), commits[1]);
    assert_eq!(s.refs[0].version.as_deref(), Some("2.0"));
}

#[test]
fn refuses_unknown_or_malformed_commits() {
    let tmp = tempdir();
    let repo = tmp.path().join("repo");
    tiny(&repo, 1);
    let absent = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert_refused(Server::repo(&repo).arg("--commit").arg(absent), &[absent]);
    let o = Server::repo(&repo)
        .arg("--commit")
        .arg("not-a-checksum")
        .start_expect_failure()
        .unwrap();
    assert!(o.stderr.contains("not-a-checksum"), "{}", o.stderr);
}

#[test]
fn refuses_refs_outside_the_binding() {
    let tmp = tempdir();
    let repo = tmp.path().join("repo");
    let commits = tiny(&repo, 1);
    assert_refused(
        Server::repo(&repo).arg("--ref").arg("other/stream"),
        &["other/stream", TINY_REF],
    );
    assert_refused(Server::repo(&repo).arg("--ref").arg("../../etc"), &[]);
    // The bound name itself is fine.
    let server = Server::repo(&repo)
        .arg("--ref")
        .arg(TINY_REF)
        .start()
        .unwrap();
    let s = server.summary().unwrap();
    assert_eq!(s.refs[0].name, TINY_REF);
    assert_eq!(s.refs[0].commit.to_hex(), commits[0]);
}

#[test]
fn refuses_a_state_dir_inside_the_served_repo() {
    let tmp = tempdir();
    let repo = tmp.path().join("repo");
    tiny(&repo, 1);
    let before = snapshot(&repo).unwrap();
    for state in [
        repo.clone(),
        repo.join("state"),
        repo.join("objects/state"),
        repo.join("refs/heads/state"),
    ] {
        assert_refused(Server::repo(&repo).state_dir(&state), &["--state-dir"]);
        assert_unchanged(
            &repo,
            &before,
            &format!("refusing --state-dir {}", state.display()),
        );
    }
    // Same through an oscontainer root.
    let oc = tmp.path().join("oc");
    std::fs::create_dir_all(oc.join("srv")).unwrap();
    copy_dir(&repo, &oc.join("srv/repo")).unwrap();
    let before = snapshot(&oc).unwrap();
    assert_refused(
        Server::oscontainer(&oc).state_dir(&oc.join("srv/repo/tmp/state")),
        &["--state-dir"],
    );
    assert_unchanged(&oc, &before, "refusing a state dir inside srv/repo");
}

#[test]
fn refuses_a_state_dir_that_contains_the_served_repo() {
    let tmp = tempdir();
    for sub in ["repo", "generations/repo"] {
        let state = tmp.path().join(format!("state-{}", sub.replace('/', "-")));
        let repo = state.join(sub);
        tiny(&repo, 1);
        let before = snapshot(&repo).unwrap();
        let r = Server::repo(&repo)
            .state_dir(&state)
            .start_expect_failure()
            .unwrap();
        assert!(
            repo.join("config").is_file(),
            "starting with --state-dir {} deleted the served repo {}:\n{}",
            state.display(),
            repo.display(),
            r.error()
        );
        assert_unchanged(
            &repo,
            &before,
            &format!("refusing state dir {}", state.display()),
        );
        assert!(
            r.error().contains("--state-dir"),
            "the error names --state-dir: {}",
            r.error()
        );
    }
}

/// A second server on a port that one already serves fails to bind and
/// says which address: the first's workers share one socket rather than
/// `SO_REUSEPORT`, with which the second would bind and silently take a
/// share of the connections. The first then still answers.
#[test]
fn a_second_server_on_a_port_in_use_is_refused() {
    let first = Server::release(v1());
    let addr = first.addr.to_string();
    assert_refused(
        Server::oscontainer(&v1().oscontainer).listen(&addr),
        &[&format!("binding {addr}"), "in use"],
    );
    let got = fetch(&http1(), &first.url_for("/config"), &[]).unwrap();
    assert_eq!(got.status, 200);
}
