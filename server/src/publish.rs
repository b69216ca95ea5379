//! Publication: turn a source repo into a servable generation.
//!
//! Oscontainer repos have no refs and no summary, so the server derives
//! them. Everything it derives is written to a fresh directory under the
//! state dir, never into the source, and only then becomes visible.
//!
//! Ref naming:
//! 1. `--ref NAME`, if given (each must be in the commit's ref binding, if
//!    it has one: stock ostree refuses anything else);
//! 2. otherwise every name in the commit's `ostree.ref-binding`;
//! 3. otherwise `version/<version>`, from the commit's `version` metadata,
//!    with characters outside `[-._A-Za-z0-9]` replaced by `_`.
//!
//! A `--repo` has refs of its own, so refs are derived for it only when it
//! has none, or when `--ref` or `--commit` asks: its own refs are then
//! published beside the derived ones and win on a name clash, and its own
//! summary is not served, since it would not list the derived refs.
//! Several releases (`--image`s) each also get `version/<version label>`
//! (`org.opencontainers.image.version`, else `version`), and a bound ref
//! points at the newest release bound to it (commit timestamp, then
//! version); a bundle made from the images carries the same refs. Stock
//! ostree pulls a commit only under a ref in its binding, so it reaches the
//! older releases by checksum, or by their version ref with
//! `ostree pull --disable-verify-bindings`; `ostree pull --mirror REMOTE`
//! with no ref (every ref) needs that flag too, with a bound ref it does not.

use crate::ages::VERSION_REF_PREFIX;
use crate::fsutil;
use crate::request::{
    find_commits, find_single_commit, list_some, PublishRequest, Source, NATIVE_ROOT_REPO,
    OSCONTAINER_REPO,
};
use crate::served::Generation;
use crate::served::{FoundRef, PINNED_SUMMARY};
use crate::signing::{self, SignatureOptions};
use crate::state::{check_disjoint, Building, StateDir};
use crate::verify::{self, ObjectGate, Root, VerdictCache, VerifiedSet, VerifyOptions};
use anyhow::{bail, Context, Result};
use oscontent_format::{self as format, Checksum, Commit, ObjectKind, ObjectName, RepoConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub mod local;
mod staging;

/// A repo `config` is a few lines.
const MAX_CONFIG: u64 = format::config::MAX_CONFIG_SIZE as u64;

/// Refs to publish, each with its commit.
type Refs = Vec<(String, Checksum)>;

/// Checks that `repo` is an archive repo; its config, if it has one.
fn check_archive_repo(repo: &Path) -> Result<Option<RepoConfig>> {
    let meta = std::fs::metadata(repo)
        .with_context(|| format!("source repo {} is not accessible", repo.display()))?;
    anyhow::ensure!(
        meta.is_dir(),
        "source repo {} is not a directory",
        repo.display()
    );
    anyhow::ensure!(
        fsutil::list_dir(repo, "objects", 1024)?.is_some(),
        "{} is not an ostree repo: it has no objects/ directory",
        repo.display()
    );
    let Some((config, _)) = fsutil::read_file(repo, "config", MAX_CONFIG)
        .with_context(|| format!("reading {}/config", repo.display()))?
    else {
        return Ok(None);
    };
    let config =
        RepoConfig::parse(&config).with_context(|| format!("reading {}/config", repo.display()))?;
    if !config.is_archive() {
        let mode = config.mode.as_deref().unwrap_or("bare");
        bail!(
            "{} is a {mode:?} repo; only archive repos can be served over HTTP (build it with `ostree init --mode=archive`)",
            repo.display()
        );
    }
    Ok(Some(config))
}

/// An unpacked ostree-native image (`sysroot/ostree/repo`, a
/// `bare-split-xattrs` repo, and no `srv/repo`) is not served in place:
/// say so, and what works, rather than that `srv/repo` is missing.
fn refuse_native_root(root: &Path, repo: &Path) -> Result<()> {
    let native = root.join(NATIVE_ROOT_REPO);
    if root.is_dir() && !repo.exists() && !native.exists() {
        bail!(
            "{} is not an oscontainer root: it has neither {OSCONTAINER_REPO} (a legacy \
             oscontainer's archive repo) nor {NATIVE_ROOT_REPO} (an ostree-native image's); for a \
             plain archive repo use --repo",
            root.display()
        );
    }
    if !repo.exists() && native.is_dir() {
        bail!(
            "{} is an ostree-native image root ({NATIVE_ROOT_REPO}, a bare-split-xattrs repo); --oscontainer serves legacy roots (srv/repo) only: serve the image itself with --image (docker://, oci: or oci-archive:), which converts it while streaming",
            root.display()
        );
    }
    Ok(())
}

/// The refs to publish for a commit, by the rules in the module docs.
pub fn derive_refs(commit: &Commit, requested: &[String]) -> Result<Vec<String>> {
    let bindings = commit.ref_bindings();
    if !requested.is_empty() {
        for r in requested {
            format::validate_ref(r).with_context(|| format!("--ref {r:?}"))?;
            if !bindings.is_empty() && !bindings.contains(r) {
                bail!(
                    "--ref {r:?} is not in commit {}'s ref binding {bindings:?}; stock ostree would refuse to pull it under that name",
                    commit.checksum
                );
            }
        }
        return Ok(requested.to_vec());
    }
    if !bindings.is_empty() {
        for r in &bindings {
            format::validate_ref(r)
                .with_context(|| format!("commit {} binds an invalid ref name", commit.checksum))?;
        }
        return Ok(bindings);
    }
    if commit.ref_binding().is_some() {
        tracing::warn!(
            commit = %commit.checksum,
            "the commit has an empty ostree.ref-binding: stock ostree refuses to pull it under any ref name, only by checksum"
        );
    }
    let Some(version) = commit
        .version()
        .and_then(|v| format::sanitize_ref_component(&v))
    else {
        bail!(
            "commit {} has neither an ostree.ref-binding nor a version to name a ref after; pass --ref",
            commit.checksum
        );
    };
    Ok(vec![format!("{VERSION_REF_PREFIX}{version}")])
}

fn write_file(path: &Path, contents: &[u8]) -> Result<()> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
    }
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

