//! The HTTP surface with plain clients: objects and ranges,
//! error bodies, methods, HTTP/2 and the operational endpoints.

use oscontent_testkit::*;
use reqwest::Method;
use std::time::Duration;

const IMMUTABLE: &str = "public, max-age=31536000, immutable";

/// With the object cache and without: on an HTTP/1.1 connection an object
/// the cache does not hold goes out by sendfile, and must answer the same.
#[test]
fn objects_are_immutable_with_strong_etags_and_ranges() {
    for cache in ["128M", "0"] {
        let v1 = v1();
        let server = Server::oscontainer(&v1.oscontainer)
            .arg(format!("--cache-size={cache}"))
            .start()
            .unwrap();
        objects_serve_as_on_disk(&server, v1);
    }
}

fn objects_serve_as_on_disk(server: &Server, v1: &Release) {
    let objects = list_objects(&v1.repo).unwrap();
    let (big, big_len) = largest_filez(&v1.repo).unwrap();
    assert!(
        big_len > 100_000,
        "the fixture has a large file ({big_len} bytes)"
    );
    let mut cases = vec![(v1.commit.clone(), "commit"), (big.clone(), "filez")];
    cases.push((
        objects.get("dirtree").into_iter().next().unwrap(),
        "dirtree",
    ));
    cases.push((
        objects.get("dirmeta").into_iter().next().unwrap(),
        "dirmeta",
    ));
    cases.push((objects.get(CONTENT).into_iter().next().unwrap(), "filez"));

    for (checksum, ext) in &cases {
        object_is_immutable(server, &v1.repo, checksum, ext);
    }
    // What was sent is what the access log counts, whichever way it went.
    let path = object_url_path(&big, "filez");
    let sent: Vec<u64> = server
        .access_log()
        .unwrap()
        .iter()
        .filter(|e| e.path == path && e.method == "GET" && e.status == 200)
        .map(|e| e.bytes)
        .collect();
    assert!(!sent.is_empty(), "no 200 for {path} in the access log");
    assert!(
        sent.iter().all(|b| *b == big_len),
        "{path}: bytes logged {sent:?}, the object is {big_len}"
    );
}

/// One object: served as on disk, immutable, with a strong ETag, byte
/// ranges, If-Range, 416 past the end, and HEAD.
fn object_is_immutable(server: &Server, repo: &std::path::Path, checksum: &str, ext: &str) {
    let path = object_url_path(checksum, ext);
    let disk = std::fs::read(object_path(repo, checksum, ext)).unwrap();
    let len = disk.len();
    let r = server.get(&path).unwrap();
    assert_eq!(r.status, 200, "{path}");
    assert!(r.body == disk, "{path}: body is the object file");
    assert_eq!(r.header("cache-control"), Some(IMMUTABLE), "{path}");
    assert_eq!(
        r.header("content-length"),
        Some(len.to_string().as_str()),
        "{path}"
    );
    assert_eq!(r.header("accept-ranges"), Some("bytes"), "{path}");
    let etag = r
        .header("etag")
        .unwrap_or_else(|| panic!("{path}: no ETag"))
        .to_owned();
    assert!(
        etag.starts_with('"') && !etag.starts_with("W/"),
        "{path}: strong ETag, got {etag}"
    );

    let c = server.get_with(&path, &[("If-None-Match", &etag)]).unwrap();
    assert_eq!(c.status, 304, "{path}: If-None-Match");
    assert!(c.body.is_empty());

    let range = |spec: &str, want_start: usize, want_end: usize| {
        let r = server.get_with(&path, &[("Range", spec)]).unwrap();
        assert_eq!(r.status, 206, "{path}: Range {spec}");
        assert_eq!(
            r.header("content-range"),
            Some(format!("bytes {want_start}-{want_end}/{len}").as_str()),
            "{path}: Range {spec}"
        );
        assert_eq!(
            r.header("content-length"),
            Some((want_end - want_start + 1).to_string().as_str())
        );
        assert!(
            r.body == disk[want_start..=want_end],
            "{path}: Range {spec} returns those bytes"
        );
    };
    if len > 100 {
        range("bytes=10-99", 10, 99);
    }
    range("bytes=0-0", 0, 0);
    range("bytes=-16", len.saturating_sub(16), len - 1);
    range(&format!("bytes={}-", len / 2), len / 2, len - 1);
    range("bytes=0-", 0, len - 1);
    range(&format!("bytes=1-{}", len * 10), 1.min(len - 1), len - 1);

    // If-Range: a matching ETag honours the range, another gives all.
    let ir = server
        .get_with(&path, &[("Range", "bytes=0-0"), ("If-Range", &etag)])
        .unwrap();
    assert_eq!(ir.status, 206, "{path}: If-Range with the ETag");
    let ir = server
        .get_with(&path, &[("Range", "bytes=0-0"), ("If-Range", "\"other\"")])
        .unwrap();
    assert_eq!(ir.status, 200, "{path}: If-Range with another ETag");
    assert!(ir.body == disk);

    let bad = server
        .get_with(&path, &[("Range", &format!("bytes={len}-"))])
        .unwrap();
    assert_eq!(bad.status, 416, "{path}: unsatisfiable range");
    assert_eq!(
        bad.header("content-range"),
        Some(format!("bytes */{len}").as_str())
    );

    let head = server.raw("HEAD", &path, &[]).unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-length"),
        Some(len.to_string().as_str()),
        "HEAD {path}"
    );
    assert_eq!(head.header("cache-control"), Some(IMMUTABLE));
    assert!(head.body.is_empty(), "HEAD {path} sent a body");
}

