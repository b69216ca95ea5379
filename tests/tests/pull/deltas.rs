//! Static deltas the server generates between the releases it serves
//! (`--deltas`): both images of the small fixtures served at once, the
//! v1 → v2 delta published in the background, and a node at v1 updated
//! through it by stock `ostree pull` and by `oscontent pull`.

use crate::support::*;
use oscontent_format::{parse_delta_index, Checksum, DeltaName, Superblock};
use oscontent_testkit::checkout::{
    assert_same_listing, checkout, commit_closure, listing, object_difference,
};
use oscontent_testkit::proxy::{only, Action, Proxy};
use oscontent_testkit::registry::Registry;
use oscontent_testkit::signing::{self, add_signed_remote, keygen, sign};
use oscontent_testkit::*;
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// Bound on the background generation of the small fixtures' delta (a
/// second or two; debug builds on a loaded machine, much more).
const DELTA_WAIT: Duration = Duration::from_secs(180);

fn images() -> [String; 2] {
    let layout = fixtures().oci_layout.display().to_string();
    [v1(), v2()].map(|r| format!("oci:{layout}:{}", r.version))
}

/// A server of both releases with `extra` arguments, ready.
fn serve_both(extra: &[&str]) -> Server {
    serve_both_in(extra, None)
}

fn serve_both_in(extra: &[&str], state: Option<&Path>) -> Server {
    let mut b = Server::images(images()).args(extra.iter().copied());
    if let Some(s) = state {
        b = b.state_dir(s);
    }
    let mut server = b.spawn().unwrap();
    server
        .wait_ready(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr()));
    server
}

/// Waits until the generation serving the delta is published.
fn wait_delta(server: &Server) {
    server
        .wait_metric("oscontent_deltas_published", &[], 1.0, DELTA_WAIT)
        .unwrap();
}

fn v1_to_v2() -> DeltaName {
    DeltaName {
        from: Some(Checksum::from_hex(&v1().commit).unwrap()),
        to: Checksum::from_hex(&v2().commit).unwrap(),
    }
}

/// A bare-user node holding v1 as `os:REF`, for stock `ostree pull os REF`
/// (it looks the delta's source up under the remote's name).
fn stock_node_at_v1(path: &Path, url: &str, signed_by: Option<&Path>) -> Ostree {
    let node = Ostree::init(path, "bare-user").unwrap();
    let v1repo = v1().repo.display().to_string();
    node.run(["pull-local", "--untrusted", &v1repo, &v1().commit])
        .unwrap();
    match signed_by {
        Some(public) => add_signed_remote(&node, "os", url, public, true).unwrap(),
        None => node.remote_add("os", url, &[]).unwrap(),
    }
    let r = format!("os:{}", fixture_ref());
    node.run(["refs", "--create", &r, &v1().commit]).unwrap();
    node
}

/// The requests of the log since `before`, as (kind, status) counts.
fn tally(log: &[AccessEntry]) -> std::collections::BTreeMap<(String, u16), usize> {
    let mut t = std::collections::BTreeMap::new();
    for e in log {
        *t.entry((e.kind.clone(), e.status)).or_insert(0) += 1;
    }
    t
}

/// Two replicas of the same releases, each compiling the delta itself, a
/// second or more apart: a node may get the index from one and the
/// superblock and parts from the other (a Service spreads connections, a
/// cache holds either), so the bytes must be the same. libostree writes
/// the compilation time into the superblock; stock ostree then refused the
/// other replica's superblock ("Invalid checksum for static delta").
#[test]
fn replicas_serve_the_same_delta_bytes() {
    let a = serve_both(&[]);
    wait_delta(&a);
    std::thread::sleep(Duration::from_millis(1100));
    let b = serve_both(&[]);
    wait_delta(&b);
    let name = v1_to_v2();
    let get = |s: &Server, path: &str| {
        let r = raw_request(s.addr, "GET", path, &[]).unwrap();
        assert_eq!(r.status, 200, "{path}");
        r.body
    };
    let index = format!("/{}", DeltaName::index_path(&name.to));
    assert_eq!(get(&a, &index), get(&b, &index), "delta index");
    let superblock = format!("/{}/superblock", name.dir());
    let sb = get(&a, &superblock);
    assert_eq!(sb, get(&b, &superblock), "superblock");
    let parts = Superblock::parse(&sb).unwrap().parts.len();
    assert!(parts > 0);
    for i in 0..parts {
        let part = format!("/{}/{i}", name.dir());
        assert_eq!(get(&a, &part), get(&b, &part), "part {i}");
    }
}

