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

use oscontent_format::filez::{ContentHasher, FileMeta, FilezWriter};
use oscontent_format::{self as format, Checksum, ObjectKind, ObjectName};
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// What the staged repo's `config` says: an archive repo, as served.
const CONFIG: &str = "[core]\nrepo_version=1\nmode=archive-z2\n";
/// Where objects are written before they are verified.
const TMP: &str = "tmp";
/// Largest `.commitmeta` kept: signatures are a few KiB each.
pub const MAX_COMMITMETA_SIZE: u64 = 16 << 20;
/// Read and write buffer of content objects.
const BUF: usize = 128 << 10;

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
    /// Bytes written into object files.
    pub written_bytes: u64,
    /// Objects written (not counting ones already present).
    pub written: u64,
}

impl Objects {
    /// Creates `root/srv/repo` with its `config` and `objects/`.
    pub fn create(root: &Path) -> Result<Self, WriteError> {
        let repo = root.join(crate::publish::OSCONTAINER_REPO);
        let tmp = repo.join(TMP);
        for d in [repo.join("objects"), tmp.clone()] {
            std::fs::create_dir_all(&d).map_err(io_at(&d))?;
        }
        let config = repo.join("config");
        std::fs::write(&config, CONFIG).map_err(io_at(&config))?;
        Ok(Self {
            repo,
            tmp,
            written_bytes: 0,
            written: 0,
        })
    }

    pub fn path(&self, name: &ObjectName) -> PathBuf {
        self.repo.join(name.path())
    }

    /// Whether the object is already staged (and so verified).
    pub fn has(&self, name: &ObjectName) -> Result<bool, WriteError> {
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
        self.place(name, f, &tmp, mtime, bytes.len() as u64)
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
        let actual = hasher.finish();
        if actual != name.checksum {
            let _ = std::fs::remove_file(&tmp);
            return Err(WriteError::Bad(format!(
                "content does not match its name: its bytes, mode, owner and xattrs hash to {actual}"
            )));
        }
        let f = w
            .finish()
            .and_then(|b| b.into_inner().map_err(|e| e.into_error()))
            .map_err(io_at(&tmp))?;
        let len = f.metadata().map_err(io_at(&tmp))?.len();
        self.place(name, f, &tmp, mtime, len)
    }

    fn tmp_path(&self, name: &ObjectName) -> PathBuf {
        self.tmp.join(format!(
            "{}.{}",
            name.checksum.to_hex(),
            name.kind.extension()
        ))
    }

    /// Gives a verified temporary file its name: mode 0644 and the entry's
    /// mtime (every replica serves the same Last-Modified).
    fn place(
        &mut self,
        name: &ObjectName,
        f: File,
        tmp: &Path,
        mtime: i64,
        len: u64,
    ) -> Result<(), WriteError> {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(io_at(tmp))?;
        let when = SystemTime::UNIX_EPOCH + Duration::from_secs(mtime.max(0) as u64);
        f.set_modified(when).map_err(io_at(tmp))?;
        drop(f);
        let dest = self.path(name);
        if let Some(dir) = dest.parent() {
            std::fs::create_dir_all(dir).map_err(io_at(dir))?;
        }
        std::fs::rename(tmp, &dest).map_err(io_at(&dest))?;
        self.written += 1;
        self.written_bytes += len;
        Ok(())
    }

    /// Removes `tmp/` once every layer is in: nothing is left there but
    /// what a refused object left, and the staging tree goes with it then.
    pub fn finish(&self) -> Result<(), WriteError> {
        std::fs::remove_dir_all(&self.tmp).map_err(io_at(&self.tmp))
    }
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
