//! `source::fetch` against a real `docker-registry` on loopback: pulls (tag,
//! digest, basic auth, mirrors, zstd, multi-platform) and tampering in the
//! registry's storage (flipped byte, truncation, forged manifest), each of
//! which must fail cleanly with nothing left behind.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod source_support;

use base64::Engine;
use oscontent_server::source::{self, FetchOptions, ImageRef, SourceError};
use source_support::*;
use std::path::Path;

fn write_authfile(dir: &Path, host: &str, user: &str, pass: &str) -> std::path::PathBuf {
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    let p = dir.join(format!("auth-{user}-{pass}.json"));
    std::fs::write(
        &p,
        format!(r#"{{"auths": {{"{host}": {{"auth": "{auth}"}}}}}}"#),
    )
    .unwrap();
    p
}

#[test]
fn pulls_by_tag_and_by_digest() {
    let reg = Registry::start();
    let os = build_oscontainer("1");
    reg.push(&os.layout, "1", "os/rhcos:4.16", &[]);
    let manifest = reg.manifest("os/rhcos", "4.16").0;
    let digest = sha256(&manifest);
    let parent = tempfile::tempdir().unwrap();
    let o = opts(&[reg.host()]);

    let s = fetch(
        &format!("docker://{}/os/rhcos:4.16", reg.host()),
        &o,
        parent.path(),
    )
    .unwrap();
    assert_eq!(s.commit, os.commit);
    assert_eq!(s.version.as_deref(), Some("1.0"));
    assert_eq!(s.labels.get(COMMIT_LABEL), Some(&os.commit));
    assert_eq!(s.manifest_digest, digest);
    assert!(s.index_digest.is_none());
    assert!(s.written_bytes > 0 && s.compressed_bytes > 0, "{s:?}");
    assert!(s.root.starts_with(parent.path()));
    assert!(s
        .root
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with(source::IMAGE_PREFIX));
    assert_staged_repo(&s.root, &os.commit);

    let by_digest = fetch(
        &format!("docker://{}/os/rhcos@{digest}", reg.host()),
        &o,
        parent.path(),
    )
    .unwrap();
    assert_eq!(by_digest.manifest_digest, digest);
    assert_eq!(by_digest.config_digest, s.config_digest);
    assert_staged_repo(&by_digest.root, &os.commit);
    assert_ne!(by_digest.root, s.root);

    // A restart cleans up everything this module left.
    source::clean_staging(parent.path()).unwrap();
    assert_empty(parent.path());

    // A tag that is not there: a clear, retryable error.
    let e = assert_failed(
        fetch(
            &format!("docker://{}/os/rhcos:nope", reg.host()),
            &o,
            parent.path(),
        ),
        parent.path(),
        &["not found", "manifests/nope", "404"],
    );
    assert!(e.is_retryable());
}

#[test]
fn basic_auth_from_an_auth_file() {
    let reg = Registry::with_auth("puller", "s3cret");
    let os = build_oscontainer("1");
    reg.push(&os.layout, "1", "os:1", &[]);
    let work = tempfile::tempdir().unwrap();
    let parent = work.path().join("staging");
    let image = format!("docker://{}/os:1", reg.host());

    let mut o = opts(&[reg.host()]);
    o.authfile = Some(write_authfile(work.path(), &reg.host(), "puller", "s3cret"));
    let s = fetch(&image, &o, &parent).unwrap();
    assert_staged_repo(&s.root, &os.commit);
    s.remove().unwrap();

    // No credentials for this registry, and wrong ones.
    let empty = work.path().join("empty.json");
    std::fs::write(&empty, r#"{"auths": {"other.io": {"auth": "dTpw"}}}"#).unwrap();
    o.authfile = Some(empty);
    let e = assert_failed(
        fetch(&image, &o, &parent),
        &parent,
        &["authentication", "auth files have none", &reg.host()],
    );
    assert!(matches!(e, SourceError::Auth { .. }), "{e:?}");

    o.authfile = Some(write_authfile(work.path(), &reg.host(), "puller", "wrong"));
    let e = assert_failed(
        fetch(&image, &o, &parent),
        &parent,
        &["credentials were rejected"],
    );
    assert!(matches!(e, SourceError::Auth { .. }), "{e:?}");

    // A missing auth file named explicitly is a configuration error.
    o.authfile = Some(work.path().join("absent.json"));
    let e = assert_failed(fetch(&image, &o, &parent), &parent, &["absent.json"]);
    assert!(matches!(e, SourceError::Config { .. }), "{e:?}");
}

#[test]
fn mirrors_when_the_primary_is_unreachable() {
    let reg = Registry::start();
    let os = build_oscontainer("1");
    // The mirror holds the image under a namespace: the prefix is rewritten.
    reg.push(&os.layout, "1", "mirrored/os:1", &[]);
    let digest = sha256(&reg.manifest("mirrored/os", "1").0);
    let work = tempfile::tempdir().unwrap();
    let conf = work.path().join("registries.conf");
    let write_conf = |pull_from: &str| {
        std::fs::write(
            &conf,
            format!(
                r#"
[[registry]]
location = "127.0.0.1:1"
insecure = true
[[registry.mirror]]
location = "127.0.0.1:2/mirrored"
insecure = true
[[registry.mirror]]
location = "{}/mirrored"
insecure = true
pull-from-mirror = "{pull_from}"
"#,
                reg.host()
            ),
        )
        .unwrap();
    };
    let parent = work.path().join("staging");
    let mut o = opts(&[]);
    o.registries_conf = Some(conf.clone());

    write_conf("all");
    let s = fetch("docker://127.0.0.1:1/os:1", &o, &parent).unwrap();
    assert_staged_repo(&s.root, &os.commit);
    assert_eq!(s.manifest_digest, digest);
    let s = fetch(&format!("docker://127.0.0.1:1/os@{digest}"), &o, &parent).unwrap();
    assert_eq!(s.manifest_digest, digest);
    source::clean_staging(&parent).unwrap();

    // Digest-only mirror, tag reference: only the dead mirror and the dead
    // primary are tried; the error lists both.
    write_conf("digest-only");
    let e = assert_failed(
        fetch("docker://127.0.0.1:1/os:1", &o, &parent),
        &parent,
        &["every source failed", "127.0.0.1:2", "127.0.0.1:1"],
    );
    assert!(e.is_retryable(), "{e:?}");
    let s = fetch(&format!("docker://127.0.0.1:1/os@{digest}"), &o, &parent).unwrap();
    assert_eq!(s.commit, os.commit);
}

#[test]
fn zstd_layers() {
    let reg = Registry::start();
    let os = build_oscontainer("1");
    let zst = os.work.path().join("oci-zstd");
    run(std::process::Command::new("skopeo")
        .args([
            "--insecure-policy",
            "copy",
            "-q",
            "--dest-compress",
            "--dest-compress-format",
            "zstd",
        ])
        .arg(format!("oci:{}:1", os.layout.display()))
        .arg(format!("oci:{}:1", zst.display())));
    reg.push(&zst, "1", "os:zstd", &[]);
    let m = String::from_utf8(reg.manifest("os", "zstd").0).unwrap();
    assert!(m.contains("tar+zstd"), "{m}");
    let parent = tempfile::tempdir().unwrap();
    let s = fetch(
        &format!("docker://{}/os:zstd", reg.host()),
        &opts(&[reg.host()]),
        parent.path(),
    )
    .unwrap();
    assert_staged_repo(&s.root, &os.commit);
}

#[test]
fn picks_the_platform_from_a_manifest_list() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("oci");
    let (amd64, commit) = repo_layer(&work.path().join("amd64"));
    let (arm64, arm_commit) = repo_layer(&work.path().join("arm64"));
    write_multiarch_layout(
        &layout,
        "multi",
        &[
            ("amd64", None, vec![amd64], commit.as_str()),
            ("arm64", Some("v8"), vec![arm64], arm_commit.as_str()),
        ],
    );
    run(std::process::Command::new("skopeo")
        .args([
            "--insecure-policy",
            "copy",
            "-q",
            "--all",
            "--dest-tls-verify=false",
        ])
        .arg(format!("oci:{}:multi", layout.display()))
        .arg(format!("docker://{}/os:multi", reg.host())));
    let parent = tempfile::tempdir().unwrap();
    let image = format!("docker://{}/os:multi", reg.host());
    let s = fetch(&image, &opts(&[reg.host()]), parent.path()).unwrap();
    assert_eq!(s.commit, commit);
    assert!(s.index_digest.is_some());
    // The refresh check resolves to the platform's manifest, not the
    // index, and fetches nothing.
    let image_ref: ImageRef = image.parse().unwrap();
    let resolved = source::resolve_digest_blocking(&image_ref, &opts(&[reg.host()])).unwrap();
    assert_eq!(resolved, s.manifest_digest);
    assert_ne!(Some(&resolved), s.index_digest.as_ref());
    let mut o = opts(&[reg.host()]);
    o.platform = "linux/arm64".parse().unwrap();
    let arm = fetch(&image, &o, parent.path()).unwrap();
    assert_eq!(arm.commit, arm_commit);
    assert_eq!(
        source::resolve_digest_blocking(&image_ref, &o).unwrap(),
        arm.manifest_digest
    );
    source::clean_staging(parent.path()).unwrap();
    o.platform = "linux/s390x".parse().unwrap();
    let e = assert_failed(
        fetch(&image, &o, parent.path()),
        parent.path(),
        &["linux/s390x", "linux/amd64, linux/arm64/v8"],
    );
    assert!(matches!(e, SourceError::NoPlatform { .. }));
}

#[test]
fn docker_schema2_manifests_and_manifest_lists() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("oci");
    let (amd64, commit) = repo_layer(&work.path().join("amd64"));
    let (arm64, arm_commit) = repo_layer(&work.path().join("arm64"));
    write_multiarch_layout(
        &layout,
        "multi",
        &[
            ("arm64", None, vec![arm64], arm_commit.as_str()),
            ("amd64", None, vec![amd64], commit.as_str()),
        ],
    );
    run(std::process::Command::new("skopeo")
        .args([
            "--insecure-policy",
            "copy",
            "-q",
            "--all",
            "--format",
            "v2s2",
            "--dest-tls-verify=false",
        ])
        .arg(format!("oci:{}:multi", layout.display()))
        .arg(format!("docker://{}/os:v2s2", reg.host())));
    let client = reqwest::blocking::Client::new();
    let list = client
        .get(format!("http://{}/v2/os/manifests/v2s2", reg.host()))
        .header(
            "Accept",
            "application/vnd.docker.distribution.manifest.list.v2+json",
        )
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        list.contains("application/vnd.docker.distribution.manifest.list.v2+json"),
        "{list}"
    );
    assert!(
        list.contains("application/vnd.docker.distribution.manifest.v2+json"),
        "{list}"
    );
    let parent = tempfile::tempdir().unwrap();
    let s = fetch(
        &format!("docker://{}/os:v2s2", reg.host()),
        &opts(&[reg.host()]),
        parent.path(),
    )
    .unwrap();
    assert_eq!(s.commit, commit);
    assert_eq!(
        s.index_digest.as_deref(),
        Some(sha256(list.as_bytes()).as_str())
    );
    assert_staged_repo(&s.root, &commit);
}

