//! Requests answered past the router (`http::direct`) against the same
//! requests through it: the same answer and the same record.

use oscontent_testkit::fixtures::DEFAULT_REF;
use oscontent_testkit::*;

/// A plain HTTP/1.1 request for a repo path is answered past the router's
/// types (`http::direct`); one with a header that path does not know goes
/// through the router. Both must answer alike, first request (from the
/// file) and later ones (a small object from the cache), and for paths
/// that are not there (an empty 404 that no cache keeps): the same status,
/// headers but the date, body, and access log record.
#[test]
fn a_repo_path_answers_alike_past_the_router_and_through_it() {
    let v1 = v1();
    let server = Server::release(v1);
    let objects = list_objects(&v1.repo).unwrap();
    let (big, _) = largest_filez(&v1.repo).unwrap();
    let mut cases = vec![(big, "filez"), (v1.commit.clone(), "commit")];
    for (set, ext) in [
        ("dirtree", "dirtree"),
        ("dirmeta", "dirmeta"),
        (CONTENT, "filez"),
    ] {
        cases.push((objects.get(set).into_iter().next().unwrap(), ext));
    }
    let mut paths: Vec<(String, Option<Vec<u8>>, &str, u16)> = cases
        .iter()
        .map(|(checksum, ext)| {
            let disk = std::fs::read(object_path(&v1.repo, checksum, ext)).unwrap();
            (object_url_path(checksum, ext), Some(disk), *ext, 200)
        })
        .collect();
    paths.push(("/summary".into(), None, "summary", 200));
    paths.push(("/config".into(), None, "config", 200));
    paths.push((format!("/refs/heads/{DEFAULT_REF}"), None, "ref", 200));
    // Not there: a commit's detached metadata (every pull asks), an object
    // of a fan-out directory that exists and of one that may not, a ref.
    let absent = format!("{}{}", &v1.commit[..2], "0".repeat(62));
    for (path, kind) in [
        (object_url_path(&absent, "commitmeta"), "commitmeta"),
        (object_url_path(&absent, "dirtree"), "dirtree"),
        (object_url_path(&"f".repeat(64), "filez"), "filez"),
        ("/refs/heads/not/served".into(), "ref"),
    ] {
        paths.push((path, Some(Vec::new()), kind, 404));
    }
    let mut lengths = Vec::new();
    for (path, want, _, status) in &paths {
        let mut got = Vec::new();
        for method in ["GET", "HEAD", "GET", "GET"] {
            let r = answered_alike(server.addr, method, path).unwrap();
            assert_eq!(r.status, *status, "{method} {path}");
            if *status == 404 {
                let cache = r
                    .headers
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case("cache-control"));
                assert_eq!(cache.map(|c| c.1.as_str()), Some("no-store"), "{path}");
            }
            if let (Some(want), "GET") = (want, method) {
                assert!(r.body == *want, "{method} {path}: the bytes on disk");
            }
            if method == "HEAD" {
                assert!(r.body.is_empty(), "HEAD {path} sent a body");
            } else {
                got = r.body;
            }
        }
        lengths.push(got.len() as u64);
    }
    // Lines of two workers may interleave: every record of one method and
    // path must be the same, whichever way it was answered.
    let log = server.access_log().unwrap();
    let repo: Vec<_> = log
        .iter()
        .filter(|e| e.kind != "health" && e.kind != "metrics")
        .collect();
    for ((path, _, kind, status), len) in paths.iter().zip(lengths) {
        for (method, n) in [("GET", 6), ("HEAD", 2)] {
            let records: Vec<_> = repo
                .iter()
                .filter(|e| e.path == *path && e.method == method)
                .map(|e| {
                    (
                        e.client.clone(),
                        e.status,
                        e.bytes,
                        e.kind.clone(),
                        e.version.clone(),
                    )
                })
                .collect();
            assert_eq!(records.len(), n, "{method} {path}");
            let bytes = if method == "HEAD" { 0 } else { len };
            let client = Some("127.0.0.1".to_owned());
            let one = (
                client,
                *status,
                bytes,
                kind.to_string(),
                "HTTP/1.1".to_owned(),
            );
            assert!(
                records.iter().all(|r| *r == one),
                "{method} {path}: {records:?}"
            );
        }
    }
    let summary = server.summary_bytes().unwrap();
    let r = answered_alike(server.addr, "GET", "/summary").unwrap();
    assert!(r.body == summary, "/summary: what the server publishes");
}
