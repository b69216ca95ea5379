//! The signature bundle on disk: its manifest, how the signer makes and
//! writes one, and how a server finds (the Kubernetes volume layout),
//! identifies and strictly loads one.

use super::error::SignatureError;
use super::keys::write_new;
use crate::fsutil;
use crate::served::{Generation, MAX_METADATA_FILE};
use anyhow::{bail, Context, Result};
use oscontent_format::openpgp::{self, Cert};
use oscontent_format::{self as format, build_gpgsigs, merge_gpgsigs, parse_gpgsigs, Checksum};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

/// The bundle's index: which commits, which summary, which key.
pub const BUNDLE_MANIFEST: &str = "manifest.json";
/// The bundle's signature over the summary (an `a{sv}` with `ostree.gpgsigs`).
pub const BUNDLE_SUMMARY_SIG: &str = "summary.sig";
/// Suffix of a bundle's per-commit detached metadata: `<checksum>.commitmeta`.
pub const COMMITMETA_SUFFIX: &str = ".commitmeta";
/// Bundle format written and understood.
pub const BUNDLE_FORMAT: u32 = 1;
/// What `format` names, so a stray JSON file is not taken for a bundle.
pub const BUNDLE_KIND: &str = "oscontent-signature-bundle";
/// Kubernetes' atomic-writer layout (ConfigMap, Secret, projected volumes):
/// `DIR/..data` links to a sibling `..<timestamp>` directory holding the
/// files, and each `DIR/<key>` links to `..data/<key>`. The swap of
/// `..data` is the atomic update.
pub const KUBE_DATA_LINK: &str = "..data";
/// A manifest lists a few commits; anything larger is not ours.
const MAX_MANIFEST: u64 = 1 << 20;
/// Commits beyond this count in one bundle are refused.
pub const MAX_BUNDLE_COMMITS: usize = 4096;
/// Files in a bundle directory beyond this count are refused unread.
const MAX_BUNDLE_ENTRIES: usize = 2 * MAX_BUNDLE_COMMITS + 16;
/// Bundle bytes hashed to notice a change, at most (a ConfigMap holds 1 MiB).
const MAX_BUNDLE_BYTES: u64 = 64 << 20;

/// `manifest.json` of a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureManifest {
    /// Always [`BUNDLE_KIND`].
    pub kind: String,
    /// [`BUNDLE_FORMAT`].
    pub format: u32,
    /// Fingerprint of the signing certificate (primary key), hex.
    pub signer: String,
    /// SHA-256 (hex) of the exact summary the server will publish; its
    /// `summary.sig` is served only next to that summary.
    pub summary_sha256: String,
    /// Every signed commit (hex); each has `<commit>.commitmeta`.
    pub commits: Vec<String>,
    /// The refs publication derived, name to commit, for people reading it.
    pub refs: BTreeMap<String, String>,
}

/// A signature bundle in memory.
#[derive(Debug, Clone)]
pub struct SignatureBundle {
    pub manifest: SignatureManifest,
    /// Each commit's full detached metadata (source's merged with ours).
    pub commitmeta: BTreeMap<Checksum, Vec<u8>>,
    /// An `a{sv}` with `ostree.gpgsigs` over the summary.
    pub summary_sig: Vec<u8>,
}

impl SignatureBundle {
    pub(super) fn summary_sha256(&self) -> &str {
        &self.manifest.summary_sha256
    }
}

