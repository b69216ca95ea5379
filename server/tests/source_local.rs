//! `source::fetch` from OCI layouts and archives, and the unpacker's
//! defences, with hand-crafted layers: path escapes, symlink and hardlink
//! tricks, device nodes, compression bombs, labels, a full disk. Every
//! failure must leave nothing under the staging parent and nothing outside.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod source_support;

use oscontent_server::source::{self, Limits, SourceError};
use source_support::*;
use std::path::Path;
use std::process::Command;

/// A crafted one-image layout with a real repo layer first and `evil` (if
/// any) after it; returns the image reference and the commit.
fn crafted(work: &Path, evil: Vec<Layer>, labels_commit: Option<&str>) -> (String, String) {
    let (repo, commit) = repo_layer(&work.join("src"));
    let mut layers = vec![repo];
    layers.extend(evil);
    let layout = work.join("oci");
    let label = labels_commit.unwrap_or(&commit).to_owned();
    write_layout(
        &layout,
        "t",
        &layers,
        &[(COMMIT_LABEL, &label), ("version", "1.0")],
    );
    (format!("oci:{}:t", layout.display()), commit)
}

fn dir_is_empty(p: &Path) -> bool {
    std::fs::read_dir(p).unwrap().next().is_none()
}

#[test]
fn pulls_from_an_oci_layout() {
    let os = build_oscontainer("1");
    let parent = tempfile::tempdir().unwrap();
    let o = opts(&[]);
    let s = fetch(&format!("oci:{}:1", os.layout.display()), &o, parent.path()).unwrap();
    assert_eq!(s.commit, os.commit);
    assert_eq!(s.version.as_deref(), Some("1.0"));
    assert_staged_repo(&s.root, &os.commit);
    // The only manifest, without a tag.
    let s2 = fetch(&format!("oci:{}", os.layout.display()), &o, parent.path()).unwrap();
    assert_eq!(s2.manifest_digest, s.manifest_digest);
    // The layout itself was only read.
    let e = assert_failed(
        fetch(
            &format!("oci:{}:2", os.layout.display()),
            &o,
            &parent.path().join("x"),
        ),
        &parent.path().join("x"),
        &["no manifest tagged \"2\"", "tags: 1"],
    );
    assert!(matches!(e, SourceError::NotFound { .. }));
}

#[test]
fn pulls_from_an_oci_archive() {
    let os = build_oscontainer("1");
    let archive = os.work.path().join("os.tar");
    run(Command::new("skopeo")
        .args(["--insecure-policy", "copy", "-q"])
        .arg(format!("oci:{}:1", os.layout.display()))
        .arg(format!("oci-archive:{}:rel-1", archive.display())));
    let parent = tempfile::tempdir().unwrap();
    let s = fetch(
        &format!("oci-archive:{}:rel-1", archive.display()),
        &opts(&[]),
        parent.path(),
    )
    .unwrap();
    assert_eq!(s.commit, os.commit);
    assert_staged_repo(&s.root, &os.commit);
    source::clean_staging(parent.path()).unwrap();
    assert_failed(
        fetch(
            &format!("oci-archive:{}:nope", archive.display()),
            &opts(&[]),
            parent.path(),
        ),
        parent.path(),
        &["no manifest tagged"],
    );
    assert_failed(
        fetch(
            &format!(
                "oci-archive:{}",
                os.work.path().join("absent.tar").display()
            ),
            &opts(&[]),
            parent.path(),
        ),
        parent.path(),
        &["absent.tar", "does not exist"],
    );
}