/// Publishes `req` as a new generation (not yet visible: the caller swaps it
/// in). On error nothing is left behind.
pub fn publish(req: &PublishRequest, state: &StateDir) -> Result<Generation> {
    publish_signed(req, state, &SignatureOptions::default())
}

/// [`publish`], with signatures installed, made and verified as `sigs`
/// says (see `signing.rs`) before the generation can become visible.
pub fn publish_signed(
    req: &PublishRequest,
    state: &StateDir,
    sigs: &SignatureOptions,
) -> Result<Generation> {
    publish_verified(req, state, sigs, None)
}

/// [`publish_signed`], reusing (and replacing) the verdicts of the
/// previous publication from the same live repo.
///
/// What is served is a snapshot the overlay holds: the refs (the source's
/// own, or derived), the source's `summary` and `summary.sig` if it has
/// them, and the set of objects and deltas verified here. Refs, summaries
/// and objects other tools add to the repo afterwards are not served until
/// a publication verifies (and, with `--sign-key`, signs) them.
pub fn publish_verified(
    req: &PublishRequest,
    state: &StateDir,
    sigs: &SignatureOptions,
    cache: Option<Arc<VerdictCache>>,
) -> Result<Generation> {
    let repo = req.source.repo_path();
    if let Source::Oscontainer(root) = &req.source {
        refuse_native_root(root, &repo)?;
    }
    let config = check_archive_repo(&repo)?;
    // Also checked before the state dir was created; the repo may have
    // moved since, and this is cheap. A native root's conversion is the
    // server's own, staged in the state dir (`source::native::root`).
    if !repo.starts_with(state.path().join(crate::source::native::root::ROOTS_DIR)) {
        check_disjoint(state.path(), &repo)?;
    }
    let existing = Generation::list_refs(&repo)?;
    if let Source::Oscontainer(_) = req.source {
        if config.is_none() {
            tracing::warn!(repo = %repo.display(), "oscontainer repo has no config; serving a generated one");
        }
    }
    // A `--repo` with refs of its own publishes them: `--commit` there only
    // pins what `--sign-key` may sign (`signing::decide`), so pinning a
    // commit never changes what is published.
    let derive = match req.source {
        Source::Repo(_) => !req.refs.is_empty() || existing.is_empty(),
        Source::Oscontainer(_) => {
            req.commit.is_some() || !req.refs.is_empty() || existing.is_empty()
        }
    };
    let building = state.begin(vec![repo.clone()])?;
    let tmp = building.path().to_owned();
    let generation = building.generation();
    let result = (|| -> Result<(Refs, VerifiedSet)> {
        if config.is_none() {
            write_file(&tmp.join("config"), format::config::ARCHIVE_CONFIG)?;
        }
        // Derived refs first: the repo's own win on a name clash.
        let mut refs = if derive {
            derive_into(req, &repo, generation, &tmp)?
        } else {
            Vec::new()
        };
        let (own, listed) = snapshot_into(&repo, &existing, generation, &tmp, !derive)?;
        refs.retain(|(n, _)| own.iter().all(|(o, _)| o != n));
        refs.extend(own);
        let mut commits: Vec<Checksum> = refs.iter().map(|(_, c)| *c).chain(listed).collect();
        commits.sort();
        commits.dedup();
        let started = std::time::Instant::now();
        let opts = VerifyOptions { jobs: 0, cache };
        let roots = [Root::plain(repo.clone())];
        let others = newest_commits(&repo, generation, verify::MAX_HISTORY)?;
        let history = verify::MAX_HISTORY;
        let mut set = verify::verify_with_history(&roots, &commits, &others, history, &opts)
            .with_context(|| format!("verifying {}", repo.display()))?;
        verify::verify_deltas(&repo, &commits, &mut set)
            .with_context(|| format!("verifying {}", repo.display()))?;
        tracing::info!(objects = set.len(), hashed = set.hashed, elapsed_ms = started.elapsed().as_millis() as u64, repo = %repo.display(), "verified what the generation serves");
        Ok((refs, set))
    })();
    finish_generation(result, building, sigs)
}

