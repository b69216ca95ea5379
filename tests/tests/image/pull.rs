//! Images fetched through the server from a real registry, an OCI layout
//! and an OCI archive, then pulled with stock ostree.

use crate::support::*;
use oscontent_testkit::*;
use std::collections::BTreeSet;

#[test]
fn pull_by_tag() {
    let v1 = v1();
    let reg = Registry::start();
    reg.push_release(v1, "os:v1", &[]);
    let server = ready(image_server(&reg, &[reg.image("os:v1")]));
    assert_eq!(served_ref(&server, fixture_ref()), v1.commit);
    assert_eq!(
        served_ref(&server, &format!("version/{}", v1.version)),
        v1.commit
    );
    pull_and_fsck(&server, fixture_ref(), &v1.commit);
    // Verified, published, and nothing left half-done.
    let images = names(&server.state_dir.join("images"));
    assert_eq!(images.len(), 1, "one staged image: {images:?}");
    assert!(images.iter().all(|n| n.starts_with("image-")), "{images:?}");
    assert!(
        server.stderr_lines(" ERROR ").is_empty(),
        "{}",
        server.stderr()
    );
}

#[test]
fn pull_by_digest_with_a_docker_schema2_manifest() {
    let v1 = v1();
    let reg = Registry::start();
    reg.push_release(v1, "os:v1", &["--format", "v2s2"]);
    let digest = reg.digest("os:v1");
    let (body, header) = reg.manifest("os", "v1");
    assert_eq!(
        digest, header,
        "skopeo and the registry agree on the digest"
    );
    let m: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        m["mediaType"], "application/vnd.docker.distribution.manifest.v2+json",
        "pushed as Docker schema2"
    );
    let server = ready(image_server(&reg, &[reg.image(&format!("os@{digest}"))]));
    assert_eq!(served_ref(&server, fixture_ref()), v1.commit);
    pull_and_fsck(&server, fixture_ref(), &v1.commit);
}

#[test]
fn pull_with_basic_auth_from_authfile_and_env() {
    let v1 = v1();
    let reg = Registry::with_auth("e2e-user", "e2e-secret-pass");
    reg.push_release(v1, "os:v1", &[]);
    let tmp = tempdir();
    let good = tmp.path().join("auth.json");
    write_authfile(&good, &reg.host(), "e2e-user", "e2e-secret-pass");
    // No credentials anywhere else: an empty home.
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let isolated = |b: ServerBuilder| {
        b.env("HOME", &home)
            .env("XDG_CONFIG_HOME", home.join(".config"))
            .env("XDG_RUNTIME_DIR", home.join("run"))
    };
    let image = reg.image("os:v1");

    // --authfile.
    let server = ready(isolated(
        image_server(&reg, std::slice::from_ref(&image))
            .arg("--authfile")
            .arg(&good),
    ));
    pull_and_fsck(&server, fixture_ref(), &v1.commit);
    drop(server);

    // REGISTRY_AUTH_FILE.
    let server = ready(isolated(
        image_server(&reg, std::slice::from_ref(&image)).env("REGISTRY_AUTH_FILE", &good),
    ));
    pull_and_fsck(&server, fixture_ref(), &v1.commit);
    drop(server);

    // A wrong password: refused by the registry, nothing served, retried;
    // the password is never logged.
    let bad = tmp.path().join("bad.json");
    write_authfile(&bad, &reg.host(), "e2e-user", "wrong-password");
    let mut server = isolated(
        image_server(&reg, std::slice::from_ref(&image))
            .arg("--authfile")
            .arg(&bad),
    )
    .spawn()
    .unwrap();
    let line = assert_fails_cleanly(&mut server, &[&image], &[&v1.commit], &[fixture_ref()]);
    assert!(
        line.to_lowercase().contains("auth") || line.contains("401"),
        "the error says authentication failed: {line}"
    );
    assert!(
        !server.stderr().contains("wrong-password"),
        "the password was logged"
    );
}

#[test]
fn pull_through_a_mirror_when_the_primary_is_unreachable() {
    let v1 = v1();
    let reg = Registry::start();
    reg.push_release(v1, "mirrored/os:v1", &[]);
    // Nothing listens on port 1 of the loopback.
    let dead = "127.0.0.1:1".to_owned();
    let tmp = tempdir();
    let conf = tmp.path().join("registries.conf");
    std::fs::write(
        &conf,
        format!(
            "[[registry]]\nlocation = \"{dead}/os\"\ninsecure = true\n\n[[registry.mirror]]\nlocation = \"{}/mirrored/os\"\ninsecure = true\n",
            reg.host()
        ),
    )
    .unwrap();
    let image = format!("docker://{dead}/os:v1");
    let server = ready(
        Server::images([&image])
            .arg("--registries-conf")
            .arg(&conf)
            .args(["--max-backoff", "1"]),
    );
    assert_eq!(served_ref(&server, fixture_ref()), v1.commit);
    pull_and_fsck(&server, fixture_ref(), &v1.commit);

    // Without the mirror configuration the same image cannot be fetched.
    let mut alone = Server::images([&image])
        .args(["--insecure-registry", &dead, "--max-backoff", "1"])
        .spawn()
        .unwrap();
    assert_fails_cleanly(&mut alone, &[&image], &[&v1.commit], &[fixture_ref()]);
}

#[test]
fn pull_zstd_layers() {
    let v2 = v2();
    let reg = Registry::start();
    reg.push_release(v2, "os:v2-zstd", &["--dest-compress-format", "zstd"]);
    let m = reg.manifest_json("os", "v2-zstd");
    let media = m["layers"][0]["mediaType"].as_str().unwrap().to_owned();
    assert!(media.ends_with("+zstd"), "pushed with zstd layers: {media}");
    let server = ready(image_server(&reg, &[reg.image("os:v2-zstd")]));
    pull_and_fsck(&server, fixture_ref(), &v2.commit);
}

