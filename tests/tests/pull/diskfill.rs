//! A hostile server must not fill the node's disk. The
//! node repo lives on a small tmpfs of its own (mounted here, removed on
//! drop): the repo's `min-free-space-*` reserve holds for a legitimate
//! pull too, a `.filez` header that declares more than fits is refused
//! before a byte is written, a header may not declare more than the
//! commit's own `ostree.sizes`, and a body may not inflate past its header.

use super::guard::{expect_refusal, obj_path, source, Src, REF};
use super::support::*;
use super::support::{serve_lying, serve_lying_about};
use oscontent_testkit::proxy::Action;
use oscontent_testkit::*;
use std::io::Write;
use std::path::Path;

/// The small filesystem the node repo lives on.
const FS_BYTES: u64 = 32 << 20;
/// The big file of the commit: incompressible, well over half the fs.
const BIG: usize = 20 << 20;

fn deflate(parts: &[&[u8]]) -> Vec<u8> {
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    for p in parts {
        e.write_all(p).unwrap();
    }
    e.finish().unwrap()
}

/// A `.filez` like `genuine` (same header) but declaring `size` bytes,
/// with `body` as its raw deflate stream.
fn forged_filez(genuine: &[u8], size: u64, body: &[u8]) -> bytes::Bytes {
    let hlen = u32::from_be_bytes(genuine[..4].try_into().unwrap()) as usize;
    let mut out = genuine[..8 + hlen].to_vec();
    // The header is `(tuuuusa(ayay))`: the size, big-endian, comes first.
    out[8..16].copy_from_slice(&size.to_be_bytes());
    out.extend_from_slice(body);
    out.into()
}

/// A commit holding the big file (and a small one), with `extra` commit
/// arguments; returns it and the big file's content checksum.
fn big_source(dir: &Path, extra: &[&str]) -> (Src, Vec<u8>, String) {
    let big = noise(BIG, 7);
    let files = vec![
        ("usr/lib/big", big.clone()),
        ("etc/os-release", b"VERSION_ID=1\n".to_vec()),
        ("etc/empty", Vec::new()),
    ];
    let src = source(dir, &files, extra);
    let (checksum, _) = largest_filez(&src.repo).unwrap();
    (src, big, checksum)
}

/// A legitimate pull keeps the repo's reserve: with
/// `min-free-space-percent=50` the big file does not fit and the pull is
/// refused (exit 5, naming the object and the setting); with the stock
/// 3% it fits. Either way the reserve is still free afterwards.
#[test]
fn the_repos_reserve_is_kept() {
    let t = tempdir();
    let (src, _, big) = big_source(t.path(), &[]);
    let liar = serve_lying(&src.repo, std::sync::Arc::new(|_: &str| None));
    // (min-free-space-percent, exit)
    for (percent, code) in [(Some("50"), 5), (None, 0)] {
        let fs = SmallFs::mount(FS_BYTES);
        let node = Ostree::init(&fs.path().join("repo"), "bare-user").unwrap();
        if let Some(p) = percent {
            node.run(["config", "set", "core.min-free-space-percent", p])
                .unwrap();
        }
        let out = run_client(&pull_args(&node.repo, &liar.url, REF, &[]));
        let what = format!("min-free-space-percent {percent:?}");
        if code == 0 {
            expect_ok(&out, &what);
            node.fsck().unwrap();
            assert!(
                fs.free() >= FS_BYTES * 3 / 100,
                "{what}: {} free",
                fs.free()
            );
            continue;
        }
        expect_refusal(&out, code, &format!("content object {big}"), &what);
        expect_refusal(&out, code, "min-free-space-percent=50", &what);
        assert!(fs.free() >= FS_BYTES / 2, "{what}: {} free", fs.free());
        assert_eq!(ref_target(&node, REF), None, "{what}");
        assert!(!object_path(&node.repo, &big, "file").exists(), "{what}");
    }
}

/// A header that declares more than the filesystem holds is refused
/// before anything is inflated: the body would inflate to 64 MiB on a
/// 32 MiB filesystem, and the filesystem stays empty.
#[test]
fn a_header_declaring_too_much_is_refused_before_writing() {
    let t = tempdir();
    let (src, _, big) = big_source(t.path(), &[]);
    let genuine = std::fs::read(object_path(&src.repo, &big, "filez")).unwrap();
    let zeros = vec![0u8; 64 << 20];
    let lie = forged_filez(&genuine, 1 << 30, &deflate(&[&zeros]));
    let liar = serve_lying_about(&src.repo, &obj_path(&big, "filez"), Action::Bytes(lie));
    let fs = SmallFs::mount(FS_BYTES);
    let node = Ostree::init(&fs.path().join("repo"), "bare-user").unwrap();
    let before = fs.free();
    let out = run_client(&pull_args(&node.repo, &liar.url, REF, &[]));
    expect_refusal(
        &out,
        5,
        &format!("content object {big} ("),
        "1 GiB declared",
    );
    expect_refusal(&out, 5, "does not fit", "1 GiB declared");
    // The small objects may have landed; nothing of the lie did.
    assert!(
        fs.free() + (1 << 20) >= before,
        "{} of {before} free",
        fs.free()
    );
    assert_eq!(ref_target(&node, REF), None);
    node.fsck().unwrap();
}