#[test]
fn both_clients_update_through_the_generated_delta_and_the_summary_does_not_change() {
    let server = serve_both(&[]);
    let before_deltas = server.summary_bytes().unwrap();
    wait_delta(&server);
    let summary = server.summary_bytes().unwrap();
    assert_eq!(
        summary, before_deltas,
        "the summary changed when the delta appeared"
    );
    let parsed = server.summary().unwrap();
    assert!(
        parsed.indexed_deltas,
        "the summary points clients at delta indexes"
    );
    assert!(parsed.deltas.is_empty(), "{:?}", parsed.deltas);

    // The index lists the delta with its superblock's checksum.
    let name = v1_to_v2();
    let index = server
        .get(&format!("/{}", DeltaName::index_path(&name.to)))
        .unwrap();
    assert_eq!(index.status, 200);
    let listed = parse_delta_index(&index.body).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].name, name);
    let sb = server.get(&format!("/{}/superblock", name.dir())).unwrap();
    assert_eq!(sb.status, 200);
    assert_eq!(Checksum::digest(&sb.body), listed[0].superblock);

    // Stock ostree 2022.7 fetches the index, the superblock and the parts.
    let tmp = tempdir();
    let node = stock_node_at_v1(&tmp.path().join("stock"), &server.url, None);
    let start = server.access_log().unwrap().len();
    let out = node.pull(&["os", fixture_ref()]).unwrap();
    let log = server.access_log().unwrap()[start..].to_vec();
    let t = tally(&log);
    eprintln!(
        "stock ostree pull v1 -> v2: {} requests {t:?}\n{out}",
        log.len()
    );
    assert!(
        out.contains("delta parts"),
        "stock ostree did not use the delta: {out}"
    );
    assert_eq!(t.get(&("delta_index".into(), 200)), Some(&1), "{t:?}");
    assert!(log
        .iter()
        .any(|e| e.path.ends_with("/superblock") && e.status == 200));
    assert!(log
        .iter()
        .any(|e| e.path.ends_with(&format!("{}/0", name.dir())) && e.status == 200));
    assert_eq!(
        node.rev_parse(&format!("os:{}", fixture_ref())).unwrap(),
        v2().commit
    );
    node.fsck().unwrap();
    let (ours, want) = (tmp.path().join("co-node"), tmp.path().join("co-v2"));
    checkout(&node, &v2().commit, &ours).unwrap();
    checkout(&Ostree::at(&v2().repo), &v2().commit, &want).unwrap();
    assert_same_listing(
        &listing(&ours).unwrap(),
        &listing(&want).unwrap(),
        "node",
        "v2",
    );

    // oscontent pull takes it from the index too, and fetches nothing loose.
    let repo = repo_at_v1(&tmp.path().join("ours")).unwrap();
    let start = server.access_log().unwrap().len();
    let out = run_client(&pull_args(&repo.repo, &server.url, fixture_ref(), &[]));
    let evs = expect_ok(&out, "oscontent pull through the delta");
    let log = server.access_log().unwrap()[start..].to_vec();
    eprintln!(
        "oscontent pull v1 -> v2: {} requests {:?}",
        log.len(),
        tally(&log)
    );
    assert_eq!(event(&evs, "delta")["from"], v1().commit.as_str());
    assert_eq!(event(&evs, "done")["delta"], true);
    assert!(
        !log.iter().any(|e| e.kind == "filez" || e.kind == "dirtree"),
        "objects fetched loose despite the delta: {:?}",
        tally(&log)
    );
    assert!(log.len() <= 10, "{} requests: {:?}", log.len(), tally(&log));
    // A few requests in a row: one HTTP/1.1 keep-alive connection, the part
    // sent by sendfile. HTTP/2 is never tried, as no object is fetched.
    let versions: BTreeSet<&str> = log.iter().map(|e| e.version.as_str()).collect();
    assert_eq!(versions, BTreeSet::from(["HTTP/1.1"]), "{log:?}");
    assert_eq!(event(&evs, "start")["protocol"], "HTTP/1.1");
    assert!(event(&evs, "done")["objects_protocol"].is_null());
    let loose = objects_new_bytes(&server);
    let delta: u64 = log
        .iter()
        .filter(|e| e.kind == "delta")
        .map(|e| e.bytes)
        .sum();
    eprintln!("delta {delta} bytes, the loose objects it replaces {loose} bytes");
    assert!(
        delta as f64 <= 1.1 * loose as f64,
        "delta {delta} > 1.1 x loose {loose}"
    );
    assert_eq!(repo.rev_parse(fixture_ref()).unwrap(), v2().commit);
    repo.fsck().unwrap();
}

