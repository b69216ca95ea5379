//! Fetching: only missing objects, the same ones stock ostree fetches;
//! every repo mode ends fsck-clean with the checkout of a stock pull;
//! HTTP/2 and HTTP/1.1; `--json` events; static deltas.

use super::support::*;
use oscontent_testkit::*;
use std::collections::BTreeSet;

/// 200 responses for dirtree, dirmeta and content objects, from the
/// server's `/metrics`.
fn object_responses(server: &Server) -> f64 {
    let m = server.metrics().unwrap();
    ["filez", "dirtree", "dirmeta"]
        .iter()
        .map(|k| {
            m.get(
                "oscontent_http_requests_total",
                &[("kind", k), ("status", "200")],
            )
            .unwrap_or(0.0)
        })
        .sum()
}

/// Who came over which protocol: the `config` requests in order (the
/// first is the pull's start, a second the walk's HTTP/2 probe), the rest
/// of the metadata, and the walk's objects (dirtree, dirmeta, content).
type Protocols<'a> = (Vec<&'a str>, BTreeSet<&'a str>, BTreeSet<&'a str>);

fn protocols(log: &[AccessEntry]) -> Protocols<'_> {
    let walk = |e: &&AccessEntry| ["dirtree", "dirmeta", "filez"].contains(&e.kind.as_str());
    let config = |e: &&AccessEntry| e.kind == "config";
    fn version(e: &AccessEntry) -> &str {
        e.version.as_str()
    }
    (
        log.iter().filter(config).map(version).collect(),
        log.iter()
            .filter(|e| !walk(e) && !config(e))
            .map(version)
            .collect(),
        log.iter().filter(walk).map(version).collect(),
    )
}

/// Pulls v1 with our client into the empty `ours` (its objects over
/// HTTP/2), and checks that it fetched every object of the commit exactly
/// once.
fn pull_v1_fetches_each_object_once(server: &Server, ours: &Ostree, v1: &Release) {
    let before = server.access_log().unwrap().len();
    let out = run_client(&pull_args(&ours.repo, &server.url, fixture_ref(), &[]));
    let evs = expect_ok(&out, "pull v1");
    let v1_log = server.access_log().unwrap()[before..].to_vec();
    // Config, summary and commit over HTTP/1.1; the walk's objects over
    // HTTP/2 with prior knowledge, once it had something to fetch.
    assert_eq!(event(&evs, "start")["protocol"], "HTTP/1.1");
    assert_eq!(event(&evs, "done")["objects_protocol"], "HTTP/2");
    assert_eq!(
        protocols(&v1_log),
        (
            vec!["HTTP/1.1", "HTTP/2.0"],
            BTreeSet::from(["HTTP/1.1"]),
            BTreeSet::from(["HTTP/2.0"])
        )
    );
    // Every object of v1 exactly once.
    let fetched = fetched_objects(&v1_log);
    let objects = v1_log
        .iter()
        .filter(|e| e.object().is_some() && e.kind != "commitmeta")
        .count();
    assert_eq!(objects, fetched.len(), "an object was fetched twice");
    let want: BTreeSet<(String, String)> = list_objects(&v1.repo)
        .unwrap()
        .0
        .into_iter()
        .flat_map(|(k, cs)| cs.into_iter().map(move |c| (k.clone(), c)))
        .filter(|(k, _)| k != "commitmeta")
        .collect();
    assert_eq!(
        fetched, want,
        "v1: fetched objects differ from the commit's"
    );
    let done = event(&evs, "done");
    assert_eq!(
        done["objects_written"].as_u64().unwrap() as usize,
        want.len()
    );
    assert_eq!(done["ref_moved"], true);
}

/// The objects (but commitmeta) of `new`'s repo that `old`'s lacks.
fn objects_new_in(new: &Release, old: &Release) -> BTreeSet<(String, String)> {
    let a = list_objects(&old.repo).unwrap();
    list_objects(&new.repo)
        .unwrap()
        .0
        .into_iter()
        .flat_map(|(k, cs)| cs.into_iter().map(move |c| (k.clone(), c)))
        .filter(|(k, c)| k != "commitmeta" && !a.contains(k, c))
        .collect()
}

