//! Deterministic synthetic oscontainers: OS-shaped trees committed with the
//! stock `ostree` CLI into archive repos laid out as oscontainer roots
//! (`srv/repo`, no refs, no summary), plus OCI image layouts built with umoci.
//!
//! CONTRACT (shared with tests/ and the demo; keep signatures stable):
//! [`FixtureSpec::new`], [`ensure`], [`default_dir`], [`small`] and the
//! public fields of [`Fixtures`] and [`Release`].
//!
//! Layout of a built fixture directory:
//!
//! ```text
//! <dir>/fixtures.json                  manifest, written last
//! <dir>/<version>/srv/repo             archive repo: one orphan commit, no refs, no summary
//! <dir>/oci                            OCI image layout, one tag per version
//! ```
//!
//! Generation (module `plan`) is split in two: [`plan_tree`] /
//! [`plan_update`] are pure functions of a seed that describe every entry
//! (content is a seed + size, not bytes, so a 1 GiB plan costs a few MiB),
//! and [`write_tree`] turns a plan into files. Everything downstream
//! (ostree, umoci) only sees the written tree; this file holds the contract,
//! the locking and the ostree/umoci steps.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::Instant;

use anyhow::{anyhow, bail, ensure as check, Context};

mod plan;
use plan::MIB;
pub use plan::{
    plan_tree, plan_update, write_content, write_tree, Content, Node, Style, TreePlan, TreeStats,
    UpdateSummary,
};

/// Bump whenever anything that changes the built bytes changes (planner,
/// content generator, commit arguments, image recipe): built fixtures with a
/// different version are rebuilt instead of reused.
pub const GENERATOR_VERSION: u32 = 2;

/// The one seed everything derives from. Changing it changes every checksum.
pub const SEED: u64 = 0x6f73_636f_6e74_656e; // "oscontent"

/// Default ref bound into the commits.
pub const DEFAULT_REF: &str = "fedora/x86_64/coreos/stable";

/// Default share of v1's regular files that v2 rewrites.
pub const DEFAULT_UPDATE_SHARE: f64 = 0.05;

/// Overrides `<workspace>/target/fixtures` as the parent of default dirs.
pub const FIXTURES_DIR_ENV: &str = "OSCONTENT_FIXTURES_DIR";

/// Name of the manifest inside a built fixture directory.
pub const MANIFEST_NAME: &str = "fixtures.json";

/// The two releases: CoreOS-style versions and their build dates. The
/// timestamps are the commit timestamps and the image `created` times, so
/// that nothing depends on the wall clock.
const RELEASES: [ReleaseDef; 2] = [
    ReleaseDef {
        version: "41.20250101.3.0",
        timestamp: "2025-01-01T00:00:00Z",
        epoch: 1_735_689_600,
    },
    ReleaseDef {
        version: "41.20250115.3.0",
        timestamp: "2025-01-15T00:00:00Z",
        epoch: 1_736_899_200,
    },
];

struct ReleaseDef {
    version: &'static str,
    timestamp: &'static str,
    epoch: i64,
}

/// Image configuration `architecture`; pinned so images built on any host
/// are identical (umoci defaults to the host's).
const IMAGE_ARCH: &str = "amd64";

// ---------------------------------------------------------------------------
// Public contract
// ---------------------------------------------------------------------------

/// Fixture scale.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
pub enum Scale {
    /// Tens of MiB: for tests.
    Small,
    /// About 1 GiB and 30,000 files: for benchmarks.
    Full,
}

impl Scale {
    pub fn as_str(self) -> &'static str {
        match self {
            Scale::Small => "small",
            Scale::Full => "full",
        }
    }
}

impl fmt::Display for Scale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scale {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "small" => Ok(Scale::Small),
            "full" => Ok(Scale::Full),
            other => bail!("unknown scale {other:?} (expected small or full)"),
        }
    }
}

/// What to build.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct FixtureSpec {
    pub scale: Scale,
    /// Share of v1's files that v2 rewrites (0.0..=1.0); default 0.05.
    pub update_share: f64,
    /// Ref bound into every commit (`ostree.ref-binding`).
    pub ref_name: String,
}

