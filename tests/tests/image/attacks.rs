//! Attacks and corruption: each must leave nothing outside the state dir,
//! no staging leftovers, nothing served, a clear error naming the image,
//! the object and the reason, and a server that keeps retrying. Some are
//! then repaired while the server retries, and it becomes ready.

use crate::support::*;
use oscontent_testkit::*;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

/// A unique name for files an escape would create.
fn nonce(what: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("oscontent-e2e-{what}-{}-{t}", std::process::id())
}

/// Pushes a crafted image as `os:TAG`; returns the image reference.
fn push_crafted(reg: &Registry, c: &Crafted, tag: &str) -> String {
    reg.push(&c.layout, &c.tag, &format!("os:{tag}"), &[]);
    reg.image(&format!("os:{tag}"))
}

#[test]
fn a_flipped_byte_in_a_stored_blob_is_refused_and_served_once_repaired() {
    let c = crafted(8, |t| t);
    let reg = Registry::start();
    let image = push_crafted(&reg, &c, "flip");
    let layer = reg.first_layer("os", "flip");
    let data = reg.blob_data(&layer);
    let len = std::fs::metadata(&data).unwrap().len();
    flip_byte(&data, len / 2);
    let mut server = image_server(&reg, std::slice::from_ref(&image))
        .spawn()
        .unwrap();
    assert_fails_cleanly(
        &mut server,
        &[&image, "layer 1/1", &layer, "digest mismatch"],
        &[&c.commit],
        &[TINY_REF],
    );

    // Repaired while the server retries: a later attempt succeeds.
    flip_byte(&data, len / 2);
    server
        .wait_ready(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e:#}"));
    pull_and_fsck(&server, TINY_REF, &c.commit);
    let images = names(&server.state_dir.join("images"));
    assert_eq!(images.len(), 1, "{images:?}");
    assert!(staging_dirs(&server.state_dir).is_empty());
}

#[test]
fn a_truncated_blob_is_refused_and_served_once_repaired() {
    let c = crafted(1, |t| t);
    let reg = Registry::start();
    let image = push_crafted(&reg, &c, "t");
    let layer = reg.first_layer("os", "t");
    let data = reg.blob_data(&layer);
    let original = std::fs::read(&data).unwrap();
    std::fs::write(&data, &original[..original.len() / 2]).unwrap();
    let mut server = image_server(&reg, std::slice::from_ref(&image))
        .spawn()
        .unwrap();
    let line = assert_fails_cleanly(
        &mut server,
        &[&image, "layer 1/1", &layer],
        &[&c.commit],
        &[TINY_REF],
    );
    assert!(
        line.contains("truncated"),
        "the error says the blob is short: {line}"
    );

    std::fs::write(&data, &original).unwrap();
    server
        .wait_ready(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e:#}"));
    pull_and_fsck(&server, TINY_REF, &c.commit);
}

#[test]
fn a_wrong_or_tampered_manifest_is_refused() {
    let c = crafted(2, |t| t);
    let reg = Registry::start();
    let image = push_crafted(&reg, &c, "m");
    let digest = reg.digest("os:m");

    // A digest that names something else: nothing by that digest.
    let other = format!("sha256:{}", sha256_hex(b"not this image"));
    let wrong = reg.image(&format!("os@{other}"));
    let mut server = image_server(&reg, std::slice::from_ref(&wrong))
        .spawn()
        .unwrap();
    assert_fails_cleanly(
        &mut server,
        &[&wrong, "manifest"],
        &[&c.commit],
        &[TINY_REF],
    );
    drop(server);

    // The stored manifest tampered with (still valid JSON, same meaning):
    // the registry serves it under the old digest.
    let stored = reg.blob_data(&digest);
    let original = std::fs::read(&stored).unwrap();
    let text = String::from_utf8(original.clone()).unwrap();
    let tampered = text.replacen("\"schemaVersion\":2", "\"schemaVersion\": 2", 1);
    assert_ne!(tampered, text, "manifest {text}");
    std::fs::write(&stored, &tampered).unwrap();
    let (served, header) = reg.manifest("os", &digest);
    assert_eq!(
        served,
        tampered.as_bytes(),
        "the registry serves the tampered bytes"
    );
    assert_eq!(header, digest, "under the original digest");

    // Pulled by digest: the bytes do not hash to it.
    let by_digest = reg.image(&format!("os@{digest}"));
    let mut server = image_server(&reg, std::slice::from_ref(&by_digest))
        .spawn()
        .unwrap();
    assert_fails_cleanly(
        &mut server,
        &[&by_digest, "manifest", "digest mismatch", &digest],
        &[&c.commit],
        &[TINY_REF],
    );
    drop(server);

    // Pulled by tag: the bytes do not hash to the advertised digest.
    let mut server = image_server(&reg, std::slice::from_ref(&image))
        .spawn()
        .unwrap();
    assert_fails_cleanly(
        &mut server,
        &[&image, "manifest", "digest mismatch"],
        &[&c.commit],
        &[TINY_REF],
    );
}

/// Reads a blob of an OCI layout as JSON.
fn layout_json(layout: &Path, digest: &str) -> serde_json::Value {
    let p = layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").unwrap());
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn a_label_commit_that_does_not_match_the_repo_is_refused() {
    // v2's image (its very layer blob), relabelled as v1's commit, in a new
    // OCI layout: what `umoci config --config.label` does, without copying
    // the 27 MB layer.
    let (v1, v2) = (v1(), v2());
    let fixture = &fixtures().oci_layout;
    let manifest = layout_json(fixture, &v2.image_manifest);
    let mut config = layout_json(fixture, manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(config["config"]["Labels"][COMMIT_LABEL], v2.commit.as_str());
    config["config"]["Labels"][COMMIT_LABEL] = v1.commit.clone().into();
    let tmp = tempdir();
    let layout = tmp.path().join("oci");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let layer = manifest["layers"][0]["digest"].as_str().unwrap();
    let hex = layer.strip_prefix("sha256:").unwrap();
    let src = fixture.join("blobs/sha256").join(hex);
    if std::fs::hard_link(&src, blobs.join(hex)).is_err() {
        std::fs::copy(&src, blobs.join(hex)).unwrap();
    }
    let put = |bytes: &[u8]| -> (String, usize) {
        let h = sha256_hex(bytes);
        std::fs::write(blobs.join(&h), bytes).unwrap();
        (format!("sha256:{h}"), bytes.len())
    };
    let (cd, cn) = put(&serde_json::to_vec(&config).unwrap());
    let mut manifest = manifest.clone();
    manifest["config"]["digest"] = cd.into();
    manifest["config"]["size"] = cn.into();
    let (md, mn) = put(&serde_json::to_vec(&manifest).unwrap());
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": OCI_MANIFEST, "digest": md, "size": mn,
        "annotations": {"org.opencontainers.image.ref.name": "relabelled"},
    }]});
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    // skopeo reads it as an image with v1's commit label.
    let inspected = skopeo(&["inspect", &format!("oci:{}:relabelled", layout.display())]);
    assert!(inspected.contains(&v1.commit), "{inspected}");

    let image = format!("oci:{}:relabelled", layout.display());
    let mut server = Server::images([&image])
        .args(["--max-backoff", "1"])
        .spawn()
        .unwrap();
    assert_fails_cleanly(
        &mut server,
        &[&image, COMMIT_LABEL, &v1.commit],
        &[&v1.commit, &v2.commit],
        &[fixture_ref()],
    );
}

