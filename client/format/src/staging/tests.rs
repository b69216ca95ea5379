use super::*;

fn c(hex: &str) -> Checksum {
    Checksum::from_hex(hex).unwrap()
}

fn n(b: u8) -> Checksum {
    Checksum::from([b; 32])
}

/// Refs the real importer (ostree-ext 0.15.3, `oscontent-encapsulate
/// import` of the native-small fixture) wrote, and ostree-ext's own
/// examples of its escaping.
#[test]
fn layer_refs_are_the_importers() {
    let cases = [
        (
            "73ae8497d395841ce7a792ea30136d0a516a417df35df73539a26e5315a53c96",
            "ostree/container/blob/sha256_3A_73ae8497d395841ce7a792ea30136d0a516a417df35df73539a26e5315a53c96",
        ),
        (
            "8c14a37ce2403bdebd76410399d75c5a3652281963a286aef76303499623187b",
            "ostree/container/blob/sha256_3A_8c14a37ce2403bdebd76410399d75c5a3652281963a286aef76303499623187b",
        ),
    ];
    for (digest, want) in cases {
        assert_eq!(layer_ref(&c(digest)), want);
        assert_eq!(layer_digest(want), Some(c(digest)));
        crate::validate_ref(want).unwrap();
    }
    let escaped = |s: &str| {
        let mut out = String::new();
        escape_for_ref(s, &mut out);
        out
    };
    let examples = [
        ("foo/bar/baz-blah/foo", "foo/bar/baz-blah/foo"),
        (
            "localhost:5000/foo:latest",
            "localhost_3A_5000/foo_3A_latest",
        ),
        (
            "registry:quay.io/coreos/fedora:latest",
            "registry_3A_quay_2E_io/coreos/fedora_3A_latest",
        ),
        ("a_b", "a__b"),
        ("/foo/", "_2F_foo_2F_"),
        ("a//b", "a/_2F_b"),
        ("é", "_E9_"),
    ];
    for (s, want) in examples {
        assert_eq!(escaped(s), want, "{s}");
    }
}

#[test]
fn layer_digest_refuses_other_refs() {
    let d = n(0xab).to_hex();
    for r in [
        format!("ostree/container/blob/sha256_3a_{d}"),
        format!("ostree/container/blob/sha512_3A_{d}"),
        format!("ostree/container/image/sha256_3A_{d}"),
        format!("ostree/container/blob/sha256_3A_{}", d.to_uppercase()),
        format!("ostree/container/blob/sha256_3A_{d}/x"),
        "ostree/container/blob/".into(),
    ] {
        assert_eq!(layer_digest(&r), None, "{r}");
    }
}

/// Object-set commits the real importer made for two layers of the
/// native-small fixture (`ostree rev-parse` of their layer refs, and
/// `ostree ls -C` of their roots).
#[test]
fn object_set_commits_are_the_importers() {
    let seven = [
        "2829b950a72bf872491ca858dcbca1db79a5e1698a398bd40f1123593c6abfee",
        "a41a90a0cb6c3da229c178b151db6e978fa8adccb03b8793b13a511f6d4ce6cd",
        "ac6a6423db43d96be16d36099d3806efb6081391931d5150c9a1339eb9e761d9",
        "aced8f451c55e10f90f2745f08f09e0b27711f12971c1a21a634ab832fd1ba98",
        "bd2b85e6ff101b23a3ea66fda37161198c2acf41d6ee5d20eb31f2d6ca3f096d",
        "c49242ff0344214bc97a0e5eb500d6dfa4e35570d53ec52bee78c64e8d322dd9",
        "dd12836353f86f70de7e61fdd6cd2693c279193997e0b74ae52458ff7d91bb8e",
    ];
    let dirmeta = "446a0ef11b7cc167f3b603e585c7eeeeb675faa412d5ec73f62988eb0b6c5488";
    // (objects, in any order; commit; dirtree)
    let cases: [(Vec<&str>, &str, &str); 3] = [
        (
            seven.to_vec(),
            "4d55d2c342303e814da06df830745aeea338cf155e3a318173c09ce8a9f11d81",
            "966eda4840f8372233e4ae7ddd8c35a9e8050574836c0c81210f7b8bd80748a0",
        ),
        (
            seven.iter().rev().copied().collect(),
            "4d55d2c342303e814da06df830745aeea338cf155e3a318173c09ce8a9f11d81",
            "966eda4840f8372233e4ae7ddd8c35a9e8050574836c0c81210f7b8bd80748a0",
        ),
        (
            vec![],
            "6109d33e99f48e9b90cdf8ad037b8e5d20ef899697cfd3eb492cf78800aed498",
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        ),
    ];
    for (objects, commit, dirtree) in cases {
        let set = ObjectSet::new(objects.iter().map(|o| c(o))).unwrap();
        let built = set.build();
        assert_eq!(built.commit.checksum, c(commit));
        assert_eq!(built.dirtree.checksum, c(dirtree));
        assert_eq!(built.dirmeta.checksum, c(dirmeta));
        for b in [&built.commit, &built.dirtree, &built.dirmeta] {
            assert_eq!(Checksum::digest(&b.bytes), b.checksum);
        }
        let parsed = crate::Commit::parse(&built.commit.bytes).unwrap();
        assert_eq!(
            (parsed.timestamp, parsed.parent, parsed.subject.as_str()),
            (0, None, "")
        );
        assert_eq!(ObjectSet::from_dirtree(&built.dirtree.bytes).unwrap(), set);
        crate::check_dirmeta(&built.dirmeta.bytes).unwrap();
    }
}

