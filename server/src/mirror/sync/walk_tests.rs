//! The walk against repos made by the stock `ostree` CLI.

use super::*;
use crate::mirror::remote::DirRemote;
use std::path::Path;

fn ostree(args: &[&str]) -> String {
    let o = std::process::Command::new("ostree")
        .args(args)
        .output()
        .expect("the ostree CLI must be installed");
    assert!(o.status.success(), "ostree {args:?}: {o:?}");
    String::from_utf8(o.stdout).unwrap()
}

/// A two-commit archive repo with a summary and a static delta, made by
/// the stock CLI.
fn source(dir: &Path) -> (std::path::PathBuf, String, String) {
    let repo = dir.join("src");
    let r = format!("--repo={}", repo.display());
    ostree(&["init", "--mode=archive", &r]);
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("usr/lib")).unwrap();
    for i in 0..50u32 {
        std::fs::write(
            tree.join(format!("usr/lib/f{i}")),
            i.to_le_bytes().repeat(500),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("lib", tree.join("usr/lib64")).unwrap();
    let commit = |subject: &str| {
        ostree(&[
            "commit",
            &r,
            "-b",
            "os/stable",
            "-s",
            subject,
            &format!("--tree=dir={}", tree.display()),
            "--owner-uid=0",
            "--owner-gid=0",
        ])
        .trim()
        .to_owned()
    };
    let c1 = commit("one");
    std::fs::write(tree.join("usr/lib/f3"), b"changed").unwrap();
    std::fs::write(tree.join("usr/lib/new"), b"new file").unwrap();
    let c2 = commit("two");
    ostree(&["static-delta", "generate", &r, "--from", &c1, "--to", &c2]);
    ostree(&["summary", "-u", &r]);
    (repo, c1, c2)
}

#[test]
fn walks_verifies_and_copies_deltas_then_prunes() {
    let t = tempfile::tempdir().unwrap();
    let (repo, _c1, c2) = source(t.path());
    let remote = DirRemote::new(&repo, None);
    let dest = t.path().join("dest");
    let store = Store::open(&dest, &t.path().join("tmp"), BTreeMap::new()).unwrap();
    let snap = sync(&remote, &store, &SyncOptions::default()).unwrap();
    assert_eq!(
        snap.commits.keys().map(|c| c.to_hex()).collect::<Vec<_>>(),
        std::slice::from_ref(&c2)
    );
    assert_eq!(
        snap.fetched as usize,
        snap.objects as usize + snap.delta_files.len()
    );
    assert!(
        snap.delta_files.iter().any(|f| f.ends_with("/superblock"))
            && snap.delta_files.iter().any(|f| f.ends_with("/0")),
        "{:?}",
        snap.delta_files
    );
    // A second sync fetches nothing.
    let again = sync(&remote, &store, &SyncOptions::default()).unwrap();
    assert_eq!(again.fetched, 0);
    // Stock ostree agrees the copy is whole: refs and summary as the
    // source's, every object present and valid.
    crate::mirror::bundle::write_remote_files(&store, &snap.meta).unwrap();
    for f in ["summary", "config"] {
        assert_eq!(
            std::fs::read(dest.join(f)).unwrap(),
            std::fs::read(repo.join(f)).unwrap()
        );
    }
    ostree(&["fsck", &format!("--repo={}", dest.display())]);
    // What c2 reaches excludes the file c1 had and c2 replaced.
    let kept = reachable(&store, &[Checksum::from_hex(&c2).unwrap()]).unwrap();
    assert_eq!(
        kept.iter().filter(|o| o.kind == ObjectKind::Commit).count(),
        1
    );
    assert!(kept.len() < snap.objects as usize + 2);
}

#[test]
fn a_corrupted_delta_part_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let (repo, _, _) = source(t.path());
    let part = crate::mirror::bundle::list_files(&repo, "deltas")
        .unwrap()
        .into_iter()
        .find(|f| f.ends_with("/0"))
        .unwrap();
    let p = repo.join(&part);
    let mut b = std::fs::read(&p).unwrap();
    let i = b.len() / 2;
    b[i] ^= 1;
    std::fs::write(&p, b).unwrap();
    let store = Store::open(
        &t.path().join("dest"),
        &t.path().join("tmp"),
        BTreeMap::new(),
    )
    .unwrap();
    let e = sync(
        &DirRemote::new(&repo, None),
        &store,
        &SyncOptions::default(),
    )
    .unwrap_err();
    assert!(format!("{e:#}").contains("SHA-256 mismatch"), "{e:#}");
    assert!(!t.path().join("dest").join(&part).exists());
}
