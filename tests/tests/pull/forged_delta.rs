//! Forged static deltas: a hostile server answers a
//! node at v1 with a delta v1 → v2 whose superblock embeds the genuine
//! commit, but whose parts lie. Each part is checked before libostree
//! sees it: one that inflates past its declared size, or whose WRITE ops
//! run past the size OPEN declared, is refused with the node's repo and
//! `$TMPDIR` (each a small tmpfs, watched through the pull) left as they
//! were and the ref at v1. A remote whose summary is verified takes only
//! the deltas that summary lists: the unsigned delta index is not read,
//! and the pull succeeds from loose objects. libostree's own temporary
//! files (an xz part, inflated) are in the repo's `tmp/`, not `$TMPDIR`.

use super::guard::{expect_refusal, sign, source, Src, REF};
use super::support::*;
use oscontent_format::delta::{superblock_with_parts, DeltaPart};
use oscontent_format::deltapart::{build_ops, build_part_payload};
use oscontent_format::{Checksum, DeltaName, Superblock};
use oscontent_testkit::proxy::Proxy;
use oscontent_testkit::*;
use sha2::Digest;
use std::io::Write;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;

/// The node repo's filesystem, and `$TMPDIR`'s.
const FS_BYTES: u64 = 64 << 20;

/// A source repo with v1 and then v2 at `REF` (stock `ostree commit`, no
/// `ostree.sizes`), the genuine delta v1 → v2 generated in it; returns
/// it (at v2), v1 and the delta's name.
fn releases(dir: &Path) -> (Src, String, DeltaName) {
    let v1_files = vec![
        ("usr/bin/tool", noise(20_000, 1)),
        ("etc/os-release", b"VERSION_ID=1\n".to_vec()),
    ];
    let v1 = source(dir, &v1_files, &[]);
    std::fs::write(dir.join("tree/usr/bin/tool"), noise(20_000, 2)).unwrap();
    std::fs::write(dir.join("tree/etc/os-release"), b"VERSION_ID=2\n").unwrap();
    let r = Ostree::at(&v1.repo);
    let v2 = r
        .run([
            "commit",
            "--no-xattrs",
            &format!("--branch={REF}"),
            &format!("--tree=dir={}", dir.join("tree").display()),
            "--subject=v2",
        ])
        .unwrap()
        .trim()
        .to_owned();
    r.run([
        "static-delta",
        "generate",
        &format!("--from={}", v1.commit),
        &format!("--to={v2}"),
    ])
    .unwrap();
    let name = DeltaName {
        from: Some(Checksum::from_hex(&v1.commit).unwrap()),
        to: Checksum::from_hex(&v2).unwrap(),
    };
    let src = Src {
        repo: v1.repo,
        commit: v2,
    };
    (src, v1.commit, name)
}

/// A bare-user node at `v1` (as `REF`), its repo inside `fs`.
fn node_at_v1(fs: &SmallFs, src: &Src, v1: &str) -> Ostree {
    let node = Ostree::init(&fs.path().join("repo"), "bare-user").unwrap();
    node.run([
        "pull-local",
        "--untrusted",
        &src.repo.display().to_string(),
        v1,
    ])
    .unwrap();
    node.run(["refs", "--create", REF, v1]).unwrap();
    node
}

/// Replaces the delta's part 0 with `part` (compression byte included),
/// declaring `uncompressed` bytes and writing `objects`, and updates the
/// summary so that it lists the forged superblock.
fn forge(
    src: &Src,
    name: &DeltaName,
    part: &[u8],
    uncompressed: u64,
    objects: Vec<(u8, Checksum)>,
) {
    let dir = src.repo.join(name.dir());
    let sb_bytes = std::fs::read(dir.join("superblock")).unwrap();
    let sb = Superblock::parse(&sb_bytes).unwrap();
    assert_eq!(sb.parts.len(), 1, "a small change makes one part");
    let forged = DeltaPart {
        checksum: Checksum::from(<[u8; 32]>::from(sha2::Sha256::digest(part))),
        size: part.len() as u64,
        uncompressed_size: uncompressed,
        objects,
    };
    std::fs::write(dir.join("0"), part).unwrap();
    std::fs::write(
        dir.join("superblock"),
        superblock_with_parts(&sb_bytes, &[forged]).unwrap(),
    )
    .unwrap();
    Ostree::at(&src.repo).run(["summary", "-u"]).unwrap();
}

