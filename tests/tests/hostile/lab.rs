//! The world the attacks happen in, built once per test process with the
//! real binaries: two small releases shaped like CoreOS oscontainers (one
//! commit each, bound to the CoreOS ref, v2's parent is v1); a trusted key
//! and an attacker's key; genuine servers for v1 and v2 (bundles made by
//! `sign`, verified with `--trusted-keys`); the attacker's own server with
//! a commit made by stock `ostree commit`; and node repos that already
//! pulled v1 (and v2) with verification on.
//!
//! The releases are small on purpose: every attack copies and fscks a node
//! repo, and the suite must stay cheap in CI. What is attacked (summary,
//! signatures, commit, dirtrees, content) is the same as with the fixtures.

use oscontent_format::Commit;
use oscontent_testkit::signing::*;
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

/// The ref every release is bound to and nodes follow.
pub const REF: &str = "fedora/x86_64/coreos/stable";
/// The genuine releases: (version, timestamp).
const RELEASES: [(&str, &str); 2] = [
    ("41.20250101.3.0", "2025-01-01T00:00:00Z"),
    ("41.20250115.3.0", "2025-01-15T00:00:00Z"),
];
/// The attacker's release: newer than anything genuine, so only
/// signatures (not timestamps) can stop it.
pub const ATTACKER_VERSION: &str = "41.20250201.0.0";
pub const ATTACKER_TIMESTAMP: &str = "2025-02-01T00:00:00Z";

/// A small genuine release: an oscontainer root with one commit.
pub struct Rel {
    pub root: PathBuf,
    pub repo: PathBuf,
    pub commit: String,
}

/// An OS-shaped tree; `gen` 2 changes a library, the docs and os-release,
/// and adds a directory, like an update.
fn os_tree(dir: &Path, version: &str, gen: u32) {
    let w = |rel: &str, body: String| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    w("usr/bin/hello", "#!/bin/sh\necho hello\n".into());
    for i in 0..8 {
        let changed = if i < 2 { gen } else { 1 };
        w(
            &format!("usr/lib/os/lib{i}.so"),
            format!("library {i} build {changed}\n").repeat(200),
        );
    }
    if gen > 1 {
        w(
            "usr/lib/os/plugins/extra.so",
            "a plugin new in this release\n".repeat(100),
        );
    }
    w(
        "usr/share/doc/os/README",
        (0..2000)
            .map(|l| format!("line {l} of {version}\n"))
            .collect(),
    );
    w("etc/os-release", format!("VERSION_ID={version}\n"));
    std::os::unix::fs::symlink("../usr/bin/hello", dir.join("etc/hello-link")).unwrap();
}

/// Where a node repo starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// At v1, about to update to v2 (the update is attacked).
    V1,
    /// Already at v2 (the attacker replays v1).
    V2,
}

pub struct Lab {
    _tmp: tempfile::TempDir,
    pub trusted: Key,
    pub v1: Rel,
    pub v2: Rel,
    /// Genuine v1 and v2, signed by the trusted key.
    pub s1: Server,
    pub s2: Server,
    /// The attacker's repo, signed by the attacker's key.
    pub sa: Server,
    base_v1: PathBuf,
    base_v2: PathBuf,
    pub v2_summary_sig: Vec<u8>,
    pub v2_commitmeta: Vec<u8>,
    /// The attacker's signatures over the genuine v2 commit and summary.
    pub attacker_v2_commitmeta: Vec<u8>,
    pub attacker_v2_summary_sig: Vec<u8>,
    pub attacker_commit: String,
    pub attacker_commit_bytes: Vec<u8>,
    /// A content object and a (non-root) dirtree that v2 has and v1 lacks:
    /// an update from v1 must fetch them.
    pub new_filez: String,
    pub new_dirtree: String,
    /// v2's root dirtree.
    pub root_dirtree: String,
    /// Valid objects of the same kinds with other checksums.
    pub other_filez_bytes: Vec<u8>,
    pub other_dirtree_bytes: Vec<u8>,
    /// `new_filez` with its own header (size, mode, xattrs) and one byte
    /// of its content changed: only its checksum can tell.
    pub tampered_filez_bytes: Vec<u8>,
}

