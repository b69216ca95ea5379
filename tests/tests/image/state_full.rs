//! A refresh that runs out of space in the state dir (issue 14, item 6):
//! the previous generation keeps serving (`/readyz` 200), the failure is in
//! the log and `/metrics`, and the staging is cleaned. The state dir is a
//! small tmpfs of the test's own.

use crate::support::*;
use oscontent_testkit::*;
use std::path::Path;
use std::time::Duration;

/// The state volume: room for the small image, not for the big one.
const STATE_BYTES: u64 = 24 << 20;
/// Zeros under `srv/repo`: tiny compressed, more than the volume unpacked.
const BIG: usize = 40 << 20;
/// Files under `srv/repo`: more than the inode-starved volume holds.
const FILES: usize = 3000;
const INODES: u64 = 2000;
const TIMEOUT: Duration = Duration::from_secs(60);

/// Puts the OCI layout `from` at `at` (replacing what was there).
fn place_layout(from: &Path, at: &Path) {
    if at.exists() {
        std::fs::remove_dir_all(at).unwrap();
    }
    copy_dir(from, at).unwrap();
}

#[test]
fn a_refresh_out_of_state_space_keeps_the_previous_generation() {
    let big = crafted(62, |t| t.file("srv/repo/zeros", &vec![0u8; BIG]));
    refresh_runs_out(&format!("size={STATE_BYTES}"), &big);
}

#[test]
fn a_refresh_out_of_state_inodes_keeps_the_previous_generation() {
    let many = crafted(63, |t| {
        (0..FILES).fold(t, |t, i| t.file(&format!("srv/repo/many/{i}"), b"x"))
    });
    refresh_runs_out(&format!("size={STATE_BYTES},nr_inodes={INODES}"), &many);
}

/// Serves a small image from a state dir on a tmpfs mounted with
/// `options`, then moves its tag to `next`, which does not fit.
fn refresh_runs_out(options: &str, next: &Crafted) {
    let small = crafted(61, |t| t);
    assert_eq!(small.tag, next.tag);
    let work = tempdir();
    let layout = work.path().join("oci");
    place_layout(&small.layout, &layout);
    let fs = SmallFs::mount_with(options);
    let state = fs.path().join("state");
    let image = format!("oci:{}:{}", layout.display(), small.tag);
    let mut server = Server::images([&image])
        .state_dir(&state)
        .args(["--max-backoff", "1"])
        .spawn()
        .unwrap();
    server
        .wait_ready(TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr()));
    assert_eq!(served_ref(&server, TINY_REF), small.commit);
    let free = fs.free();

    place_layout(&next.layout, &layout);
    server.sighup().unwrap();
    let errors = server.wait_stderr_lines(" ERROR ", 1, TIMEOUT).unwrap();
    assert!(
        errors
            .iter()
            .any(|l| l.contains("disk full") && l.contains("previous generation")),
        "the error says the state dir is full and what is still served: {errors:?}"
    );
    // Still serving the previous generation, ready.
    assert_eq!(server.get("/readyz").unwrap().status, 200);
    assert_eq!(served_ref(&server, TINY_REF), small.commit);
    pull_and_fsck(&server, TINY_REF, &small.commit);
    let m = server.metrics().unwrap();
    assert!(
        m.get("oscontent_source_checks_total", &[("result", "failed")])
            .unwrap_or(0.0)
            >= 1.0,
        "the failure is counted"
    );
    assert_eq!(m.get("oscontent_generation", &[]), Some(1.0));
    // The staging is cleaned: the space comes back (between retries).
    let cleaned = poll(TIMEOUT, || -> anyhow::Result<Option<()>> {
        let back = staging_dirs(&state).is_empty() && fs.free() + (1 << 20) >= free;
        Ok(back.then_some(()))
    })
    .unwrap();
    assert!(
        cleaned.is_some(),
        "staging {:?}, {} bytes free of {free}",
        staging_dirs(&state),
        fs.free()
    );
    drop(server);
}
