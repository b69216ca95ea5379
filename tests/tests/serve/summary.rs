//! The published summary: its refs as stock ostree and our parser read
//! them, and its determinism.

use oscontent_format::{parse_summary, Commit};
use oscontent_testkit::*;
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

fn commit_object(r: &Release) -> (Vec<u8>, Commit) {
    let bytes = std::fs::read(object_path(&r.repo, &r.commit, "commit")).unwrap();
    let c = Commit::parse(&bytes).unwrap();
    (bytes, c)
}

#[test]
fn summary_lists_the_bound_ref_with_the_fixture_commit() {
    let v1 = v1();
    let server = Server::release(v1);
    let (commit_bytes, commit) = commit_object(v1);
    stock_ostree_sees_the_ref(&server, v1, &commit_bytes);
    our_parser_sees_the_ref(&server, v1, &commit_bytes, &commit);
    the_ref_file_names_the_commit(&server, v1);
    the_client_lists_the_ref(&server, v1);
    let m = server.metrics().unwrap();
    assert_eq!(m.get("oscontent_published_refs", &[]), Some(1.0));
    assert_eq!(m.get("oscontent_ready", &[]), Some(1.0));
}

/// The summary as stock ostree sees it: one ref, the binding, with the
/// commit, its version, timestamp and size, and the repo metadata.
fn stock_ostree_sees_the_ref(server: &Server, v1: &Release, commit_bytes: &[u8]) {
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    repo.remote_add("os", &server.url, &[]).unwrap();
    let refs: BTreeSet<String> = repo
        .run(["remote", "refs", "os"])
        .unwrap()
        .lines()
        .map(|l| l.trim().to_owned())
        .collect();
    assert_eq!(
        refs,
        BTreeSet::from([format!("os:{}", fixture_ref())]),
        "the ref is the commit's binding"
    );
    let view = repo.run(["remote", "summary", "os"]).unwrap();
    let entries = parse_summary_view(&view);
    assert_eq!(
        entries.keys().collect::<Vec<_>>(),
        [fixture_ref()],
        "{view}"
    );
    let lines = &entries[fixture_ref()];
    assert!(
        lines.contains(&v1.commit),
        "summary names the v1 commit:\n{view}"
    );
    assert!(
        lines.contains(&format!("Version (ostree.commit.version): {}", v1.version)),
        "summary carries the version:\n{view}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("Timestamp (ostree.commit.timestamp): ")),
        "{view}"
    );
    assert!(
        lines.contains(&format!("Latest Commit ({} bytes):", commit_bytes.len())),
        "ostree must read the commit size {} from the summary:\n{view}",
        commit_bytes.len()
    );
    let meta = summary_view_metadata(&view);
    assert!(
        meta.contains("Repository Mode (ostree.summary.mode): archive-z2"),
        "{meta:?}"
    );
    assert!(
        meta.iter()
            .any(|l| l.starts_with("Last-Modified (ostree.summary.last-modified): ")),
        "{meta:?}"
    );
}

/// The summary as our parser sees it.
fn our_parser_sees_the_ref(server: &Server, v1: &Release, commit_bytes: &[u8], commit: &Commit) {
    let s = server.summary().unwrap();
    assert_eq!(s.refs.len(), 1, "{s:?}");
    let r = &s.refs[0];
    assert_eq!(r.name, fixture_ref());
    assert_eq!(r.commit.to_hex(), v1.commit);
    assert_eq!(r.version.as_deref(), Some(v1.version.as_str()));
    assert_eq!(r.timestamp, Some(commit.timestamp));
    assert_eq!(
        r.commit_size,
        commit_bytes.len() as u64,
        "commit size in the summary"
    );
    assert_eq!(
        s.last_modified,
        Some(commit.timestamp),
        "last-modified is the newest commit's time, not the clock"
    );
    assert_eq!(s.mode.as_deref(), Some("archive-z2"));
    assert!(s.collection_map.is_empty() && s.collection_id.is_none());
}

/// `/refs/heads/REF` holds the commit.
fn the_ref_file_names_the_commit(server: &Server, v1: &Release) {
    let rf = server
        .get(&format!("/refs/heads/{}", fixture_ref()))
        .unwrap();
    assert_eq!(rf.status, 200);
    assert_eq!(
        String::from_utf8(rf.body).unwrap(),
        format!("{}\n", v1.commit)
    );
}

