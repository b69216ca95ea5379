//! Generations in a running server: a tag that moves is picked up (by
//! `--refresh-interval` or SIGHUP), verified, and switched to in one step;
//! a bad new image never displaces the verified one being served.

use crate::support::*;
use oscontent_testkit::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// How long a refresh may take to show (a fetch of the small fixture is a
/// second or two; the backoff is one second).
pub const SWITCH_TIMEOUT: Duration = Duration::from_secs(60);
const SOURCE_CHECKS: &str = "oscontent_source_checks_total";

pub fn checks(server: &Server, result: &str) -> f64 {
    server
        .metrics()
        .unwrap()
        .get(SOURCE_CHECKS, &[("result", result)])
        .unwrap_or(0.0)
}

/// Polls until `/refs/heads/NAME` names `commit`.
pub fn wait_for_ref(server: &Server, name: &str, commit: &str) {
    let found = poll(SWITCH_TIMEOUT, || -> anyhow::Result<Option<()>> {
        let r = server.get(&format!("/refs/heads/{name}"))?;
        Ok((r.status == 200 && String::from_utf8_lossy(&r.body).trim() == commit).then_some(()))
    })
    .unwrap();
    assert!(
        found.is_some(),
        "{name} never moved to {commit} within {SWITCH_TIMEOUT:?}\nstderr:\n{}",
        server.stderr()
    );
}

/// Polls until `f` holds for the server's metrics.
pub fn wait_for_metrics(server: &Server, what: &str, f: impl Fn(&Server) -> bool) {
    let found = poll(SWITCH_TIMEOUT, || -> anyhow::Result<Option<()>> {
        Ok(f(server).then_some(()))
    })
    .unwrap();
    assert!(
        found.is_some(),
        "{what} within {SWITCH_TIMEOUT:?}\nstderr:\n{}",
        server.stderr()
    );
}

/// A GET whose response body is left unread, to finish after a switch.
struct Held {
    stream: TcpStream,
    head: Vec<u8>,
}

impl Held {
    fn start(server: &Server, path: &str) -> Held {
        let host = server.url.trim_start_matches("http://");
        let mut stream = TcpStream::connect(host).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        // Read until the end of the head, and no further.
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert!(head.len() < 64 << 10, "response head too long");
            stream.read_exact(&mut b).unwrap();
            head.push(b[0]);
        }
        Held { stream, head }
    }

    fn finish(self) -> (String, Vec<u8>) {
        let mut body = Vec::new();
        self.stream
            .take(MAX_READ as u64)
            .read_to_end(&mut body)
            .unwrap();
        (String::from_utf8_lossy(&self.head).into_owned(), body)
    }
}

