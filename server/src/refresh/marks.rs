//! The rollback high-water marks, kept across restarts: for every ref ever
//! published from this state dir, the newest commit (timestamp and
//! version) it was published at. Without them a restart would have nothing
//! to compare with, and a tag moved back while the pod was down would be
//! published to every fresh node.
//!
//! A ref that a later publication no longer carries keeps its mark (even
//! when `--image` arguments change between runs): refs come from the
//! commits, not from the arguments, and forgetting them would let a tag
//! be rebound elsewhere (the ref disappears) and then back to an old
//! release (it reappears, older). `--allow-rollback` moves a mark back.
//!
//! The file is written atomically and durably beneath the state dir's fd
//! (`fsutil::write_durable`) and parsed strictly: a corrupt file is an
//! error naming it, never a silent reset to "no marks".

use crate::ages::RefAge;
use anyhow::{bail, Context, Result};
use oscontent_format::Checksum;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Under the state dir.
pub const MARKS_FILE: &str = "rollback-marks.json";
/// The one format this code reads and writes.
const FORMAT: u32 = 1;
/// Most marks kept; past it, the oldest of the refs no longer published
/// are forgotten first (a `version/<v>` ref per release would otherwise
/// grow the file forever).
pub const MAX_MARKS: usize = 4096;
/// Bound on the file read at start (a mark is well under 512 bytes).
const MAX_FILE_BYTES: u64 = 4 << 20;
/// How a site server names a ref of `refs/mirrors/`.
const MIRROR_PREFIX: &str = "(mirror) ";
/// Longest `version` kept in a mark.
const MAX_VERSION_BYTES: usize = 256;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: u32,
    refs: BTreeMap<String, Mark>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Mark {
    commit: String,
    timestamp: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    version: Option<String>,
}

/// The marks, by ref name (pure: bytes in, values out).
pub fn parse(bytes: &[u8]) -> Result<BTreeMap<String, RefAge>> {
    let file: File = serde_json::from_slice(bytes).context("not a marks file")?;
    if file.format != FORMAT {
        bail!("format {} (this server reads {FORMAT})", file.format);
    }
    if file.refs.len() > MAX_MARKS {
        bail!("{} marks, over the {MAX_MARKS} limit", file.refs.len());
    }
    file.refs
        .into_iter()
        .map(|(name, m)| {
            // A site server's mirrored refs carry this prefix.
            let bare = name.strip_prefix(MIRROR_PREFIX).unwrap_or(&name);
            oscontent_format::validate_ref(bare).with_context(|| format!("ref {name:?}"))?;
            let commit: Checksum = m
                .commit
                .parse()
                .with_context(|| format!("ref {name}: commit {:?}", m.commit))?;
            if m.version
                .as_ref()
                .is_some_and(|v| v.len() > MAX_VERSION_BYTES)
            {
                bail!("ref {name}: version over {MAX_VERSION_BYTES} bytes");
            }
            let age = RefAge {
                name: name.clone(),
                commit,
                timestamp: m.timestamp,
                version: m.version,
            };
            Ok((name, age))
        })
        .collect()
}

/// The file's bytes for `marks` (pure; deterministic).
pub fn encode(marks: &BTreeMap<String, RefAge>) -> Result<Vec<u8>> {
    let file = File {
        format: FORMAT,
        refs: marks
            .iter()
            .map(|(name, a)| {
                let m = Mark {
                    commit: a.commit.to_hex(),
                    timestamp: a.timestamp,
                    version: a.version.clone(),
                };
                (name.clone(), m)
            })
            .collect(),
    };
    let mut out = serde_json::to_vec_pretty(&file).context("encoding the rollback marks")?;
    out.push(b'\n');
    Ok(out)
}

/// `marks` moved to what `published` publishes (the caller has already
/// refused, or allowed, every move back), bounded to [`MAX_MARKS`] (pure).
pub fn advance(marks: &mut BTreeMap<String, RefAge>, published: &[RefAge]) {
    for a in published {
        marks.insert(a.name.clone(), a.clone());
    }
    if marks.len() <= MAX_MARKS {
        return;
    }
    let mut gone: Vec<(u64, String)> = marks
        .values()
        .filter(|m| !published.iter().any(|p| p.name == m.name))
        .map(|m| (m.timestamp, m.name.clone()))
        .collect();
    gone.sort();
    let excess = marks.len() - MAX_MARKS;
    for (_, name) in gone.into_iter().take(excess) {
        marks.remove(&name);
    }
}

/// The marks file of a state dir.
#[derive(Debug)]
pub struct MarksFile {
    dir: PathBuf,
}

impl MarksFile {
    pub fn new(state_dir: &Path) -> Self {
        Self {
            dir: state_dir.to_owned(),
        }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(MARKS_FILE)
    }

