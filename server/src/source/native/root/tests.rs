//! A native root made of a real commit (stock `ostree commit`, laid out by
//! the testkit as ostree-ext's tar format, unpacked as an image volume
//! would be) converted, checked with stock `ostree fsck`; tampered roots
//! refused with nothing left; the root itself never written.

use super::*;
use oscontent_testkit::native::{native_object_path, source_commit, NativeLayers};
use oscontent_testkit::ostree::Ostree;
use std::os::unix::fs::PermissionsExt;

/// A native root of commit `seed` under a new temporary directory.
struct Root {
    tmp: tempfile::TempDir,
    commit: Checksum,
    parts: NativeLayers,
}

impl Root {
    fn new(seed: u32) -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let source = tmp.path().join("source");
        let commit = source_commit(&source, "os/tiny", "1.0", seed).expect("commit");
        let parts = NativeLayers::read(&source, &commit).expect("read");
        parts.unpack_root(&tmp.path().join("root")).expect("unpack");
        Self {
            commit: Checksum::from_hex(&commit).expect("hex"),
            tmp,
            parts,
        }
    }

    fn dir(&self) -> PathBuf {
        self.tmp.path().join("root")
    }

    fn repo(&self) -> PathBuf {
        self.dir().join(NATIVE_ROOT_REPO)
    }

    fn parent(&self) -> PathBuf {
        self.tmp.path().join("state").join(ROOTS_DIR)
    }

    fn convert(&self) -> Result<ConvertedRoot, SourceError> {
        convert(&self.dir(), &self.repo(), self.commit, &self.parent())
    }

    /// The content object with the most bytes.
    fn biggest(&self) -> String {
        let f = self.parts.files.values().max_by_key(|f| f.content.len());
        f.expect("files").checksum.clone()
    }

    fn object(&self, checksum: &str, ext: &str) -> PathBuf {
        self.dir().join(native_object_path(checksum, ext))
    }

    /// Every path under the root with its size and mtime.
    fn snapshot(&self) -> Vec<(PathBuf, u64, i64)> {
        let mut out = Vec::new();
        let mut stack = vec![self.dir()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("read_dir") {
                let p = e.expect("entry").path();
                let m = std::fs::symlink_metadata(&p).expect("stat");
                if m.is_dir() {
                    stack.push(p.clone());
                }
                out.push((p, m.len(), m.mtime()));
            }
        }
        out.sort();
        out
    }
}