#[test]
fn a_label_naming_one_of_two_commits_in_the_repo_is_refused() {
    // The commit the label names is in the repo, but so is another: the
    // image is not the one commit it claims to be. This fails after the
    // image is staged, at publication; the staged tree goes too.
    let work = tempdir();
    let repo = work.path().join("repo");
    let commits = tiny_repo(
        &repo,
        &[
            TinyCommit {
                version: "1.0",
                bind_ref: Some(TINY_REF),
                seed: 10,
            },
            TinyCommit {
                version: "2.0",
                bind_ref: Some(TINY_REF),
                seed: 11,
            },
        ],
    )
    .unwrap();
    let tar = Tar::new().dir("srv").tree("srv/repo", &repo).finish();
    let layout = work.path().join("oci");
    write_layout(
        &layout,
        "two",
        &[Layer::gz(tar)],
        &[(COMMIT_LABEL, &commits[0]), ("version", "1.0")],
    );
    let reg = Registry::start();
    reg.push(&layout, "two", "os:two", &[]);
    let image = reg.image("os:two");
    let mut server = image_server(&reg, std::slice::from_ref(&image))
        .spawn()
        .unwrap();
    let line = assert_fails_cleanly(
        &mut server,
        &[&image],
        &[&commits[0], &commits[1]],
        &[TINY_REF, "version/1.0"],
    );
    assert!(
        line.contains("2 commits") || line.contains(COMMIT_LABEL),
        "the error says the repo is not the labelled commit: {line}"
    );
}