/// The `n` newest commits in `repo` (by timestamp), those that load: what
/// a `--repo` serves by checksum beside its refs. One that does not load
/// is left out, and so not served. Read without keeping them: a repo may
/// hold many more commits than the generation serves.
fn newest_commits(repo: &Path, generation: &Generation, n: usize) -> Result<Vec<Checksum>> {
    let mut found: Vec<(u64, Checksum)> = Vec::new();
    for c in find_commits(repo)? {
        match generation.read_commit(&c) {
            Ok(commit) => found.push((commit.timestamp, c)),
            Err(e) => tracing::warn!(commit = %c, "not serving the commit: {e:#}"),
        }
    }
    found.sort_unstable_by(|a, b| b.cmp(a));
    Ok(found.into_iter().take(n).map(|(_, c)| c).collect())
}

/// Derives refs for the one commit (`--commit`, else the repo's only one)
/// and writes them into the overlay.
fn derive_into(
    req: &PublishRequest,
    repo: &Path,
    generation: &Generation,
    tmp: &Path,
) -> Result<Vec<(String, Checksum)>> {
    let checksum = match req.commit {
        Some(c) => c,
        None => find_single_commit(repo)?,
    };
    let commit = generation.commit(&checksum)?;
    check_root_objects(repo, &commit)?;
    let names = derive_refs(&commit, &req.refs)?;
    for name in &names {
        write_file(
            &tmp.join("refs/heads").join(name),
            format!("{checksum}\n").as_bytes(),
        )?;
    }
    Ok(names.into_iter().map(|n| (n, checksum)).collect())
}