/// Bytes of the objects v2 has and v1 lacks, as the server serves them:
/// what a node fetches loose without a delta.
fn objects_new_bytes(server: &Server) -> u64 {
    let (a, b) = (Ostree::at(&v1().repo), Ostree::at(&v2().repo));
    let new = object_difference(
        &commit_closure(&b, &v2().commit).unwrap(),
        &commit_closure(&a, &v1().commit).unwrap(),
    );
    let mut total = 0;
    for (kind, checksums) in &new.0 {
        // The commit comes embedded in the superblock either way.
        let ext = match kind.as_str() {
            "commit" => continue,
            "dirtree" | "dirmeta" => kind.as_str(),
            _ => "filez",
        };
        for c in checksums {
            let path = format!("/objects/{}/{}.{ext}", &c[..2], &c[2..]);
            let r = server.get(&path).unwrap();
            assert_eq!(r.status, 200, "{path}");
            total += r.body.len() as u64;
        }
    }
    total
}

#[test]
fn a_tampered_part_is_refused_by_both_clients_and_the_ref_stays() {
    let server = serve_both(&[]);
    wait_delta(&server);
    let part = format!("/{}/0", v1_to_v2().dir());
    let genuine = server.get(&part).unwrap().body;
    let mut bad = genuine.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x55;
    let proxy = Proxy::start(&server.url, only(&part, Action::Bytes(bad.into()))).unwrap();
    let tmp = tempdir();

    let node = stock_node_at_v1(&tmp.path().join("stock"), &proxy.url, None);
    let err = node.pull(&["os", fixture_ref()]).unwrap_err();
    eprintln!("stock ostree: {err:#}");
    assert_eq!(
        node.rev_parse(&format!("os:{}", fixture_ref())).unwrap(),
        v1().commit
    );

    let repo = repo_at_v1(&tmp.path().join("ours")).unwrap();
    let out = run_client(&pull_args(&repo.repo, &proxy.url, fixture_ref(), &[]));
    expect_code(&out, 3, "oscontent pull of a tampered delta part");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("delta part 0"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(repo.rev_parse(fixture_ref()).unwrap(), v1().commit);
    assert!(
        proxy.requests().iter().any(|p| p.contains(&part)),
        "{:?}",
        proxy.requests()
    );
}

#[test]
fn signed_summaries_still_verify_and_sign_reproduces_them_after_deltas_appear() {
    let tmp = tempdir();
    let key = keygen(&tmp.path().join("keys"), "release", &[]).unwrap();
    let sign_key = key.secret.display().to_string();
    // Only pinned images are signed: both releases by digest.
    let reg = Registry::start();
    let mut source = Vec::new();
    for r in [v1(), v2()] {
        let name = format!("os:{}", r.version);
        reg.push_release(r, &name, &[]);
        source.push("--image".to_owned());
        source.push(reg.image(&format!("os@{}", reg.digest(&name))));
    }
    source.extend(["--insecure-registry".to_owned(), reg.host()]);
    let mut server = Server::images(Vec::<String>::new())
        .args(&source)
        .args(["--sign-key", &sign_key])
        .spawn()
        .unwrap();
    server
        .wait_ready(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr()));
    wait_delta(&server);
    let summary = server.summary_bytes().unwrap();
    // `sign`, run where the key lives, signs exactly these bytes.
    let bundle = tmp.path().join("bundle");
    let manifest = sign(&source, &key, &bundle).unwrap();
    assert_eq!(
        signing::manifest_summary_sha256(&manifest),
        Checksum::digest(&summary).to_hex()
    );
    // Stock ostree verifies the summary and the commit (embedded in the
    // superblock) with the key, and takes the delta.
    let node = stock_node_at_v1(&tmp.path().join("node"), &server.url, Some(&key.public));
    let out = node.pull(&["os", fixture_ref()]).unwrap();
    assert!(out.contains("delta parts"), "{out}");
    assert_eq!(
        node.rev_parse(&format!("os:{}", fixture_ref())).unwrap(),
        v2().commit
    );
    node.fsck().unwrap();
}

