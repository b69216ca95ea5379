//! `--sign-key` and `sign` sign only what the operator pinned
//! (ARCHITECTURE.md's trust model): a registry tag that moves, or a `--repo` someone else
//! writes, never gets a commit signed with the release key.

use crate::support::*;
use oscontent_testkit::registry::Registry;
use oscontent_testkit::signing::*;
use oscontent_testkit::*;
use std::path::Path;
use std::time::Duration;

/// How long the tests let polls and refreshes go by (each 1 s) before
/// checking that nothing new was signed.
const SEVERAL_POLLS: Duration = Duration::from_secs(4);

/// Runs `oscontent-server ARGS` (a `serve` gets a scratch state dir and
/// port 0) and expects it to refuse at start with `phrase`, never
/// listening.
fn refused_at_start(args: &[String], state: &Path, phrase: &str) {
    let mut cmd = server_command(args);
    if args.first().map(String::as_str) == Some("serve") {
        cmd.arg("--state-dir").arg(state);
        cmd.args(["--listen", "127.0.0.1:0"]);
    }
    let o = run_bounded(&mut cmd, TOOL_TIMEOUT).unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} started:\n{stderr}");
    assert!(!announced_listening(&o.stdout), "{args:?} listened");
    assert!(
        stderr.contains(phrase),
        "{args:?}: no {phrase:?} in:\n{stderr}"
    );
}

/// A fresh node that verifies commits and the summary pulls `TINY_REF`:
/// whether it succeeded, and the commit it then holds, if any.
fn verified_pull(dir: &Path, url: &str, key: &Key) -> (bool, Option<String>) {
    let node = Ostree::init(dir, "archive").unwrap();
    add_signed_remote(&node, "origin", url, &key.public, true).unwrap();
    let out = node
        .output(["pull", "--disable-fsync", "origin", TINY_REF])
        .unwrap();
    let at = node.rev_parse(&format!("origin:{TINY_REF}")).ok();
    (out.status.success(), at)
}

/// Neither the commit nor any signature of it is served.
fn not_served(server: &Server, commit: &str, what: &str) {
    for ext in ["commit", "commitmeta"] {
        let path = format!("/{}", object_rel(commit, ext));
        assert_eq!(server.get(&path).unwrap().status, 404, "{what}: {path}");
    }
}

#[test]
fn a_moved_tag_never_gets_a_new_commit_signed() {
    let tmp = tempdir();
    let k = keys();
    let s = |p: &Path| p.display().to_string();
    let one = tiny_oscontainer(&tmp.path().join("one"), 61);
    let other = tiny_oscontainer(&tmp.path().join("other"), 62);
    let layout = tmp.path().join("oci");
    oci_layout(&layout, &[(&one, "one"), (&other, "other")]);
    let reg = Registry::start();
    reg.push(&layout, "one", "tiny:release", &[]);
    let tagged = reg.image("tiny:release");
    let key = ["--sign-key".to_owned(), s(&k.trusted.secret)];
    let insecure = ["--insecure-registry".to_owned(), reg.host()];

    // By tag: refused at start, by `serve --sign-key` and by `sign`,
    // saying how to pin it.
    let fix = format!(
        "give the image by digest (docker://{}/tiny@sha256:…) instead of the tag :release",
        reg.host()
    );
    let serve = [
        vec!["serve".to_owned(), "--image".into(), tagged.clone()],
        insecure.to_vec(),
        key.to_vec(),
        vec!["--refresh-interval".into(), "1".into()],
    ]
    .concat();
    refused_at_start(&serve, &tmp.path().join("state-tag"), &fix);
    let layout_ref = format!("oci:{}:one", layout.display());
    let by_layout = [
        vec!["serve".to_owned(), "--image".into(), layout_ref],
        key.to_vec(),
    ]
    .concat();
    refused_at_start(
        &by_layout,
        &tmp.path().join("state-oci"),
        "push it to a registry",
    );
    let out = tmp.path().join("bundle-by-tag");
    let sign_tag = [
        vec!["sign".to_owned(), "--image".into(), tagged],
        insecure.to_vec(),
        vec![
            "--key".into(),
            s(&k.trusted.secret),
            "--out".into(),
            s(&out),
        ],
    ]
    .concat();
    refused_at_start(&sign_tag, &tmp.path().join("unused"), &fix);
    assert!(!out.exists(), "sign wrote a bundle for a tag");

    // By digest: signed, and stock ostree verifies it.
    let digest = reg.digest("tiny:release");
    let pinned = reg.image(&format!("tiny@{digest}"));
    let mut server = Server::images([pinned])
        .args(&insecure)
        .args(&key)
        .args(["--refresh-interval", "1"])
        .start()
        .unwrap();
    let (ok, at) = verified_pull(&tmp.path().join("node-1"), &server.url, &k.trusted);
    assert!(ok && at.as_deref() == Some(one.commit.as_str()), "{at:?}");

    // The tag moves to another image: refreshes and a SIGHUP go by, and
    // the other image's commit is neither served nor signed.
    reg.push(&layout, "other", "tiny:release", &[]);
    assert_ne!(reg.digest("tiny:release"), digest, "the tag moved");
    std::thread::sleep(SEVERAL_POLLS);
    server.sighup().unwrap();
    std::thread::sleep(SEVERAL_POLLS);
    not_served(&server, &other.commit, "after the tag moved");
    let (ok, at) = verified_pull(&tmp.path().join("node-2"), &server.url, &k.trusted);
    assert!(ok && at.as_deref() == Some(one.commit.as_str()), "{at:?}");
    assert!(
        server.stderr_lines(&other.commit).is_empty(),
        "{}",
        server.stderr()
    );
}

