//! Validators, preconditions, caching and byte ranges (as
//! tests/tests/serve/conditionals.rs and http.rs check end to end).

use crate::support::*;
use http::StatusCode;
use std::time::{Duration, SystemTime};

#[tokio::test]
async fn metadata_answers_conditionals() {
    let (_fx, server) = serving_v1().await;
    let ref_path = format!("/refs/heads/{REF}");
    for path in ["/summary", ref_path.as_str(), "/config"] {
        let full = server.get(path).await;
        assert_eq!(full.status, 200, "{path}");
        let etag = full.header("etag").unwrap().to_owned();
        let lm_str = full.header("last-modified").unwrap().to_owned();
        let lm = httpdate::parse_http_date(&lm_str).unwrap();
        let again = server.get(path).await;
        assert_eq!(
            again.header("etag"),
            Some(etag.as_str()),
            "{path}: stable ETag"
        );
        assert_eq!(again.header("last-modified"), Some(lm_str.as_str()));
        assert_eq!(again.body, full.body);

        let weak = format!("W/{etag}");
        let list = format!("\"nope\", {etag}");
        let past = date(lm - Duration::from_secs(86_400));
        let now = date(SystemTime::now() + Duration::from_secs(1));
        let future = date(SystemTime::now() + Duration::from_secs(10 * 86_400));
        let cases: Vec<(Vec<(&str, &str)>, u16)> = vec![
            (vec![("If-None-Match", &etag)], 304),
            (vec![("If-None-Match", &weak)], 304),
            (vec![("If-None-Match", &list)], 304),
            (vec![("If-None-Match", "*")], 304),
            (vec![("If-Modified-Since", &lm_str)], 304),
            // Only its own date: another replica's later date on other
            // bytes is not "unmodified" (nginx's `if_modified_since exact`).
            (vec![("If-Modified-Since", &now)], 200),
            (vec![("If-Modified-Since", &past)], 200),
            (vec![("If-None-Match", "\"nope\"")], 200),
            (
                vec![
                    ("If-None-Match", "\"nope\""),
                    ("If-Modified-Since", &future),
                ],
                200,
            ),
            (
                vec![("If-None-Match", &etag), ("If-Modified-Since", &past)],
                304,
            ),
            (vec![("If-Modified-Since", "yesterday")], 200),
            (vec![("If-Match", &etag)], 200),
            (vec![("If-Match", "*")], 200),
            (vec![("If-Match", "\"nope\"")], 412),
            (vec![("If-Match", &weak)], 412),
            (vec![("If-Unmodified-Since", &past)], 412),
            (vec![("If-Unmodified-Since", &lm_str)], 200),
        ];
        for (headers, want) in &cases {
            let r = server.get_with(path, headers).await;
            assert_eq!(r.status.as_u16(), *want, "{path}: {headers:?}");
            match want {
                200 => assert_eq!(r.body, full.body, "{path}: {headers:?}"),
                304 => {
                    assert!(r.body.is_empty(), "{path}: 304 has no body");
                    assert_eq!(r.header("etag"), Some(etag.as_str()), "{path}");
                    assert_eq!(r.header("cache-control"), Some(SHORT_LIVED), "{path}");
                }
                _ => {
                    assert!(r.body.is_empty(), "{path}: 412 has no body");
                    assert_eq!(r.header("content-length"), Some("0"));
                }
            }
        }
        // HEAD: the headers of a GET, no body.
        let head = server.send("HEAD", path, &[]).await;
        assert_eq!(head.status, 200, "HEAD {path}");
        let len = full.body.len().to_string();
        assert_eq!(head.header("content-length"), Some(len.as_str()));
        assert_eq!(head.header("etag"), Some(etag.as_str()));
        assert!(head.body.is_empty(), "HEAD {path} sent a body");
        let head304 = server.send("HEAD", path, &[("If-None-Match", &etag)]).await;
        assert_eq!(head304.status, 304, "conditional HEAD {path}");
        // A 304's Content-Length is the 200's or none (RFC 9110 §8.6).
        assert_eq!(head304.header("content-length"), Some(len.as_str()));
        let get304 = server.get_with(path, &[("If-None-Match", &etag)]).await;
        assert_eq!(get304.header("content-length"), Some(len.as_str()));
    }
}