/// Shared by the tests that run at the same time, rebuilt if they do not
/// (so that its servers stop when the last test using it is done).
pub fn lab() -> Arc<Lab> {
    static LAB: Mutex<Weak<Lab>> = Mutex::new(Weak::new());
    let mut held = LAB.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = held.upgrade() {
        return l;
    }
    let l = Arc::new(Lab::build());
    *held = Arc::downgrade(&l);
    l
}

/// A `.filez` (framed header, raw deflate) with the first byte of its
/// content flipped and the rest as it was; `None` for one with no content
/// (a symlink, an empty file).
fn flip_a_content_byte(filez: &[u8]) -> Option<Vec<u8>> {
    use oscontent_format::content::{header_len, HEADER_PREFIX_LEN};
    use std::io::{Read, Write};
    let hlen = header_len(&filez[..HEADER_PREFIX_LEN].try_into().unwrap()).unwrap();
    let (framed_header, body) = filez.split_at(HEADER_PREFIX_LEN + hlen);
    let mut content = Vec::new();
    flate2::read::DeflateDecoder::new(body)
        .read_to_end(&mut content)
        .unwrap();
    *content.first_mut()? ^= 1;
    let mut out = flate2::write::DeflateEncoder::new(framed_header.to_vec(), Default::default());
    out.write_all(&content).unwrap();
    Some(out.finish().unwrap())
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The genuine releases v1 and v2 (v2 the child of v1), each an
/// oscontainer root holding an archive repo.
fn releases(t: &Path) -> (Rel, Rel) {
    let mut rels = Vec::new();
    let mut parent: Option<String> = None;
    for (n, (version, ts)) in RELEASES.iter().enumerate() {
        let root = t.join(format!("v{}", n + 1));
        let repo = root.join("srv/repo");
        let r = Ostree::init(&repo, "archive").unwrap();
        let tree = t.join(format!("tree-v{}", n + 1));
        os_tree(&tree, version, n as u32 + 1);
        let commit = commit_tree(&r, &tree, REF, version, ts, parent.as_deref()).unwrap();
        parent = Some(commit.clone());
        rels.push(Rel { root, repo, commit });
    }
    let v2 = rels.pop().unwrap();
    let v1 = rels.pop().unwrap();
    (v1, v2)
}

/// The attacker's release: a small tree, bound to the genuine ref,
/// committed with stock ostree, with `parent` (v2) as its parent. Its
/// repo and commit.
fn attacker_release(t: &Path, parent: &str) -> (PathBuf, String) {
    let arepo = t.join("attacker/repo");
    let ar = Ostree::init(&arepo, "archive").unwrap();
    let tree = t.join("attacker/tree");
    std::fs::create_dir_all(tree.join("usr/bin")).unwrap();
    std::fs::write(tree.join("usr/bin/backdoor"), "#!/bin/sh\necho owned\n").unwrap();
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(
        tree.join("etc/os-release"),
        format!("VERSION_ID={ATTACKER_VERSION}\n"),
    )
    .unwrap();
    let commit = commit_tree(
        &ar,
        &tree,
        REF,
        ATTACKER_VERSION,
        ATTACKER_TIMESTAMP,
        Some(parent),
    )
    .unwrap();
    (arepo, commit)
}

/// Nodes that pulled v1, and then v2, the careful way (from the genuine
/// servers, with the trusted key): their repos.
fn careful_nodes(
    t: &Path,
    [(s1, v1), (s2, v2)]: [(&Server, &Rel); 2],
    key: &Path,
) -> (PathBuf, PathBuf) {
    let base_v1 = t.join("base-v1");
    let n1 = Ostree::init(&base_v1, "archive").unwrap();
    add_signed_remote(&n1, "origin", &s1.url, key, true).unwrap();
    n1.pull(&["origin", REF]).unwrap();
    let base_v2 = t.join("base-v2");
    let n2 = fork_repo(&base_v1, &base_v2).unwrap();
    set_remote_url(&n2, "origin", &s2.url).unwrap();
    n2.pull(&["--timestamp-check", "origin", REF]).unwrap();
    let head = |n: &Ostree| n.rev_parse(&format!("origin:{}", REF)).unwrap();
    assert_eq!(head(&n1), v1.commit, "the v1 node is at v1");
    assert_eq!(head(&n2), v2.commit, "the v2 node is at v2");
    (base_v1, base_v2)
}

impl Lab {
    fn build() -> Lab {
        let tmp = tempdir();
        let t = tmp.path();
        let (v1, v2) = releases(t);
        let trusted = keygen(&t.join("keys"), "trusted", &[]).unwrap();
        let attacker = keygen(&t.join("keys"), "attacker", &[]).unwrap();

        let b1 = t.join("bundle-v1");
        let b2 = t.join("bundle-v2");
        let a2 = t.join("attacker-bundle-v2");
        let osc = |r: &Rel| {
            vec![
                "--oscontainer".to_owned(),
                s(&r.root),
                "--commit".into(),
                r.commit.clone(),
            ]
        };
        sign(&osc(&v1), &trusted, &b1).unwrap();
        sign(&osc(&v2), &trusted, &b2).unwrap();
        sign(&osc(&v2), &attacker, &a2).unwrap();

        let (arepo, attacker_commit) = attacker_release(t, &v2.commit);
        let aa = t.join("attacker-bundle");
        let pinned = [
            "--repo".to_owned(),
            s(&arepo),
            "--commit".into(),
            attacker_commit.clone(),
        ];
        sign(&pinned, &attacker, &aa).unwrap();

        let genuine = |r: &Rel, b: &Path| {
            Server::oscontainer(&r.root)
                .args(["--signatures", &s(b), "--trusted-keys", &s(&trusted.public)])
                .start()
                .unwrap_or_else(|e| panic!("genuine server for {}: {e:#}", r.commit))
        };
        let s1 = genuine(&v1, &b1);
        let s2 = genuine(&v2, &b2);
        let sa = Server::repo(&arepo)
            .args(["--signatures", &s(&aa)])
            .start()
            .unwrap_or_else(|e| panic!("attacker server: {e:#}"));

        let (base_v1, base_v2) = careful_nodes(t, [(&s1, &v1), (&s2, &v2)], &trusted.public);

        let o1 = list_objects(&v1.repo).unwrap();
        let o2 = list_objects(&v2.repo).unwrap();
        let v2_commit = Commit::parse(&read(&object_path(&v2.repo, &v2.commit, "commit"))).unwrap();
        let v1_commit = Commit::parse(&read(&object_path(&v1.repo, &v1.commit, "commit"))).unwrap();
        let root_dirtree = v2_commit.root_tree.to_hex();
        let only_v2 = |kind: &str| -> Vec<String> {
            o2.get(kind).difference(&o1.get(kind)).cloned().collect()
        };
        let (new_filez, tampered_filez_bytes) = only_v2(CONTENT)
            .into_iter()
            .find_map(|c| {
                let tampered = flip_a_content_byte(&read(&object_path(&v2.repo, &c, "filez")))?;
                Some((c, tampered))
            })
            .expect("v2 has a non-empty file v1 lacks");
        let new_dirtree = only_v2("dirtree")
            .into_iter()
            .find(|d| *d != root_dirtree)
            .expect("v2 has a non-root dirtree v1 lacks");
        let other_filez = o2
            .get(CONTENT)
            .into_iter()
            .find(|c| *c != new_filez)
            .unwrap();
        let other_dirtree = v1_commit.root_tree.to_hex();

        Lab {
            v2_summary_sig: read(&b2.join("summary.sig")),
            v2_commitmeta: read(&b2.join(format!("{}.commitmeta", v2.commit))),
            attacker_v2_commitmeta: read(&a2.join(format!("{}.commitmeta", v2.commit))),
            attacker_v2_summary_sig: read(&a2.join("summary.sig")),
            attacker_commit_bytes: read(&object_path(&arepo, &attacker_commit, "commit")),
            attacker_commit,
            other_filez_bytes: read(&object_path(&v2.repo, &other_filez, "filez")),
            other_dirtree_bytes: read(&object_path(&v1.repo, &other_dirtree, "dirtree")),
            tampered_filez_bytes,
            new_filez,
            new_dirtree,
            root_dirtree,
            trusted,
            s1,
            s2,
            sa,
            base_v1,
            base_v2,
            _tmp: tmp,
            v1,
            v2,
        }
    }

    pub fn base(&self, b: Base) -> &Path {
        match b {
            Base::V1 => &self.base_v1,
            Base::V2 => &self.base_v2,
        }
    }

    /// What a base repo's ref points at.
    pub fn base_commit(&self, b: Base) -> &str {
        match b {
            Base::V1 => &self.v1.commit,
            Base::V2 => &self.v2.commit,
        }
    }
}
