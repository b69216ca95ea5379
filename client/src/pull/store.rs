//! The local repo, through libostree. Blocking: call from writer threads.
//!
//! Objects are written without a transaction and with libostree's own
//! fsync disabled: each one is written to an anonymous temporary file and
//! linked into `objects/XX/` complete (libostree's `O_TMPFILE` + `linkat`),
//! which is where the governor finds it to start its writeback. Durability
//! is the governor's job and the final barrier's (see "Writing objects" below).
//!
//! # Writing objects: libostree, no transaction, fsync off
//!
//! Metadata is written with `ostree_repo_write_metadata` (expected checksum
//! given, so libostree hashes it again and refuses a mismatch), content with
//! `ostree_repo_write_content_trusted`, **outside a transaction, with the
//! repo's fsync disabled**. Content is trusted by libostree because we hash
//! it ourselves as libostree reads it (`client/src/pull/inflate.rs`): a
//! mismatch fails the read that would hand on the last byte, before
//! libostree links the object. libostree 2022.7 hashes with GLib's portable
//! SHA-256, a quarter of a pull's CPU; `sha2` uses the CPU's SHA
//! instructions. Hostile attack 1c (one content byte changed, header and
//! size kept) is what proves the check is ours and in force. libostree then writes each object to an
//! `O_TMPFILE` in `tmp/` and links it, complete, to `objects/XX/REST.EXT`
//! (`.file` for bare modes, `.filez` for archive). That gives the governor
//! what it needs: the final path of every object the moment it exists, so it
//! can start (and later wait for) that file's writeback from our own thread.
//! Inside a transaction with fsync on, objects go to a staging directory and
//! libostree does its own `syncfs` + renames at commit, leaving us nothing to
//! pace; with fsync on and no transaction, libostree fsyncs every object
//! (stock `--per-object-fsync`, the behaviour we are trying to beat).
//!
//! Content from the server is archive `.filez` (header + raw deflate). The
//! client parses the header itself (`oscontent-format`'s `content.rs`, bounded), inflates
//! the body as it streams in, and hands libostree the uncompressed content
//! stream; for archive target repos libostree recompresses it. (The Rust
//! binding of `ostree_content_stream_parse` panics on symlinks, whose content
//! stream is NULL; doing the header ourselves avoids it and keeps parsing of
//! untrusted bytes in code we test.)
//!
//! Crash semantics: a kill (SIGKILL) at any point leaves objects that are
//! complete (linked only when fully written), a partial marker, and the old
//! ref; `tests/tests/pull/crash.rs` checks 20 such points.
//!
//! Power loss is the harder case: an object linked but not yet written back
//! may come back empty or short (XFS exposes a zero-length file rather than
//! stale data), and `has_object` would still call it present. Three rules
//! close that gap:
//! - The partial marker is made durable (`state/` fsynced) *before* the
//!   commit object is written, and an existing marker is never rewritten, so
//!   its mtime dates the first interrupted attempt. A commit object without a
//!   marker is therefore always one whose barrier completed.
//! - At start, the oldest `state/*.commitpartial` in the repo (any target,
//!   ours or stock ostree's) gives a time; every object the walk finds present
//!   whose ctime is at or after it (less 2 s for coarse timestamps) is checked
//!   with libostree's `fsck_object` before it is trusted, and deleted and
//!   fetched again if damaged (`objects_rechecked`, `objects_repaired` in
//!   `done`). Objects older than every marker were covered by a completed
//!   barrier.
//! - The ref still moves only after the barrier.
//!
//! `crash.rs::torn_objects_left_by_a_power_cut_are_fetched_again` kills a pull,
//! truncates a content object and a dirtree it wrote (what a power cut leaves),
//! and checks that the next run repairs exactly those, moves the ref, and that
//! stock `ostree fsck` then accepts v2 (it skips commits no ref points to, so
//! an unrepaired object would show there). The cost of a resume is reading back
//! what the interrupted runs wrote; an uninterrupted pull checks nothing. A
//! clock stepped backwards between the crash and the resume could date torn
//! objects before their marker; that is not handled.

