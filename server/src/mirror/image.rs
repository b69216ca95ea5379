//! An image source into a bundle: stream and verify the image exactly as
//! `serve --image` does (`source::fetch`), publish it with the server's own
//! deterministic code (`publish::publish_releases`, the generated summary),
//! then copy what that generation serves into the bundle through the same
//! verified walk as any other remote. So the bundle's summary is byte for
//! byte the one `serve --image SRC` publishes, which is the one a signer
//! signs with `oscontent-server sign --image SRC`.

use super::remote::GenerationRemote;
use super::sync::{self, SyncOptions};
use super::Signatures;
use crate::publish::Release;
use crate::source::{self, FetchOptions, ImageRef};
use crate::state::StateDir;
use anyhow::{Context, Result};
use oscontent_format::Checksum;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Under the work dir: staged images and the scratch state dir.
const IMAGES: &str = "images";
const STATE: &str = "state";

/// What staging the image found.
#[derive(Debug, Clone)]
pub struct StagedInfo {
    pub manifest_digest: String,
    /// Config plus layers, as stored (compressed): the image's size.
    pub compressed_bytes: u64,
    pub commit: String,
}

/// Fetches `image` into `work`, publishes it, and syncs the generation into
/// `dest`'s store. The staged image and the scratch state are removed
/// whatever happens.
pub fn sync_image(
    image: &ImageRef,
    fetch: &FetchOptions,
    signatures: &Signatures,
    dest: &super::bundle::Destination,
    opts: &SyncOptions,
) -> Result<(sync::Snapshot, StagedInfo)> {
    let images = dest.work.join(IMAGES);
    source::clean_staging(&images)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let staged = source::fetch_blocking(image, fetch, &images, &cancel)
        .with_context(|| format!("fetching {image}"))?;
    let info = StagedInfo {
        manifest_digest: staged.manifest_digest.clone(),
        compressed_bytes: staged.compressed_bytes,
        commit: staged.commit.clone(),
    };
    let root = staged.root.clone();
    let result = (|| {
        let commit: Checksum = staged
            .commit
            .parse()
            .with_context(|| format!("image {image}: its commit label"))?;
        let release = Release {
            image: image.to_string(),
            repo: staged.root.join(crate::request::OSCONTAINER_REPO),
            commit,
            version: staged.version.clone(),
            preverified: staged.format == crate::source::ImageFormat::Native,
            staging: staged.staging.clone(),
        };
        let state_root = dest.work.join(STATE);
        let state = StateDir::open(&state_root, std::slice::from_ref(&release.repo))?;
        let generation = signatures.publish_releases(&[release], &state)?;
        let remote = GenerationRemote {
            generation: Arc::new(generation),
        };
        let snap = super::update_from(dest, &remote, opts);
        drop(remote);
        let _ = std::fs::remove_dir_all(&state_root);
        snap
    })();
    if let Err(e) = std::fs::remove_dir_all(&root) {
        tracing::warn!(dir = %root.display(), "removing the staged image: {e}");
    }
    Ok((result?, info))
}

/// Removes what an interrupted image mirror left in `work`.
pub fn clean(work: &Path) -> Result<()> {
    source::clean_staging(&work.join(IMAGES))?;
    let state = work.join(STATE);
    if state.exists() {
        std::fs::remove_dir_all(&state).with_context(|| format!("removing {}", state.display()))?;
    }
    Ok(())
}
