//! Ostree-native images (ostree-ext's tar format) made from a real commit:
//! [`source_commit`] builds a tree with what the format must carry (modes,
//! owners, xattrs, symlinks, empty and multi-block files) and commits it
//! with the stock `ostree` CLI into an archive repo; [`NativeLayers`] walks
//! that commit and writes the layers as `ostree container encapsulate`
//! lays them out (`sysroot/ostree/repo/objects/...` in bare-split-xattrs
//! form, a checkout of hardlinks to the objects), so tests can tamper with
//! any entry before the layers become an image.
//!
//! The layout, from ostree-ext's `tar/export.rs`: the first layer holds
//! the repo structure and `config`, the commit, its detached metadata,
//! every dirtree and dirmeta, and the content not in a chunk; each chunk
//! layer holds content objects only. A content object is its
//! `.file-xattrs` (the `a(ayay)`, named by its SHA-256, once per layer),
//! a `.file-xattrs-link` hardlink to it, then the `.file` (uid, gid and
//! permission bits in the tar header; a symlink as a tar symlink), then
//! its checkout paths: hardlinks to the `.file`, or plain empty files for
//! empty ones.

use crate::oci::{EntryType, Tar};
use crate::ostree::Ostree;
use anyhow::{ensure, Context, Result};
use oscontent_format::content::{header_len, ArchiveHeader, HEADER_PREFIX_LEN};
use oscontent_format::Commit;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const NATIVE_COMMIT_LABEL: &str = "ostree.commit";
pub const FINAL_DIFFID_LABEL: &str = "ostree.final-diffid";
const REPO: &str = "sysroot/ostree/repo";
/// Objects a walk may visit.
const MAX_OBJECTS: usize = 100_000;

/// `sysroot/ostree/repo/objects/XX/REST.EXT`.
pub fn native_object_path(checksum: &str, ext: &str) -> String {
    format!("{REPO}/objects/{}/{}.{ext}", &checksum[..2], &checksum[2..])
}

