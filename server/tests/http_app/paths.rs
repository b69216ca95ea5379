//! Every kind of archive path answers; everything else is an empty 404;
//! only GET and HEAD are allowed; an HTTP/1.1 request needs one Host (as tests/tests/serve/http.rs and
//! traversal.rs check end to end).

use crate::support::*;
use http::StatusCode;

#[tokio::test]
async fn every_kind_of_archive_path_answers() {
    let (fx, server) = serving_v1().await;
    let v1 = &fx.v1;
    let c = &v1.commit;
    let deltas = v1.files("deltas");
    let superblock = deltas.iter().find(|f| f.ends_with("/superblock")).unwrap();
    let part = deltas.iter().find(|f| f.ends_with("/0")).unwrap();
    let index = &v1.files("delta-indexes")[0];
    let commitmeta = format!("/objects/{}/{}.commitmeta", &c[..2], &c[2..]);
    // (path, metrics kind, Cache-Control, expected body: None = checked below)
    let cases: Vec<(String, &str, &str, Option<Vec<u8>>)> = vec![
        (
            "/config".into(),
            "config",
            SHORT_LIVED,
            Some(v1.disk("config")),
        ),
        ("/summary".into(), "summary", SHORT_LIVED, None),
        (
            format!("/refs/heads/{REF}"),
            "ref",
            SHORT_LIVED,
            Some(format!("{c}\n").into_bytes()),
        ),
        (v1.object("commit"), "commit", IMMUTABLE, None),
        (v1.object("dirtree"), "dirtree", IMMUTABLE, None),
        (v1.object("dirmeta"), "dirmeta", IMMUTABLE, None),
        (v1.object("filez"), "filez", IMMUTABLE, None),
        (commitmeta, "commitmeta", SHORT_LIVED, None),
        (format!("/{superblock}"), "delta", SHORT_LIVED, None),
        (format!("/{part}"), "delta", SHORT_LIVED, None),
        (format!("/{index}"), "delta_index", SHORT_LIVED, None),
    ];
    for (path, _, cache, want) in &cases {
        let r = server.get(path).await;
        assert_eq!(r.status, 200, "{path}");
        let want = match (want, path.as_str()) {
            (Some(w), _) => w.clone(),
            (None, "/summary") => r.body.clone(),
            (None, p) => v1.disk(p),
        };
        assert!(r.body == want, "{path}: body");
        assert_eq!(r.header("cache-control"), Some(*cache), "{path}");
        let len = r.body.len().to_string();
        assert_eq!(r.header("content-length"), Some(len.as_str()), "{path}");
        assert_eq!(r.header("accept-ranges"), Some("bytes"), "{path}");
        assert_eq!(
            r.header("content-type"),
            Some("application/octet-stream"),
            "{path}"
        );
        let etag = r.header("etag").unwrap();
        assert!(
            etag.starts_with('"') && etag.ends_with('"'),
            "{path}: {etag}"
        );
        httpdate::parse_http_date(r.header("last-modified").unwrap()).unwrap();
    }
    // The summary names the bound ref, the commit and the delta.
    let s = oscontent_format::parse_summary(&server.get("/summary").await.body).unwrap();
    assert_eq!(s.refs.len(), 1);
    assert_eq!(
        (s.refs[0].name.as_str(), s.refs[0].commit.to_hex()),
        (REF, c.clone())
    );
    assert_eq!(s.refs[0].version.as_deref(), Some("1.0"));
    assert_eq!(s.mode.as_deref(), Some("archive-z2"));
    assert_eq!(s.deltas.len(), 1);
    // No signature is published.
    let sig = server.get("/summary.sig").await;
    assert_eq!((sig.status, sig.body.len()), (StatusCode::NOT_FOUND, 0));
    // Every request counted under its kind and status.
    for (path, kind, _, _) in &cases {
        let n = cases.iter().filter(|c| c.1 == *kind).count() as f64;
        let got = server
            .metric(
                "oscontent_http_requests_total",
                &[("kind", kind), ("status", "200")],
            )
            .await;
        let extra = f64::from(u8::from(*kind == "summary"));
        assert_eq!(got, Some(n + extra), "{path}: requests of kind {kind}");
    }
}