#[test]
fn layers_apply_in_order_with_whiteouts_and_only_srv_repo_is_kept() {
    let work = tempfile::tempdir().unwrap();
    let (repo, commit) = repo_layer(&work.path().join("src"));
    let extra = Tar::new()
        .dir("srv/repo/extra")
        .file("srv/repo/extra/old", b"lower")
        .file("srv/repo/gone", b"lower")
        .dir("srv/repo/keep")
        .file("srv/repo/keep/a", b"a")
        .finish();
    // Outside srv/repo: ignored whatever it is (device nodes, absolute
    // symlinks, files).
    let outside = Tar::new()
        .dir("etc")
        .file("etc/passwd", b"root::0:0::/:/bin/sh\n")
        .symlink("bin", "/usr/bin")
        .raw("dev/null", EntryType::Char, b"", "")
        .file("srv/other", b"not the repo")
        .finish();
    let upper = Tar::new()
        .file("srv/repo/.wh.gone", b"")
        .file("srv/repo/extra/new", b"upper")
        .file("srv/repo/extra/.wh..wh..opq", b"")
        .file("srv/repo/keep/b", b"b")
        .finish();
    let layout = work.path().join("oci");
    write_layout(
        &layout,
        "t",
        &[
            repo,
            Layer::new(extra, TAR),
            Layer::new(outside, ZSTD),
            Layer::new(upper, GZIP),
        ],
        &[(COMMIT_LABEL, &commit)],
    );
    let parent = tempfile::tempdir().unwrap();
    let s = fetch(
        &format!("oci:{}:t", layout.display()),
        &opts(&[]),
        parent.path(),
    )
    .unwrap();
    let r = s.root.join("srv/repo");
    assert!(!r.join("gone").exists(), "whiteout applied");
    assert!(
        !r.join("extra/old").exists(),
        "opaque dir hides the lower layer"
    );
    assert_eq!(
        std::fs::read(r.join("extra/new")).unwrap(),
        b"upper",
        "same-layer entries survive the opaque marker"
    );
    assert!(r.join("keep/a").exists() && r.join("keep/b").exists());
    assert!(!r.join(".wh.gone").exists() && !r.join("extra/.wh..wh..opq").exists());
    assert!(
        !s.root.join("srv/other").exists()
            && !s.root.join("etc").exists()
            && !s.root.join("dev").exists()
    );
    assert!(s.version.is_none());
    std::fs::remove_dir_all(r.join("extra")).unwrap();
    std::fs::remove_dir_all(r.join("keep")).unwrap();
    assert_staged_repo(&s.root, &commit);
}

#[test]
fn dotdot_and_absolute_entries_are_refused() {
    let cases: &[(&str, &[&str])] = &[
        (
            "srv/repo/../../../../../../tmp/evil",
            &["`..` component", "srv/repo/../../"],
        ),
        ("../evil", &["`..` component"]),
        ("/srv/repo/evil", &["absolute path"]),
    ];
    for (path, needles) in cases {
        let work = tempfile::tempdir().unwrap();
        let evil = Layer::gz(Tar::new().file(path, b"pwned").finish());
        let (image, _) = crafted(work.path(), vec![evil], None);
        let parent = work.path().join("staging");
        let e = assert_failed(fetch(&image, &opts(&[]), &parent), &parent, needles);
        assert!(matches!(e, SourceError::UnsafeEntry { .. }), "{e:?}");
        assert!(e.to_string().contains("layer 2/2 sha256:"), "{e}");
        assert!(!e.is_retryable());
        assert!(!work.path().join("evil").exists() && !Path::new("/tmp/evil").exists());
    }
}

