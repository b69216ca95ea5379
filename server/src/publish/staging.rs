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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::native::staging::{plan, NativeStaging};
    use oscontent_format::staging::digest_string;
    use std::sync::Arc;

    fn o(n: u8) -> Checksum {
        Checksum::from([n; 32])
    }

    /// A two-layer native image whose chunk layer carries `o(1)`, `o(2)`.
    fn staged() -> NativeStaging {
        let (m, c) = (b"{\"manifest\":1}".to_vec(), b"{\"config\":1}".to_vec());
        let d = |b: &[u8]| digest_string(&Checksum::digest(b));
        plan(
            (&d(&m), m.clone()),
            (&d(&c), c.clone()),
            o(9),
            &[d(b"layer 0"), d(b"layer 1")],
            vec![vec![], vec![o(1), o(2)]],
        )
        .unwrap()
    }

    fn release(s: &NativeStaging) -> Release {
        Release {
            image: "oci:/img:1".into(),
            repo: "/nonexistent".into(),
            commit: o(9),
            version: None,
            preverified: true,
            staging: Some(Arc::new(s.clone())),
        }
    }

    fn verified(objects: &[Checksum]) -> VerifiedSet {
        let mut set = VerifiedSet::default();
        for c in objects {
            set.insert(ObjectName::new(*c, ObjectKind::File));
        }
        set
    }

    #[test]
    fn an_image_is_published_for_staging_in_the_overlay() {
        let s = staged();
        let overlay = tempfile::tempdir().unwrap();
        let mut set = verified(&[o(1), o(2)]);
        write_staging(&[release(&s), release(&s)], overlay.path(), &mut set).unwrap();
        let built = s.sets[0].build();
        for (c, kind) in [
            (built.commit.checksum, ObjectKind::Commit),
            (built.dirtree.checksum, ObjectKind::DirTree),
            (built.dirmeta.checksum, ObjectKind::DirMeta),
        ] {
            let name = ObjectName::new(c, kind);
            assert!(set.contains(&name), "{name:?} is served");
            let bytes = std::fs::read(overlay.path().join(name.path())).unwrap();
            assert_eq!(Checksum::digest(&bytes), c);
        }
        let ref_of = |i: usize| {
            let l = &s.image.layers[i];
            let p = overlay.path().join("refs/heads").join(l.ref_name());
            std::fs::read_to_string(p).unwrap()
        };
        assert_eq!(ref_of(0), format!("{}\n", o(9)));
        assert_eq!(ref_of(1), format!("{}\n", built.commit.checksum));
        for (d, bytes) in [(s.image.manifest, &s.manifest), (s.image.config, &s.config)] {
            let p = overlay.path().join(RepoPath::Blob(d).to_path());
            assert_eq!(&std::fs::read(p).unwrap(), bytes);
        }
        let index = std::fs::read(overlay.path().join(STAGING_INDEX)).unwrap();
        let index = StagingIndex::parse(&index).unwrap();
        assert_eq!(index.images, vec![s.image.clone()], "listed once");
    }

    /// A layer carrying a content object its commit's closure lacks (so
    /// not served): the image is not published for staging at all.
    #[test]
    fn an_object_set_outside_the_closure_is_not_published() {
        let s = staged();
        let overlay = tempfile::tempdir().unwrap();
        let mut set = verified(&[o(1)]);
        write_staging(&[release(&s)], overlay.path(), &mut set).unwrap();
        assert_eq!(set.len(), 1, "nothing added to what is served");
        let written: Vec<_> = std::fs::read_dir(overlay.path()).unwrap().collect();
        assert!(written.is_empty(), "{written:?}");
    }
}
