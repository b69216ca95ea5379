//! The bundle format, its verification and the bundle as a remote.

use super::*;
use crate::mirror::remote::Remote;
use crate::mirror::store::FileEntry;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

fn manifest(files: &[(&str, &[u8])]) -> BundleManifest {
    let mut m = BundleManifest {
        kind: KIND.into(),
        format: FORMAT,
        source: "test".into(),
        summary_sha256: String::new(),
        summary_signed: false,
        releases: Vec::new(),
        files: BTreeMap::new(),
    };
    for (p, b) in files {
        let e = FileEntry {
            sha256: hex::encode(Sha256::digest(b)),
            size: b.len() as u64,
        };
        if *p == "summary" {
            m.summary_sha256 = e.sha256.clone();
        }
        m.files.insert(p.to_string(), e);
    }
    m
}

fn write_bundle(dir: &Path, files: &[(&str, &[u8])]) {
    for (p, b) in files {
        let path = dir.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b).unwrap();
    }
    std::fs::write(
        dir.join(MANIFEST),
        serde_json::to_vec(&manifest(files)).unwrap(),
    )
    .unwrap();
}

#[test]
fn verification_refuses_what_does_not_match() {
    let obj = format!("objects/aa/{}.dirmeta", "b".repeat(62));
    let files: Vec<(&str, &[u8])> = vec![
        ("summary", b"summary bytes"),
        ("config", b"[core]\nmode=archive-z2\n"),
        ("refs/heads/x", b"abc\n"),
        (obj.as_str(), b"object bytes"),
    ];
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage, Option<&str>)> = vec![
        ("intact", Box::new(|_| {}), None),
        (
            "flipped byte",
            Box::new(|d: &Path| {
                let p = d.join(format!("objects/aa/{}.dirmeta", "b".repeat(62)));
                let mut b = std::fs::read(&p).unwrap();
                b[3] ^= 1;
                std::fs::write(p, b).unwrap();
            }),
            Some("SHA-256"),
        ),
        (
            "swapped summary",
            Box::new(|d: &Path| std::fs::write(d.join("summary"), b"other bytes!!").unwrap()),
            Some("summary: SHA-256"),
        ),
        (
            "missing file",
            Box::new(|d: &Path| std::fs::remove_file(d.join("refs/heads/x")).unwrap()),
            Some("refs/heads/x: missing"),
        ),
        (
            "truncated",
            Box::new(|d: &Path| std::fs::write(d.join("config"), b"[core]").unwrap()),
            Some("config: 6 bytes"),
        ),
        (
            "no manifest",
            Box::new(|d: &Path| std::fs::remove_file(d.join(MANIFEST)).unwrap()),
            Some("not a bundle"),
        ),
        (
            "interrupted",
            Box::new(|d: &Path| {
                std::fs::remove_file(d.join(MANIFEST)).unwrap();
                std::fs::create_dir(d.join(WORK_DIR)).unwrap();
            }),
            Some("incomplete bundle"),
        ),
    ];
    for (name, damage, want) in cases {
        let t = tempfile::tempdir().unwrap();
        write_bundle(t.path(), &files);
        damage(t.path());
        match (verify_bundle(t.path()), want) {
            (Ok(_), None) => {}
            (Err(e), Some(w)) => assert!(format!("{e:#}").contains(w), "{name}: {e:#}"),
            (r, w) => panic!("{name}: {r:?}, wanted {w:?}"),
        }
    }
}

#[test]
fn foreign_directories_are_not_written() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("d");
    refuse_foreign_dir(&d, &[MANIFEST]).unwrap();
    std::fs::create_dir(&d).unwrap();
    refuse_foreign_dir(&d, &[MANIFEST]).unwrap();
    std::fs::write(d.join("notes.txt"), b"mine").unwrap();
    let e = refuse_foreign_dir(&d, &[MANIFEST, WORK_DIR]).unwrap_err();
    assert!(e.to_string().contains("refusing to write"), "{e}");
    std::fs::create_dir(d.join(WORK_DIR)).unwrap();
    refuse_foreign_dir(&d, &[MANIFEST, WORK_DIR]).unwrap();
}

#[test]
fn manifests_are_checked() {
    let good = serde_json::to_vec(&manifest(&[("summary", b"s")])).unwrap();
    assert!(BundleManifest::parse(&good, "m").is_ok());
    let mut m = manifest(&[("summary", b"s")]);
    m.files.insert(
        "../etc/passwd".into(),
        FileEntry {
            sha256: String::new(),
            size: 0,
        },
    );
    let e = BundleManifest::parse(&serde_json::to_vec(&m).unwrap(), "m").unwrap_err();
    assert!(format!("{e:#}").contains("not an archive repo path"), "{e}");
    let mut m = manifest(&[]);
    m.kind = "something".into();
    assert!(BundleManifest::parse(&serde_json::to_vec(&m).unwrap(), "m").is_err());
    assert!(BundleManifest::parse(b"{}", "m").is_err());
}

#[test]
fn a_bundle_remote_serves_only_listed_verified_files() {
    let t = tempfile::tempdir().unwrap();
    write_bundle(t.path(), &[("summary", b"s1"), ("config", b"c")]);
    std::fs::write(t.path().join("summary.sig"), b"unlisted").unwrap();
    let r = BundleRemote::open(t.path(), None).unwrap();
    assert_eq!(r.get("summary", 100).unwrap().unwrap(), b"s1");
    assert!(r.get("summary.sig", 100).unwrap().is_none(), "unlisted");
    // Changed after verification: refused at read time.
    std::fs::write(t.path().join("config"), b"X").unwrap();
    assert!(r.get("config", 100).is_err());
}
