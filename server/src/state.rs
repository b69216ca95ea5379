//! The state dir and the one lifecycle of a generation: begin it (its
//! overlay directory created empty), build it, commit it (hand it over to
//! be served); its overlay is removed if it is never committed, and again
//! when the generation is retired.

use crate::served::Generation;
use anyhow::{bail, Context, Result};
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

    /// The next generation, serving `sources`, with a fresh, empty
    /// overlay to build.
    pub fn begin(&self, sources: Vec<PathBuf>) -> Result<Building> {
        self.generations.begin(sources)
    }
}

/// A directory of generation overlays, numbered from 1 in this process.
#[derive(Debug)]
pub struct Generations {
    dir: PathBuf,
    next_id: AtomicU64,
}

impl Generations {
    /// Opens `dir` empty: overlays an earlier process left are removed,
    /// whether it had committed them or was still building them (a
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

    /// The next generation, serving `sources`, its overlay created empty
    /// under its final name. Nothing renames it later: what keeps a
    /// half-built overlay from being served is that only
    /// [`Building::commit`] hands its generation out, and what keeps one
    /// from outliving a crash is [`Self::open`], which removes every
    /// overlay an earlier process left.
    pub fn begin(&self, sources: Vec<PathBuf>) -> Result<Building> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let dir = self.dir.join(id.to_string());
        // Owned from here: an error below removes it.
        let guard = OverlayGuard(dir.clone());
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Building {
            generation: Generation::new(id, sources, dir, Vec::new()),
            guard,
        })
    }
}

/// A generation being built, not yet visible: publication reads its
/// commits through it, writes its overlay, sets what it serves (refs,
/// gate, signatures), generates and signs its summary, then commits it.
/// Dropped uncommitted, its overlay is removed.
#[derive(Debug)]
pub struct Building {
    generation: Generation,
    /// Holds the overlay directory.
    guard: OverlayGuard,
}

impl Building {
    pub fn id(&self) -> u64 {
        self.generation.id
    }

    /// The overlay to write into.
    pub fn path(&self) -> &Path {
        &self.guard.0
    }

    /// The generation as built so far. Its refs are listed once, at the
    /// first [`Generation::refs`], and its summary generated at the first
    /// ask: publication asks for either only once the overlay's refs are
    /// all written.
    pub fn generation(&self) -> &Generation {
        &self.generation
    }

    pub fn generation_mut(&mut self) -> &mut Generation {
        &mut self.generation
    }

    /// Hands the generation over, ready to serve, with what was cached
    /// while it was built (refs, summary, commits, open roots). Its
    /// overlay is removed when it is dropped: after a newer one is
    /// published and the last request on this one is done.
    pub fn commit(self) -> Generation {
        let Self {
            mut generation,
            guard,
        } = self;
        generation.published = std::time::SystemTime::now();
        generation.keepalive.push(Box::new(guard));
        generation
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
        let building = gens.begin(Vec::new()).expect("begin");
        let scratch = building.path().to_owned();
        assert!(scratch.is_dir());
        drop(building);
        assert!(!scratch.exists(), "an abandoned build is removed");

        let building = gens.begin(Vec::new()).expect("begin");
        assert_eq!(building.id(), 2);
        let overlay = building.path().to_owned();
        assert_eq!(overlay, tmp.path().join("g/2"));
        std::fs::write(overlay.join("config"), b"x").expect("write");
        let generation = building.commit();
        assert_eq!(generation.id, 2);
        assert_eq!(generation.overlay, overlay, "served where it was built");
        assert!(overlay.join("config").is_file());
        drop(generation);
        assert!(
            !overlay.exists(),
            "a retired generation's overlay is removed"
        );
    }

    /// What a process left in the generations directory, committed or
    /// half-built, is gone when the next one opens it.
    #[test]
    fn opening_removes_every_overlay_an_earlier_process_left() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("g");
        let gens = Generations::open(dir.clone()).expect("open");
        let served = gens.begin(Vec::new()).expect("begin").commit();
        let half_built = gens.begin(Vec::new()).expect("begin");
        std::fs::write(half_built.path().join("config"), b"x").expect("write");
        // A crash: neither is dropped.
        std::mem::forget(served);
        std::mem::forget(half_built);
        assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 2);

        let gens = Generations::open(dir.clone()).expect("reopen");
        assert_eq!(std::fs::read_dir(&dir).expect("list").count(), 0);
        assert_eq!(gens.begin(Vec::new()).expect("begin").id(), 1);
    }
}