#[tokio::test]
async fn invalid_and_missing_paths_are_empty_404s() {
    let (fx, server) = serving_v1().await;
    let c = &fx.v1.commit;
    let m64 = "ASNFZ4mrze8BI0VniavN7wEjRWeJq83vASNFZ4mrze8";
    let mut targets: Vec<String> = [
        // Valid names of absent things.
        format!("/objects/{}/{}.filez", &ABSENT[..2], &ABSENT[2..]),
        format!("/objects/{}/{}.commit", &ABSENT[..2], &ABSENT[2..]),
        format!("/objects/{}/{}.dirtree", &ABSENT[..2], &ABSENT[2..]),
        format!("/objects/{}/{}.dirmeta", &ABSENT[..2], &ABSENT[2..]),
        "/refs/heads/no/such/ref".into(),
        "/refs/mirrors/org.example.Os/no/such/ref".into(),
        format!("/deltas/{}/{}/superblock", &m64[..2], &m64[2..]),
        format!("/deltas/{}/{}/0", &m64[..2], &m64[2..]),
        format!("/delta-indexes/{}/{}.index", &m64[..2], &m64[2..]),
        // Names that are not ostree's.
        format!("/objects/{}/{}.COMMIT", &c[..2], &c[2..]),
        format!(
            "/objects/{}/{}.commit",
            &c[..2].to_uppercase(),
            &c[2..].to_uppercase()
        ),
        format!("/objects/{}/{}.txt", &c[..2], &c[2..]),
        format!("/objects/{}/{}.commit", &c[..2], &c[2..40]),
        format!("/objects/{}/{}x.commit", &c[..2], &c[2..63]),
        format!("/objects/{}{}.commit", &c[..2], &c[2..]),
        format!("/objects/{}/{}.commit/", &c[..2], &c[2..]),
        format!("/objects//{}/{}.commit", &c[..2], &c[2..]),
        format!("/objects/{}/../{}/{}.commit", &c[..2], &c[..2], &c[2..]),
        format!("/objects/%{}/{}.commit", &c[..2], &c[2..]),
        format!("/deltas/{}/{}/01", &m64[..2], &m64[2..]),
        format!("/refs/heads/{REF}/"),
        format!("/refs/heads/{REF}/../stable"),
    ]
    .into();
    targets.extend(
        [
            "/",
            "/index.html",
            "/objects",
            "/objects/",
            "/objects/01/",
            "/refs",
            "/refs/",
            "/refs/heads",
            "/refs/heads/",
            "/deltas/",
            "/config.bak",
            "/summary/",
            "/state",
            "/.lock",
            "//config",
            "/./config",
            "/../../etc/passwd",
            "/refs/heads/../../config",
            "/%2e%2e/%2e%2e/etc/passwd",
            "/objects/..%2f..%2fetc%2fpasswd",
            "//etc/passwd",
            "/refs/heads/%2e%2e%2f%2e%2e%2fconfig",
            "/objects/../config",
            "/.%2e/.%2e/etc/passwd",
            "/refs/heads/..%5c..%5cconfig",
            "/refs/heads/..;/..;/config",
            "/config%00",
            "/%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd",
            "/delta-indexes/../../etc/passwd",
            "/proc/self/environ",
            "/conf%69g",
            "/summary%2Esig",
        ]
        .map(String::from),
    );
    for t in &targets {
        for method in ["GET", "HEAD"] {
            let r = server.send(method, t, &[]).await;
            assert_eq!(r.status, 404, "{method} {t}");
            assert!(r.body.is_empty(), "{method} {t}: {:?}", r.body);
            assert_eq!(r.header("content-length"), Some("0"), "{method} {t}");
            // A shared cache must not keep a 404: what is missing now may
            // be published (or reach this replica) a moment later.
            assert_eq!(r.header("cache-control"), Some("no-store"), "{method} {t}");
        }
    }
    // Neither are probes and metrics kept.
    for t in ["/healthz", "/readyz", "/metrics"] {
        let r = server.get(t).await;
        assert_eq!(r.status, 200, "{t}");
        assert_eq!(r.header("cache-control"), Some("no-store"), "{t}");
    }
    // Conditionals on a missing path change nothing.
    let r = server
        .get_with("/refs/heads/no/such", &[("If-None-Match", "*")])
        .await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn only_get_and_head_are_allowed_on_repo_paths() {
    let (fx, server) = serving_v1().await;
    let big = fx.v1.object("filez");
    let ref_path = format!("/refs/heads/{REF}");
    for path in ["/summary", "/config", ref_path.as_str(), big.as_str()] {
        for m in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            let r = server.send(m, path, &[]).await;
            assert_eq!(r.status, 405, "{m} {path}");
            assert_eq!(r.header("allow"), Some("GET, HEAD"), "{m} {path}");
            assert!(r.body.is_empty(), "{m} {path}: empty body");
        }
    }
    // The path is judged first: a method on a non-path is a 404.
    let r = server.send("POST", "/no/such/thing", &[]).await;
    assert_eq!((r.status, r.body.len()), (StatusCode::NOT_FOUND, 0));
    // Nothing was written: the summary still names v1.
    let s = oscontent_format::parse_summary(&server.get("/summary").await.body).unwrap();
    assert_eq!(s.refs[0].commit.to_hex(), fx.v1.commit);
}