    /// The marks (none if there is no file yet). Blocking.
    pub fn load(&self) -> Result<BTreeMap<String, RefAge>> {
        let path = self.path();
        let f = match open_nofollow(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
        };
        let mut bytes = Vec::new();
        f.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", path.display()))?;
        anyhow::ensure!(
            bytes.len() as u64 <= MAX_FILE_BYTES,
            "rollback marks {}: over the {MAX_FILE_BYTES} byte limit",
            path.display()
        );
        parse(&bytes).with_context(|| {
            format!(
                "rollback marks {} are corrupt (not reset: fix or remove the file, \
                 which forgets every ref's newest release)",
                path.display()
            )
        })
    }

    /// Replaces the file with `marks`, durably. Blocking.
    pub fn store(&self, marks: &BTreeMap<String, RefAge>) -> Result<()> {
        crate::fsutil::write_durable(&self.dir, MARKS_FILE, &encode(marks)?)
            .with_context(|| format!("writing {}", self.path().display()))
    }
}

/// The state dir is ours, but a symlink planted there is still not followed.
fn open_nofollow(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age(name: &str, n: u8, timestamp: u64, version: Option<&str>) -> RefAge {
        RefAge {
            name: name.to_owned(),
            commit: Checksum::from_bytes(&[n; 32]).expect("32 bytes"),
            timestamp,
            version: version.map(str::to_owned),
        }
    }

    #[test]
    fn encode_then_parse_is_the_identity() {
        let marks: BTreeMap<String, RefAge> = [
            age("os/x86_64/stable", 1, 100, Some("41.2")),
            age("version/41.2", 1, 100, None),
            age("(mirror) os/x86_64/stable", 2, 90, None),
        ]
        .into_iter()
        .map(|a| (a.name.clone(), a))
        .collect();
        assert_eq!(parse(&encode(&marks).unwrap()).unwrap(), marks);
    }

    #[test]
    fn a_corrupt_file_is_refused_saying_why() {
        let c = "a".repeat(64);
        let cases: &[(&str, String, &str)] = &[
            ("not JSON", "{".into(), "not a marks file"),
            ("empty", String::new(), "not a marks file"),
            (
                "another format",
                r#"{"format":2,"refs":{}}"#.into(),
                "format 2",
            ),
            (
                "an unknown field",
                format!(
                    r#"{{"format":1,"refs":{{"r":{{"commit":"{c}","timestamp":1,"extra":1}}}}}}"#
                ),
                "not a marks file",
            ),
            (
                "a bad commit",
                r#"{"format":1,"refs":{"r":{"commit":"xyz","timestamp":1}}}"#.into(),
                "commit \"xyz\"",
            ),
            (
                "a bad ref name",
                format!(r#"{{"format":1,"refs":{{"../x":{{"commit":"{c}","timestamp":1}}}}}}"#),
                "ref \"../x\"",
            ),
            (
                "a negative timestamp",
                format!(r#"{{"format":1,"refs":{{"r":{{"commit":"{c}","timestamp":-1}}}}}}"#),
                "not a marks file",
            ),
        ];
        for (what, text, want) in cases {
            let e = parse(text.as_bytes()).expect_err(what);
            let msg = format!("{e:#}");
            assert!(msg.contains(want), "{what}: {msg}");
        }
    }

    #[test]
    fn marks_move_to_what_is_published_and_gone_refs_are_kept() {
        let mut marks = BTreeMap::new();
        advance(
            &mut marks,
            &[age("a", 1, 100, None), age("b", 2, 100, None)],
        );
        // b is no longer published; a moves on (or back, when allowed).
        advance(&mut marks, &[age("a", 3, 50, None)]);
        assert_eq!(marks["a"].commit, age("", 3, 0, None).commit);
        assert_eq!(marks["b"].commit, age("", 2, 0, None).commit, "kept");
    }

    #[test]
    fn past_the_limit_the_oldest_gone_refs_are_forgotten() {
        let mut marks = BTreeMap::new();
        let old: Vec<RefAge> = (0..MAX_MARKS as u64)
            .map(|i| age(&format!("version/{i}"), 1, i, None))
            .collect();
        advance(&mut marks, &old);
        advance(&mut marks, &[age("version/new", 2, 1, None)]);
        assert_eq!(marks.len(), MAX_MARKS);
        assert!(!marks.contains_key("version/0"), "the oldest gone one");
        assert!(marks.contains_key("version/1") && marks.contains_key("version/new"));
    }

    #[test]
    fn a_missing_file_is_no_marks_and_a_stored_one_loads() {
        let dir = tempfile::tempdir().unwrap();
        let f = MarksFile::new(dir.path());
        assert!(f.load().unwrap().is_empty());
        let marks: BTreeMap<String, RefAge> = [age("a", 1, 7, Some("1.0"))]
            .into_iter()
            .map(|a| (a.name.clone(), a))
            .collect();
        f.store(&marks).unwrap();
        assert_eq!(f.load().unwrap(), marks);
        std::fs::write(f.path(), b"{\"format\":1").unwrap();
        let e = format!("{:#}", f.load().unwrap_err());
        assert!(e.contains(MARKS_FILE) && e.contains("corrupt"), "{e}");
    }
}