/// One release: an oscontainer root and its commit.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Release {
    /// `version` metadata, also the image label `version` and the OCI tag.
    pub version: String,
    /// The commit checksum (64 hex), also the label `com.coreos.ostree-commit`.
    pub commit: String,
    /// Root of the unpacked oscontainer (contains `srv/repo`).
    pub oscontainer: PathBuf,
    /// `oscontainer/srv/repo`: archive repo, no refs, no summary.
    pub repo: PathBuf,
    /// Apparent bytes of all files under `srv/repo`.
    pub repo_bytes: u64,
    /// Number of files in the committed tree (regular + symlinks).
    pub tree_files: u64,
    /// Sum of the compressed layer blob sizes of this release's OCI image:
    /// what a node downloads today to update.
    pub image_bytes: u64,
    /// Apparent bytes of regular-file content in the committed tree (before
    /// ostree's compression; `repo_bytes / tree_bytes` is roughly the
    /// compression ratio).
    pub tree_bytes: u64,
    /// The commit's parent, if any (v2's parent is v1's commit, which v2's
    /// repo does not contain, as in real CoreOS oscontainers).
    pub parent: Option<String>,
    /// `sha256:<hex>` of this release's image manifest in the OCI layout.
    pub image_manifest: String,
}

/// A built fixture set.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Fixtures {
    pub spec: FixtureSpec,
    /// Directory holding everything below.
    pub root: PathBuf,
    /// v1 then v2.
    pub releases: Vec<Release>,
    /// OCI image layout with tags named by each release's version.
    pub oci_layout: PathBuf,
}

impl FixtureSpec {
    pub fn new(scale: Scale) -> Self {
        FixtureSpec {
            scale,
            update_share: DEFAULT_UPDATE_SHARE,
            ref_name: DEFAULT_REF.to_owned(),
        }
    }

    fn validate(&self) -> anyhow::Result<()> {
        check!(
            self.update_share.is_finite() && (0.0..=1.0).contains(&self.update_share),
            "update_share must be within 0.0..=1.0, got {}",
            self.update_share
        );
        check!(!self.ref_name.is_empty(), "ref_name must not be empty");
        Ok(())
    }

    /// Same build output. The share is compared with a tolerance because
    /// serde_json's default float parser is not guaranteed to round-trip
    /// the last bit.
    fn same_as(&self, other: &FixtureSpec) -> bool {
        self.scale == other.scale
            && self.ref_name == other.ref_name
            && (self.update_share - other.update_share).abs() <= 1e-12
    }
}

/// Build (or reuse, if already built with the same spec and generator
/// version) the fixtures under `dir`. Safe to call concurrently from many
/// test processes: an exclusive lock serialises builders.
pub fn ensure(spec: &FixtureSpec, dir: &Path) -> anyhow::Result<Fixtures> {
    spec.validate()?;
    let dir =
        std::path::absolute(dir).with_context(|| format!("making {} absolute", dir.display()))?;
    let parent = dir
        .parent()
        .ok_or_else(|| anyhow!("fixture dir {} has no parent", dir.display()))?
        .to_path_buf();
    let name = dir
        .file_name()
        .ok_or_else(|| anyhow!("fixture dir {} has no file name", dir.display()))?
        .to_string_lossy()
        .into_owned();
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;

    // The lock file lives next to the dir, never inside it, so it survives
    // the dir being replaced; it is never deleted, because deleting a lock
    // file lets two processes lock two different inodes.
    let lock_path = parent.join(format!("{name}.lock"));
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening lock {}", lock_path.display()))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .with_context(|| format!("locking {}", lock_path.display()))?;

    if let Some(fixtures) = load_existing(spec, &dir)? {
        return Ok(fixtures);
    }

    refuse_foreign(&dir)?;

    // Only lock holders build, so whatever scratch a previous holder left
    // behind (it crashed) is garbage.
    remove_scratch(&parent, &name)?;

    let tmp = parent.join(format!(".{name}.tmp.{}", std::process::id()));
    let built = build(spec, &tmp, &dir);
    let fixtures = match built {
        Ok(f) => f,
        Err(e) => {
            // Best effort: the next lock holder removes it anyway.
            let _ = fs::remove_dir_all(&tmp);
            return Err(e.context(format!("building fixtures into {}", tmp.display())));
        }
    };

    publish(&tmp, &dir)?;
    Ok(fixtures)
}

