//! A `--repo` follows its repo (without `--sign-key`): a change to its
//! refs, its `summary` or `summary.sig`, or the detached metadata of the
//! commits its refs name is published by itself, verified like any
//! publication, so a mirror a cron job syncs needs no SIGHUP. inotify wakes
//! the refresher within about [`SETTLE`] of a change; a look every
//! `--signatures-poll` is the fallback (no inotify, too many directories,
//! an event the kernel dropped). What decides is a fingerprint of those
//! inputs, taken as each publication starts, so a change made while one
//! runs is published by the next. With `--sign-key` there is no following
//! at all: what a repo's writer changes must never get anything signed.

use crate::served::Generation;
use oscontent_format::{Checksum, ObjectKind, ObjectName};
use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
use sha2::{Digest, Sha256};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How long events are let settle before the repo is looked at: a sync
/// writes many files, and one publication after it is the point.
pub const SETTLE: Duration = Duration::from_millis(250);

/// Most directories watched (the root, `objects/` and its fan-out, the
/// refs tree); past it, the poll covers the rest.
const MAX_WATCHES: usize = 1024;

/// Deepest ref directory watched (as `Generation::list_refs` bounds it).
const MAX_REF_DEPTH: usize = 16;

/// Follows one repo.
#[derive(Debug)]
pub struct Follow {
    repo: PathBuf,
    /// The fallback poll.
    pub every: Duration,
    watcher: Option<Watcher>,
    /// The inputs as the last publication began; `None` before any.
    seen: Option<[u8; 32]>,
}

impl Follow {
    /// Watches `repo` with inotify if it can (else logs that the poll
    /// alone follows it).
    pub fn new(repo: &Path, every: Duration) -> Self {
        let watcher = match Watcher::new(repo) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(repo = %repo.display(), "no inotify ({e}); looking for changes every {every:?}");
                None
            }
        };
        Self {
            repo: repo.to_owned(),
            every,
            watcher,
            seen: None,
        }
    }

    /// Records the inputs as a publication begins.
    pub async fn mark(&mut self) {
        let repo = self.repo.clone();
        self.seen = tokio::task::spawn_blocking(move || fingerprint(&repo))
            .await
            .ok()
            .flatten();
    }

    /// Waits for an inotify event and lets events settle; never returns
    /// without a watcher (the poll is the caller's).
    pub async fn woken(&self) {
        match &self.watcher {
            Some(w) => {
                w.wait().await;
                tokio::time::sleep(SETTLE).await;
            }
            None => std::future::pending().await,
        }
    }

    /// Whether the inputs differ from those the last publication began
    /// with (new directories are watched on the way). A look that fails
    /// (a ref half-renamed) is no change: the next event or poll looks
    /// again.
    pub async fn changed(&self) -> bool {
        let repo = self.repo.clone();
        let rewatch = self.watcher.as_ref().map(|w| w.fd.clone());
        let now = tokio::task::spawn_blocking(move || {
            if let Some(fd) = rewatch {
                add_watches(&fd, &repo);
            }
            fingerprint(&repo)
        })
        .await
        .ok()
        .flatten();
        now.is_some() && now != self.seen
    }
}

/// An inotify descriptor read by a thread of its own (the server has no
/// `unsafe` to register it with the runtime), which wakes the refresher.
#[derive(Debug)]
struct Watcher {
    fd: Arc<OwnedFd>,
    wake: Arc<Notify>,
    stop: Arc<AtomicBool>,
}

/// How often the reading thread looks whether it should stop.
const STOP_CHECK: Duration = Duration::from_secs(1);

impl Watcher {
    fn new(repo: &Path) -> std::io::Result<Self> {
        let fd = Arc::new(inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?);
        inotify::add_watch(&*fd, repo, flags())?;
        add_watches(&fd, repo);
        let wake = Arc::new(Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (f, w, s) = (fd.clone(), wake.clone(), stop.clone());
        std::thread::Builder::new()
            .name("repo-follow".into())
            .spawn(move || read_events(&f, &w, &s))?;
        Ok(Self { fd, wake, stop })
    }

    /// Until the repo had events (a permit is kept if none waited).
    async fn wait(&self) {
        self.wake.notified().await;
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads events as they come (they only say "look") and wakes the
/// refresher, until `stop`; bounded by the server's life, and each wait by
/// [`STOP_CHECK`].
fn read_events(fd: &OwnedFd, wake: &Notify, stop: &AtomicBool) {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let timeout = Timespec {
        tv_sec: STOP_CHECK.as_secs() as i64,
        tv_nsec: 0,
    };
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::warn!("reading inotify events: {e}; polling for changes only");
                return;
            }
        }
        // Empties the queue (bounded by the kernel's max_queued_events).
        while matches!(rustix::io::read(fd, &mut buf), Ok(n) if n > 0) {}
        wake.notify_one();
    }
}

