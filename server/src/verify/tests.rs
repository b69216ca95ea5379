//! The gate (pure) and the verifying walk against repos made by the stock
//! `ostree` CLI.

use super::*;
use oscontent_format::{Checksum, DeltaFile};
use std::path::Path;

fn ostree(args: &[&str]) -> String {
    let o = std::process::Command::new("ostree")
        .args(args)
        .output()
        .expect("the ostree CLI must be installed");
    assert!(o.status.success(), "ostree {args:?}: {o:?}");
    String::from_utf8(o.stdout).unwrap()
}

/// An archive repo with one commit of 20 files and a symlink.
fn repo(dir: &Path) -> (PathBuf, Checksum) {
    let repo = dir.join("repo");
    let r = format!("--repo={}", repo.display());
    ostree(&["init", "--mode=archive", &r]);
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("usr/lib")).unwrap();
    for i in 0..20u32 {
        let body = i.to_le_bytes().repeat(300 + i as usize);
        std::fs::write(tree.join(format!("usr/lib/f{i}")), body).unwrap();
    }
    std::os::unix::fs::symlink("lib", tree.join("usr/lib64")).unwrap();
    let c = ostree(&[
        "commit",
        &r,
        "-b",
        "os",
        &format!("--tree=dir={}", tree.display()),
    ]);
    (repo, Checksum::from_hex(c.trim()).unwrap())
}

fn files_with(repo: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(repo.join("objects")).unwrap() {
        for f in std::fs::read_dir(d.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn name_of(p: &Path) -> ObjectName {
    let rel = p.strip_prefix(p.parent().unwrap().parent().unwrap().parent().unwrap());
    match RepoPath::parse(rel.unwrap().to_str().unwrap()) {
        Some(RepoPath::Object(o)) => o,
        other => panic!("{p:?}: {other:?}"),
    }
}

#[test]
fn the_gate_lets_through_only_what_was_verified() {
    let sum = |b: u8| Checksum::from([b; 32]);
    let known = ObjectName::new(sum(1), ObjectKind::File);
    let delta = DeltaName {
        from: None,
        to: sum(2),
    };
    let mut set = VerifiedSet::default();
    set.insert(known);
    set.insert_delta(delta);
    let gate = ObjectGate::Only(Arc::new(set));
    let other_delta = DeltaName {
        from: Some(sum(1)),
        to: sum(2),
    };
    let cases: &[(RepoPath, bool, bool)] = &[
        // (path, allowed by the set, allowed by a closed gate)
        (RepoPath::Object(known), true, false),
        (
            RepoPath::Object(ObjectName::new(sum(1), ObjectKind::DirTree)),
            false,
            false,
        ),
        (
            RepoPath::Object(ObjectName::new(sum(3), ObjectKind::File)),
            false,
            false,
        ),
        (
            RepoPath::Object(ObjectName::new(sum(3), ObjectKind::CommitMeta)),
            true,
            true,
        ),
        (
            RepoPath::Delta {
                name: delta,
                file: DeltaFile::Part(0),
            },
            true,
            false,
        ),
        (
            RepoPath::Delta {
                name: other_delta,
                file: DeltaFile::Superblock,
            },
            false,
            false,
        ),
        (RepoPath::Summary, true, true),
        (RepoPath::Config, true, true),
    ];
    for (path, by_set, by_closed) in cases {
        assert_eq!(gate.allows(path), *by_set, "{path:?}");
        assert_eq!(ObjectGate::default().allows(path), *by_closed, "{path:?}");
        assert!(ObjectGate::VerifiedStore.allows(path), "{path:?}");
    }
}

#[test]
fn the_closure_is_verified_and_the_verdicts_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, commit) = repo(dir.path());
    let cache = Arc::new(VerdictCache::default());
    let opts = VerifyOptions {
        jobs: 2,
        cache: Some(cache.clone()),
    };
    let roots = [Root::plain(repo.clone())];
    let set = verify_closure(&roots, &[commit], &opts).unwrap();
    for ext in ["commit", "dirtree", "dirmeta", "filez"] {
        for f in files_with(&repo, ext) {
            assert!(set.contains(&name_of(&f)), "{f:?} not verified");
        }
    }
    assert_eq!(set.hashed, set.len());
    assert_eq!(cache.len(), set.len());
    // The same files again: nothing is read twice.
    let again = verify_closure(&roots, &[commit], &opts).unwrap();
    assert_eq!((again.len(), again.hashed), (set.len(), 0));
    // A file rewritten (even with the same bytes) is hashed again.
    let f = &files_with(&repo, "filez")[0];
    std::fs::write(f, std::fs::read(f).unwrap()).unwrap();
    assert_eq!(verify_closure(&roots, &[commit], &opts).unwrap().hashed, 1);
}

#[test]
fn missing_and_corrupt_objects_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, commit) = repo(dir.path());
    let roots = [Root::plain(repo.clone())];
    let filez = files_with(&repo, "filez");
    let (a, b) = (&filez[0], &filez[1]);
    let saved = std::fs::read(a).unwrap();
    std::fs::write(a, std::fs::read(b).unwrap()).unwrap();
    let e = verify_closure(&roots, &[commit], &VerifyOptions::default()).unwrap_err();
    // Typed: a publisher serving the source in place branches on it.
    assert!(super::is_corruption(&e), "{e:#}");
    let err = format!("{e:#}");
    let named = name_of(a).checksum.to_hex();
    assert!(
        err.contains(&format!("content object {named} is corrupt")),
        "{err}"
    );
    std::fs::write(a, saved).unwrap();
    let saved_b = std::fs::read(b).unwrap();
    std::fs::remove_file(b).unwrap();
    let err = format!(
        "{:#}",
        verify_closure(&roots, &[commit], &VerifyOptions::default()).unwrap_err()
    );
    let named = name_of(b).checksum.to_hex();
    assert!(err.contains(&format!("filez {named} is missing")), "{err}");
    assert!(!super::is_corruption(
        &verify_closure(&roots, &[commit], &VerifyOptions::default()).unwrap_err()
    ));
    // Present, but through a symlink: said so, not "missing".
    let elsewhere = dir.path().join("elsewhere");
    std::fs::write(&elsewhere, &saved_b).unwrap();
    std::os::unix::fs::symlink(&elsewhere, b).unwrap();
    let err = format!(
        "{:#}",
        verify_closure(&roots, &[commit], &VerifyOptions::default()).unwrap_err()
    );
    assert!(err.contains("is a symlink"), "{err}");
    assert!(!err.contains("is missing"), "{err}");
}

