//! The part checker's tables: op streams accepted and refused, payloads,
//! compression bytes, varints and the payload layout.

use super::*;

fn c(n: u8) -> Checksum {
    Checksum::from([n; 32])
}

fn ops(list: &[(u8, &[u64])]) -> Vec<u8> {
    build_ops(list)
}

fn payload(raw: &[u8], ops: &[u8]) -> Vec<u8> {
    build_part_payload(&[(0, 0, 0o100644)], raw, ops)
}

const CAP: u64 = 1000;

// long-fn: a table of op streams, one row a case
#[test]
fn op_streams() {
    let file = [(1u8, c(1))];
    let two = [(1u8, c(1)), (2u8, c(2))];
    let many_writes: Vec<(u8, &[u64])> = std::iter::once((b'o', &[0, 0, 100][..]))
        .chain(std::iter::repeat_n((b'w', &[64, 0][..]), 100))
        .collect();
    // (what, objects, ops, accepted bytes or refusal substring)
    type Case<'a> = (&'a str, &'a [(u8, Checksum)], Vec<u8>, Result<u64, &'a str>);
    let cases: Vec<Case> = vec![
        ("nothing", &file, vec![], Ok(0)),
        (
            "splice a file",
            &file,
            ops(&[(b'S', &[0, 0, 10, 0])]),
            Ok(10),
        ),
        (
            "splice a file, then a dirtree",
            &two,
            ops(&[(b'S', &[0, 0, 10, 0]), (b'S', &[20, 10])]),
            Ok(30),
        ),
        (
            "open, two writes, close",
            &file,
            ops(&[
                (b'o', &[0, 0, 64]),
                (b'w', &[32, 0]),
                (b'w', &[32, 32]),
                (b'c', &[]),
            ]),
            Ok(64),
        ),
        (
            "write from a read source",
            &file,
            ops(&[
                (b'o', &[0, 0, 500]),
                (b'r', &[0]),
                (b'w', &[500, 1 << 40]),
                (b'R', &[]),
                (b'c', &[]),
            ]),
            Ok(500),
        ),
        (
            "bspatch",
            &file,
            ops(&[
                (b'o', &[0, 0, 900]),
                (b'r', &[0]),
                (b'B', &[32, 8]),
                (b'c', &[]),
            ]),
            Ok(900),
        ),
        (
            "repeated writes past open",
            &file,
            ops(&many_writes),
            Err("past the 100 bytes"),
        ),
        (
            "one write past open",
            &file,
            ops(&[(b'o', &[0, 0, 10]), (b'w', &[11, 0])]),
            Err("past the 10 bytes"),
        ),
        (
            "write overflowing",
            &file,
            ops(&[
                (b'o', &[0, 0, 10]),
                (b'r', &[0]),
                (b'w', &[10, 0]),
                (b'w', &[u64::MAX, 0]),
            ]),
            Err("past the 10 bytes"),
        ),
        (
            "open over the cap",
            &file,
            ops(&[(b'o', &[0, 0, CAP + 1])]),
            Err("more than the 1000"),
        ),
        (
            "splice over the cap",
            &file,
            ops(&[(b'S', &[0, 0, CAP + 1, 0])]),
            Err("more than"),
        ),
        (
            "splice outside raw",
            &file,
            ops(&[(b'S', &[0, 0, 10, 60])]),
            Err("outside the 64"),
        ),
        (
            "splice offset overflow",
            &file,
            ops(&[(b'S', &[0, 0, 10, u64::MAX])]),
            Err("outside"),
        ),
        (
            "write outside raw",
            &file,
            ops(&[(b'o', &[0, 0, 100]), (b'w', &[65, 0])]),
            Err("outside"),
        ),
        (
            "mode out of range",
            &file,
            ops(&[(b'o', &[1, 0, 1])]),
            Err("mode 1 of 1"),
        ),
        (
            "xattr out of range",
            &file,
            ops(&[(b'o', &[0, 1, 1])]),
            Err("xattr set 1 of 1"),
        ),
        (
            "more objects than listed",
            &file,
            ops(&[(b'S', &[0, 0, 1, 0]), (b'S', &[0, 0, 1, 0])]),
            Err("opens object 1, but the part lists 1"),
        ),
        (
            "open a dirtree",
            &two[1..],
            ops(&[(b'o', &[0, 0, 1])]),
            Err("has type 2"),
        ),
        (
            "write with nothing open",
            &file,
            ops(&[(b'w', &[1, 0])]),
            Err("no object is open"),
        ),
        (
            "close with nothing open",
            &file,
            ops(&[(b'c', &[])]),
            Err("no object is open"),
        ),
        (
            "open twice",
            &file,
            ops(&[(b'o', &[0, 0, 1]), (b'o', &[0, 0, 1])]),
            Err("already open"),
        ),
        (
            "closed short",
            &file,
            ops(&[(b'o', &[0, 0, 10]), (b'w', &[5, 0]), (b'c', &[])]),
            Err("after writing 5"),
        ),
        (
            "left open",
            &file,
            ops(&[(b'o', &[0, 0, 10])]),
            Err("still open"),
        ),
        (
            "bspatch without source",
            &file,
            ops(&[(b'o', &[0, 0, 10]), (b'B', &[0, 8])]),
            Err("without a read source"),
        ),
        (
            "bspatch after a write",
            &file,
            ops(&[
                (b'o', &[0, 0, 10]),
                (b'w', &[1, 0]),
                (b'r', &[0]),
                (b'B', &[0, 8]),
            ]),
            Err("already written"),
        ),
        (
            "read source outside raw",
            &file,
            ops(&[(b'r', &[40])]),
            Err("reads 32 bytes at 40"),
        ),
        (
            "unknown opcode",
            &file,
            vec![b'z'],
            Err("unknown opcode 0x7a"),
        ),
        (
            "truncated varint",
            &file,
            vec![b'o', 0x80],
            Err("truncated varint"),
        ),
        (
            "varint past 64 bits",
            &file,
            vec![
                b'r', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ],
            Err("truncated varint"),
        ),
    ];
    let raw = [7u8; 64];
    for (what, objects, stream, want) in cases {
        let got = check_part_payload(&payload(&raw, &stream), objects, |_, _| CAP);
        match (got, want) {
            (Ok(w), Ok(bytes)) => assert_eq!(w.bytes, bytes, "{what}"),
            (Err(e), Err(needle)) => {
                assert!(e.to_string().contains(needle), "{what}: {e}")
            }
            (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn payloads() {
    let big_patch = ops(&[
        (b'o', &[0, 0, MAX_BSPATCH_SIZE + 1]),
        (b'r', &[0]),
        (b'B', &[0, 1]),
    ]);
    let file = [(1u8, c(1))];
    // (what, payload, refusal substring)
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not a payload", b"garbage".to_vec(), "invalid delta part"),
        (
            "bspatch too big",
            payload(&[0; 64], &big_patch),
            "above the",
        ),
    ];
    // An empty payload is glib's default value: no ops, nothing written.
    let empty = check_part_payload(&[], &file, |_, _| 0);
    assert_eq!(empty, Ok(PartWrites::default()));
    for (what, p, needle) in cases {
        let e = check_part_payload(&p, &file, |_, _| u64::MAX).unwrap_err();
        assert!(e.to_string().contains(needle), "{what}: {e}");
    }
}

/// The layout ostree writes (and the fuzz seeds are laid out by hand
/// in): modes, xattr sets, raw data, ops, then the tuple's frame
/// offsets, last member first.
#[test]
fn payload_layout() {
    let got = build_part_payload(&[(0, 0, 0o100644)], b"ab", b"R");
    let mut want = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x81, 0xa4];
    want.push(0); // one empty xattr set: its end offset
    want.extend_from_slice(b"abR");
    want.extend_from_slice(&[15, 13, 12]);
    assert_eq!(got, want);
    assert_eq!(
        check_part_payload(&got, &[], |_, _| 0),
        Ok(PartWrites::default())
    );
}

#[test]
fn compression_bytes() {
    let cases = [
        (0u8, Some(PartCompression::None)),
        (b'x', Some(PartCompression::Xz)),
        (b'g', None),
    ];
    for (b, want) in cases {
        let got = PartCompression::from_byte(b).ok();
        assert_eq!(got, want, "{b}");
        if let Some(w) = want {
            assert_eq!(w.byte(), b);
        }
    }
}

#[test]
fn varints_round_trip() {
    for v in [0, 1, 127, 128, 300, 1 << 40, u64::MAX] {
        let mut out = Vec::new();
        write_varint(v, &mut out);
        assert_eq!(read_varint(&out), Some((v, &[][..])), "{v}");
    }
}