#[test]
fn symlinks_are_never_written_through() {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().display().to_string();
    let cases: Vec<(Tar, Vec<&str>)> = vec![
        // The classic: a link to /etc, then a file through it.
        (
            Tar::new()
                .symlink("srv/repo/x", "/etc")
                .file("srv/repo/x/passwd", b"pwned"),
            vec!["srv/repo/x", "symlink to \"/etc\""],
        ),
        (
            Tar::new()
                .symlink("srv/repo/x", &target)
                .file("srv/repo/x/f", b"pwned"),
            vec!["symlink to"],
        ),
        (
            Tar::new()
                .symlink("srv/repo/x", "../../..")
                .file("srv/repo/x/f", b"pwned"),
            vec!["symlink to \"../../..\""],
        ),
        // A harmless-looking link inside the repo is still never followed.
        (
            Tar::new()
                .symlink("srv/repo/x", "objects")
                .file("srv/repo/x/f", b"pwned"),
            vec!["srv/repo/x/f", "refusing to write through"],
        ),
        // srv itself a symlink.
        (
            Tar::new()
                .symlink("srv", &target)
                .file("srv/repo/f", b"pwned"),
            vec!["srv and srv/repo must be directories"],
        ),
        // Hardlinks must stay inside and name an extracted file.
        (
            Tar::new().hardlink("srv/repo/h", "etc/shadow"),
            vec!["hardlink to \"etc/shadow\", outside srv/repo"],
        ),
        (
            Tar::new().hardlink("srv/repo/h", "srv/repo/missing"),
            vec!["not an extracted regular file"],
        ),
        (
            Tar::new().hardlink("srv/repo/h", "srv/repo/../../etc/shadow"),
            vec!["`..` component"],
        ),
        (
            Tar::new().raw("srv/repo/dev", EntryType::Block, b"", ""),
            vec!["device nodes"],
        ),
        (
            Tar::new().raw("srv/repo/fifo", EntryType::Fifo, b"", ""),
            vec!["FIFOs"],
        ),
    ];
    for (tar, needles) in cases {
        let work = tempfile::tempdir().unwrap();
        let (image, _) = crafted(work.path(), vec![Layer::gz(tar.finish())], None);
        let parent = work.path().join("staging");
        let e = assert_failed(fetch(&image, &opts(&[]), &parent), &parent, &needles);
        assert!(matches!(e, SourceError::UnsafeEntry { .. }), "{e:?}");
        assert!(
            dir_is_empty(outside.path()),
            "something was written outside: {e}"
        );
    }
    assert!(Path::new("/etc/passwd").read_link().is_err());
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(!passwd.contains("pwned"));
}

#[test]
fn compression_bombs_hit_the_limits() {
    let work = tempfile::tempdir().unwrap();
    // 16 MiB of zeros: about 16 KiB of gzip.
    let bomb = Layer::gz(
        Tar::new()
            .file("srv/repo/zeros", &vec![0u8; 16 << 20])
            .finish(),
    );
    let (image, _) = crafted(work.path(), vec![bomb], None);
    let parent = work.path().join("staging");

    let mut o = opts(&[]);
    o.limits = Limits {
        max_ratio: 20,
        ratio_grace_bytes: 1 << 20,
        ..Limits::default()
    };
    let e = assert_failed(
        fetch(&image, &o, &parent),
        &parent,
        &["compression ratio", "layer 2/2"],
    );
    assert!(matches!(e, SourceError::LimitExceeded { .. }), "{e:?}");

    o.limits = Limits {
        max_decompressed_bytes: 4 << 20,
        ..Limits::default()
    };
    assert_failed(
        fetch(&image, &o, &parent),
        &parent,
        &["decompressed size", "layer 2/2"],
    );

    // Within the limits the same image is fine.
    let s = fetch(&image, &opts(&[]), &parent).unwrap();
    assert_eq!(
        std::fs::metadata(s.root.join("srv/repo/zeros"))
            .unwrap()
            .len(),
        16 << 20
    );
    source::clean_staging(&parent).unwrap();

    // Entry count.
    o.limits = Limits {
        max_entries: 5,
        ..Limits::default()
    };
    assert_failed(fetch(&image, &o, &parent), &parent, &["tar entries"]);
    // Layer count, compressed size.
    o.limits = Limits {
        max_layers: 1,
        ..Limits::default()
    };
    assert_failed(fetch(&image, &o, &parent), &parent, &["layer count"]);
    o.limits = Limits {
        max_compressed_bytes: 1000,
        ..Limits::default()
    };
    assert_failed(
        fetch(&image, &o, &parent),
        &parent,
        &["compressed size", "the limit is 1000"],
    );
}

#[test]
fn time_limits_and_cancellation_stop_cleanly() {
    let work = tempfile::tempdir().unwrap();
    let (image, _) = crafted(work.path(), vec![], None);
    let parent = work.path().join("staging");
    let mut o = opts(&[]);
    o.total_timeout = Some(std::time::Duration::ZERO);
    let e = assert_failed(
        fetch(&image, &o, &parent),
        &parent,
        &["took longer than", "layer 1/1"],
    );
    assert!(e.is_retryable());

    let image: source::ImageRef = image.parse().unwrap();
    let cancelled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let r = source::fetch_blocking(&image, &opts(&[]), &parent, &cancelled);
    assert_failed(r, &parent, &["cancelled"]);
}

