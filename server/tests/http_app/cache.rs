//! The object cache (`--cache-size`): what it answers is what the disk
//! holds, with the same validators, conditionals, ranges and HEAD; requests
//! keep only small objects; it
//! stays within its budget; a new generation never sees the entries of
//! the old one; and publication warms it with what a release brings new,
//! only what it verified, within half the budget.

use crate::support::*;
use oscontent_format::{ObjectName, RepoPath};
use oscontent_server::cache::{warm, ObjectCache};
use oscontent_server::verify::{ObjectGate, VerifiedSet};
use oscontent_server::HttpConfig;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    server.publish(fx.publish(&fx.v1)).await;
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
    // In-process requests cannot sendfile, as on HTTP/2: objects under
    // 16 KiB are kept, the larger ones only read (a pull asks for each
    // once, and they would push the small ones out).
    let small = paths
        .iter()
        .filter(|p| fx.v1.disk(p).len() < 16 * 1024)
        .count();
    assert!(small < paths.len(), "the fixture has a large object");
    let (used, entries) = server.state.cache.usage();
    assert_eq!(
        entries, small,
        "every small object cached once, no large one"
    );
    assert!(used <= server.state.cache.capacity());
}

#[tokio::test]
async fn a_small_cache_stays_within_its_budget_and_still_serves_everything() {
    let fx = Fixture::new();
    // Room for a few small objects; the 200 KB content object is over the
    // per-entry limit (an eighth) and is streamed instead.
    let budget = 16 * 1024;
    let server = Server::with_config(cached(budget));
    server.publish(fx.publish(&fx.v1)).await;
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
    server.publish(fx.publish(&fx.v1)).await;
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
    server.publish(fx.publish(&fx.v1)).await;
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
    server.publish(fx.publish(&fx.v1)).await;
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

/// v2 on top of v1 in one repo (v1 served as its parent), and the object
/// paths v2 brings new and those it shares with v1, from the files
/// `ostree commit` added to the copy of v1's repo.
fn v2_on_v1(fx: &Fixture, files: usize) -> (Repo, Vec<String>, Vec<String>) {
    let v2 = fx.child(&fx.v1, "2.0", files);
    let shared = objects(&fx.v1);
    let new: Vec<String> = objects(&v2)
        .into_iter()
        .filter(|p| !shared.contains(p))
        .collect();
    (v2, new, shared)
}

fn name(path: &str) -> ObjectName {
    match RepoPath::parse(path.trim_start_matches('/')) {
        Some(RepoPath::Object(o)) => o,
        other => panic!("{path} is not an object path: {other:?}"),
    }
}

fn cached_names(cache: &ObjectCache, key: u64, paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .filter(|p| cache.get(key, &name(p)).is_some())
        .cloned()
        .collect()
}

/// Status, body, ETag and Last-Modified.
type Seen = (u16, Vec<u8>, Option<String>, Option<String>);

async fn seen(server: &Server, path: &str) -> Seen {
    let r = server.get(path).await;
    let h = |n: &str| r.header(n).map(str::to_owned);
    (
        r.status.as_u16(),
        r.body.clone(),
        h("etag"),
        h("last-modified"),
    )
}

#[tokio::test]
async fn publishing_a_release_warms_what_it_brings_new_and_answers_as_the_disk() {
    let fx = Fixture::new();
    let (v2, new, shared) = v2_on_v1(&fx, 8);
    // The commit, dirtrees (root, usr, usr/bin, usr/lib, usr/lib/new),
    // hello, the 8 files and the big one; usr/big and the dirmetas are v1's.
    assert!(new.len() >= 14, "{new:?}");
    // What the disk answers, through a server that caches nothing.
    let disk = Server::with_config(cached(0));
    disk.publish(fx.publish_newest(&v2)).await;
    let mut from_disk = Vec::new();
    for p in &new {
        from_disk.push(seen(&disk, p).await);
    }

    let server = Server::with_config(cached(64 << 20));
    server.publish(fx.publish_newest(&v2)).await;
    let key = server.current().cache_key;
    let cache = &server.state.cache;
    assert_eq!(
        cached_names(cache, key, &new),
        new,
        "every new object warmed"
    );
    assert_eq!(cached_names(cache, key, &shared), Vec::<String>::new());
    let (used, entries) = cache.usage();
    assert_eq!(entries, new.len());
    assert!(used <= cache.capacity() / 2, "{used} bytes: over half");
    let bytes: usize = new.iter().map(|p| v2.disk(p).len()).sum();
    let metric = |n| server.metric(n, &[]);
    assert_eq!(
        metric("oscontent_cache_warmed_bytes").await,
        Some(bytes as f64)
    );
    let count = new.len() as f64;
    assert_eq!(metric("oscontent_cache_warmed_objects").await, Some(count));

    // Gone from the disk, they are still answered: from memory, with the
    // body and validators the disk gave, and conditionals and ranges work.
    for p in &new {
        std::fs::remove_file(v2.dir.join(p.trim_start_matches('/'))).unwrap();
    }
    for (p, want) in new.iter().zip(&from_disk) {
        assert_eq!(want.0, 200, "{p}");
        assert_eq!(&seen(&server, p).await, want, "{p}");
        assert_eq!(disk.get(p).await.status, 404, "{p} is gone from the disk");
        let (etag, lm) = (want.2.as_deref().unwrap(), want.3.as_deref().unwrap());
        let cases: Vec<Case> = vec![
            (vec![("If-None-Match", etag)], 304, vec![]),
            (vec![("If-Modified-Since", lm)], 304, vec![]),
            (vec![("Range", "bytes=0-0")], 206, want.1[..1].to_vec()),
            (vec![("If-Match", "\"other\"")], 412, vec![]),
        ];
        for (headers, status, body) in cases {
            let r = server.get_with(p, &headers).await;
            let got = (r.status.as_u16(), r.body);
            assert_eq!(got, (status, body), "{p} {headers:?}");
        }
    }
}

#[tokio::test]
async fn warming_takes_at_most_half_the_cache_metadata_first() {
    let fx = Fixture::new();
    // 24 files of 3,000 bytes (~77 KB with the overhead) against a budget
    // of 32 KiB; entries up to 8 KiB, so the 300,000-byte file never fits.
    let (v2, new, _) = v2_on_v1(&fx, 24);
    let budget = 32 * 1024;
    let server = Server::with_config(cached(2 * budget));
    server.publish(fx.publish_newest(&v2)).await;
    let key = server.current().cache_key;
    let cache = &server.state.cache;
    let (meta, content): (Vec<String>, Vec<String>) =
        new.iter().cloned().partition(|p| !p.ends_with(".filez"));
    assert_eq!(cached_names(cache, key, &meta), meta, "all metadata first");
    let warm = cached_names(cache, key, &content);
    assert!(!warm.is_empty() && warm.len() < content.len(), "{warm:?}");
    let (used, _) = cache.usage();
    assert!(used <= budget, "{used} bytes warmed, over {budget}");
    let big = new.iter().max_by_key(|p| v2.disk(p).len()).unwrap();
    assert!(
        cache.get(key, &name(big)).is_none(),
        "{big} is over the limit"
    );
    let bytes: usize = meta.iter().chain(&warm).map(|p| v2.disk(p).len()).sum();
    let metric = server.metric("oscontent_cache_warmed_bytes", &[]).await;
    assert_eq!(metric, Some(bytes as f64));
}

#[tokio::test]
async fn only_what_publication_verified_is_warmed_and_nothing_without_a_parent() {
    let fx = Fixture::new();
    let (v2, new, _) = v2_on_v1(&fx, 8);
    let mut g = fx.publish_newest(&v2);
    // One new content object the gate does not allow, as if publication
    // had not verified it (the smallest: `hello`).
    let filez = new.iter().filter(|p| p.ends_with(".filez"));
    let left_out = name(filez.min_by_key(|p| v2.disk(p).len()).unwrap());
    let big = name(new.iter().max_by_key(|p| v2.disk(p).len()).unwrap());
    let ObjectGate::Only(set) = &g.gate else {
        panic!("a --repo publication lists what it verified");
    };
    let mut narrower = VerifiedSet::default();
    for o in set.objects().filter(|o| **o != left_out) {
        narrower.insert(*o);
    }
    g.gate = ObjectGate::Only(Arc::new(narrower));
    let cache = ObjectCache::new(1 << 20);
    let far = Instant::now() + Duration::from_secs(600);
    let w = warm::warm(&cache, &g, far);
    // 1 MiB: entries up to 128 KiB, so the 300,000-byte file is left out.
    let want: Vec<String> = new
        .iter()
        .filter(|p| ![left_out, big].contains(&name(p)))
        .cloned()
        .collect();
    assert_eq!(want.len(), new.len() - 2);
    assert_eq!(cached_names(&cache, g.cache_key, &new), want);
    let counts = (w.objects, w.tips, w.too_large, w.stopped);
    assert_eq!(counts, (want.len(), 1, 1, None));
    assert_eq!(cache.usage().1, want.len());

    // Out of time before it starts: nothing.
    let late = ObjectCache::new(1 << 20);
    let w = warm::warm(&late, &g, Instant::now());
    assert_eq!((w.objects, w.stopped), (0, Some(warm::Stop::Deadline)));
    assert_eq!(late.usage(), (0, 0));

    // v1 is a first release: nothing to warm.
    let server = Server::with_config(cached(64 << 20));
    server.publish(fx.publish(&fx.v1)).await;
    assert_eq!(server.state.cache.usage(), (0, 0));
    let metric = server.metric("oscontent_cache_warmed_objects", &[]).await;
    assert_eq!(metric, Some(0.0));
}
