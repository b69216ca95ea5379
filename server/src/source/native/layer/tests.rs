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
    let limits = Limits::default();
    let mut state = LayerState::new(&subject, &limits, commit);
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
        .and_then(|()| state.finish().map(drop))
        .map_err(|e| e.to_string());
    // What the pool was handed is on disk from here.
    objects.drain().unwrap();
    (result, dir, objects)
}

/// The names the cases use, made from real parts.
struct Names {
    xattrs: Vec<u8>,
    xsum: Checksum,
    file: Checksum,
    empty: Checksum,
    sym: Checksum,
    other: Checksum,
    dirmeta: Vec<u8>,
    dm: Checksum,
}

impl Names {
    fn new() -> Self {
        let meta = FileMeta::regular(0, 0, 0o644, vec![]);
        // (uuua(ayay)): root, root, 040755 big-endian, no xattrs.
        let dirmeta = vec![0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x41, 0xed];
        Self {
            xattrs: vec![],
            xsum: Checksum::digest(b""),
            file: name_of(&meta, b"hello\n"),
            empty: name_of(&meta, b""),
            sym: name_of(&FileMeta::symlink(0, 0, "../x".into(), vec![]), b""),
            other: Checksum::digest(b"other"),
            dm: Checksum::digest(&dirmeta),
            dirmeta,
        }
    }
    /// The `.file-xattrs`.
    fn x(&self) -> E {
        reg(obj(&self.xsum, "file-xattrs"), &self.xattrs)
    }
    /// A `.file-xattrs-link` for `f` to it.
    fn xl(&self, f: &Checksum) -> E {
        link(obj(f, "file-xattrs-link"), obj(&self.xsum, "file-xattrs"))
    }
    fn f(&self, c: &Checksum, data: &[u8]) -> E {
        reg(obj(c, "file"), data)
    }
    fn hello(&self) -> E {
        self.f(&self.file, b"hello\n")
    }
}

/// Sequences the format allows, and the content objects they stage.
fn accepted(n: &Names) -> Vec<(&'static str, Vec<E>, Vec<Checksum>)> {
    let xattrs_blob = format!("{REPO}/xattrs/{}", n.xsum);
    vec![
        (
            "v1 form",
            vec![n.x(), n.xl(&n.file), n.hello()],
            vec![n.file],
        ),
        (
            "v1, the link a copy",
            vec![reg(obj(&n.file, "file-xattrs-link"), &n.xattrs), n.hello()],
            vec![n.file],
        ),
        (
            "older form",
            vec![
                reg(xattrs_blob.clone(), &n.xattrs),
                link(obj(&n.file, "file.xattrs"), xattrs_blob),
                n.hello(),
            ],
            vec![n.file],
        ),
        (
            "symlink and empty file, checkout paths skipped",
            vec![
                n.x(),
                n.xl(&n.sym),
                E(
                    EntryType::Symlink,
                    obj(&n.sym, "file"),
                    Some("../x".into()),
                    vec![],
                    0o777,
                ),
                link("usr/bin/x".into(), obj(&n.sym, "file")),
                n.xl(&n.empty),
                n.f(&n.empty, b""),
                reg("usr/share/empty".into(), b""),
            ],
            vec![n.sym, n.empty],
        ),
        (
            "a dirmeta",
            vec![reg(obj(&n.dm, "dirmeta"), &n.dirmeta)],
            vec![],
        ),
    ]
}

/// Sequences refused, and what the error says.
fn refused(n: &Names) -> Vec<(&'static str, Vec<E>, &'static str)> {
    vec![
        (
            "a dirmeta not its name",
            vec![reg(obj(&n.other, "dirmeta"), &n.dirmeta)],
            "does not match its name",
        ),
        (
            "no xattrs link",
            vec![n.x(), n.hello()],
            "no .file-xattrs-link precedes it",
        ),
        (
            "the link is another file's",
            vec![n.x(), n.xl(&n.other), n.hello()],
            "the xattrs link before it is for",
        ),
        (
            "two links in a row",
            vec![n.x(), n.xl(&n.file), n.xl(&n.file)],
            "has no .file after it",
        ),
        (
            "a link left at the end",
            vec![n.x(), n.xl(&n.file)],
            "the layer ends before the .file",
        ),
        (
            "a link to nothing",
            vec![n.xl(&n.file)],
            "which no earlier entry of this layer carries",
        ),
        (
            "xattrs not their name",
            vec![reg(obj(&n.other, "file-xattrs"), &n.xattrs)],
            "does not match its name",
        ),
        (
            "content not its name",
            vec![n.x(), n.xl(&n.file), n.f(&n.file, b"hellO\n")],
            "content does not match its name",
        ),
        (
            "another commit",
            vec![reg(obj(&n.file, "commit"), b"x")],
            "is not the one its label",
        ),
        (
            "unknown object type",
            vec![reg(obj(&n.file, "filez"), b"")],
            "unknown ostree object type",
        ),
        (
            "an escaping hardlink",
            vec![link("usr/x".into(), "../../etc/passwd".into())],
            "`..` component",
        ),
        (
            "an absolute path",
            vec![reg("/etc/passwd".into(), b"")],
            "absolute path",
        ),
        (
            "a hardlinked .file",
            vec![
                n.x(),
                n.xl(&n.file),
                link(obj(&n.file, "file"), "usr/bin/x".into()),
            ],
            "content objects are regular files or symlinks",
        ),
    ]
}

#[test]
fn accepted_sequences_stage_their_objects() {
    let n = Names::new();
    for (name, entries, files) in accepted(&n) {
        let (got, _dir, objects) = run(&entries, n.other);
        assert_eq!(got, Ok(()), "{name}");
        for c in files {
            let o = ObjectName::new(c, ObjectKind::File);
            assert!(objects.has(&o).unwrap(), "{name}: {c}.filez written");
        }
    }
}

#[test]
fn refused_sequences_say_why() {
    let n = Names::new();
    for (name, entries, want) in refused(&n) {
        let (got, _dir, _) = run(&entries, n.other);
        let e = got.expect_err(name);
        assert!(e.contains(want), "{name}: {e}");
    }
}
