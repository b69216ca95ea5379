//! Stock `ostree pull` against the server: by ref, by checksum, mirror,
//! updates that fetch only what is missing, HTTP/2 on and off.

use oscontent_testkit::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Kinds whose 404 is part of a normal pull: optional files ostree probes.
const OPTIONAL_KINDS: &[&str] = &["summary_sig", "commitmeta", "delta", "delta_index"];

/// Object requests of an access log: (kind, checksum) for each 200.
fn fetched_objects(log: &[AccessEntry]) -> Vec<(String, String)> {
    log.iter()
        .filter(|e| e.status == 200)
        .filter_map(|e| e.object().map(|(c, ext)| (object_kind(&ext).to_owned(), c)))
        .collect()
}

/// Every request was a GET answered 200, or a 404 for an optional file.
fn assert_clean_pull_log(log: &[AccessEntry], what: &str) {
    assert!(!log.is_empty(), "{what}: empty access log");
    for e in log {
        assert!(
            KINDS.contains(&e.kind.as_str()),
            "{what}: unknown kind in {e:?}"
        );
        if e.kind == "health" || e.kind == "metrics" {
            continue;
        }
        assert_eq!(e.method, "GET", "{what}: ostree only GETs: {e:?}");
        assert_ne!(
            e.kind, "other",
            "{what}: ostree requested a path outside the archive layout: {e:?}"
        );
        match e.status {
            200 => {}
            404 => assert!(
                OPTIONAL_KINDS.contains(&e.kind.as_str()),
                "{what}: 404 for a path ostree needs: {e:?}"
            ),
            s => panic!("{what}: unexpected status {s}: {e:?}"),
        }
    }
}

fn count_tree(root: &Path) -> u64 {
    let mut n = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else {
                n += 1;
            }
        }
    }
    n
}

#[test]
fn pull_v1_by_ref_into_bare_user_then_fsck_and_checkout() {
    let v1 = v1();
    let before = snapshot(&v1.oscontainer).unwrap();
    let server = Server::release(v1);
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    // Default remote options: ostree's http2 setting is on.
    repo.remote_add("os", &server.url, &[]).unwrap();
    repo.pull(&["os", fixture_ref()]).unwrap();

    let r = format!("os:{}", fixture_ref());
    assert_eq!(
        repo.rev_parse(&r).unwrap(),
        v1.commit,
        "pulled ref points at the v1 commit"
    );
    assert_eq!(repo.refs().unwrap(), BTreeSet::from([r.clone()]));
    repo.fsck().unwrap();
    repo.run(["fsck", "--verify-bindings"]).unwrap();
    let version = repo
        .run(["show", "--print-metadata-key=version", &v1.commit])
        .unwrap();
    assert!(
        version.contains(&v1.version),
        "version metadata {version:?}"
    );

    let co = tmp.path().join("checkout");
    repo.run(["checkout", "-U", &v1.commit, co.to_str().unwrap()])
        .unwrap();
    assert_eq!(
        count_tree(&co),
        v1.tree_files,
        "checkout has every file and symlink of the v1 tree"
    );

    // The server was asked only for repo paths, and had everything ostree
    // needed; a fresh repo fetched every object of v1 exactly as stored.
    let log = server.access_log().unwrap();
    assert_clean_pull_log(&log, "v1 pull");
    let fetched: BTreeSet<(String, String)> = fetched_objects(&log).into_iter().collect();
    let served = list_objects(&v1.repo).unwrap();
    for kind in ["commit", "dirtree", "dirmeta", CONTENT] {
        let got: BTreeSet<String> = fetched
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, c)| c.clone())
            .collect();
        assert_eq!(
            got,
            served.get(kind),
            "a fresh pull fetches every {kind} object of v1"
        );
    }
    assert_eq!(
        repo.objects().unwrap().get(CONTENT),
        served.get(CONTENT),
        "local content objects = v1's"
    );

    // --oscontainer mode never writes the image it serves.
    drop(server);
    assert_unchanged(&v1.oscontainer, &before, "serving v1 with --oscontainer");
}

