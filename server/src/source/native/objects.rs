//! The archive repo a native image becomes: `srv/repo` in the staging
//! directory, the layout legacy images already have, so that publication
//! and serving do not know which kind of image it came from.
//!
//! Every object is written to `tmp/` and renamed to its name only once it
//! is verified: metadata hashes to its name (commitmeta, which has no
//! name of its own, parses as an `a{sv}`), and a content object's
//! libostree checksum, over the header built from the tar entry and its
//! xattrs and the bytes as they stream, equals its name. Paths are built
//! from parsed checksums only, never from the layer's strings.
//!
//! Re-deflating content is most of a conversion's CPU, so a content object
//! of up to [`POOLED_MAX`] bytes is read whole, verified, and only then
//! queued (at most [`QUEUE`] at a time: bounded memory) for a small pool
//! of threads to compress, write and name; bigger ones stream inline.
//! [`Objects::drain`] waits for the pool and reports its first failure;
//! until then a queued object counts as present.

use oscontent_format::filez::{ContentHasher, FileMeta, FilezWriter};
use oscontent_format::{self as format, Checksum, ObjectKind, ObjectName};
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

/// What the staged repo's `config` says: an archive repo, as served.
const CONFIG: &str = "[core]\nrepo_version=1\nmode=archive-z2\n";
/// Where objects are written before they are verified.
const TMP: &str = "tmp";
/// Largest `.commitmeta` kept: signatures are a few KiB each.
pub const MAX_COMMITMETA_SIZE: u64 = 16 << 20;
/// Read and write buffer of content objects.
const BUF: usize = 128 << 10;
/// Largest content object compressed on the pool (read whole first).
pub const POOLED_MAX: u64 = 4 << 20;
/// Content objects queued for the pool at most: with [`POOLED_MAX`], what
/// bounds the memory it holds.
pub const QUEUE: usize = 8;
/// Threads of the pool, at most.
const MAX_WORKERS: usize = 4;

/// Why an object was not written.
#[derive(Debug)]
pub enum WriteError {
    /// The object is not what its name says.
    Bad(String),
    /// The staging filesystem failed.
    Io(PathBuf, io::Error),
}

fn io_at(p: &Path) -> impl FnOnce(io::Error) -> WriteError + '_ {
    move |e| WriteError::Io(p.to_path_buf(), e)
}

/// The staged archive repo.
#[derive(Debug)]
pub struct Objects {
    repo: PathBuf,
    tmp: PathBuf,
    /// Bytes written into object files, and objects written (not
    /// counting ones already present), the pool's included.
    counts: Arc<Counts>,
    pool: Option<Pool>,
    /// Content objects handed to the pool.
    queued: HashSet<Checksum>,
}

#[derive(Debug, Default)]
struct Counts {
    written: AtomicU64,
    written_bytes: AtomicU64,
}

/// A verified content object to compress and name.
struct Job {
    tmp: PathBuf,
    dest: PathBuf,
    meta: FileMeta,
    data: Vec<u8>,
    mtime: i64,
}

#[derive(Debug)]
struct Pool {
    tx: SyncSender<Job>,
    workers: Vec<JoinHandle<()>>,
    failure: Arc<Mutex<Option<WriteError>>>,
}

impl Pool {
    fn start(counts: &Arc<Counts>) -> Self {
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let failure = Arc::new(Mutex::new(None));
        let n = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS));
        let workers = (0..n)
            .map(|_| {
                let (rx, failure, counts) = (rx.clone(), failure.clone(), counts.clone());
                std::thread::spawn(move || work(&rx, &failure, &counts))
            })
            .collect();
        Self {
            tx,
            workers,
            failure,
        }
    }

    /// Waits for every queued job; the first failure.
    fn join(self) -> Result<(), WriteError> {
        drop(self.tx);
        for w in self.workers {
            let _ = w.join();
        }
        let failure = self.failure.lock().map(|mut f| f.take());
        match failure {
            Ok(Some(e)) => Err(e),
            Ok(None) => Ok(()),
            Err(_) => Err(WriteError::Bad("a compression worker panicked".into())),
        }
    }
}

