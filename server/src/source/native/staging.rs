//! What a native image gives a node to stage it in the importer's form
//! (`oscontent_format::staging`): the manifest and config bytes, verified
//! by digest as they streamed, and each chunk layer's object set, from the
//! `.file` entries the layer carried. Publication writes it into the
//! generation's overlay (`crate::publish`).

use oscontent_format::staging::{self, LayerKind, ObjectSet, StagedImage, StagedLayer};
use oscontent_format::Checksum;

/// One image's staging material.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NativeStaging {
    /// The manifest's bytes, which hash to `image.manifest`.
    pub manifest: Vec<u8>,
    /// The config's bytes, which hash to `image.config`.
    pub config: Vec<u8>,
    /// Its entry in the summary's staging index.
    pub image: StagedImage,
    /// Each chunk layer's object set, in manifest order.
    pub sets: Vec<ObjectSet>,
}

/// The image's staging material. `layers` are the manifest's layer
/// digests, `carried` the content objects of each ostree layer (the first
/// `carried.len()`; the rest are derived). `None`, and why, for an image
/// the importer could not take as staged: a digest other than sha256, a
/// layer carrying an object twice (the importer refuses it), or sizes past
/// the index's bounds.
pub fn plan(
    manifest: (&str, Vec<u8>),
    config: (&str, Vec<u8>),
    commit: Checksum,
    layers: &[String],
    carried: Vec<Vec<Checksum>>,
) -> Result<NativeStaging, String> {
    let digest = |d: &str| staging::parse_digest(d).map_err(|e| e.to_string());
    let manifest_digest = digest(manifest.0)?;
    let config_digest = digest(config.0)?;
    // Both were verified by digest as they were read; checked again here,
    // where a mix-up would publish the wrong bytes under a digest.
    for (what, d, bytes) in [
        ("manifest", manifest_digest, &manifest.1),
        ("config", config_digest, &config.1),
    ] {
        if Checksum::digest(bytes) != d {
            return Err(format!("the {what} bytes kept do not hash to {d}"));
        }
    }
    if carried.is_empty() || carried.len() > layers.len() {
        return Err(format!(
            "{} ostree layers of {} in the manifest",
            carried.len(),
            layers.len()
        ));
    }
    let mut sets = Vec::new();
    let mut staged = Vec::with_capacity(layers.len());
    let mut carried = carried.into_iter();
    for (i, l) in layers.iter().enumerate() {
        let layer_digest = digest(l)?;
        let kind = match (i, carried.next()) {
            (0, Some(_)) => LayerKind::Commit,
            (_, Some(objects)) => {
                let set = ObjectSet::new(objects).map_err(|e| format!("layer {l}: {e}"))?;
                let commit = set.build().commit.checksum;
                sets.push(set);
                LayerKind::ObjectSet(commit)
            }
            (_, None) => LayerKind::Derived,
        };
        staged.push(StagedLayer {
            digest: layer_digest,
            kind,
        });
    }
    let image = StagedImage {
        manifest: manifest_digest,
        manifest_size: manifest.1.len() as u64,
        config: config_digest,
        config_size: config.1.len() as u64,
        commit,
        layers: staged,
    };
    // The index's own rules (sizes, layer count), checked now rather than
    // when the summary is built.
    staging::StagingIndex {
        images: vec![image.clone()],
    }
    .build()
    .map_err(|e| e.to_string())?;
    Ok(NativeStaging {
        manifest: manifest.1,
        config: config.1,
        image,
        sets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(b: &[u8]) -> String {
        staging::digest_string(&Checksum::digest(b))
    }

    #[test]
    fn layers_are_the_commit_then_object_sets_then_derived() {
        let (m, c) = (b"manifest".to_vec(), b"config".to_vec());
        let layers = [d(b"l0"), d(b"l1"), d(b"l2")];
        let o = |n: u8| Checksum::from([n; 32]);
        let plan = plan(
            (&d(&m), m.clone()),
            (&d(&c), c.clone()),
            o(9),
            &layers,
            vec![vec![o(1)], vec![o(3), o(2)]],
        )
        .unwrap();
        let want_set = ObjectSet::new([o(2), o(3)]).unwrap();
        assert_eq!(plan.sets, vec![want_set.clone()]);
        let kinds: Vec<LayerKind> = plan.image.layers.iter().map(|l| l.kind).collect();
        assert_eq!(
            kinds,
            vec![
                LayerKind::Commit,
                LayerKind::ObjectSet(want_set.build().commit.checksum),
                LayerKind::Derived
            ]
        );
        assert_eq!(plan.image.manifest_size, m.len() as u64);
    }

    #[test]
    fn what_the_importer_could_not_take_is_not_staged() {
        let (m, c) = (b"manifest".to_vec(), b"config".to_vec());
        let o = Checksum::from([1; 32]);
        let layers = [d(b"l0"), d(b"l1")];
        let cases: Vec<(&str, Result<NativeStaging, String>)> = vec![
            (
                "listed twice",
                plan(
                    (&d(&m), m.clone()),
                    (&d(&c), c.clone()),
                    o,
                    &layers,
                    vec![vec![], vec![o, o]],
                ),
            ),
            (
                "do not hash",
                plan(
                    (&d(b"other"), m.clone()),
                    (&d(&c), c.clone()),
                    o,
                    &layers,
                    vec![vec![]],
                ),
            ),
            (
                "not sha256",
                plan(
                    ("sha512:00", m.clone()),
                    (&d(&c), c.clone()),
                    o,
                    &layers,
                    vec![vec![]],
                ),
            ),
            (
                "3 ostree layers of 2",
                plan(
                    (&d(&m), m.clone()),
                    (&d(&c), c.clone()),
                    o,
                    &layers,
                    vec![vec![], vec![], vec![]],
                ),
            ),
        ];
        for (want, got) in cases {
            let e = got.unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