/// The genuine part 0's first content object.
fn first_file(src: &Src, name: &DeltaName) -> (u8, Checksum) {
    let sb_bytes = std::fs::read(src.repo.join(name.dir()).join("superblock")).unwrap();
    let sb = Superblock::parse(&sb_bytes).unwrap();
    *sb.parts[0]
        .objects
        .iter()
        .find(|(t, _)| *t == 1)
        .expect("the part carries a file")
}

/// Runs the pull with `$TMPDIR` in `tmp`, watching both filesystems;
/// returns the output and the lowest free space seen on each (repo, tmp).
fn pull_watched(node: &Ostree, repo_fs: &SmallFs, tmp: &SmallFs, url: &str) -> (Output, u64, u64) {
    let (out, low) = lowest_free_while(&[repo_fs.path(), tmp.path()], || {
        let mut cmd = client(pull_args(&node.repo, url, REF, &[]));
        cmd.env("TMPDIR", tmp.path());
        run_bounded(&mut cmd, CLIENT_TIMEOUT).unwrap()
    });
    (out, low[0], low[1])
}

/// Asserts the forged delta was refused with `needle`, the ref stayed at
/// v1, and at no point did either filesystem lose more than `slack`.
fn expect_refused_within(
    out: &Output,
    needle: &str,
    node: &Ostree,
    v1: &str,
    (repo_before, low_repo): (u64, u64),
    (tmp_before, low_tmp): (u64, u64),
    slack: u64,
) {
    expect_refusal(out, 3, "delta part 0: refused", needle);
    expect_refusal(out, 3, needle, needle);
    assert_eq!(ref_target(node, REF).as_deref(), Some(v1), "{needle}");
    let (repo_used, tmp_used) = (repo_before - low_repo, tmp_before - low_tmp);
    eprintln!("{needle}: at most {repo_used} bytes written to the repo, {tmp_used} to $TMPDIR");
    assert!(
        repo_used <= slack,
        "{needle}: the repo's fs lost {repo_used} bytes"
    );
    assert!(tmp_used <= slack, "{needle}: $TMPDIR lost {tmp_used} bytes");
    node.fsck().unwrap();
}