/// Copies the repo's refs as they are now into the overlay (with its
/// `summary` and `summary.sig`, pinned, unless refs were derived, which
/// that summary would not list), leaving out refs whose commit is not
/// there, as a remote with one broken ref still serves the others.
/// Returns the refs, and the other commits a pinned summary names (they are
/// served, so they are verified too).
fn snapshot_into(
    repo: &Path,
    existing: &[FoundRef],
    generation: &Generation,
    tmp: &Path,
    pin_summary: bool,
) -> Result<(Refs, Vec<Checksum>)> {
    let mut refs = Vec::new();
    for r in existing {
        if let Err(e) = generation.commit(&r.commit) {
            tracing::warn!(r#ref = r.name, commit = %r.commit, "not publishing the ref: {e:#}");
            continue;
        }
        // The name passed the ref grammar when it was listed.
        write_file(
            &tmp.join(r.namespace.dir()).join(&r.name),
            format!("{}\n", r.commit).as_bytes(),
        )?;
        refs.push((r.name.clone(), r.commit));
    }
    if !pin_summary {
        return Ok((refs, Vec::new()));
    }
    let cap = format::summary::MAX_SUMMARY_SIZE as u64;
    let Some((summary, _)) = fsutil::read_file(repo, "summary", cap)
        .with_context(|| format!("reading {}/summary", repo.display()))?
    else {
        return Ok((refs, Vec::new()));
    };
    let parsed = format::parse_summary(&summary)
        .with_context(|| format!("parsing {}/summary", repo.display()))?;
    let sig = fsutil::read_file(repo, "summary.sig", cap)
        .with_context(|| format!("reading {}/summary.sig", repo.display()))?;
    write_file(&tmp.join(PINNED_SUMMARY), &summary)?;
    if let Some((sig, _)) = sig {
        write_file(&tmp.join("summary.sig"), &sig)?;
    }
    let listed = parsed
        .refs
        .iter()
        .chain(parsed.collection_map.values().flatten());
    let listed = listed
        .map(|r| r.commit)
        .filter(|c| generation.commit(c).is_ok())
        .collect();
    Ok((refs, listed))
}

/// Finishes the generation built in `building`, serving `refs` and only
/// the objects in `verified`: checks it, generates its summary, installs
/// and verifies its signatures, then commits it. On any error its overlay
/// is removed.
fn finish_generation(
    result: Result<(Refs, VerifiedSet)>,
    mut building: Building,
    sigs: &SignatureOptions,
) -> Result<Generation> {
    let (refs, verified) = result?;
    let generation = building.generation_mut();
    generation.gate = ObjectGate::Only(Arc::new(verified));
    // A pinned summary (a `--repo`'s own) is served as it is: it does not
    // say to look in delta indexes, and stock ostree would then try a
    // generated delta's superblock unlisted, which a signed summary forbids.
    generation.index_deltas = several_commits(&refs) && !generation.has_pinned_summary()?;
    generation.derived_refs = refs;
    // A broken repo fails here, not on the first client.
    anyhow::ensure!(
        !generation.refs()?.is_empty(),
        "nothing to publish: no refs"
    );
    // Generated here, once: the first summary request finds it cached.
    generation
        .generated_summary()
        .context("generating the summary")?;
    // Signatures last: they sign (and verify) the final refs and summary.
    generation.signatures = signing::apply(generation, sigs, std::time::SystemTime::now())?;
    Ok(building.commit())
}

/// Whether the refs name more than one commit: then the server may
/// generate deltas between them (`crate::deltas`), and a generated summary
/// says to look for them in delta indexes from the start. It depends on the
/// refs only, so `sign` and `serve` (whatever its `--deltas`) agree on the
/// summary's bytes; with no delta published, a stock client's one index
/// request answers 404 and it fetches objects.
pub fn several_commits(refs: &[(String, Checksum)]) -> bool {
    refs.iter().any(|(_, c)| *c != refs[0].1)
}

/// A commit whose root dirtree or dirmeta is missing cannot be checked out:
/// refuse it before any ref points at it.
fn check_root_objects(repo: &Path, commit: &Commit) -> Result<()> {
    for (what, c, kind) in [
        ("root dirtree", commit.root_tree, ObjectKind::DirTree),
        ("root dirmeta", commit.root_meta, ObjectKind::DirMeta),
    ] {
        let rel = ObjectName::new(c, kind).path();
        anyhow::ensure!(
            fsutil::open_file(repo, &rel)?.is_some(),
            "commit {} is incomplete: its {what} {c} is missing from {}",
            commit.checksum,
            repo.display()
        );
    }
    Ok(())
}

/// One verified image's repo, to publish alongside others.
#[derive(Debug, Clone)]
pub struct Release {
    /// How the image was named, for messages.
    pub image: String,
    /// The staged `srv/repo`.
    pub repo: PathBuf,
    /// From the image label `com.coreos.ostree-commit`.
    pub commit: Checksum,
    /// From the image label `version`.
    pub version: Option<String>,
    /// Its repo holds only objects verified as they were written (a native
    /// image, converted while streaming): not hashed again at publication.
    pub preverified: bool,
    /// A native image's staging material (manifest, config, object sets),
    /// published beside it; `None` for a legacy image.
    pub staging: Option<Arc<crate::source::native::staging::NativeStaging>>,
}

/// Which commit a ref name ends up on when several releases claim it: the
/// newest by commit timestamp, then by version.
fn newer(a: &Commit, b: &Commit) -> bool {
    (a.timestamp, a.version()) > (b.timestamp, b.version())
}

/// Publishes several releases (images) as one generation. Each image's label
/// must name the one commit its repo holds, or the image is refused. Refs:
/// every release gets `version/<version label>`, and each bound ref points
/// at the newest release bound to it (stock ostree only pulls a commit under
/// a ref in its binding; older releases stay reachable by checksum or by
/// their version ref with clients that allow it).
pub fn publish_releases(releases: &[Release], state: &StateDir) -> Result<Generation> {
    publish_releases_signed(releases, state, &SignatureOptions::default())
}

/// [`publish_releases`] with signatures, as [`publish_signed`].
pub fn publish_releases_signed(
    releases: &[Release],
    state: &StateDir,
    sigs: &SignatureOptions,
) -> Result<Generation> {
    anyhow::ensure!(!releases.is_empty(), "no releases to publish");
    let sources: Vec<PathBuf> = releases.iter().map(|r| r.repo.clone()).collect();
    let mut building = state.begin(sources)?;
    // Staged by the server, and never written again while served.
    building.generation_mut().fixed_sources = true;
    let tmp = building.path().to_owned();
    let generation = building.generation();
    let result = (|| -> Result<(Refs, VerifiedSet)> {
        let mut any_config = false;
        let mut claims: std::collections::BTreeMap<String, Commit> =
            std::collections::BTreeMap::new();
        for r in releases {
            any_config |= check_archive_repo(&r.repo)
                .with_context(|| format!("image {}", r.image))?
                .is_some();
            // An oscontainer holds exactly its labelled commit.
            match find_commits(&r.repo)?.as_slice() {
                [found] if *found == r.commit => {}
                [found] => bail!(
                    "image {}: its label com.coreos.ostree-commit={} does not match the commit {found} its repo holds; refusing it",
                    r.image,
                    r.commit
                ),
                [] => bail!("image {}: its srv/repo contains no commit object", r.image),
                many => bail!(
                    "image {}: its srv/repo contains {} commits ({}), an oscontainer holds exactly one; refusing it",
                    r.image,
                    many.len(),
                    list_some(many)
                ),
            }
            let commit = generation
                .commit(&r.commit)
                .with_context(|| format!("image {}", r.image))?;
            check_root_objects(&r.repo, &commit)?;
            let mut names: Vec<String> = commit.ref_bindings();
            for n in &names {
                format::validate_ref(n).with_context(|| {
                    format!(
                        "image {}: commit {} binds an invalid ref name",
                        r.image, r.commit
                    )
                })?;
            }
            let version = r.version.clone().or_else(|| commit.version());
            if let Some(v) = version.as_deref().and_then(format::sanitize_ref_component) {
                names.push(format!("{VERSION_REF_PREFIX}{v}"));
            }
            anyhow::ensure!(
                !names.is_empty(),
                "image {}: commit {} has no ref binding and no version to name a ref after",
                r.image,
                r.commit
            );
            for n in names {
                match claims.get(&n) {
                    Some(prev) if prev.checksum != commit.checksum && !newer(&commit, prev) => {
                        tracing::warn!(r#ref = n, kept = %prev.checksum, dropped = %commit.checksum, "two releases claim one ref; keeping the newer");
                    }
                    _ => {
                        claims.insert(n, commit.clone());
                    }
                }
            }
        }
        if !any_config {
            write_file(&tmp.join("config"), format::config::ARCHIVE_CONFIG)?;
        }
        for (name, commit) in &claims {
            write_file(
                &tmp.join("refs/heads").join(name),
                format!("{}\n", commit.checksum).as_bytes(),
            )?;
        }
        let mut set = verify_releases(releases)?;
        staging::write_staging(releases, &tmp, &mut set)?;
        Ok((
            claims.into_iter().map(|(n, c)| (n, c.checksum)).collect(),
            set,
        ))
    })();
    finish_generation(result, building, sigs)
}

/// What a generation of `releases` serves: each labelled commit's closure,
/// read as the generation resolves it (earlier images first); a native
/// image's objects were verified at conversion and are walked only.
fn verify_releases(releases: &[Release]) -> Result<VerifiedSet> {
    let roots: Vec<Root> = releases
        .iter()
        .map(|r| Root {
            path: r.repo.clone(),
            preverified: r.preverified,
        })
        .collect();
    let commits: Vec<Checksum> = releases.iter().map(|r| r.commit).collect();
    let started = std::time::Instant::now();
    let set = verify::verify_closure(&roots, &commits, &VerifyOptions::default())
        .context("verifying the images' objects")?;
    tracing::info!(
        objects = set.len(),
        hashed = set.hashed,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "verified what the generation serves"
    );
    Ok(set)
}
