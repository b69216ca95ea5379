//! The check at the site ([`verify_bundle`]) and a verified bundle as a
//! [`Remote`].

use super::manifest::{read_manifest, BundleManifest, MANIFEST, WORK_DIR};
use crate::mirror::remote::{copy_bounded, DirRemote, RateLimit, Remote};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

/// Mismatches listed in one error before "and N more".
const MAX_LISTED: usize = 10;

/// Checks every file a bundle's manifest lists (size and SHA-256), and that
/// the summary is the one it names. The error lists what does not match.
pub fn verify_bundle(dir: &Path) -> Result<BundleManifest> {
    let Some(m) = read_manifest(&dir.join(MANIFEST))? else {
        if dir.join(WORK_DIR).is_dir() {
            bail!(
                "{} is an incomplete bundle (no {MANIFEST}): a mirror into it is running or was interrupted; run the mirror again to complete it",
                dir.display()
            );
        }
        bail!("{} is not a bundle: it has no {MANIFEST}", dir.display());
    };
    let summary = m
        .files
        .get("summary")
        .with_context(|| format!("{}: the manifest lists no summary", dir.display()))?;
    anyhow::ensure!(
        summary.sha256 == m.summary_sha256,
        "{}: the manifest's summary entry and summary_sha256 disagree",
        dir.display()
    );
    let mut bad = Vec::new();
    for (rel, want) in &m.files {
        let problem = match crate::fsutil::open_file(dir, rel) {
            Ok(None) => Some("missing (or not a regular file)".to_owned()),
            Err(e) => Some(format!("unreadable: {e}")),
            Ok(Some((f, meta))) if meta.len() != want.size => {
                drop(f);
                Some(format!(
                    "{} bytes, the manifest says {}",
                    meta.len(),
                    want.size
                ))
            }
            Ok(Some((f, _))) => {
                let mut h = HashSink(Sha256::new());
                match copy_bounded(f, &mut h, want.size, rel, None) {
                    Err(e) => Some(format!("{e:#}")),
                    Ok(_) => {
                        let got = hex::encode(h.0.finalize());
                        (got != want.sha256)
                            .then(|| format!("SHA-256 {got}, the manifest says {}", want.sha256))
                    }
                }
            }
        };
        if let Some(p) = problem {
            bad.push(format!("{rel}: {p}"));
        }
    }
    if !bad.is_empty() {
        let n = bad.len();
        bad.truncate(MAX_LISTED);
        if n > MAX_LISTED {
            bad.push(format!("... and {} more", n - MAX_LISTED));
        }
        bail!(
            "bundle {} does not match its manifest ({n} file{}; tampered with or damaged in transit):\n  {}",
            dir.display(),
            if n == 1 { "" } else { "s" },
            bad.join("\n  ")
        );
    }
    Ok(m)
}

struct HashSink(Sha256);

impl Write for HashSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A verified bundle as a [`Remote`]: only the files its manifest lists,
/// each checked against its manifest entry as it is read.
#[derive(Debug)]
pub struct BundleRemote {
    dir: DirRemote,
    pub manifest: BundleManifest,
}

impl BundleRemote {
    /// Verifies the bundle ([`verify_bundle`]) and opens it.
    pub fn open(dir: &Path, limit: Option<Arc<RateLimit>>) -> Result<Self> {
        let manifest = verify_bundle(dir)?;
        Ok(Self {
            dir: DirRemote::new(dir, limit),
            manifest,
        })
    }
}

struct Tee<'a> {
    out: &'a mut dyn Write,
    hash: Sha256,
}

impl Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl Remote for BundleRemote {
    fn describe(&self) -> String {
        format!("bundle {}", self.dir.root.display())
    }

    fn copy_to(&self, rel: &str, out: &mut dyn Write, max: u64) -> Result<Option<u64>> {
        let Some(want) = self.manifest.files.get(rel) else {
            return Ok(None);
        };
        let mut tee = Tee {
            out,
            hash: Sha256::new(),
        };
        let n = self
            .dir
            .copy_to(rel, &mut tee, max.min(want.size))?
            .with_context(|| format!("{}: {rel} is listed but missing", self.describe()))?;
        let got = hex::encode(tee.hash.finalize());
        anyhow::ensure!(
            got == want.sha256 && n == want.size,
            "{}: {rel} changed since it was verified (SHA-256 {got}, the manifest says {})",
            self.describe(),
            want.sha256
        );
        Ok(Some(n))
    }
}