#[test]
fn deltas_none_publishes_none_and_the_same_summary() {
    let none = serve_both(&["--deltas", "none"]);
    let with = serve_both(&[]);
    wait_delta(&with);
    assert_eq!(none.summary_bytes().unwrap(), with.summary_bytes().unwrap());
    let m = none.metrics().unwrap();
    for result in ["generated", "reused", "failed"] {
        assert_eq!(
            m.get("oscontent_deltas_total", &[("result", result)]),
            Some(0.0)
        );
    }
    let index = format!("/{}", DeltaName::index_path(&v1_to_v2().to));
    assert_eq!(none.get(&index).unwrap().status, 404);
    assert_eq!(
        none.get(&format!("/{}/superblock", v1_to_v2().dir()))
            .unwrap()
            .status,
        404
    );
    assert!(
        !none.state_dir.join("deltas").exists(),
        "--deltas none wrote deltas/"
    );
    // A stock pull finds no delta (one 404 for the index) and fetches
    // objects.
    let tmp = tempdir();
    let node = stock_node_at_v1(&tmp.path().join("node"), &none.url, None);
    let out = node.pull(&["os", fixture_ref()]).unwrap();
    assert!(!out.contains("delta parts"), "{out}");
    assert_eq!(
        node.rev_parse(&format!("os:{}", fixture_ref())).unwrap(),
        v2().commit
    );
}

#[test]
fn a_restart_reuses_the_delta_and_a_corrupt_one_is_made_again() {
    let tmp = tempdir();
    let state = tmp.path().join("state");
    let mut first = serve_both_in(&[], Some(&state));
    wait_delta(&first);
    first.stop(Duration::from_secs(30)).unwrap();
    let second = serve_both_in(&[], Some(&state));
    second
        .wait_metric(
            "oscontent_deltas_total",
            &[("result", "reused")],
            1.0,
            DELTA_WAIT,
        )
        .unwrap();
    let m = second.metrics().unwrap();
    assert_eq!(
        m.get("oscontent_deltas_total", &[("result", "generated")]),
        Some(0.0)
    );
    drop(second);
    // A part changed on disk fails verification: generated again.
    let part = std::fs::read_dir(state.join("deltas"))
        .unwrap()
        .map(|e| e.unwrap().path().join(v1_to_v2().dir()).join("0"))
        .find(|p| p.is_file())
        .expect("the stored delta's part 0");
    let mut bytes = std::fs::read(&part).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&part, bytes).unwrap();
    let third = serve_both_in(&[], Some(&state));
    third
        .wait_metric(
            "oscontent_deltas_total",
            &[("result", "generated")],
            1.0,
            DELTA_WAIT,
        )
        .unwrap();
    wait_delta(&third);
    drop(third);
    // With --deltas none, what was stored is removed.
    let none = serve_both_in(&["--deltas", "none"], Some(&state));
    let emptied = poll(DELTA_WAIT, || {
        let left = std::fs::read_dir(state.join("deltas"))?.count();
        std::io::Result::Ok((left == 0).then_some(()))
    })
    .unwrap();
    assert!(emptied.is_some(), "stored deltas left with --deltas none");
    assert_eq!(none.get("/summary").unwrap().status, 200);
}

