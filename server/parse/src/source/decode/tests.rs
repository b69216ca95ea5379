//! The decoder, table by table: paths, entry kinds, extension headers.

use super::*;

#[test]
fn components_refuse_escapes() {
    assert_eq!(
        components(b"./srv//repo/./x").unwrap(),
        vec![&b"srv"[..], b"repo", b"x"]
    );
    assert_eq!(components(b"./").unwrap(), Vec::<&[u8]>::new());
    for (p, why) in [
        (&b"/etc/passwd"[..], "absolute"),
        (b"srv/../x", "`..`"),
        (b"..", "`..`"),
        (b"", "empty"),
        (b"a\0b", "NUL"),
    ] {
        assert!(components(p).unwrap_err().contains(why), "{p:?}");
    }
}

#[test]
fn places() {
    let p = |s: &str| place(&components(s.as_bytes()).unwrap());
    assert_eq!(p("."), Place::Root);
    assert_eq!(p("srv"), Place::Srv);
    assert_eq!(p("srv/repo/"), Place::Repo);
    assert_eq!(p("srv/repo/objects"), Place::Inside);
    assert_eq!(p("srv/repository"), Place::Outside);
    for derived in [
        "srv/repo/summary",
        "srv/repo/summary.sig",
        "srv/repo/refs",
        "srv/repo/refs/heads/os/stable",
        "srv/repo/deltas/aa/bb/superblock",
        "srv/repo/delta-indexes/aa/b.index",
    ] {
        assert_eq!(p(derived), Place::Derived, "{derived}");
    }
    for inside in [
        "srv/repo/config",
        "srv/repo/summary.sig.x",
        "srv/repo/objects/refs",
    ] {
        assert_eq!(p(inside), Place::Inside, "{inside}");
    }
    assert_eq!(p("usr/srv/repo"), Place::Outside);
}

fn header(kind: tar::EntryType, path: &str, link: Option<&str>) -> Header {
    Header {
        kind,
        size: 0,
        pax_size: None,
        path: path.as_bytes().to_vec(),
        link: link.map(|l| l.as_bytes().to_vec()),
        mtime: 7,
        uid: 0,
        gid: 0,
        mode: 0o644,
    }
}

fn at<'a>(p: &'a str) -> At<'a> {
    At::new(components(p.as_bytes()).unwrap()).unwrap()
}

/// What [`classify`] made of a header, in a form a table can hold.
#[derive(Debug, PartialEq)]
enum Got<'a> {
    Skip,
    Apply(Kind<'a>),
    Refused(String),
}

fn got<'h>(h: &'h Header, limits: &Limits) -> Got<'h> {
    match classify(h, &Subject::new("img", "layer 1/1"), limits) {
        Ok(None) => Got::Skip,
        Ok(Some(e)) => {
            assert_eq!(e.path, &h.path[..]);
            Got::Apply(e.kind)
        }
        Err(e) => Got::Refused(e.to_string()),
    }
}

fn limits() -> Limits {
    Limits {
        max_depth: 4,
        max_path_bytes: 40,
        ..Limits::default()
    }
}

#[test]
fn entries_are_classified() {
    use tar::EntryType as T;
    let limits = limits();
    let cases: Vec<(Header, Got<'static>)> = vec![
        (header(T::Directory, "./", None), Got::Skip),
        (header(T::Regular, "etc/passwd", None), Got::Skip),
        (header(T::Char, "dev/null", None), Got::Skip),
        (header(T::Symlink, "bin", Some("/usr/bin")), Got::Skip),
        (
            header(T::Directory, "srv/repo", None),
            Got::Apply(Kind::Dir),
        ),
        (
            header(T::Regular, "srv/repo/f", None),
            Got::Apply(Kind::File { mtime: 7 }),
        ),
        (
            header(T::Continuous, "srv/repo/f", None),
            Got::Apply(Kind::File { mtime: 7 }),
        ),
        (
            header(T::Symlink, "srv/repo/l", Some("a/b")),
            Got::Apply(Kind::Symlink { target: b"a/b" }),
        ),
        (
            header(T::Link, "srv/repo/h", Some("./srv/repo/f")),
            Got::Apply(Kind::Hardlink {
                target: b"./srv/repo/f",
                to: at("srv/repo/f"),
            }),
        ),
        (
            header(T::Regular, "srv/repo/.wh.gone", None),
            Got::Apply(Kind::Whiteout {
                victim: at("srv/repo/gone"),
            }),
        ),
        (
            header(T::Regular, "srv/.wh.repo", None),
            Got::Apply(Kind::Whiteout {
                victim: at("srv/repo"),
            }),
        ),
        (
            header(T::Regular, "srv/repo/d/.wh..wh..opq", None),
            Got::Apply(Kind::Opaque),
        ),
        (
            header(T::Regular, ".wh..wh..opq", None),
            Got::Apply(Kind::Opaque),
        ),
        (header(T::Regular, "etc/.wh..wh..opq", None), Got::Skip),
        (header(T::Regular, "etc/.wh.passwd", None), Got::Skip),
        (header(T::Regular, "srv/repo/.wh..wh.plnk", None), Got::Skip),
    ];
    for (h, want) in &cases {
        assert_eq!(&got(h, &limits), want, "{h:?}");
    }
}

