//! Entry sequences of one layer, as a table: what the format allows (the
//! current and the older xattrs forms, symlinks, empty files, metadata) and
//! each way it can be wrong.

use super::*;
use oscontent_format::filez::ContentHasher;

const REPO: &str = "sysroot/ostree/repo";

fn obj(c: &Checksum, ext: &str) -> String {
    let h = c.to_hex();
    format!("{REPO}/objects/{}/{}.{ext}", &h[..2], &h[2..])
}

/// One tar entry: kind, path, link target, data, mode.
#[derive(Clone)]
struct E(EntryType, String, Option<String>, Vec<u8>, u32);

fn reg(path: String, data: &[u8]) -> E {
    E(EntryType::Regular, path, None, data.to_vec(), 0o644)
}
fn link(path: String, target: String) -> E {
    E(EntryType::Link, path, Some(target), vec![], 0o644)
}

/// A content object's name, from its parts.
fn name_of(meta: &FileMeta, content: &[u8]) -> Checksum {
    let mut h = ContentHasher::new(meta).unwrap();
    h.update(content);
    h.finish()
}

/// Feeds `entries` to one layer; the error text, if any.
fn run(entries: &[E], commit: Checksum) -> (Result<(), String>, tempfile::TempDir, Objects) {
    let dir = tempfile::tempdir().unwrap();
    let mut objects = Objects::create(dir.path()).unwrap();
    let subject = Subject::new("img", "layer 1/1");
    let mut state = LayerState::new(&subject, commit);
    let mut result = Ok(());
    for E(kind, path, link, data, mode) in entries {
        let h = Header {
            kind: *kind,
            size: data.len() as u64,
            pax_size: None,
            path: path.clone().into_bytes(),
            link: link.clone().map(String::into_bytes),
            mtime: 1,
            uid: 0,
            gid: 0,
            mode: *mode,
        };
        result = state.entry(&mut objects, &h, &mut &data[..]);
        if result.is_err() {
            break;
        }
    }
    let result = result
        .and_then(|()| state.finish())
        .map_err(|e| e.to_string());
    (result, dir, objects)
}

#[test]
fn entry_sequences() {
    let xattrs = b"";
    let xsum = Checksum::digest(xattrs);
    let meta = FileMeta::regular(0, 0, 0o644, vec![]);
    let file = name_of(&meta, b"hello\n");
    let empty = name_of(&meta, b"");
    let sym = name_of(&FileMeta::symlink(0, 0, "../x".into(), vec![]), b"");
    let other = Checksum::digest(b"other");
    // (uuua(ayay)): root, root, 040755 big-endian, no xattrs.
    let dirmeta = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x41, 0xed].to_vec();
    let dm = Checksum::digest(&dirmeta);
    let x = || reg(obj(&xsum, "file-xattrs"), xattrs);
    let xl = |f: &Checksum| link(obj(f, "file-xattrs-link"), obj(&xsum, "file-xattrs"));
    let f = |c: &Checksum, data: &[u8]| reg(obj(c, "file"), data);
    type Case = (&'static str, Vec<E>, Result<Vec<Checksum>, &'static str>);
    let cases: Vec<Case> = vec![
        (
            "v1 form",
            vec![x(), xl(&file), f(&file, b"hello\n")],
            Ok(vec![file]),
        ),
        (
            "v1, the link a copy",
            vec![
                reg(obj(&file, "file-xattrs-link"), xattrs),
                f(&file, b"hello\n"),
            ],
            Ok(vec![file]),
        ),
        (
            "older form",
            vec![
                reg(format!("{REPO}/xattrs/{xsum}"), xattrs),
                link(obj(&file, "file.xattrs"), format!("{REPO}/xattrs/{xsum}")),
                f(&file, b"hello\n"),
            ],
            Ok(vec![file]),
        ),
        (
            "symlink and empty file, checkout paths skipped",
            vec![
                x(),
                xl(&sym),
                E(
                    EntryType::Symlink,
                    obj(&sym, "file"),
                    Some("../x".into()),
                    vec![],
                    0o777,
                ),
                link("usr/bin/x".into(), obj(&sym, "file")),
                xl(&empty),
                f(&empty, b""),
                reg("usr/share/empty".into(), b""),
            ],
            Ok(vec![sym, empty]),
        ),
        (
            "a dirmeta",
            vec![reg(obj(&dm, "dirmeta"), &dirmeta)],
            Ok(vec![]),
        ),
        (
            "a dirmeta not its name",
            vec![reg(obj(&other, "dirmeta"), &dirmeta)],
            Err("does not match its name"),
        ),
        (
            "no xattrs link",
            vec![x(), f(&file, b"hello\n")],
            Err("no .file-xattrs-link precedes it"),
        ),
        (
            "the link is another file's",
            vec![x(), xl(&other), f(&file, b"hello\n")],
            Err("the xattrs link before it is for"),
        ),
        (
            "two links in a row",
            vec![x(), xl(&file), xl(&file)],
            Err("has no .file after it"),
        ),
        (
            "a link left at the end",
            vec![x(), xl(&file)],
            Err("the layer ends before the .file"),
        ),
        (
            "a link to nothing",
            vec![xl(&file)],
            Err("which no earlier entry of this layer carries"),
        ),
        (
            "xattrs not their name",
            vec![reg(obj(&other, "file-xattrs"), xattrs)],
            Err("does not match its name"),
        ),
        (
            "content not its name",
            vec![x(), xl(&file), f(&file, b"hellO\n")],
            Err("content does not match its name"),
        ),
        (
            "another commit",
            vec![reg(obj(&file, "commit"), b"x")],
            Err("is not the one its label"),
        ),
        (
            "unknown object type",
            vec![reg(obj(&file, "filez"), b"")],
            Err("unknown ostree object type"),
        ),
        (
            "an escaping hardlink",
            vec![link("usr/x".into(), "../../etc/passwd".into())],
            Err("`..` component"),
        ),
        (
            "an absolute path",
            vec![reg("/etc/passwd".into(), b"")],
            Err("absolute path"),
        ),
        (
            "a hardlinked .file",
            vec![x(), xl(&file), link(obj(&file, "file"), "usr/bin/x".into())],
            Err("content objects are regular files or symlinks"),
        ),
    ];
    for (name, entries, want) in cases {
        let (got, _dir, objects) = run(&entries, other);
        match (got, want) {
            (Ok(()), Ok(files)) => {
                for c in files {
                    let n = ObjectName::new(c, ObjectKind::File);
                    assert!(objects.has(&n).unwrap(), "{name}: {c}.filez written");
                }
            }
            (Err(e), Err(w)) => assert!(e.contains(w), "{name}: {e}"),
            (got, want) => panic!("{name}: got {got:?}, want {:?}", want.map(|_| ())),
        }
    }
}