/// An archive repo holding both releases, `REF` at v2 and `version/1` at
/// v1; with `ostree summary -u` when `own_summary`.
fn repo_of_both(dir: &Path, own_summary: bool) -> Ostree {
    let repo = Ostree::init(dir, "archive").unwrap();
    for r in [v1(), v2()] {
        repo.run(["pull-local", &r.repo.display().to_string(), &r.commit])
            .unwrap();
    }
    repo.run(["refs", "--create", fixture_ref(), &v2().commit])
        .unwrap();
    repo.run(["refs", "--create", "version/1", &v1().commit])
        .unwrap();
    if own_summary {
        repo.run(["summary", "-u"]).unwrap();
    }
    repo
}

#[test]
fn a_repo_served_with_its_own_summary_gets_no_generated_delta() {
    let tmp = tempdir();
    let derived = repo_of_both(&tmp.path().join("derived"), false);
    let pinned = repo_of_both(&tmp.path().join("pinned"), true);
    let with_own = Server::repo(&pinned.repo).start().unwrap();
    // The control: the same refs with a summary the server derives get
    // the delta, in about the time the other server had to make one.
    let control = Server::repo(&derived.repo).start().unwrap();
    wait_delta(&control);
    assert!(control.summary().unwrap().indexed_deltas);

    // The repo's own summary is served as it is, and listing deltas is
    // the source's business: a summary without the indexed-deltas flag
    // would send stock ostree to an unlisted superblock, which a signed
    // summary makes an error, so none is generated.
    let served = with_own.summary_bytes().unwrap();
    assert_eq!(served, std::fs::read(pinned.repo.join("summary")).unwrap());
    let sb = format!("/{}/superblock", v1_to_v2().dir());
    assert_eq!(with_own.get(&sb).unwrap().status, 404);
    let m = with_own.metrics().unwrap();
    assert_eq!(m.get("oscontent_deltas_published", &[]), Some(0.0));
    assert_eq!(
        m.get("oscontent_deltas_total", &[("result", "generated")]),
        Some(0.0)
    );
}

#[test]
fn a_failed_round_is_counted_and_serving_goes_on_without_deltas() {
    let tmp = tempdir();
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    // Where the deltas directory goes, a file: the round cannot start.
    std::fs::write(state.join("deltas"), b"in the way").unwrap();
    let server = serve_both_in(&[], Some(&state));
    server
        .wait_metric(
            "oscontent_deltas_total",
            &[("result", "failed")],
            1.0,
            DELTA_WAIT,
        )
        .unwrap();
    assert!(
        !server
            .stderr_lines("static deltas not generated")
            .is_empty(),
        "{}",
        server.stderr()
    );
    let m = server.metrics().unwrap();
    assert_eq!(m.get("oscontent_deltas_published", &[]), Some(0.0));
    assert_eq!(m.get("oscontent_ready", &[]), Some(1.0));
    // Nodes update through objects.
    let node = stock_node_at_v1(&tmp.path().join("node"), &server.url, None);
    let out = node.pull(&["os", fixture_ref()]).unwrap();
    assert!(!out.contains("delta parts"), "{out}");
    assert_eq!(
        node.rev_parse(&format!("os:{}", fixture_ref())).unwrap(),
        v2().commit
    );
    node.fsck().unwrap();
}