/// Signs what `generation` publishes: every commit its refs point at, and
/// its summary. Existing detached metadata is kept and our signature added.
pub fn sign_generation(generation: &Generation, tsk: &Cert) -> Result<SignatureBundle> {
    let refs = published_refs(generation)?;
    let mut commitmeta = BTreeMap::new();
    for commit in refs.values() {
        if commitmeta.contains_key(commit) {
            continue;
        }
        let bytes = generation.commit_bytes(commit)?;
        let sig = openpgp::sign_detached(tsk, &bytes)
            .with_context(|| format!("signing commit {commit}"))?;
        let existing = generation.source_commitmeta(commit)?;
        let merged = merge_gpgsigs(existing.as_deref(), &[sig])
            .with_context(|| format!("merging into commit {commit}'s detached metadata"))?;
        commitmeta.insert(*commit, merged);
    }
    anyhow::ensure!(
        commitmeta.len() <= MAX_BUNDLE_COMMITS,
        "{} commits to sign, over the {MAX_BUNDLE_COMMITS} limit of one bundle",
        commitmeta.len()
    );
    let summary = generation.served_summary()?;
    let summary_sig =
        build_gpgsigs(&[openpgp::sign_detached(tsk, &summary).context("signing the summary")?])?;
    Ok(SignatureBundle {
        manifest: SignatureManifest {
            kind: BUNDLE_KIND.into(),
            format: BUNDLE_FORMAT,
            signer: tsk.fingerprint().to_hex(),
            summary_sha256: Checksum::digest(&summary).to_hex(),
            commits: commitmeta.keys().map(Checksum::to_hex).collect(),
            refs: refs.iter().map(|(n, c)| (n.clone(), c.to_hex())).collect(),
        },
        commitmeta,
        summary_sig,
    })
}

/// Every ref the generation serves (heads and mirrors), name to commit.
pub(super) fn published_refs(generation: &Generation) -> Result<BTreeMap<String, Checksum>> {
    Ok(generation
        .refs()?
        .into_iter()
        .map(|r| {
            let name = match r.namespace {
                format::RefNamespace::Heads => r.name,
                format::RefNamespace::Mirrors => format!("(mirror) {}", r.name),
            };
            (name, r.commit)
        })
        .collect())
}

/// Writes `bundle` as the directory `out`: into a sibling temporary
/// directory first, renamed into place only when complete. `out` must not
/// exist, or be an empty directory.
pub fn write_bundle(bundle: &SignatureBundle, out: &Path) -> Result<()> {
    if let Ok(mut rd) = std::fs::read_dir(out) {
        anyhow::ensure!(
            rd.next().is_none(),
            "{} exists and is not empty; refusing to overwrite it",
            out.display()
        );
    } else if out.symlink_metadata().is_ok() {
        bail!("{} exists and is not a directory", out.display());
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".oscontent-bundle-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a temporary directory in {}", parent.display()))?;
    let mut manifest = serde_json::to_vec_pretty(&bundle.manifest).context("manifest")?;
    manifest.push(b'\n');
    write_new(&tmp.path().join(BUNDLE_MANIFEST), &manifest, 0o644)?;
    write_new(
        &tmp.path().join(BUNDLE_SUMMARY_SIG),
        &bundle.summary_sig,
        0o644,
    )?;
    for (c, meta) in &bundle.commitmeta {
        write_new(
            &tmp.path().join(format!("{c}{COMMITMETA_SUFFIX}")),
            meta,
            0o644,
        )?;
    }
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .context("setting bundle permissions")?;
    if out.exists() {
        std::fs::remove_dir(out).with_context(|| format!("replacing empty {}", out.display()))?;
    }
    let tmp = tmp.keep();
    if let Err(e) = std::fs::rename(&tmp, out) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e).with_context(|| format!("renaming the bundle into {}", out.display()));
    }
    Ok(())
}