#[test]
fn a_flipped_byte_in_a_stored_blob_is_refused() {
    let reg = Registry::start();
    let os = build_oscontainer("1");
    reg.push(&os.layout, "1", "os:1", &[]);
    let layer = reg.first_layer("os", "1");
    let data = reg.blob_data(&layer);
    let mut bytes = std::fs::read(&data).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&data, &bytes).unwrap();

    let parent = tempfile::tempdir().unwrap();
    let e = assert_failed(
        fetch(
            &format!("docker://{}/os:1", reg.host()),
            &opts(&[reg.host()]),
            parent.path(),
        ),
        parent.path(),
        &[
            "digest mismatch",
            &layer,
            "layer 1/1",
            &format!("docker://{}/os:1", reg.host()),
        ],
    );
    assert!(matches!(e, SourceError::DigestMismatch { .. }), "{e:?}");
}

#[test]
fn a_truncated_blob_is_refused() {
    let reg = Registry::start();
    let os = build_oscontainer("1");
    reg.push(&os.layout, "1", "os:1", &[]);
    let layer = reg.first_layer("os", "1");
    let data = reg.blob_data(&layer);
    let len = std::fs::metadata(&data).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    let parent = tempfile::tempdir().unwrap();
    let e = assert_failed(
        fetch(
            &format!("docker://{}/os:1", reg.host()),
            &opts(&[reg.host()]),
            parent.path(),
        ),
        parent.path(),
        &["truncated", &layer],
    );
    assert!(e.is_retryable(), "{e:?}");
}