#[tokio::test]
async fn an_http11_request_needs_exactly_one_host() {
    use http::Version;
    let (_fx, server) = serving_v1().await;
    let one = [("host", "a")];
    let two = [("host", "a"), ("host", "b")];
    // (version, headers, status): RFC 9112 §3.2 for HTTP/1.1; HTTP/1.0 may
    // leave it out; HTTP/2 carries :authority instead.
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let cases: [(Version, Headers, u16); 6] = [
        (Version::HTTP_11, &one, 200),
        (Version::HTTP_11, &[], 400),
        (Version::HTTP_11, &two, 400),
        (Version::HTTP_10, &[], 200),
        (Version::HTTP_10, &two, 400),
        (Version::HTTP_2, &[], 200),
    ];
    for (version, headers, want) in cases {
        for path in ["/config", "/healthz"] {
            let r = server.send_as(version, "GET", path, headers).await;
            assert_eq!(r.status.as_u16(), want, "{version:?} {headers:?} {path}");
            if want == 400 {
                assert!(r.body.is_empty(), "{path}: {:?}", r.body);
            }
        }
    }
}

#[tokio::test]
async fn an_expectation_other_than_100_continue_is_417() {
    let (_fx, server) = serving_v1().await;
    // (Expect values, status): RFC 9110 §10.1.1.
    let cases: [(&[&str], u16); 6] = [
        (&[], 200),
        (&["100-continue"], 200),
        (&["100-Continue"], 200),
        (&["999-bogus"], 417),
        (&["100-continue, 999-bogus"], 417),
        (&["100-continue", "x"], 417),
    ];
    for (values, want) in cases {
        let mut headers = vec![("host", "a")];
        headers.extend(values.iter().map(|v| ("expect", *v)));
        for path in ["/config", "/healthz"] {
            let r = server.send("GET", path, &headers).await;
            assert_eq!(r.status.as_u16(), want, "{values:?} {path}");
        }
    }
}