#[test]
fn errors_are_empty_404s_and_only_get_and_head_are_allowed() {
    let v1 = v1();
    let server = Server::release(v1);
    let absent = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let absent_m64 = "ASNFZ4mrze8BI0VniavN7wEjRWeJq83vASNFZ4mrze8";
    let missing_repo_paths = [
        object_url_path(absent, "filez"),
        object_url_path(absent, "commit"),
        object_url_path(absent, "dirtree"),
        object_url_path(absent, "dirmeta"),
        object_url_path(&v1.commit, "commitmeta"),
        "/refs/heads/no/such/ref".to_owned(),
        "/refs/mirrors/org.example.Os/no/such/ref".to_owned(),
        "/summary.sig".to_owned(),
        format!(
            "/deltas/{}/{}/superblock",
            &absent_m64[..2],
            &absent_m64[2..]
        ),
        format!("/deltas/{}/{}/0", &absent_m64[..2], &absent_m64[2..]),
        format!(
            "/delta-indexes/{}/{}.index",
            &absent_m64[..2],
            &absent_m64[2..]
        ),
    ];
    let unknown = [
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
        "/srv/repo/config",
        "/repo/config",
        "/config.bak",
        "/summary/",
        "/state",
        "/tmp",
        "/.lock",
    ];
    for p in missing_repo_paths.iter().map(String::as_str).chain(unknown) {
        for client in [http1(), http2()] {
            let r = fetch(&client, &server.url_for(p), &[]).unwrap();
            assert_eq!(r.status, 404, "GET {p} ({:?})", r.version);
            assert!(
                r.body.is_empty(),
                "GET {p}: error bodies are empty, got {:?}",
                String::from_utf8_lossy(&r.body)
            );
        }
    }
    // Directory listings never happen, even for real directories.
    for p in ["/objects/", "/refs/heads/", "/"] {
        let r = server.raw("GET", p, &[]).unwrap();
        assert_eq!(r.status, 404, "{p}");
        assert!(r.body.is_empty());
    }

    let big = object_url_path(&largest_filez(&v1.repo).unwrap().0, "filez");
    let ref_path = format!("/refs/heads/{}", fixture_ref());
    for path in ["/summary", "/config", ref_path.as_str(), big.as_str()] {
        for m in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
            let method = Method::from_bytes(m.as_bytes()).unwrap();
            let r = request(&http1(), method, &server.url_for(path), &[]).unwrap();
            assert_eq!(r.status, 405, "{m} {path}");
            let allow = r
                .header("allow")
                .unwrap_or_else(|| panic!("{m} {path}: 405 without Allow"));
            assert!(
                allow.contains("GET") && allow.contains("HEAD"),
                "{m} {path}: Allow: {allow}"
            );
            assert!(r.body.is_empty(), "{m} {path}: empty body");
        }
    }
    // A POST with a body is refused without writing anything either.
    let r = http1()
        .post(server.url_for("/summary"))
        .body(vec![0u8; 1024])
        .send()
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(server.summary().unwrap().refs[0].commit.to_hex(), v1.commit);
}

/// The serving process opts out of transparent huge pages: with them, a few
/// replays of one pull took its RSS from about 275 to 390-570 MiB, over the
/// deployment's 512 Mi limit (xtask/src/bench/RESULTS.md).
#[test]
fn the_serving_process_uses_no_transparent_huge_pages() {
    let server = Server::release(v1());
    let pid = server.pid().unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let thp = status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .unwrap_or_else(|| panic!("no THP_enabled in /proc/{pid}/status:\n{status}"));
    assert_eq!(thp.trim(), "0", "THP_enabled of the server");
}

