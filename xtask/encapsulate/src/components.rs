//! The component map: which files of the tree each component (package)
//! owns, as a release pipeline knows from its package database. ostree-ext
//! chunks by content object, so paths become checksums here; parsing and
//! the mapping are pure (the commit walk is in `encapsulate.rs`).

use anyhow::{bail, ensure, Context};
use ostree_ext::objectsource::{ObjectMeta, ObjectSourceMeta};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

/// Content no component claims. Like rpm-ostree's unpackaged content it
/// gets the maximal change frequency, which ostree-ext packs into a layer
/// of its own.
pub const UNPACKAGED: &str = "unpackaged";

/// ostree-ext joins a layer's component names with this in the layer's
/// `ostree.components` annotation, and splits them on it when reusing a
/// prior build's packing.
const NAME_SEPARATOR: char = ',';

/// The component map file (JSON).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentMap {
    pub components: Vec<Component>,
}

/// One component: a package.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Component {
    /// Stable across builds (what a prior build's packing is matched on).
    pub name: String,
    /// Changes when the package does (the identifier is `name-version`).
    pub version: String,
    /// Relative age of the last change, in ostree-ext's unitless terms.
    pub change_time_offset: u32,
    /// How often it changes; u32::MAX is reserved for unpackaged content.
    pub change_frequency: u32,
    /// Files (regular files and symlinks) it owns, relative to the root.
    pub paths: Vec<String>,
}

impl Component {
    fn identifier(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }
}

/// Parses and checks a component map.
pub fn parse(bytes: &[u8]) -> anyhow::Result<ComponentMap> {
    let map: ComponentMap = serde_json::from_slice(bytes).context("parsing the component map")?;
    let mut names = BTreeSet::new();
    let mut owners = BTreeMap::new();
    for c in &map.components {
        ensure!(
            !c.name.is_empty() && !c.name.contains(NAME_SEPARATOR) && c.name != UNPACKAGED,
            "component name {:?} is empty, contains {NAME_SEPARATOR:?} or is reserved",
            c.name
        );
        ensure!(
            names.insert(c.name.as_str()),
            "component {} is listed twice",
            c.name
        );
        ensure!(
            c.change_frequency != u32::MAX,
            "component {}: change_frequency u32::MAX is reserved for {UNPACKAGED} content",
            c.name
        );
        for p in &c.paths {
            ensure!(
                !p.is_empty()
                    && !p.starts_with('/')
                    && !p.split('/').any(|s| s.is_empty() || s == "." || s == ".."),
                "component {}: path {p:?} is not a normal relative path",
                c.name
            );
            if let Some(other) = owners.insert(p.as_str(), c.name.as_str()) {
                bail!("path {p} is owned by both {other} and {}", c.name);
            }
        }
    }
    Ok(map)
}