fn xz(data: &[u8]) -> Vec<u8> {
    let mut e = xz2::write::XzEncoder::new(vec![b'x'], 1);
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// N1, first variant: an xz part of a few tens of KB that inflates to
/// 256 MiB, declaring the genuine part's small size. On the old client
/// libostree inflated it whole into `$TMPDIR` (here 64 MiB: it fills).
#[test]
fn a_forged_xz_part_inflating_past_its_declared_size_is_refused() {
    let t = tempdir();
    let (src, v1, name) = releases(t.path());
    let sb =
        Superblock::parse(&std::fs::read(src.repo.join(name.dir()).join("superblock")).unwrap())
            .unwrap();
    let declared = sb.parts[0].uncompressed_size;
    let bomb = xz(&vec![0u8; 256 << 20]);
    eprintln!("the bomb: {} bytes, declares {declared}", bomb.len());
    forge(&src, &name, &bomb, declared, sb.parts[0].objects.clone());
    let liar = Proxy::serve_dir(&src.repo, Arc::new(|_: &str| None)).unwrap();
    let (repo_fs, tmp) = (SmallFs::mount(FS_BYTES), SmallFs::mount(FS_BYTES));
    let node = node_at_v1(&repo_fs, &src, &v1);
    let before = (repo_fs.free(), tmp.free());
    let (out, low_repo, low_tmp) = pull_watched(&node, &repo_fs, &tmp, &liar.url);
    // What the node may write: the download and one unpacked copy.
    let slack = bomb.len() as u64 + declared + (1 << 20);
    expect_refused_within(
        &out,
        "inflates past",
        &node,
        &v1,
        (before.0, low_repo),
        (before.1, low_tmp),
        slack,
    );
}

/// N1, second variant: a 12 KB part whose op stream OPENs a 4 KiB file
/// and then WRITEs its 8 KiB of raw data 8,000 times (64 MiB). On the old
/// client libostree appended every write into the repo's `tmp/`.
#[test]
fn a_forged_part_writing_past_its_open_size_is_refused() {
    let t = tempdir();
    let (src, v1, name) = releases(t.path());
    let raw = noise(8 << 10, 3);
    let mut list: Vec<(u8, &[u64])> = vec![(b'o', &[0, 0, 4096])];
    list.extend(std::iter::repeat_n((b'w', &[8192u64, 0][..]), 8_000));
    list.push((b'c', &[]));
    let payload = build_part_payload(&[(0, 0, 0o100644)], &raw, &build_ops(&list));
    let part = xz(&payload);
    forge(
        &src,
        &name,
        &part,
        payload.len() as u64,
        vec![first_file(&src, &name)],
    );
    let liar = Proxy::serve_dir(&src.repo, Arc::new(|_: &str| None)).unwrap();
    let (repo_fs, tmp) = (SmallFs::mount(FS_BYTES), SmallFs::mount(FS_BYTES));
    let node = node_at_v1(&repo_fs, &src, &v1);
    let before = (repo_fs.free(), tmp.free());
    let (out, low_repo, low_tmp) = pull_watched(&node, &repo_fs, &tmp, &liar.url);
    expect_refused_within(
        &out,
        "past the 4096 bytes its object declared",
        &node,
        &v1,
        (before.0, low_repo),
        (before.1, low_tmp),
        part.len() as u64 + payload.len() as u64 + (1 << 20),
    );
}

/// A verified remote (`--trusted-keys`: the summary's signature is
/// checked) whose signed summary lists no delta, while an unsigned delta
/// index names one: the index is not read, no superblock is fetched, and
/// the pull succeeds from loose objects.
#[test]
fn an_unsigned_delta_index_is_ignored_on_a_verified_remote() {
    let t = tempdir();
    let (src, v1, name) = releases(t.path());
    // The signed summary is made before the delta is listed anywhere;
    // then the index names it (as `ostree static-delta reindex` writes).
    let delta_dir = src.repo.join("deltas");
    let hidden = t.path().join("deltas-aside");
    std::fs::rename(&delta_dir, &hidden).unwrap();
    Ostree::at(&src.repo).run(["summary", "-u"]).unwrap();
    let key = sign(t.path(), &src);
    std::fs::rename(&hidden, &delta_dir).unwrap();
    Ostree::at(&src.repo)
        .run(["static-delta", "reindex"])
        .unwrap();
    let index = src.repo.join(DeltaName::index_path(&name.to));
    assert!(index.exists(), "{} written", index.display());
    let summary =
        oscontent_format::parse_summary(&std::fs::read(src.repo.join("summary")).unwrap()).unwrap();
    assert!(
        summary.deltas.is_empty() && summary.indexed_deltas,
        "{summary:?}"
    );

    let server = Proxy::serve_dir(&src.repo, Arc::new(|_: &str| None)).unwrap();
    let fs = SmallFs::mount(FS_BYTES);
    let node = node_at_v1(&fs, &src, &v1);
    let key = key.display().to_string();
    let out = run_client(&pull_args(
        &node.repo,
        &server.url,
        REF,
        &["--trusted-keys", &key],
    ));
    let evs = expect_ok(&out, "a verified pull with an unsigned delta index");
    let skipped = event(&evs, "delta-skipped");
    assert!(
        skipped["reason"]
            .as_str()
            .unwrap()
            .contains("not in the signed summary"),
        "{skipped}"
    );
    assert!(evs.iter().all(|e| e["event"] != "delta"), "{evs:#?}");
    let asked = server.requests();
    assert!(
        !asked
            .iter()
            .any(|p| p.contains("delta-indexes") || p.contains("superblock")),
        "{asked:?}"
    );
    assert_eq!(ref_target(&node, REF).as_deref(), Some(src.commit.as_str()));
    node.fsck().unwrap();

    // Unverified, the same index is used as stock ostree uses it; its xz
    // part is inflated inside the repo, whatever `$TMPDIR` says.
    let fs = SmallFs::mount(FS_BYTES);
    let node = node_at_v1(&fs, &src, &v1);
    let mut cmd = client(pull_args(&node.repo, &server.url, REF, &[]));
    cmd.env("TMPDIR", t.path().join("no-such-dir"));
    let out = run_bounded(&mut cmd, CLIENT_TIMEOUT).unwrap();
    let evs = expect_ok(&out, "an unverified pull through the index");
    assert_eq!(event(&evs, "delta")["from"], v1.as_str());
    assert_eq!(ref_target(&node, REF).as_deref(), Some(src.commit.as_str()));
    node.fsck().unwrap();
}
