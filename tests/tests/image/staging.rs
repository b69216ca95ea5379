//! What the server publishes so that a node on the container path can be
//! staged in the importer's own form: the layer refs ostree-ext's
//! importer looks layers up by, the object-set commits they name, the
//! manifest and config by digest, and the staging index in the summary,
//! checked against the real importer (`oscontent-encapsulate import`, the
//! ostree-ext library rpm-ostree and bootc call) and stock `ostree pull`.

use crate::support::*;
use oscontent_format::staging::{
    layer_digest, layer_ref, parse_digest, LayerKind, ObjectSet, StagingIndex, LAYER_REF_PREFIX,
};
use oscontent_format::Checksum;
use oscontent_testkit::encapsulate::import;
use oscontent_testkit::fixtures::{native_small, NativeFixtures};
use oscontent_testkit::*;
use std::collections::BTreeMap;

fn fixtures() -> NativeFixtures {
    native_small().unwrap_or_else(|e| panic!("{e:#}"))
}

/// The served summary's staging index.
fn staging_index(server: &Server) -> StagingIndex {
    let s = server.summary().unwrap();
    s.staging.expect("the summary carries a staging index")
}

/// The layer refs the summary lists, name to commit.
fn served_layer_refs(server: &Server) -> BTreeMap<String, String> {
    let s = server.summary().unwrap();
    s.refs
        .iter()
        .filter(|r| r.name.starts_with(LAYER_REF_PREFIX))
        .map(|r| (r.name.clone(), r.commit.to_hex()))
        .collect()
}

fn digest(s: &str) -> Checksum {
    parse_digest(s).unwrap()
}

/// The layer refs and object-set commits a node's importer wrote for an
/// image are exactly those the server streaming the same image publishes:
/// the same names, each at the same commit (the commit layer's at the
/// image's commit, every chunk layer's at its object-set commit).
#[test]
fn the_layer_refs_are_those_the_importer_writes() {
    let f = fixtures();
    let v1 = &f.releases[0];
    let reg = Registry::start();
    let image = reg.push(&f.oci_layout, &v1.version, "native:v1", &[]);
    let tmp = tempdir();
    let node_path = tmp.path().join("node");
    import(&node_path, &image, true).unwrap_or_else(|e| panic!("{e:#}"));
    let node = Ostree::at(&node_path);
    let mut imported = BTreeMap::new();
    for r in node.refs().unwrap() {
        if r.starts_with(LAYER_REF_PREFIX) {
            let commit = node.rev_parse(&r).unwrap();
            imported.insert(r, commit);
        }
    }
    assert_eq!(imported.len(), v1.layers.len(), "{imported:?}");

    let server = ready(image_server(&reg, std::slice::from_ref(&image)));
    let served = served_layer_refs(&server);
    assert_eq!(served, imported);
    let first = layer_ref(&digest(&v1.layers[0].digest));
    assert_eq!(served[&first], v1.commit, "the commit layer's ref");
    // Each object-set commit's objects, as served, are the importer's.
    let (_pulled_tmp, pulled) = pull_and_fsck(
        &server,
        oscontent_testkit::fixtures::DEFAULT_REF,
        &v1.commit,
    );
    for l in &v1.layers[1..3] {
        let r = layer_ref(&digest(&l.digest));
        pulled.pull(&["os", &r]).unwrap();
        let listed = |repo: &Ostree, rev: &str| repo.run(["ls", "-R", "-C", rev]).unwrap();
        assert_eq!(
            listed(&pulled, &served[&r]),
            listed(&node, &imported[&r]),
            "{r}"
        );
    }
}