#[test]
fn update_v1_to_v2_fetches_only_missing_objects() {
    let (v1, v2) = (v1(), v2());
    let s1 = Server::release(v1);
    let s2 = Server::release(v2);
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    // This test pulls with HTTP/2 off; the v1 test runs with ostree's default.
    let opts = ["--set=http2=false"];
    repo.remote_add("os", &s1.url, &opts).unwrap();
    repo.pull(&["os", fixture_ref()]).unwrap();
    let r = format!("os:{}", fixture_ref());
    assert_eq!(repo.rev_parse(&r).unwrap(), v1.commit);
    let local_before = repo.objects().unwrap();

    // The node's remote moves to the server of the new release.
    repo.remote_replace("os", &s2.url, &opts).unwrap();
    repo.pull(&["os", fixture_ref()]).unwrap();
    assert_eq!(
        repo.rev_parse(&r).unwrap(),
        v2.commit,
        "the ref moved to v2"
    );
    repo.fsck().unwrap();
    let local_after = repo.objects().unwrap();

    let log = s2.access_log().unwrap();
    assert_clean_pull_log(&log, "v2 pull");
    for e in s1.access_log().unwrap().iter().chain(&log) {
        if e.kind != "health" {
            assert_eq!(
                e.version, "HTTP/1.1",
                "http2=false must give HTTP/1.1: {e:?}"
            );
        }
    }

    let requested = requested_only_what_was_missing(&log, &local_before, &local_after);
    let fetched =
        fetched_exactly_the_missing_content(v2, &log, &requested, &local_before, &local_after);
    metrics_agree_with_the_access_log(&s2, fetched.len());
}

/// No object the node already had was requested, whatever its kind, and
/// every object requested is now present locally; the requests by kind.
fn requested_only_what_was_missing(
    log: &[AccessEntry],
    local_before: &ObjectSet,
    local_after: &ObjectSet,
) -> BTreeMap<String, Vec<String>> {
    let mut requested: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in log {
        if let Some((c, ext)) = e.object() {
            let kind = object_kind(&ext).to_owned();
            if kind == "commitmeta" {
                continue; // detached metadata is not an object of the tree
            }
            assert!(
                !local_before.contains(&kind, &c),
                "v2 pull requested {} {c}, which the node already had from v1 ({e:?})",
                kind
            );
            requested.entry(kind).or_default().push(c);
        }
    }
    // ...and every object requested is now present locally.
    for (kind, cs) in &requested {
        for c in cs {
            assert!(
                local_after.contains(kind, c),
                "{kind} {c} was fetched but is not in the repo"
            );
        }
    }
    requested
}

/// Exactly the missing content was fetched (v2's content minus v1's), a
/// small fraction of the release; returns the fetched content checksums.
fn fetched_exactly_the_missing_content(
    v2: &Release,
    log: &[AccessEntry],
    requested: &BTreeMap<String, Vec<String>>,
    local_before: &ObjectSet,
    local_after: &ObjectSet,
) -> BTreeSet<String> {
    let v2_objects = list_objects(&v2.repo).unwrap();
    let missing: BTreeSet<String> = v2_objects
        .get(CONTENT)
        .difference(&local_before.get(CONTENT))
        .cloned()
        .collect();
    let fetched: BTreeSet<String> = requested
        .get(CONTENT)
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .collect();
    assert_eq!(
        fetched,
        missing,
        "the v2 pull fetches exactly the content v1 lacked (fetched {}, missing {})",
        fetched.len(),
        missing.len()
    );
    let new_locally: BTreeSet<String> = local_after
        .get(CONTENT)
        .difference(&local_before.get(CONTENT))
        .cloned()
        .collect();
    assert_eq!(
        fetched, new_locally,
        "what was fetched is what was added locally"
    );

    // Positive: an update is a small fraction of the release.
    let total = v2_objects.get(CONTENT).len();
    assert!(
        !fetched.is_empty(),
        "v2 rewrote files, so some content must be fetched"
    );
    assert!(
        fetched.len() * 5 < total,
        "an update fetches far fewer than the {total} content objects of v2, got {}",
        fetched.len()
    );
    let filez_bytes: u64 = log
        .iter()
        .filter(|e| e.kind == "filez" && e.status == 200)
        .map(|e| e.bytes)
        .sum();
    assert!(
        filez_bytes * 4 < v2.repo_bytes,
        "update moved {filez_bytes} content bytes of a {} byte repo",
        v2.repo_bytes
    );
    assert_eq!(
        requested.get("commit").map(Vec::len),
        Some(1),
        "one commit object: v2's"
    );
    fetched
}

