use super::*;
use crate::content::{header_len, ArchiveHeader, HEADER_PREFIX_LEN};
use glib::VariantTy;
use std::io::Read;

/// `a(ayay)` with one xattr; names carry their NUL, as libostree stores them.
fn xattrs(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut n = name.to_vec();
    n.push(0);
    let pair = Variant::tuple_from_iter([
        Variant::array_from_fixed_array(&n),
        Variant::array_from_fixed_array(value),
    ]);
    Variant::array_from_iter_with_type(VariantTy::new("(ayay)").unwrap(), [pair])
        .data()
        .to_vec()
}

fn checksum(meta: &FileMeta, content: &[u8]) -> String {
    let mut h = ContentHasher::new(meta).unwrap();
    h.update(content);
    h.finish().to_hex()
}

/// The names stock ostree 2022.7 gave these files (`ostree commit
/// --owner-uid=0 --owner-gid=0` into a bare-user repo, then `ostree ls -RCX`;
/// the xattr set with `os.setxattr`).
#[test]
fn checksums_match_libostree() {
    let cases: &[(&str, FileMeta, &[u8], &str)] = &[
        (
            "empty 0644",
            FileMeta::regular(0, 0, 0o644, vec![]),
            b"",
            "cc700d46f407c6c5ab2d5dde474366a928b7398277e61162e7f8ec06f469f07e",
        ),
        (
            "hello 0755",
            FileMeta::regular(0, 0, 0o755, vec![]),
            b"hello\n",
            "d6f58149fd47ec2be3fafef4fe767915f195e7ae67b9a0c090b842b156cd07f3",
        ),
        (
            "symlink",
            FileMeta::symlink(0, 0, "../target".into(), vec![]),
            b"",
            "420b73367f8f4ce4809a96cdbdb0b4b447cc428f819ffb1ab3000e00e75654cd",
        ),
        (
            "xattr user.foo=bar, 0600",
            FileMeta::regular(0, 0, 0o600, xattrs(b"user.foo", b"bar")),
            b"x",
            "9def794528a2b18c1f353fd1bac47849444ac50da2682111c22004062252b75d",
        ),
        (
            "type bits in the tar mode are replaced",
            FileMeta::regular(0, 0, 0o100755, vec![]),
            b"hello\n",
            "d6f58149fd47ec2be3fafef4fe767915f195e7ae67b9a0c090b842b156cd07f3",
        ),
    ];
    for (name, meta, content, want) in cases {
        assert_eq!(checksum(meta, content), *want, "{name}");
    }
}

/// What `FilezWriter` writes reads back, through the client's parser, as
/// the same header and content, and hashes to the same name.
#[test]
fn filez_round_trips() {
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let cases: Vec<(FileMeta, Vec<u8>)> = vec![
        (FileMeta::regular(0, 0, 0o644, vec![]), vec![]),
        (
            FileMeta::regular(
                1000,
                5,
                0o4755,
                xattrs(b"security.selinux", b"system_u:object_r:bin_t:s0\0"),
            ),
            big,
        ),
        (FileMeta::symlink(0, 0, "/etc/x".into(), vec![]), vec![]),
    ];
    for (meta, content) in cases {
        let mut w = FilezWriter::new(Vec::new(), &meta, content.len() as u64).unwrap();
        w.write_all(&content).unwrap();
        let filez = w.finish().unwrap();
        let prefix: [u8; HEADER_PREFIX_LEN] = filez[..8].try_into().unwrap();
        let len = header_len(&prefix).unwrap();
        let h = ArchiveHeader::parse(&filez[8..8 + len]).unwrap();
        assert_eq!(h.size, content.len() as u64);
        assert_eq!(h.mode, meta.mode);
        assert_eq!(h.file_header, meta.file_header().unwrap());
        let mut body = Vec::new();
        if meta.symlink_target.is_none() {
            flate2::read::DeflateDecoder::new(&filez[8 + len..])
                .read_to_end(&mut body)
                .unwrap();
        } else {
            assert_eq!(filez.len(), 8 + len, "a symlink has no body");
        }
        assert_eq!(body, content);
        let mut stream = h.content_stream_prefix();
        stream.extend_from_slice(&body);
        assert_eq!(
            Checksum::digest(&stream).to_hex(),
            checksum(&meta, &content)
        );
    }
}

#[test]
fn refuses_bad_parts() {
    let bad_xattrs = FileMeta::regular(0, 0, 0o644, vec![1, 2, 3]);
    assert!(bad_xattrs.file_header().is_err());
    assert!(ContentHasher::new(&bad_xattrs).is_err());
    assert!(FileMeta::symlink(0, 0, String::new(), vec![])
        .file_header()
        .is_err());
    assert!(FileMeta::symlink(0, 0, "a\0b".into(), vec![])
        .file_header()
        .is_err());
    let meta = FileMeta::regular(0, 0, 0o644, vec![]);
    let mut w = FilezWriter::new(Vec::new(), &meta, 2).unwrap();
    assert!(w.write_all(b"abc").is_err(), "more than announced");
    let w = FilezWriter::new(Vec::new(), &meta, 2).unwrap();
    assert!(w.finish().is_err(), "less than announced");
    let link = FileMeta::symlink(0, 0, "t".into(), vec![]);
    assert!(FilezWriter::new(Vec::new(), &link, 1).is_err());
}
