//! The *small* update: about 60 MiB in 2,200 small files spread
//! over 1,600 new directories, committed on top of a fixture's v1. Where
//! a share of v1's files is rewritten, most bytes are in few big files;
//! here a burst of creates and dirtrees finishes in a couple of seconds,
//! before a feedback loop that waits for slow flushes sees one.
//!
//! Built once per v1 under `target/bench/io-small`: the v1 repo is copied
//! with hard links (ostree never rewrites an object in place, and only
//! v1's commit is unlinked from the copy), the new tree is committed over
//! v1's with `--tree=ref= --tree=dir=`, and the copy then holds exactly
//! one commit, as a served oscontainer must.

use super::repo;
use crate::fixtures::Release;
use anyhow::{bail, Context, Result};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Top-level and second-level directories of the new subtree.
pub const DIRS: (usize, usize) = (40, 40);
pub const FILES: usize = 2200;
/// File sizes are log-uniform in [1 KiB, 128 KiB): mean about 26 KiB.
const SIZE_LOG2: (u32, u32) = (10, 17);
/// Where the new subtree lives in the tree.
const BASE: &str = "usr/share/oscontent-bench-small";
const SEED: u64 = 0x5_3a11;

/// One new file: its path under the tree root and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFile {
    pub path: String,
    pub size: u64,
    pub seed: u64,
}

/// The new files, deterministic: file `i` goes to leaf directory
/// `i mod (40 x 40)`, so every leaf gets one or two.
pub fn plan() -> Vec<NewFile> {
    let mut rng = ChaCha8Rng::seed_from_u64(SEED);
    let leaves = DIRS.0 * DIRS.1;
    (0..FILES)
        .map(|i| {
            let leaf = i % leaves;
            let k = rng.gen_range(SIZE_LOG2.0..SIZE_LOG2.1);
            NewFile {
                path: format!("{BASE}/a{:02}/b{:02}/f{i:04}", leaf / DIRS.1, leaf % DIRS.1),
                size: (1u64 << k) + rng.gen_range(0..(1u64 << k)),
                seed: rng.gen(),
            }
        })
        .collect()
}

/// v1 plus the small update, served as a release: built under `dir` on
/// first use, reused after.
pub fn ensure(dir: &Path, v1: &Release, ref_name: &str) -> Result<Release> {
    let root = dir.join(format!("small-{}", &v1.commit[..12]));
    let meta = root.join("release.json");
    if let Ok(text) = std::fs::read_to_string(&meta) {
        return serde_json::from_str(&text).with_context(|| format!("parsing {}", meta.display()));
    }
    eprintln!(
        "xtask: building the small update over v1 {}",
        &v1.commit[..12]
    );
    let tmp = dir.join(format!("tmp-small-{}", &v1.commit[..12]));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    let tree = tmp.join("tree");
    let files = plan();
    write_tree(&tree, &files)?;
    let repo_dir = tmp.join("oscontainer/srv/repo");
    std::fs::create_dir_all(repo_dir.parent().context("repo parent")?)?;
    let cp = Command::new("cp")
        .args(["-a", "--link"])
        .arg(&v1.repo)
        .arg(&repo_dir)
        .status()
        .context("running cp")?;
    if !cp.success() {
        bail!(
            "cp -a --link {} {} failed",
            v1.repo.display(),
            repo_dir.display()
        );
    }
    let version = format!("{}.small", v1.version);
    let commit = repo::ostree(
        &repo_dir,
        &[
            "commit",
            "--orphan",
            &format!("--tree=ref={}", v1.commit),
            &format!("--tree=dir={}", tree.display()),
            &format!("--subject=bench io small update over {}", v1.version),
            &format!("--add-metadata-string=version={version}"),
            &format!("--bind-ref={ref_name}"),
            &format!("--parent={}", v1.commit),
            "--owner-uid=0",
            "--owner-gid=0",
            "--no-xattrs",
            "--fsync=false",
        ],
    )?
    .trim()
    .to_owned();
    // The copy's only commit must be v2's: unlink v1's (its links only).
    for ext in ["commit", "commitmeta"] {
        let p = repo_dir.join(format!(
            "objects/{}/{}.{ext}",
            &v1.commit[..2],
            &v1.commit[2..]
        ));
        if p.exists() {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    std::fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    if root.exists() {
        std::fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    std::fs::rename(&tmp, &root).with_context(|| format!("renaming to {}", root.display()))?;
    let bytes: u64 = files.iter().map(|f| f.size).sum();
    let oscontainer = root.join("oscontainer");
    let repo_path: PathBuf = oscontainer.join("srv/repo");
    let release = Release {
        version,
        commit,
        repo_bytes: crate::bench::rounded_size(&repo_path, 1)?,
        oscontainer,
        repo: repo_path,
        tree_files: v1.tree_files + files.len() as u64,
        image_bytes: 0,
        tree_bytes: v1.tree_bytes + bytes,
        parent: Some(v1.commit.clone()),
        image_manifest: String::new(),
    };
    std::fs::write(&meta, serde_json::to_vec_pretty(&release)?)
        .with_context(|| format!("writing {}", meta.display()))?;
    Ok(release)
}

/// The new subtree's files, incompressible (ostree's archive would
/// otherwise shrink them on the wire, not on the node's disk).
fn write_tree(tree: &Path, files: &[NewFile]) -> Result<()> {
    for f in files {
        let p = tree.join(&f.path);
        std::fs::create_dir_all(p.parent().context("file parent")?)
            .with_context(|| format!("creating {}", p.display()))?;
        let mut data = vec![0u8; f.size as usize];
        ChaCha8Rng::seed_from_u64(f.seed).fill_bytes(&mut data);
        std::fs::write(&p, data).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_plan_is_small_files_in_many_directories() {
        let p = plan();
        assert_eq!(p, plan(), "deterministic");
        let dirs: BTreeSet<&str> = p
            .iter()
            .map(|f| f.path.rsplit_once('/').unwrap().0)
            .collect();
        let bytes: u64 = p.iter().map(|f| f.size).sum();
        // (what, value, lowest, highest): the shape, 2,000+ small
        // content objects and 1,500+ dirtrees in about 60 MiB.
        let cases = [
            ("files", p.len() as u64, 2000, 2500),
            ("leaf dirs", dirs.len() as u64, 1500, 1700),
            ("MiB", bytes >> 20, 50, 70),
            (
                "largest KiB",
                p.iter().map(|f| f.size).max().unwrap() >> 10,
                64,
                128,
            ),
        ];
        for (what, v, lo, hi) in cases {
            assert!((lo..=hi).contains(&v), "{what}: {v} not in {lo}..={hi}");
        }
    }
}