/// Moves the finished build at `tmp` to `dir`. A stale build at `dir`
/// (other spec or generator version) is swapped out atomically, so `dir`
/// never goes missing or half-built, and then deleted.
fn publish(tmp: &Path, dir: &Path) -> anyhow::Result<()> {
    if fs::symlink_metadata(dir).is_err() {
        return fs::rename(tmp, dir)
            .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()));
    }
    let cwd = rustix::fs::CWD;
    match rustix::fs::renameat_with(cwd, tmp, cwd, dir, rustix::fs::RenameFlags::EXCHANGE) {
        Ok(()) => {
            // `tmp` now holds the stale build.
            fs::remove_dir_all(tmp).with_context(|| format!("removing stale {}", tmp.display()))
        }
        // Filesystems without RENAME_EXCHANGE: a short window without `dir`
        // beats failing.
        Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOSYS => {
            let old = tmp.with_extension("old");
            fs::rename(dir, &old)
                .with_context(|| format!("moving stale {} aside", dir.display()))?;
            fs::rename(tmp, dir)
                .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
            fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))
        }
        Err(e) => Err(e)
            .with_context(|| format!("exchanging {} with stale {}", tmp.display(), dir.display())),
    }
}

/// The default location: `<workspace>/target/fixtures/<scale>-<share>`.
pub fn default_dir(spec: &FixtureSpec) -> PathBuf {
    let base = match std::env::var_os(FIXTURES_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => workspace_root().join("target").join("fixtures"),
    };
    base.join(format!("{}-{}", spec.scale, spec.update_share))
}

/// `ensure(spec, default_dir(spec))` for the small scale: what tests use.
pub fn small() -> anyhow::Result<Fixtures> {
    let spec = FixtureSpec::new(Scale::Small);
    ensure(&spec, &default_dir(&spec))
}

/// Workspace root, from where xtask was compiled.
pub fn workspace_root() -> PathBuf {
    // This crate is tests/testkit: the workspace is two levels up.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .unwrap_or(manifest)
        .to_path_buf()
}

/// A human-readable summary, for `cargo xtask fixtures`.
pub fn summary(f: &Fixtures) -> String {
    let mut s = format!(
        "fixtures {} (scale {}, update share {}, ref {})\n",
        f.root.display(),
        f.spec.scale,
        f.spec.update_share,
        f.spec.ref_name
    );
    for r in &f.releases {
        s += &format!(
            "  {}  commit {}\n    parent {}\n    tree: {} files, {}  repo: {}  image layers: {}\n    repo {}\n",
            r.version,
            r.commit,
            r.parent.as_deref().unwrap_or("none"),
            r.tree_files,
            human_bytes(r.tree_bytes),
            human_bytes(r.repo_bytes),
            human_bytes(r.image_bytes),
            r.repo.display(),
        );
    }
    s += &format!("  oci layout {}\n", f.oci_layout.display());
    s
}

fn human_bytes(b: u64) -> String {
    format!("{:.1} MiB ({b} B)", b as f64 / MIB as f64)
}

// ---------------------------------------------------------------------------
// Reuse
// ---------------------------------------------------------------------------

#[derive(serde::Serialize, serde::Deserialize)]
struct Manifest {
    generator_version: u32,
    fixtures: Fixtures,
}

/// The built fixtures at `dir`, if they are complete and match `spec`.
fn load_existing(spec: &FixtureSpec, dir: &Path) -> anyhow::Result<Option<Fixtures>> {
    let path = dir.join(MANIFEST_NAME);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    // A manifest we cannot parse is from an older generator: rebuild.
    let Ok(manifest) = serde_json::from_slice::<Manifest>(&bytes) else {
        return Ok(None);
    };
    if manifest.generator_version != GENERATOR_VERSION || !manifest.fixtures.spec.same_as(spec) {
        return Ok(None);
    }
    // Paths are recomputed rather than trusted, so a moved target dir works.
    let mut f = manifest.fixtures;
    f.spec = spec.clone();
    rebase(&mut f, dir);
    let complete = f.releases.len() == RELEASES.len()
        && f.oci_layout.join("index.json").is_file()
        && f.releases.iter().all(|r| r.repo.join("config").is_file());
    Ok(complete.then_some(f))
}