#[test]
fn pull_from_an_oci_layout() {
    let v1 = v1();
    let layout = &fixtures().oci_layout;
    let before = snapshot(layout).unwrap();
    let server = ready(
        Server::images([format!("oci:{}:{}", layout.display(), v1.version)])
            .args(["--max-backoff", "1"]),
    );
    pull_and_fsck(&server, fixture_ref(), &v1.commit);
    // Only an ostree-native image is published for staging.
    assert_eq!(server.summary().unwrap().staging, None);
    drop(server);
    assert_unchanged(layout, &before, "serving from an OCI layout");
}

#[test]
fn pull_from_an_oci_archive() {
    let v2 = v2();
    let tmp = tempdir();
    let archive = tmp.path().join("os.tar");
    skopeo(&[
        "copy",
        "-q",
        &format!("oci:{}:{}", fixtures().oci_layout.display(), v2.version),
        &format!("oci-archive:{}:{}", archive.display(), v2.version),
    ]);
    let before = snapshot(tmp.path()).unwrap();
    let server = ready(
        Server::images([format!("oci-archive:{}:{}", archive.display(), v2.version)])
            .args(["--max-backoff", "1"]),
    );
    pull_and_fsck(&server, fixture_ref(), &v2.commit);
    drop(server);
    assert_unchanged(tmp.path(), &before, "serving from an OCI archive");
}

/// Object checksums of `.filez` requests answered 200, from `from` on.
fn filez_fetched(log: &[AccessEntry], from: usize) -> BTreeSet<String> {
    log[from..]
        .iter()
        .filter(|e| e.status == 200)
        .filter_map(|e| e.object())
        .filter(|(_, ext)| ext == "filez")
        .map(|(c, _)| c)
        .collect()
}

/// Index just past a `GET /healthz` sent (and logged) after every request
/// so far.
fn log_mark(server: &Server) -> usize {
    let r = server.get("/healthz").unwrap();
    assert_eq!(r.status, 200);
    let found = wait_for(
        std::time::Duration::from_secs(10),
        std::time::Duration::from_millis(20),
        || {
            let log = server.access_log().ok()?;
            log.iter()
                .rposition(|e| e.path.starts_with("/healthz"))
                .map(|i| i + 1)
        },
    );
    found.expect("the /healthz mark reaches the access log")
}

#[test]
fn two_releases_at_once_and_a_node_updates_fetching_only_missing_objects() {
    let (v1, v2) = (v1(), v2());
    let reg = Registry::start();
    reg.push_release(v1, "os:v1", &[]);
    reg.push_release(v2, "os:v2", &[]);
    // Loose objects only: the update through the generated delta is
    // tests/tests/pull/deltas.rs's.
    let server = ready(
        image_server(&reg, &[reg.image("os:v1"), reg.image("os:v2")]).args(["--deltas", "none"]),
    );
    // The bound ref is the newest release; each release has its version ref.
    assert_eq!(served_ref(&server, fixture_ref()), v2.commit);
    let v1_ref = format!("version/{}", v1.version);
    let v2_ref = format!("version/{}", v2.version);
    assert_eq!(served_ref(&server, &v1_ref), v1.commit);
    assert_eq!(served_ref(&server, &v2_ref), v2.commit);
    let images = names(&server.state_dir.join("images"));
    assert_eq!(images.len(), 2, "two staged images: {images:?}");

    // A node with v1, pulled by checksum.
    let tmp = tempdir();
    let node = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    node.remote_add("os", &server.url, &[]).unwrap();
    let listed = node.run(["remote", "refs", "os"]).unwrap();
    for r in [fixture_ref(), v1_ref.as_str(), v2_ref.as_str()] {
        assert!(
            listed.lines().any(|l| l.trim() == format!("os:{r}")),
            "the summary lists {r}:\n{listed}"
        );
    }
    node.pull(&["os", &v1.commit]).unwrap();
    node.fsck().unwrap();
    let had = node.objects().unwrap();
    assert!(had.contains("commit", &v1.commit));
    let mark = log_mark(&server);

    // It updates to v2 through the bound ref, fetching only what it lacks.
    node.pull(&["os", fixture_ref()]).unwrap();
    assert_eq!(
        node.rev_parse(&format!("os:{}", fixture_ref())).unwrap(),
        v2.commit
    );
    node.fsck().unwrap();
    let log = server.access_log().unwrap();
    let fetched = filez_fetched(&log, mark);
    let had_content = had.get(CONTENT);
    let again: Vec<&String> = fetched.intersection(&had_content).collect();
    assert!(
        again.is_empty(),
        "the update fetched {} content objects the node already had, e.g. {:?}",
        again.len(),
        again.iter().take(5).collect::<Vec<_>>()
    );
    assert!(!fetched.is_empty(), "the update fetched v2's new content");
    let v2_content = list_objects(&v2.repo).unwrap().get(CONTENT);
    assert!(
        fetched.len() < v2_content.len() / 2,
        "an update fetches a small part of v2 ({} of {} content objects)",
        fetched.len(),
        v2_content.len()
    );
    assert!(
        log[mark..]
            .iter()
            .any(|e| e.status == 200 && e.object() == Some((v2.commit.clone(), "commit".into()))),
        "the update fetched v2's commit"
    );

    // The older release stays reachable by its version ref for clients
    // that do not insist on the binding.
    node.pull(&["--disable-verify-bindings", "os", &v1_ref])
        .unwrap();
    assert_eq!(node.rev_parse(&format!("os:{v1_ref}")).unwrap(), v1.commit);
}
