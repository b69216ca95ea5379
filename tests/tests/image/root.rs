//! `serve --oscontainer DIR` and `sign --oscontainer DIR` on an
//! ostree-native image root: a native image (the testkit's layers of a
//! real commit) unpacked with `umoci unpack`, as an image volume holds
//! it. Served, pulled by stock ostree and checked out identical to the
//! source commit; signed with a bundle stock ostree verifies; a tampered
//! object refused, nothing served and nothing left.

use crate::support::*;
use oscontent_testkit::checkout::{assert_same_listing, checkout, listing};
use oscontent_testkit::native::native_object_path;
use oscontent_testkit::signing::{add_signed_remote, keygen, sign};
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `umoci unpack` of a native image: the root (`rootfs`) of the bundle.
fn unpacked(img: &NativeImage) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempdir();
    let bundle = tmp.path().join("bundle");
    let image = format!("{}:{}", img.layout.display(), img.tag);
    tool(
        Command::new("umoci")
            .args(["unpack", "--image", &image])
            .arg(&bundle),
    );
    (tmp, bundle.join("rootfs"))
}

/// Every path under `dir` with its size and mtime: what "never written"
/// compares.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.push((p, m.len(), m.mtime()));
        }
    }
    out.sort();
    out
}

#[test]
fn a_native_image_root_is_served_and_checks_out_as_the_source_commit() {
    let img = plain_native_image(21);
    let (_tmp, root) = unpacked(&img);
    let before = snapshot(&root);
    let server = ready(Server::oscontainer(&root));
    assert_eq!(served_ref(&server, TINY_REF), img.commit);
    pull_and_fsck(&server, TINY_REF, &img.commit);
    let (_pulled_tmp, pulled) = pull_bare(&server, TINY_REF, &img.commit);
    let co = tempdir();
    checkout(
        &Ostree::at(&img.source),
        &img.commit,
        &co.path().join("want"),
    )
    .unwrap();
    checkout(&pulled, &img.commit, &co.path().join("got")).unwrap();
    let want = listing(&co.path().join("want")).unwrap();
    let got = listing(&co.path().join("got")).unwrap();
    assert_same_listing(&got, &want, "the pulled checkout", "the source's");
    assert_eq!(
        want["usr/bin/hello"].xattrs.get("user.oscontent.test"),
        Some(&b"labelled".to_vec()),
        "the source has the xattr the comparison covers"
    );
    assert_eq!(snapshot(&root), before, "the served root was written to");
}

#[test]
fn a_tampered_file_in_a_native_root_is_refused_and_nothing_is_left() {
    let img = plain_native_image(22);
    let (_tmp, root) = unpacked(&img);
    let victim = biggest(&img.parts);
    let object = root.join(native_object_path(&victim, "file"));
    let mut bytes = std::fs::read(&object).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&object, bytes).unwrap();
    let state = tempdir();
    let refusal = Server::oscontainer(&root)
        .state_dir(state.path())
        .start_expect_failure()
        .unwrap();
    let e = refusal.error();
    for needle in [
        &format!("{victim}.file"),
        "content does not match its name",
        root.to_str().unwrap(),
    ] {
        assert!(e.contains(needle), "{needle:?} not in {e}");
    }
    let left: Vec<_> = std::fs::read_dir(state.path().join("native-roots"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn sign_of_a_native_root_gives_a_bundle_stock_ostree_verifies() {
    let img = plain_native_image(23);
    let (_tmp, root) = unpacked(&img);
    let keys = tempdir();
    let key = keygen(keys.path(), "release", &[]).unwrap();
    let bundle = keys.path().join("bundle");
    let source = [
        "--oscontainer".as_ref(),
        root.as_os_str(),
        "--commit".as_ref(),
        img.commit.as_ref(),
    ];
    let manifest = sign(&source, &key, &bundle).unwrap();
    assert_eq!(
        manifest["refs"][TINY_REF].as_str(),
        Some(img.commit.as_str())
    );
    let server = ready(
        Server::oscontainer(&root)
            .arg("--signatures")
            .arg(&bundle)
            .arg("--trusted-keys")
            .arg(&key.public),
    );
    let node = tempdir();
    let repo = Ostree::init(&node.path().join("repo"), "bare-user").unwrap();
    add_signed_remote(&repo, "os", &server.url, &key.public, true).unwrap();
    repo.pull(&["os", TINY_REF])
        .unwrap_or_else(|e| panic!("signed pull: {e:#}\n{}", server.stderr()));
    assert_eq!(
        repo.rev_parse(&format!("os:{TINY_REF}")).unwrap(),
        img.commit
    );
}
