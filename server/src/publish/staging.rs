//! A generation's staging material, for the native images it serves:
//! written into the overlay, never the source. Per image, the manifest and
//! config at `blobs/sha256/<hex>`; per chunk layer, the object-set commit,
//! dirtree and dirmeta the importer would write (served objects, added to
//! the verified set); per staged layer, the importer's layer ref; and the
//! index of them all (`STAGING_INDEX`), which the generated summary
//! carries under `oscontent.staging`.

use super::{write_file, Release};
use crate::served::STAGING_INDEX;
use crate::verify::VerifiedSet;
use anyhow::{Context, Result};
use oscontent_format::staging::{StagedImage, StagingIndex};
use oscontent_format::{Checksum, ObjectKind, ObjectName, RepoPath};
use std::collections::BTreeMap;
use std::path::Path;

/// Writes what the releases' native images need for staging into
/// `overlay`, adding the objects it writes to `set`. An image whose object
/// sets name an object the generation does not serve (outside its commit's
/// closure) is left out, logged: a node could not pull its layer refs.
pub(super) fn write_staging(
    releases: &[Release],
    overlay: &Path,
    set: &mut VerifiedSet,
) -> Result<()> {
    let mut images: BTreeMap<Checksum, StagedImage> = BTreeMap::new();
    let mut refs: BTreeMap<String, Checksum> = BTreeMap::new();
    for r in releases {
        let Some(s) = &r.staging else { continue };
        if images.contains_key(&s.image.manifest) {
            continue;
        }
        let outside = s
            .sets
            .iter()
            .flat_map(|o| o.iter())
            .find(|c| !set.contains(&ObjectName::new(**c, ObjectKind::File)));
        if let Some(c) = outside {
            tracing::warn!(image = r.image, object = %c, "not publishing the image for staging: a layer carries a content object outside its commit's closure");
            continue;
        }
        let mut layer_refs = Vec::new();
        for l in s.image.staged_layers() {
            let target = s
                .image
                .ref_target(l)
                .expect("a staged layer names a commit");
            match refs.get(&l.ref_name()) {
                Some(t) if *t != target => anyhow::bail!(
                    "image {}: layer {} would name commit {target}, another image's names {t}",
                    r.image,
                    l.digest
                ),
                _ => layer_refs.push((l.ref_name(), target)),
            }
        }
        for o in &s.sets {
            let built = o.build();
            for (b, kind) in [
                (&built.commit, ObjectKind::Commit),
                (&built.dirtree, ObjectKind::DirTree),
                (&built.dirmeta, ObjectKind::DirMeta),
            ] {
                let name = ObjectName::new(b.checksum, kind);
                if set.insert(name) {
                    write_file(&overlay.join(name.path()), &b.bytes)?;
                }
            }
        }
        for (digest, bytes) in [(s.image.manifest, &s.manifest), (s.image.config, &s.config)] {
            write_file(&overlay.join(RepoPath::Blob(digest).to_path()), bytes)?;
        }
        refs.extend(layer_refs);
        images.insert(s.image.manifest, s.image.clone());
    }
    if images.is_empty() {
        return Ok(());
    }
    for (name, commit) in &refs {
        write_file(
            &overlay.join("refs/heads").join(name),
            format!("{commit}\n").as_bytes(),
        )?;
    }
    let index = StagingIndex {
        images: images.into_values().collect(),
    };
    let bytes = index.build().context("building the staging index")?;
    write_file(&overlay.join(STAGING_INDEX), &bytes)
}