/// What a request finds without waiting, once the first request of a
/// path has brought it into the kernel's caches: the same as the
/// resolver's blocking answer, opened once; and a generated summary
/// older than its recheck interval is kept on a glance at its sources'
/// files, or left to the blocking pool once one of them changed, which
/// answers the same bytes, with the refs as published.
#[tokio::test]
async fn a_cached_path_is_found_without_waiting_and_as_the_resolver_finds_it() {
    use oscontent_format::RepoPath;
    use oscontent_server::served::{Located, Resolved};
    use std::io::Read;
    // On disk: on a tmpfs the overlay misses below always take the pool.
    let fx = Fixture::on_disk();
    let server = Server::new();
    server.publish(fx.publish(&fx.v1)).await;
    let v1 = &fx.v1;
    let c = &v1.commit;
    let deltas = v1.files("deltas");
    let superblock = deltas.iter().find(|f| f.ends_with("/superblock")).unwrap();
    let part = deltas.iter().find(|f| f.ends_with("/0")).unwrap();
    let index = &v1.files("delta-indexes")[0];
    // (path, 200 from the source's file, 200 generated, or 404)
    let cases: Vec<(String, &str)> = vec![
        ("config".into(), "file"),
        (format!("refs/heads/{REF}"), "overlay"),
        (
            format!("objects/{}/{}.commitmeta", &c[..2], &c[2..]),
            "file",
        ),
        (superblock.clone(), "file"),
        (part.clone(), "file"),
        (index.clone(), "file"),
        ("summary".into(), "generated"),
        ("summary.sig".into(), "missing"),
        ("refs/heads/no/such/ref".into(), "missing"),
        (
            format!("objects/{}/{}.commitmeta", &ABSENT[..2], &ABSENT[2..]),
            "missing",
        ),
    ];
    let g = server.current();
    for (path, want) in &cases {
        let status = if *want == "missing" { 404 } else { 200 };
        let served = server.get(&format!("/{path}")).await;
        assert_eq!(served.status, status, "{path}");
        let rp = RepoPath::parse(path).unwrap();
        let located = g.locate(&rp, true).unwrap();
        match (located, *want) {
            (Located::File { mut file, rel, .. }, "file" | "overlay") => {
                assert_eq!(&rel, path);
                let mut bytes = Vec::new();
                file.read_to_end(&mut bytes).unwrap();
                if *want == "file" {
                    assert!(bytes == v1.disk(path), "{path}: the source's bytes");
                }
                assert!(bytes == served.body, "{path}: what was served");
            }
            (Located::Generated(gen), "generated") => {
                assert!(gen.bytes[..] == served.body[..], "{path}");
            }
            (Located::Missing, "missing") => {}
            (other, want) => panic!("{path}: {other:?}, expected {want}"),
        }
        let resolved = g.resolve(&rp).unwrap();
        let agree = matches!(
            (&resolved, *want),
            (Resolved::File { .. }, "file" | "overlay")
                | (Resolved::Generated(_), "generated")
                | (Resolved::Missing, "missing")
        );
        assert!(agree, "{path}: the resolver says {resolved:?}");
    }
    // Past the recheck interval (a second) the generated summary's inputs
    // are looked at again: by identity, without waiting, while the
    // source's files are as they were; once one changed, from the pool.
    // The refs are not among them: they were listed once, as a published
    // overlay is never written. A ref planted there now (nothing of ours
    // ever does) stays out of the summary; listing the refs again at each
    // recheck was most of its cost.
    let summary = RepoPath::parse("summary").unwrap();
    let published = server.get("/summary").await.body;
    std::fs::write(
        server.overlay().join("refs/heads/planted"),
        format!("{c}\n"),
    )
    .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    match g.locate(&summary, true).unwrap() {
        Located::Generated(gen) => assert!(gen.bytes[..] == published[..], "kept on a glance"),
        other => panic!("a summary whose sources did not change: {other:?}"),
    }
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    touch_config(&v1.dir);
    assert!(
        matches!(g.locate(&summary, true).unwrap(), Located::WouldBlock),
        "a stale summary whose source changed found without waiting"
    );
    let before = server.get("/summary").await.body;
    assert!(before == published, "the summary changed with the overlay");
    match g.locate(&summary, true).unwrap() {
        Located::Generated(gen) => assert!(gen.bytes[..] == before[..]),
        other => panic!("the summary the request just checked: {other:?}"),
    }
}

/// The source's config rewritten (a comment added): the same settings, a
/// new identity.
fn touch_config(repo: &std::path::Path) {
    let mut config = std::fs::read(repo.join("config")).unwrap();
    config.extend_from_slice(b"# touched\n");
    std::fs::write(repo.join("config"), config).unwrap();
}

/// A generated summary is looked at again, past its recheck interval, only
/// where its inputs can change: a `--repo` someone else owns, where a
/// changed source file sends the request to the pool. An image's staged
/// repo is never written once published, so its summary is answered
/// without waiting for the generation's life, the same bytes.
#[tokio::test]
async fn a_generated_summary_is_rechecked_only_where_its_sources_can_change() {
    use oscontent_format::RepoPath;
    use oscontent_server::served::Located;
    let fx = Fixture::on_disk();
    // (published as, its generation, rechecked)
    let cases = [
        ("a --repo", fx.publish(&fx.v1), true),
        ("an image", fx.publish_release(&fx.v1), false),
    ];
    let mut served = Vec::new();
    for (name, generation, rechecked) in cases {
        let server = Server::new();
        server.publish(generation).await;
        let body = server.get("/summary").await.body;
        served.push((name, server, body, rechecked));
    }
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    // Both publications' source (the image's as if it were written).
    touch_config(&fx.v1.dir);
    let summary = RepoPath::parse("summary").unwrap();
    for (name, server, body, rechecked) in &served {
        match (server.current().locate(&summary, true).unwrap(), rechecked) {
            (Located::WouldBlock, true) => {}
            (Located::Generated(g), false) => assert!(g.bytes[..] == body[..], "{name}"),
            (other, _) => panic!("{name}: {other:?}, rechecked: {rechecked}"),
        }
        assert!(server.get("/summary").await.body == *body, "{name}");
    }
}