/// With `ostree commit --generate-sizes`, the commit's own size list caps
/// what a header may declare (exit 3, naming `ostree.sizes`), and a
/// genuine pull of such a commit goes through.
#[test]
fn the_commits_sizes_cap_the_headers() {
    let t = tempdir();
    let (src, big_bytes, big) = big_source(t.path(), &["--generate-sizes"]);
    let node = Ostree::init(&t.path().join("genuine"), "bare-user").unwrap();
    let genuine_server = serve_lying(&src.repo, std::sync::Arc::new(|_: &str| None));
    expect_ok(
        &run_client(&pull_args(&node.repo, &genuine_server.url, REF, &[])),
        "a commit with ostree.sizes",
    );
    let genuine = std::fs::read(object_path(&src.repo, &big, "filez")).unwrap();
    let extra = vec![0u8; 1 << 20];
    let lie = forged_filez(
        &genuine,
        (BIG + extra.len()) as u64,
        &deflate(&[&big_bytes, &extra]),
    );
    let liar = serve_lying_about(&src.repo, &obj_path(&big, "filez"), Action::Bytes(lie));
    let node = Ostree::init(&t.path().join("node"), "bare-user").unwrap();
    let out = run_client(&pull_args(&node.repo, &liar.url, REF, &[]));
    expect_refusal(&out, 3, "ostree.sizes says", "a header over ostree.sizes");
    assert_eq!(ref_target(&node, REF), None);
}

/// The content checksum of the file at `path` in the commit.
fn content_checksum(src: &Src, path: &str) -> String {
    let out = Ostree::at(&src.repo)
        .run(["ls", "-C", &src.commit, path])
        .unwrap();
    // `-00644 0 0 SIZE CHECKSUM PATH`
    out.split_whitespace().nth(4).unwrap().to_owned()
}

/// A body that inflates past the size its header declares is refused
/// (exit 3), not cut at the size and accepted: for a big file, and for an
/// empty one (whose body libostree never reads).
#[test]
fn a_body_longer_than_its_header_is_refused() {
    let t = tempdir();
    let (src, big_bytes, big) = big_source(t.path(), &[]);
    let empty = content_checksum(&src, "/etc/empty");
    // (file, its bytes, declared size)
    let cases = [
        (big.as_str(), big_bytes.as_slice(), BIG as u64),
        (&empty, &[], 0),
    ];
    for (i, (c, bytes, size)) in cases.into_iter().enumerate() {
        let genuine = std::fs::read(object_path(&src.repo, c, "filez")).unwrap();
        let lie = forged_filez(&genuine, size, &deflate(&[bytes, b"and then some more"]));
        let liar = serve_lying_about(&src.repo, &obj_path(c, "filez"), Action::Bytes(lie));
        let node = Ostree::init(&t.path().join(format!("node{i}")), "bare-user").unwrap();
        let out = run_client(&pull_args(&node.repo, &liar.url, REF, &[]));
        let what = format!("surplus after the {size} bytes declared");
        expect_refusal(&out, 3, "more than the", &what);
        expect_refusal(&out, 3, &format!("content object {c}"), &what);
        assert_eq!(ref_target(&node, REF), None, "{what}");
        assert!(!object_path(&node.repo, c, "file").exists(), "{what}");
    }
}

/// C1: the `.filez` bomb against a commit made by stock `ostree commit`
/// (no `ostree.sizes`, so nothing vouches for a header's size): eight
/// files, each header declaring 8 MiB of a body that inflates to zeros,
/// fetched eight at a time onto a 32 MiB filesystem. However the headers
/// lie, what is written at any moment stays above the repo's reserve
/// (3%): each declared size is promised before its first byte is written,
/// and a body is cut at its declared size. The pull is refused and the
/// ref does not move.
#[test]
fn a_filez_bomb_without_ostree_sizes_never_writes_past_the_reserve() {
    const DECLARED: u64 = 8 << 20;
    let t = tempdir();
    let files: Vec<(String, Vec<u8>)> = (0..8)
        .map(|i| (format!("usr/lib/f{i}"), noise(1 << 20, 100 + i)))
        .collect();
    let borrowed: Vec<(&str, Vec<u8>)> =
        files.iter().map(|(p, b)| (p.as_str(), b.clone())).collect();
    let src = source(t.path(), &borrowed, &[]);
    let commit = Ostree::at(&src.repo)
        .run(["show", "--print-metadata-key=ostree.sizes", &src.commit])
        .is_err();
    assert!(commit, "stock ostree commit writes no ostree.sizes");
    let zeros = vec![0u8; DECLARED as usize + (1 << 20)];
    let body = deflate(&[&zeros]);
    let mut lies = std::collections::HashMap::new();
    for (p, _) in &files {
        let c = content_checksum(&src, &format!("/{p}"));
        let genuine = std::fs::read(object_path(&src.repo, &c, "filez")).unwrap();
        lies.insert(
            obj_path(&c, "filez"),
            forged_filez(&genuine, DECLARED, &body),
        );
    }
    let liar = serve_lying(
        &src.repo,
        std::sync::Arc::new(move |p: &str| lies.get(p).map(|b| Action::Bytes(b.clone()))),
    );
    let fs = SmallFs::mount(FS_BYTES);
    let node = Ostree::init(&fs.path().join("repo"), "bare-user").unwrap();
    let args = pull_args(&node.repo, &liar.url, REF, &["--concurrency", "8"]);
    let (out, low) = lowest_free_while(&[fs.path()], || run_client(&args));
    let reserve = FS_BYTES * 3 / 100;
    eprintln!(
        "exit {:?}; lowest free {} of {FS_BYTES} (reserve {reserve})",
        out.status.code(),
        low[0]
    );
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("checksum mismatch")
            || text.contains("does not fit")
            || text.contains("inflates to more than"),
        "{text}"
    );
    assert!(
        low[0] >= reserve,
        "the filesystem fell to {} free, below the {reserve} reserve",
        low[0]
    );
    assert_eq!(ref_target(&node, REF), None);
}