/// Where a bundle's files are: `dir` itself, or what its Kubernetes
/// `..data` link points at. Only that one link is followed, and only to a
/// sibling `..<name>` directory; symlinks anywhere else are not.
pub fn bundle_root(dir: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(dir)
        .with_context(|| format!("signature directory {} is not accessible", dir.display()))?;
    anyhow::ensure!(
        meta.is_dir(),
        "signature directory {} is not a directory",
        dir.display()
    );
    let link = dir.join(KUBE_DATA_LINK);
    match std::fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => {
            let target =
                std::fs::read_link(&link).with_context(|| format!("reading {}", link.display()))?;
            let mut comps = target.components();
            match (comps.next(), comps.next()) {
                (Some(Component::Normal(name)), None)
                    if name.as_encoded_bytes().starts_with(b"..") =>
                {
                    Ok(dir.join(name))
                }
                _ => bail!(
                    "{} points at {}; want a sibling `..<timestamp>` directory (the Kubernetes volume layout)",
                    link.display(),
                    target.display()
                ),
            }
        }
        Ok(_) => bail!(
            "{} is not a symlink; want the Kubernetes volume layout or plain files",
            link.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(dir.to_owned()),
        Err(e) => Err(e).with_context(|| format!("inspecting {}", link.display())),
    }
}