#[test]
fn health_ready_and_metrics_endpoints() {
    let server = Server::release(v1());
    let h = server.get("/healthz").unwrap();
    assert_eq!(h.status, 200);
    let r = server.get("/readyz").unwrap();
    assert_eq!(r.status, 200);

    let summary = server.get("/summary").unwrap();
    let absent = object_url_path(
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "filez",
    );
    assert_eq!(server.get(&absent).unwrap().status, 404);
    assert_eq!(server.get("/no/such/thing").unwrap().status, 404);

    let resp = server.get("/metrics").unwrap();
    assert_eq!(resp.status, 200);
    let ctype = resp.header("content-type").unwrap_or_default();
    assert!(
        ctype.starts_with("text/plain") && ctype.contains("version=0.0.4"),
        "content type {ctype}"
    );
    let m = Metrics::parse(&String::from_utf8(resp.body).unwrap()).unwrap();
    metrics_count_requests_by_kind(&m, summary.body.len());
    access_log_has_one_line_per_request(&server, &absent, summary.body.len());
}

/// The counters and the latency histogram after the requests above, with
/// bounded `kind` labels.
fn metrics_count_requests_by_kind(m: &Metrics, summary_len: usize) {
    assert_eq!(m.get("oscontent_ready", &[]), Some(1.0));
    assert_eq!(m.get("oscontent_published_refs", &[]), Some(1.0));
    assert_eq!(
        m.types
            .get("oscontent_http_requests_total")
            .map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        m.types
            .get("oscontent_http_response_bytes_total")
            .map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        m.types
            .get("oscontent_http_request_duration_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    assert!(
        m.get(
            "oscontent_http_requests_total",
            &[("kind", "summary"), ("status", "200")]
        ) >= Some(1.0)
    );
    assert_eq!(
        m.get(
            "oscontent_http_requests_total",
            &[("kind", "filez"), ("status", "404")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m.get(
            "oscontent_http_requests_total",
            &[("kind", "other"), ("status", "404")]
        ),
        Some(1.0)
    );
    assert!(
        m.get(
            "oscontent_http_requests_total",
            &[("kind", "health"), ("status", "200")]
        ) >= Some(2.0)
    );
    assert!(
        m.get(
            "oscontent_http_response_bytes_total",
            &[("kind", "summary")]
        ) >= Some(summary_len as f64),
        "bytes sent for the summary"
    );
    let buckets: Vec<_> = m
        .of("oscontent_http_request_duration_seconds_bucket")
        .filter(|s| s.labels.get("kind").map(String::as_str) == Some("summary"))
        .collect();
    assert!(buckets.len() > 3, "a latency histogram by kind");
    assert!(buckets
        .iter()
        .any(|s| s.labels.get("le").map(String::as_str) == Some("+Inf")));
    for s in m.of("oscontent_http_requests_total") {
        assert!(
            KINDS.contains(&s.labels["kind"].as_str()),
            "bounded kinds: {s:?}"
        );
    }
}

/// The access log has one well-formed line per request.
fn access_log_has_one_line_per_request(server: &Server, absent: &str, summary_len: usize) {
    let log = server.access_log().unwrap();
    assert!(log.iter().any(|e| e.path == "/summary"
        && e.status == 200
        && e.kind == "summary"
        && e.bytes == summary_len as u64
        && e.method == "GET"
        && e.version == "HTTP/1.1"));
    assert!(log
        .iter()
        .any(|e| e.path == absent && e.status == 404 && e.kind == "filez" && e.bytes == 0));
    assert!(log
        .iter()
        .any(|e| e.path == "/no/such/thing" && e.kind == "other"));
    for e in &log {
        assert!(KINDS.contains(&e.kind.as_str()), "{e:?}");
        assert!(e.duration_ms >= 0.0 && !e.ts.is_empty(), "{e:?}");
        assert_eq!(
            e.client.as_deref(),
            Some("127.0.0.1"),
            "each line names the client: {e:?}"
        );
    }
}

#[test]
fn http2_prior_knowledge_serves_the_same_bytes() {
    let v1 = v1();
    let server = Server::release(v1);
    let h2 = http2();
    let s2 = fetch(&h2, &server.url_for("/summary"), &[]).unwrap();
    assert_eq!(
        s2.version,
        reqwest::Version::HTTP_2,
        "h2c with prior knowledge"
    );
    assert_eq!(s2.status, 200);
    let s1 = server.get("/summary").unwrap();
    assert_eq!(s1.version, reqwest::Version::HTTP_11);
    assert_eq!(s2.body, s1.body, "same summary over HTTP/1.1 and HTTP/2");
    let etag = s2.header("etag").unwrap().to_owned();
    let nm = fetch(
        &h2,
        &server.url_for("/summary"),
        &[("If-None-Match", &etag)],
    )
    .unwrap();
    assert_eq!((nm.version, nm.status), (reqwest::Version::HTTP_2, 304));
    let ready = fetch(&h2, &server.url_for("/readyz"), &[]).unwrap();
    assert_eq!(ready.status, 200);
    let head = request(&h2, Method::HEAD, &server.url_for("/summary"), &[]).unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(
        head.header("content-length"),
        Some(s1.body.len().to_string().as_str())
    );
    assert!(head.body.is_empty());

    // Many objects at once over one multiplexed connection.
    let objects: Vec<String> = list_objects(&v1.repo)
        .unwrap()
        .get(CONTENT)
        .into_iter()
        .take(200)
        .collect();
    let (big, _) = largest_filez(&v1.repo).unwrap();
    let mut work: Vec<String> = objects.clone();
    work.push(big);
    let chunks: Vec<Vec<String>> = work
        .chunks(work.len().div_ceil(8))
        .map(<[String]>::to_vec)
        .collect();
    std::thread::scope(|scope| {
        for chunk in &chunks {
            let h2 = h2.clone();
            let server = &server;
            let repo = &v1.repo;
            scope.spawn(move || {
                for c in chunk {
                    let r = fetch(&h2, &server.url_for(&object_url_path(c, "filez")), &[]).unwrap();
                    assert_eq!(r.version, reqwest::Version::HTTP_2);
                    assert_eq!(r.status, 200, "{c}");
                    assert!(
                        r.body == std::fs::read(object_path(repo, c, "filez")).unwrap(),
                        "{c}: bytes over h2"
                    );
                }
            });
        }
    });
    let range = fetch(
        &h2,
        &server.url_for(&object_url_path(&objects[0], "filez")),
        &[("Range", "bytes=0-3")],
    )
    .unwrap();
    assert_eq!(range.status, 206);
    assert_eq!(range.body.len(), 4);

    let log = server.access_log().unwrap();
    let h2_lines = log
        .iter()
        .filter(|e| e.version == "HTTP/2.0" && e.kind == "filez")
        .count();
    assert!(
        h2_lines > work.len(),
        "access log records HTTP/2 requests ({h2_lines})"
    );
}

#[test]
fn h2c_upgrade_request_gets_a_valid_answer() {
    // curl (ostree's fetcher) asks to upgrade plain-http connections to h2c.
    // The server may switch protocols or answer in HTTP/1.1, but must answer.
    let server = Server::release(v1());
    let want = server.summary_bytes().unwrap();
    let r = server
        .raw(
            "GET",
            "/summary",
            &[
                ("Upgrade", "h2c"),
                ("HTTP2-Settings", "AAMAAABkAARAAAAAAAIAAAAA"),
                ("Connection", "Upgrade, HTTP2-Settings"),
            ],
        )
        .unwrap();
    match r.status {
        101 => assert!(
            r.header("upgrade")
                .is_some_and(|u| u.eq_ignore_ascii_case("h2c")),
            "{}",
            r.status_line
        ),
        200 => assert!(
            r.body == want,
            "an HTTP/1.1 answer to an upgrade request carries the summary"
        ),
        s => panic!(
            "unexpected answer to an h2c upgrade request: {s} {}",
            r.status_line
        ),
    }
}

#[test]
fn http10_and_pipelined_requests_are_answered() {
    let server = Server::release(v1());
    let config = server.get("/config").unwrap().body;
    let summary = server.summary_bytes().unwrap();

    // HTTP/1.0: answered, then the connection closes.
    let raw = raw_exchange(
        server.addr,
        format!("GET /config HTTP/1.0\r\nHost: {}\r\n\r\n", server.addr).as_bytes(),
        Duration::from_secs(30),
    )
    .unwrap();
    let r = parse_raw_response(&raw, false).unwrap();
    assert_eq!(r.status, 200, "{}", r.status_line);
    assert_eq!(r.body, config);

    // Three pipelined requests in one write: three responses, in order.
    let host = server.addr;
    let req = format!(
        "GET /config HTTP/1.1\r\nHost: {host}\r\n\r\n\
         GET /objects/00/nope HTTP/1.1\r\nHost: {host}\r\n\r\n\
         GET /summary HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    );
    let raw = raw_exchange(server.addr, req.as_bytes(), Duration::from_secs(30)).unwrap();
    let mut rest: &[u8] = &raw;
    let mut got = Vec::new();
    for _ in 0..3 {
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head")
            + 4;
        let head = parse_raw_response(&rest[..end], true).unwrap();
        let len: usize = head
            .header("content-length")
            .expect("Content-Length")
            .parse()
            .unwrap();
        got.push((head.status, rest[end..end + len].to_vec()));
        rest = &rest[end + len..];
    }
    assert!(rest.is_empty(), "{} trailing bytes", rest.len());
    assert_eq!(got[0], (200, config));
    assert_eq!(got[1], (404, Vec::new()));
    assert_eq!(got[2], (200, summary));
}

/// The HTTP/2 preface is prior knowledge at a connection's start only (RFC
/// 9113 §3.4): after an HTTP/1.1 request it is a bad request, never a
/// switch to HTTP/2 that would answer whatever frames follow.
#[test]
fn the_http2_preface_after_a_request_is_no_switch() {
    let server = Server::release(v1());
    let config = server.get("/config").unwrap().body;
    let settings = [0u8, 0, 0, 4, 0, 0, 0, 0, 0];
    let mut req = format!("GET /config HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr).into_bytes();
    req.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    req.extend_from_slice(&settings);
    // An HTTP/2 connection would stay open, waiting for frames: no EOF.
    let raw = raw_exchange(server.addr, &req, Duration::from_secs(10)).unwrap();
    // Parsed as one response up to EOF: its body is the config, then
    // whatever the preface got.
    let r = parse_raw_response(&raw, false).unwrap();
    assert_eq!(r.status, 200, "{}", r.status_line);
    let rest = r
        .body
        .strip_prefix(&config[..])
        .expect("the config, answered first");
    assert!(
        rest.is_empty() || rest.starts_with(b"HTTP/1.1 400"),
        "after an HTTP/1.1 answer, the preface got {:?}",
        String::from_utf8_lossy(&rest[..rest.len().min(64)])
    );
}

/// Over HTTP/2 (no sendfile) every object is read into memory, but only
/// small ones stay in the object cache: a pull asks for each object once,
/// and keeping the large ones only pushed out the small ones every
/// connection is answered from (`cargo xtask bench serve` at e7e020f).
#[test]
fn the_object_cache_keeps_small_objects_not_large_ones() {
    let v1 = v1();
    let server = Server::release(v1);
    // Sized so that the cache would take either (up to 1 MiB each).
    let sized = |range: std::ops::Range<u64>| {
        filez_sizes(&v1.repo)
            .unwrap()
            .into_iter()
            .find(|(_, len)| range.contains(len))
            .unwrap_or_else(|| panic!("the fixture has no content object of {range:?} bytes"))
    };
    let (big, big_len) = sized(64 << 10..512 << 10);
    let (small, small_len) = sized(1000..8192);
    let usage = || {
        let m = server.get("/metrics").unwrap();
        let m = Metrics::parse(&String::from_utf8(m.body).unwrap()).unwrap();
        let get = |name| m.get(name, &[]).unwrap_or_else(|| panic!("no {name}"));
        (get("oscontent_cache_bytes"), get("oscontent_cache_objects"))
    };
    assert_eq!(usage(), (0.0, 0.0), "nothing cached before a request");

    let h2 = http2();
    let got = fetch(&h2, &server.url_for(&object_url_path(&big, "filez")), &[]).unwrap();
    assert_eq!((got.version, got.status), (reqwest::Version::HTTP_2, 200));
    assert_eq!(got.body.len() as u64, big_len);
    assert_eq!(
        usage(),
        (0.0, 0.0),
        "a large object read over HTTP/2 is not kept"
    );

    for _ in 0..2 {
        let got = fetch(&h2, &server.url_for(&object_url_path(&small, "filez")), &[]).unwrap();
        assert_eq!((got.status, got.body.len() as u64), (200, small_len));
    }
    let (bytes, objects) = usage();
    assert_eq!(objects, 1.0, "the small object is kept, once");
    assert!(
        (small_len as f64..small_len as f64 + 4096.0).contains(&bytes),
        "{bytes} bytes cached for one object of {small_len}"
    );
}
