//! Shared helpers for the `source_*` integration tests, beyond the
//! testkit's registry and OCI builders: oscontainer images built with the
//! stock `ostree` and `umoci`, `source::fetch` on a runtime, and what every
//! fetch must leave behind.

#![allow(dead_code)]

use oscontent_server::source::{self, FetchOptions, ImageRef, SourceError, StagedImage};
// Each test binary uses its own part of these.
#[allow(unused_imports)]
pub use oscontent_testkit::oci::{
    write_layout, write_multiarch_layout, EntryType, Layer, Tar, COMMIT_LABEL, GZIP, TAR, ZSTD,
};
#[allow(unused_imports)]
pub use oscontent_testkit::registry::Registry;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(b)))
}

/// A tiny oscontainer: an archive repo with one commit, as `srv/repo` in
/// an OCI layout built by umoci, labelled like the real ones.
pub struct Oscontainer {
    pub work: tempfile::TempDir,
    pub layout: PathBuf,
    pub repo: PathBuf,
    pub tag: String,
    pub commit: String,
}

/// An archive repo with one orphan commit (version 1.0) of a small tree.
pub fn ostree_repo(work: &Path) -> (PathBuf, String) {
    let repo = work.join("repo");
    let tree = work.join("tree");
    run(Command::new("ostree")
        .args(["init", "--mode=archive"])
        .arg(format!("--repo={}", repo.display())));
    std::fs::create_dir_all(tree.join("usr/bin")).unwrap();
    std::fs::create_dir_all(tree.join("usr/lib")).unwrap();
    std::fs::write(tree.join("usr/bin/hello"), b"#!/bin/sh\necho hello\n").unwrap();
    std::fs::write(tree.join("usr/lib/os-release"), b"NAME=test\nVERSION=1.0\n").unwrap();
    std::os::unix::fs::symlink("../lib/os-release", tree.join("usr/bin/os-release")).unwrap();
    let commit = run(Command::new("ostree")
        .args(["commit", "--orphan", "--add-metadata-string=version=1.0"])
        .arg(format!("--repo={}", repo.display()))
        .arg(format!("--tree=dir={}", tree.display())))
    .trim()
    .to_owned();
    assert_eq!(commit.len(), 64, "{commit}");
    (repo, commit)
}

pub fn build_oscontainer(tag: &str) -> Oscontainer {
    let work = tempfile::tempdir().unwrap();
    let (repo, commit) = ostree_repo(work.path());
    let layout = work.path().join("oci");
    let image = format!("{}:{tag}", layout.display());
    run(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout));
    run(Command::new("umoci").args(["new", "--image", &image]));
    run(Command::new("umoci")
        .args(["insert", "--image", &image])
        .arg(&repo)
        .arg("/srv/repo"));
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--config.label",
        &format!("{COMMIT_LABEL}={commit}"),
        "--config.label",
        "version=1.0",
    ]));
    Oscontainer {
        work,
        layout,
        repo,
        tag: tag.to_owned(),
        commit,
    }
}

/// `source::fetch` (the async API) on a fresh runtime.
pub fn fetch(image: &str, opts: &FetchOptions, parent: &Path) -> Result<StagedImage, SourceError> {
    let image: ImageRef = image.parse().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(source::fetch(&image, opts, parent))
}

/// Options for tests: plain HTTP to these hosts.
pub fn opts(insecure: &[String]) -> FetchOptions {
    FetchOptions {
        insecure_registries: insecure.to_vec(),
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(20),
        ..FetchOptions::default()
    }
}

/// Nothing at all under the staging parent (no staging leftovers).
pub fn assert_empty(dir: &Path) {
    let left: Vec<_> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.map(|e| e.unwrap().file_name()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => panic!("{}: {e}", dir.display()),
    };
    assert!(
        left.is_empty(),
        "leftovers under {}: {left:?}",
        dir.display()
    );
}

/// Asserts a fetch failed, with a message containing every `needle`, and
/// that the staging parent is empty. Returns the error.
pub fn assert_failed(
    r: Result<StagedImage, SourceError>,
    parent: &Path,
    needles: &[&str],
) -> SourceError {
    let e = match r {
        Ok(s) => panic!("fetch succeeded, expected an error: {s:?}"),
        Err(e) => e,
    };
    let msg = e.to_string();
    eprintln!("expected error: {msg}");
    for n in needles {
        assert!(msg.contains(n), "error {msg:?} does not mention {n:?}");
    }
    assert_empty(parent);
    e
}

/// Checks a staged tree: the repo is there, complete, and `ostree fsck`
/// accepts it.
pub fn assert_staged_repo(root: &Path, commit: &str) {
    let repo = root.join("srv/repo");
    let obj = repo
        .join("objects")
        .join(&commit[..2])
        .join(format!("{}.commit", &commit[2..]));
    assert!(obj.is_file(), "{} missing", obj.display());
    let top: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(top, ["srv"], "only srv/ is extracted");
    // fsck on a copy: the staged tree is the server's, never written.
    let copy = tempfile::tempdir().unwrap();
    run(Command::new("cp")
        .arg("-a")
        .arg(&repo)
        .arg(copy.path().join("repo")));
    run(Command::new("ostree")
        .args(["fsck", "--quiet"])
        .arg(format!("--repo={}", copy.path().join("repo").display())));
}

/// A layer holding a real ostree repo as `srv/repo`, and its commit.
pub fn repo_layer(work: &Path) -> (Layer, String) {
    std::fs::create_dir_all(work).unwrap();
    let (repo, commit) = ostree_repo(work);
    (
        Layer::gz(Tar::new().dir("srv").tree("srv/repo", &repo).finish()),
        commit,
    )
}
