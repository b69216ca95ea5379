//! Caching and conditionals of what can change under its name (summary,
//! refs, config): short-lived caching, stable validators, conditional GETs
//! and HEAD, and a later date from another replica.

use oscontent_testkit::*;
use std::time::{Duration, SystemTime};

fn max_age(cache_control: &str) -> Option<u64> {
    cache_control
        .split(',')
        .map(str::trim)
        .find_map(|d| d.strip_prefix("max-age="))
        .and_then(|v| v.parse().ok())
}

fn assert_short_lived(r: &HttpResponse, what: &str) {
    let cc = r
        .header("cache-control")
        .unwrap_or_else(|| panic!("{what}: no Cache-Control"));
    assert!(
        !cc.contains("immutable"),
        "{what}: mutable metadata must not be immutable: {cc}"
    );
    let age = max_age(cc).unwrap_or_else(|| panic!("{what}: Cache-Control without max-age: {cc}"));
    assert!(age <= 3600, "{what}: a short max-age, got {cc}");
    let etag = r
        .header("etag")
        .unwrap_or_else(|| panic!("{what}: no ETag"));
    assert!(
        etag.starts_with('"') && etag.ends_with('"') && etag.len() > 2,
        "{what}: strong ETag, got {etag}"
    );
    let lm = r
        .header("last-modified")
        .unwrap_or_else(|| panic!("{what}: no Last-Modified"));
    httpdate::parse_http_date(lm).unwrap_or_else(|e| panic!("{what}: Last-Modified {lm:?}: {e}"));
}

fn date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

#[test]
fn summary_refs_and_config_answer_conditionals() {
    let v1 = v1();
    let server = Server::release(v1);
    let ref_path = format!("/refs/heads/{}", fixture_ref());
    for path in ["/summary", ref_path.as_str(), "/config"] {
        answers_conditionals(&server, path);
    }
    // Byte ranges work on generated metadata too.
    let summary = server.get("/summary").unwrap();
    let part = server
        .get_with("/summary", &[("Range", "bytes=0-9")])
        .unwrap();
    assert_eq!(part.status, 206);
    assert_eq!(part.body, summary.body[..10]);
    // Conditionals on a missing path change nothing: still 404.
    let missing = server
        .get_with("/refs/heads/no/such", &[("If-None-Match", "*")])
        .unwrap();
    assert_eq!(missing.status, 404);
    // No signature is published: 404 with an empty body.
    let sig = server.get("/summary.sig").unwrap();
    assert_eq!(sig.status, 404);
    assert!(sig.body.is_empty());
}

/// One metadata path: short-lived caching, stable validators, conditional
/// GETs (RFC 9110 section 13) and HEAD.
fn answers_conditionals(server: &Server, path: &str) {
    let full = server.get(path).unwrap();
    assert_eq!(full.status, 200, "{path}");
    assert!(!full.body.is_empty(), "{path}");
    assert_short_lived(&full, path);
    assert_eq!(
        full.header("content-length"),
        Some(full.body.len().to_string().as_str()),
        "{path}"
    );
    let etag = full.header("etag").unwrap().to_owned();
    let lm_str = full.header("last-modified").unwrap().to_owned();
    let lm = httpdate::parse_http_date(&lm_str).unwrap();

    // Stable validators.
    let again = server.get(path).unwrap();
    assert_eq!(
        again.header("etag"),
        Some(etag.as_str()),
        "{path}: ETag is stable"
    );
    assert_eq!(
        again.header("last-modified"),
        Some(lm_str.as_str()),
        "{path}: Last-Modified is stable"
    );
    assert_eq!(again.body, full.body);
    conditional_gets(server, path, &full, &etag, &lm_str, lm);
    head_is_a_get_without_body(server, path, &full, &etag);
}