/// The server's `/metrics` agree with its access log, request by request
/// and byte by byte.
fn metrics_agree_with_the_access_log(s2: &Server, fetched_len: usize) {
    let metrics = s2.metrics().unwrap();
    let log = s2.access_log().unwrap();
    let mut by_kind_status: BTreeMap<(String, u16), u64> = BTreeMap::new();
    let mut bytes_by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for e in log.iter().filter(|e| e.kind != "metrics") {
        *by_kind_status
            .entry((e.kind.clone(), e.status))
            .or_default() += 1;
        *bytes_by_kind.entry(e.kind.clone()).or_default() += e.bytes;
    }
    for ((kind, status), n) in &by_kind_status {
        let got = metrics.get(
            "oscontent_http_requests_total",
            &[("kind", kind), ("status", &status.to_string())],
        );
        assert_eq!(
            got,
            Some(*n as f64),
            "requests_total{{kind={kind},status={status}}} vs access log"
        );
    }
    for s in metrics.of("oscontent_http_requests_total") {
        let kind = &s.labels["kind"];
        if kind == "metrics" {
            continue;
        }
        let status: u16 = s.labels["status"].parse().unwrap();
        assert_eq!(
            by_kind_status
                .get(&(kind.clone(), status))
                .copied()
                .unwrap_or(0) as f64,
            s.value,
            "metric {s:?} has no matching access-log lines"
        );
    }
    for (kind, b) in &bytes_by_kind {
        let got = metrics.get("oscontent_http_response_bytes_total", &[("kind", kind)]);
        assert_eq!(
            got,
            Some(*b as f64),
            "response_bytes_total{{kind={kind}}} vs access log"
        );
    }
    let filez_count = metrics.get(
        "oscontent_http_request_duration_seconds_count",
        &[("kind", "filez")],
    );
    assert_eq!(
        filez_count,
        Some(
            by_kind_status
                .get(&("filez".into(), 200))
                .copied()
                .unwrap_or(0) as f64
        )
    );
    assert_eq!(
        metrics.get(
            "oscontent_http_requests_total",
            &[("kind", "filez"), ("status", "200")]
        ),
        Some(fetched_len as f64),
        "filez requests counted by /metrics = distinct missing objects"
    );
}

#[test]
fn mirror_pull_into_archive_repo() {
    let v1 = v1();
    let server = Server::release(v1);
    let tmp = tempdir();
    let mirror = Ostree::init(&tmp.path().join("mirror"), "archive").unwrap();
    mirror.remote_add("os", &server.url, &[]).unwrap();
    // No refs named: --mirror fetches every ref the summary lists.
    mirror.pull(&["--mirror", "os"]).unwrap();
    assert_eq!(
        mirror.refs().unwrap(),
        BTreeSet::from([fixture_ref().to_owned()]),
        "mirrors keep plain ref names"
    );
    assert_eq!(mirror.rev_parse(fixture_ref()).unwrap(), v1.commit);
    mirror.fsck().unwrap();
    mirror.run(["fsck", "--verify-bindings"]).unwrap();

    // The mirror holds the same objects, byte for byte.
    let served = list_objects(&v1.repo).unwrap();
    let mirrored = mirror.objects().unwrap();
    for kind in ["commit", "dirtree", "dirmeta", CONTENT] {
        assert_eq!(
            mirrored.get(kind),
            served.get(kind),
            "{kind} objects of the mirror"
        );
    }
    let (big, _) = largest_filez(&v1.repo).unwrap();
    assert_eq!(
        std::fs::read(object_path(&mirror.repo, &big, "filez")).unwrap(),
        std::fs::read(object_path(&v1.repo, &big, "filez")).unwrap(),
        "mirrored .filez bytes are the served ones"
    );
    assert_clean_pull_log(&server.access_log().unwrap(), "mirror pull");

    // A mirror is itself servable: serve it with --repo and list its refs.
    let s2 = Server::repo(&mirror.repo).start().unwrap();
    let sum = s2.summary().unwrap();
    let names: Vec<&str> = sum.refs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [fixture_ref()]);
    assert_eq!(sum.refs[0].commit.to_hex(), v1.commit);
}