#[test]
fn object_sets_refuse_what_the_importer_never_writes() {
    assert!(ObjectSet::new([n(1), n(2), n(1)]).is_err(), "a duplicate");
    let tree = |files: Vec<(String, Checksum)>, dirs: Vec<(&str, u8, u8)>| {
        let ay = |c: &Checksum| Variant::array_from_fixed_array(c.as_bytes());
        let f = Variant::array_from_iter_with_type(
            ty("(say)"),
            files
                .iter()
                .map(|(name, c)| Variant::tuple_from_iter([name.to_variant(), ay(c)])),
        );
        let d = Variant::array_from_iter_with_type(
            ty("(sayay)"),
            dirs.iter().map(|(name, t, m)| {
                Variant::tuple_from_iter([name.to_variant(), ay(&n(*t)), ay(&n(*m))])
            }),
        );
        Variant::tuple_from_iter([f, d]).data().to_vec()
    };
    let good = tree(vec![(n(1).to_hex(), n(1)), (n(2).to_hex(), n(2))], vec![]);
    assert_eq!(
        ObjectSet::from_dirtree(&good).unwrap(),
        ObjectSet::new([n(2), n(1)]).unwrap()
    );
    let cases = [
        ("misnamed", tree(vec![(n(1).to_hex(), n(2))], vec![])),
        ("named otherwise", tree(vec![("usr".into(), n(2))], vec![])),
        ("a subdirectory", tree(vec![], vec![("etc", 1, 2)])),
        ("not a dirtree", b"junk".to_vec()),
    ];
    for (what, bytes) in cases {
        assert!(ObjectSet::from_dirtree(&bytes).is_err(), "{what} accepted");
    }
}

fn image(m: u8) -> StagedImage {
    StagedImage {
        manifest: n(m),
        manifest_size: 14_481,
        config: n(m + 1),
        config_size: 3_000,
        commit: n(m + 2),
        layers: vec![
            StagedLayer {
                digest: n(m + 3),
                kind: LayerKind::Commit,
            },
            StagedLayer {
                digest: n(m + 4),
                kind: LayerKind::ObjectSet(n(m + 5)),
            },
            StagedLayer {
                digest: n(m + 6),
                kind: LayerKind::Derived,
            },
        ],
    }
}

#[test]
fn an_index_round_trips_sorted_whatever_the_order() {
    let index = StagingIndex {
        images: vec![image(20), image(10)],
    };
    let bytes = index.build().unwrap();
    let mut reversed = index.clone();
    reversed.images.reverse();
    assert_eq!(reversed.build().unwrap(), bytes, "deterministic");
    let back = StagingIndex::parse(&bytes).unwrap();
    assert_eq!(back.images, vec![image(10), image(20)]);
    assert_eq!(back.image(&n(20)), Some(&image(20)));
    assert_eq!(back.image(&n(99)), None);
    let i = image(10);
    let targets: Vec<_> = i.staged_layers().map(|l| i.ref_target(l)).collect();
    assert_eq!(targets, vec![Some(n(12)), Some(n(15))]);
    assert_eq!(StagingIndex::default().build().unwrap().len(), 0);
}

