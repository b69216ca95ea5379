//! ostree-native images, made by ostree-ext's own encapsulator (the
//! `native-*` fixtures), cross-checked against ostree-ext's importer
//! (`container::store::ImageImporter` into a bare-user repo), which is what
//! nodes on the container path run today, and against stock `ostree pull`
//! from the server streaming the same images.

use crate::support::*;
use oscontent_testkit::checkout::{
    assert_same_listing, checkout, commit_closure, listing, object_difference,
};
use oscontent_testkit::encapsulate::import;
use oscontent_testkit::fixtures::{native_small, NativeFixtures, DEFAULT_REF};
use oscontent_testkit::*;

fn fixtures() -> NativeFixtures {
    native_small().unwrap_or_else(|e| panic!("{e:#}"))
}

/// The importer, pulling from a registry as a node does, and stock `ostree
/// pull` from the server streaming the same image both reconstruct the very
/// commit the encapsulator was given: same checksum, a clean fsck, and
/// checkouts identical to the source commit's in every path, content, mode,
/// owner, xattr and symlink target.
#[test]
fn the_importer_checks_out_exactly_the_encapsulated_commit() {
    let f = fixtures();
    let v1 = &f.releases[0];
    let reg = Registry::start();
    let image = reg.push(&f.oci_layout, &v1.version, "native:v1", &[]);
    let tmp = tempdir();
    let node = tmp.path().join("node");
    let imported = import(&node, &image, true).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(imported.commit, v1.commit);
    assert_eq!(imported.manifest_digest, v1.image_manifest);
    assert_eq!(
        imported.fetched.len(),
        v1.layers.len(),
        "a fresh node fetches every layer"
    );
    let node = Ostree::at(&node);
    node.fsck().unwrap();

    // The shared fixtures are never opened by a tool that may write.
    let source = tmp.path().join("source-repo");
    copy_dir(&f.repo, &source).unwrap();
    checkout(&node, &v1.commit, &tmp.path().join("imported")).unwrap();
    checkout(
        &Ostree::at(&source),
        &v1.commit,
        &tmp.path().join("committed"),
    )
    .unwrap();
    let imported = listing(&tmp.path().join("imported")).unwrap();
    let committed = listing(&tmp.path().join("committed")).unwrap();
    assert_same_listing(&imported, &committed, "ostree-ext import", "ostree commit");
    let server = ready(image_server(&reg, std::slice::from_ref(&image)));
    let (_pulled_tmp, pulled) = pull_and_fsck(&server, DEFAULT_REF, &v1.commit);
    checkout(&pulled, &v1.commit, &tmp.path().join("pulled")).unwrap();
    let pulled = listing(&tmp.path().join("pulled")).unwrap();
    assert_same_listing(
        &imported,
        &pulled,
        "ostree-ext import",
        "ostree pull from oscontent",
    );
    // The comparison covered xattrs and special modes for real.
    let passwd = &imported["usr/bin/passwd"];
    assert!(
        passwd.xattrs.contains_key("security.capability"),
        "{passwd:?}"
    );
    assert_eq!(passwd.mode & 0o4000, 0o4000, "{passwd:?}");
    assert!(
        imported
            .values()
            .filter(|e| e.xattrs.contains_key("user.oscontent.fixture"))
            .count()
            > 10
    );
}

/// Migration: a node populated by the importer with v1 (a node as it is
/// today) moves to the server and pulls v2 with stock `ostree pull`. It
/// fetches exactly the objects v2 has and v1 lacks, and fsck is clean.
/// The server streams v2's native image from the registry.
#[test]
fn a_node_imported_from_the_registry_pulls_only_what_v2_adds() {
    let f = fixtures();
    let (v1, v2) = (&f.releases[0], &f.releases[1]);
    let reg = Registry::start();
    let image = reg.push(&f.oci_layout, &v1.version, "native:v1", &[]);
    let tmp = tempdir();
    let node_path = tmp.path().join("node");
    import(&node_path, &image, true).unwrap_or_else(|e| panic!("{e:#}"));
    let node = Ostree::at(&node_path);

    let image2 = reg.push(&f.oci_layout, &v2.version, "native:v2", &[]);
    let server = ready(image_server(&reg, &[image2]));
    let before = node.objects().unwrap();
    node.remote_add("oscontent", &server.url, &[]).unwrap();
    node.pull(&["oscontent", DEFAULT_REF])
        .unwrap_or_else(|e| panic!("{e:#}\nserver:\n{}", server.stderr()));
    assert_eq!(
        node.rev_parse(&format!("oscontent:{DEFAULT_REF}")).unwrap(),
        v2.commit
    );
    node.fsck().unwrap();
    let fetched = object_difference(&node.objects().unwrap(), &before);

    let c1 = commit_closure(&node, &v1.commit).unwrap();
    let c2 = commit_closure(&node, &v2.commit).unwrap();
    let new_in_v2 = object_difference(&c2, &c1);
    assert_eq!(
        fetched.len(),
        new_in_v2.len(),
        "fetched {fetched:?}\nv2 adds {new_in_v2:?}"
    );
    assert_eq!(fetched, new_in_v2);
    // A package-shaped update: about as many content objects as rewritten files.
    let content = new_in_v2.get(objects::CONTENT).len() as u64;
    assert!(
        content > 0 && content <= f.files_rewritten,
        "{content} of {}",
        f.files_rewritten
    );
}