#[test]
fn unsafe_entries_are_refused() {
    use tar::EntryType as T;
    let limits = limits();
    let long = format!("srv/repo/{}", "x".repeat(40));
    let refused: Vec<(Header, &str)> = vec![
        (
            header(T::Regular, "/srv/repo/f", None),
            "unsafe tar entry \"/srv/repo/f\": absolute path",
        ),
        (header(T::Regular, "etc/../x", None), "`..` component"),
        (header(T::Regular, "a\0b", None), "NUL byte in path"),
        (
            header(T::Regular, &long, None),
            "path or link target longer than 40 bytes",
        ),
        (
            header(T::Symlink, "etc/l", Some(&long)),
            "path or link target longer than 40 bytes",
        ),
        (
            header(T::GNUSparse, "etc/s", None),
            "unsupported: GNU sparse tar entry \"etc/s\"",
        ),
        (
            header(T::Regular, "srv/repo/a/b/c", None),
            "deeper than 4 components",
        ),
        (
            header(T::Regular, "srv", None),
            "srv and srv/repo must be directories",
        ),
        (
            header(T::Symlink, "srv/repo", Some("x")),
            "srv and srv/repo must be directories",
        ),
        (
            header(T::Regular, "srv/repo/.wh.", None),
            "whiteout of an invalid name",
        ),
        (
            header(T::Regular, "etc/.wh...", None),
            "whiteout of an invalid name",
        ),
        (
            header(T::Symlink, "srv/repo/x", Some("/etc")),
            "symlink to \"/etc\": inside srv/repo",
        ),
        (
            header(T::Symlink, "srv/repo/x", Some("../../..")),
            "symlink to \"../../..\"",
        ),
        (header(T::Symlink, "srv/repo/x", None), "symlink to \"\""),
        (
            header(T::Link, "srv/repo/h", Some("etc/shadow")),
            "hardlink to \"etc/shadow\", outside srv/repo",
        ),
        (
            header(T::Link, "srv/repo/h", Some("srv/repo")),
            "hardlink to \"srv/repo\", outside srv/repo",
        ),
        (
            header(T::Link, "srv/repo/h", Some("srv/repo/../../etc/shadow")),
            "hardlink target \"srv/repo/../../etc/shadow\": `..` component",
        ),
        (
            header(T::Block, "srv/repo/dev", None),
            "device nodes and FIFOs are not allowed in srv/repo",
        ),
        (
            header(T::Fifo, "srv/repo/fifo", None),
            "device nodes and FIFOs",
        ),
        (
            header(T::new(b'V'), "srv/repo/v", None),
            "unsupported: tar entry \"srv/repo/v\" of type",
        ),
    ];
    for (h, want) in &refused {
        match got(h, &limits) {
            Got::Refused(e) => assert!(
                e.contains(want) && e.contains("img: layer 1/1"),
                "{h:?}: {e}"
            ),
            other => panic!("{h:?}: {other:?}, wanted {want}"),
        }
    }
}

#[test]
fn pax_sizes_must_agree() {
    use tar::EntryType as T;
    let limits = limits();
    let mut h = header(T::Regular, "srv/repo/big", None);
    h.pax_size = Some(9 << 30);
    assert!(matches!(got(&h, &limits), Got::Refused(e) if e.contains("has a PAX size")));
    h.pax_size = Some(0);
    assert_eq!(got(&h, &limits), Got::Apply(Kind::File { mtime: 7 }));
}

#[test]
fn pax_headers() {
    let s = Subject::new("img", "layer 1/1");
    let record = |k: &str, v: &str| {
        let body = format!(" {k}={v}\n");
        let mut n = body.len() + 1;
        if format!("{n}{body}").len() != n {
            n += 1;
        }
        format!("{n}{body}")
    };
    let mut p = Pending::default();
    let data = [
        record("path", "srv/repo/long"),
        record("linkpath", "srv/repo/to"),
        record("size", "12"),
        record("mtime", "1.5"),
    ]
    .concat();
    p.pax(data.as_bytes(), &s).unwrap();
    assert_eq!(
        p,
        Pending {
            path: Some(b"srv/repo/long".to_vec()),
            link: Some(b"srv/repo/to".to_vec()),
            size: Some(12),
        }
    );
    let e = Pending::default()
        .pax(record("size", "many").as_bytes(), &s)
        .unwrap_err();
    assert!(e.to_string().contains("tar: bad PAX size"), "{e}");
    let e = Pending::default().pax(b"99 path=x\n", &s).unwrap_err();
    assert!(e.to_string().contains("invalid: tar: "), "{e}");
}