/// One worker: jobs until the queue closes; after a failure, the rest are
/// dropped (the conversion fails anyway).
fn work(rx: &Mutex<Receiver<Job>>, failure: &Mutex<Option<WriteError>>, counts: &Counts) {
    loop {
        let job = match rx.lock() {
            Ok(r) => r.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        if failure.lock().map_or(true, |f| f.is_some()) {
            continue;
        }
        if let Err(e) = compress(&job, counts) {
            let _ = std::fs::remove_file(&job.tmp);
            if let Ok(mut f) = failure.lock() {
                f.get_or_insert(e);
            }
        }
    }
}

fn compress(job: &Job, counts: &Counts) -> Result<(), WriteError> {
    let f = File::create(&job.tmp).map_err(io_at(&job.tmp))?;
    let size = job.data.len() as u64;
    let mut w = FilezWriter::new(BufWriter::with_capacity(BUF, f), &job.meta, size)
        .map_err(io_at(&job.tmp))?;
    w.write_all(&job.data).map_err(io_at(&job.tmp))?;
    let f = w
        .finish()
        .and_then(|b| b.into_inner().map_err(|e| e.into_error()))
        .map_err(io_at(&job.tmp))?;
    place(f, &job.tmp, &job.dest, job.mtime, counts)
}

/// Gives a verified temporary file its name: mode 0644 and the entry's
/// mtime (every replica serves the same Last-Modified).
fn place(f: File, tmp: &Path, dest: &Path, mtime: i64, counts: &Counts) -> Result<(), WriteError> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(io_at(tmp))?;
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(mtime.max(0) as u64);
    f.set_modified(when).map_err(io_at(tmp))?;
    let len = f.metadata().map_err(io_at(tmp))?.len();
    drop(f);
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir).map_err(io_at(dir))?;
    }
    std::fs::rename(tmp, dest).map_err(io_at(dest))?;
    counts.written.fetch_add(1, Ordering::Relaxed);
    counts.written_bytes.fetch_add(len, Ordering::Relaxed);
    Ok(())
}

impl Drop for Objects {
    /// Nothing may still write into a staging tree being removed.
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            let _ = pool.join();
        }
    }
}

impl Objects {
    /// Creates `root/srv/repo` with its `config` and `objects/`.
    pub fn create(root: &Path) -> Result<Self, WriteError> {
        let repo = root.join(crate::request::OSCONTAINER_REPO);
        let tmp = repo.join(TMP);
        for d in [repo.join("objects"), tmp.clone()] {
            std::fs::create_dir_all(&d).map_err(io_at(&d))?;
        }
        let config = repo.join("config");
        std::fs::write(&config, CONFIG).map_err(io_at(&config))?;
        let counts = Arc::new(Counts::default());
        Ok(Self {
            repo,
            tmp,
            pool: Some(Pool::start(&counts)),
            counts,
            queued: HashSet::new(),
        })
    }

    /// Bytes written into object files.
    pub fn written_bytes(&self) -> u64 {
        self.counts.written_bytes.load(Ordering::Relaxed)
    }

    /// Objects written.
    pub fn written(&self) -> u64 {
        self.counts.written.load(Ordering::Relaxed)
    }

    /// Waits until every queued object is written; the pool's first
    /// failure. Nothing can be queued afterwards.
    pub fn drain(&mut self) -> Result<(), WriteError> {
        match self.pool.take() {
            Some(pool) => pool.join(),
            None => Ok(()),
        }
    }

    pub fn path(&self, name: &ObjectName) -> PathBuf {
        self.repo.join(name.path())
    }

    /// Whether the object is already staged or queued (and so verified).
    pub fn has(&self, name: &ObjectName) -> Result<bool, WriteError> {
        if name.kind == ObjectKind::File && self.queued.contains(&name.checksum) {
            return Ok(true);
        }
        let p = self.path(name);
        match std::fs::symlink_metadata(&p) {
            Ok(m) => Ok(m.is_file()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(WriteError::Io(p, e)),
        }
    }

    /// Reads a staged object back, up to `max` bytes.
    pub fn read(&self, name: &ObjectName, max: u64) -> Result<Option<Vec<u8>>, WriteError> {
        let p = self.path(name);
        let f = match File::open(&p) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(WriteError::Io(p, e)),
        };
        let mut v = Vec::new();
        f.take(max + 1).read_to_end(&mut v).map_err(io_at(&p))?;
        if v.len() as u64 > max {
            return Err(WriteError::Bad(format!("larger than {max} bytes")));
        }
        Ok(Some(v))
    }

    /// Verifies and writes a metadata object.
    pub fn write_metadata(
        &mut self,
        name: &ObjectName,
        bytes: &[u8],
        mtime: i64,
    ) -> Result<(), WriteError> {
        check_metadata(name, bytes).map_err(WriteError::Bad)?;
        let tmp = self.tmp_path(name);
        let mut f = File::create(&tmp).map_err(io_at(&tmp))?;
        f.write_all(bytes).map_err(io_at(&tmp))?;
        place(f, &tmp, &self.path(name), mtime, &self.counts)
    }