#[test]
fn a_layer_with_dotdot_entries_is_refused() {
    let escaped = nonce("dotdot");
    let name = format!("srv/repo/../../../../../{escaped}");
    let c = crafted(3, |t| {
        t.file(&name, b"escaped through ..\n")
            .file(&format!("../../../../../../../../tmp/{escaped}"), b"x\n")
    });
    let reg = Registry::start();
    let image = push_crafted(&reg, &c, "dotdot");
    let mut server = image_server(&reg, std::slice::from_ref(&image))
        .spawn()
        .unwrap();
    assert_fails_cleanly(
        &mut server,
        &[&image, "layer 1/1", "unsafe tar entry", &name, "`..`"],
        &[&c.commit],
        &[TINY_REF],
    );
    assert!(!Path::new("/tmp").join(&escaped).exists());
}

/// Serves a crafted image whose layer, after a valid repo, holds `extra`
/// (a symlink and a file written through it); asserts the usual failure,
/// that `watched` and `/etc/passwd` are untouched, and that none of
/// `must_not_exist` exists.
fn symlink_attack(
    seed: u32,
    image_from_registry: bool,
    extra: impl FnOnce(Tar) -> Tar,
    watched: &Path,
    must_not_exist: &[&Path],
    needles: &[&str],
) {
    let before = snapshot(watched).unwrap();
    let passwd = passwd_state();
    let c = crafted(seed, extra);
    let reg;
    let builder = if image_from_registry {
        reg = Registry::start();
        let image = push_crafted(&reg, &c, "link");
        image_server(&reg, &[image])
    } else {
        Server::images([format!("oci:{}:{}", c.layout.display(), c.tag)])
            .args(["--max-backoff", "1"])
    };
    let mut server = builder.spawn().unwrap();
    let mut all = vec!["layer 1/1", "unsafe tar entry"];
    all.extend_from_slice(needles);
    assert_fails_cleanly(&mut server, &all, &[&c.commit], &[TINY_REF]);
    drop(server);
    assert_unchanged(watched, &before, "a symlink attack");
    assert_eq!(passwd_state(), passwd, "/etc/passwd changed");
    for p in must_not_exist {
        assert!(
            std::fs::symlink_metadata(p).is_err(),
            "{} was created through a symlink",
            p.display()
        );
    }
}

#[test]
fn a_symlink_to_an_outside_dir_is_never_written_through() {
    let watched = tempdir();
    plant_secret(&watched.path().join("passwd")).unwrap();
    let target = watched.path().display().to_string();
    symlink_attack(
        4,
        true,
        |t| {
            t.symlink("srv/repo/escape", &target)
                .file("srv/repo/escape/pwned", b"written through a symlink\n")
                .file("srv/repo/escape/passwd", b"root::0:0::/:/bin/sh\n")
        },
        watched.path(),
        &[&watched.path().join("pwned")],
        &["srv/repo/escape"],
    );
}

#[test]
fn a_relative_symlink_escaping_the_repo_is_never_written_through() {
    let watched = tempdir();
    let target = format!(
        "{}{}",
        "../".repeat(16),
        watched.path().display().to_string().trim_start_matches('/')
    );
    symlink_attack(
        5,
        true,
        |t| {
            t.symlink("srv/repo/objects/up", &target)
                .file("srv/repo/objects/up/pwned", b"written through a symlink\n")
        },
        watched.path(),
        &[&watched.path().join("pwned")],
        &["srv/repo/objects/up"],
    );
}

#[test]
fn a_symlink_to_etc_is_never_written_through() {
    // Through an OCI layout this time. The file name is unique, so even a
    // vulnerable server would only add a file to /etc, never replace one;
    // it is removed if it appears.
    let planted = nonce("etc");
    let etc_file = Path::new("/etc").join(&planted);
    let path = format!("srv/repo/etc/{planted}");
    struct Cleanup<'a>(&'a Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _cleanup = Cleanup(&etc_file);
    let watched = tempdir();
    symlink_attack(
        6,
        false,
        |t| {
            t.symlink("srv/repo/etc", "/etc")
                .file(&path, b"written through a symlink to /etc\n")
        },
        watched.path(),
        &[&etc_file],
        &["srv/repo/etc"],
    );
}

