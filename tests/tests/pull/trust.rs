//! Signatures, ref bindings and downgrades, on the basic paths (the full
//! hostile suite is tests/tests/hostile): the right key passes,
//! a wrong key or a stripped signature is refused with exit 3, a replay of
//! an older release with exit 4, and in every refusal the ref stays put.

use super::support::*;
use oscontent_format::build_gpgsigs;
use oscontent_format::openpgp::{self, KeyAlgo};
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const REF: &str = "tiny/stable";

struct Signed {
    src: PathBuf,
    commits: Vec<String>,
    good: PathBuf,
    bad: PathBuf,
    good_fpr: String,
}

fn key(dir: &Path, name: &str) -> (openpgp::Cert, PathBuf) {
    let (tsk, public) =
        openpgp::generate_key(&format!("{name} <{name}@example.com>"), KeyAlgo::Ed25519).unwrap();
    let path = dir.join(format!("{name}.asc"));
    std::fs::write(&path, public).unwrap();
    (openpgp::load_tsk(tsk.as_bytes()).unwrap(), path)
}

/// An archive repo with releases 1.0 and 2.0 bound to `REF`, both commits
/// and the summary signed by `good`.
fn signed_repo(dir: &Path) -> Signed {
    let src = dir.join("src");
    let commits = tiny_repo(
        &src,
        &[
            TinyCommit {
                version: "1.0",
                bind_ref: Some(REF),
                seed: 1,
            },
            TinyCommit {
                version: "2.0",
                bind_ref: Some(REF),
                seed: 2,
            },
        ],
    )
    .unwrap();
    let (good_tsk, good) = key(dir, "good");
    let (_, bad) = key(dir, "bad");
    for c in &commits {
        let bytes = std::fs::read(object_path(&src, c, "commit")).unwrap();
        let sig = openpgp::sign_detached(&good_tsk, &bytes).unwrap();
        std::fs::write(
            object_path(&src, c, "commitmeta"),
            build_gpgsigs(&[sig]).unwrap(),
        )
        .unwrap();
    }
    let r = Ostree::at(&src);
    r.run(["refs", "--create", REF, &commits[1]]).unwrap();
    r.run(["summary", "-u"]).unwrap();
    let summary = std::fs::read(src.join("summary")).unwrap();
    let sig = openpgp::sign_detached(&good_tsk, &summary).unwrap();
    std::fs::write(src.join("summary.sig"), build_gpgsigs(&[sig]).unwrap()).unwrap();
    Signed {
        src,
        commits,
        good,
        bad,
        good_fpr: good_tsk.fingerprint().to_hex(),
    }
}

fn keys(p: &Path) -> Vec<&str> {
    vec!["--trusted-keys", p.to_str().unwrap()]
}

/// `verify`: exit 0 with the right key, 3 with another.
fn verify_exits_by_key(server: &Server, s: &Signed, c2: &str) {
    let verify = |k: &Path| {
        run_client(&[
            "verify",
            "--url",
            &server.url,
            "--ref",
            REF,
            "--json",
            "--trusted-keys",
            k.to_str().unwrap(),
        ])
    };
    let out = verify(&s.good);
    let evs = expect_ok(&out, "verify");
    assert_eq!(evs[0]["ok"], true);
    assert_eq!(evs[0]["commit"], c2);
    let out = verify(&s.bad);
    expect_code(&out, 3, "verify with the wrong key");
    assert_eq!(event(&events(&out), "error")["kind"], "verification");
}