    /// Converts a content object: `size` bytes of `data` (none for a
    /// symlink) with `meta` become a `.filez`, kept only if the content
    /// checksum is the object's name.
    pub fn write_content(
        &mut self,
        name: &ObjectName,
        meta: &FileMeta,
        size: u64,
        data: &mut dyn Read,
        mtime: i64,
    ) -> Result<(), WriteError> {
        let mut hasher = ContentHasher::new(meta).map_err(|e| WriteError::Bad(e.to_string()))?;
        if size <= POOLED_MAX && self.pool.is_some() {
            let mut data_buf = Vec::with_capacity(size as usize);
            let tmp = self.tmp_path(name);
            data.take(size)
                .read_to_end(&mut data_buf)
                .map_err(io_at(&tmp))?;
            if (data_buf.len() as u64) < size {
                let left = size - data_buf.len() as u64;
                return Err(WriteError::Bad(format!("content ends {left} bytes short")));
            }
            hasher.update(&data_buf);
            check_content(hasher, name)?;
            return self.queue(
                name.checksum,
                Job {
                    tmp,
                    dest: self.path(name),
                    meta: meta.clone(),
                    data: data_buf,
                    mtime,
                },
            );
        }
        let tmp = self.tmp_path(name);
        let f = File::create(&tmp).map_err(io_at(&tmp))?;
        let mut w =
            FilezWriter::new(BufWriter::with_capacity(BUF, f), meta, size).map_err(io_at(&tmp))?;
        let mut buf = vec![0u8; BUF];
        let mut left = size;
        while left > 0 {
            let want = buf.len().min(left.min(usize::MAX as u64) as usize);
            let n = data.read(&mut buf[..want]).map_err(io_at(&tmp))?;
            if n == 0 {
                return Err(WriteError::Bad(format!("content ends {left} bytes short")));
            }
            hasher.update(&buf[..n]);
            w.write_all(&buf[..n]).map_err(io_at(&tmp))?;
            left -= n as u64;
        }
        if let Err(e) = check_content(hasher, name) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let f = w
            .finish()
            .and_then(|b| b.into_inner().map_err(|e| e.into_error()))
            .map_err(io_at(&tmp))?;
        place(f, &tmp, &self.path(name), mtime, &self.counts)
    }

    /// Hands verified content object `checksum` to the pool; a failed
    /// pool's error, as soon as it is known.
    fn queue(&mut self, checksum: Checksum, job: Job) -> Result<(), WriteError> {
        let Some(pool) = &self.pool else {
            return Err(WriteError::Bad(
                "queued after the conversion finished".into(),
            ));
        };
        let failed = pool.failure.lock().map_or(true, |f| f.is_some());
        if failed || pool.tx.send(job).is_err() {
            return match self.drain() {
                Ok(()) => Err(WriteError::Bad("the compression pool stopped".into())),
                Err(e) => Err(e),
            };
        }
        self.queued.insert(checksum);
        Ok(())
    }

    fn tmp_path(&self, name: &ObjectName) -> PathBuf {
        self.tmp.join(format!(
            "{}.{}",
            name.checksum.to_hex(),
            name.kind.extension()
        ))
    }

    /// Removes `tmp/` once every layer is in: nothing is left there but
    /// what a refused object left, and the staging tree goes with it then.
    pub fn finish(&self) -> Result<(), WriteError> {
        std::fs::remove_dir_all(&self.tmp).map_err(io_at(&self.tmp))
    }
}

/// A content object's checksum must be its name.
fn check_content(hasher: ContentHasher, name: &ObjectName) -> Result<(), WriteError> {
    let actual = hasher.finish();
    if actual == name.checksum {
        return Ok(());
    }
    Err(WriteError::Bad(format!(
        "content does not match its name: its bytes, mode, owner and xattrs hash to {actual}"
    )))
}

/// Metadata kept verbatim must be what its name says, and parse.
fn check_metadata(name: &ObjectName, bytes: &[u8]) -> Result<(), String> {
    let hashes_to_name = || {
        let actual = Checksum::digest(bytes);
        if actual == name.checksum {
            Ok(())
        } else {
            Err(format!(
                "does not match its name: its bytes hash to {actual}"
            ))
        }
    };
    match name.kind {
        ObjectKind::Commit => {
            hashes_to_name()?;
            format::Commit::parse(bytes)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        ObjectKind::DirTree => {
            hashes_to_name()?;
            format::parse_dirtree(bytes)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        ObjectKind::DirMeta => {
            hashes_to_name()?;
            format::check_dirmeta(bytes).map_err(|e| e.to_string())
        }
        ObjectKind::CommitMeta => format::parse_normal(bytes, "a{sv}", "commitmeta")
            .map(drop)
            .map_err(|e| e.to_string()),
        ObjectKind::File => Err("a content object is not metadata".into()),
    }
}

/// The most a metadata object of `kind` may be.
pub fn max_metadata_size(kind: ObjectKind) -> u64 {
    match kind {
        ObjectKind::Commit => format::commit::MAX_COMMIT_SIZE as u64,
        ObjectKind::DirTree => format::tree::MAX_DIRTREE_SIZE as u64,
        ObjectKind::DirMeta => format::tree::MAX_DIRMETA_SIZE as u64,
        ObjectKind::CommitMeta | ObjectKind::File => MAX_COMMITMETA_SIZE,
    }
}
