//! `oscontent-bundle.json`: reading it from a bundle directory. The
//! format (and its parser, which the fuzz targets build) is
//! `oscontent_parse::bundle`.

use anyhow::{Context, Result};
pub use oscontent_parse::bundle::{
    BundleManifest, ReleaseEntry, FORMAT, KIND, MANIFEST, MAX_MANIFEST_SIZE, WORK_DIR,
};
use std::path::Path;

/// Reads a manifest file, if there is one.
pub fn read_manifest(path: &Path) -> Result<Option<BundleManifest>> {
    use std::io::Read;
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
    };
    let mut buf = Vec::new();
    f.take(MAX_MANIFEST_SIZE + 1)
        .read_to_end(&mut buf)
        .with_context(|| format!("reading {}", path.display()))?;
    anyhow::ensure!(
        buf.len() as u64 <= MAX_MANIFEST_SIZE,
        "{} is over the {MAX_MANIFEST_SIZE} byte limit",
        path.display()
    );
    BundleManifest::parse(&buf, &path.display().to_string()).map(Some)
}

/// Whether `dir` is (or was meant to be) a bundle: it has a manifest, or a
/// mirror's work directory (an update in progress or interrupted).
pub fn is_bundle(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file() || dir.join(WORK_DIR).is_dir()
}
