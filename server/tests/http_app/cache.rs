//! The object cache (`--cache-size`): what it answers is what the disk
//! holds, with the same validators, conditionals, ranges and HEAD; it
//! stays within its budget; and a new generation never sees the entries
//! of the old one.

use crate::support::*;
use oscontent_server::HttpConfig;

/// Request headers, the status and the body they should get.
type Case<'a> = (Vec<(&'a str, &'a str)>, u16, Vec<u8>);

fn cached(cache_size: usize) -> HttpConfig {
    HttpConfig {
        cache_size,
        ..Default::default()
    }
}

/// Every object path of a repo (commit, dirtree, dirmeta, filez).
fn objects(repo: &Repo) -> Vec<String> {
    repo.files("objects")
        .into_iter()
        .filter(|f| !f.ends_with(".commitmeta"))
        .map(|f| format!("/{f}"))
        .collect()
}

#[tokio::test]
async fn answers_from_memory_as_from_disk_conditionals_ranges_and_head_included() {
    let fx = Fixture::new();
    let server = Server::with_config(cached(64 << 20));
    server.publish(fx.publish(&fx.v1));
    let paths = objects(&fx.v1);
    assert!(paths.len() >= 4, "{paths:?}");
    for path in &paths {
        let disk = fx.v1.disk(path);
        // The first request fills the cache, the second is answered by it.
        let first = server.get(path).await;
        let second = server.get(path).await;
        for r in [&first, &second] {
            assert_eq!(r.status, 200, "{path}");
            assert_eq!(r.body, disk, "{path}");
            assert_eq!(
                r.header("cache-control"),
                Some(oscontent_server::http::IMMUTABLE)
            );
        }
        assert_eq!(first.header("etag"), second.header("etag"), "{path}");
        assert_eq!(
            first.header("last-modified"),
            second.header("last-modified")
        );
        let etag = second.header("etag").unwrap().to_owned();
        let lm = second.header("last-modified").unwrap().to_owned();

        let len = disk.len();
        let range_head = format!("bytes=1-{}", len.min(10) - 1);
        let past_end = format!("bytes={len}-");
        let head = server.send("HEAD", path, &[]).await;
        assert_eq!((head.status.as_u16(), head.body.len()), (200, 0), "{path}");
        assert_eq!(
            head.header("content-length"),
            Some(len.to_string().as_str())
        );
        let cases: Vec<Case> = vec![
            (vec![("If-None-Match", &etag)], 304, vec![]),
            (vec![("If-Modified-Since", &lm)], 304, vec![]),
            (vec![("If-Match", "\"nope\"")], 412, vec![]),
            (
                vec![("Range", &range_head)],
                206,
                disk[1..len.min(10)].to_vec(),
            ),
            (vec![("Range", "bytes=-3")], 206, disk[len - 3..].to_vec()),
            (vec![("Range", &past_end)], 416, vec![]),
            (
                vec![("Range", "bytes=0-0"), ("If-Range", "\"other\"")],
                200,
                disk.clone(),
            ),
        ];
        for (headers, status, body) in cases {
            let r = server.get_with(path, &headers).await;
            assert_eq!(
                (r.status.as_u16(), &r.body),
                (status, &body),
                "{path} {headers:?}"
            );
        }
    }
    let (used, entries) = server.state.cache.usage();
    assert_eq!(entries, paths.len(), "every object cached once");
    assert!(used <= server.state.cache.capacity());
}

#[tokio::test]
async fn a_small_cache_stays_within_its_budget_and_still_serves_everything() {
    let fx = Fixture::new();
    // Room for a few small objects; the 200 KB content object is over the
    // per-entry limit (an eighth) and is streamed instead.
    let budget = 16 * 1024;
    let server = Server::with_config(cached(budget));
    server.publish(fx.publish(&fx.v1));
    let paths = objects(&fx.v1);
    for round in 0..3 {
        for path in &paths {
            let r = server.get(path).await;
            assert_eq!(r.status, 200, "{path}");
            assert_eq!(r.body, fx.v1.disk(path), "{path} (round {round})");
            let (used, _) = server.state.cache.usage();
            assert!(used <= budget, "{used} bytes cached, over {budget}");
        }
    }
    let big = fx.v1.object("filez");
    assert!(fx.v1.disk(&big).len() > budget / 8);
}

#[tokio::test]
async fn entries_are_keyed_by_generation() {
    let fx = Fixture::new();
    let server = Server::with_config(cached(64 << 20));
    server.publish(fx.publish(&fx.v1));
    let path = fx.v1.object("dirtree");
    let before = server.get(&path).await;
    assert_eq!(before.body, fx.v1.disk(&path));
    // The file changes on disk under the same name (what no ostree tool
    // does to an object, which is why the cache may keep it).
    let file = fx.v1.dir.join(path.trim_start_matches('/'));
    let original = std::fs::read(&file).unwrap();
    std::fs::write(&file, b"different bytes").unwrap();
    let same_generation = server.get(&path).await;
    assert_eq!(same_generation.body, before.body, "served from the cache");
    // A new publication verifies again and refuses the changed object.
    let refused = fx.try_publish(&fx.v1).unwrap_err();
    assert!(format!("{refused:#}").contains("corrupt"), "{refused:#}");
    // Restored, it publishes; the new generation does not answer from the
    // old one's entry: with the file gone after publication, it is a 404.
    std::fs::write(&file, &original).unwrap();
    server.publish(fx.publish(&fx.v1));
    std::fs::remove_file(&file).unwrap();
    let next = server.get(&path).await;
    assert_eq!(
        next.status.as_u16(),
        404,
        "the new generation read the disk, not the old entry"
    );
}

#[tokio::test]
async fn off_means_nothing_is_kept() {
    let (fx, _) = serving_v1().await;
    let server = Server::with_config(cached(0));
    server.publish(fx.publish(&fx.v1));
    for path in objects(&fx.v1) {
        let r = server.get(&path).await;
        assert_eq!(
            (r.status.as_u16(), r.body),
            (200, fx.v1.disk(&path)),
            "{path}"
        );
    }
    assert_eq!(server.state.cache.usage(), (0, 0));
}