#[test]
fn native_repo_is_recognized_by_its_layout_and_mode() {
    // (case, mode of sysroot/ostree/repo, srv/repo too, Ok(is native) or
    // the error's words)
    type Case<'a> = (&'a str, Option<&'a str>, bool, Result<bool, &'a str>);
    let cases: &[Case] = &[
        ("native", Some("bare-split-xattrs"), false, Ok(true)),
        (
            "legacy beside it wins",
            Some("bare-split-xattrs"),
            true,
            Ok(false),
        ),
        ("legacy only", None, true, Ok(false)),
        ("bare", Some("bare"), false, Err("\"bare\" repo")),
        (
            "archive",
            Some("archive-z2"),
            false,
            Err("\"archive-z2\" repo"),
        ),
    ];
    for (what, mode, legacy, want) in cases {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        if let Some(mode) = mode {
            let repo = root.join(NATIVE_ROOT_REPO);
            std::fs::create_dir_all(repo.join("objects")).expect("mkdir");
            let config = format!("[core]\nrepo_version=1\nmode={mode}\n");
            std::fs::write(repo.join("config"), config).expect("config");
        }
        if *legacy {
            std::fs::create_dir_all(root.join(OSCONTAINER_REPO)).expect("mkdir");
        }
        match (native_repo(root), want) {
            (Ok(got), Ok(want)) => assert_eq!(got.is_some(), *want, "{what}"),
            (Err(e), Err(words)) => assert!(format!("{e:#}").contains(words), "{what}: {e:#}"),
            (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn a_native_root_converts_to_an_archive_repo_stock_ostree_accepts() {
    let root = Root::new(11);
    let before = root.snapshot();
    let converted = root.convert().expect("convert");
    let repo = converted.root.join(OSCONTAINER_REPO);
    // A served repo's refs are the generation's; stock ostree needs the
    // directories to open a repo at all.
    for d in ["refs/heads", "refs/remotes"] {
        std::fs::create_dir_all(repo.join(d)).expect("mkdir");
    }
    let ostree = Ostree::at(&repo);
    ostree.fsck().expect("fsck of the converted repo");
    let objects = ostree.objects().expect("objects");
    let want: std::collections::BTreeSet<String> = root.parts.files.keys().cloned().collect();
    assert_eq!(objects.get(oscontent_testkit::CONTENT), want);
    assert_eq!(root.snapshot(), before, "the native root was written to");
    let staged = converted.root.clone();
    drop(converted);
    assert!(!staged.exists(), "a dropped conversion is removed");
}

#[test]
fn a_tampered_or_missing_file_is_refused_naming_it_and_nothing_is_left() {
    type Edit = fn(&Path);
    let flip: Edit = |p| {
        let mut b = std::fs::read(p).expect("read");
        b[1000] ^= 0xff;
        // The object is a hardlink of the checkout path: write in place.
        std::fs::write(p, b).expect("write");
    };
    let chmod: Edit =
        |p| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let remove: Edit = |p| std::fs::remove_file(p).expect("rm");
    let cases: &[(&str, Edit, &str)] = &[
        ("content", flip, "content does not match its name"),
        ("mode", chmod, "content does not match its name"),
        (
            "removed",
            remove,
            "missing: the commit reaches it at \"/usr/lib/tiny/blob\"",
        ),
    ];
    for (what, edit, words) in cases {
        let root = Root::new(12);
        let victim = root.biggest();
        edit(&root.object(&victim, "file"));
        let e = root.convert().expect_err(what).to_string();
        assert!(e.contains(&format!("{victim}.file")), "{what}: {e}");
        assert!(e.contains(words), "{what}: {e}");
        let left: Vec<_> = std::fs::read_dir(root.parent()).expect("ls").collect();
        assert!(left.is_empty(), "{what}: left behind {left:?}");
    }
}

#[test]
fn an_xattrs_link_that_is_not_the_files_is_refused() {
    let root = Root::new(13);
    let labelled = root
        .parts
        .files
        .values()
        .find(|f| !f.xattrs.is_empty())
        .expect("a labelled file")
        .checksum
        .clone();
    let link = root.object(&labelled, "file-xattrs-link");
    std::fs::remove_file(&link).expect("rm");
    let e = root.convert().expect_err("no xattrs").to_string();
    assert!(e.contains(&format!("{labelled}.file")), "{e}");
    assert!(e.contains("content does not match its name"), "{e}");
}

#[test]
fn a_refresh_reconverts_only_when_the_commit_changes() {
    let root = Root::new(14);
    let state = StateDir::open(&root.tmp.path().join("state"), &[]).expect("state");
    let mut roots = NativeRoots::open(&state).expect("roots");
    let req = PublishRequest {
        source: Source::Oscontainer(root.dir()),
        commit: None,
        refs: Vec::new(),
    };
    let (first, a) = roots
        .prepare(&req, &state)
        .expect("prepare")
        .expect("native");
    assert_eq!(first.commit, Some(root.commit));
    let (_, b) = roots
        .prepare(&req, &state)
        .expect("prepare")
        .expect("native");
    assert!(Arc::ptr_eq(&a, &b), "the same commit was converted again");
    // Another commit in the same root: two commits, none chosen.
    let other = Root::new(15);
    let rel = native_object_path(&other.commit.to_hex(), "commit");
    let dest = root.dir().join(&rel);
    std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
    std::fs::copy(other.dir().join(&rel), dest).expect("copy");
    let e = roots.prepare(&req, &state).expect_err("two commits");
    assert!(
        format!("{e:#}").contains("choose one with --commit"),
        "{e:#}"
    );
    let pinned = PublishRequest {
        commit: Some(root.commit),
        ..req.clone()
    };
    let (_, c) = roots
        .prepare(&pinned, &state)
        .expect("prepare")
        .expect("native");
    assert!(Arc::ptr_eq(&a, &c));
    // The source now holds the other commit: converted afresh; the old
    // conversion stays until what serves it lets go.
    let moved = PublishRequest {
        source: Source::Oscontainer(other.dir()),
        ..req
    };
    let (_, d) = roots
        .prepare(&moved, &state)
        .expect("prepare")
        .expect("native");
    assert_eq!(d.commit, other.commit);
    assert!(a.root.is_dir() && d.root.is_dir() && a.root != d.root);
    let old = a.root.clone();
    drop((a, b, c));
    assert!(!old.exists(), "the old conversion outlived its last user");
}
