//! Ostree-native images (ostree-ext's tar format): served from a layout
//! made of a real commit, pulled by stock ostree into what a node has,
//! equal to the source; and every kind of bad input refused cleanly
//! (nothing staged, nothing served, a clear error, retried).

use crate::support::*;
use oscontent_testkit::checkout::{assert_same_listing, checkout, listing};
use oscontent_testkit::native::*;
use oscontent_testkit::*;
use std::path::Path;

/// The served, pulled and checked-out commit is the source's: the same
/// checkout (content, modes, owners, xattrs, symlinks), through the
/// registry (`docker://`) with the layers split into chunks.
#[test]
fn a_native_image_is_served_and_stock_ostree_pulls_the_source_commit() {
    let img = plain_native_image(1);
    let reg = Registry::start();
    reg.push(&img.layout, &img.tag, "os:native", &[]);
    let image = reg.image("os:native");
    let server = ready(image_server(&reg, std::slice::from_ref(&image)));
    assert_eq!(served_ref(&server, TINY_REF), img.commit);
    pull_and_fsck(&server, TINY_REF, &img.commit);
    let (_tmp, pulled) = pull_bare(&server, TINY_REF, &img.commit);
    let co = tempdir();
    checkout(
        &Ostree::at(&img.source),
        &img.commit,
        &co.path().join("want"),
    )
    .unwrap();
    checkout(
        &Ostree::at(&pulled.repo),
        &img.commit,
        &co.path().join("got"),
    )
    .unwrap();
    let want = listing(&co.path().join("want")).unwrap();
    let got = listing(&co.path().join("got")).unwrap();
    assert_same_listing(&got, &want, "the pulled checkout", "the source's");
    let entry = |path: &str| {
        want.get(path)
            .unwrap_or_else(|| panic!("{path} not in the source checkout"))
    };
    assert_eq!(
        entry("usr/bin/hello").xattrs.get("user.oscontent.test"),
        Some(&b"labelled".to_vec())
    );
    assert_eq!(
        entry("usr/bin/hi").target.as_deref(),
        Some(Path::new("hello"))
    );
    assert_eq!(
        entry("etc/blob-link").target.as_deref(),
        Some(Path::new("/usr/lib/tiny/blob"))
    );
    let key = entry("etc/secret/key");
    assert_eq!((key.uid, key.gid), (1000, 27));
    assert_eq!(
        (entry("etc/secret").kind, entry("etc/secret").mode),
        ("dir", 0o700)
    );
    assert_eq!(entry("usr/bin/setuid").mode, 0o4755);
    assert_eq!(
        entry("usr/share/doc/empty").sha256.as_deref(),
        Some(sha256_hex(b"").as_str())
    );
}

/// Serves `img` from its layout; asserts it fails cleanly with `needles`
/// (and the image) in the error; the error line.
fn refused(img: &NativeImage, needles: &[&str]) -> String {
    let image = img.reference();
    let mut server = Server::images([&image])
        .args(["--max-backoff", "1"])
        .spawn()
        .unwrap();
    let mut all = vec![image.as_str()];
    all.extend_from_slice(needles);
    assert_fails_cleanly(&mut server, &all, &[&img.commit], &[TINY_REF])
}

#[test]
fn a_file_whose_content_is_not_its_name_is_refused_naming_object_and_layer() {
    let img = native_image(
        2,
        Tamper {
            parts: Some(Box::new(|p: &mut NativeLayers| {
                let victim = biggest(p);
                p.files.get_mut(&victim).unwrap().content[1000] ^= 0xff;
            })),
            ..Tamper::default()
        },
    );
    let victim = biggest(&img.parts);
    let object = format!("{victim}.file");
    let layer = img.layer_of(&victim);
    refused(&img, &[&object, &layer, "content does not match its name"]);
}

#[test]
fn a_layer_whose_content_is_not_its_diff_id_is_refused_naming_it() {
    let doctored = format!("sha256:{}", "cd".repeat(32));
    let diff_id = doctored.clone();
    let img = native_image(
        9,
        Tamper {
            layers: Some(Box::new(move |layers: &mut Vec<Layer>| {
                layers[1].diff_id = diff_id;
            })),
            ..Tamper::default()
        },
    );
    let layer = format!(
        "layer 2/{} {}",
        img.layer_digests.len(),
        img.layer_digests[1]
    );
    refused(&img, &[&layer, "rootfs.diff_ids", &doctored]);
}