use super::fetch::{BodyReader, ConsumeError};
use super::inflate::ExactInflate;
use super::space::{MinFree, SpaceGuard};
use anyhow::{anyhow, Context, Result};
use oscontent_format::content::{header_len, ArchiveHeader, HEADER_PREFIX_LEN};
use oscontent_format::{Checksum, ObjectKind};
use ostree::gio;
use ostree::glib::{self, Variant, VariantTy};
use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone)]
pub struct Store {
    pub repo: ostree::Repo,
    pub path: PathBuf,
    pub mode: ostree::RepoMode,
}

fn no_cancel() -> Option<&'static gio::Cancellable> {
    None
}

fn objtype(kind: ObjectKind) -> ostree::ObjectType {
    match kind {
        ObjectKind::Commit => ostree::ObjectType::Commit,
        ObjectKind::DirTree => ostree::ObjectType::DirTree,
        ObjectKind::DirMeta => ostree::ObjectType::DirMeta,
        ObjectKind::File => ostree::ObjectType::File,
        ObjectKind::CommitMeta => ostree::ObjectType::CommitMeta,
    }
}

/// libostree's marker of a commit whose objects may be incomplete.
const PARTIAL_SUFFIX: &str = ".commitpartial";
/// Filesystems with coarse timestamps (1 s on some) could date an object
/// written just after a marker before it.
const TIMESTAMP_MARGIN: Duration = Duration::from_secs(2);

/// libostree reports a checksum mismatch on write with this prefix.
const CORRUPTED: &str = "Corrupted";
/// Content objects above this size are refused (here, from the header,
/// and by the walk as a cap on the download). Content is streamed, so this
/// bounds disk use by a hostile server rather than memory; the largest
/// files of an OS image are a few hundred MiB.
pub const MAX_CONTENT_SIZE: u64 = 32 << 30;

impl Store {
    pub fn open(path: &Path) -> Result<Self> {
        let repo = ostree::Repo::new_for_path(path);
        repo.open(no_cancel())
            .with_context(|| format!("opening ostree repo {}", path.display()))?;
        repo.set_disable_fsync(true);
        let mode = repo.mode();
        Ok(Self {
            repo,
            path: path.to_path_buf(),
            mode,
        })
    }

    pub fn is_archive(&self) -> bool {
        self.mode == ostree::RepoMode::Archive
    }

    /// The repo directory, for `syncfs` and `fsync`.
    pub fn dir(&self) -> Result<File> {
        File::open(&self.path).with_context(|| format!("opening {}", self.path.display()))
    }

    /// `objects/XX/REST.EXT` as this repo stores the object.
    pub fn object_relpath(&self, kind: ObjectKind, c: &Checksum) -> String {
        let hex = c.to_hex();
        let ext = match kind {
            ObjectKind::File if !self.is_archive() => "file",
            k => k.extension(),
        };
        format!("objects/{}/{}.{ext}", &hex[..2], &hex[2..])
    }

