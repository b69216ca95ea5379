//! The trust flow's premise: `sign` and `serve` compute the same summary,
//! byte for byte, from the same sources, so the bundle's `summary.sig` is
//! served; and a bundle made for other sources is not.

use crate::support::*;
use oscontent_testkit::registry::Registry;
use oscontent_testkit::signing::*;
use oscontent_testkit::*;

/// A `--repo` with what makes summaries interesting: two commits, a static
/// delta between them, a collection ID, and refs chosen by --commit/--ref.
fn rich_repo(dir: &std::path::Path) -> (std::path::PathBuf, Vec<String>) {
    let repo = dir.join("repo");
    let commits = tiny_repo(
        &repo,
        &[
            TinyCommit {
                version: "2.0",
                bind_ref: None,
                seed: 20,
            },
            TinyCommit {
                version: "2.1",
                bind_ref: None,
                seed: 21,
            },
        ],
    )
    .unwrap();
    let r = Ostree::at(&repo);
    r.run(["config", "set", "core.collection-id", "org.example.Os"])
        .unwrap();
    r.run([
        "static-delta",
        "generate",
        "--from",
        &commits[0],
        "--to",
        &commits[1],
    ])
    .unwrap();
    (repo, commits)
}

/// A mirror that keeps its own summary (of one commit, bound to `os/own`):
/// that summary is what is served, so that is what gets signed.
fn repo_with_own_summary(dir: &std::path::Path) -> (std::path::PathBuf, String) {
    let own = dir.join("own");
    let own_commit = tiny_commit(&own, "4.0", Some("os/own"), 40).unwrap();
    let o = Ostree::at(&own);
    o.run(["refs", "--create=os/own", &own_commit]).unwrap();
    o.run(["summary", "-u"]).unwrap();
    (own, own_commit)
}

/// Signs `source` with the trusted and with the other key, checks that the
/// manifests agree and list the `signed` commits, and returns the trusted
/// bundle and its manifest.
fn sign_twice(
    tmp: &std::path::Path,
    name: &str,
    source: &[String],
    signed: &[String],
) -> (std::path::PathBuf, serde_json::Value) {
    let k = keys();
    let b1 = tmp.join(format!("{name}-1"));
    let b2 = tmp.join(format!("{name}-2"));
    let m1 = sign(source, &k.trusted, &b1).unwrap();
    let m2 = sign(source, &k.other, &b2).unwrap();
    // Deterministic across runs and signers.
    assert_eq!(
        manifest_summary_sha256(&m1),
        manifest_summary_sha256(&m2),
        "{name}"
    );
    assert_eq!(m1["commits"], m2["commits"], "{name}");
    let listed: Vec<String> = serde_json::from_value(m1["commits"].clone()).unwrap();
    let mut want = signed.to_vec();
    want.sort();
    assert_eq!(listed, want, "{name}: signed commits");
    (b1, m1)
}

/// What `ostree summary --view` must show of [`rich_repo`]'s summary.
fn assert_rich_summary(name: &str, view: &str) {
    assert!(
        view.contains("org.example.Os"),
        "{name}: collection ID in\n{view}"
    );
    assert!(view.contains("Static Deltas"), "{name}: deltas in\n{view}");
    assert!(
        view.contains("os/a)") && view.contains("os/b)"),
        "{name}: refs in\n{view}"
    );
}

