//! `--max-image-bytes`: an image that decompresses to more is refused
//! cleanly (nothing staged, nothing served, retried), and the same image
//! within the limit is served.

use crate::support::*;
use oscontent_testkit::*;
use std::time::Duration;

#[test]
fn an_image_over_max_image_bytes_is_refused_and_served_within_it() {
    // 1 MiB of zeros beside the repo: tiny compressed, large decompressed.
    let c = crafted(31, |t| t.file("srv/repo/zeros", &vec![0u8; 1 << 20]));
    let image = format!("oci:{}:{}", c.layout.display(), c.tag);
    let mut server = Server::images([&image])
        .args(["--max-backoff", "1", "--max-image-bytes", "1000000"])
        .spawn()
        .unwrap();
    assert_fails_cleanly(
        &mut server,
        &["decompressed size", "more than 1000000 bytes decompressed"],
        &[&c.commit],
        &[TINY_REF],
    );
    drop(server);

    let mut server = Server::images([&image])
        .args(["--max-backoff", "1", "--max-image-bytes", "100000000"])
        .spawn()
        .unwrap();
    server
        .wait_ready(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr()));
    pull_and_fsck(&server, TINY_REF, &c.commit);

    let o = run_bounded(
        std::process::Command::new(server_bin()).args([
            "serve",
            "--image",
            &image,
            "--max-image-bytes",
            "0",
        ]),
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--max-image-bytes"));
}

/// The state volume: room for the small image, not for the big one.
const STATE_BYTES: u64 = 24 << 20;
/// Incompressible bytes under `srv/repo`: the layer's declared
/// (compressed) size alone is more than the volume's room.
const BIG: usize = 32 << 20;

/// `--max-image-bytes` (4 GiB by default) is more than the state volume
/// holds beside the served generation: an image whose layers the
/// manifest declares bigger than the volume's real room (statvfs, minus
/// the reserve) is refused before any layer is fetched, saying so; the
/// served generation keeps serving and the staging is cleaned.
#[test]
fn an_image_declared_bigger_than_the_state_volumes_room_is_refused_before_writing() {
    let small = crafted(71, |t| t);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let noise: Vec<u8> = (0..BIG / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    let big = crafted(72, |t| t.file("srv/repo/noise", &noise));
    assert_eq!(small.tag, big.tag);
    let work = tempdir();
    let layout = work.path().join("oci");
    copy_dir(&small.layout, &layout).unwrap();
    let fs = SmallFs::mount(STATE_BYTES);
    let state = fs.path().join("state");
    let image = format!("oci:{}:{}", layout.display(), small.tag);
    let mut server = Server::images([&image])
        .state_dir(&state)
        .args(["--max-backoff", "1"])
        .spawn()
        .unwrap();
    server
        .wait_ready(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr()));
    assert_eq!(served_ref(&server, TINY_REF), small.commit);

    std::fs::remove_dir_all(&layout).unwrap();
    copy_dir(&big.layout, &layout).unwrap();
    server.sighup().unwrap();
    let errors = server
        .wait_stderr_lines(" ERROR ", 1, Duration::from_secs(60))
        .unwrap();
    assert!(
        errors.iter().any(|l| l.contains("disk full")
            && l.contains(
                "the image's 1 layer as the manifest declares them, before fetching any"
            )
            && l.contains("kept in reserve")
            && l.contains("still serving the previous generation")),
        "refused by the declared size against the volume's room: {errors:?}"
    );
    assert_eq!(server.get("/readyz").unwrap().status, 200);
    assert_eq!(served_ref(&server, TINY_REF), small.commit);
    pull_and_fsck(&server, TINY_REF, &small.commit);
    let cleaned = poll(Duration::from_secs(60), || -> anyhow::Result<Option<()>> {
        Ok(staging_dirs(&state).is_empty().then_some(()))
    })
    .unwrap();
    assert!(
        cleaned.is_some(),
        "staging left: {:?}",
        staging_dirs(&state)
    );
}