    /// The object's file opened read-only for the governor, or `None` for a
    /// symlink (bare mode stores symlinks as symlinks: no data to flush).
    pub fn open_object(&self, kind: ObjectKind, c: &Checksum) -> Result<Option<File>> {
        let rel = self.object_relpath(kind, c);
        let dir = self.dir()?;
        match rustix::fs::openat(
            dir.as_fd(),
            rel.as_str(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            Ok(fd) => Ok(Some(File::from(fd))),
            Err(rustix::io::Errno::LOOP) => Ok(None),
            Err(e) => Err(anyhow!("opening {rel}: {e}")),
        }
    }

    pub fn has(&self, kind: ObjectKind, c: &Checksum) -> Result<bool> {
        self.repo
            .has_object(objtype(kind), &c.to_hex(), no_cancel())
            .with_context(|| format!("looking up {}", self.object_relpath(kind, c)))
    }

    /// A stored metadata object's bytes.
    pub fn load(&self, kind: ObjectKind, c: &Checksum) -> Result<Vec<u8>> {
        let v = self
            .repo
            .load_variant(objtype(kind), &c.to_hex())
            .with_context(|| format!("loading {}", self.object_relpath(kind, c)))?;
        Ok(v.data().to_vec())
    }

    /// Writes a metadata object whose bytes already hashed to `c`.
    /// libostree checks the checksum again as it writes.
    pub fn write_metadata(
        &self,
        kind: ObjectKind,
        c: &Checksum,
        bytes: &[u8],
        ty: &str,
    ) -> Result<()> {
        debug_assert_eq!(&Checksum::digest(bytes), c);
        let ty = VariantTy::new(ty).expect("valid type string");
        // glib keeps pointers into the buffer in child values: it must own it.
        #[allow(clippy::unnecessary_to_owned)]
        let v = Variant::from_data_with_type(bytes.to_vec(), ty);
        self.repo
            .write_metadata(objtype(kind), Some(&c.to_hex()), &v, no_cancel())
            .with_context(|| format!("writing {}", self.object_relpath(kind, c)))?;
        Ok(())
    }

    /// Writes detached metadata (`.commitmeta`) as fetched.
    pub fn write_commitmeta(&self, c: &Checksum, bytes: &[u8]) -> Result<()> {
        #[allow(clippy::unnecessary_to_owned)]
        let v = Variant::from_data_with_type(bytes.to_vec(), VariantTy::VARDICT);
        self.repo
            .write_commit_detached_metadata(&c.to_hex(), Some(&v), no_cancel())
            .with_context(|| format!("writing detached metadata of {c}"))
    }

    /// The free-space reserve this repo's config asks for.
    pub fn min_free(&self) -> Result<MinFree> {
        let kf = self.repo.copy_config();
        let get = |key: &str| kf.string("core", key).ok().map(|v| v.to_string());
        MinFree::parse(
            get("min-free-space-size").as_deref(),
            get("min-free-space-percent").as_deref(),
        )
        .with_context(|| format!("the config of {}", self.path.display()))
    }

    /// Streams an archive content object (`.filez`: header, then raw
    /// deflate) into the repo: the untrusted header is parsed and bounded
    /// here (by [`MAX_CONTENT_SIZE`], by `max_size` from the commit's
    /// `ostree.sizes`, and by the free space `space` keeps), the bytes are
    /// inflated on the fly to exactly the declared size and hashed as
    /// libostree writes them in this repo's mode; a mismatch with `c`
    /// fails before the object is linked into `objects/`.
    pub fn write_content(
        &self,
        c: &Checksum,
        mut body: BodyReader,
        space: &Arc<SpaceGuard>,
        max_size: Option<u64>,
    ) -> Result<(), ConsumeError> {
        let mut prefix = [0u8; HEADER_PREFIX_LEN];
        body.read_exact(&mut prefix)
            .map_err(|e| ConsumeError::Corrupt(anyhow!("content object {c}: header: {e}")))?;
        let hlen = header_len(&prefix)
            .map_err(|e| ConsumeError::Corrupt(anyhow!("content object {c}: {e}")))?;
        let mut hbytes = vec![0u8; hlen];
        body.read_exact(&mut hbytes)
            .map_err(|e| ConsumeError::Corrupt(anyhow!("content object {c}: header: {e}")))?;
        let header = ArchiveHeader::parse(&hbytes)
            .map_err(|e| ConsumeError::Corrupt(anyhow!("content object {c}: {e}")))?;
        if header.size > MAX_CONTENT_SIZE {
            return Err(ConsumeError::Corrupt(anyhow!(
                "content object {c}: {} bytes exceeds the {MAX_CONTENT_SIZE} byte limit",
                header.size
            )));
        }
        if let Some(max) = max_size.filter(|m| header.size > *m) {
            return Err(ConsumeError::Corrupt(anyhow!(
                "content object {c}: declares {} bytes, but its commit's ostree.sizes says {max}",
                header.size
            )));
        }
        let len = header.content_stream_len();
        let room = space
            .reserve(&format!("content object {c}"), len)
            .map_err(ConsumeError::Local)?;
        let prefix = header.content_stream_prefix();
        let mut inflate =
            ExactInflate::new(std::io::BufReader::new(body), header.size, &prefix, *c);
        inflate
            .check_empty()
            .map_err(|e| ConsumeError::Corrupt(anyhow!("content object {c}: {e}")))?;
        let refusal = inflate.refusal();
        let stream = std::io::Cursor::new(prefix).chain(room.meter(inflate, !self.is_archive()));
        let input = gio::ReadInputStream::new(stream);
        // Trusted: `inflate` has checked the checksum by the time libostree
        // has read the last byte, and fails that read otherwise.
        self.repo
            .write_content_trusted(&c.to_hex(), &input, len, no_cancel())
            .map_err(|e| match refusal.get() {
                Some(why) => ConsumeError::Corrupt(anyhow!("content object {c}: {why}")),
                None => classify(e, &format!("writing content object {c}")),
            })?;
        Ok(())
    }

    /// Whether the local commit is marked partial (`state/C.commitpartial`).
    pub fn is_partial(&self, c: &Checksum) -> Result<bool> {
        let (_, state) = self
            .repo
            .load_commit(&c.to_hex())
            .with_context(|| format!("loading commit {c}"))?;
        Ok(state.contains(ostree::RepoCommitState::PARTIAL))
    }

    /// When the oldest pull that is still marked partial in this repo
    /// began (the mtime of the oldest `state/*.commitpartial`), if any.
    /// Objects are written without fsync and linked into `objects/` at
    /// once, so after a power cut during such a pull, files created since
    /// then may be torn (empty or short) while their names say they exist.
    pub fn oldest_partial_marker(&self) -> Result<Option<SystemTime>> {
        let dir = self.path.join("state");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        let mut oldest: Option<SystemTime> = None;
        for entry in entries {
            let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
            if !entry
                .file_name()
                .to_string_lossy()
                .ends_with(PARTIAL_SUFFIX)
            {
                continue;
            }
            let m = entry
                .metadata()
                .with_context(|| format!("stat {}", entry.path().display()))?;
            let t = m
                .modified()
                .with_context(|| format!("mtime of {}", entry.path().display()))?;
            oldest = Some(oldest.map_or(t, |o| o.min(t)));
        }
        Ok(oldest)
    }

    /// Whether the object's file changed (ctime) at or after `since`, less
    /// a margin for coarse timestamps.
    pub fn changed_since(&self, kind: ObjectKind, c: &Checksum, since: SystemTime) -> Result<bool> {
        let path = self.path.join(self.object_relpath(kind, c));
        let m =
            std::fs::symlink_metadata(&path).with_context(|| format!("stat {}", path.display()))?;
        let ctime = UNIX_EPOCH
            + Duration::new(
                u64::try_from(m.ctime()).unwrap_or(0),
                u32::try_from(m.ctime_nsec()).unwrap_or(0),
            );
        Ok(ctime + TIMESTAMP_MARGIN >= since)
    }

    /// Checks a present object against its checksum (libostree's fsck of
    /// one object). One that fails is deleted so that it is fetched again;
    /// returns whether it was intact.
    pub fn recheck(&self, kind: ObjectKind, c: &Checksum) -> Result<bool> {
        let hex = c.to_hex();
        match self.repo.fsck_object(objtype(kind), &hex, no_cancel()) {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::warn!(
                    "{} is damaged ({e}); fetching it again",
                    self.object_relpath(kind, c)
                );
                self.repo
                    .delete_object(objtype(kind), &hex, no_cancel())
                    .with_context(|| {
                        format!("deleting damaged {}", self.object_relpath(kind, c))
                    })?;
                Ok(false)
            }
        }
    }