#[test]
fn update_fetches_only_new_objects_like_stock_ostree() {
    let (v1, v2) = (v1(), v2());
    let tmp = tempdir();
    let mut server = Server::release(v1);

    // Stock ostree: v1, then v2.
    let stock = Ostree::init(&tmp.path().join("stock"), "bare-user").unwrap();
    stock.remote_add("os", &server.url, &[]).unwrap();
    stock.pull(&["os", fixture_ref()]).unwrap();
    let ours = Ostree::init(&tmp.path().join("ours"), "bare-user").unwrap();
    pull_v1_fetches_each_object_once(&server, &ours, v1);

    // v2 from a server serving v2: both clients fetch exactly the new objects.
    server.stop(std::time::Duration::from_secs(10)).unwrap();
    let server2 = Server::release(v2);
    stock.remote_replace("os", &server2.url, &[]).unwrap();
    let s0 = server2.access_log().unwrap().len();
    stock.pull(&["os", fixture_ref()]).unwrap();
    let stock_v2 = fetched_objects(&server2.access_log().unwrap()[s0..]);
    let o0 = server2.access_log().unwrap().len();
    let m0 = object_responses(&server2);
    let out = run_client(&pull_args(
        &ours.repo,
        &server2.url,
        fixture_ref(),
        &["--io-mode", "per-object-fsync"],
    ));
    let evs = expect_ok(&out, "pull v2");
    let served = object_responses(&server2) - m0;
    let ours_v2 = fetched_objects(&server2.access_log().unwrap()[o0..]);
    assert!(!ours_v2.is_empty());
    assert_eq!(
        ours_v2, stock_v2,
        "the update fetched other objects than stock ostree"
    );
    let new_objects = objects_new_in(v2, v1);
    assert_eq!(
        ours_v2, new_objects,
        "the update fetched objects it already had"
    );
    // The server's own counters agree: one 200 per new object, no more.
    let new_loose = new_objects.iter().filter(|(k, _)| k != "commit").count();
    assert_eq!(served, new_loose as f64, "object 200s in /metrics");
    let done = event(&evs, "done");
    // One fsync per object written.
    assert_eq!(done["governor"]["flushes"], done["objects_written"]);
    assert_eq!(done["previous"], v1.commit.as_str());
    assert_eq!(done["commit"], v2.commit.as_str());
    assert!(done["objects_present"].as_u64().unwrap() > 1000, "{done}");
    // Progress lines parse and count up.
    assert!(evs.iter().any(|e| e["event"] == "progress"));

    assert_eq!(ours.rev_parse(fixture_ref()).unwrap(), v2.commit);
    ours.fsck().unwrap();
    let a = checkout_digest(&ours, &v2.commit, &tmp.path().join("co-ours"));
    let b = checkout_digest(&stock, &v2.commit, &tmp.path().join("co-stock"));
    assert!(a.len() > 1000);
    assert_eq!(a, b, "checkouts differ");

    // A third run has nothing to do and fetches no object.
    let o1 = server2.access_log().unwrap().len();
    let out = run_client(&pull_args(&ours.repo, &server2.url, fixture_ref(), &[]));
    let evs = expect_ok(&out, "pull again");
    assert!(fetched_objects(&server2.access_log().unwrap()[o1..])
        .iter()
        .all(|(k, _)| k == "commit"));
    assert_eq!(event(&evs, "done")["up_to_date"], true);
}