/// What a bundle directory holds right now, for noticing a change: the
/// resolved root and a hash of every file's name and bytes. `None` when the
/// directory cannot be read (that is reported when loading).
pub fn bundle_identity(dir: &Path) -> Option<[u8; 32]> {
    let root = bundle_root(dir).ok()?;
    let entries = fsutil::list_dir(&root, "", MAX_BUNDLE_ENTRIES).ok()??;
    let mut h = Sha256::new();
    h.update(root.as_os_str().as_encoded_bytes());
    let mut budget = MAX_BUNDLE_BYTES;
    for e in entries.iter().filter(|e| e.is_file) {
        let (bytes, _) = fsutil::read_file(&root, &e.name, budget).ok()??;
        budget = budget.saturating_sub(bytes.len() as u64);
        h.update((e.name.len() as u64).to_le_bytes());
        h.update(e.name.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Some(h.finalize().into())
}

/// Loads the bundle in `dir`. `Ok(None)` if the directory has no
/// manifest yet (an empty or optional ConfigMap); anything malformed is a
/// [`SignatureError::BadBundle`] naming the file and what is wrong with it.
pub fn load_bundle(dir: &Path) -> Result<Option<SignatureBundle>> {
    let bad = |reason: String| SignatureError::BadBundle {
        dir: dir.to_owned(),
        reason,
    };
    let root = bundle_root(dir).map_err(|e| bad(format!("{e:#}")))?;
    let read = |name: &str, max: u64| -> Result<Option<Vec<u8>>, SignatureError> {
        match fsutil::read_file(&root, name, max) {
            Ok(Some((b, _))) => Ok(Some(b)),
            Ok(None) => {
                // Say why a file that is there is not read.
                if root.join(name).symlink_metadata().is_ok() {
                    return Err(bad(format!(
                        "{name} is not a regular file (symlinks are followed only through the Kubernetes ..data layout)"
                    )));
                }
                Ok(None)
            }
            Err(e) => Err(bad(format!("reading {name}: {e}"))),
        }
    };
    let Some(manifest) = read(BUNDLE_MANIFEST, MAX_MANIFEST)? else {
        return Ok(None);
    };
    let manifest: SignatureManifest = serde_json::from_slice(&manifest)
        .map_err(|e| bad(format!("{BUNDLE_MANIFEST} is not a bundle manifest: {e}")))?;
    if manifest.kind != BUNDLE_KIND {
        return Err(bad(format!(
            "{BUNDLE_MANIFEST} has kind {:?}, want {BUNDLE_KIND:?}",
            manifest.kind
        ))
        .into());
    }
    if manifest.format != BUNDLE_FORMAT {
        return Err(bad(format!(
            "{BUNDLE_MANIFEST} has format {}, this server understands {BUNDLE_FORMAT}",
            manifest.format
        ))
        .into());
    }
    Checksum::from_hex(&manifest.summary_sha256)
        .map_err(|e| bad(format!("{BUNDLE_MANIFEST}: summary_sha256: {e}")))?;
    if manifest.commits.len() > MAX_BUNDLE_COMMITS {
        return Err(bad(format!(
            "{} commits, over the {MAX_BUNDLE_COMMITS} limit",
            manifest.commits.len()
        ))
        .into());
    }
    let mut commitmeta = BTreeMap::new();
    for hex in &manifest.commits {
        let c =
            Checksum::from_hex(hex).map_err(|e| bad(format!("{BUNDLE_MANIFEST}: commits: {e}")))?;
        let name = format!("{c}{COMMITMETA_SUFFIX}");
        let meta = read(&name, MAX_METADATA_FILE)?.ok_or_else(|| {
            bad(format!(
                "{BUNDLE_MANIFEST} lists commit {c} but {name} is missing"
            ))
        })?;
        let sigs = parse_gpgsigs(&meta).map_err(|e| bad(format!("{name}: {e}")))?;
        if sigs.is_empty() {
            return Err(bad(format!("{name} holds no ostree.gpgsigs")).into());
        }
        commitmeta.insert(c, meta);
    }
    let summary_sig = read(BUNDLE_SUMMARY_SIG, MAX_METADATA_FILE)?
        .ok_or_else(|| bad(format!("{BUNDLE_SUMMARY_SIG} is missing")))?;
    if parse_gpgsigs(&summary_sig)
        .map_err(|e| bad(format!("{BUNDLE_SUMMARY_SIG}: {e}")))?
        .is_empty()
    {
        return Err(bad(format!("{BUNDLE_SUMMARY_SIG} holds no ostree.gpgsigs")).into());
    }
    Ok(Some(SignatureBundle {
        manifest,
        commitmeta,
        summary_sig,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_root_layouts() {
        let t = tempfile::tempdir().unwrap();
        let plain = t.path().join("plain");
        std::fs::create_dir(&plain).unwrap();
        assert_eq!(bundle_root(&plain).unwrap(), plain);

        // What kubelet's atomic writer leaves for a ConfigMap volume.
        let kube = t.path().join("kube");
        std::fs::create_dir_all(kube.join("..2025_01_01_00_00_00.000000001")).unwrap();
        std::os::unix::fs::symlink("..2025_01_01_00_00_00.000000001", kube.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/manifest.json", kube.join("manifest.json")).unwrap();
        assert_eq!(
            bundle_root(&kube).unwrap(),
            kube.join("..2025_01_01_00_00_00.000000001")
        );

        let escaping = t.path().join("escaping");
        std::fs::create_dir(&escaping).unwrap();
        std::os::unix::fs::symlink("/etc", escaping.join("..data")).unwrap();
        let nested = t.path().join("nested");
        std::fs::create_dir(&nested).unwrap();
        std::os::unix::fs::symlink("..x/../..", nested.join("..data")).unwrap();
        let not_link = t.path().join("notlink");
        std::fs::create_dir_all(not_link.join("..data")).unwrap();
        for d in [&escaping, &nested, &not_link, &t.path().join("missing")] {
            assert!(bundle_root(d).is_err(), "{}", d.display());
        }
    }

    fn fake_bundle() -> SignatureBundle {
        let c = Checksum::digest(b"a commit");
        SignatureBundle {
            manifest: SignatureManifest {
                kind: BUNDLE_KIND.into(),
                format: BUNDLE_FORMAT,
                signer: "AB".repeat(20),
                summary_sha256: Checksum::digest(b"a summary").to_hex(),
                commits: vec![c.to_hex()],
                refs: BTreeMap::from([("os/stable".to_owned(), c.to_hex())]),
            },
            commitmeta: BTreeMap::from([(c, build_gpgsigs(&[vec![1, 2, 3]]).unwrap())]),
            summary_sig: build_gpgsigs(&[vec![4, 5, 6]]).unwrap(),
        }
    }

    #[test]
    fn bundles_roundtrip_and_never_overwrite() {
        let t = tempfile::tempdir().unwrap();
        let b = fake_bundle();
        let out = t.path().join("bundle");
        write_bundle(&b, &out).unwrap();
        let loaded = load_bundle(&out).unwrap().unwrap();
        assert_eq!(loaded.manifest, b.manifest);
        assert_eq!(loaded.commitmeta, b.commitmeta);
        assert_eq!(loaded.summary_sig, b.summary_sig);
        let err = write_bundle(&b, &out).unwrap_err();
        assert!(format!("{err:#}").contains("not empty"), "{err:#}");
        // An empty directory (a fresh mount point) is fine to fill.
        let empty = t.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        write_bundle(&b, &empty).unwrap();
        // No temporary directories are left behind.
        let left: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".oscontent-bundle-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // A missing directory is an error; an empty one is "no bundle
        // yet" (an optional ConfigMap).
        assert!(load_bundle(&t.path().join("missing")).is_err());
        let nothing = t.path().join("nothing");
        std::fs::create_dir(&nothing).unwrap();
        assert!(load_bundle(&nothing).unwrap().is_none());
    }

    #[test]
    fn malformed_bundles_are_refused_by_name() {
        let b = fake_bundle();
        let c = b.manifest.commits[0].clone();
        type Edit = Box<dyn Fn(&Path)>;
        let manifest_with = |f: fn(&mut serde_json::Value)| -> Edit {
            Box::new(move |d: &Path| {
                let p = d.join(BUNDLE_MANIFEST);
                let mut v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                f(&mut v);
                std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
            })
        };
        let c2 = c.clone();
        let cases: Vec<(&str, Edit, &str)> = vec![
            (
                "not json",
                Box::new(|d: &Path| std::fs::write(d.join(BUNDLE_MANIFEST), "{").unwrap()),
                "not a bundle manifest",
            ),
            (
                "wrong kind",
                manifest_with(|v| v["kind"] = "other".into()),
                "has kind",
            ),
            (
                "future format",
                manifest_with(|v| v["format"] = 2.into()),
                "has format 2",
            ),
            (
                "unknown field",
                manifest_with(|v| v["extra"] = 1.into()),
                "unknown field",
            ),
            (
                "bad summary digest",
                manifest_with(|v| v["summary_sha256"] = "xyz".into()),
                "summary_sha256",
            ),
            (
                "bad commit",
                manifest_with(|v| v["commits"] = serde_json::json!(["nothex"])),
                "commits",
            ),
            (
                "missing commitmeta",
                Box::new(move |d: &Path| {
                    std::fs::remove_file(d.join(format!("{c}{COMMITMETA_SUFFIX}"))).unwrap()
                }),
                "is missing",
            ),
            (
                "commitmeta without signatures",
                Box::new(move |d: &Path| {
                    std::fs::write(
                        d.join(format!("{c2}{COMMITMETA_SUFFIX}")),
                        merge_gpgsigs(None, &[]).unwrap(),
                    )
                    .unwrap()
                }),
                "holds no ostree.gpgsigs",
            ),
            (
                "missing summary.sig",
                Box::new(|d: &Path| std::fs::remove_file(d.join(BUNDLE_SUMMARY_SIG)).unwrap()),
                "summary.sig is missing",
            ),
            (
                "symlinked manifest outside the kube layout",
                Box::new(|d: &Path| {
                    let real = d.with_extension("real");
                    std::fs::rename(d.join(BUNDLE_MANIFEST), &real).unwrap();
                    std::os::unix::fs::symlink(&real, d.join(BUNDLE_MANIFEST)).unwrap();
                }),
                "not a regular file",
            ),
        ];
        let t = tempfile::tempdir().unwrap();
        for (i, (name, edit, phrase)) in cases.into_iter().enumerate() {
            let d = t.path().join(format!("b{i}"));
            write_bundle(&b, &d).unwrap();
            edit(&d);
            let err = load_bundle(&d).expect_err(name);
            assert!(
                err.chain().any(|e| e.is::<SignatureError>()),
                "{name}: not a SignatureError: {err:#}"
            );
            let msg = format!("{err:#}");
            assert!(
                msg.contains(phrase) && msg.contains(&d.display().to_string()),
                "{name}: {msg}"
            );
        }
    }
}
