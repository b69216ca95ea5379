//! Images into OCI layouts: digests preserved, every blob verified, only
//! missing blobs copied, `index.json` written last.

use crate::netns::{suite_ns, SuiteNs};
use crate::support::*;
use oscontent_testkit::*;

#[test]
fn image_into_an_oci_layout_keeps_digests_and_copies_only_new_blobs() {
    let (v1, v2) = (v1(), v2());
    let ns = suite_ns("layout");
    let registry = ns_registry(&ns);
    let img1 = push_release(&registry, v1);
    let img2 = push_release(&registry, v2);
    let (_t, work) = dir();
    let layout = work.join("layout");
    let dest = format!("oci:{}", layout.display());
    let insecure = ["--insecure-registry", REGISTRY];

    let r1 = mirror(&ns, &img1, &dest, &insecure);
    assert_eq!(r1["manifest_digest"], v1.image_manifest.as_str(), "{r1}");
    assert_eq!(u64_of(&r1, "blobs_copied"), u64_of(&r1, "blobs"));
    let r2 = mirror(&ns, &img2, &dest, &insecure);
    assert_eq!(r2["manifest_digest"], v2.image_manifest.as_str(), "{r2}");
    // The same release under another tag: nothing to copy.
    let again = format!("{dest}:again");
    let r3 = mirror(&ns, &img2, &again, &insecure);
    assert_eq!(u64_of(&r3, "bytes_copied"), 0, "{r3}");
    eprintln!(
        "layout: N copied {} bytes, N+1 {} bytes, N+1 again {} bytes",
        u64_of(&r1, "bytes_copied"),
        u64_of(&r2, "bytes_copied"),
        u64_of(&r3, "bytes_copied")
    );
    // Stock tools resolve the same digests in the copy.
    for (tag, want) in [
        (v1.version.as_str(), &v1.image_manifest),
        (v2.version.as_str(), &v2.image_manifest),
        ("again", &v2.image_manifest),
    ] {
        let d = ok(std::process::Command::new("skopeo")
            .args(["inspect", "--format", "{{.Digest}}"])
            .arg(format!("oci:{}:{tag}", layout.display())));
        assert_eq!(d.trim(), want.as_str(), "{tag}");
    }

    // A damaged blob in the layout is fetched again, verified.
    let layer = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap())
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap()
        .path();
    flip_byte(&layer);
    let owner = [(&img1, v1), (&img2, v2)]
        .into_iter()
        .find(|(_, r)| {
            let m = ok(std::process::Command::new("skopeo")
                .args(["inspect", "--raw"])
                .arg(format!("oci:{}:{}", layout.display(), r.version)));
            m.contains(layer.file_name().unwrap().to_str().unwrap())
        })
        .expect("the largest blob is a layer of one of the releases");
    let r4 = mirror(&ns, owner.0, &dest, &insecure);
    assert_eq!(u64_of(&r4, "blobs_copied"), 1, "{r4}");

    // A corrupted registry blob is refused; index.json is left as it was.
    let index_before = std::fs::read(layout.join("index.json")).unwrap();
    let m: serde_json::Value = serde_json::from_str(&ok(std::process::Command::new("skopeo")
        .args(["inspect", "--raw"])
        .arg(format!("oci:{}:{}", layout.display(), v2.version))))
    .unwrap();
    let digest = m["layers"][0]["digest"].as_str().unwrap();
    flip_byte(&registry.blob_data(digest));
    let fresh = format!("oci:{}", work.join("fresh").display());
    let err = mirror_fails(&ns, &img2, &fresh, &insecure);
    assert!(err.contains("digest mismatch"), "{err}");
    assert!(!work.join("fresh/index.json").exists());
    assert_eq!(
        std::fs::read(layout.join("index.json")).unwrap(),
        index_before
    );

    // And serve --image reads the copy as it would the original.
    let server = NsServer::ready(
        &ns,
        "127.0.0.1:8080",
        &[
            "--image",
            &format!("oci:{}:{}", layout.display(), v2.version),
        ],
    );
    let summary = ns.http_get(&format!("{}/summary", server.url)).unwrap();
    assert!(!summary.is_empty());
}
