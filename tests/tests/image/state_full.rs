//! A refresh that runs out of space in the state dir:
//! the previous generation keeps serving (`/readyz` 200), the failure is in
//! the log and `/metrics`, and the staging is cleaned. The state dir is a
//! small tmpfs of the test's own.

use crate::support::*;
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
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

/// The big native image's one file: more than the state volume, and
/// incompressible to zlib (a `.filez`: a 32 KiB window) while its zstd
/// layer is small (a 512 KiB block repeated, within zstd's window), so the
/// layer's declared size fits the volume and only the object does not.
const NATIVE_BIG: usize = 32 << 20;
const NATIVE_BLOCK: usize = 512 << 10;

/// A native image (tag `native`, as [`plain_native_image`]'s) of one
/// commit holding `NATIVE_BIG` bytes, in one zstd layer; the layout and
/// the big content object's checksum.
fn big_native_image(work: &Path) -> (PathBuf, String) {
    use oscontent_testkit::native::{native_labels, NativeLayers};
    let repo = work.join("source");
    let r = Ostree::init(&repo, "archive").unwrap();
    let tree = work.join("tree/usr/lib");
    std::fs::create_dir_all(&tree).unwrap();
    // xorshift: reproducible, and zlib cannot shrink it.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let block: Vec<u8> = (0..NATIVE_BLOCK / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect();
    let bytes = block.repeat(NATIVE_BIG / NATIVE_BLOCK);
    std::fs::write(tree.join("big"), &bytes).unwrap();
    let commit = r
        .run([
            "commit".to_owned(),
            "--orphan".into(),
            format!("--tree=dir={}", work.join("tree").display()),
            "--add-metadata-string=version=9.0".into(),
            format!("--bind-ref={TINY_REF}"),
        ])
        .unwrap()
        .trim()
        .to_owned();
    let parts = NativeLayers::read(&repo, &commit).unwrap();
    let big = parts
        .files
        .values()
        .find(|f| f.content.len() == NATIVE_BIG)
        .unwrap()
        .checksum
        .clone();
    let layers: Vec<Layer> = parts
        .layers(&[])
        .into_iter()
        .map(|t| Layer::new(t.finish(), ZSTD))
        .collect();
    assert!(
        layers[0].blob.len() < (STATE_BYTES / 4) as usize,
        "the zstd layer is small"
    );
    let final_diffid = layers.last().unwrap().diff_id.clone();
    let layout = work.join("oci");
    write_layout(
        &layout,
        "native",
        &layers,
        &native_labels(&commit, &final_diffid, "9.0"),
    );
    (layout, big)
}

/// A native layer whose object is bigger than the state volume's room
/// used to be written until the volume was full (native entries skipped
/// the free-space check legacy ones pass). Now it is refused before its
/// first byte, naming the object and the reserve; the served generation
/// keeps serving and the staging is cleaned.
#[test]
fn a_native_layer_overflowing_the_state_volume_is_refused_per_entry() {
    let small = plain_native_image(64);
    let work = tempdir();
    let (big_layout, big) = big_native_image(work.path());
    let layout = work.path().join("served");
    place_layout(&small.layout, &layout);
    let fs = SmallFs::mount(STATE_BYTES);
    let state = fs.path().join("state");
    let image = format!("oci:{}:native", layout.display());
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

    place_layout(&big_layout, &layout);
    server.sighup().unwrap();
    let errors = server.wait_stderr_lines(" ERROR ", 1, TIMEOUT).unwrap();
    assert!(
        errors.iter().any(|l| l.contains("disk full")
            && l.contains(&big[2..])
            && l.contains(&format!("({NATIVE_BIG} bytes, with"))
            && l.contains("kept in reserve")),
        "refused before writing, naming the object, its size and the reserve: {errors:?}"
    );
    assert_eq!(server.get("/readyz").unwrap().status, 200);
    assert_eq!(served_ref(&server, TINY_REF), small.commit);
    pull_and_fsck(&server, TINY_REF, &small.commit);
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
}
