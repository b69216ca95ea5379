//! Which kind of oscontainer an image is, from its config alone (labels
//! and the layers' diff IDs), before any layer is fetched:
//! - **ostree-native** (ostree-ext's "tar format", what `ostree container
//!   encapsulate`, rpm-ostree and bootc build; every OS image today):
//!   label `ostree.commit`; its layers hold a `bare-split-xattrs` repo under
//!   `sysroot/ostree/repo`, converted while streaming (the server's
//!   `source::native`);
//! - **legacy** (`machine-os-content` up to OpenShift 4.11): label
//!   `com.coreos.ostree-commit`; an archive repo under `srv/repo`.
//!
//! Pure: labels in, a decision or the reason out.

use std::collections::BTreeMap;

/// The label naming the ostree commit of a legacy oscontainer.
pub const LEGACY_COMMIT_LABEL: &str = "com.coreos.ostree-commit";
/// The label naming the ostree commit of an ostree-native image.
pub const NATIVE_COMMIT_LABEL: &str = "ostree.commit";
/// The diff ID of the last layer ostree-ext wrote; later ones are derived.
pub const FINAL_DIFFID_LABEL: &str = "ostree.final-diffid";
/// The version label of OCI images (ostree-ext reads it before `version`).
pub const OCI_VERSION_LABEL: &str = "org.opencontainers.image.version";
/// The older version label, the one legacy oscontainers carry.
pub const VERSION_LABEL: &str = "version";
/// Label names shown when an image is neither format.
const MAX_LABELS_SHOWN: usize = 20;

/// The two layouts an oscontainer comes in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    /// `srv/repo`, an archive repo (label `com.coreos.ostree-commit`).
    Legacy,
    /// `sysroot/ostree/repo`, ostree-ext's tar format (label `ostree.commit`).
    Native,
}

impl std::fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ImageFormat::Legacy => "legacy",
            ImageFormat::Native => "ostree-native",
        })
    }
}

/// What the labels say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detected {
    pub format: ImageFormat,
    /// The commit checksum the label names (64 lowercase hex).
    pub commit: String,
    pub version: Option<String>,
}

/// Why the labels do not describe an oscontainer: the label at fault and
/// the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelProblem {
    pub label: &'static str,
    pub reason: String,
}

fn problem(label: &'static str, reason: String) -> LabelProblem {
    LabelProblem { label, reason }
}