#[test]
fn a_manifest_that_does_not_match_its_digest_is_refused() {
    let reg = Registry::start();
    let os = build_oscontainer("1");
    reg.push(&os.layout, "1", "os:1", &[]);
    let digest = sha256(&reg.manifest("os", "1").0);
    let parent = tempfile::tempdir().unwrap();
    let o = opts(&[reg.host()]);

    // A digest the registry does not have.
    let other = sha256(b"not this manifest");
    assert_failed(
        fetch(
            &format!("docker://{}/os@{other}", reg.host()),
            &o,
            parent.path(),
        ),
        parent.path(),
        &["not found", &other],
    );

    // The registry serves other bytes under the digest asked for.
    let data = reg.blob_data(&digest);
    let mut bytes = std::fs::read(&data).unwrap();
    bytes.extend_from_slice(b"\n");
    std::fs::write(&data, &bytes).unwrap();
    let e = assert_failed(
        fetch(
            &format!("docker://{}/os@{digest}", reg.host()),
            &o,
            parent.path(),
        ),
        parent.path(),
        &["digest mismatch", "manifest", &digest],
    );
    assert!(matches!(e, SourceError::DigestMismatch { .. }), "{e:?}");
}

#[test]
fn an_image_without_the_commit_label_is_refused() {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let (layer, _) = repo_layer(work.path());
    let layout = work.path().join("oci");
    write_layout(&layout, "1", &[layer], &[("version", "1.0")]);
    reg.push(&layout, "1", "os:nolabel", &[]);
    let parent = tempfile::tempdir().unwrap();
    let e = assert_failed(
        fetch(
            &format!("docker://{}/os:nolabel", reg.host()),
            &opts(&[reg.host()]),
            parent.path(),
        ),
        parent.path(),
        &[COMMIT_LABEL, "missing", "config sha256:"],
    );
    assert!(!e.is_retryable());
}

#[test]
fn https_registry_without_insecure_fails_cleanly() {
    // The test registry speaks plain HTTP; without --insecure-registry the
    // client insists on TLS and must fail without leaving anything.
    let reg = Registry::start();
    let parent = tempfile::tempdir().unwrap();
    let o = FetchOptions {
        connect_timeout: std::time::Duration::from_secs(5),
        ..FetchOptions::default()
    };
    let e = assert_failed(
        fetch(&format!("docker://{}/os:1", reg.host()), &o, parent.path()),
        parent.path(),
        &["https://"],
    );
    assert!(matches!(e, SourceError::Network { .. }), "{e:?}");
}