/// A wrong key, or stripped signatures: exit 3, nothing written, no ref.
fn wrong_or_stripped_signatures_write_nothing(
    tmp: &Path,
    server: &mut Server,
    s: &Signed,
    c2: &str,
) {
    // A wrong key: exit 3, nothing written, no ref.
    let fresh = Ostree::init(&tmp.join("fresh"), "bare-user").unwrap();
    let out = run_client(&pull_args(&fresh.repo, &server.url, REF, &keys(&s.bad)));
    expect_code(&out, 3, "wrong key");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in the trusted keyring"));
    assert!(fresh.refs().unwrap().is_empty());
    assert!(
        fresh.objects().unwrap().is_empty(),
        "objects written before verification"
    );

    // Stripped signatures: the summary's (served as the last publication
    // snapshotted it, so stripped by publishing again), then the commit's
    // (detached metadata is read live).
    let cm = object_path(&s.src, c2, "commitmeta");
    for (what, file, url) in [
        (
            "summary.sig",
            s.src.join("summary.sig"),
            "/summary.sig".to_owned(),
        ),
        ("commitmeta", cm, object_url_path(c2, "commitmeta")),
    ] {
        let saved = std::fs::read(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        republished(server, &url, 404);
        let out = run_client(&pull_args(&fresh.repo, &server.url, REF, &keys(&s.good)));
        expect_code(&out, 3, &format!("stripped {what}"));
        assert!(fresh.refs().unwrap().is_empty(), "{what}");
        std::fs::write(&file, saved).unwrap();
        republished(server, &url, 200);
    }
}

/// Publishes the source again (SIGHUP) and waits, bounded, until `path`
/// answers `status`.
fn republished(server: &mut Server, path: &str, status: u16) {
    server.sighup().unwrap();
    let seen = poll(Duration::from_secs(30), || -> anyhow::Result<Option<()>> {
        Ok((server.get(path)?.status == status).then_some(()))
    })
    .unwrap();
    assert!(seen.is_some(), "{path} never answered {status}");
}

#[test]
fn signatures_bindings_and_downgrades() {
    let tmp = tempdir();
    let s = signed_repo(tmp.path());
    let mut server = Server::repo(&s.src).start().unwrap();
    let (c1, c2) = (&s.commits[0], &s.commits[1]);

    // The right key: verified, and the events say by whom.
    let node = Ostree::init(&tmp.path().join("node"), "bare-user").unwrap();
    let out = run_client(&pull_args(&node.repo, &server.url, REF, &keys(&s.good)));
    let evs = expect_ok(&out, "signed pull");
    let v = event(&evs, "verified");
    assert_eq!(v["signature"]["cert"], s.good_fpr.as_str());
    assert_eq!(v["summary_signature"]["cert"], s.good_fpr.as_str());
    assert_eq!(node.rev_parse(REF).unwrap(), *c2);
    node.fsck().unwrap();

    verify_exits_by_key(&server, &s, c2);
    wrong_or_stripped_signatures_write_nothing(tmp.path(), &mut server, &s, c2);

    // A remote configured with gpg-verify and a key path needs no flag.
    node.run([
        "remote",
        "add",
        &format!("--set=gpgkeypath={}", s.good.display()),
        "signed",
        &server.url,
    ])
    .unwrap();
    let remote_args = |extra: &[&str]| {
        let mut a = vec![
            "pull",
            "--repo",
            node.repo.to_str().unwrap(),
            "--remote",
            "signed",
            "--ref",
            REF,
            "--json",
        ];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let out = run_client(&remote_args(&[]));
    let evs = expect_ok(&out, "remote with gpgkeypath");
    assert_eq!(
        event(&evs, "verified")["signature"]["cert"],
        s.good_fpr.as_str()
    );
    assert_eq!(node.rev_parse(&format!("signed:{REF}")).unwrap(), *c2);

    // Downgrade: a validly signed older release is refused (exit 4), the
    // ref stays; --allow-downgrade takes it.
    let out = run_client(&remote_args(&["--commit", c1]));
    expect_code(&out, 4, "downgrade");
    assert_eq!(event(&events(&out), "error")["kind"], "downgrade");
    assert_eq!(node.rev_parse(&format!("signed:{REF}")).unwrap(), *c2);
    let out = run_client(&remote_args(&["--commit", c1, "--allow-downgrade"]));
    expect_ok(&out, "allowed downgrade");
    assert_eq!(node.rev_parse(&format!("signed:{REF}")).unwrap(), *c1);
    node.fsck().unwrap();

    // Ref binding: the commits are bound to REF only.
    let out = run_client(&pull_args(
        &node.repo,
        &server.url,
        "other/name",
        &["--commit", c2],
    ));
    expect_code(&out, 3, "wrong ref binding");
    assert!(String::from_utf8_lossy(&out.stderr).contains("bound to"));
    assert!(!node.refs().unwrap().iter().any(|r| r.contains("other")));

    // A pinned checksum the remote does not have: exit 2, ref unchanged.
    let missing = "0".repeat(64);
    let out = run_client(&pull_args(
        &node.repo,
        &server.url,
        REF,
        &["--commit", &missing],
    ));
    expect_code(&out, 2, "missing pinned commit");
}

/// A server nothing verifies answers with a commit dated ten years ahead:
/// had the node's ref moved to it, every honest release of the next ten
/// years would be refused as a downgrade. The pull is refused (exit 4,
/// saying why), the ref never moves, and the next honest release is
/// pulled; pinned with `--commit`, the operator may take it.
#[test]
fn a_far_future_commit_from_an_unverified_server_does_not_freeze_the_node() {
    use oscontent_testkit::signing::commit_tree;
    let tmp = tempdir();
    let src = tmp.path().join("src");
    let r = Ostree::init(&src, "archive").unwrap();
    let tree = tmp.path().join("tree");
    std::fs::create_dir_all(tree.join("usr/bin")).unwrap();
    std::fs::write(tree.join("usr/bin/hello"), "hello\n").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let at = |t: u64| format!("@{t}");
    let ten_years = 10 * 365 * 24 * 3600;
    let future = commit_tree(&r, &tree, REF, "1.1", &at(now + ten_years), None).unwrap();
    std::fs::write(tree.join("usr/bin/hello"), "hello again\n").unwrap();
    let honest = commit_tree(&r, &tree, REF, "1.2", &at(now), None).unwrap();
    r.run(["refs", "--create", REF, &future]).unwrap();
    r.run(["summary", "-u"]).unwrap();
    let mut server = Server::repo(&src).start().unwrap();
    let node = Ostree::init(&tmp.path().join("node"), "bare-user").unwrap();

    let out = run_client(&pull_args(&node.repo, &server.url, REF, &[]));
    expect_code(&out, 4, "far-future commit");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ahead of the local clock") && err.contains(&future),
        "says why, naming the commit: {err}"
    );
    assert!(node.refs().unwrap().is_empty(), "the ref never moved");

    // The next honest release (dated now, a higher version) is pulled.
    r.run(["refs", "--delete", REF]).unwrap();
    r.run(["refs", "--create", REF, &honest]).unwrap();
    r.run(["summary", "-u"]).unwrap();
    server.sighup().unwrap();
    let mut pulled = None;
    for _ in 0..100 {
        let out = run_client(&pull_args(&node.repo, &server.url, REF, &[]));
        if out.status.success() {
            pulled = Some(out);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(pulled.is_some(), "the honest release was never pulled");
    assert_eq!(node.rev_parse(REF).unwrap(), honest);

    // Pinned by the operator, the far-future commit is theirs to take.
    let fresh = Ostree::init(&tmp.path().join("fresh"), "bare-user").unwrap();
    let out = run_client(&pull_args(
        &fresh.repo,
        &server.url,
        REF,
        &["--commit", &future],
    ));
    expect_ok(&out, "pinned far-future commit");
    assert_eq!(fresh.rev_parse(REF).unwrap(), future);
}