#[test]
fn pull_by_commit_checksum() {
    let v1 = v1();
    let server = Server::release(v1);
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    repo.remote_add("os", &server.url, &[]).unwrap();
    repo.pull(&["os", &v1.commit]).unwrap();
    assert!(
        repo.refs().unwrap().is_empty(),
        "pulling a checksum creates no ref"
    );
    let show = repo.run(["show", &v1.commit]).unwrap();
    assert!(show.contains(&v1.commit), "{show}");
    repo.fsck().unwrap();
    let co = tmp.path().join("checkout");
    repo.run(["checkout", "-U", &v1.commit, co.to_str().unwrap()])
        .unwrap();
    assert_eq!(count_tree(&co), v1.tree_files);
    assert_clean_pull_log(&server.access_log().unwrap(), "pull by checksum");
}

#[test]
fn pull_of_unknown_ref_or_commit_fails_cleanly() {
    let server = Server::release(v1());
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    repo.remote_add("os", &server.url, &[]).unwrap();

    let o = repo
        .output(["pull", "os", "fedora/x86_64/coreos/nosuchstream"])
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "pulling an unknown ref must fail");
    assert_eq!(
        o.status.code(),
        Some(1),
        "a clean error exit, not a crash: {err}"
    );
    assert!(
        err.contains("fedora/x86_64/coreos/nosuchstream"),
        "the error names the ref: {err}"
    );

    let missing = "0000000000000000000000000000000000000000000000000000000000000001";
    let o = repo.output(["pull", "os", missing]).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(1),
        "pulling an unknown commit fails cleanly: {err}"
    );
    assert!(err.contains("404") || err.contains(missing), "{err}");

    assert!(repo.refs().unwrap().is_empty());
    assert!(repo.objects().unwrap().is_empty(), "nothing was written");
    // The unknown ref never reached the object store: the summary answered.
    let log = server.access_log().unwrap();
    let commit_404 = object_url_path(missing, "commit");
    for e in &log {
        if let Some((c, _)) = e.object() {
            assert_eq!(
                c, missing,
                "only the unknown commit was requested as an object: {e:?}"
            );
            assert_eq!(e.status, 404, "{e:?}");
        }
    }
    assert!(
        log.iter().any(|e| e.path == commit_404),
        "ostree asked for the unknown commit"
    );
}

#[test]
fn derived_version_ref_pulls_with_http2_on_and_off() {
    // A commit without a ref binding is published as `version/<version>`.
    let tmp = tempdir();
    let src = tmp.path().join("src");
    let commits = tiny_repo(
        &src,
        &[TinyCommit {
            version: "7.1.0",
            bind_ref: None,
            seed: 1,
        }],
    )
    .unwrap();
    let server = Server::repo(&src).start().unwrap();
    let sum = server.summary().unwrap();
    assert_eq!(sum.refs.len(), 1, "{sum:?}");
    assert_eq!(sum.refs[0].name, "version/7.1.0");
    assert_eq!(sum.refs[0].commit.to_hex(), commits[0]);

    for (i, (label, value)) in [("on", "true"), ("off", "false")].into_iter().enumerate() {
        let repo = Ostree::init(&tmp.path().join(format!("node-{i}")), "bare-user").unwrap();
        repo.remote_add("os", &server.url, &[&format!("--set=http2={value}")])
            .unwrap();
        let before = server.access_log().unwrap().len();
        repo.pull(&["os", "version/7.1.0"])
            .unwrap_or_else(|e| panic!("pull with http2 {label}: {e:#}"));
        assert_eq!(repo.rev_parse("os:version/7.1.0").unwrap(), commits[0]);
        repo.fsck().unwrap();
        let log = server.access_log().unwrap();
        let mine = &log[before..];
        assert_clean_pull_log(mine, &format!("http2 {label}"));
        let versions: BTreeSet<&str> = mine.iter().map(|e| e.version.as_str()).collect();
        if value == "false" {
            assert_eq!(versions, BTreeSet::from(["HTTP/1.1"]), "http2=false");
        } else {
            // ostree's curl backend asks for HTTP/2 by Upgrade on plain http;
            // either protocol is fine as long as the pull works.
            assert!(
                versions
                    .iter()
                    .all(|v| *v == "HTTP/1.1" || *v == "HTTP/2.0"),
                "{versions:?}"
            );
        }
    }
}