/// Stock `ostree pull REMOTE ostree/container/blob/…` works for every
/// layer ref of a served native image (the commit layer's with
/// `--disable-verify-bindings` when the commit binds its refs), into a
/// bare-user repo, and fsck is clean; the manifest and config are served by digest, hash to it, and
/// are cached forever; an unknown digest is 404. The staging index names
/// the image's manifest, config, commit and layers, in manifest order.
#[test]
fn stock_ostree_pulls_every_layer_ref_and_the_image_is_served_by_digest() {
    let f = fixtures();
    let v1 = &f.releases[0];
    let reg = Registry::start();
    let image = reg.push(&f.oci_layout, &v1.version, "native:v1", &[]);
    let server = ready(image_server(&reg, std::slice::from_ref(&image)));

    let index = staging_index(&server);
    assert_eq!(index.images.len(), 1);
    let staged = &index.images[0];
    assert_eq!(staged.manifest, digest(&v1.image_manifest));
    assert_eq!(staged.commit.to_hex(), v1.commit);
    let layers: Vec<Checksum> = staged.layers.iter().map(|l| l.digest).collect();
    let want: Vec<Checksum> = v1.layers.iter().map(|l| digest(&l.digest)).collect();
    assert_eq!(layers, want);
    assert_eq!(staged.layers[0].kind, LayerKind::Commit);
    assert!(staged.layers[1..]
        .iter()
        .all(|l| matches!(l.kind, LayerKind::ObjectSet(_))));

    let manifest = server
        .get(&format!("/blobs/sha256/{}", staged.manifest.to_hex()))
        .unwrap();
    assert_eq!(manifest.status, 200);
    assert_eq!(Checksum::digest(&manifest.body), staged.manifest);
    assert_eq!(manifest.body.len() as u64, staged.manifest_size);
    assert!(
        manifest
            .header("cache-control")
            .is_some_and(|c| c.contains("immutable")),
        "{:?}",
        manifest.headers
    );
    let json: serde_json::Value = serde_json::from_slice(&manifest.body).unwrap();
    assert_eq!(
        parse_digest(json["config"]["digest"].as_str().unwrap()).unwrap(),
        staged.config
    );
    let config = server
        .get(&format!("/blobs/sha256/{}", staged.config.to_hex()))
        .unwrap();
    assert_eq!(config.status, 200);
    assert_eq!(Checksum::digest(&config.body), staged.config);
    assert_eq!(config.body.len() as u64, staged.config_size);
    let json: serde_json::Value = serde_json::from_slice(&config.body).unwrap();
    assert_eq!(
        json["config"]["Labels"]["ostree.commit"],
        v1.commit.as_str()
    );
    // A layer blob, a digest nobody served, and a name that is no digest.
    for missing in [
        format!("/blobs/sha256/{}", staged.layers[1].digest.to_hex()),
        format!("/blobs/sha256/{}", "0".repeat(64)),
        "/blobs/sha256/nothex".to_owned(),
    ] {
        assert_eq!(server.get(&missing).unwrap().status, 404, "{missing}");
    }

    let refs = served_layer_refs(&server);
    assert_eq!(refs.len(), v1.layers.len());
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    repo.remote_add("os", &server.url, &[]).unwrap();
    // The commit layer's ref names the image's commit, which binds its
    // own ref only: stock ostree pulls it under the layer ref when told
    // not to check bindings (the importer's refs are no ostree branch).
    let commit_ref = layer_ref(&staged.layers[0].digest);
    let mut args = vec!["os"];
    args.extend(
        refs.keys()
            .filter(|r| **r != commit_ref)
            .map(String::as_str),
    );
    repo.pull(&args)
        .unwrap_or_else(|e| panic!("{e:#}\nserver:\n{}", server.stderr()));
    repo.pull(&["--disable-verify-bindings", "os", &commit_ref])
        .unwrap_or_else(|e| panic!("{e:#}\nserver:\n{}", server.stderr()));
    for (r, commit) in &refs {
        assert_eq!(&repo.rev_parse(&format!("os:{r}")).unwrap(), commit, "{r}");
        assert!(layer_digest(r).is_some(), "{r}");
    }
    repo.fsck().unwrap();
}

/// A hand-made native image with a derived layer, served for its base
/// commit: the index marks the derived layer and publishes no ref for it,
/// and each chunk layer's object-set commit is the one its own content
/// objects make.
#[test]
fn a_derived_layer_is_listed_but_not_staged() {
    let derived = oscontent_testkit::oci::Tar::new()
        .dir("usr")
        .dir("usr/bin")
        .file("usr/bin/added", b"#!/bin/sh\n");
    let img = native_image(
        21,
        Tamper {
            derived: vec![derived],
            ..Tamper::default()
        },
    );
    let server = ready(Server::images([img.reference()]).args([
        "--max-backoff",
        "1",
        "--serve-base-commit",
    ]));
    let index = staging_index(&server);
    let staged = &index.images[0];
    assert_eq!(staged.commit.to_hex(), img.commit);
    let kinds: Vec<LayerKind> = staged.layers.iter().map(|l| l.kind).collect();
    let set = |objects: &[String]| {
        let set = ObjectSet::new(objects.iter().map(|o| Checksum::from_hex(o).unwrap())).unwrap();
        set.build().commit.checksum
    };
    assert_eq!(
        kinds,
        vec![
            LayerKind::Commit,
            LayerKind::ObjectSet(set(&img.chunks[0])),
            LayerKind::ObjectSet(set(&img.chunks[1])),
            LayerKind::Derived,
        ]
    );
    let refs = served_layer_refs(&server);
    let derived_ref = layer_ref(&digest(&img.layer_digests[3]));
    assert!(!refs.contains_key(&derived_ref), "{refs:?}");
    assert_eq!(refs.len(), 3, "{refs:?}");
    // The object-set refs pull as they are; the commit layer's names the
    // image's commit, which binds its own refs only: stock ostree pulls it
    // under the layer ref when told not to check bindings, as the
    // importer's refs are no ostree branch.
    let commit_ref = layer_ref(&digest(&img.layer_digests[0]));
    assert_eq!(refs[&commit_ref], img.commit);
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    repo.remote_add("os", &server.url, &[]).unwrap();
    let mut args = vec!["os"];
    args.extend(
        refs.keys()
            .filter(|r| **r != commit_ref)
            .map(String::as_str),
    );
    repo.pull(&args)
        .unwrap_or_else(|e| panic!("{e:#}\nserver:\n{}", server.stderr()));
    let bound = repo.pull(&["os", &commit_ref]).unwrap_err();
    assert!(format!("{bound:#}").contains("ref binding"), "{bound:#}");
    repo.pull(&["--disable-verify-bindings", "os", &commit_ref])
        .unwrap_or_else(|e| panic!("{e:#}\nserver:\n{}", server.stderr()));
    for (r, commit) in &refs {
        assert_eq!(&repo.rev_parse(&format!("os:{r}")).unwrap(), commit, "{r}");
    }
    repo.fsck().unwrap();
}