/// Replacing `dir` is fine if it is a fixture build (has a manifest) or
/// empty; anything else is someone's data, e.g. a mistyped `--dir`.
fn refuse_foreign(dir: &Path) -> anyhow::Result<()> {
    if fs::symlink_metadata(dir).is_err() || dir.join(MANIFEST_NAME).is_file() {
        return Ok(());
    }
    let empty = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .next()
        .is_none();
    check!(
        empty,
        "{} exists but holds no {MANIFEST_NAME}: refusing to replace it with fixtures",
        dir.display()
    );
    Ok(())
}

fn rebase(f: &mut Fixtures, dir: &Path) {
    f.root = dir.to_path_buf();
    f.oci_layout = dir.join("oci");
    for r in &mut f.releases {
        r.oscontainer = dir.join(&r.version);
        r.repo = r.oscontainer.join("srv").join("repo");
    }
}

fn remove_scratch(parent: &Path, name: &str) -> anyhow::Result<()> {
    // Covers both scratch builds and stale builds moved aside by publish.
    let prefix = format!(".{name}.tmp.");
    for entry in fs::read_dir(parent).with_context(|| format!("listing {}", parent.display()))? {
        let entry = entry.with_context(|| format!("listing {}", parent.display()))?;
        let file_name = entry.file_name();
        let file_name = file_name.to_string_lossy();
        if file_name.starts_with(&prefix) {
            let p = entry.path();
            fs::remove_dir_all(&p).with_context(|| format!("removing stale {}", p.display()))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Build
// ---------------------------------------------------------------------------

/// Builds everything into `tmp`; the returned paths point at `final_dir`,
/// where the caller renames `tmp`.
fn build(spec: &FixtureSpec, tmp: &Path, final_dir: &Path) -> anyhow::Result<Fixtures> {
    let started = Instant::now();
    eprintln!(
        "xtask: building {} fixtures in {}",
        spec.scale,
        tmp.display()
    );
    create_dir_mode(tmp, 0o755)?;

    let v1 = plan_tree(spec.scale, SEED);
    let (v2, update) = plan_update(&v1, spec.update_share, SEED.wrapping_add(1));
    eprintln!(
        "xtask:   v2 rewrites {}, adds {} and removes {} of v1's {} regular files",
        update.rewritten.len(),
        update.added.len(),
        update.removed.len(),
        v1.stats().files
    );
    let plans = [v1, v2];

    let trees: Vec<PathBuf> = RELEASES
        .iter()
        .map(|def| tmp.join(format!("tree-{}", def.version)))
        .collect();
    let mut releases = std::thread::scope(|s| -> anyhow::Result<Vec<Release>> {
        // Commits are sequential (v2 names v1's commit as its parent) and
        // ostree commits on one core, so later trees are written meanwhile.
        let writers: Vec<_> = plans
            .iter()
            .zip(&trees)
            .map(|(plan, tree)| {
                s.spawn(move || {
                    let t = Instant::now();
                    write_tree(plan, tree)
                        .with_context(|| format!("writing tree {}", tree.display()))?;
                    anyhow::Ok(t.elapsed())
                })
            })
            .collect();
        let mut releases = Vec::with_capacity(RELEASES.len());
        let mut parent: Option<String> = None;
        for (((def, plan), tree), writer) in RELEASES.iter().zip(&plans).zip(&trees).zip(writers) {
            let wrote = writer
                .join()
                .map_err(|_| anyhow!("tree writer for {} panicked", def.version))??;
            let t = Instant::now();
            let oscontainer = tmp.join(def.version);
            create_dir_mode(&oscontainer, 0o755)?;
            create_dir_mode(&oscontainer.join("srv"), 0o755)?;
            let repo = oscontainer.join("srv").join("repo");
            let commit = commit_release(spec, def, tree, &repo, parent.as_deref())?;
            // The full tree is 1 GiB: only the repo is kept.
            fs::remove_dir_all(tree).with_context(|| format!("removing {}", tree.display()))?;
            let stats = plan.stats();
            eprintln!(
                "xtask:   {} committed {commit} ({} files): tree written in {:.1}s, committed in {:.1}s",
                def.version,
                stats.files + stats.symlinks,
                wrote.as_secs_f64(),
                t.elapsed().as_secs_f64()
            );
            releases.push(Release {
                version: def.version.to_owned(),
                commit: commit.clone(),
                oscontainer: oscontainer.clone(),
                repo,
                repo_bytes: 0,
                tree_files: stats.files + stats.symlinks,
                image_bytes: 0,
                tree_bytes: stats.bytes,
                parent: parent.clone(),
                image_manifest: String::new(),
            });
            parent = Some(commit);
        }
        Ok(releases)
    })?;

    let t = Instant::now();
    let oci = tmp.join("oci");
    build_oci(&oci, &mut releases)?;
    eprintln!(
        "xtask:   OCI layout built in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let mut fixtures = Fixtures {
        spec: spec.clone(),
        root: tmp.to_path_buf(),
        releases,
        oci_layout: oci,
    };
    rebase(&mut fixtures, final_dir);
    let manifest = Manifest {
        generator_version: GENERATOR_VERSION,
        fixtures: fixtures.clone(),
    };
    // Everything must be on disk before the manifest claims it is, and the
    // manifest before the rename publishes it; one syncfs is far cheaper
    // than ostree's per-object fsyncs, which are disabled.
    sync_fs(tmp)?;
    let json = serde_json::to_vec_pretty(&manifest).context("serialising fixtures manifest")?;
    write_file_synced(&tmp.join(MANIFEST_NAME), &json)?;
    eprintln!(
        "xtask: built {} fixtures in {:.1}s",
        spec.scale,
        started.elapsed().as_secs_f64()
    );
    Ok(fixtures)
}

fn commit_release(
    spec: &FixtureSpec,
    def: &ReleaseDef,
    tree: &Path,
    repo: &Path,
    parent: Option<&str>,
) -> anyhow::Result<String> {
    let repo_arg = os_concat("--repo=", repo);
    run_tool(
        "ostree",
        &[
            OsString::from("init"),
            OsString::from("--mode=archive"),
            repo_arg.clone(),
        ],
    )?;
    let mut args: Vec<OsString> = vec![
        "commit".into(),
        repo_arg,
        // Oscontainer repos carry no refs: the server derives them.
        "--orphan".into(),
        os_concat("--tree=dir=", tree),
        format!("--subject=Fedora CoreOS {}", def.version).into(),
        format!("--add-metadata-string=version={}", def.version).into(),
        format!("--bind-ref={}", spec.ref_name).into(),
        format!("--timestamp={}", def.timestamp).into(),
        // Who built the tree and what the build host's xattrs (SELinux
        // labels) are must not leak into the checksum.
        "--owner-uid=0".into(),
        "--owner-gid=0".into(),
        "--no-xattrs".into(),
        // Durability comes from one syncfs before the manifest is written.
        "--fsync=false".into(),
    ];
    if let Some(p) = parent {
        // ostree records the parent without needing it in the repo, which is
        // exactly the shape of real CoreOS oscontainers.
        args.push(format!("--parent={p}").into());
    }
    let out = run_tool("ostree", &args)?;
    let commit = out.trim().to_owned();
    check!(
        commit.len() == 64 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "ostree commit printed {out:?}, not a checksum"
    );
    Ok(commit)
}

/// One image per release in a single layout: `umoci new` + `insert` of
/// `srv` + `config` labels, then `gc` to drop the intermediate blobs umoci
/// leaves behind on every step.
fn build_oci(oci: &Path, releases: &mut [Release]) -> anyhow::Result<()> {
    let layout = os_concat("--layout=", oci);
    run_tool("umoci", &["init".into(), layout.clone()])?;
    for (r, def) in releases.iter_mut().zip(RELEASES.iter()) {
        let srv = r.oscontainer.join("srv");
        // Tar headers carry mtimes: pin them so layer digests do not depend
        // on when the fixtures were built.
        r.repo_bytes = pin_mtimes(&srv, def.epoch)?;
        let mut image = oci.as_os_str().to_owned();
        image.push(format!(":{}", r.version));
        let image_arg = os_concat("--image=", &image);
        run_tool("umoci", &["new".into(), image_arg.clone()])?;
        run_tool(
            "umoci",
            &[
                "insert".into(),
                image_arg.clone(),
                format!("--history.created={}", def.timestamp).into(),
                "--history.created_by=xtask fixtures".into(),
                srv.into_os_string(),
                "/srv".into(),
            ],
        )?;
        run_tool(
            "umoci",
            &[
                "config".into(),
                image_arg,
                format!("--created={}", def.timestamp).into(),
                format!("--architecture={IMAGE_ARCH}").into(),
                "--os=linux".into(),
                format!("--config.label=com.coreos.ostree-commit={}", r.commit).into(),
                format!("--config.label=version={}", r.version).into(),
                "--no-history".into(),
            ],
        )?;
    }
    run_tool("umoci", &["gc".into(), layout])?;
    for r in releases.iter_mut() {
        let (digest, bytes) = image_layer_bytes(oci, &r.version)?;
        r.image_manifest = digest;
        r.image_bytes = bytes;
    }
    // umoci writes blobs 0600; tests that do not run as root should still
    // be able to read them.
    let blobs = oci.join("blobs").join("sha256");
    for entry in fs::read_dir(&blobs).with_context(|| format!("listing {}", blobs.display()))? {
        let p = entry
            .with_context(|| format!("listing {}", blobs.display()))?
            .path();
        set_mode(&p, 0o644)?;
    }
    Ok(())
}

/// The manifest digest of `tag` and the sum of its layer sizes.
fn image_layer_bytes(oci: &Path, tag: &str) -> anyhow::Result<(String, u64)> {
    let index_path = oci.join("index.json");
    let index: serde_json::Value = serde_json::from_slice(
        &fs::read(&index_path).with_context(|| format!("reading {}", index_path.display()))?,
    )
    .with_context(|| format!("parsing {}", index_path.display()))?;
    let digest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .and_then(|m| m["digest"].as_str())
        .ok_or_else(|| anyhow!("tag {tag} not in {}", index_path.display()))?
        .to_owned();
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| anyhow!("unexpected digest {digest}"))?;
    let manifest_path = oci.join("blobs").join("sha256").join(hex);
    let manifest: serde_json::Value = serde_json::from_slice(
        &fs::read(&manifest_path)
            .with_context(|| format!("reading {}", manifest_path.display()))?,
    )
    .with_context(|| format!("parsing {}", manifest_path.display()))?;
    let layers = manifest["layers"]
        .as_array()
        .ok_or_else(|| anyhow!("manifest {digest} has no layers"))?;
    let mut total = 0;
    for l in layers {
        total += l["size"]
            .as_u64()
            .ok_or_else(|| anyhow!("layer without size in {digest}"))?;
    }
    Ok((digest, total))
}

/// Sets atime and mtime of everything under `root` (not following
/// symlinks) and returns the apparent size of its regular files.
fn pin_mtimes(root: &Path, epoch: i64) -> anyhow::Result<u64> {
    let ts = rustix::fs::Timespec {
        tv_sec: epoch,
        tv_nsec: 0,
    };
    let times = rustix::fs::Timestamps {
        last_access: ts,
        last_modification: ts,
    };
    let mut bytes = 0;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
            let p = entry.path();
            let ft = entry
                .file_type()
                .with_context(|| format!("stat {}", p.display()))?;
            if ft.is_dir() {
                stack.push(p.clone());
            } else if ft.is_file() {
                bytes += entry
                    .metadata()
                    .with_context(|| format!("stat {}", p.display()))?
                    .len();
            }
            rustix::fs::utimensat(
                rustix::fs::CWD,
                p.as_path(),
                &times,
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )
            .with_context(|| format!("setting times of {}", p.display()))?;
        }
        rustix::fs::utimensat(
            rustix::fs::CWD,
            dir.as_path(),
            &times,
            rustix::fs::AtFlags::empty(),
        )
        .with_context(|| format!("setting times of {}", dir.display()))?;
    }
    Ok(bytes)
}