/// If-None-Match and If-Modified-Since, alone and together, against the
/// validators of `full`.
fn conditional_gets(
    server: &Server,
    path: &str,
    full: &HttpResponse,
    etag: &str,
    lm_str: &str,
    lm: SystemTime,
) {
    let (etag, lm_str) = (etag.to_owned(), lm_str.to_owned());
    let not_modified = |headers: &[(&str, &str)], why: &str| {
        let r = server.get_with(path, headers).unwrap();
        assert_eq!(r.status, 304, "{path}: {why}: {headers:?}");
        assert!(r.body.is_empty(), "{path}: 304 has no body");
        assert_eq!(
            r.header("etag"),
            Some(etag.as_str()),
            "{path}: 304 repeats the ETag"
        );
        assert!(
            r.header("cache-control").is_some(),
            "{path}: 304 repeats Cache-Control"
        );
    };
    let modified = |headers: &[(&str, &str)], why: &str| {
        let r = server.get_with(path, headers).unwrap();
        assert_eq!(r.status, 200, "{path}: {why}: {headers:?}");
        assert_eq!(r.body, full.body, "{path}: {why}");
    };
    let weak = format!("W/{etag}");
    let list = format!("\"nope\", {etag}");
    let past = date(lm - Duration::from_secs(86_400));
    let now = date(SystemTime::now() + Duration::from_secs(1));
    let future = date(SystemTime::now() + Duration::from_secs(10 * 86_400));

    not_modified(&[("If-None-Match", &etag)], "matching If-None-Match");
    not_modified(
        &[("If-None-Match", &weak)],
        "If-None-Match uses weak comparison",
    );
    not_modified(&[("If-None-Match", &list)], "a list containing the ETag");
    not_modified(&[("If-None-Match", "*")], "If-None-Match: *");
    not_modified(
        &[("If-Modified-Since", &lm_str)],
        "If-Modified-Since = Last-Modified",
    );
    // Only its own date: the date of what can change under its name is a
    // replica's, and a later one may stand on other bytes.
    modified(
        &[("If-Modified-Since", &now)],
        "If-Modified-Since after Last-Modified",
    );
    modified(
        &[("If-Modified-Since", &past)],
        "If-Modified-Since before Last-Modified",
    );
    modified(&[("If-None-Match", "\"nope\"")], "a different ETag");
    // If-None-Match takes precedence over If-Modified-Since (RFC 9110 13.2.2).
    modified(
        &[
            ("If-None-Match", "\"nope\""),
            ("If-Modified-Since", &future),
        ],
        "mismatching INM wins over IMS",
    );
    not_modified(
        &[("If-None-Match", &etag), ("If-Modified-Since", &past)],
        "matching INM wins over an old IMS",
    );
    // Invalid dates are ignored.
    modified(&[("If-Modified-Since", "yesterday")], "an invalid date");
}

/// HEAD: the headers of a GET, no body (checked on the wire).
fn head_is_a_get_without_body(server: &Server, path: &str, full: &HttpResponse, etag: &str) {
    let etag = etag.to_owned();
    let head = server.raw("HEAD", path, &[]).unwrap();
    assert_eq!(head.status, 200, "HEAD {path}");
    assert_eq!(
        head.header("content-length"),
        Some(full.body.len().to_string().as_str()),
        "HEAD {path}"
    );
    assert_eq!(head.header("etag"), Some(etag.as_str()), "HEAD {path}");
    assert!(
        head.body.is_empty(),
        "HEAD {path} sent {} body bytes",
        head.body.len()
    );
    let head304 = server
        .raw("HEAD", path, &[("If-None-Match", &etag)])
        .unwrap();
    assert_eq!(head304.status, 304, "conditional HEAD {path}");
    assert!(head304.body.is_empty());
}

/// Two replicas, the one with the older release started later: the date
/// a client got from it is later than the newer replica's Last-Modified,
/// and revalidating with that date alone (`curl -z`) must still get the
/// newer replica's bytes, not a 304 that keeps the old ones.
#[test]
fn a_later_date_from_another_replica_is_not_a_304() {
    let ref_path = format!("/refs/heads/{}", fixture_ref());
    let newer = Server::release(v2());
    let first: Vec<_> = ["/summary", ref_path.as_str()]
        .iter()
        .map(|p| newer.get(p).unwrap())
        .collect();
    // HTTP dates have one-second resolution.
    std::thread::sleep(Duration::from_millis(1100));
    let older = Server::release(v1());
    for (path, new) in ["/summary", ref_path.as_str()].iter().zip(&first) {
        let old = older.get(path).unwrap();
        assert_ne!(old.body, new.body, "{path}: the releases differ");
        let old_lm = old.header("last-modified").unwrap().to_owned();
        let new_lm = httpdate::parse_http_date(new.header("last-modified").unwrap()).unwrap();
        assert!(
            httpdate::parse_http_date(&old_lm).unwrap() > new_lm,
            "{path}: the older release's replica started later"
        );
        let r = newer
            .get_with(path, &[("If-Modified-Since", &old_lm)])
            .unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.body, new.body, "{path}");
    }
}