/// Runs the decoder over a tar stream: the headers it yields.
fn decode(tar: &[u8], limits: &Limits) -> Result<Vec<Header>, SourceError> {
    let s = Subject::new("img", "layer 1/1");
    let mut archive = tar::Archive::new(tar);
    let mut decoder = Decoder::new(&s, limits);
    let mut out = Vec::new();
    for entry in archive.entries().unwrap().raw(true) {
        if let Some(h) = decoder.header(&mut entry.unwrap())? {
            out.push(h);
        }
    }
    decoder.finish()?;
    Ok(out)
}

#[test]
fn extension_headers_name_the_next_entry() {
    let long = format!("srv/repo/{}", "d".repeat(200));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_size(0);
    b.append_data(&mut h, &long, &[][..]).unwrap();
    b.append_pax_extensions([("path", &b"srv/repo/pax"[..])])
        .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_size(3);
    h.set_mtime(42);
    b.append_data(&mut h, "short", &b"abc"[..]).unwrap();
    let tar = b.into_inner().unwrap();
    let got = decode(&tar, &Limits::default()).unwrap();
    let paths: Vec<String> = got.iter().map(|h| show(&h.path)).collect();
    assert_eq!(paths, [long.as_str(), "srv/repo/pax"]);
    assert_eq!((got[1].size, got[1].mtime), (3, 42));

    let e = decode(
        &tar,
        &Limits {
            max_extension_bytes: 10,
            ..Limits::default()
        },
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("tar extension header limit exceeded: a GNU long name header of"),
        "{e}"
    );

    // An extension header at the end, with nothing to describe.
    let mut b = tar::Builder::new(Vec::new());
    b.append_pax_extensions([("path", &b"srv/repo/x"[..])])
        .unwrap();
    let e = decode(&b.into_inner().unwrap(), &Limits::default()).unwrap_err();
    assert!(
        e.to_string().contains("extension header without the entry"),
        "{e}"
    );
}

#[test]
fn mtimes_past_year_9999_are_clamped() {
    let max = crate::conditional::MAX_HTTP_DATE_SECS;
    for (mtime, want) in [(42, 42), (max, max), (max + 1, max), (1 << 40, max)] {
        let mut b = tar::Builder::new(Vec::new());
        // GNU: base-256 numbers, so any mtime fits.
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mtime(mtime);
        b.append_data(&mut h, "srv/repo/config", &b"x"[..]).unwrap();
        let got = decode(&b.into_inner().unwrap(), &Limits::default()).unwrap();
        assert_eq!(got[0].mtime, want as i64, "{mtime}");
    }
}

#[test]
fn what_the_server_derives_is_dropped_but_ref_dirs_stay() {
    use tar::EntryType::{Directory, Regular, Symlink};
    let cases = [
        (Regular, "srv/repo/summary", Got::Skip),
        (Regular, "srv/repo/summary.sig", Got::Skip),
        (Regular, "srv/repo/refs/heads/os/stable", Got::Skip),
        (Symlink, "srv/repo/refs/heads/x", Got::Skip),
        (Regular, "srv/repo/deltas/aa/bb/superblock", Got::Skip),
        (Directory, "srv/repo/deltas/aa", Got::Skip),
        (Regular, "srv/repo/delta-indexes/aa/b.index", Got::Skip),
        (Directory, "srv/repo/refs", Got::Apply(Kind::Dir)),
        (Directory, "srv/repo/refs/heads", Got::Apply(Kind::Dir)),
        (
            Regular,
            "srv/repo/config",
            Got::Apply(Kind::File { mtime: 7 }),
        ),
    ];
    for (kind, path, want) in cases {
        let h = header(kind, path, (kind == Symlink).then_some("y"));
        assert_eq!(got(&h, &limits()), want, "{path}");
    }
}

#[test]
fn extension_headers_are_bounded() {
    let (mut l, s) = (limits(), Subject::new("img", "layer 1/1"));
    l.max_extension_bytes = 50;
    check_extension(50, "PAX", &l, &s).unwrap();
    let e = check_extension(51, "PAX", &l, &s).unwrap_err().to_string();
    assert!(e.contains("a PAX header of 51 bytes (limit 50)"), "{e}");
}