/// `oscontent ls-remote --json` lists the ref, commit and version.
fn the_client_lists_the_ref(server: &Server, v1: &Release) {
    let out = check_output(
        local_only(&mut Command::new(client_bin())).args([
            "ls-remote",
            "--url",
            &server.url,
            "--json",
        ]),
        Duration::from_secs(60),
    )
    .unwrap();
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["refs"][0]["ref"], fixture_ref());
    assert_eq!(j["refs"][0]["commit"], v1.commit.as_str());
    assert_eq!(j["refs"][0]["version"], v1.version.as_str());
}

#[test]
fn summary_ref_entries_match_what_ostree_itself_generates() {
    // Stock ostree's own summary of the same ref and commit is the reference
    // for every field of a ref entry (commit size, timestamp, version).
    let v1 = v1();
    let tmp = tempdir();
    let copy = tmp.path().join("copy");
    copy_dir(&v1.repo, &copy).unwrap();
    let own = Ostree::at(&copy);
    own.run(["refs", &format!("--create={}", fixture_ref()), &v1.commit])
        .unwrap();
    own.run(["summary", "-u"]).unwrap();
    let own_view = own.run(["summary", "--view"]).unwrap();
    let own_bytes = std::fs::read(copy.join("summary")).unwrap();

    let server = Server::release(v1);
    let node = Ostree::init(&tmp.path().join("node"), "bare-user").unwrap();
    node.remote_add("os", &server.url, &[]).unwrap();
    let served_view = node.run(["remote", "summary", "os"]).unwrap();

    let own_refs = parse_summary_view(&own_view);
    let served_refs = parse_summary_view(&served_view);
    assert_eq!(
        own_refs.keys().collect::<Vec<_>>(),
        served_refs.keys().collect::<Vec<_>>()
    );
    for (name, own_lines) in &own_refs {
        let a: BTreeSet<&String> = own_lines.iter().collect();
        let b: BTreeSet<&String> = served_refs[name].iter().collect();
        assert_eq!(
            b, a,
            "ref {name}: `ostree remote summary` of the server differs from ostree's own summary\n--- served:\n{served_view}\n--- ostree summary -u:\n{own_view}"
        );
    }

    // Our parser reads ostree's summary and the server's alike.
    let ours = parse_summary(&server.summary_bytes().unwrap()).unwrap();
    let theirs = parse_summary(&own_bytes).unwrap();
    assert_eq!(
        ours.staging, None,
        "an oscontainer publishes no staging index"
    );
    assert_eq!(
        ours.refs, theirs.refs,
        "ref entries, parsed from the served summary and from ostree's"
    );
}

#[test]
fn summary_bytes_are_deterministic_across_instances_and_restarts() {
    let v1 = v1();
    let tmp = tempdir();
    let state_a = tmp.path().join("state-a");
    let mut a = Server::oscontainer(&v1.oscontainer)
        .state_dir(&state_a)
        .start()
        .unwrap();
    let b = Server::release(v1);
    let ra = a.get("/summary").unwrap();
    let rb = b.get("/summary").unwrap();
    assert_eq!(ra.status, 200);
    assert!(!ra.body.is_empty());
    assert_eq!(
        ra.body, rb.body,
        "two servers of the same content serve the same summary bytes"
    );
    assert_eq!(ra.header("etag"), rb.header("etag"), "and the same ETag");

    // Restart on the same state dir.
    let status = a.stop(Duration::from_secs(30)).unwrap();
    assert!(status.success(), "graceful exit: {status}");
    let a2 = Server::oscontainer(&v1.oscontainer)
        .state_dir(&state_a)
        .start()
        .unwrap();
    let ra2 = a2.get("/summary").unwrap();
    assert_eq!(ra2.body, ra.body, "a restart serves the same summary bytes");
    assert_eq!(ra2.header("etag"), ra.header("etag"));

    // The same repo served from another path with --repo.
    let copy = tmp.path().join("copy");
    copy_dir(&v1.repo, &copy).unwrap();
    let c = Server::repo(&copy).start().unwrap();
    assert_eq!(
        c.get("/summary").unwrap().body,
        ra.body,
        "--repo of a copy: same summary bytes"
    );

    // Fetching it again (HTTP/2 too) changes nothing.
    let h2 = fetch(&http2(), &b.url_for("/summary"), &[]).unwrap();
    assert_eq!(h2.body, ra.body);

    // Different content, different summary.
    let d = Server::release(v2());
    let rd = d.summary().unwrap();
    assert_ne!(d.summary_bytes().unwrap(), ra.body);
    assert_eq!(rd.refs[0].commit.to_hex(), v2().commit);
    assert_eq!(rd.refs[0].name, fixture_ref());
}