/// ostree-ext's object → component mapping for a commit whose files are
/// `files` (path → content checksum). Every content object must be mapped
/// (ostree-ext's chunking asserts it), so what no component claims goes to
/// [`UNPACKAGED`]. An object shared by several components (identical
/// files) belongs to the first that lists it.
pub fn object_meta(
    map: &ComponentMap,
    files: &BTreeMap<String, String>,
) -> anyhow::Result<ObjectMeta> {
    let mut meta = ObjectMeta::default();
    for c in &map.components {
        let id: Rc<str> = Rc::from(c.identifier());
        let mut owns_any = false;
        for p in &c.paths {
            let checksum = files.get(p).with_context(|| {
                format!(
                    "component {} lists {p}, which the commit does not have",
                    c.name
                )
            })?;
            if !meta.map.contains_key(checksum) {
                meta.map.insert(checksum.clone(), Rc::clone(&id));
                owns_any = true;
            }
        }
        if owns_any {
            meta.set.insert(ObjectSourceMeta {
                identifier: Rc::clone(&id),
                name: Rc::from(c.name.as_str()),
                srcid: Rc::from(c.name.as_str()),
                change_time_offset: c.change_time_offset,
                change_frequency: c.change_frequency,
            });
        }
    }
    let unpackaged: Rc<str> = Rc::from(UNPACKAGED);
    let mut any_unpackaged = false;
    for checksum in files.values() {
        if !meta.map.contains_key(checksum) {
            meta.map.insert(checksum.clone(), Rc::clone(&unpackaged));
            any_unpackaged = true;
        }
    }
    if any_unpackaged {
        meta.set.insert(ObjectSourceMeta {
            identifier: Rc::clone(&unpackaged),
            name: Rc::clone(&unpackaged),
            srcid: Rc::clone(&unpackaged),
            change_time_offset: 0,
            change_frequency: u32::MAX,
        });
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comp(name: &str, paths: &[&str]) -> Component {
        Component {
            name: name.into(),
            version: "1.0-1".into(),
            change_time_offset: 1,
            change_frequency: 1,
            paths: paths.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn parse_refuses_bad_maps() {
        let cases: &[(&str, Vec<Component>, &str)] = &[
            ("empty name", vec![comp("", &[])], "is empty"),
            ("separator", vec![comp("a,b", &[])], "contains"),
            ("reserved", vec![comp(UNPACKAGED, &[])], "reserved"),
            (
                "twice",
                vec![comp("a", &[]), comp("a", &[])],
                "listed twice",
            ),
            ("absolute", vec![comp("a", &["/usr/bin/a"])], "not a normal"),
            ("dotdot", vec![comp("a", &["usr/../etc"])], "not a normal"),
            ("double slash", vec![comp("a", &["usr//a"])], "not a normal"),
            (
                "two owners",
                vec![comp("a", &["usr/x"]), comp("b", &["usr/x"])],
                "owned by both",
            ),
        ];
        for (what, components, want) in cases {
            let bytes = serde_json::to_vec(&ComponentMap {
                components: components.clone(),
            })
            .unwrap();
            let err = format!("{:#}", parse(&bytes).unwrap_err());
            assert!(err.contains(want), "{what}: {err}");
        }
        let mut c = comp("a", &[]);
        c.change_frequency = u32::MAX;
        let bytes = serde_json::to_vec(&ComponentMap {
            components: vec![c],
        })
        .unwrap();
        assert!(parse(&bytes).is_err());
        assert!(parse(br#"{"components":[],"extra":1}"#).is_err());
        assert!(parse(br#"{"components":[]}"#).is_ok());
    }

    #[test]
    fn every_object_is_mapped_once() {
        let files: BTreeMap<String, String> = [
            ("usr/bin/a", "c1"),
            ("usr/lib/liba.so", "c2"),
            ("usr/bin/b", "c3"),
            ("usr/share/empty-a", "c0"),
            ("usr/share/empty-b", "c0"),
            ("etc/generated", "c4"),
        ]
        .into_iter()
        .map(|(p, c)| (p.to_owned(), c.to_owned()))
        .collect();
        // (components, expected object -> identifier)
        type Case<'a> = (Vec<Component>, &'a [(&'a str, &'a str)]);
        let cases: &[Case] = &[
            (
                vec![
                    comp("a", &["usr/bin/a", "usr/lib/liba.so", "usr/share/empty-a"]),
                    comp("b", &["usr/bin/b", "usr/share/empty-b"]),
                ],
                &[
                    ("c1", "a-1.0-1"),
                    ("c2", "a-1.0-1"),
                    ("c0", "a-1.0-1"),
                    ("c3", "b-1.0-1"),
                    ("c4", UNPACKAGED),
                ],
            ),
            (
                vec![],
                &[
                    ("c1", UNPACKAGED),
                    ("c2", UNPACKAGED),
                    ("c0", UNPACKAGED),
                    ("c3", UNPACKAGED),
                    ("c4", UNPACKAGED),
                ],
            ),
        ];
        for (components, want) in cases {
            let map = ComponentMap {
                components: components.clone(),
            };
            let meta = object_meta(&map, &files).unwrap();
            assert_eq!(meta.map.len(), want.len());
            for (obj, id) in *want {
                assert_eq!(&*meta.map[*obj], *id, "{obj}");
                assert!(meta.set.iter().any(|m| &*m.identifier == *id), "{id}");
            }
        }
        let unknown = ComponentMap {
            components: vec![comp("a", &["usr/bin/nope"])],
        };
        let err = format!("{:#}", object_meta(&unknown, &files).unwrap_err());
        assert!(err.contains("usr/bin/nope"), "{err}");
    }
}
