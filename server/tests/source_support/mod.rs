//! Shared helpers for the `source_*` integration tests: a real
//! `docker-registry` on loopback, oscontainer images built with the stock
//! `ostree` and `umoci`, pushed with `skopeo`, and hand-crafted OCI layouts
//! for the attacks.

#![allow(dead_code)]

use oscontent_server::source::{self, FetchOptions, ImageRef, SourceError, StagedImage};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const COMMIT_LABEL: &str = "com.coreos.ostree-commit";

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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `docker-registry serve` on 127.0.0.1, killed on drop.
pub struct Registry {
    pub port: u16,
    pub dir: tempfile::TempDir,
    child: Child,
}

impl Registry {
    /// Starts a registry; with `basic`, it requires those htpasswd
    /// credentials.
    pub fn start(basic: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let auth = match basic {
            Some((u, p)) => {
                let line = run(Command::new("htpasswd").args(["-Bbn", u, p]));
                let path = dir.path().join("htpasswd");
                std::fs::write(&path, line.trim()).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: test\n    path: {}\n",
                    path.display()
                )
            }
            None => String::new(),
        };
        // A port picked here may be taken by the time the registry binds
        // it: a few tries.
        for _ in 0..5 {
            let port = free_port();
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}",
                    dir.path().join("storage").display()
                ),
            )
            .unwrap();
            let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
            let mut child = Command::new("docker-registry")
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("docker-registry (Debian package docker-registry) must be installed");
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                if let Some(status) = child.try_wait().unwrap() {
                    eprintln!("registry exited early ({status}); retrying on another port");
                    break;
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Registry { port, dir, child };
                }
                assert!(
                    Instant::now() < deadline,
                    "registry did not listen on {addr} within 15 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("could not start docker-registry");
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where the registry stores a blob (or manifest) with this digest.
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The raw manifest for `reference`, as the registry serves it.
    pub fn manifest(&self, repo: &str, reference: &str, creds: Option<(&str, &str)>) -> Vec<u8> {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let mut req = client
            .get(format!(
                "http://{}/v2/{repo}/manifests/{reference}",
                self.host()
            ))
            .header("Accept", "application/vnd.oci.image.manifest.v1+json");
        if let Some((u, p)) = creds {
            req = req.basic_auth(u, Some(p));
        }
        let resp = req.send().unwrap().error_for_status().unwrap();
        resp.bytes().unwrap().to_vec()
    }

    /// The digest of the first layer of `repo:reference`.
    pub fn first_layer(&self, repo: &str, reference: &str, creds: Option<(&str, &str)>) -> String {
        let m: serde_json::Value =
            serde_json::from_slice(&self.manifest(repo, reference, creds)).unwrap();
        m["layers"][0]["digest"].as_str().unwrap().to_owned()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pushes `oci:LAYOUT:TAG` to `docker://DEST` with skopeo.
pub fn push(layout: &Path, tag: &str, dest: &str, creds: Option<(&str, &str)>) {
    let mut cmd = Command::new("skopeo");
    cmd.args(["--insecure-policy", "copy", "-q", "--dest-tls-verify=false"]);
    if let Some((u, p)) = creds {
        cmd.args(["--dest-creds", &format!("{u}:{p}")]);
    }
    cmd.arg(format!("oci:{}:{tag}", layout.display()))
        .arg(format!("docker://{dest}"));
    run(&mut cmd);
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

// ---------------------------------------------------------------------
// Hand-crafted layers and layouts.

/// A tar stream built entry by entry, including entries the `tar` crate's
/// safe API refuses to write (`..`, absolute paths).
pub struct Tar {
    b: tar::Builder<Vec<u8>>,
}

impl Default for Tar {
    fn default() -> Self {
        Self::new()
    }
}

impl Tar {
    pub fn new() -> Self {
        Self {
            b: tar::Builder::new(Vec::new()),
        }
    }

    /// An entry with exactly these name and link bytes (ustar, ≤ 100 each).
    pub fn raw(mut self, path: &str, kind: tar::EntryType, data: &[u8], link: &str) -> Self {
        let mut h = tar::Header::new_ustar();
        {
            let old = h.as_old_mut();
            assert!(path.len() <= 100 && link.len() <= 100);
            old.name = [0; 100];
            old.name[..path.len()].copy_from_slice(path.as_bytes());
            old.linkname = [0; 100];
            old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        self.b.append(&h, data).unwrap();
        self
    }

    pub fn dir(self, path: &str) -> Self {
        self.raw(path, tar::EntryType::Directory, b"", "")
    }
    pub fn file(self, path: &str, data: &[u8]) -> Self {
        self.raw(path, tar::EntryType::Regular, data, "")
    }
    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.raw(path, tar::EntryType::Symlink, b"", target)
    }
    pub fn hardlink(self, path: &str, target: &str) -> Self {
        self.raw(path, tar::EntryType::Link, b"", target)
    }

    /// A whole directory tree under `prefix` (e.g. an ostree repo as
    /// `srv/repo`).
    pub fn tree(mut self, prefix: &str, src: &Path) -> Self {
        self.b.follow_symlinks(false);
        self.b.append_dir_all(prefix, src).unwrap();
        self
    }

    pub fn finish(self) -> Vec<u8> {
        self.b.into_inner().unwrap()
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

pub const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const TAR: &str = "application/vnd.oci.image.layer.v1.tar";

/// One layer of a crafted image: its tar, compressed as `media_type` says.
pub struct Layer {
    pub tar: Vec<u8>,
    pub media_type: &'static str,
}

impl Layer {
    pub fn gz(tar: Vec<u8>) -> Self {
        Self {
            tar,
            media_type: GZIP,
        }
    }
    pub fn blob(&self) -> Vec<u8> {
        match self.media_type {
            GZIP => gzip(&self.tar),
            ZSTD => zstd(&self.tar),
            _ => self.tar.clone(),
        }
    }
}

fn put_blob(layout: &Path, bytes: &[u8]) -> String {
    let d = sha256(bytes);
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(d.strip_prefix("sha256:").unwrap()), bytes).unwrap();
    d
}

/// Stores one image (layers, config with `labels`, manifest) in the
/// layout's blobs; returns the manifest's digest and size.
pub fn put_image(
    layout: &Path,
    arch: &str,
    layers: &[Layer],
    labels: &[(&str, &str)],
) -> (String, usize) {
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for l in layers {
        let blob = l.blob();
        let d = put_blob(layout, &blob);
        descs.push(serde_json::json!({"mediaType": l.media_type, "digest": d, "size": blob.len()}));
        diff_ids.push(sha256(&l.tar));
    }
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let cd = put_blob(layout, &config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": config.len()},
        "layers": descs,
    }))
    .unwrap();
    (put_blob(layout, &manifest), manifest.len())
}

fn write_index_json(layout: &Path, tag: &str, media_type: &str, digest: &str, size: usize) {
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": media_type,
            "digest": digest,
            "size": size,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    });
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
}