#[test]
fn a_missing_object_in_the_closure_is_refused() {
    let img = native_image(
        3,
        Tamper {
            parts: Some(Box::new(|p: &mut NativeLayers| {
                let victim = biggest(p);
                p.files.remove(&victim);
            })),
            ..Tamper::default()
        },
    );
    // img.parts lost it; the source commit still names it.
    let gone = biggest(&NativeLayers::read(&img.source, &img.commit).unwrap());
    refused(
        &img,
        &[&format!("{gone}.file"), "missing", "/usr/lib/tiny/blob"],
    );
}

#[test]
fn an_xattrs_link_to_nothing_is_refused() {
    let file = {
        let img = plain_native_image(4);
        img.parts.files.values().next().unwrap().clone()
    };
    let nowhere = native_object_path(&"ab".repeat(32), "file-xattrs");
    let img = native_image(
        4,
        Tamper {
            tars: Some(Box::new(
                move |tars: &mut Vec<oscontent_testkit::oci::Tar>| {
                    let t = std::mem::take(&mut tars[1]);
                    let link = native_object_path(&file.checksum, "file-xattrs-link");
                    tars[1] = append_file(hardlink(t, &link, &nowhere), &file);
                },
            )),
            ..Tamper::default()
        },
    );
    let link = format!(
        "{}.file-xattrs-link",
        img.parts.files.values().next().unwrap().checksum
    );
    refused(&img, &[&link, "links to xattrs", "no earlier entry"]);
}

#[test]
fn a_commit_that_is_not_the_labels_is_refused() {
    let other = {
        let tmp = tempdir();
        source_commit(&tmp.path().join("r"), TINY_REF, "9", 9).unwrap()
    };
    let shown = other.clone();
    let img = native_image(
        5,
        Tamper {
            labels: Some(Box::new(move |l: &mut Vec<(&'static str, String)>| {
                l.retain(|(k, _)| *k != NATIVE_COMMIT_LABEL);
                l.push((NATIVE_COMMIT_LABEL, other));
            })),
            ..Tamper::default()
        },
    );
    refused(
        &img,
        &[
            &format!("{}.commit", img.commit),
            "is not the one its label",
            &shown,
        ],
    );
}

#[test]
fn an_escaping_entry_is_refused() {
    let img = native_image(
        6,
        Tamper {
            tars: Some(Box::new(|tars: &mut Vec<oscontent_testkit::oci::Tar>| {
                let t = std::mem::take(&mut tars[0]);
                tars[0] = t.hardlink("usr/bin/evil", "../../../etc/passwd");
            })),
            ..Tamper::default()
        },
    );
    refused(&img, &["unsafe tar entry", "usr/bin/evil", "`..`"]);
}

#[test]
fn an_image_that_is_neither_format_names_its_labels() {
    let img = native_image(
        7,
        Tamper {
            labels: Some(Box::new(|l: &mut Vec<(&'static str, String)>| {
                l.retain(|(k, _)| *k != NATIVE_COMMIT_LABEL);
            })),
            ..Tamper::default()
        },
    );
    refused(
        &img,
        &[
            "not an oscontainer",
            "ostree.final-diffid",
            "containers.bootc",
        ],
    );
}

/// A derived layer (what a Containerfile adds) is refused by default,
/// saying how many and what it means; `--serve-base-commit` serves the base.
#[test]
fn derived_layers_are_refused_unless_the_base_commit_is_asked_for() {
    let derived = oscontent_testkit::oci::Tar::new()
        .dir("usr")
        .dir("usr/bin")
        .file("usr/bin/added", b"#!/bin/sh\n");
    let img = native_image(
        8,
        Tamper {
            derived: vec![derived],
            ..Tamper::default()
        },
    );
    refused(
        &img,
        &[
            "1 derived layer(s)",
            "would not serve what the image runs",
            "--serve-base-commit",
        ],
    );
    let server = ready(Server::images([img.reference()]).args([
        "--max-backoff",
        "1",
        "--serve-base-commit",
    ]));
    assert_eq!(served_ref(&server, TINY_REF), img.commit);
    pull_and_fsck(&server, TINY_REF, &img.commit);
}

