//! Where a native layer's entry falls: the names of ostree-ext's tar
//! format under `sysroot/ostree/repo`, as values. Pure; the entry's kind
//! and data are the caller's business.

use oscontent_format::{Checksum, ObjectKind, ObjectName};

/// The repo every native layer carries.
pub const REPO: [&[u8]; 3] = [b"sysroot", b"ostree", b"repo"];

/// What a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Outside the repo (the checkout: `usr/...`, `etc/...`), or a part of
    /// the repo we do not read (`config`, `refs/`, `tmp/`, directories).
    Ignored,
    /// `objects/XX/REST.{commit,commitmeta,dirtree,dirmeta,file}`.
    Object(ObjectName),
    /// `objects/XX/REST.file-xattrs`: an `a(ayay)`, named by its SHA-256.
    Xattrs(Checksum),
    /// `objects/XX/REST.file-xattrs-link`: the xattrs of content object
    /// REST (a hardlink to a `.file-xattrs`, or a copy of it).
    XattrsLink(Checksum),
    /// The older form: `objects/XX/REST.file.xattrs`, a hardlink to
    /// `xattrs/<sha256>`, for content object REST.
    XattrsRef(Checksum),
    /// The older form's `xattrs/<sha256>`.
    XattrsBlob(Checksum),
}

fn hex(b: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(b).ok()?;
    s.bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        .then_some(s)
}

/// `XX` + `REST.ext` to a checksum and the extension.
fn object_name<'a>(dir: &[u8], name: &'a [u8]) -> Result<(Checksum, &'a str), String> {
    let bad = || {
        format!(
            "not an ostree object name: {:?}",
            String::from_utf8_lossy(name)
        )
    };
    let dir = hex(dir).filter(|d| d.len() == 2).ok_or_else(bad)?;
    let name = std::str::from_utf8(name).map_err(|_| bad())?;
    let (rest, ext) = name.split_once('.').ok_or_else(bad)?;
    let rest = hex(rest.as_bytes())
        .filter(|r| r.len() == 62)
        .ok_or_else(bad)?;
    let checksum = Checksum::from_hex(&format!("{dir}{rest}")).map_err(|_| bad())?;
    Ok((checksum, ext))
}

/// Classifies the components of a path (already split and checked for
/// `..` and absolute paths). An error names what is wrong with a path
/// inside `objects/` that no writer of the format produces.
pub fn classify(comps: &[&[u8]]) -> Result<Place, String> {
    let Some(rest) = comps.strip_prefix(&REPO[..]) else {
        return Ok(Place::Ignored);
    };
    match rest {
        [b"objects", dir, name] => {
            let (c, ext) = object_name(dir, name)?;
            let kind = match ext {
                "commit" => ObjectKind::Commit,
                "commitmeta" => ObjectKind::CommitMeta,
                "dirtree" => ObjectKind::DirTree,
                "dirmeta" => ObjectKind::DirMeta,
                "file" => ObjectKind::File,
                "file-xattrs" => return Ok(Place::Xattrs(c)),
                "file-xattrs-link" => return Ok(Place::XattrsLink(c)),
                "file.xattrs" => return Ok(Place::XattrsRef(c)),
                other => return Err(format!("unknown ostree object type {other:?}")),
            };
            Ok(Place::Object(ObjectName::new(c, kind)))
        }
        [b"xattrs", name] => {
            let bad = || format!("not an xattrs name: {:?}", String::from_utf8_lossy(name));
            let h = hex(name).filter(|h| h.len() == 64).ok_or_else(bad)?;
            Ok(Place::XattrsBlob(Checksum::from_hex(h).map_err(|_| bad())?))
        }
        _ => Ok(Place::Ignored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn comps(p: &str) -> Vec<&[u8]> {
        p.split('/').map(str::as_bytes).collect()
    }

    #[test]
    fn places() {
        let c = Checksum::from_hex(C).unwrap();
        let obj = |ext: &str| format!("sysroot/ostree/repo/objects/01/{}.{ext}", &C[2..]);
        let object = |k| Ok(Place::Object(ObjectName::new(c, k)));
        let cases: Vec<(String, Result<Place, &str>)> = vec![
            (obj("commit"), object(ObjectKind::Commit)),
            (obj("commitmeta"), object(ObjectKind::CommitMeta)),
            (obj("dirtree"), object(ObjectKind::DirTree)),
            (obj("dirmeta"), object(ObjectKind::DirMeta)),
            (obj("file"), object(ObjectKind::File)),
            (obj("file-xattrs"), Ok(Place::Xattrs(c))),
            (obj("file-xattrs-link"), Ok(Place::XattrsLink(c))),
            (obj("file.xattrs"), Ok(Place::XattrsRef(c))),
            (
                format!("sysroot/ostree/repo/xattrs/{C}"),
                Ok(Place::XattrsBlob(c)),
            ),
            ("usr/bin/bash".into(), Ok(Place::Ignored)),
            ("sysroot/ostree/repo/config".into(), Ok(Place::Ignored)),
            ("sysroot/ostree/repo/objects/01".into(), Ok(Place::Ignored)),
            (
                "sysroot/ostree/repo/refs/heads/x".into(),
                Ok(Place::Ignored),
            ),
            ("sysroot/ostree".into(), Ok(Place::Ignored)),
            (obj("filez"), Err("unknown ostree object type \"filez\"")),
            (
                obj("file").replace("/01/", "/02/"),
                Ok(Place::Object(ObjectName::new(
                    Checksum::from_hex(&format!("02{}", &C[2..])).unwrap(),
                    ObjectKind::File,
                ))),
            ),
            (
                obj("file").replace("/01/", "/0G/"),
                Err("not an ostree object name"),
            ),
            (
                format!("sysroot/ostree/repo/objects/01/{}.file", &C[3..]),
                Err("not an ostree object name"),
            ),
            (
                format!("sysroot/ostree/repo/objects/01/{}", &C[2..]),
                Err("not an ostree object name"),
            ),
            (
                obj("file")
                    .to_uppercase()
                    .replace("SYSROOT/OSTREE/REPO", "sysroot/ostree/repo")
                    .replace("OBJECTS", "objects"),
                Err("not an ostree object name"),
            ),
            (
                "sysroot/ostree/repo/xattrs/abc".into(),
                Err("not an xattrs name"),
            ),
        ];
        for (p, want) in cases {
            match (classify(&comps(&p)), want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{p}"),
                (Err(g), Err(w)) => assert!(g.contains(w), "{p}: {g}"),
                (g, w) => panic!("{p}: got {g:?}, want {w:?}"),
            }
        }
    }
}