#[test]
fn a_written_repo_gets_nothing_signed() {
    let tmp = tempdir();
    let k = keys();
    let s = |p: &Path| p.display().to_string();
    let live = tmp.path().join("live");
    let (r, first) = live_repo(&live, 63);
    let key = ["--sign-key".to_owned(), s(&k.trusted.secret)];

    // Unpinned: refused at start, by `serve --sign-key` and by `sign`.
    let serve = [
        vec!["serve".to_owned(), "--repo".into(), s(&live)],
        key.to_vec(),
    ]
    .concat();
    refused_at_start(
        &serve,
        &tmp.path().join("state-unpinned"),
        "--commit CHECKSUM",
    );
    let out = tmp.path().join("bundle-unpinned");
    let sign_repo = [
        vec!["sign".to_owned(), "--repo".into(), s(&live)],
        vec![
            "--key".into(),
            s(&k.trusted.secret),
            "--out".into(),
            s(&out),
        ],
    ]
    .concat();
    refused_at_start(&sign_repo, &tmp.path().join("unused"), "--commit CHECKSUM");

    let mut server = Server::repo(&live)
        .args(&key)
        .args(["--commit", &first, "--signatures-poll", "1"])
        .start()
        .unwrap();
    let (ok, at) = verified_pull(&tmp.path().join("node-1"), &server.url, &k.trusted);
    assert!(ok && at.as_deref() == Some(first.as_str()), "{at:?}");

    // Someone who can write the repo moves the ref to their commit and
    // changes what the summary is made of.
    let second = move_to_second(&r, tmp.path(), &first);
    std::fs::create_dir_all(live.join("delta-indexes/aa")).unwrap();
    let config = std::fs::read_to_string(live.join("config")).unwrap();
    std::fs::write(live.join("config"), format!("{config}\n# changed\n")).unwrap();
    std::thread::sleep(SEVERAL_POLLS);
    not_served(&server, &second, "after the repo was written");
    let (_, at) = verified_pull(&tmp.path().join("node-2"), &server.url, &k.trusted);
    assert_ne!(at.as_deref(), Some(second.as_str()), "a node took it");

    // Nor does the operator's SIGHUP sign it: refused, naming the commit.
    server.sighup().unwrap();
    server
        .wait_stderr_lines(
            "refusing to sign and publish unpinned content",
            1,
            NOTICE_TIMEOUT,
        )
        .unwrap();
    let refused = server.stderr();
    assert!(
        refused.contains(&format!("commit {second} is not pinned")),
        "{refused}"
    );
    not_served(&server, &second, "after SIGHUP");
    // `sign` refuses the moved ref too, and writes nothing.
    let sign_moved = [sign_repo.clone(), vec!["--commit".into(), first.clone()]].concat();
    refused_at_start(&sign_moved, &tmp.path().join("unused"), "is not pinned");
    assert!(!out.exists(), "sign wrote a bundle");
}

/// `--trusted-keys` pins too: a `--repo` commit that already carries a
/// signature they verify (the release key's, in the repo's detached
/// metadata) is signed with `--sign-key`; a ref moved to a commit without
/// one is refused at SIGHUP.
#[test]
fn a_written_repo_gets_only_trusted_commits_signed() {
    let tmp = tempdir();
    let k = keys();
    let s = |p: &Path| p.display().to_string();
    let live = tmp.path().join("live");
    let (r, first) = live_repo(&live, 64);
    // The release key (`other` here) signed `first` where it was made.
    let upstream = tmp.path().join("upstream-bundle");
    let pinned = [
        "--repo".to_owned(),
        s(&live),
        "--commit".into(),
        first.clone(),
    ];
    sign(&pinned, &k.other, &upstream).unwrap();
    std::fs::copy(
        upstream.join(format!("{first}.commitmeta")),
        live.join(object_rel(&first, "commitmeta")),
    )
    .unwrap();
    let ring = tmp.path().join("ring.asc");
    let keys = [&k.other.public, &k.trusted.public].map(|p| std::fs::read(p).unwrap());
    std::fs::write(&ring, keys.concat()).unwrap();
    let mut server = Server::repo(&live)
        .args([
            "--sign-key",
            &s(&k.trusted.secret),
            "--trusted-keys",
            &s(&ring),
        ])
        .args(["--signatures-poll", "1"])
        .start()
        .unwrap();
    let (ok, at) = verified_pull(&tmp.path().join("node-1"), &server.url, &k.trusted);
    assert!(ok && at.as_deref() == Some(first.as_str()), "{at:?}");
    let meta = get_ok(&server, &format!("/{}", object_rel(&first, "commitmeta")));
    assert_eq!(sig_count(&meta), 2, "the release key's and the server's");

    let second = move_to_second(&r, tmp.path(), &first);
    server.sighup().unwrap();
    server
        .wait_stderr_lines(
            "refusing to sign and publish unpinned content",
            1,
            NOTICE_TIMEOUT,
        )
        .unwrap();
    assert!(
        server
            .stderr()
            .contains(&format!("commit {second} is not pinned")),
        "{}",
        server.stderr()
    );
    not_served(&server, &second, "an unsigned commit");
}
