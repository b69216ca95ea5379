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