fn is_checksum(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn checksum_label(
    labels: &BTreeMap<String, String>,
    label: &'static str,
) -> Result<Option<String>, LabelProblem> {
    match labels.get(label) {
        None => Ok(None),
        Some(c) if is_checksum(c) => Ok(Some(c.clone())),
        Some(c) => Err(problem(
            label,
            format!("{c:?} is not an ostree commit checksum (64 lowercase hex)"),
        )),
    }
}

/// The image's format and commit, from its labels.
pub fn detect(labels: &BTreeMap<String, String>) -> Result<Detected, LabelProblem> {
    let native = checksum_label(labels, NATIVE_COMMIT_LABEL)?;
    let legacy = checksum_label(labels, LEGACY_COMMIT_LABEL)?;
    match (native, legacy) {
        (Some(n), Some(l)) if n != l => Err(problem(
            NATIVE_COMMIT_LABEL,
            format!("names commit {n}, but label {LEGACY_COMMIT_LABEL} names {l}: which one the image carries is ambiguous"),
        )),
        (Some(commit), _) => Ok(Detected {
            format: ImageFormat::Native,
            commit,
            version: labels
                .get(OCI_VERSION_LABEL)
                .or_else(|| labels.get(VERSION_LABEL))
                .cloned(),
        }),
        (None, Some(commit)) => Ok(Detected {
            format: ImageFormat::Legacy,
            commit,
            version: labels.get(VERSION_LABEL).cloned(),
        }),
        (None, None) => Err(problem(NATIVE_COMMIT_LABEL, neither(labels))),
    }
}

fn neither(labels: &BTreeMap<String, String>) -> String {
    let mut shown: Vec<String> = labels
        .keys()
        .take(MAX_LABELS_SHOWN)
        .map(|k| format!("{:?}", k.chars().take(80).collect::<String>()))
        .collect();
    if labels.len() > MAX_LABELS_SHOWN {
        shown.push(format!("and {} more", labels.len() - MAX_LABELS_SHOWN));
    }
    let has = if shown.is_empty() {
        "it has no labels".to_owned()
    } else {
        format!("its labels are {}", shown.join(", "))
    };
    format!(
        "missing: not an oscontainer; an ostree-native image has label {NATIVE_COMMIT_LABEL:?} and a legacy one {LEGACY_COMMIT_LABEL:?}, and {has}"
    )
}

/// How many of a native image's `layers` hold its ostree commit: up to and
/// including the one whose diff ID is `ostree.final-diffid`; the rest are
/// derived (added on top, e.g. by a Containerfile). Without the label only
/// a single-layer image can be told apart.
pub fn base_layers(
    labels: &BTreeMap<String, String>,
    diff_ids: &[String],
    layers: usize,
) -> Result<usize, LabelProblem> {
    let Some(final_diffid) = labels.get(FINAL_DIFFID_LABEL) else {
        if layers == 1 {
            return Ok(1);
        }
        return Err(problem(
            FINAL_DIFFID_LABEL,
            format!(
                "missing: with {layers} layers, the ostree layers cannot be told from derived ones"
            ),
        ));
    };
    if diff_ids.len() != layers {
        return Err(problem(
            FINAL_DIFFID_LABEL,
            format!(
                "the config lists {} diff IDs for {layers} layers",
                diff_ids.len()
            ),
        ));
    }
    let mut at = diff_ids
        .iter()
        .enumerate()
        .filter(|(_, d)| *d == final_diffid);
    match (at.next(), at.next()) {
        (Some((i, _)), None) => Ok(i + 1),
        (None, _) => Err(problem(
            FINAL_DIFFID_LABEL,
            format!("{final_diffid:?} is not the diff ID of any layer"),
        )),
        (Some(_), Some(_)) => Err(problem(
            FINAL_DIFFID_LABEL,
            format!("{final_diffid:?} is the diff ID of more than one layer"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn detection() {
        type Want = Result<(ImageFormat, &'static str, Option<&'static str>), &'static str>;
        let cases: &[(&[(&str, &str)], Want)] = &[
            (
                &[(NATIVE_COMMIT_LABEL, A), ("containers.bootc", "1")],
                Ok((ImageFormat::Native, A, None)),
            ),
            (
                &[
                    (NATIVE_COMMIT_LABEL, A),
                    (VERSION_LABEL, "1"),
                    (OCI_VERSION_LABEL, "2"),
                ],
                Ok((ImageFormat::Native, A, Some("2"))),
            ),
            (
                &[(NATIVE_COMMIT_LABEL, A), (VERSION_LABEL, "1")],
                Ok((ImageFormat::Native, A, Some("1"))),
            ),
            (
                &[(LEGACY_COMMIT_LABEL, A), (VERSION_LABEL, "4.6")],
                Ok((ImageFormat::Legacy, A, Some("4.6"))),
            ),
            (
                &[(LEGACY_COMMIT_LABEL, A), (OCI_VERSION_LABEL, "x")],
                Ok((ImageFormat::Legacy, A, None)),
            ),
            (
                &[(LEGACY_COMMIT_LABEL, A), (NATIVE_COMMIT_LABEL, A)],
                Ok((ImageFormat::Native, A, None)),
            ),
            (
                &[(LEGACY_COMMIT_LABEL, A), (NATIVE_COMMIT_LABEL, B)],
                Err("ambiguous"),
            ),
            (
                &[(NATIVE_COMMIT_LABEL, "abc")],
                Err("not an ostree commit checksum"),
            ),
            (
                &[(LEGACY_COMMIT_LABEL, &A[1..])],
                Err("not an ostree commit checksum"),
            ),
            (
                &[("maintainer", "me"), ("io.k8s.name", "x")],
                Err(r#"its labels are "io.k8s.name", "maintainer""#),
            ),
            (&[], Err("it has no labels")),
        ];
        for (l, want) in cases {
            let got = detect(&labels(l));
            match (got, want) {
                (Ok(d), Ok((f, c, v))) => {
                    assert_eq!(
                        (d.format, d.commit.as_str(), d.version.as_deref()),
                        (*f, *c, *v),
                        "{l:?}"
                    )
                }
                (Err(p), Err(w)) => assert!(p.reason.contains(w), "{l:?}: {}", p.reason),
                (got, want) => panic!("{l:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn the_ostree_layers() {
        let d = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let with = labels(&[(FINAL_DIFFID_LABEL, "sha256:2")]);
        type Case<'a> = (
            &'a BTreeMap<String, String>,
            Vec<String>,
            usize,
            Result<usize, &'a str>,
        );
        let cases: &[Case] = &[
            (&with, d(&["sha256:1", "sha256:2"]), 2, Ok(2)),
            (
                &with,
                d(&["sha256:1", "sha256:2", "sha256:3", "sha256:4"]),
                4,
                Ok(2),
            ),
            (&with, d(&["sha256:2"]), 1, Ok(1)),
            (
                &with,
                d(&["sha256:1", "sha256:3"]),
                2,
                Err("not the diff ID of any layer"),
            ),
            (
                &with,
                d(&["sha256:2", "sha256:2"]),
                2,
                Err("more than one layer"),
            ),
            (&with, d(&["sha256:1"]), 2, Err("1 diff IDs for 2 layers")),
            (&BTreeMap::new(), vec![], 1, Ok(1)),
            (&BTreeMap::new(), vec![], 3, Err("cannot be told")),
        ];
        for (l, ids, n, want) in cases {
            match (base_layers(l, ids, *n), want) {
                (Ok(g), Ok(w)) => assert_eq!(g, *w, "{ids:?}"),
                (Err(p), Err(w)) => assert!(p.reason.contains(w), "{ids:?}: {}", p.reason),
                (g, w) => panic!("{ids:?}: got {g:?}, want {w:?}"),
            }
        }
    }
}