/// Writes an OCI image layout at `layout` holding one image tagged `tag`,
/// by hand: blobs, config, manifest, index.json. Returns the manifest
/// digest.
pub fn write_layout(layout: &Path, tag: &str, layers: &[Layer], labels: &[(&str, &str)]) -> String {
    std::fs::create_dir_all(layout).unwrap();
    let (md, size) = put_image(layout, "amd64", layers, labels);
    write_index_json(
        layout,
        tag,
        "application/vnd.oci.image.manifest.v1+json",
        &md,
        size,
    );
    md
}

/// A multi-platform image: `tag` names an image index with one manifest
/// per (arch, variant, layers, commit label). Returns the index digest.
pub fn write_multiarch_layout(
    layout: &Path,
    tag: &str,
    images: &[(&str, Option<&str>, Vec<Layer>, &str)],
) -> String {
    std::fs::create_dir_all(layout).unwrap();
    let mut entries = Vec::new();
    for (arch, variant, layers, commit) in images {
        let (md, size) = put_image(
            layout,
            arch,
            layers,
            &[(COMMIT_LABEL, commit), ("version", "1.0")],
        );
        let mut platform = serde_json::json!({"os": "linux", "architecture": arch});
        if let Some(v) = variant {
            platform["variant"] = serde_json::Value::from(*v);
        }
        entries.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": md, "size": size, "platform": platform,
        }));
    }
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": entries,
    }))
    .unwrap();
    let d = put_blob(layout, &index);
    write_index_json(
        layout,
        tag,
        "application/vnd.oci.image.index.v1+json",
        &d,
        index.len(),
    );
    d
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