/// A native image's commit signed where the key lives (`sign --image`)
/// is served with `--trusted-keys` from the bundle (commit and summary
/// verified), and refused unsigned. The same commit encapsulated with its
/// signature (`.commitmeta` in the commit layer, as a signed commit is
/// encapsulated) serves that signature: stock ostree verifies it on pull.
#[test]
fn a_signed_native_image_is_verified_from_a_bundle_and_from_its_own_commitmeta() {
    use oscontent_testkit::signing::{add_signed_remote, keygen, sign};
    let img = plain_native_image(10);
    let t = img.work.path();
    let key = keygen(&t.join("keys"), "release", &[]).unwrap();
    let public = key.public.display().to_string();
    let bundle = t.join("bundle");
    // `sign` takes only a pinned image: the same one, by digest.
    let reg = Registry::start();
    reg.push(&img.layout, &img.tag, "native:signed", &[]);
    let pinned = reg.image(&format!("native@{}", reg.digest("native:signed")));
    let source = [
        "--image".to_owned(),
        pinned,
        "--insecure-registry".into(),
        reg.host(),
    ];
    sign(&source, &key, &bundle).unwrap();
    let commitmeta = std::fs::read(bundle.join(format!("{}.commitmeta", img.commit))).unwrap();

    let mut unsigned = Server::images([img.reference()])
        .args(["--trusted-keys", &public])
        .spawn()
        .unwrap();
    unsigned
        .wait_stderr_lines("refusing to publish", 1, START_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        unsigned.stderr().contains("no signatures"),
        "{}",
        unsigned.stderr()
    );
    assert_eq!(unsigned.get("/readyz").unwrap().status, 503);

    let mut parts = img.parts.clone();
    parts
        .metadata
        .insert(1, (img.commit.clone(), "commitmeta", commitmeta));
    let signed = relayout(&img, &parts, &t.join("signed"));
    let bundle_arg = bundle.display().to_string();
    // (case, image, server args, whether the summary is signed too)
    let cases: [(&str, String, Vec<&str>, bool); 2] = [
        (
            "bundle",
            img.reference(),
            vec!["--signatures", &bundle_arg, "--trusted-keys", &public],
            true,
        ),
        ("commitmeta in the image", signed, vec![], false),
    ];
    for (name, image, args, summary_signed) in cases {
        let server = ready(Server::images([&image]).args(args));
        assert_eq!(served_ref(&server, TINY_REF), img.commit, "{name}");
        let tmp = tempdir();
        let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
        add_signed_remote(&repo, "os", &server.url, &key.public, summary_signed).unwrap();
        repo.pull(&["os", TINY_REF])
            .unwrap_or_else(|e| panic!("{name}: verified pull: {e:#}"));
        assert_eq!(
            repo.rev_parse(&format!("os:{TINY_REF}")).unwrap(),
            img.commit
        );
        repo.fsck().unwrap();
    }
}

/// `mirror` takes native images like legacy ones: into a bundle (converted
/// and verified on the way) served with `--bundle`, and into an OCI layout
/// copy served with `--image`.
#[test]
fn native_images_mirror_into_bundles_and_layouts() {
    use oscontent_testkit::signing::server_command;
    let img = plain_native_image(11);
    let t = img.work.path();
    let bundle = t.join("bundle");
    let copy = t.join("copy");
    for dest in [
        format!("bundle:{}", bundle.display()),
        format!("oci:{}:{}", copy.display(), img.tag),
    ] {
        check_output(
            &mut server_command(["mirror", &img.reference(), &dest]),
            TOOL_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("mirror to {dest}: {e:#}"));
    }
    let bundle_arg = bundle.display().to_string();
    let servers = [
        Server::images(Vec::<String>::new()).args(["--bundle", &bundle_arg]),
        Server::images([format!("oci:{}:{}", copy.display(), img.tag)]),
    ];
    for b in servers {
        let server = ready(b);
        assert_eq!(served_ref(&server, TINY_REF), img.commit);
        pull_and_fsck(&server, TINY_REF, &img.commit);
    }
}

/// An image root whose `sysroot/ostree/repo` is not a native image's
/// (`bare-split-xattrs`) is refused naming what it is (native roots are
/// served: `root.rs`).
#[test]
fn a_root_whose_repo_is_not_a_native_images_is_refused_naming_its_mode() {
    let tmp = tempdir();
    let root = tmp.path().join("root");
    let repo = root.join("sysroot/ostree/repo");
    Ostree::init(&repo, "bare-user").unwrap();
    let refusal = Server::oscontainer(&root)
        .start_expect_failure()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let err = refusal.error();
    for needle in [
        "sysroot/ostree/repo",
        "\"bare-user\" repo",
        "\"bare-split-xattrs\"",
    ] {
        assert!(err.contains(needle), "{needle:?} in {err}");
    }
}