/// Indexes as a hostile or broken server would send them: each refusal
/// names what was wrong.
#[test]
fn an_index_refuses_what_breaks_its_rules() {
    let layer = |d: u8, kind| StagedLayer { digest: n(d), kind };
    let with = |f: &dyn Fn(&mut StagedImage)| {
        let mut i = image(10);
        f(&mut i);
        i
    };
    let cases: Vec<(&str, StagedImage)> = vec![
        (
            "manifest of",
            with(&|i| i.manifest_size = MAX_BLOB_SIZE + 1),
        ),
        ("config of", with(&|i| i.config_size = MAX_BLOB_SIZE + 1)),
        ("0 layers", with(&|i| i.layers.clear())),
        (
            "first layer is not the commit layer",
            with(&|i| {
                i.layers.remove(0);
            }),
        ),
        (
            "second commit layer",
            with(&|i| i.layers.push(layer(40, LayerKind::Commit))),
        ),
        (
            "object set after a derived",
            with(&|i| i.layers.push(layer(40, LayerKind::ObjectSet(n(41))))),
        ),
        (
            "1027 layers",
            with(&|i| {
                i.layers
                    .extend((0..MAX_LAYERS).map(|_| layer(40, LayerKind::Derived)))
            }),
        ),
    ];
    for (want, bad) in cases {
        let index = StagingIndex { images: vec![bad] };
        let e = index.build().unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
    let twice = StagingIndex {
        images: vec![image(10), image(10)],
    };
    assert!(twice.build().unwrap_err().to_string().contains("twice"));
}

// long-fn: a table of forged indexes, one row a forgery
/// Bytes no [`StagingIndex::build`] makes, forged at the GVariant level.
#[test]
fn a_forged_index_is_refused_when_parsed() {
    let forge = |manifest: &str, layers: Vec<(String, String, u8, Vec<u8>)>| {
        let l = layers.into_iter().map(|(d, r, k, t)| {
            Variant::tuple_from_iter([
                d.to_variant(),
                r.to_variant(),
                k.to_variant(),
                Variant::array_from_fixed_array(&t),
            ])
        });
        let i = Variant::tuple_from_iter([
            manifest.to_variant(),
            1u64.to_variant(),
            digest_string(&n(2)).to_variant(),
            1u64.to_variant(),
            Variant::array_from_fixed_array(n(3).as_bytes()),
            Variant::array_from_iter_with_type(ty("(ssyay)"), l),
        ]);
        Variant::array_from_iter_with_type(ty("(ststaya(ssyay))"), [i])
            .data()
            .to_vec()
    };
    let m = digest_string(&n(1));
    let commit_layer = |ref_name: String, target: Checksum| {
        (
            digest_string(&n(4)),
            ref_name,
            LayerKind::COMMIT,
            target.as_bytes().to_vec(),
        )
    };
    let good_ref = layer_ref(&n(4));
    let ok = forge(&m, vec![commit_layer(good_ref.clone(), n(3))]);
    assert_eq!(StagingIndex::parse(&ok).unwrap().images.len(), 1);
    let cases = [
        (
            "under ref",
            forge(&m, vec![commit_layer(layer_ref(&n(5)), n(3))]),
        ),
        (
            "another commit",
            forge(&m, vec![commit_layer(good_ref.clone(), n(9))]),
        ),
        (
            "not sha256",
            forge("sha512:00", vec![commit_layer(good_ref.clone(), n(3))]),
        ),
        (
            "unknown kind 7",
            forge(
                &m,
                vec![
                    commit_layer(good_ref.clone(), n(3)),
                    (digest_string(&n(5)), layer_ref(&n(5)), 7, vec![]),
                ],
            ),
        ),
        (
            "derived layer 1 names a commit",
            forge(
                &m,
                vec![
                    commit_layer(good_ref.clone(), n(3)),
                    (
                        digest_string(&n(5)),
                        layer_ref(&n(5)),
                        LayerKind::DERIVED,
                        n(6).as_bytes().to_vec(),
                    ),
                ],
            ),
        ),
        (
            "object set: 3 bytes",
            forge(
                &m,
                vec![
                    commit_layer(good_ref.clone(), n(3)),
                    (
                        digest_string(&n(5)),
                        layer_ref(&n(5)),
                        LayerKind::OBJECT_SET,
                        vec![1, 2, 3],
                    ),
                ],
            ),
        ),
    ];
    for (want, bytes) in cases {
        let e = StagingIndex::parse(&bytes).unwrap_err().to_string();
        assert!(e.contains(want), "{want}: {e}");
    }
    let mut unsorted = StagingIndex {
        images: vec![image(10), image(20)],
    }
    .to_variant()
    .unwrap();
    let children: Vec<Variant> = unsorted.iter().collect();
    unsorted =
        Variant::array_from_iter_with_type(ty("(ststaya(ssyay))"), children.into_iter().rev());
    let e = StagingIndex::parse(unsorted.data())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not strictly sorted"), "{e}");
    assert!(StagingIndex::parse(&vec![0; MAX_INDEX_SIZE + 1]).is_err());
    for junk in [&b"garbage"[..], &[0xff; 80]] {
        // Garbage either fails or parses to nothing; it never panics.
        if let Ok(i) = StagingIndex::parse(junk) {
            assert!(i.images.is_empty());
        }
    }
}
