//! The scale-out recipe's object cache (deploy/object-cache/objects.conf),
//! run as shipped in real nginx in front of the real server: stock ostree
//! with `url` on oscontent and `contenturl` on the cache gets its metadata
//! from the origin and every object through the cache, and a second node's
//! objects come from the cache alone; `oscontent pull --remote` the same.

use oscontent_testkit::nginx::{Nginx, NginxRequest};
use oscontent_testkit::*;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The shipped file with its three deployment-specific values swapped for
/// loopback ones; each must be there exactly once, so an edit that renames
/// them fails here rather than testing something else.
fn adapt_shipped(origin: &str) -> String {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/object-cache/objects.conf");
    let mut conf = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let swaps = [
        (
            "server oscontent-server.oscontent.svc:80;",
            format!("server {origin};"),
        ),
        ("listen 8080;", "listen 127.0.0.1:PORT;".to_owned()),
        ("/var/cache/nginx/oscontent", "PREFIX/cache".to_owned()),
    ];
    for (from, to) in swaps {
        assert_eq!(
            conf.matches(from).count(),
            1,
            "{} must contain {from:?} once",
            path.display()
        );
        conf = conf.replace(from, &to);
    }
    conf
}

fn objects(reqs: &[NginxRequest]) -> Vec<&NginxRequest> {
    reqs.iter()
        .filter(|r| r.path.starts_with("/objects/"))
        .collect()
}

/// Who pulls through the cache.
#[derive(Debug, Clone, Copy)]
enum Node {
    /// `ostree pull REMOTE REF`.
    Stock,
    /// `oscontent pull --remote REMOTE --ref REF`, over HTTP/2 to the
    /// origin and HTTP/1.1 to the cache (nginx's cleartext listener).
    Oscontent,
}

fn pull(node: Node, repo: &Ostree) -> anyhow::Result<()> {
    match node {
        Node::Stock => repo.pull(&["os", TINY_REF]).map(drop),
        Node::Oscontent => {
            let mut cmd = std::process::Command::new(client_bin());
            local_only(&mut cmd)
                .arg("pull")
                .arg("--repo")
                .arg(&repo.repo)
                .args(["--remote", "os", "--ref", TINY_REF, "--json"]);
            let out = run_bounded(&mut cmd, std::time::Duration::from_secs(120))?;
            anyhow::ensure!(
                out.status.success(),
                "oscontent pull: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(())
        }
    }
}

#[test]
fn contenturl_through_the_shipped_object_cache() {
    for node in [Node::Stock, Node::Oscontent] {
        through_the_cache(node);
    }
}

fn through_the_cache(client: Node) {
    let tmp = tempdir();
    let repo = tmp.path().join("repo");
    let commit = tiny_commit(&repo, "1", Some(TINY_REF), 11).unwrap();
    let server = Server::repo(&repo).start().unwrap();
    let nginx = Nginx::start(
        &tmp.path().join("nginx"),
        &adapt_shipped(&server.addr.to_string()),
    )
    .unwrap();
    let contenturl = format!("--set=contenturl={}", nginx.url);

    let mut after_node = Vec::new();
    for node in 0..2 {
        let repo = Ostree::init(&tmp.path().join(format!("node{node}")), "bare-user").unwrap();
        repo.remote_add("os", &server.url, &["--no-gpg-verify", &contenturl])
            .unwrap();
        pull(client, &repo)
            .unwrap_or_else(|e| panic!("{client:?} node {node}: pull through the cache: {e:#}"));
        assert_eq!(repo.rev_parse(&format!("os:{TINY_REF}")).unwrap(), commit);
        repo.fsck().unwrap();
        after_node.push(nginx.requests().unwrap());
    }

    let first = objects(&after_node[0]);
    let all = objects(&after_node[1]);
    let second = &all[first.len()..];
    assert!(
        first.len() >= 4,
        "{client:?}: a commit, its trees and content came through the cache: {first:?}"
    );
    assert!(
        first.iter().all(|r| r.status == 200 && r.cache == "MISS"),
        "{client:?}: the first node filled the cache: {first:?}"
    );
    assert_eq!(
        second.len(),
        first.len(),
        "{client:?}: the second node asked the same objects"
    );
    assert!(
        second.iter().all(|r| r.status == 200 && r.cache == "HIT"),
        "{client:?}: the second node's objects came from the cache alone: {second:?}"
    );

    // The origin saw each object once (the cache's fetch) and all of the
    // metadata, detached commit metadata (where signatures live) included;
    // the cache saw no metadata.
    let origin = server.access_log().unwrap();
    let origin_objects: Vec<&str> = origin
        .iter()
        .filter(|e| e.object().is_some() && e.kind != "commitmeta")
        .map(|e| e.path.as_str())
        .collect();
    let origin_commitmeta = origin.iter().filter(|e| e.kind == "commitmeta").count();
    assert_eq!(
        origin_commitmeta, 2,
        "{client:?}: each node asked `url` for the commit's detached metadata: {origin:?}"
    );
    assert!(
        all.iter().all(|r| !r.path.ends_with(".commitmeta")),
        "{client:?}: detached metadata went through the cache: {all:?}"
    );
    let cached: BTreeSet<&str> = first.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        origin_objects.iter().copied().collect::<BTreeSet<_>>(),
        cached,
        "{client:?}: the origin served exactly the objects the cache missed"
    );
    assert_eq!(
        origin_objects.len(),
        cached.len(),
        "{client:?}: no object reached the origin twice"
    );
    let origin_config = origin.iter().filter(|e| e.kind == "config").count();
    assert_eq!(
        origin_config, 2,
        "{client:?}: each node read config from `url`: {origin:?}"
    );
    // oscontent's HTTP/2 prior-knowledge probe: nginx's cleartext
    // listener speaks HTTP/1.1 only, and logs the preface as a bad request
    // with no path. One per node, and nothing else.
    let probe = |r: &&NginxRequest| r.status == 400 && r.path == "-";
    let probes = after_node[1].iter().filter(probe).count();
    let want_probes = match client {
        Node::Stock => 0,
        Node::Oscontent => 2,
    };
    assert_eq!(probes, want_probes, "{client:?}: {:?}", after_node[1]);
    let stray: Vec<&NginxRequest> = after_node[1]
        .iter()
        .filter(|r| !probe(r))
        .filter(|r| !r.path.starts_with("/objects/") && !r.path.starts_with("/deltas/"))
        .collect();
    assert!(
        stray.is_empty(),
        "{client:?}: metadata went through the cache: {stray:?}"
    );
}
