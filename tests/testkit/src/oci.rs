//! Hand-made tar streams, layers and OCI image layouts, for the suites and
//! the server's integration tests.
//!
//! [`Tar`] writes every header field itself (through `tar::Header`'s raw
//! ustar fields, never `set_path`), so that it can hold what a safe writer
//! refuses: `..`, absolute paths, escaping links, devices, FIFOs.

use crate::ostree::{tiny_commit, TINY_REF};
use crate::sha256_hex;
use crate::tools::tempdir;
use std::io::Write;
use std::path::{Path, PathBuf};

pub use tar::EntryType;

pub const COMMIT_LABEL: &str = "com.coreos.ostree-commit";
pub const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Every entry's mtime (reproducible layers).
const MTIME: u64 = 1_700_000_000;
/// Entries a [`Tar::tree`] may hold.
const MAX_TREE_ENTRIES: usize = 100_000;

/// Copies `s` into a NUL-padded header field.
fn put_field(field: &mut [u8], s: &str) {
    assert!(s.len() <= field.len(), "{s:?} does not fit");
    field.fill(0);
    field[..s.len()].copy_from_slice(s.as_bytes());
}

/// One ustar header: `path` verbatim (split into prefix and name past 100
/// bytes), owner root, and `link` as the link name.
pub fn tar_header(path: &str, kind: EntryType, size: u64, link: &str, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    let (prefix, name) = if path.len() <= 100 {
        ("", path)
    } else {
        let cut = path[..path.len().min(156)]
            .rfind('/')
            .expect("a long path needs a / to split at");
        (&path[..cut], &path[cut + 1..])
    };
    {
        let u = h.as_ustar_mut().expect("a ustar header");
        put_field(&mut u.name, name);
        put_field(&mut u.prefix, prefix);
        put_field(&mut u.linkname, link);
        put_field(&mut u.uname, "root");
        put_field(&mut u.gname, "root");
    }
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(MTIME);
    h.set_cksum();
    h
}

/// Zero padding after `size` bytes of entry data.
pub fn tar_padding(size: u64) -> usize {
    ((512 - (size % 512)) % 512) as usize
}

/// A tar stream built entry by entry.
pub struct Tar {
    b: tar::Builder<Vec<u8>>,
}

impl std::fmt::Debug for Tar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tar").finish_non_exhaustive()
    }
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

    /// Appends a header as is, then `data` and its padding.
    pub fn header(mut self, h: &tar::Header, data: &[u8]) -> Self {
        self.b.append(h, data).expect("writing to memory");
        self
    }

    /// An entry with exactly these path, link and mode.
    pub fn entry(self, path: &str, kind: EntryType, data: &[u8], link: &str, mode: u32) -> Self {
        let h = tar_header(path, kind, data.len() as u64, link, mode);
        self.header(&h, data)
    }

    /// An entry with exactly these path and link, and the usual mode for
    /// its kind.
    pub fn raw(self, path: &str, kind: EntryType, data: &[u8], link: &str) -> Self {
        let mode = match kind {
            EntryType::Directory => 0o755,
            EntryType::Symlink => 0o777,
            EntryType::Char | EntryType::Block | EntryType::Fifo => 0o666,
            _ => 0o644,
        };
        self.entry(path, kind, data, link, mode)
    }

    pub fn dir(self, path: &str) -> Self {
        self.raw(path, EntryType::Directory, b"", "")
    }
    pub fn file(self, path: &str, data: &[u8]) -> Self {
        self.raw(path, EntryType::Regular, data, "")
    }
    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.raw(path, EntryType::Symlink, b"", target)
    }
    pub fn hardlink(self, path: &str, target: &str) -> Self {
        self.raw(path, EntryType::Link, b"", target)
    }

    /// An entry as ostree-ext writes one: a GNU header with this mode and
    /// owner, long paths and link targets as GNU extension entries (the
    /// object paths of a native layer do not fit a ustar header).
    pub fn gnu(
        mut self,
        path: &str,
        kind: EntryType,
        data: &[u8],
        link: &str,
        mode: u32,
        owner: (u64, u64),
    ) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(owner.0);
        h.set_gid(owner.1);
        h.set_mtime(MTIME);
        let r = if link.is_empty() {
            self.b.append_data(&mut h, path, data)
        } else {
            self.b.append_link(&mut h, path, link)
        };
        r.expect("writing to memory");
        self
    }

    /// A character device (1, 3 is /dev/null).
    pub fn chardev(self, path: &str) -> Self {
        let mut h = tar_header(path, EntryType::Char, 0, "", 0o666);
        h.set_device_major(1).expect("a ustar header");
        h.set_device_minor(3).expect("a ustar header");
        h.set_cksum();
        self.header(&h, b"")
    }

    /// A directory tree as `prefix` (e.g. an ostree repo as `srv/repo`):
    /// directories, regular files and symlinks, in name order.
    pub fn tree(mut self, prefix: &str, src: &Path) -> Self {
        self = self.dir(prefix);
        let mut stack = vec![(src.to_path_buf(), prefix.to_owned())];
        let mut budget = MAX_TREE_ENTRIES;
        while let Some((dir, name)) = stack.pop() {
            let mut ents: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap())
                .collect();
            ents.sort_by_key(|e| e.file_name());
            for e in ents {
                budget = budget.checked_sub(1).expect("tree too big");
                let ft = e.file_type().unwrap();
                let n = format!("{name}/{}", e.file_name().to_string_lossy());
                if ft.is_dir() {
                    self = self.dir(&n);
                    stack.push((e.path(), n));
                } else if ft.is_file() {
                    self = self.file(&n, &std::fs::read(e.path()).unwrap());
                } else if ft.is_symlink() {
                    let target = std::fs::read_link(e.path()).unwrap();
                    self = self.symlink(&n, &target.to_string_lossy());
                }
            }
        }
        self
    }

    /// The stream, with its end-of-archive blocks.
    pub fn finish(self) -> Vec<u8> {
        self.b.into_inner().expect("writing to memory")
    }
}