fn flags() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_TO
        | WatchFlags::MOVED_FROM
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::ONLYDIR
        | WatchFlags::DONT_FOLLOW
}

/// Watches `objects/` and its fan-out directories (detached metadata) and
/// the refs tree, up to [`MAX_WATCHES`] in all; watching one again is a
/// no-op.
fn add_watches(fd: &OwnedFd, repo: &Path) {
    let mut budget = MAX_WATCHES;
    let mut watch = |dir: &Path| -> bool {
        if budget == 0 {
            return false;
        }
        budget -= 1;
        inotify::add_watch(fd, dir, flags()).is_ok()
    };
    let subdirs = |dir: &Path| -> Vec<PathBuf> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let dirs = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()));
        dirs.take(MAX_WATCHES).map(|e| e.path()).collect()
    };
    let objects = repo.join("objects");
    if watch(&objects) {
        for fanout in subdirs(&objects) {
            watch(&fanout);
        }
    }
    let mut refs = vec![(repo.join("refs"), 0)];
    while let Some((dir, depth)) = refs.pop() {
        if !watch(&dir) || depth >= MAX_REF_DEPTH {
            continue;
        }
        refs.extend(subdirs(&dir).into_iter().map(|d| (d, depth + 1)));
    }
    if budget == 0 {
        tracing::debug!(repo = %repo.display(), "watching {MAX_WATCHES} directories; polling for the rest");
    }
}

/// What a publication of `repo` depends on that its writer changes:
/// every ref and its commit, the identity of `summary` and `summary.sig`,
/// and of each ref commit's `.commitmeta`. `None` if the refs cannot be
/// listed just now.
fn fingerprint(repo: &Path) -> Option<[u8; 32]> {
    let refs = Generation::list_refs(repo).ok()?;
    let mut h = Sha256::new();
    let mut commits: Vec<Checksum> = Vec::new();
    for r in &refs {
        h.update(format!("{:?}\0{}\0{}\n", r.namespace, r.name, r.commit));
        commits.push(r.commit);
    }
    commits.sort();
    commits.dedup();
    let files = ["summary".to_owned(), "summary.sig".to_owned()].into_iter();
    let metas = commits
        .iter()
        .map(|c| ObjectName::new(*c, ObjectKind::CommitMeta).path());
    for rel in files.chain(metas) {
        h.update(rel.as_bytes());
        match std::fs::symlink_metadata(repo.join(&rel)) {
            Ok(m) => {
                for n in [m.dev(), m.ino(), m.size()] {
                    h.update(n.to_le_bytes());
                }
                for n in [m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()] {
                    h.update(n.to_le_bytes());
                }
            }
            Err(_) => h.update([0]),
        }
    }
    Some(h.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each input a writer changes moves the fingerprint; what a
    /// publication does not depend on leaves it.
    #[test]
    fn the_fingerprint_moves_with_refs_summaries_and_detached_metadata() {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path();
        let c1 = Checksum::digest(b"one");
        let c2 = Checksum::digest(b"two");
        let meta = |c: &Checksum| repo.join(ObjectName::new(*c, ObjectKind::CommitMeta).path());
        std::fs::create_dir_all(repo.join("refs/heads/os")).expect("mkdir");
        std::fs::create_dir_all(meta(&c2).parent().expect("parent")).expect("mkdir");
        let write = |rel: &str, body: String| std::fs::write(repo.join(rel), body).expect("write");
        write("refs/heads/os/stable", format!("{c1}\n"));
        type Change<'a> = (&'a str, bool, Box<dyn Fn() + 'a>);
        let changes: Vec<Change> = vec![
            (
                "a ref moved",
                true,
                Box::new(|| write("refs/heads/os/stable", format!("{c2}\n"))),
            ),
            (
                "a ref added",
                true,
                Box::new(|| write("refs/heads/os/next", format!("{c2}\n"))),
            ),
            ("a summary", true, Box::new(|| write("summary", "s".into()))),
            (
                "a summary.sig",
                true,
                Box::new(|| write("summary.sig", "g".into())),
            ),
            (
                "a ref commit's .commitmeta",
                true,
                Box::new(|| std::fs::write(meta(&c2), "m").expect("write")),
            ),
            (
                "another file",
                false,
                Box::new(|| write("config", "[core]\n".into())),
            ),
            (
                "an object",
                false,
                Box::new(|| std::fs::write(meta(&c2).with_extension("filez"), "f").expect("write")),
            ),
        ];
        for (what, moves, change) in changes {
            let before = fingerprint(repo).expect("fingerprint");
            change();
            let after = fingerprint(repo).expect("fingerprint");
            assert_eq!(before != after, moves, "{what}");
        }
    }
}