#[test]
fn sign_and_serve_publish_byte_identical_summaries() {
    let tmp = tempdir();
    let k = keys();
    let (repo, commits) = rich_repo(tmp.path());
    let (own, own_commit) = repo_with_own_summary(tmp.path());
    let rel1 = tiny_oscontainer(&tmp.path().join("rel1"), 31);
    let rel2 = tiny_oscontainer(&tmp.path().join("rel2"), 32);
    oci_layout(&tmp.path().join("oci"), &[(&rel1, "one"), (&rel2, "two")]);
    let reg = Registry::start();
    let images = pinned_images(&reg, &tmp.path().join("oci"), &["two", "one"]);
    let p = |x: &std::path::Path| x.display().to_string();
    // (name, source and publication arguments, commits signed)
    let cases: Vec<(&str, Vec<String>, Vec<String>)> = vec![
        (
            "oscontainer",
            vec![
                "--oscontainer".into(),
                p(&v1().oscontainer),
                "--commit".into(),
                v1().commit.clone(),
            ],
            vec![v1().commit.clone()],
        ),
        (
            "repo with deltas, collection ID, --commit and two --ref",
            vec![
                "--repo".into(),
                p(&repo),
                "--commit".into(),
                commits[1].clone(),
                "--ref".into(),
                "os/b".into(),
                "--ref".into(),
                "os/a".into(),
            ],
            vec![commits[1].clone()],
        ),
        (
            "repo with its own summary",
            vec![
                "--repo".into(),
                p(&own),
                "--commit".into(),
                own_commit.clone(),
            ],
            vec![own_commit.clone()],
        ),
        (
            "two images",
            images,
            vec![rel1.commit.clone(), rel2.commit.clone()],
        ),
    ];
    for (name, source, signed) in cases {
        let (b1, m1) = sign_twice(tmp.path(), name, &source, &signed);

        let b = builder(&source).args([
            "--signatures",
            &p(&b1),
            "--trusted-keys",
            &p(&k.trusted.public),
        ]);
        let mut server = b.start().unwrap_or_else(|e| panic!("{name}: {e:#}"));
        server.wait_ready(START_TIMEOUT).unwrap();
        let summary = get_ok(&server, "/summary");
        if name.contains("own summary") {
            assert_eq!(
                summary,
                std::fs::read(own.join("summary")).unwrap(),
                "{name}: the source's summary is served"
            );
        }
        assert_eq!(
            sha256_hex(&summary),
            manifest_summary_sha256(&m1),
            "{name}: served summary is the signed one"
        );
        assert_eq!(
            get_ok(&server, "/summary.sig"),
            std::fs::read(b1.join("summary.sig")).unwrap(),
            "{name}: summary.sig"
        );
        for c in &signed {
            assert_eq!(
                get_ok(&server, &format!("/{}", object_rel(c, "commitmeta"))),
                std::fs::read(b1.join(format!("{c}.commitmeta"))).unwrap(),
                "{name}: {c}.commitmeta"
            );
        }
        // The summary says what the sources say: stock ostree reads it.
        let view = ostree_summary_view(&summary, tmp.path(), name);
        if name.starts_with("repo with deltas") {
            assert_rich_summary(name, &view);
        }
        assert!(
            server
                .stderr_lines("not serving the bundle's summary.sig")
                .is_empty(),
            "{name}"
        );
    }
}

/// `ostree summary --view` of summary bytes, through a scratch repo.
fn ostree_summary_view(summary: &[u8], tmp: &std::path::Path, name: &str) -> String {
    let dir = tmp.join(format!("view-{}", sha256_hex(name.as_bytes())));
    let r = Ostree::init(&dir, "archive").unwrap();
    std::fs::write(dir.join("summary"), summary).unwrap();
    r.run(["summary", "--view"]).unwrap()
}

#[test]
fn a_bundle_for_other_sources_signs_nothing_served() {
    let tmp = tempdir();
    let k = keys();
    let repo = tmp.path().join("repo");
    let commit = tiny_commit(&repo, "3.0", None, 3).unwrap();
    let source = vec!["--repo".to_owned(), repo.display().to_string()];
    let bundle = tmp.path().join("bundle");
    // Signed for a publication under one ref; served under two: same
    // commit, different summary.
    let m = sign(
        &[
            source.clone(),
            vec![
                "--ref".into(),
                "os/a".into(),
                "--commit".into(),
                commit.clone(),
            ],
        ]
        .concat(),
        &k.trusted,
        &bundle,
    )
    .unwrap();
    let server = builder(&source)
        .args([
            "--ref",
            "os/a",
            "--ref",
            "os/b",
            "--signatures",
            bundle.to_str().unwrap(),
        ])
        .start()
        .unwrap();
    let summary = get_ok(&server, "/summary");
    assert_ne!(sha256_hex(&summary), manifest_summary_sha256(&m));
    assert_eq!(
        server.get("/summary.sig").unwrap().status,
        404,
        "a signature over another summary is never served"
    );
    let why = server.stderr_lines("not serving the bundle's summary.sig");
    assert_eq!(why.len(), 1, "the server says why:\n{}", server.stderr());
    assert!(
        why[0].contains(&manifest_summary_sha256(&m)) && why[0].contains(&sha256_hex(&summary)),
        "{}",
        why[0]
    );
    // The commit signature still applies: it signs the commit, not the summary.
    let meta = get_ok(&server, &format!("/{}", object_rel(&commit, "commitmeta")));
    assert_eq!(sig_count(&meta), 1);
}