    /// Marks the commit partial, durably, before any of its objects is
    /// written: a marker lost in a power cut would let the next run take
    /// the commit for complete. An existing marker is left alone, so its
    /// mtime still dates the first interrupted attempt.
    pub fn begin_partial(&self, c: &Checksum) -> Result<()> {
        let marker = self
            .path
            .join("state")
            .join(format!("{}{PARTIAL_SUFFIX}", c.to_hex()));
        if marker.exists() {
            return Ok(());
        }
        self.mark_partial(c, true)?;
        self.sync_state_dir()
    }

    pub fn mark_partial(&self, c: &Checksum, partial: bool) -> Result<()> {
        self.repo
            .mark_commit_partial(&c.to_hex(), partial)
            .with_context(|| format!("marking commit {c} partial={partial}"))
    }

    /// Where `refspec` points: `REF` is `refs/heads/REF` only, never a
    /// remote's ref of the same name (plain `resolve_rev` falls back to
    /// those, which would make a `--url` pull judge, or skip, its move by
    /// another ref); `REMOTE:REF` is that remote's ref.
    pub fn resolve(&self, refspec: &str) -> Result<Option<Checksum>> {
        let r = self
            .repo
            .resolve_rev_ext(refspec, true, ostree::RepoResolveRevExtFlags::LOCAL_ONLY)
            .with_context(|| format!("resolving {refspec}"))?;
        r.map(|s| Checksum::from_hex(&s).map_err(anyhow::Error::from))
            .transpose()
    }

