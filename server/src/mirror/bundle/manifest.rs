//! `oscontent-bundle.json`: reading it from a bundle directory. The
//! format (and its streaming parser, which the fuzz targets build) is
//! `oscontent_parse::bundle`.

use crate::fsutil::{open_plain, Plain};
use anyhow::{bail, Context, Result};
pub use oscontent_parse::bundle::{
    BundleManifest, ReleaseEntry, FORMAT, KIND, MANIFEST, MAX_MANIFEST_SIZE, WORK_DIR,
};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// Reads a manifest file, if there is one. Only a regular file is read (a
/// bundle arrives on untrusted media): a symlink is not followed, a FIFO
/// or device is not waited on, and one over [`MAX_MANIFEST_SIZE`] is
/// refused before a byte is read; the parser streams it, refusing every
/// count or length past its cap as it goes.
pub fn read_manifest(path: &Path) -> Result<Option<BundleManifest>> {
    let (dir, name) = match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(d), Some(n)) => (d, n),
        _ => bail!("{}: not a manifest file path", path.display()),
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let (file, meta) = match open_plain(dir, name).with_context(|| format!("opening {}", path.display()))? {
        Plain::File(f, m) => (f, m),
        Plain::Absent => return Ok(None),
        Plain::Symlink => bail!(
            "{} is a symlink: a bundle manifest is read only as a regular file, never through a link",
            path.display()
        ),
        Plain::Other(t) => bail!(
            "{} is {}, not a regular file: a bundle manifest is read only as one",
            path.display(),
            describe(t)
        ),
    };
    anyhow::ensure!(
        meta.len() <= MAX_MANIFEST_SIZE,
        "{} is {} bytes, over the {MAX_MANIFEST_SIZE} byte limit of a bundle manifest",
        path.display(),
        meta.len()
    );
    BundleManifest::read_from(file, &path.display().to_string()).map(Some)
}

fn describe(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a plain file"
    }
}

/// Whether `dir` is (or was meant to be) a bundle: it has a manifest, or a
/// mirror's work directory (an update in progress or interrupted).
pub fn is_bundle(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file() || dir.join(WORK_DIR).is_dir()
}