#[test]
fn a_moved_tag_becomes_a_new_generation_and_in_flight_requests_finish() {
    let (v1, v2) = (v1(), v2());
    let reg = Registry::start();
    reg.push_release(v1, "os:stable", &[]);
    let server =
        ready(image_server(&reg, &[reg.image("os:stable")]).args(["--refresh-interval", "1"]));
    assert_eq!(served_ref(&server, fixture_ref()), v1.commit);
    let (_node_dir, node) = pull_and_fsck(&server, fixture_ref(), &v1.commit);
    let first_images = names(&server.state_dir.join("images"));
    assert_eq!(first_images.len(), 1, "{first_images:?}");
    // Unchanged digests cost no fetch: a few checks go by, still generation 1.
    wait_for_metrics(&server, "two unchanged checks", |s| {
        checks(s, "unchanged") >= 2.0
    });
    assert_eq!(
        server.metrics().unwrap().get("oscontent_generation", &[]),
        Some(1.0)
    );

    // A large v1 object, its body still unread when the switch happens.
    let (big, size) = largest_filez(&v1.repo).unwrap();
    let held = Held::start(&server, &object_url_path(&big, "filez"));

    reg.push_release(v2, "os:stable", &[]);
    wait_for_ref(&server, fixture_ref(), &v2.commit);
    assert_eq!(
        server.metrics().unwrap().get("oscontent_generation", &[]),
        Some(2.0)
    );
    assert_eq!(
        checks(&server, "published"),
        2.0,
        "the first fetch and the switch"
    );
    // The refs and the summary switched together: v2's version ref is
    // there, v1's went with its generation.
    assert_eq!(
        served_ref(&server, &format!("version/{}", v2.version)),
        v2.commit
    );
    let gone = server
        .get(&format!("/refs/heads/version/{}", v1.version))
        .unwrap();
    assert_eq!(gone.status, 404, "v1's version ref is no longer published");

    let (head, body) = held.finish();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body.len() as u64, size, "the in-flight body completed");
    assert_eq!(
        body,
        std::fs::read(object_path(&v1.repo, &big, "filez")).unwrap(),
        "the in-flight body is v1's object, intact"
    );

    // The node updates through the new generation.
    node.pull(&["os", fixture_ref()]).unwrap();
    assert_eq!(
        node.rev_parse(&format!("os:{}", fixture_ref())).unwrap(),
        v2.commit
    );
    node.fsck().unwrap();

    // v1's staged image goes once no generation serves it.
    let found = poll(SWITCH_TIMEOUT, || -> anyhow::Result<Option<()>> {
        let now = names(&server.state_dir.join("images"));
        Ok((now.len() == 1 && now.is_disjoint(&first_images)).then_some(()))
    })
    .unwrap();
    assert!(
        found.is_some(),
        "v1's staging still there: {:?}",
        names(&server.state_dir.join("images"))
    );
    assert!(
        server.stderr_lines(" ERROR ").is_empty(),
        "{}",
        server.stderr()
    );
}

#[test]
fn sighup_checks_now_and_a_corrupt_new_image_keeps_the_verified_one() {
    let (v1, v2) = (v1(), v2());
    let reg = Registry::start();
    reg.push_release(v1, "os:stable", &[]);
    // No interval: only SIGHUP (and the retry after a failure) checks.
    let mut server = ready(image_server(&reg, &[reg.image("os:stable")]));
    server.sighup().unwrap();
    wait_for_metrics(&server, "an unchanged check after SIGHUP", |s| {
        checks(s, "unchanged") >= 1.0
    });

    reg.push_release(v2, "os:stable", &[]);
    let layer = reg.first_layer("os", "stable");
    let blob = reg.blob_data(&layer);
    flip_byte(&blob, 4096);
    server.sighup().unwrap();
    let errors = server
        .wait_stderr_lines(" ERROR ", 1, SWITCH_TIMEOUT)
        .unwrap();
    let short = layer.trim_start_matches("sha256:");
    assert!(
        errors
            .iter()
            .any(|l| l.contains("os:stable") && l.contains(&short[..12])),
        "the error names the image and the layer: {errors:?}"
    );
    assert!(
        errors.iter().any(|l| l.contains("previous generation")),
        "the error says what is still served: {errors:?}"
    );
    // Still serving the verified v1, ready, with nothing unverified kept.
    assert_eq!(served_ref(&server, fixture_ref()), v1.commit);
    assert_eq!(server.get("/readyz").unwrap().status, 200);
    assert_eq!(
        server.metrics().unwrap().get("oscontent_generation", &[]),
        Some(1.0)
    );
    assert!(checks(&server, "failed") >= 1.0);
    let none = poll(SWITCH_TIMEOUT, || -> anyhow::Result<Option<()>> {
        Ok(staging_dirs(&server.state_dir).is_empty().then_some(()))
    })
    .unwrap();
    assert!(none.is_some(), "{:?}", staging_dirs(&server.state_dir));
    // No trace of v2: neither its commit nor the summary mentions it.
    assert_eq!(
        server
            .get(&object_url_path(&v2.commit, "commit"))
            .unwrap()
            .status,
        404
    );
    let summary = server.get("/summary").unwrap();
    assert_eq!(summary.status, 200);
    let v2_bin = hex::decode(&v2.commit).unwrap();
    assert!(
        !summary.body.windows(32).any(|w| w == v2_bin.as_slice()),
        "the summary names v2"
    );

    // Repaired: the retry (backoff, no new signal) publishes v2.
    flip_byte(&blob, 4096);
    wait_for_ref(&server, fixture_ref(), &v2.commit);
    pull_and_fsck(&server, fixture_ref(), &v2.commit);
}