    /// Moves a ref, durably: libostree writes the new ref file with fsync
    /// enabled for this one call (write, fdatasync, rename), then the refs
    /// directory is fsynced so the rename itself survives a power cut.
    pub fn set_ref(&self, remote: Option<&str>, name: &str, c: &Checksum) -> Result<()> {
        self.repo.set_disable_fsync(false);
        let r = self
            .repo
            .set_ref_immediate(remote, name, Some(&c.to_hex()), no_cancel());
        self.repo.set_disable_fsync(true);
        r.with_context(|| format!("setting ref {name} to {c}"))?;
        let dir = match remote {
            Some(rm) => self.path.join("refs/remotes").join(rm),
            None => self.path.join("refs/heads"),
        };
        let file = dir.join(name);
        let parent = file.parent().unwrap_or(&dir);
        fsync_path(parent)
    }

    /// Makes the removal of a partial marker durable.
    pub fn sync_state_dir(&self) -> Result<()> {
        fsync_path(&self.path.join("state"))
    }

    /// The remote's URL and settings from the repo config.
    pub fn remote_url(&self, name: &str) -> Result<String> {
        Ok(self
            .repo
            .remote_get_url(name)
            .with_context(|| format!("reading remote {name:?}"))?
            .to_string())
    }

    pub fn remote_gpg_verify(&self, name: &str) -> Result<(bool, bool)> {
        let commits = self
            .repo
            .remote_get_gpg_verify(name)
            .with_context(|| format!("reading gpg-verify of remote {name:?}"))?;
        let summary = self
            .repo
            .remote_get_gpg_verify_summary(name)
            .with_context(|| format!("reading gpg-verify-summary of remote {name:?}"))?;
        Ok((commits, summary))
    }

    pub fn remote_option(&self, name: &str, key: &str) -> Result<Option<String>> {
        Ok(self
            .repo
            .remote_option(name, key, None)
            .with_context(|| format!("reading {key} of remote {name:?}"))?
            .map(|s| s.to_string()))
    }

    /// Applies a downloaded static delta directory (`superblock`, `0`,
    /// `1`, ...). libostree checks each part's checksum against the
    /// superblock and each object's checksum as it writes it.
    pub fn apply_delta(&self, dir: &Path) -> Result<(), ConsumeError> {
        let f = gio::File::for_path(dir);
        self.repo
            .static_delta_execute_offline(&f, false, no_cancel())
            .map_err(|e| classify(e, "applying the static delta"))
    }
}

/// Sorts a libostree error into "the data was bad" and "we failed".
fn classify(e: glib::Error, what: &str) -> ConsumeError {
    let msg = e.to_string();
    let err = anyhow!("{what}: {msg}");
    let io = e.kind::<gio::IOErrorEnum>();
    let local = matches!(
        io,
        Some(gio::IOErrorEnum::NoSpace)
            | Some(gio::IOErrorEnum::PermissionDenied)
            | Some(gio::IOErrorEnum::ReadOnly)
    );
    if !local
        && (msg.contains(CORRUPTED)
            || io.is_none()
            || io == Some(gio::IOErrorEnum::InvalidData)
            || io == Some(gio::IOErrorEnum::Failed))
    {
        ConsumeError::Corrupt(err)
    } else {
        ConsumeError::Local(err)
    }
}

fn fsync_path(p: &Path) -> Result<()> {
    let f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
    rustix::fs::fsync(f.as_fd()).with_context(|| format!("fsync {}", p.display()))
}