#[tokio::test]
async fn objects_are_immutable_with_strong_etags() {
    let (fx, server) = serving_v1().await;
    for ext in ["commit", "dirtree", "dirmeta", "filez"] {
        let path = fx.v1.object(ext);
        let r = server.get(&path).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("cache-control"), Some(IMMUTABLE), "{path}");
        let etag = r.header("etag").unwrap().to_owned();
        assert!(etag.starts_with('"') && !etag.starts_with("W/"), "{etag}");
        // Content-addressed: the ETag names the object.
        let hex = format!("{}{}", &path[9..11], &path[12..74]);
        assert!(
            etag.starts_with(&format!("\"{hex}.{ext}-")),
            "{path}: {etag}"
        );
        let again = server.get(&path).await;
        assert_eq!(again.header("etag"), Some(etag.as_str()));
        let nm = server.get_with(&path, &[("If-None-Match", &etag)]).await;
        assert_eq!((nm.status, nm.body.len()), (StatusCode::NOT_MODIFIED, 0));
        assert_eq!(nm.header("cache-control"), Some(IMMUTABLE));
        // Immutable: any date at or after its own is "not modified".
        let later = date(SystemTime::now() + Duration::from_secs(86_400));
        let ims = server
            .get_with(&path, &[("If-Modified-Since", &later)])
            .await;
        assert_eq!(ims.status, StatusCode::NOT_MODIFIED, "{path}");
        let im = server.get_with(&path, &[("If-Match", "\"other\"")]).await;
        assert_eq!(
            (im.status, im.body.len()),
            (StatusCode::PRECONDITION_FAILED, 0)
        );
        let head = server.send("HEAD", &path, &[]).await;
        assert_eq!(head.status, 200);
        let len = r.body.len().to_string();
        assert_eq!(head.header("content-length"), Some(len.as_str()));
        assert_eq!(head.header("cache-control"), Some(IMMUTABLE));
        assert!(head.body.is_empty(), "HEAD {path} sent a body");
        let head304 = server
            .send("HEAD", &path, &[("If-None-Match", &etag)])
            .await;
        assert_eq!(head304.status, 304, "{path}");
        assert_eq!(head304.header("content-length"), Some(len.as_str()));
    }
}

#[tokio::test]
async fn byte_ranges_on_files_and_generated_bytes() {
    let (fx, server) = serving_v1().await;
    let big = fx.v1.object("filez");
    for path in [big.as_str(), "/summary"] {
        let full = server.get(path).await;
        let etag = full.header("etag").unwrap().to_owned();
        let len = full.body.len();
        assert!(len > 100, "{path}: {len} bytes");
        // (Range, wanted start and end; None = the whole body with 200)
        let cases: Vec<(String, Option<(usize, usize)>)> = vec![
            ("bytes=10-99".into(), Some((10, 99))),
            ("bytes=0-0".into(), Some((0, 0))),
            ("bytes=-16".into(), Some((len - 16, len - 1))),
            (format!("bytes={}-", len / 2), Some((len / 2, len - 1))),
            ("bytes=0-".into(), Some((0, len - 1))),
            (format!("bytes=1-{}", len * 10), Some((1, len - 1))),
            // Several ranges, other units, nonsense: the whole body.
            ("bytes=0-1,5-6".into(), None),
            ("items=0-1".into(), None),
            ("bytes=5-1".into(), None),
            ("bytes=a-b".into(), None),
        ];
        for (spec, want) in &cases {
            let r = server.get_with(path, &[("Range", spec)]).await;
            let Some((s, e)) = *want else {
                assert_eq!(r.status, 200, "{path}: Range {spec}");
                assert!(r.body == full.body, "{path}: Range {spec}: the whole body");
                assert_eq!(r.header("content-range"), None);
                continue;
            };
            assert_eq!(r.status, 206, "{path}: Range {spec}");
            let cr = format!("bytes {s}-{e}/{len}");
            assert_eq!(
                r.header("content-range"),
                Some(cr.as_str()),
                "{path}: {spec}"
            );
            let n = (e - s + 1).to_string();
            assert_eq!(
                r.header("content-length"),
                Some(n.as_str()),
                "{path}: {spec}"
            );
            assert!(
                r.body == full.body[s..=e],
                "{path}: Range {spec}: those bytes"
            );
        }
        // If-Range: a matching ETag honours the range, another gives all.
        let ir = server
            .get_with(path, &[("Range", "bytes=0-0"), ("If-Range", &etag)])
            .await;
        assert_eq!(ir.status, 206, "{path}: If-Range with the ETag");
        let ir = server
            .get_with(path, &[("Range", "bytes=0-0"), ("If-Range", "\"other\"")])
            .await;
        assert_eq!(ir.status, 200, "{path}: If-Range with another ETag");
        assert!(ir.body == full.body);
        // Unsatisfiable.
        for spec in [format!("bytes={len}-"), "bytes=-0".into()] {
            let bad = server.get_with(path, &[("Range", &spec)]).await;
            assert_eq!(bad.status, 416, "{path}: {spec}");
            let cr = format!("bytes */{len}");
            assert_eq!(bad.header("content-range"), Some(cr.as_str()));
            assert!(bad.body.is_empty());
        }
        // HEAD with a range: the 206 headers, no body.
        let head = server.send("HEAD", path, &[("Range", "bytes=0-9")]).await;
        assert_eq!(head.status, 206);
        assert_eq!(head.header("content-length"), Some("10"));
        let cr = format!("bytes 0-9/{len}");
        assert_eq!(head.header("content-range"), Some(cr.as_str()));
        assert!(head.body.is_empty());
    }
}
