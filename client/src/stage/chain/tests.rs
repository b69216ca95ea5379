use super::*;
use serde_json::json;

const COMMIT: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const OTHER: &str = "2222222222222222222222222222222222222222222222222222222222222222";
const SET: &str = "3333333333333333333333333333333333333333333333333333333333333333";

fn layer(n: u8) -> String {
    format!("sha256:{}", hex::encode([n; 32]))
}

fn reff(d: &str) -> String {
    format!("ostree/container/blob/{}", d.replace(':', "_3A_"))
}

/// An image of a commit layer, one chunk and one derived layer, its
/// manifest and config bytes, and the index entry an honest server makes.
fn image(commit: &str) -> (Vec<u8>, Vec<u8>, ServedImage) {
    let config = json!({
        "config": {"Labels": {"ostree.commit": commit, "ostree.final-diffid": "d1"}},
        "rootfs": {"type": "layers", "diff_ids": ["d0", "d1", "d2"]},
    })
    .to_string()
    .into_bytes();
    let manifest = json!({
        "schemaVersion": 2,
        "config": {"mediaType": "c", "digest": sha256_digest(&config), "size": config.len()},
        "layers": (1..=3).map(|n| json!({"mediaType": "l", "digest": layer(n), "size": 100 * n as u64})).collect::<Vec<_>>(),
    })
    .to_string()
    .into_bytes();
    let kinds = [
        Kind::Commit,
        Kind::ObjectSet(Checksum::from_hex(SET).unwrap()),
        Kind::Derived,
    ];
    let served = ServedImage {
        config: sha256_digest(&config),
        commit: Checksum::from_hex(COMMIT).unwrap(),
        layers: (1..=3)
            .zip(kinds)
            .map(|(n, kind)| ServedLayer {
                digest: layer(n),
                ref_name: reff(&layer(n)),
                kind,
            })
            .collect(),
    };
    (manifest, config, served)
}

type Mutate = fn(&mut Vec<u8>, &mut Vec<u8>, &mut ServedImage);

#[test]
fn the_chain_from_the_digest() {
    let table: &[(&str, Mutate, Option<&str>)] = &[
        ("an honest server", |_, _, _| {}, None),
        (
            "a manifest that does not match the digest",
            |m, _, _| m.push(b' '),
            Some("it is not the pinned image"),
        ),
        (
            "an index naming another config",
            |_, _, s| s.config = layer(9),
            Some("but its manifest names"),
        ),
        (
            "a config that does not match the manifest",
            |_, c, _| c.push(b' '),
            Some("the config served for"),
        ),
        (
            "a config naming another commit",
            |_, _, s| s.commit = Checksum::from_hex(OTHER).unwrap(),
            Some("the config names commit 1111"),
        ),
        (
            "a ref for a layer the manifest lacks",
            |_, _, s| {
                s.layers[1].digest = layer(9);
                s.layers[1].ref_name = reff(&layer(9));
            },
            Some("which the manifest lacks"),
        ),
        (
            "a layer more than the manifest",
            |_, _, s| {
                let extra = s.layers[2].clone();
                s.layers.push(extra)
            },
            Some("indexes 4 layers for this image, its manifest has 3"),
        ),
        (
            "a ref name the importer never looks for",
            |_, _, s| s.layers[1].ref_name = "ostree/container/blob/other".into(),
            Some("the importer looks for"),
        ),
        (
            "a derived layer staged as an object set",
            |_, _, s| s.layers[2].kind = Kind::ObjectSet(Checksum::from_hex(SET).unwrap()),
            Some("as an object-set layer, but the image makes it a derived layer"),
        ),
        (
            "a chunk layer passed off as the commit",
            |_, _, s| s.layers[1].kind = Kind::Commit,
            Some("as the commit layer, but the image makes it an object-set layer"),
        ),
    ];
    for (name, mutate, want) in table {
        let (mut m, mut c, mut s) = image(COMMIT);
        let pinned = sha256_digest(&m);
        mutate(&mut m, &mut c, &mut s);
        // A manifest edited after pinning must still name the edited config.
        let r = check(&pinned, &m, &c, &s, reff);
        match (r, want) {
            (Ok(plan), None) => {
                assert_eq!(plan.commit.to_hex(), COMMIT);
                assert_eq!(plan.layers.len(), 3);
                assert_eq!(plan.layers[1].size, 200);
                assert_eq!(plan.layers[2].kind, Kind::Derived);
            }
            (Err(e), Some(w)) => assert!(e.to_string().contains(w), "{name}: {e}"),
            (r, w) => panic!("{name}: got {r:?}, want {w:?}"),
        }
    }
}
