//! The state dir and the one lifecycle of a generation's overlay: begin a
//! directory, build it, commit it into place; removed if never committed,
//! and removed again when the generation it became is retired.

use crate::served::Generation;
use anyhow::{bail, Context, Result};
use oscontent_format::Checksum;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Under a state dir: generation overlays.
const GENERATIONS: &str = "generations";

/// The server's own directory. Nothing else is ever written.
#[derive(Debug)]
pub struct StateDir {
    root: PathBuf,
    generations: Generations,
}

impl StateDir {
    /// Opens (creating if needed) the state dir and removes what an earlier
    /// run left: generations are cheap to rebuild, and a half-written one
    /// must never be served. `served` are the repos the server will serve:
    /// the state dir may neither lie inside one nor contain one, and this is
    /// checked before anything is created or removed.
    pub fn open(root: &Path, served: &[PathBuf]) -> Result<Self> {
        let resolved = resolve_nonexistent(root)?;
        // A missing repo is reported by publication, with a clearer message.
        for repo in served.iter().filter(|r| r.exists()) {
            check_disjoint(&resolved, repo)?;
        }
        std::fs::create_dir_all(root)
            .with_context(|| format!("creating state dir {}", root.display()))?;
        let root = root
            .canonicalize()
            .with_context(|| format!("resolving {}", root.display()))?;
        anyhow::ensure!(
            root == resolved,
            "state dir {} moved while opening it",
            root.display()
        );
        let generations = Generations::open(root.join(GENERATIONS))?;
        Ok(Self { root, generations })
    }

    pub fn path(&self) -> &Path {
        &self.root
    }

    /// A fresh, empty overlay directory for the next generation.
    pub fn begin(&self) -> Result<Building> {
        self.generations.begin()
    }
}

/// A directory of generation overlays, numbered from 1 in this process.
#[derive(Debug)]
pub struct Generations {
    dir: PathBuf,
    next_id: AtomicU64,
}

impl Generations {
    /// Opens `dir` empty: overlays an earlier process left are removed (a
    /// half-written one must never be served).
    pub fn open(dir: PathBuf) -> Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("removing stale {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self {
            dir,
            next_id: AtomicU64::new(1),
        })
    }

    /// Creates the next generation's overlay under a temporary name.
    pub fn begin(&self) -> Result<Building> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!("{id}.tmp"));
        // Owned from here: an error below removes it.
        let guard = OverlayGuard(tmp.clone());
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        Ok(Building {
            id,
            dir: self.dir.join(id.to_string()),
            guard,
        })
    }
}

/// A generation's overlay being built, not yet visible; removed when
/// dropped uncommitted.
#[derive(Debug)]
pub struct Building {
    id: u64,
    /// Where it goes when committed.
    dir: PathBuf,
    /// Holds the temporary directory.
    guard: OverlayGuard,
}

impl Building {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The overlay to write into.
    pub fn path(&self) -> &Path {
        &self.guard.0
    }

    /// Renames the overlay into place and makes it a generation serving
    /// `sources`, which removes the overlay when it is dropped: after a
    /// newer one is published and the last request on this one is done.
    pub fn commit(
        mut self,
        sources: Vec<PathBuf>,
        refs: Vec<(String, Checksum)>,
    ) -> Result<Generation> {
        std::fs::rename(self.path(), &self.dir)
            .with_context(|| format!("renaming {} into place", self.path().display()))?;
        self.guard.0 = self.dir.clone();
        let mut generation = Generation::new(self.id, sources, self.dir, refs);
        generation.keepalive.push(Box::new(self.guard));
        Ok(generation)
    }
}

/// Removes an overlay directory when dropped: one never committed, or the
/// overlay of a retired generation.
#[derive(Debug)]
struct OverlayGuard(PathBuf);

impl Drop for OverlayGuard {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.0) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %self.0.display(), "removing a generation's overlay: {e}")
            }
        }
    }
}

/// The canonical form of a path that may not exist yet: its nearest
/// existing ancestor canonicalized, plus the rest.
fn resolve_nonexistent(p: &Path) -> Result<PathBuf> {
    let abs = if p.is_absolute() {
        p.to_owned()
    } else {
        std::env::current_dir()
            .context("reading the current directory")?
            .join(p)
    };
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    while !existing.exists() {
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            break;
        };
        rest.push(name.to_owned());
        existing = parent;
    }
    let mut out = existing
        .canonicalize()
        .with_context(|| format!("resolving {}", existing.display()))?;
    for name in rest.iter().rev() {
        anyhow::ensure!(
            name != ".." && name != ".",
            "state dir {} must not contain . or ..",
            p.display()
        );
        out.push(name);
    }
    Ok(out)
}

/// Refuses a state dir inside the served repo (or the other way round): the
/// server would then be writing (or wiping) the repo it serves.
pub fn check_disjoint(state: &Path, repo: &Path) -> Result<()> {
    let repo = repo
        .canonicalize()
        .with_context(|| format!("resolving {}", repo.display()))?;
    if state.starts_with(&repo) || repo.starts_with(state) {
        bail!(
            "--state-dir {} overlaps the served repo {}; the server never writes the repo it serves",
            state.display(),
            repo.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_uncommitted_overlay_is_removed_and_a_committed_one_outlives_it_until_retired() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let gens = Generations::open(tmp.path().join("g")).expect("open");
        let building = gens.begin().expect("begin");
        let scratch = building.path().to_owned();
        assert!(scratch.is_dir());
        drop(building);
        assert!(!scratch.exists(), "an abandoned build is removed");

        let building = gens.begin().expect("begin");
        assert_eq!(building.id(), 2);
        std::fs::write(building.path().join("config"), b"x").expect("write");
        let generation = building.commit(Vec::new(), Vec::new()).expect("commit");
        let overlay = generation.overlay.clone();
        assert_eq!(overlay, tmp.path().join("g/2"));
        assert!(overlay.join("config").is_file());
        drop(generation);
        assert!(
            !overlay.exists(),
            "a retired generation's overlay is removed"
        );
    }
}