/// gzip of what `feed` writes, without holding the input in memory.
pub fn gzip_with(feed: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    feed(&mut e).expect("feeding gzip");
    e.finish().expect("writing to memory")
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    gzip_with(|w| w.write_all(data))
}

#[cfg(feature = "zstd")]
pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).expect("writing to memory")
}

#[cfg(not(feature = "zstd"))]
pub fn zstd(_: &[u8]) -> Vec<u8> {
    panic!("a zstd layer needs oscontent-testkit's zstd feature")
}

/// `sha256:HEX`.
pub fn sha256_digest(b: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(b))
}

/// A layer blob and what the config says about it.
#[derive(Debug, Clone)]
pub struct Layer {
    pub blob: Vec<u8>,
    pub media_type: &'static str,
    /// sha256 of the uncompressed tar.
    pub diff_id: String,
}

impl Layer {
    /// `tar`, compressed as `media_type` says (gzip, zstd, or none).
    pub fn new(tar: Vec<u8>, media_type: &'static str) -> Self {
        let diff_id = sha256_digest(&tar);
        let blob = match media_type {
            GZIP => gzip(&tar),
            ZSTD => zstd(&tar),
            _ => tar,
        };
        Self {
            blob,
            media_type,
            diff_id,
        }
    }

    pub fn gz(tar: Vec<u8>) -> Self {
        Self::new(tar, GZIP)
    }
}

/// Stores `bytes` under the layout's blobs; its digest and size.
fn put_blob(layout: &Path, bytes: &[u8]) -> (String, usize) {
    let hex = sha256_hex(bytes);
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(&hex), bytes).unwrap();
    (format!("sha256:{hex}"), bytes.len())
}

/// Stores one image (layers, config with `labels`, manifest) in the
/// layout's blobs; returns the manifest's digest and size.
pub fn put_image(
    layout: &Path,
    arch: &str,
    layers: &[Layer],
    labels: &[(&str, &str)],
) -> (String, usize) {
    let descs: Vec<_> = layers
        .iter()
        .map(|l| {
            let (d, n) = put_blob(layout, &l.blob);
            serde_json::json!({"mediaType": l.media_type, "digest": d, "size": n})
        })
        .collect();
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "created": "2025-01-01T00:00:00Z",
        "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
    }))
    .unwrap();
    let (cd, cn) = put_blob(layout, &config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": cd, "size": cn},
        "layers": descs,
    }))
    .unwrap();
    put_blob(layout, &manifest)
}

/// The layout's `oci-layout` and `index.json`, naming one descriptor as
/// `tag`.
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

/// Writes an OCI image layout at `layout` holding one amd64 image tagged
/// `tag`: blobs, config (with `labels`), manifest and index.json. Returns
/// the manifest digest.
pub fn write_layout(layout: &Path, tag: &str, layers: &[Layer], labels: &[(&str, &str)]) -> String {
    std::fs::create_dir_all(layout).unwrap();
    let (md, size) = put_image(layout, "amd64", layers, labels);
    write_index_json(layout, tag, OCI_MANIFEST, &md, size);
    md
}

/// One platform of a multi-platform image: (arch, variant, layers, commit
/// label).
pub type Platform<'a> = (&'a str, Option<&'a str>, Vec<Layer>, &'a str);

/// A multi-platform image: `tag` names an image index with one manifest
/// per platform (each labelled version 1.0). Returns the index digest.
pub fn write_multiarch_layout(layout: &Path, tag: &str, images: &[Platform<'_>]) -> String {
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
            "mediaType": OCI_MANIFEST,
            "digest": md, "size": size, "platform": platform,
        }));
    }
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": entries,
    }))
    .unwrap();
    let (d, n) = put_blob(layout, &index);
    write_index_json(layout, tag, OCI_INDEX, &d, n);
    d
}

/// A hand-made oscontainer: a tiny archive repo (one commit bound to
/// [`TINY_REF`], version `version`) as `srv/repo`, then whatever `extra`
/// appends to the same layer (after the repo, so that the staging dir has
/// content when the bad entry comes).
#[derive(Debug)]
pub struct Crafted {
    pub work: tempfile::TempDir,
    pub layout: PathBuf,
    pub tag: String,
    pub commit: String,
    pub version: String,
}

pub fn crafted(seed: u32, extra: impl FnOnce(Tar) -> Tar) -> Crafted {
    crafted_bound(seed, TINY_REF, extra)
}

/// [`crafted`], its commit bound to `bind_ref` (images of different
/// streams served side by side).
pub fn crafted_bound(seed: u32, bind_ref: &str, extra: impl FnOnce(Tar) -> Tar) -> Crafted {
    let work = tempdir();
    let version = format!("1.{seed}");
    let repo = work.path().join("repo");
    let commit = tiny_commit(&repo, &version, Some(bind_ref), seed).unwrap();
    let tar = extra(Tar::new().dir("srv").tree("srv/repo", &repo)).finish();
    let layout = work.path().join("oci");
    let tag = "crafted".to_owned();
    write_layout(
        &layout,
        &tag,
        &[Layer::gz(tar)],
        &[(COMMIT_LABEL, &commit), ("version", &version)],
    );
    Crafted {
        work,
        layout,
        tag,
        commit,
        version,
    }
}