/// Runs `program args` and returns its stdout. The tools run under umask
/// 022 so that the modes of the files they create (repo objects, blobs),
/// and with them the image layer digests, do not depend on the caller's
/// umask.
fn run_tool(program: &str, args: &[OsString]) -> anyhow::Result<String> {
    let desc = std::iter::once(program.to_owned())
        .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"umask 022 && exec "$0" "$@""#)
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running `{desc}`"))?;
    if !out.status.success() {
        bail!(
            "`{desc}` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{desc}` printed non-UTF-8"))
}

fn os_concat(prefix: &str, path: impl AsRef<OsStr>) -> OsString {
    let mut s = OsString::from(prefix);
    s.push(path.as_ref());
    s
}

pub(crate) fn create_dir_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    fs::create_dir(path).with_context(|| format!("creating {}", path.display()))?;
    set_mode(path, mode)
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

fn sync_fs(path: &Path) -> anyhow::Result<()> {
    let f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    rustix::fs::syncfs(&f).with_context(|| format!("syncfs {}", path.display()))
}

fn write_file_synced(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let mut f = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    set_mode(path, 0o644)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The small fixtures' commits. They pin the whole generator: if they
    /// change on purpose, bump GENERATOR_VERSION and update them.
    const SMALL_COMMITS: [&str; 2] = [
        "fa613f96c24369e60f972617269486f48dcc18d5a6fb0d5433576aaa67a92a01",
        "5c96137809dbcfcf395624fa23d60d9bea8bc6ca837f24e8eea664be46639c19",
    ];

    /// Builds real fixtures with ostree and umoci (about 10 s).
    #[test]
    fn ensure_builds_once_under_contention_and_reuses() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("small");
        let spec = FixtureSpec::new(Scale::Small);
        let built: Vec<Fixtures> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3).map(|_| s.spawn(|| ensure(&spec, &dir))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect()
        });
        for f in &built {
            let commits: Vec<&str> = f.releases.iter().map(|r| r.commit.as_str()).collect();
            assert_eq!(commits, SMALL_COMMITS);
        }
        let f = &built[0];
        assert_eq!(f.root, dir);
        assert_eq!(f.releases[1].parent.as_deref(), Some(SMALL_COMMITS[0]));
        for r in &f.releases {
            assert!(r.repo.starts_with(&dir) && r.repo.join("config").is_file());
            assert!(!r.repo.join("summary").exists(), "{}", r.version);
            for kind in ["heads", "remotes", "mirrors"] {
                let refs = r.repo.join("refs").join(kind);
                assert_eq!(
                    fs::read_dir(&refs).unwrap().count(),
                    0,
                    "{}",
                    refs.display()
                );
            }
            assert!(r.repo_bytes > 20 * MIB && r.image_bytes > r.repo_bytes / 2);
            assert!(r.image_manifest.starts_with("sha256:"));
        }
        let index = fs::read_to_string(f.oci_layout.join("index.json")).unwrap();
        for r in &f.releases {
            assert!(index.contains(&format!("\"{}\"", r.version)), "{index}");
        }
        // Nothing but the fixtures and the lock next to them.
        let mut siblings: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        siblings.sort();
        assert_eq!(siblings, ["small", "small.lock"]);

        let manifest = dir.join(MANIFEST_NAME);
        let before = fs::metadata(&manifest).unwrap().modified().unwrap();
        let again = ensure(&spec, &dir).unwrap();
        assert_eq!(fs::metadata(&manifest).unwrap().modified().unwrap(), before);
        assert_eq!(again.releases[1].commit, SMALL_COMMITS[1]);
    }

    #[test]
    fn scale_round_trips_and_default_dir_names() {
        for scale in [Scale::Small, Scale::Full] {
            assert_eq!(scale.as_str().parse::<Scale>().unwrap(), scale);
            let spec = FixtureSpec::new(scale);
            assert_eq!(spec.update_share, DEFAULT_UPDATE_SHARE);
            assert_eq!(spec.ref_name, DEFAULT_REF);
            if std::env::var_os(FIXTURES_DIR_ENV).is_none() {
                assert_eq!(
                    default_dir(&spec),
                    workspace_root().join(format!("target/fixtures/{scale}-0.05"))
                );
            }
        }
    }
}