/// A new generation starts with the summary its publication generated:
/// its first summary request is answered without the blocking pool (which
/// the first nodes of a wave each took, building it again), with the
/// bytes the server then serves.
#[tokio::test]
async fn a_new_generation_answers_the_summary_its_publication_made_without_waiting() {
    use oscontent_format::RepoPath;
    use oscontent_server::served::Located;
    let fx = Fixture::on_disk();
    let summary = RepoPath::parse("summary").unwrap();
    let cases = [
        ("a --repo", fx.publish(&fx.v1)),
        ("an image", fx.publish_release(&fx.v1)),
    ];
    for (name, generation) in cases {
        // Whether a source or the overlay has a summary of its own is
        // looked up first: known to the kernel once asked (warming asks).
        for dir in [&fx.v1.dir, &generation.overlay] {
            assert!(!dir.join("summary").exists(), "{name}");
        }
        let Located::Generated(first) = generation.locate(&summary, true).unwrap() else {
            panic!("{name}: the summary publication made is not there without waiting");
        };
        let server = Server::new();
        server.publish(generation).await;
        assert!(
            server.get("/summary").await.body == first.bytes[..],
            "{name}"
        );
    }
}

/// Every answer is counted and logged once, with what its body sent:
/// a repo path's (its answer keeps its own record) and a route's (the
/// router's middleware keeps it) alike.
#[tokio::test]
async fn every_answer_is_recorded_once() {
    let (fx, server) = serving_v1().await;
    let v1 = &fx.v1;
    let c = &v1.commit;
    let deltas = v1.files("deltas");
    let part = format!("/{}", deltas.iter().find(|f| f.ends_with("/0")).unwrap());
    let commit = v1.object("commit");
    let etag = server.get(&commit).await.header("etag").unwrap().to_owned();
    type Case<'a> = (&'a str, String, Vec<(&'a str, &'a str)>, &'a str);
    // (method, path, headers, metrics kind)
    let cases: Vec<Case> = vec![
        ("GET", "/config".into(), vec![], "config"),
        ("GET", "/summary".into(), vec![], "summary"),
        ("GET", format!("/refs/heads/{REF}"), vec![], "ref"),
        ("GET", commit.clone(), vec![], "commit"),
        ("HEAD", commit.clone(), vec![], "commit"),
        (
            "GET",
            commit.clone(),
            vec![("if-none-match", &etag)],
            "commit",
        ),
        (
            "GET",
            v1.object("filez"),
            vec![("range", "bytes=2-9")],
            "filez",
        ),
        (
            "GET",
            v1.object("dirtree"),
            vec![("range", "bytes=999999-")],
            "dirtree",
        ),
        ("GET", part.clone(), vec![], "delta"),
        (
            "GET",
            format!("/objects/{}/{}.commitmeta", &c[..2], &c[2..]),
            vec![],
            "commitmeta",
        ),
        ("GET", "/objects/zz/not-an-object".into(), vec![], "other"),
        ("GET", "/healthz/".into(), vec![], "other"),
        ("POST", "/config".into(), vec![], "config"),
        ("GET", "/config".into(), vec![("expect", "magic")], "config"),
        (
            "GET",
            "/config".into(),
            vec![("host", "a.test"), ("host", "b.test")],
            "config",
        ),
        ("GET", "/healthz".into(), vec![], "health"),
        ("POST", "/readyz".into(), vec![], "health"),
    ];
    let mut sent = Vec::new();
    for (method, path, headers, _) in &cases {
        let r = server.send(method, path, headers).await;
        sent.push((r.status.as_u16(), r.body.len() as u64));
    }
    let log = server.access_log();
    assert_eq!(log.len(), cases.len() + 1, "the etag's GET, then one each");
    for (((method, path, headers, kind), (status, bytes)), line) in
        cases.iter().zip(sent).zip(&log[1..])
    {
        let what = format!("{method} {path} {headers:?}: {line}");
        assert_eq!(line["method"], *method, "{what}");
        assert_eq!(line["path"], path.as_str(), "{what}");
        assert_eq!(line["kind"], *kind, "{what}");
        assert_eq!(line["status"], status, "{what}");
        assert_eq!(line["bytes"], bytes, "{what}");
    }
}