#[test]
fn other_unsafe_entries_are_refused() {
    let watched = tempdir();
    let passwd = passwd_state();
    let before = snapshot(watched.path()).unwrap();
    let target = watched.path().display().to_string();
    let reg = Registry::start();
    type Extra = Box<dyn FnOnce(Tar) -> Tar>;
    let cases: Vec<(&str, Extra, &str)> = vec![
        (
            "absolute",
            Box::new(|t: Tar| t.file("/srv/repo/absolute", b"x\n")),
            "absolute path",
        ),
        (
            "hardlink",
            Box::new(|t: Tar| t.hardlink("srv/repo/passwd", "/etc/passwd")),
            "srv/repo/passwd",
        ),
        (
            "device",
            Box::new(|t: Tar| t.chardev("srv/repo/null")),
            "srv/repo/null",
        ),
        (
            "srv-symlink",
            Box::new(move |t: Tar| {
                t.symlink("srv", &target)
                    .file("srv/repo/pwned", b"written through a symlink\n")
            }),
            "srv",
        ),
    ];
    for (i, (tag, extra, needle)) in cases.into_iter().enumerate() {
        let c = crafted(20 + i as u32, extra);
        let image = push_crafted(&reg, &c, tag);
        let mut server = image_server(&reg, std::slice::from_ref(&image))
            .spawn()
            .unwrap();
        let line = assert_fails_cleanly(
            &mut server,
            &[&image, "layer 1/1", needle],
            &[&c.commit],
            &[TINY_REF],
        );
        assert!(
            line.contains("unsafe tar entry") || line.contains("unsupported"),
            "{tag}: the error says why: {line}"
        );
        // Served nothing: /etc/passwd bytes are nowhere in a response.
        for p in ["/summary", "/config", "/refs/heads/tiny/x86_64/stable"] {
            let r = server.get(p).unwrap();
            assert!(!leaks_secret(&r.body), "{tag}: {p} leaks a secret");
        }
    }
    assert_unchanged(watched.path(), &before, "unsafe entries");
    assert_eq!(passwd_state(), passwd, "/etc/passwd changed");
}

#[test]
fn a_gzip_bomb_hits_the_ratio_limit() {
    // The server's defaults (server/src/source/mod.rs): a layer may not
    // decompress to more than 100 times its compressed size once past
    // 64 MiB. 128 MiB of zeros gzip to ~128 KiB: about 1000:1.
    const ZEROS: u64 = 128 << 20;
    let work = tempdir();
    let repo = work.path().join("repo");
    let commit = tiny_commit(&repo, "1.0", Some(TINY_REF), 7).unwrap();
    // The repo, then the bomb inside srv/repo (so that a server without the
    // limit would write it, and serve the image).
    let mut head = Tar::new().dir("srv").tree("srv/repo", &repo).finish();
    head.truncate(head.len() - 1024); // no end-of-archive yet
    let (tx, rx) = std::sync::mpsc::channel();
    let blob = gzip_with(move |w| {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        let mut put = |w: &mut dyn Write, b: &[u8]| -> std::io::Result<()> {
            h.update(b);
            w.write_all(b)
        };
        put(w, &head)?;
        put(
            w,
            tar_header("srv/repo/tmp/zeros", EntryType::Regular, ZEROS, "", 0o644).as_bytes(),
        )?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(ZEROS >> 20) {
            put(w, &zeros)?;
        }
        put(w, &vec![0u8; tar_padding(ZEROS) + 1024])?;
        let _ = tx.send(format!("sha256:{}", hex::encode(h.finalize())));
        Ok(())
    });
    let diff_id = rx.recv().unwrap();
    assert!(
        (blob.len() as u64) * 100 < ZEROS,
        "the bomb compresses to {} bytes",
        blob.len()
    );
    let layout = work.path().join("oci");
    write_layout(
        &layout,
        "bomb",
        &[Layer {
            blob,
            media_type: GZIP,
            diff_id,
        }],
        &[(COMMIT_LABEL, &commit), ("version", "1.0")],
    );
    let reg = Registry::start();
    reg.push(&layout, "bomb", "os:bomb", &[]);
    let image = reg.image("os:bomb");
    let mut server = image_server(&reg, std::slice::from_ref(&image))
        .spawn()
        .unwrap();
    assert_fails_cleanly(
        &mut server,
        &[&image, "layer 1/1", "compression ratio", "limit"],
        &[&commit],
        &[TINY_REF],
    );
}

#[test]
fn one_bad_image_among_several_serves_nothing() {
    // Releases are published together or not at all: the good image is
    // fetched and verified first, then the bad one fails, and the good
    // one's staged tree goes too.
    let good = crafted(30, |t| t);
    let bad = crafted(31, |t| t.file("srv/repo/../../../../../escaped", b"x\n"));
    let reg = Registry::start();
    let good_image = push_crafted(&reg, &good, "good");
    let bad_image = push_crafted(&reg, &bad, "bad");
    let mut server = image_server(&reg, &[good_image, bad_image.clone()])
        .spawn()
        .unwrap();
    assert_fails_cleanly(
        &mut server,
        &[&bad_image, "unsafe tar entry"],
        &[&good.commit, &bad.commit],
        &[TINY_REF, &format!("version/{}", good.version)],
    );
    assert!(
        server.stderr().contains("image verified and staged"),
        "the good image was staged before the bad one failed:\n{}",
        server.stderr()
    );
}