#[test]
fn a_preverified_root_is_walked_not_hashed() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, commit) = repo(dir.path());
    let roots = [Root {
        path: repo.clone(),
        preverified: true,
    }];
    let set = verify_closure(&roots, &[commit], &VerifyOptions::default()).unwrap();
    assert_eq!(set.hashed, 0);
    assert_eq!(
        set.len(),
        files_with(&repo, "filez").len() + {
            let trees = files_with(&repo, "dirtree").len();
            trees + files_with(&repo, "dirmeta").len() + 1
        }
    );
}

#[test]
fn history_is_served_as_far_as_it_is_present_and_intact() {
    let dir = tempfile::tempdir().unwrap();
    let (repo, first) = repo(dir.path());
    let before = files_with(&repo, "filez");
    // A second commit on the branch, parent `first`, with one file changed.
    let tree = dir.path().join("tree");
    std::fs::write(tree.join("usr/lib/f0"), b"changed").unwrap();
    let r = format!("--repo={}", repo.display());
    let c = ostree(&[
        "commit",
        &r,
        "-b",
        "os",
        &format!("--tree=dir={}", tree.display()),
    ]);
    let second = Checksum::from_hex(c.trim()).unwrap();
    let only_first: Vec<PathBuf> = before
        .into_iter()
        .filter(|f| {
            let o = name_of(f);
            !verify_closure(
                &[Root::plain(repo.clone())],
                &[second],
                &VerifyOptions::default(),
            )
            .unwrap()
            .contains(&o)
        })
        .collect();
    assert_eq!(only_first.len(), 1, "{only_first:?}");
    let old = name_of(&only_first[0]);
    let roots = [Root::plain(repo.clone())];
    let opts = VerifyOptions::default();
    let set = verify_with_history(&roots, &[second], &[], MAX_HISTORY, &opts).unwrap();
    assert!(set.contains(&ObjectName::new(first, ObjectKind::Commit)) && set.contains(&old));
    assert!(!verify_with_history(&roots, &[second], &[], 0, &opts)
        .unwrap()
        .contains(&old));
    // Pruned from history: skipped. Corrupt: refused, named.
    let saved = std::fs::read(&only_first[0]).unwrap();
    std::fs::remove_file(&only_first[0]).unwrap();
    let set = verify_with_history(&roots, &[second], &[], MAX_HISTORY, &opts).unwrap();
    assert!(set.contains(&ObjectName::new(first, ObjectKind::Commit)) && !set.contains(&old));
    std::fs::write(&only_first[0], &saved[..saved.len() - 1]).unwrap();
    let err = format!(
        "{:#}",
        verify_with_history(&roots, &[second], &[], MAX_HISTORY, &opts).unwrap_err()
    );
    assert!(err.contains(&old.checksum.to_hex()), "{err}");
}
