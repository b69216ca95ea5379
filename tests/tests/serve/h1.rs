//! The HTTP/1.1 loop (`listen::h1`) writing repo answers on the wire: one
//! keep-alive connection carrying each kind of answer, and the same
//! answers over HTTP/2, where hyper writes them.

use oscontent_testkit::*;

/// One connection, pipelined: a large object (sent from its file), its
/// HEAD, a 304, a range, an unsatisfiable range, a failed precondition, a
/// small object twice (from its file, then the cache), the summary, a
/// target with a query, an empty 404; then a method the loop leaves to
/// hyper, after which hyper answers the rest of the connection. Every
/// answer as on disk, framed by its Content-Length, and logged once with
/// the bytes sent.
#[test]
fn one_connection_carries_every_kind_of_answer() {
    let v1 = v1();
    let server = Server::release(v1);
    let (big, len) = largest_filez(&v1.repo).unwrap();
    assert!(len > 100_000, "a large object ({len} bytes)");
    let big_path = object_url_path(&big, "filez");
    let disk = std::fs::read(object_path(&v1.repo, &big, "filez")).unwrap();
    let dirtree = list_objects(&v1.repo).unwrap().get("dirtree");
    let small = dirtree.iter().next().unwrap();
    let small_path = object_url_path(small, "dirtree");
    let small_disk = std::fs::read(object_path(&v1.repo, small, "dirtree")).unwrap();
    let etag = server.get(&big_path).unwrap();
    let etag = etag.header("etag").unwrap().to_owned();
    let absent = object_url_path(
        &format!("{}{}", &v1.commit[..2], "0".repeat(62)),
        "commitmeta",
    );
    let query = format!("{big_path}?x=1");
    let past = format!("bytes={len}-");
    let if_none_match = [("If-None-Match", etag.as_str())];
    let past = [("Range", past.as_str())];
    #[rustfmt::skip]
    let asked: Vec<(Asked<'_>, u16, Option<&[u8]>)> = vec![
        (("GET", &big_path, &[]), 200, Some(&disk)),
        (("HEAD", &big_path, &[]), 200, Some(b"")),
        (("GET", &big_path, &if_none_match), 304, Some(b"")),
        (("GET", &big_path, &[("Range", "bytes=10-19")]), 206, Some(&disk[10..20])),
        (("GET", &big_path, &past), 416, Some(b"")),
        (("GET", &big_path, &[("If-Match", "\"other\"")]), 412, Some(b"")),
        (("GET", &small_path, &[]), 200, Some(&small_disk)),
        (("GET", &small_path, &[]), 200, Some(&small_disk)),
        (("GET", "/summary", &[]), 200, None),
        (("GET", &query, &[]), 200, Some(&disk)),
        (("GET", &absent, &[]), 404, Some(b"")),
        (("DELETE", &big_path, &[]), 405, Some(b"")),
        (("GET", &big_path, &[]), 200, Some(&disk)),
    ];
    let requests: Vec<Asked<'_>> = asked.iter().map(|a| a.0).collect();
    let got = keep_alive(server.addr, &requests).unwrap();
    let summary = server.summary_bytes().unwrap();
    for ((ask, status, body), r) in asked.iter().zip(&got) {
        let what = format!("{} {} {:?}", ask.0, ask.1, ask.2);
        assert_eq!(r.status, *status, "{what}: {}", r.status_line);
        assert!(r.body == body.unwrap_or(&summary), "{what}: the bytes");
        let cache = r.header("cache-control").unwrap_or_default();
        if *status >= 400 {
            assert_eq!(cache, "no-store", "{what}");
        } else {
            assert!(r.header("etag").is_some(), "{what}: an ETag");
        }
    }
    let length = |i: usize| got[i].header("content-length").map(str::to_owned);
    assert_eq!(length(1), Some(len.to_string()), "HEAD: the GET's length");
    assert_eq!(
        got[3].header("content-range"),
        Some(&*format!("bytes 10-19/{len}"))
    );
    assert_eq!(
        got[4].header("content-range"),
        Some(&*format!("bytes */{len}"))
    );
    assert_eq!(got[11].header("allow"), Some("GET, HEAD"));
    // Each answer logged once, with what its body sent.
    let log = server.access_log().unwrap();
    let repo: Vec<_> = log
        .iter()
        .filter(|e| e.kind != "health" && e.kind != "metrics")
        .collect();
    for ((ask, status, _), r) in asked.iter().zip(&got) {
        let path = ask.1.split('?').next().unwrap();
        let sent = r.body.len() as u64;
        let n = |e: &&&AccessEntry| {
            e.method == ask.0 && e.path == path && e.status == *status && e.bytes == sent
        };
        assert!(
            repo.iter().any(|e| n(&e)),
            "{} {}: {sent} bytes logged",
            ask.0,
            ask.1
        );
        assert!(repo.iter().all(|e| e.version == "HTTP/1.1"), "{:?}", repo);
    }
}

/// The same answers over HTTP/2 (hyper writes them): status, headers but
/// the date and the 304's length, and bytes.
#[test]
fn hyper_writes_the_answers_the_loop_writes() {
    let v1 = v1();
    let server = Server::release(v1);
    let (big, _) = largest_filez(&v1.repo).unwrap();
    let big_path = object_url_path(&big, "filez");
    let absent = object_url_path(&"f".repeat(64), "filez");
    let cases: [(&str, &[(&str, &str)]); 6] = [
        (&big_path, &[]),
        (&big_path, &[("Range", "bytes=5-")]),
        (&big_path, &[("Range", "bytes=99999999-")]),
        ("/config", &[]),
        ("/summary", &[]),
        (&absent, &[]),
    ];
    let h2 = http2();
    for (path, headers) in cases {
        let [plain] = &keep_alive(server.addr, &[("GET", path, headers)]).unwrap()[..] else {
            panic!("one answer");
        };
        let hyper = fetch(&h2, &server.url_for(path), headers).unwrap();
        assert_eq!(hyper.version, reqwest::Version::HTTP_2);
        assert_eq!(
            (plain.status, &plain.body),
            (hyper.status, &hyper.body),
            "{path}"
        );
        let mut ours: Vec<(String, String)> = plain
            .headers
            .iter()
            .filter(|(k, _)| !["date", "connection"].contains(&&*k.to_ascii_lowercase()))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        let mut theirs: Vec<(String, String)> = hyper
            .headers
            .iter()
            .filter(|(k, _)| k.as_str() != "date")
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        ours.sort();
        theirs.sort();
        assert_eq!(ours, theirs, "{path} {headers:?}");
    }
}