#[test]
fn every_repo_mode_matches_a_stock_pull_over_http1_and_http2() {
    let v1 = v1();
    let tmp = tempdir();
    let server = Server::release(v1);
    let stock = Ostree::init(&tmp.path().join("stock"), "bare-user").unwrap();
    stock.remote_add("os", &server.url, &[]).unwrap();
    stock.pull(&["os", fixture_ref()]).unwrap();
    let want = checkout_digest(&stock, &v1.commit, &tmp.path().join("co-stock"));

    for (mode, http1, io_mode) in [
        ("bare", false, "writeback"),
        ("archive", true, "stock-like"),
        ("bare-user", true, "paced"),
    ] {
        let repo = Ostree::init(&tmp.path().join(mode), mode).unwrap();
        repo.remote_add("os", &server.url, &[]).unwrap();
        let mut args = vec![
            "pull".to_owned(),
            "--repo".into(),
            repo.repo.display().to_string(),
            "--remote".into(),
            "os".into(),
            "--ref".into(),
            fixture_ref().into(),
            "--json".into(),
            "--io-mode".into(),
            io_mode.into(),
        ];
        if http1 {
            args.push("--http1".into());
        }
        let before = server.access_log().unwrap().len();
        let out = run_client(&args);
        let evs = expect_ok(&out, mode);
        let log = server.access_log().unwrap()[before..].to_vec();
        let (config, objects) = if http1 {
            (vec!["HTTP/1.1"], "HTTP/1.1")
        } else {
            (vec!["HTTP/1.1", "HTTP/2.0"], "HTTP/2.0")
        };
        assert_eq!(
            protocols(&log),
            (
                config,
                BTreeSet::from(["HTTP/1.1"]),
                BTreeSet::from([objects])
            ),
            "{mode}: (config, other metadata, objects) over"
        );
        // The ref is the remote's, as `ostree pull REMOTE REF` writes it.
        assert_eq!(
            repo.rev_parse(&format!("os:{}", fixture_ref())).unwrap(),
            v1.commit
        );
        repo.fsck().unwrap_or_else(|e| panic!("{mode}: {e:#}"));
        let got = checkout_digest(&repo, &v1.commit, &tmp.path().join(format!("co-{mode}")));
        assert_eq!(got, want, "{mode}: checkout differs from the stock pull's");
        let g = &event(&evs, "done")["governor"];
        assert_eq!(g["io_mode"], io_mode);
        // Stock-like never flushes before the barrier; the others do.
        assert_eq!(
            g["flushes"].as_u64().unwrap() > 0,
            io_mode != "stock-like",
            "{mode}: {g}"
        );
        assert!(g["barrier_ms"].as_f64().is_some());
        // Paced commits the journal as it goes (every 128 objects or 2 MiB
        // of data: v1 has thousands), never more than once a chunk; the
        // other modes leave that to their fsyncs or the barrier.
        let forces = g["log_forces"].as_u64().unwrap();
        assert_eq!(forces > 0, io_mode == "paced", "{mode}: {g}");
        assert!(forces <= g["flushes"].as_u64().unwrap(), "{mode}: {g}");
        // Nothing left behind in tmp/ but what ostree itself keeps.
        let leftovers: Vec<_> = std::fs::read_dir(repo.repo.join("tmp"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("oscontent"))
            .collect();
        assert!(leftovers.is_empty(), "{mode}: {leftovers:?}");
    }
}

#[test]
fn static_delta_is_used_when_offered_from_the_local_commit() {
    let (v1, v2) = (v1(), v2());
    let tmp = tempdir();
    // An archive repo with both releases, a ref, and a v1 → v2 delta.
    let src = Ostree::init(&tmp.path().join("src"), "archive").unwrap();
    src.run(["pull-local", &v1.repo.display().to_string(), &v1.commit])
        .unwrap();
    src.run(["pull-local", &v2.repo.display().to_string(), &v2.commit])
        .unwrap();
    src.run(["refs", "--create", fixture_ref(), &v2.commit])
        .unwrap();
    src.run([
        "static-delta",
        "generate",
        "--from",
        &v1.commit,
        "--to",
        &v2.commit,
    ])
    .unwrap();
    let server = Server::repo(&src.repo).start().unwrap();
    let repo = repo_at_v1(&tmp.path().join("node")).unwrap();

    let before = server.access_log().unwrap().len();
    let out = run_client(&pull_args(&repo.repo, &server.url, fixture_ref(), &[]));
    let evs = expect_ok(&out, "delta pull");
    let log = server.access_log().unwrap()[before..].to_vec();
    let d = event(&evs, "delta");
    assert_eq!(d["from"], v1.commit.as_str());
    assert!(log
        .iter()
        .any(|e| e.kind == "delta" && e.path.ends_with("/superblock")));
    assert!(log
        .iter()
        .any(|e| e.kind == "delta" && e.path.ends_with("/0")));
    // The delta carried the content: no loose content object was fetched.
    assert!(
        !log.iter().any(|e| e.kind == "filez"),
        "loose content fetched despite the delta"
    );
    assert_eq!(event(&evs, "done")["delta"], true);
    assert_eq!(repo.rev_parse(fixture_ref()).unwrap(), v2.commit);
    repo.fsck().unwrap();
}
