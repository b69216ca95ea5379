//! Stock `ostree pull` with `gpg-verify` and `gpg-verify-summary`, the key
//! imported with `--gpg-import`, against every way the server gets
//! signatures: a bundle, `--sign-key`, and the source's own detached
//! metadata (oscontainer and image).

use crate::support::*;
use oscontent_testkit::registry::Registry;
use oscontent_testkit::signing::*;
use oscontent_testkit::*;
use std::path::Path;

/// Pulls `TINY_REF` from `url` trusting only `key`; returns the repo and
/// whether the pull succeeded (with its stderr).
fn stock_pull(dir: &Path, url: &str, key: &Key, verify_summary: bool) -> (Ostree, bool, String) {
    let repo = Ostree::init(dir, "archive").unwrap();
    add_signed_remote(&repo, "origin", url, &key.public, verify_summary).unwrap();
    let out = repo
        .output(["pull", "--disable-fsync", "origin", TINY_REF])
        .unwrap();
    (
        repo,
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_pulled(repo: &Ostree, commit: &str, what: &str) {
    assert_eq!(
        repo.rev_parse(&format!("origin:{TINY_REF}")).unwrap(),
        commit,
        "{what}"
    );
    repo.fsck().unwrap();
    // gpgme's own verdict on what was pulled.
    let shown = repo
        .run(["show", commit, "--gpg-verify-remote=origin"])
        .unwrap();
    assert!(shown.contains("Good signature"), "{what}: {shown}");
}

fn assert_refused(repo: &Ostree, ok: bool, stderr: &str, what: &str) {
    assert!(
        !ok,
        "{what}: stock ostree pulled content signed by a key it does not trust"
    );
    assert!(
        stderr.to_lowercase().contains("signature") || stderr.contains("public key not found"),
        "{what}: not a signature failure: {stderr}"
    );
    assert!(repo.refs().unwrap().is_empty(), "{what}: a ref appeared");
}

#[test]
fn stock_ostree_verifies_bundle_and_sign_key_publications() {
    let tmp = tempdir();
    let k = keys();
    let tiny = tiny_oscontainer(&tmp.path().join("tiny"), 5);
    let source_before = snapshot(&tiny.root).unwrap();
    let bundle = tmp.path().join("bundle");
    sign(&oscontainer_args(&tiny), &k.trusted, &bundle).unwrap();
    let bundle_before = snapshot(&bundle).unwrap();
    let s = |p: &Path| p.display().to_string();
    let modes = [
        (
            "bundle",
            Server::oscontainer(&tiny.root).args([
                "--signatures",
                &s(&bundle),
                "--trusted-keys",
                &s(&k.trusted.public),
            ]),
        ),
        (
            "sign-key",
            Server::oscontainer(&tiny.root).args([
                "--sign-key",
                &s(&k.trusted.secret),
                "--trusted-keys",
                &s(&k.trusted.public),
                "--commit",
                &tiny.commit,
            ]),
        ),
        (
            "sign-key-env",
            Server::oscontainer(&tiny.root)
                .args(["--sign-key-env", "OSCONTENT_TEST_SIGN_KEY"])
                .args(["--commit", &tiny.commit])
                .env(
                    "OSCONTENT_TEST_SIGN_KEY",
                    std::fs::read_to_string(&k.trusted.secret).unwrap(),
                ),
        ),
    ];
    for (mode, b) in modes {
        let server = b.start().unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        let (repo, ok, err) = stock_pull(
            &tmp.path().join(format!("{mode}-good")),
            &server.url,
            &k.trusted,
            true,
        );
        assert!(ok, "{mode}: stock ostree refused: {err}");
        assert_pulled(&repo, &tiny.commit, mode);
        let (repo, ok, err) = stock_pull(
            &tmp.path().join(format!("{mode}-other")),
            &server.url,
            &k.other,
            true,
        );
        assert_refused(&repo, ok, &err, mode);
        if mode.starts_with("sign-key") {
            assert!(
                !server
                    .stderr_lines("trusted (control-plane) nodes")
                    .is_empty(),
                "{mode}: the trusted mode is announced"
            );
        }
    }
    assert_unchanged(&tiny.root, &source_before, "serving signed content");
    assert_unchanged(&bundle, &bundle_before, "serving a bundle");
}

#[test]
fn detached_metadata_in_the_source_is_served_and_counts() {
    let tmp = tempdir();
    let k = keys();
    let tiny = tiny_oscontainer(&tmp.path().join("tiny"), 7);
    // The oscontainer was built with a signed commit: its repo carries
    // the trusted key's signature as objects/XX/REST.commitmeta.
    let by_trusted = tmp.path().join("by-trusted");
    sign(&oscontainer_args(&tiny), &k.trusted, &by_trusted).unwrap();
    std::fs::copy(
        by_trusted.join(format!("{}.commitmeta", tiny.commit)),
        tiny.repo.join(object_rel(&tiny.commit, "commitmeta")),
    )
    .unwrap();
    let both = tmp.path().join("both.asc");
    std::fs::write(
        &both,
        [
            std::fs::read(&k.trusted.public).unwrap(),
            std::fs::read(&k.other.public).unwrap(),
        ]
        .concat(),
    )
    .unwrap();
    oci_layout(&tmp.path().join("oci"), &[(&tiny, "signed")]);
    let reg = Registry::start();
    let image = pinned_images(&reg, &tmp.path().join("oci"), &["signed"]);
    let s = |p: &Path| p.display().to_string();
    let sources: [(&str, Vec<String>); 2] =
        [("oscontainer", oscontainer_args(&tiny)), ("image", image)];
    for (name, source) in sources {
        // A bundle by the other key over the same publication.
        let by_other = tmp.path().join(format!("by-other-{name}"));
        sign(&source, &k.other, &by_other).unwrap();

        // Trusting only the source's signer: the commit verifies through
        // the source's own signature; the summary (signed only by the
        // other key) does not, and only the summary is named.
        let mut refused = builder(&source)
            .args([
                "--signatures",
                &s(&by_other),
                "--trusted-keys",
                &s(&k.trusted.public),
            ])
            .spawn()
            .unwrap();
        let lines = refused
            .wait_stderr_lines("refusing to publish", 1, START_TIMEOUT)
            .unwrap();
        let err = refused.stderr();
        assert!(
            err.contains("summary (sha256") && err.contains("not in the trusted keyring"),
            "{name}: {err}"
        );
        assert!(
            !err.contains(&format!("ref {TINY_REF} (commit")),
            "{name}: the commit verified: {err}"
        );
        assert_eq!(readyz(&refused), 503, "{name}: {lines:?}");
        drop(refused);

        // Trusting both: published, with both signatures merged.
        let server = builder(&source)
            .args(["--signatures", &s(&by_other), "--trusted-keys", &s(&both)])
            .start()
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let meta = get_ok(
            &server,
            &format!("/{}", object_rel(&tiny.commit, "commitmeta")),
        );
        assert_eq!(
            sig_count(&meta),
            2,
            "{name}: the source's signature and the bundle's"
        );
        // Stock ostree trusting only the source's signer accepts the commit.
        let (repo, ok, err) = stock_pull(
            &tmp.path().join(format!("pull-{name}")),
            &server.url,
            &k.trusted,
            false,
        );
        assert!(ok, "{name}: {err}");
        assert_pulled(&repo, &tiny.commit, name);
    }
}

#[test]
fn sign_key_covers_images_and_live_repo_changes() {
    let tmp = tempdir();
    let k = keys();
    let s = |p: &Path| p.display().to_string();
    let sign_args = [
        "--sign-key".to_owned(),
        s(&k.trusted.secret),
        "--trusted-keys".into(),
        s(&k.trusted.public),
    ];

    // --image by digest: the server signs what it staged.
    let tiny = tiny_oscontainer(&tmp.path().join("tiny"), 21);
    oci_layout(&tmp.path().join("oci"), &[(&tiny, "t")]);
    let reg = Registry::start();
    let image = pinned_images(&reg, &tmp.path().join("oci"), &["t"]);
    let server = Server::images(Vec::<String>::new())
        .args(&image)
        .args(&sign_args)
        .start()
        .unwrap();
    let (repo, ok, err) = stock_pull(
        &tmp.path().join("image-pull"),
        &server.url,
        &k.trusted,
        true,
    );
    assert!(ok, "image: {err}");
    assert_pulled(&repo, &tiny.commit, "image");
    drop(server);

    // --repo: a ref another tool moves to a commit the operator pinned is
    // signed (and verified) only by a publication the operator asks for
    // (SIGHUP), never on its own: the server is no signing oracle for
    // whoever can write the repo.
    let live = tmp.path().join("live");
    let (r, first) = live_repo(&live, 22);
    // The release pipeline made the next commit, and pinned it, before
    // another tool brings it into the repo and moves the ref.
    let staged = fork_repo(&live, &tmp.path().join("staged")).unwrap();
    let second = move_to_second(&staged, tmp.path(), &first);
    let mut server = Server::repo(&live)
        .args(&sign_args)
        .args(["--commit", &first, "--commit", &second])
        .args(["--signatures-poll", POLL])
        .start()
        .unwrap();
    let (node, ok, err) = stock_pull(&tmp.path().join("live-pull"), &server.url, &k.trusted, true);
    assert!(ok, "repo: {err}");
    assert_pulled(&node, &first, "repo");

    r.run(["pull-local", &s(&tmp.path().join("staged")), &second])
        .unwrap();
    r.run(["refs", "--force", &format!("--create={TINY_REF}"), &second])
        .unwrap();
    // Several signature polls go by: nothing is published, signed or served.
    std::thread::sleep(NOTICE_TIMEOUT.min(std::time::Duration::from_secs(3)));
    assert!(server.stderr_lines("publishing again").is_empty());
    for ext in ["commit", "commitmeta"] {
        let path = format!("/{}", object_rel(&second, ext));
        assert_eq!(server.get(&path).unwrap().status, 404, "{path}");
    }
    let r = server.get(&format!("/refs/heads/{TINY_REF}")).unwrap();
    assert_eq!(String::from_utf8_lossy(&r.body).trim(), first);
    server.sighup().unwrap();
    let signed = wait_for(
        NOTICE_TIMEOUT,
        std::time::Duration::from_millis(100),
        || {
            let meta = server
                .get(&format!("/{}", object_rel(&second, "commitmeta")))
                .ok()?;
            (meta.status == 200).then_some(())
        },
    );
    assert!(
        signed.is_some(),
        "the new commit was signed:\n{}",
        server.stderr()
    );
    node.pull(&["origin", TINY_REF]).unwrap();
    assert_pulled(&node, &second, "repo after a change");
}
