//! `serve --trusted-keys`: nothing unverified is published; the refusal
//! names the ref, the commit and the reason; new signatures (a ConfigMap
//! update) are picked up, verified first, and never written to.

use crate::support::*;
use oscontent_testkit::signing::*;
use oscontent_testkit::*;
use std::path::{Path, PathBuf};

/// A bundle signed over `tiny` by a key revoked after it signed, and a
/// trusted keyring that carries the revocation.
fn signed_by_revoked_key(t: &Path, tiny: &Tiny) -> (PathBuf, PathBuf) {
    let s = |p: &Path| p.display().to_string();
    let revocable = keygen(
        &t.join("keys"),
        "revocable",
        &["--out-revocation", &s(&t.join("revocable.rev"))],
    )
    .unwrap();
    let by_revoked = t.join("by-revoked");
    sign(&oscontainer_args(tiny), &revocable, &by_revoked).unwrap();
    let revoked_ring = t.join("revoked.asc");
    std::fs::write(
        &revoked_ring,
        std::fs::read(t.join("revocable.rev")).unwrap(),
    )
    .unwrap();
    (by_revoked, revoked_ring)
}

/// A trusted signature of `from` moved onto `onto`'s commit.
fn trusted_signature_moved(t: &Path, k: &Keys, from: &Tiny, onto: &Tiny) -> PathBuf {
    let by_trusted_other = t.join("by-trusted-other");
    sign(&oscontainer_args(from), &k.trusted, &by_trusted_other).unwrap();
    let moved = t.join("moved");
    std::fs::create_dir(&moved).unwrap();
    std::fs::copy(
        by_trusted_other.join("summary.sig"),
        moved.join("summary.sig"),
    )
    .unwrap();
    std::fs::copy(
        by_trusted_other.join(format!("{}.commitmeta", from.commit)),
        moved.join(format!("{}.commitmeta", onto.commit)),
    )
    .unwrap();
    let mut m = read_manifest(&by_trusted_other).unwrap();
    m["commits"] = serde_json::json!([onto.commit]);
    std::fs::write(moved.join("manifest.json"), serde_json::to_vec(&m).unwrap()).unwrap();
    moved
}

/// A bundle whose manifest is of another kind.
fn malformed_bundle(t: &Path) -> PathBuf {
    let malformed = t.join("malformed");
    std::fs::create_dir(&malformed).unwrap();
    std::fs::write(
        malformed.join("manifest.json"),
        b"{\"kind\": \"something else\"}",
    )
    .unwrap();
    malformed
}

#[test]
fn trusted_keys_refuse_unverified_publications() {
    let tmp = tempdir();
    let k = keys();
    let t = tmp.path();
    let s = |p: &Path| p.display().to_string();
    let tiny = tiny_oscontainer(&t.join("tiny"), 11);
    let other_tiny = tiny_oscontainer(&t.join("other-tiny"), 12);

    let by_other = t.join("by-other");
    sign(&oscontainer_args(&tiny), &k.other, &by_other).unwrap();

    let (by_revoked, revoked_ring) = signed_by_revoked_key(t, &tiny);
    let moved = trusted_signature_moved(t, k, &other_tiny, &tiny);
    let malformed = malformed_bundle(t);

    let ref_and_commit = format!("ref {TINY_REF} (commit {})", tiny.commit);
    // (name, extra serve args, phrases the refusal must contain)
    let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
        (
            "unsigned",
            vec![],
            vec![ref_and_commit.clone(), "no signatures".into()],
        ),
        (
            "untrusted signer",
            vec!["--signatures".into(), s(&by_other)],
            vec![ref_and_commit.clone(), "not in the trusted keyring".into()],
        ),
        (
            "revoked key",
            vec!["--signatures".into(), s(&by_revoked)],
            vec![ref_and_commit.clone(), "revoked".into()],
        ),
        (
            "trusted signature over another commit",
            vec!["--signatures".into(), s(&moved)],
            vec![ref_and_commit.clone(), "bad signature".into()],
        ),
        (
            "malformed bundle",
            vec!["--signatures".into(), s(&malformed)],
            vec!["signature bundle".into(), "manifest.json".into()],
        ),
    ];
    // Started together (each is small), checked one by one.
    let mut servers = Vec::new();
    for (name, extra, _) in &cases {
        let trusted = if *name == "revoked key" {
            &revoked_ring
        } else {
            &k.trusted.public
        };
        let server = Server::oscontainer(&tiny.root)
            .args(extra)
            .args(["--trusted-keys", &s(trusted), "--signatures-poll", POLL])
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        servers.push(server);
    }
    for ((name, _, phrases), mut server) in cases.into_iter().zip(servers) {
        let needle = if name == "malformed bundle" {
            "signature bundle"
        } else {
            "refusing to publish"
        };
        server
            .wait_stderr_lines(needle, 1, START_TIMEOUT)
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let err = server.stderr();
        for p in &phrases {
            assert!(
                err.contains(p.as_str()),
                "{name}: the refusal lacks {p:?}:\n{err}"
            );
        }
        assert_eq!(readyz(&server), 503, "{name}: not ready");
        assert_eq!(
            server.get("/summary").unwrap().status,
            503,
            "{name}: nothing served"
        );
        assert!(
            server.is_running(),
            "{name}: the server waits for signatures rather than exiting"
        );
    }
}

#[test]
fn configmap_updates_are_verified_before_they_are_served() {
    let tmp = tempdir();
    let k = keys();
    let tiny = tiny_oscontainer(&tmp.path().join("tiny"), 13);
    let good = tmp.path().join("good");
    let bad = tmp.path().join("bad");
    sign(&oscontainer_args(&tiny), &k.trusted, &good).unwrap();
    sign(&oscontainer_args(&tiny), &k.other, &bad).unwrap();
    let mut cm = ConfigMapDir::new(&tmp.path().join("cm"));
    cm.update(&bad);
    let cm_path = cm.dir.display().to_string();

    let mut server = Server::oscontainer(&tiny.root)
        .args(["--signatures", &cm_path, "--signatures-poll", POLL])
        .args(["--trusted-keys", k.trusted.public.to_str().unwrap()])
        .spawn()
        .unwrap();
    server
        .wait_stderr_lines("refusing to publish", 1, START_TIMEOUT)
        .unwrap();
    assert_eq!(readyz(&server), 503);

    // The signer publishes the right bundle: the server verifies it and
    // becomes ready without a restart.
    cm.update(&good);
    server.wait_ready(NOTICE_TIMEOUT).unwrap();
    let good_sig = std::fs::read(good.join("summary.sig")).unwrap();
    assert_eq!(get_ok(&server, "/summary.sig"), good_sig);
    let meta_path = format!("/{}", object_rel(&tiny.commit, "commitmeta"));
    let good_meta = get_ok(&server, &meta_path);

    // A bad update is refused; the verified generation stays.
    cm.update(&bad);
    let cm_before = snapshot(&cm.dir).unwrap();
    server
        .wait_stderr_lines("still serving the previous generation", 1, NOTICE_TIMEOUT)
        .unwrap();
    assert_eq!(readyz(&server), 200);
    assert_eq!(get_ok(&server, "/summary.sig"), good_sig);
    assert_eq!(get_ok(&server, &meta_path), good_meta);
    assert_unchanged(
        &cm.dir,
        &cm_before,
        "the signature directory is read-only to the server",
    );
}