#[test]
fn sighup_republishes_a_local_oscontainer() {
    let (v1, v2) = (v1(), v2());
    let tmp = tempdir();
    let root = tmp.path().join("oscontainer");
    copy_dir(&v1.oscontainer, &root).unwrap();
    let mut server = Server::oscontainer(&root).start().unwrap();
    assert_eq!(served_ref(&server, fixture_ref()), v1.commit);

    // The volume now holds v2 (as a remounted image volume would).
    std::fs::remove_dir_all(root.join("srv/repo")).unwrap();
    copy_dir(&v2.repo, &root.join("srv/repo")).unwrap();
    server.sighup().unwrap();
    wait_for_ref(&server, fixture_ref(), &v2.commit);
    pull_and_fsck(&server, fixture_ref(), &v2.commit);

    // A broken source keeps what is served.
    std::fs::remove_dir_all(root.join("srv/repo/objects")).unwrap();
    server.sighup().unwrap();
    server
        .wait_stderr_lines("still serving the previous generation", 1, SWITCH_TIMEOUT)
        .unwrap();
    assert_eq!(served_ref(&server, fixture_ref()), v2.commit);
    assert_eq!(server.get("/readyz").unwrap().status, 200);
}

pub fn rollbacks(server: &Server, result: &str) -> f64 {
    server
        .metrics()
        .unwrap()
        .get("oscontent_rollbacks_total", &[("result", result)])
        .unwrap_or(-1.0)
}

#[test]
fn a_tag_moved_back_is_refused_unless_rollback_is_allowed() {
    let (v1, v2) = (v1(), v2());
    for allow in [false, true] {
        let reg = Registry::start();
        reg.push_release(v2, "os:stable", &[]);
        let mut cmd = image_server(&reg, &[reg.image("os:stable")]);
        if allow {
            cmd = cmd.args(["--allow-rollback"]);
        }
        let mut server = ready(cmd);
        assert_eq!(served_ref(&server, fixture_ref()), v2.commit);
        let m = server.metrics().unwrap();
        assert_eq!(
            m.get("oscontent_rollback_allowed", &[]),
            Some(f64::from(allow))
        );
        assert_eq!(rollbacks(&server, "refused"), 0.0, "shown from the start");

        // The attacker who controls the tag replays the older release.
        reg.push_release(v1, "os:stable", &[]);
        server.sighup().unwrap();
        if allow {
            wait_for_ref(&server, fixture_ref(), &v1.commit);
            assert_eq!(rollbacks(&server, "allowed"), 1.0);
            let warned = server.stderr_lines("publishing it (--allow-rollback)");
            assert!(!warned.is_empty(), "{}", server.stderr());
            continue;
        }
        let errors = server
            .wait_stderr_lines(" ERROR ", 1, SWITCH_TIMEOUT)
            .unwrap();
        assert!(
            errors.iter().any(|l| l.contains(fixture_ref())
                && l.contains(&v1.commit)
                && l.contains("still serving the previous generation")),
            "the refusal names the ref, the older commit and what is served: {errors:?}"
        );
        assert_eq!(rollbacks(&server, "refused"), 1.0);
        assert_eq!(served_ref(&server, fixture_ref()), v2.commit);
        assert_eq!(
            server.metrics().unwrap().get("oscontent_generation", &[]),
            Some(1.0)
        );
        // A fresh node still installs v2.
        pull_and_fsck(&server, fixture_ref(), &v2.commit);
        // Refused once: the same digest is not refetched and refused again.
        server.sighup().unwrap();
        wait_for_metrics(&server, "an unchanged check", |s| {
            checks(s, "unchanged") >= 1.0
        });
        assert_eq!(rollbacks(&server, "refused"), 1.0);
    }
}