#[test]
fn labels_are_checked() {
    let work = tempfile::tempdir().unwrap();
    let (repo, _) = repo_layer(&work.path().join("src"));
    let layout = work.path().join("oci");
    write_layout(&layout, "t", &[repo], &[("version", "1.0")]);
    let parent = work.path().join("staging");
    let image = format!("oci:{}:t", layout.display());
    let e = assert_failed(
        fetch(&image, &opts(&[]), &parent),
        &parent,
        &[COMMIT_LABEL, "missing"],
    );
    assert!(matches!(e, SourceError::Label { .. }));

    // A label naming a commit the repo does not have.
    let work = tempfile::tempdir().unwrap();
    let other = "ab".repeat(32);
    let (image, _) = crafted(work.path(), vec![], Some(&other));
    let parent = work.path().join("staging");
    assert_failed(
        fetch(&image, &opts(&[]), &parent),
        &parent,
        &["no commit object", &other],
    );

    let work = tempfile::tempdir().unwrap();
    let (image, _) = crafted(work.path(), vec![], Some("not-a-checksum"));
    let parent = work.path().join("staging");
    assert_failed(
        fetch(&image, &opts(&[]), &parent),
        &parent,
        &["not an ostree commit checksum"],
    );
}

#[test]
fn a_corrupted_layout_blob_is_refused() {
    let work = tempfile::tempdir().unwrap();
    let (image, _) = crafted(work.path(), vec![], None);
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(work.path().join("oci/index.json")).unwrap())
            .unwrap();
    let md = idx["manifests"][0]["digest"].as_str().unwrap().to_owned();
    let blob = |d: &str| {
        work.path()
            .join("oci/blobs/sha256")
            .join(d.strip_prefix("sha256:").unwrap())
    };
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(blob(&md)).unwrap()).unwrap();
    let layer = m["layers"][0]["digest"].as_str().unwrap().to_owned();
    let mut bytes = std::fs::read(blob(&layer)).unwrap();
    let n = bytes.len();
    bytes[n - 12] ^= 1; // in the deflate stream's tail, or the CRC
    std::fs::write(blob(&layer), &bytes).unwrap();
    let parent = work.path().join("staging");
    let e = assert_failed(
        fetch(&image, &opts(&[]), &parent),
        &parent,
        &["digest mismatch", &layer],
    );
    assert!(matches!(e, SourceError::DigestMismatch { .. }), "{e:?}");

    // One byte too many.
    bytes[n - 12] ^= 1;
    bytes.push(0);
    std::fs::write(blob(&layer), &bytes).unwrap();
    assert_failed(
        fetch(&image, &opts(&[]), &parent),
        &parent,
        &["size mismatch", &layer],
    );
}

/// Unmounts on drop.
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_fails_cleanly() {
    let work = tempfile::tempdir().unwrap();
    let mnt = work.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "tmpfs"])
        .arg(&mnt)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipping: cannot mount a tmpfs here (needs root)");
        return;
    }
    let _umount = Tmpfs(mnt.clone());
    // 4 MiB of incompressible bytes, so only the disk limit is hit.
    let mut noise = vec![0u8; 4 << 20];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let big = Layer::gz(Tar::new().file("srv/repo/noise", &noise).finish());
    let (image, _) = crafted(&work.path().join("img"), vec![big], None);
    let parent = mnt.join("staging");
    let e = assert_failed(
        fetch(&image, &opts(&[]), &parent),
        &parent,
        // The manifest declares more than the volume holds: refused before
        // any layer is fetched (the per-entry check is the next line of
        // defence, for layers whose content outgrows what they declare).
        &[
            "disk full",
            "as the manifest declares them",
            "before fetching any",
        ],
    );
    assert!(matches!(e, SourceError::DiskFull { .. }), "{e:?}");
    assert!(e.is_retryable());
}

