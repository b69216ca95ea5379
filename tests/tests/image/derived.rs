//! An image's own `summary`, `summary.sig`, refs and deltas are dropped at
//! unpack: what is served is derived from the image's commit, whatever the
//! image says.

use crate::support::*;
use oscontent_format::{build_summary, parse_summary, Checksum, DeltaName, Summary, SummaryRef};
use oscontent_testkit::*;
use std::time::Duration;

#[test]
fn an_images_own_refs_and_summary_never_win_over_the_derived_ones() {
    let older = "1".repeat(64);
    let planted = build_summary(&Summary {
        refs: vec![SummaryRef {
            name: TINY_REF.into(),
            commit: Checksum::from_hex(&older).unwrap(),
            commit_size: 1,
            timestamp: Some(1),
            version: Some("0.1".into()),
        }],
        ..Summary::default()
    })
    .unwrap();
    let empty_delta = DeltaName {
        from: None,
        to: Checksum::from_hex(&older).unwrap(),
    };
    let ref_file = format!("srv/repo/refs/heads/{TINY_REF}");
    let c = crafted(21, |t| {
        t.file(&ref_file, format!("{older}\n").as_bytes())
            .file(
                "srv/repo/refs/heads/planted",
                format!("{older}\n").as_bytes(),
            )
            .file("srv/repo/summary", &planted)
            .file(
                "srv/repo/summary.sig",
                b"an old, validly signed summary's signature",
            )
            .file(&format!("srv/repo/{}/superblock", empty_delta.dir()), b"x")
    });
    let mut server = Server::images([format!("oci:{}:{}", c.layout.display(), c.tag)])
        .args(["--max-backoff", "1"])
        .spawn()
        .unwrap();
    server
        .wait_ready(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr()));

    let summary = server.get("/summary").unwrap();
    assert_eq!(summary.status, 200);
    assert_ne!(summary.body, planted, "the image's summary was served");
    let parsed = parse_summary(&summary.body).unwrap();
    // The derived refs: the bound ref and its version ref, both at the
    // image's commit; nothing the image planted.
    let refs: Vec<(String, String)> = parsed
        .refs
        .iter()
        .map(|r| (r.name.clone(), r.commit.to_hex()))
        .collect();
    let want = [TINY_REF.to_owned(), format!("version/{}", c.version)];
    assert_eq!(
        refs,
        want.map(|n| (n, c.commit.clone())),
        "the derived refs, at the image's commit"
    );
    assert!(parsed.deltas.is_empty(), "{:?}", parsed.deltas);

    let r = server.get(&format!("/refs/heads/{TINY_REF}")).unwrap();
    assert_eq!(
        (r.status, r.body),
        (200, format!("{}\n", c.commit).into_bytes())
    );
    for gone in ["/refs/heads/planted", "/summary.sig"] {
        assert_eq!(server.get(gone).unwrap().status, 404, "{gone}");
    }
    pull_and_fsck(&server, TINY_REF, &c.commit);
}