/// Makes a tree and commits it (bound to `bind_ref`, metadata `version`)
/// into a new archive repo at `repo` with stock ostree. Returns the commit.
pub fn source_commit(repo: &Path, bind_ref: &str, version: &str, seed: u32) -> Result<String> {
    let r = Ostree::init(repo, "archive")?;
    let tree = crate::tools::tempdir();
    let t = tree.path();
    for d in ["usr/bin", "usr/lib/tiny", "usr/share/doc", "etc/secret"] {
        std::fs::create_dir_all(t.join(d))?;
    }
    let write = |p: &str, data: &[u8], mode: u32| -> Result<()> {
        std::fs::write(t.join(p), data)?;
        std::fs::set_permissions(t.join(p), std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    write(
        "usr/bin/hello",
        format!("#!/bin/sh\necho {seed}\n").as_bytes(),
        0o755,
    )?;
    write("usr/bin/setuid", b"#!/bin/sh\n", 0o4755)?;
    let big: Vec<u8> = (0..300_000u32)
        .map(|i| ((i * 7 + seed) % 251) as u8)
        .collect();
    write("usr/lib/tiny/blob", &big, 0o644)?;
    write("usr/share/doc/empty", b"", 0o644)?;
    write(
        "usr/share/doc/README",
        format!("release {version}\n").as_bytes(),
        0o444,
    )?;
    write("etc/secret/key", b"not really\n", 0o600)?;
    std::fs::set_permissions(t.join("etc/secret"), std::fs::Permissions::from_mode(0o700))?;
    rustix::fs::chown(
        t.join("etc/secret/key"),
        Some(rustix::fs::Uid::from_raw(1000)),
        Some(rustix::fs::Gid::from_raw(27)),
    )
    .context("chown (the suites run as root)")?;
    rustix::fs::setxattr(
        t.join("usr/bin/hello"),
        "user.oscontent.test",
        b"labelled",
        rustix::fs::XattrFlags::empty(),
    )
    .context("setting a user xattr")?;
    std::os::unix::fs::symlink("hello", t.join("usr/bin/hi"))?;
    std::os::unix::fs::symlink("/usr/lib/tiny/blob", t.join("etc/blob-link"))?;
    let out = r.run([
        "commit".to_owned(),
        "--orphan".into(),
        format!("--tree=dir={}", t.display()),
        format!("--add-metadata-string=version={version}"),
        format!("--subject=native {version}"),
        format!("--bind-ref={bind_ref}"),
    ])?;
    let commit = out.trim().to_owned();
    ensure!(
        commit.len() == 64,
        "unexpected `ostree commit` output {out:?}"
    );
    Ok(commit)
}

/// A content object of the source commit, as the format carries it.
#[derive(Debug, Clone)]
pub struct NativeFile {
    pub checksum: String,
    pub uid: u32,
    pub gid: u32,
    /// Permission bits (no file type), as the tar header has them.
    pub perms: u32,
    pub symlink: Option<String>,
    pub xattrs: Vec<u8>,
    pub content: Vec<u8>,
    /// Checkout paths (relative, no leading `/`).
    pub paths: Vec<String>,
}

/// Every object of a commit, read from an archive repo.
#[derive(Debug, Clone)]
pub struct NativeLayers {
    pub commit: String,
    /// (checksum, extension, bytes): commit, commitmeta, dirtrees, dirmetas.
    pub metadata: Vec<(String, &'static str, Vec<u8>)>,
    pub files: BTreeMap<String, NativeFile>,
}

fn read_object(repo: &Path, checksum: &str, ext: &str) -> Result<Vec<u8>> {
    let p: PathBuf = crate::objects::object_path(repo, checksum, ext);
    std::fs::read(&p).with_context(|| format!("reading {}", p.display()))
}

/// A `.filez` back to its parts.
fn read_filez(bytes: &[u8], checksum: &str) -> Result<NativeFile> {
    let prefix: [u8; HEADER_PREFIX_LEN] = bytes[..HEADER_PREFIX_LEN].try_into()?;
    let len = header_len(&prefix)?;
    let h = ArchiveHeader::parse(&bytes[8..8 + len])?;
    let v = oscontent_format::parse_normal(&h.file_header, "(uuuusa(ayay))", "file header")?;
    let be = |i: usize| u32::from_be(v.child_value(i).get::<u32>().unwrap_or(0));
    let target = v.child_value(4).str().unwrap_or("").to_owned();
    let mut content = Vec::new();
    if target.is_empty() {
        flate2::read::DeflateDecoder::new(&bytes[8 + len..]).read_to_end(&mut content)?;
    }
    Ok(NativeFile {
        checksum: checksum.to_owned(),
        uid: be(0),
        gid: be(1),
        perms: be(2) & 0o7777,
        symlink: (!target.is_empty()).then_some(target),
        xattrs: v.child_value(5).data().to_vec(),
        content,
        paths: Vec::new(),
    })
}

impl NativeLayers {
    /// Walks `commit` in the archive repo `repo`.
    pub fn read(repo: &Path, commit: &str) -> Result<Self> {
        let cbytes = read_object(repo, commit, "commit")?;
        let c = Commit::parse(&cbytes)?;
        let mut metadata = vec![(commit.to_owned(), "commit", cbytes)];
        if let Ok(meta) = read_object(repo, commit, "commitmeta") {
            metadata.push((commit.to_owned(), "commitmeta", meta));
        }
        let mut files: BTreeMap<String, NativeFile> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut stack = vec![(c.root_tree, c.root_meta, String::new())];
        while let Some((tree, meta, dir)) = stack.pop() {
            ensure!(seen.len() < MAX_OBJECTS, "commit too big for a test");
            for (sum, ext) in [(meta, "dirmeta"), (tree, "dirtree")] {
                let hex = sum.to_hex();
                if seen.insert((hex.clone(), ext)) {
                    metadata.push((hex.clone(), ext, read_object(repo, &hex, ext)?));
                }
            }
            let dt =
                oscontent_format::parse_dirtree(&read_object(repo, &tree.to_hex(), "dirtree")?)?;
            for (name, sum) in &dt.files {
                let hex = sum.to_hex();
                if !files.contains_key(&hex) {
                    let f = read_filez(&read_object(repo, &hex, "filez")?, &hex)?;
                    files.insert(hex.clone(), f);
                }
                files
                    .get_mut(&hex)
                    .expect("inserted")
                    .paths
                    .push(format!("{dir}{name}"));
            }
            for (name, t, m) in &dt.dirs {
                stack.push((*t, *m, format!("{dir}{name}/")));
            }
        }
        Ok(Self {
            commit: commit.to_owned(),
            metadata,
            files,
        })
    }

    /// The checksums of the content objects, in order.
    pub fn file_checksums(&self) -> Vec<String> {
        self.files.keys().cloned().collect()
    }

    /// The layers: the commit layer (metadata plus every content object
    /// not in `chunks`), then one layer per chunk of content checksums.
    pub fn layers(&self, chunks: &[Vec<String>]) -> Vec<Tar> {
        let chunked: BTreeSet<&String> = chunks.iter().flatten().collect();
        let mut first = repo_structure(Tar::new());
        for (sum, ext, bytes) in &self.metadata {
            first = file(first, &native_object_path(sum, ext), bytes);
        }
        let rest: Vec<String> = self
            .files
            .keys()
            .filter(|k| !chunked.contains(k))
            .cloned()
            .collect();
        let mut out = vec![self.content(first, &rest)];
        for chunk in chunks {
            out.push(self.content(repo_structure(Tar::new()), chunk));
        }
        out
    }

    /// The image root these objects unpack to (as a mounted image volume
    /// has it: `sysroot/ostree/repo` in bare-split-xattrs mode, owners and
    /// modes applied, xattrs links hardlinked, checkout paths hardlinks to
    /// the objects) under `dir`; the root's native repo.
    pub fn unpack_root(&self, dir: &Path) -> Result<PathBuf> {
        use std::os::unix::fs::{lchown, symlink};
        let at = |rel: &str| -> Result<PathBuf> {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().context("a parent")?)?;
            Ok(p)
        };
        std::fs::write(
            at(&format!("{REPO}/config"))?,
            b"[core]\nrepo_version=1\nmode=bare-split-xattrs\n",
        )?;
        for (sum, ext, bytes) in &self.metadata {
            std::fs::write(at(&native_object_path(sum, ext))?, bytes)?;
        }
        for f in self.files.values() {
            let xpath = at(&native_object_path(
                &crate::sha256_hex(&f.xattrs),
                "file-xattrs",
            ))?;
            std::fs::write(&xpath, &f.xattrs)?;
            let link = at(&native_object_path(&f.checksum, "file-xattrs-link"))?;
            std::fs::hard_link(&xpath, &link).context("linking xattrs")?;
            let obj = at(&native_object_path(&f.checksum, "file"))?;
            match &f.symlink {
                Some(t) => symlink(t, &obj)?,
                None => {
                    std::fs::write(&obj, &f.content)?;
                }
            }
            lchown(&obj, Some(f.uid), Some(f.gid)).context("chown (tests run as root)")?;
            if f.symlink.is_none() {
                // After chown, which clears setuid.
                std::fs::set_permissions(&obj, std::fs::Permissions::from_mode(f.perms))?;
            }
            for p in &f.paths {
                std::fs::hard_link(&obj, at(p)?).with_context(|| format!("linking {p}"))?;
            }
        }
        Ok(dir.join(REPO))
    }

    /// Appends content objects (xattrs, link, object, checkout paths).
    pub fn content(&self, mut tar: Tar, checksums: &[String]) -> Tar {
        let mut xattrs_written = BTreeSet::new();
        for sum in checksums {
            let f = &self.files[sum];
            let xsum = crate::sha256_hex(&f.xattrs);
            let xpath = native_object_path(&xsum, "file-xattrs");
            if xattrs_written.insert(xsum) {
                tar = file(tar, &xpath, &f.xattrs);
            }
            tar = hardlink(tar, &native_object_path(sum, "file-xattrs-link"), &xpath);
            tar = append_file(tar, f);
            for p in &f.paths {
                tar = match (&f.symlink, f.content.is_empty()) {
                    (None, true) => file(tar, p, b""),
                    _ => hardlink(tar, p, &native_object_path(sum, "file")),
                };
            }
        }
        tar
    }
}

/// The `.file` entry of a content object.
pub fn append_file(tar: Tar, f: &NativeFile) -> Tar {
    let path = native_object_path(&f.checksum, "file");
    let (kind, data, link) = match &f.symlink {
        Some(t) => (EntryType::Symlink, &[][..], t.as_str()),
        None => (EntryType::Regular, &f.content[..], ""),
    };
    tar.gnu(
        &path,
        kind,
        data,
        link,
        f.perms,
        (f.uid.into(), f.gid.into()),
    )
}

/// A root-owned 0644 file, as ostree-ext writes repo files.
pub fn file(tar: Tar, path: &str, data: &[u8]) -> Tar {
    tar.gnu(path, EntryType::Regular, data, "", 0o644, (0, 0))
}

/// A hardlink, as ostree-ext writes them.
pub fn hardlink(tar: Tar, path: &str, target: &str) -> Tar {
    tar.gnu(path, EntryType::Link, b"", target, 0o644, (0, 0))
}

fn dir(tar: Tar, path: &str) -> Tar {
    tar.gnu(path, EntryType::Directory, b"", "", 0o755, (0, 0))
}

/// `sysroot/ostree/repo` with its object directories and `config`.
pub fn repo_structure(mut tar: Tar) -> Tar {
    for d in [
        "sysroot",
        "sysroot/ostree",
        REPO,
        &format!("{REPO}/objects"),
    ] {
        tar = dir(tar, d);
    }
    for i in 0..=255u8 {
        tar = dir(tar, &format!("{REPO}/objects/{i:02x}"));
    }
    file(
        tar,
        &format!("{REPO}/config"),
        b"[core]\nrepo_version=1\nmode=bare-split-xattrs\n",
    )
}

/// The labels of a native image whose last ostree layer has `final_diffid`.
pub fn native_labels<'a>(
    commit: &'a str,
    final_diffid: &'a str,
    version: &'a str,
) -> Vec<(&'static str, &'a str)> {
    vec![
        (NATIVE_COMMIT_LABEL, commit),
        (FINAL_DIFFID_LABEL, final_diffid),
        ("ostree.bootable", "true"),
        ("containers.bootc", "1"),
        ("org.opencontainers.image.version", version),
    ]
}