#[test]
fn clean_staging_removes_leftovers_only() {
    let parent = tempfile::tempdir().unwrap();
    let p = parent.path();
    std::fs::create_dir_all(p.join("staging-abc/srv/repo/objects")).unwrap();
    std::fs::write(p.join("staging-abc/srv/repo/objects/x"), b"partial").unwrap();
    std::fs::create_dir_all(p.join("image-123-abc/srv/repo")).unwrap();
    std::fs::write(p.join("staging-file"), b"").unwrap();
    std::fs::create_dir(p.join("other")).unwrap();
    // A symlink named like ours is removed, never followed.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), b"").unwrap();
    std::os::unix::fs::symlink(outside.path(), p.join("staging-link")).unwrap();
    source::clean_staging(p).unwrap();
    let mut left: Vec<_> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["other"]);
    assert!(outside.path().join("keep").exists());
    source::clean_staging(&p.join("absent")).unwrap();
}

/// Entries under `dir`, itself included (bounded: the test's own tree).
fn count_tree(dir: &Path) -> u64 {
    1 + std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            if p.is_dir() && !p.is_symlink() {
                count_tree(&p)
            } else {
                1
            }
        })
        .sum::<u64>()
}

#[test]
fn parent_directories_an_entry_creates_count_against_the_entry_limit() {
    let work = tempfile::tempdir().unwrap();
    let deep: String = (0..30).map(|i| format!("d{i}/")).collect();
    let with_file = |path: &str| {
        let w = work.path().join(path.len().to_string());
        let layer = Layer::gz(Tar::new().file(path, b"x").finish());
        let (image, _) = crafted(&w, vec![layer], None);
        (image, count_tree(&w.join("src/repo")))
    };
    let (shallow, repo_entries) = with_file("srv/repo/f");
    let (deep, _) = with_file(&format!("srv/repo/{deep}f"));
    // `srv`, the repo's entries and the file, with room for a few more:
    // the shallow image fits, the deep one's 30 parents do not.
    let mut o = opts(&[]);
    o.limits = Limits {
        max_entries: repo_entries + 10,
        ..Limits::default()
    };
    let parent = work.path().join("staging");
    fetch(&shallow, &o, &parent).unwrap();
    source::clean_staging(&parent).unwrap();
    assert_failed(
        fetch(&deep, &o, &parent),
        &parent,
        &["tar entries", "parent directories", "layer 2/2"],
    );
}

/// A layer's decompressed stream, all of it (what follows the tar end
/// marker included), must hash to its `rootfs.diff_ids` entry: a config
/// that describes other content is refused naming the layer.
#[test]
fn a_layer_is_checked_against_its_diff_id() {
    let work = tempfile::tempdir().unwrap();
    let (repo, commit) = repo_layer(&work.path().join("src"));
    // Padding after the end marker, as GNU tar writes to fill a record:
    // part of the diff ID, never seen by the tar reader.
    let mut padded = Tar::new().dir("srv/repo/refs").finish();
    padded.extend_from_slice(&[0u8; 8192]);
    let padded = Layer::gz(padded);
    let labels = [(COMMIT_LABEL, commit.as_str()), ("version", "1.0")];
    let parent = work.path().join("staging");
    // (case, diff ID of layer 2 or None to keep it, what the error names)
    let cases: &[(&str, Option<String>, &[&str])] = &[
        ("right", None, &[]),
        (
            "doctored",
            Some(format!("sha256:{}", "ab".repeat(32))),
            &["layer 2/2", "rootfs.diff_ids", &padded.diff_id],
        ),
        (
            "not sha256",
            Some("md5:00".into()),
            &["rootfs.diff_ids[1]", "not a sha256 digest"],
        ),
    ];
    for (i, (what, diff_id, needles)) in cases.iter().enumerate() {
        let mut second = padded.clone();
        if let Some(d) = diff_id {
            second.diff_id = d.clone();
        }
        let layout = work.path().join(format!("oci-{i}"));
        write_layout(&layout, "t", &[repo.clone(), second], &labels);
        let image = format!("oci:{}:t", layout.display());
        let r = fetch(&image, &opts(&[]), &parent);
        if needles.is_empty() {
            let s = r.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(s.commit, commit, "{what}");
            std::fs::remove_dir_all(&s.root).unwrap();
            continue;
        }
        let mut all = vec![image.as_str()];
        all.extend_from_slice(needles);
        let e = assert_failed(r, &parent, &all);
        assert!(!e.is_retryable(), "{what}: {e}");
    }
}
