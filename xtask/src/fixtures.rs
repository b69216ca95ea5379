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
//! Generation is split in two: [`plan_tree`] / [`plan_update`] are pure
//! functions of a seed that describe every entry (content is a seed + size,
//! not bytes, so a 1 GiB plan costs a few MiB), and [`write_tree`] turns a
//! plan into files. Everything downstream (ostree, umoci) only sees the
//! written tree.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs;
use std::io::{BufWriter, Write};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::Instant;

use anyhow::{anyhow, bail, ensure as check, Context};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Bump whenever anything that changes the built bytes changes (planner,
/// content generator, commit arguments, image recipe): built fixtures with a
/// different version are rebuilt instead of reused.
pub const GENERATOR_VERSION: u32 = 1;

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

const MIB: u64 = 1024 * 1024;
/// Apparent bytes of regular-file content in the small tree.
const SMALL_TARGET_BYTES: u64 = 36 * MIB;
/// Apparent bytes of regular-file content in the full tree.
const FULL_TARGET_BYTES: u64 = 1024 * MIB;

/// The kernel version used for `usr/lib/modules/<kver>`; a macro so it can
/// be `concat!`ed into the const tables.
macro_rules! kver {
    () => {
        "6.11.5-300.fc41.x86_64"
    };
}

/// v2 adds this many new files per 1000 rewritten ones...
const ADDED_PER_MILLE_OF_REWRITTEN: u64 = 200;
/// ...and removes this many per 1000 rewritten ones. Both scale with the
/// share, so a share of 0 gives v2 a tree identical to v1's.
const REMOVED_PER_MILLE_OF_REWRITTEN: u64 = 100;
/// A rewritten file keeps its size within +-this per mille (package updates
/// rarely change sizes much).
const REWRITE_SIZE_JITTER_PER_MILLE: u64 = 100;

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

    if fs::symlink_metadata(&dir).is_ok() {
        // A stale build (other spec or generator version): move it aside
        // first so the final path goes straight from old to new.
        let old = parent.join(format!(".{name}.old.{}", std::process::id()));
        fs::rename(&dir, &old).with_context(|| format!("moving stale {} aside", dir.display()))?;
        fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    fs::rename(&tmp, &dir)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dir.display()))?;
    Ok(fixtures)
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
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
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
    let prefixes = [format!(".{name}.tmp."), format!(".{name}.old.")];
    for entry in fs::read_dir(parent).with_context(|| format!("listing {}", parent.display()))? {
        let entry = entry.with_context(|| format!("listing {}", parent.display()))?;
        let file_name = entry.file_name();
        let file_name = file_name.to_string_lossy();
        if prefixes.iter().any(|p| file_name.starts_with(p.as_str())) {
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
    let (v2, _update) = plan_update(&v1, spec.update_share, SEED.wrapping_add(1));
    let plans = [v1, v2];

    let mut releases = Vec::with_capacity(RELEASES.len());
    let mut parent: Option<String> = None;
    for (def, plan) in RELEASES.iter().zip(&plans) {
        let t = Instant::now();
        let tree = tmp.join(format!("tree-{}", def.version));
        write_tree(plan, &tree).with_context(|| format!("writing tree {}", tree.display()))?;
        let oscontainer = tmp.join(def.version);
        create_dir_mode(&oscontainer, 0o755)?;
        create_dir_mode(&oscontainer.join("srv"), 0o755)?;
        let repo = oscontainer.join("srv").join("repo");
        let commit = commit_release(spec, def, &tree, &repo, parent.as_deref())?;
        // The full tree is 1 GiB: only the repo is kept.
        fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
        let stats = plan.stats();
        eprintln!(
            "xtask:   {} committed {commit} ({} files) in {:.1}s",
            def.version,
            stats.files + stats.symlinks,
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

fn create_dir_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
    fs::create_dir(path).with_context(|| format!("creating {}", path.display()))?;
    set_mode(path, mode)
}

fn set_mode(path: &Path, mode: u32) -> anyhow::Result<()> {
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

// ---------------------------------------------------------------------------
// Planner: pure functions of a seed
// ---------------------------------------------------------------------------

/// How a file's bytes look, which decides how well they compress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// ELF-like: mostly random with string tables and zero padding
    /// (gzip ~1.5x).
    Binary,
    /// Already compressed (`.ko.xz`, `.gz`, firmware): random, ~1.0x.
    Compressed,
    /// Config files, scripts, docs: words and punctuation, ~3-4x.
    Text,
}

/// A planned file's bytes: generated from `seed`, `size` long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Content {
    pub seed: u64,
    pub size: u64,
    pub style: Style,
}

/// One entry of a planned tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir { mode: u32 },
    File { mode: u32, content: Content },
    Symlink { target: String },
}

/// A planned tree: relative paths (no leading `/`) to entries. Sorted, so
/// every directory comes before its contents.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreePlan {
    pub entries: BTreeMap<String, Node>,
}

/// Counts over a [`TreePlan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeStats {
    pub dirs: u64,
    /// Regular files.
    pub files: u64,
    pub symlinks: u64,
    pub absolute_symlinks: u64,
    pub empty_files: u64,
    pub executables: u64,
    pub setuid: u64,
    /// Apparent bytes of regular files.
    pub bytes: u64,
    pub largest_file: u64,
    /// Path components of the deepest entry.
    pub max_depth: u64,
}

impl TreePlan {
    pub fn stats(&self) -> TreeStats {
        let mut s = TreeStats::default();
        for (path, node) in &self.entries {
            s.max_depth = s.max_depth.max(path.split('/').count() as u64);
            match node {
                Node::Dir { .. } => s.dirs += 1,
                Node::File { mode, content } => {
                    s.files += 1;
                    s.bytes += content.size;
                    s.largest_file = s.largest_file.max(content.size);
                    s.empty_files += u64::from(content.size == 0);
                    s.executables += u64::from(mode & 0o111 != 0);
                    s.setuid += u64::from(mode & 0o4000 != 0);
                }
                Node::Symlink { target } => {
                    s.symlinks += 1;
                    s.absolute_symlinks += u64::from(target.starts_with('/'));
                }
            }
        }
        s
    }

    /// Paths of regular files, sorted.
    pub fn regular_files(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|(_, n)| matches!(n, Node::File { .. }))
            .map(|(p, _)| p.as_str())
            .collect()
    }

    /// Inserts `node` at `path`, creating missing parents as 0755 dirs.
    /// Returns false (and changes nothing) if `path` exists.
    fn insert(&mut self, path: &str, node: Node) -> bool {
        if self.entries.contains_key(path) {
            return false;
        }
        let mut end = 0;
        while let Some(i) = path[end..].find('/') {
            end += i;
            self.entries
                .entry(path[..end].to_owned())
                .or_insert(Node::Dir { mode: 0o755 });
            end += 1;
        }
        self.entries.insert(path.to_owned(), node);
        true
    }

    /// Inserts a file under `dir` named `stem` + `ext`, adding a numeric
    /// suffix to the stem on collision. Returns the path used.
    fn insert_unique(&mut self, dir: &str, stem: &str, ext: &str, node: Node) -> String {
        let mut path = format!("{dir}/{stem}{ext}");
        let mut n = 1u32;
        while !self.insert(&path, node.clone()) {
            n += 1;
            path = format!("{dir}/{stem}{n}{ext}");
        }
        path
    }
}

/// Where a category's files go below its base directory.
enum Subdirs {
    /// Directly in the base.
    Flat,
    /// Spread over these fixed subdirectories.
    Fixed(&'static [&'static str]),
    /// Spread over generated package directories (small count, full count),
    /// each with up to `depth` further generated levels.
    Packages { small: u64, full: u64, depth: u32 },
}

/// How a category names its files.
enum Names {
    /// Generated word, then the extension.
    Generated {
        prefix: &'static str,
        ext: &'static str,
    },
    /// Picked from a fixed list (documentation files and the like).
    Fixed(&'static [&'static str]),
}

/// One family of files in the tree: e.g. "executables in usr/bin".
struct Category {
    base: &'static str,
    subdirs: Subdirs,
    names: Names,
    small: u64,
    full: u64,
    /// File sizes are log-uniform in [2^lo, 2^hi) before scaling to the
    /// target total.
    size_log2: (u32, u32),
    style: Style,
    mode: u32,
    /// Chance, per mille, that a file is empty.
    empty_per_mille: u32,
    links: Links,
}

/// Symlinks a category adds next to its files.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Links {
    None,
    /// `libfoo.so.1 -> libfoo.so.1.2.3` for every library.
    Soname,
    /// A relative link to a sibling, for this many per mille of files.
    Sibling(u32),
    /// `<dir>/<name> -> /<file>`, for this many per mille of files.
    Absolute(&'static str, u32),
}

const KERNEL_SUBSYSTEMS: &[&str] = &[
    "drivers/net/ethernet/intel/ice",
    "drivers/net/ethernet/mellanox/mlx5/core",
    "drivers/net/wireless/intel/iwlwifi",
    "drivers/gpu/drm/amd/amdgpu",
    "drivers/gpu/drm/i915",
    "drivers/scsi/megaraid",
    "drivers/nvme/host",
    "drivers/usb/host",
    "drivers/infiniband/hw/mlx5",
    "drivers/md",
    "drivers/hid",
    "drivers/block",
    "fs/xfs",
    "fs/btrfs",
    "fs/nfs",
    "fs/ceph",
    "net/ipv6/netfilter",
    "net/netfilter",
    "net/sched",
    "crypto",
    "lib",
    "sound/pci/hda",
];

const MAN_SECTIONS: &[&str] = &["man1", "man3", "man5", "man7", "man8"];

const LOCALES: &[&str] = &[
    "de/LC_MESSAGES",
    "fr/LC_MESSAGES",
    "es/LC_MESSAGES",
    "it/LC_MESSAGES",
    "ja/LC_MESSAGES",
    "ko/LC_MESSAGES",
    "pt_BR/LC_MESSAGES",
    "ru/LC_MESSAGES",
    "zh_CN/LC_MESSAGES",
    "zh_TW/LC_MESSAGES",
    "pl/LC_MESSAGES",
    "cs/LC_MESSAGES",
    "nl/LC_MESSAGES",
    "sv/LC_MESSAGES",
    "uk/LC_MESSAGES",
    "tr/LC_MESSAGES",
];

const ZONE_REGIONS: &[&str] = &[
    "Africa",
    "America",
    "America/Argentina",
    "Antarctica",
    "Asia",
    "Atlantic",
    "Australia",
    "Europe",
    "Indian",
    "Pacific",
    "Etc",
];

const DOC_NAMES: &[&str] = &[
    "README",
    "README.md",
    "NEWS",
    "AUTHORS",
    "ChangeLog",
    "CHANGES.md",
    "THANKS",
    "TODO",
    "CONTRIBUTING.md",
    "example.conf",
];

const LICENSE_NAMES: &[&str] = &["LICENSE", "COPYING", "COPYING.LIB", "NOTICE", "LICENSE.MIT"];

/// The tree's make-up. Counts are (small, full); sizes are scaled
/// afterwards so the total hits the scale's target.
const CATEGORIES: &[Category] = &[
    Category {
        base: "usr/bin",
        subdirs: Subdirs::Flat,
        names: Names::Generated {
            prefix: "",
            ext: "",
        },
        small: 120,
        full: 1400,
        size_log2: (11, 19),
        style: Style::Binary,
        mode: 0o755,
        empty_per_mille: 2,
        links: Links::Sibling(60),
    },
    Category {
        base: "usr/sbin",
        subdirs: Subdirs::Flat,
        names: Names::Generated {
            prefix: "",
            ext: "",
        },
        small: 30,
        full: 300,
        size_log2: (11, 19),
        style: Style::Binary,
        mode: 0o755,
        empty_per_mille: 0,
        links: Links::Absolute("usr/etc/alternatives", 50),
    },
    Category {
        base: "usr/libexec",
        subdirs: Subdirs::Packages {
            small: 8,
            full: 60,
            depth: 1,
        },
        names: Names::Generated {
            prefix: "",
            ext: "",
        },
        small: 50,
        full: 600,
        size_log2: (11, 19),
        style: Style::Binary,
        mode: 0o755,
        empty_per_mille: 0,
        links: Links::None,
    },
    Category {
        base: "usr/lib64",
        subdirs: Subdirs::Flat,
        names: Names::Generated {
            prefix: "lib",
            ext: ".so",
        },
        small: 140,
        full: 1600,
        size_log2: (12, 19),
        style: Style::Binary,
        mode: 0o755,
        empty_per_mille: 0,
        links: Links::Soname,
    },
    Category {
        base: "usr/lib64",
        subdirs: Subdirs::Packages {
            small: 12,
            full: 120,
            depth: 1,
        },
        names: Names::Generated {
            prefix: "",
            ext: ".so",
        },
        small: 200,
        full: 2200,
        size_log2: (11, 18),
        style: Style::Binary,
        mode: 0o755,
        empty_per_mille: 0,
        links: Links::None,
    },
    Category {
        base: "usr/lib/python3.13/site-packages",
        subdirs: Subdirs::Packages {
            small: 15,
            full: 150,
            depth: 2,
        },
        names: Names::Generated {
            prefix: "",
            ext: ".py",
        },
        small: 380,
        full: 4500,
        size_log2: (9, 15),
        style: Style::Text,
        mode: 0o644,
        empty_per_mille: 40,
        links: Links::None,
    },
    Category {
        base: concat!("usr/lib/modules/", kver!(), "/kernel"),
        subdirs: Subdirs::Fixed(KERNEL_SUBSYSTEMS),
        names: Names::Generated {
            prefix: "",
            ext: ".ko.xz",
        },
        small: 300,
        full: 4600,
        size_log2: (10, 16),
        style: Style::Compressed,
        mode: 0o644,
        empty_per_mille: 0,
        links: Links::None,
    },
    Category {
        base: "usr/lib/firmware",
        subdirs: Subdirs::Packages {
            small: 8,
            full: 80,
            depth: 1,
        },
        names: Names::Generated {
            prefix: "",
            ext: ".bin.xz",
        },
        small: 90,
        full: 1400,
        size_log2: (11, 19),
        style: Style::Compressed,
        mode: 0o644,
        empty_per_mille: 0,
        links: Links::Sibling(30),
    },
    Category {
        base: "usr/lib/systemd/system",
        subdirs: Subdirs::Flat,
        names: Names::Generated {
            prefix: "",
            ext: ".service",
        },
        small: 70,
        full: 800,
        size_log2: (8, 12),
        style: Style::Text,
        mode: 0o644,
        empty_per_mille: 0,
        links: Links::Absolute("usr/lib/systemd/system/multi-user.target.wants", 150),
    },
    Category {
        base: "usr/share/doc",
        subdirs: Subdirs::Packages {
            small: 40,
            full: 400,
            depth: 0,
        },
        names: Names::Fixed(DOC_NAMES),
        small: 120,
        full: 1500,
        size_log2: (9, 16),
        style: Style::Text,
        mode: 0o644,
        empty_per_mille: 10,
        links: Links::None,
    },
    Category {
        base: "usr/share/licenses",
        subdirs: Subdirs::Packages {
            small: 40,
            full: 400,
            depth: 0,
        },
        names: Names::Fixed(LICENSE_NAMES),
        small: 50,
        full: 600,
        size_log2: (10, 15),
        style: Style::Text,
        mode: 0o644,
        empty_per_mille: 0,
        links: Links::None,
    },
    Category {
        base: "usr/share/man",
        subdirs: Subdirs::Fixed(MAN_SECTIONS),
        names: Names::Generated {
            prefix: "",
            ext: ".gz",
        },
        small: 200,
        full: 2400,
        size_log2: (10, 15),
        style: Style::Compressed,
        mode: 0o644,
        empty_per_mille: 0,
        links: Links::Sibling(40),
    },
    Category {
        base: "usr/share/locale",
        subdirs: Subdirs::Fixed(LOCALES),
        names: Names::Generated {
            prefix: "",
            ext: ".mo",
        },
        small: 250,
        full: 3200,
        size_log2: (10, 16),
        style: Style::Binary,
        mode: 0o644,
        empty_per_mille: 0,
        links: Links::None,
    },
    Category {
        base: "usr/share/zoneinfo",
        subdirs: Subdirs::Fixed(ZONE_REGIONS),
        names: Names::Generated {
            prefix: "",
            ext: "",
        },
        small: 60,
        full: 600,
        size_log2: (7, 12),
        style: Style::Binary,
        mode: 0o644,
        empty_per_mille: 0,
        links: Links::Sibling(100),
    },
    Category {
        base: "usr/etc",
        subdirs: Subdirs::Packages {
            small: 15,
            full: 120,
            depth: 1,
        },
        names: Names::Generated {
            prefix: "",
            ext: ".conf",
        },
        small: 80,
        full: 900,
        size_log2: (6, 13),
        style: Style::Text,
        mode: 0o644,
        empty_per_mille: 80,
        links: Links::None,
    },
    Category {
        base: "usr/share",
        subdirs: Subdirs::Packages {
            small: 20,
            full: 200,
            depth: 2,
        },
        names: Names::Generated {
            prefix: "",
            ext: ".dat",
        },
        small: 250,
        full: 3000,
        size_log2: (10, 17),
        style: Style::Binary,
        mode: 0o644,
        empty_per_mille: 5,
        links: Links::None,
    },
    Category {
        base: "usr/share/fonts",
        subdirs: Subdirs::Packages {
            small: 4,
            full: 30,
            depth: 1,
        },
        names: Names::Generated {
            prefix: "",
            ext: ".otf",
        },
        small: 20,
        full: 300,
        size_log2: (14, 20),
        style: Style::Compressed,
        mode: 0o644,
        empty_per_mille: 0,
        links: Links::None,
    },
];

/// A few big files, as in a real OS: (path, MiB at small scale, MiB at full
/// scale, style, mode). Not scaled.
const LARGE_FILES: &[(&str, u64, u64, Style, u32)] = &[
    (
        concat!("usr/lib/modules/", kver!(), "/vmlinuz"),
        2,
        15,
        Style::Compressed,
        0o755,
    ),
    (
        concat!("usr/lib/modules/", kver!(), "/initramfs.img"),
        3,
        70,
        Style::Compressed,
        0o644,
    ),
    ("usr/lib64/libLLVM.so.19.1", 3, 100, Style::Binary, 0o755),
    ("usr/bin/podman", 2, 40, Style::Binary, 0o755),
    ("usr/bin/kubelet", 2, 80, Style::Binary, 0o755),
];

/// Files with specific modes: setuid binaries and private config. Sizes in
/// bytes, not scaled.
const SPECIAL_FILES: &[(&str, u64, Style, u32)] = &[
    ("usr/bin/passwd", 32 * 1024, Style::Binary, 0o4755),
    ("usr/bin/su", 56 * 1024, Style::Binary, 0o4755),
    ("usr/bin/sudo", 260 * 1024, Style::Binary, 0o4111),
    ("usr/bin/newgrp", 40 * 1024, Style::Binary, 0o4755),
    ("usr/lib/os-release", 600, Style::Text, 0o644),
    ("usr/etc/shadow", 900, Style::Text, 0o400),
    ("usr/etc/gshadow", 700, Style::Text, 0o400),
    ("usr/etc/sudoers", 4300, Style::Text, 0o440),
    ("usr/etc/.pwd.lock", 0, Style::Text, 0o600),
    ("usr/etc/subuid", 0, Style::Text, 0o644),
    ("usr/etc/subgid", 0, Style::Text, 0o644),
    ("usr/share/zoneinfo/Etc/UTC", 114, Style::Binary, 0o644),
];

/// Top-level layout of an ostree-based OS: the real directories live in
/// usr/ and var/, the rest are links or mount points.
const ROOT_SYMLINKS: &[(&str, &str)] = &[
    ("bin", "usr/bin"),
    ("sbin", "usr/sbin"),
    ("lib", "usr/lib"),
    ("lib64", "usr/lib64"),
    ("home", "var/home"),
    ("root", "var/roothome"),
    ("opt", "var/opt"),
    ("srv", "var/srv"),
    ("mnt", "var/mnt"),
    ("media", "run/media"),
    ("ostree", "sysroot/ostree"),
    ("usr/etc/localtime", "../usr/share/zoneinfo/Etc/UTC"),
    ("usr/etc/os-release", "../usr/lib/os-release"),
    ("usr/share/zoneinfo/UTC", "Etc/UTC"),
    ("usr/etc/mtab", "/proc/self/mounts"),
    (
        "usr/etc/resolv.conf",
        "/run/systemd/resolve/stub-resolv.conf",
    ),
];

/// Empty directories (mount points and the like), with their real modes.
const EMPTY_DIRS: &[(&str, u32)] = &[
    ("boot", 0o755),
    ("dev", 0o755),
    ("proc", 0o555),
    ("run", 0o755),
    ("sys", 0o555),
    ("sysroot", 0o755),
    ("tmp", 0o1777),
    ("var", 0o755),
    ("usr/local", 0o755),
    ("usr/etc/sudoers.d", 0o750),
    ("usr/etc/polkit-1/rules.d", 0o700),
];

const SYLLABLES: &[&str] = &[
    "ab", "ar", "bel", "cor", "dex", "fin", "gal", "hut", "ix", "jor", "kel", "lum", "mor", "nex",
    "ol", "pra", "qu", "ris", "sol", "tor", "ur", "vex", "wen", "xy", "yo", "zan", "ct", "fs",
    "net", "d", "ctl", "io",
];

fn word(rng: &mut ChaCha8Rng) -> String {
    let n = rng.gen_range(1..=3u32);
    let mut s = String::new();
    for i in 0..n {
        if i > 0 && rng.gen_range(0..4u32) == 0 {
            s.push('-');
        }
        let syllable: &str = pick::<&str>(rng, SYLLABLES);
        s.push_str(syllable);
    }
    s
}

/// Uniform pick. Indices go through u64 so the stream does not depend on
/// the platform's usize.
fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[rng.gen_range(0..items.len() as u64) as usize]
}

/// Log-uniform size in [2^lo, 2^hi), in integers only, so plans do not
/// depend on a platform's libm.
fn log_uniform(rng: &mut ChaCha8Rng, (lo, hi): (u32, u32)) -> u64 {
    let k = rng.gen_range(lo..hi);
    (1u64 << k) + rng.gen_range(0..(1u64 << k))
}

fn leaf_dirs(rng: &mut ChaCha8Rng, cat: &Category, scale: Scale) -> Vec<String> {
    match &cat.subdirs {
        Subdirs::Flat => vec![cat.base.to_owned()],
        Subdirs::Fixed(list) => list.iter().map(|d| format!("{}/{d}", cat.base)).collect(),
        Subdirs::Packages { small, full, depth } => {
            let count = match scale {
                Scale::Small => *small,
                Scale::Full => *full,
            };
            let mut dirs = BTreeSet::new();
            while (dirs.len() as u64) < count {
                let pkg = format!("{}/{}", cat.base, word(rng));
                let mut d = pkg.clone();
                dirs.insert(pkg);
                for _ in 0..rng.gen_range(0..=*depth) {
                    d = format!("{d}/{}", word(rng));
                    dirs.insert(d.clone());
                }
            }
            dirs.into_iter().collect()
        }
    }
}

/// Plans an OS-shaped tree for `scale`: the same (scale, seed) always gives
/// the same plan.
pub fn plan_tree(scale: Scale, seed: u64) -> TreePlan {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut plan = TreePlan::default();
    let target = match scale {
        Scale::Small => SMALL_TARGET_BYTES,
        Scale::Full => FULL_TARGET_BYTES,
    };

    for &(path, mode) in EMPTY_DIRS {
        plan.insert(path, Node::Dir { mode });
    }
    let mut fixed_bytes = 0;
    for &(path, small, full, style, mode) in LARGE_FILES {
        let mib = match scale {
            Scale::Small => small,
            Scale::Full => full,
        };
        let content = Content {
            seed: rng.gen(),
            size: mib * MIB,
            style,
        };
        fixed_bytes += mib * MIB;
        plan.insert(path, Node::File { mode, content });
    }
    for &(path, size, style, mode) in SPECIAL_FILES {
        let content = Content {
            seed: rng.gen(),
            size,
            style,
        };
        fixed_bytes += size;
        plan.insert(path, Node::File { mode, content });
    }
    for &(path, target) in ROOT_SYMLINKS {
        plan.insert(
            path,
            Node::Symlink {
                target: target.to_owned(),
            },
        );
    }

    // Category sizes are drawn from each category's distribution, then
    // scaled together so the whole tree hits the target.
    let mut scalable = Vec::new();
    for cat in CATEGORIES {
        let dirs = leaf_dirs(&mut rng, cat, scale);
        let count = match scale {
            Scale::Small => cat.small,
            Scale::Full => cat.full,
        };
        for _ in 0..count {
            let dir = pick(&mut rng, &dirs).clone();
            let (stem, ext) = match &cat.names {
                Names::Generated { prefix, ext } => (format!("{prefix}{}", word(&mut rng)), *ext),
                Names::Fixed(list) => ((*pick(&mut rng, list)).to_owned(), ""),
            };
            let size = if rng.gen_range(0..1000u32) < cat.empty_per_mille {
                0
            } else {
                log_uniform(&mut rng, cat.size_log2)
            };
            let content = Content {
                seed: rng.gen(),
                size,
                style: cat.style,
            };
            let node = Node::File {
                mode: cat.mode,
                content,
            };
            let ext = if cat.links == Links::Soname {
                // Real libraries are versioned files behind soname links.
                format!(
                    "{ext}.{}.{}.{}",
                    rng.gen_range(0..4u32),
                    rng.gen_range(0..30u32),
                    rng.gen_range(0..10u32)
                )
            } else {
                ext.to_owned()
            };
            let path = plan.insert_unique(&dir, &stem, &ext, node);
            add_links(&mut rng, &mut plan, cat.links, &path);
            scalable.push(path);
        }
    }

    scale_sizes(&mut plan, &scalable, target.saturating_sub(fixed_bytes));
    plan
}

fn add_links(rng: &mut ChaCha8Rng, plan: &mut TreePlan, links: Links, path: &str) {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    match links {
        Links::None => {}
        Links::Soname => {
            // libfoo.so.1.2.3 -> libfoo.so.1
            let mut parts = name.rsplitn(3, '.');
            let _patch = parts.next();
            let _minor = parts.next();
            if let Some(soname) = parts.next() {
                plan.insert(
                    &format!("{dir}/{soname}"),
                    Node::Symlink {
                        target: name.to_owned(),
                    },
                );
            }
        }
        Links::Sibling(per_mille) => {
            if rng.gen_range(0..1000u32) < per_mille {
                let alias = word(rng);
                plan.insert(
                    &format!("{dir}/{alias}"),
                    Node::Symlink {
                        target: name.to_owned(),
                    },
                );
            }
        }
        Links::Absolute(link_dir, per_mille) => {
            if rng.gen_range(0..1000u32) < per_mille {
                plan.insert(
                    &format!("{link_dir}/{name}"),
                    Node::Symlink {
                        target: format!("/{path}"),
                    },
                );
            }
        }
    }
}

/// Scales the non-empty files at `paths` so they total about `target`,
/// keeping the shape of the size distribution.
fn scale_sizes(plan: &mut TreePlan, paths: &[String], target: u64) {
    let size_of = |plan: &TreePlan, p: &String| match plan.entries.get(p) {
        Some(Node::File { content, .. }) => content.size,
        _ => 0,
    };
    let raw: u64 = paths.iter().map(|p| size_of(plan, p)).sum();
    if raw == 0 {
        return;
    }
    for p in paths {
        if let Some(Node::File { content, .. }) = plan.entries.get_mut(p) {
            if content.size > 0 {
                let scaled = u128::from(content.size) * u128::from(target) / u128::from(raw);
                content.size = u64::try_from(scaled).unwrap_or(u64::MAX).max(1);
            }
        }
    }
}

/// What [`plan_update`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpdateSummary {
    /// Regular files of v1 whose content v2 replaces.
    pub rewritten: Vec<String>,
    /// Regular files new in v2.
    pub added: Vec<String>,
    /// Regular files of v1 absent from v2.
    pub removed: Vec<String>,
}

/// Plans v2 from v1: rewrites `round(share * regular files)` of v1's regular
/// files, adds and removes a number proportional to that.
pub fn plan_update(v1: &TreePlan, share: f64, seed: u64) -> (TreePlan, UpdateSummary) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut v2 = v1.clone();
    let mut files: Vec<String> = v1.regular_files().into_iter().map(str::to_owned).collect();
    let n = files.len() as u64;
    let n_rewrite = ((share.clamp(0.0, 1.0) * n as f64).round() as u64).min(n);
    // Partial Fisher-Yates: the first n_rewrite are rewritten, the next
    // ones are removal candidates.
    shuffle_prefix(&mut rng, &mut files, n);

    let mut summary = UpdateSummary::default();
    for path in &files[..n_rewrite as usize] {
        if let Some(Node::File { content, .. }) = v2.entries.get_mut(path) {
            content.seed = rng.gen();
            content.size = if content.size == 0 {
                log_uniform(&mut rng, (6, 12))
            } else {
                jitter(&mut rng, content.size)
            };
            summary.rewritten.push(path.clone());
        }
    }

    // Files that a relative symlink points at stay, so v2 has no dangling
    // links that v1 did not have.
    let linked: BTreeSet<String> = v1
        .entries
        .iter()
        .filter_map(|(p, n)| match n {
            Node::Symlink { target } if !target.starts_with('/') && !target.contains('/') => {
                let dir = p.rsplit_once('/').map_or("", |(d, _)| d);
                Some(format!("{dir}/{target}"))
            }
            _ => None,
        })
        .collect();
    let n_remove = n_rewrite * REMOVED_PER_MILLE_OF_REWRITTEN / 1000;
    for path in files[n_rewrite as usize..]
        .iter()
        .filter(|p| !linked.contains(*p))
    {
        if summary.removed.len() as u64 >= n_remove {
            break;
        }
        v2.entries.remove(path);
        summary.removed.push(path.clone());
    }

    let n_add = n_rewrite * ADDED_PER_MILLE_OF_REWRITTEN / 1000;
    for i in 0..n_add {
        // New files land next to existing ones and look like them.
        let sibling = &files[rng.gen_range(0..n) as usize];
        let Some(Node::File { mode, content }) = v1.entries.get(sibling) else {
            continue;
        };
        let (dir, name) = sibling.rsplit_once('/').unwrap_or(("", sibling));
        let ext = name.find('.').map_or("", |i| &name[i..]);
        let content = Content {
            seed: rng.gen(),
            size: if content.size == 0 {
                0
            } else {
                jitter(&mut rng, content.size)
            },
            style: content.style,
        };
        let stem = format!("{}-{i}", word(&mut rng));
        let path = v2.insert_unique(
            dir,
            &stem,
            ext,
            Node::File {
                mode: *mode,
                content,
            },
        );
        summary.added.push(path);
    }
    summary.rewritten.sort();
    summary.removed.sort();
    summary.added.sort();
    (v2, summary)
}

fn shuffle_prefix(rng: &mut ChaCha8Rng, items: &mut [String], n: u64) {
    for i in 0..n.min(items.len() as u64) {
        let j = rng.gen_range(i..items.len() as u64);
        items.swap(i as usize, j as usize);
    }
}

fn jitter(rng: &mut ChaCha8Rng, size: u64) -> u64 {
    let delta = size * REWRITE_SIZE_JITTER_PER_MILLE / 1000;
    (size - delta + rng.gen_range(0..=2 * delta)).max(1)
}

// ---------------------------------------------------------------------------
// Content and writer
// ---------------------------------------------------------------------------

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "with",
    "by",
    "this",
    "that",
    "if",
    "return",
    "value",
    "error",
    "config",
    "system",
    "service",
    "kernel",
    "device",
    "network",
    "file",
    "path",
    "user",
    "group",
    "default",
    "enable",
    "disable",
    "option",
    "true",
    "false",
    "None",
    "self",
    "def",
    "import",
    "from",
    "class",
    "static",
    "const",
    "struct",
    "int",
    "char",
    "void",
    "license",
    "copyright",
    "version",
    "update",
    "install",
    "target",
    "After=",
    "Wants=",
    "ExecStart=",
    "Type=",
    "[Unit]",
    "[Service]",
    "[Install]",
    "#",
    "=",
    "{",
    "}",
    "(",
    ")",
    "0",
    "1",
    "64",
    "/usr/lib",
    "/etc",
    "/var/lib",
];

/// Bytes per write chunk when generating content.
const CHUNK: usize = 64 * 1024;

/// Writes `content`'s bytes to `out`.
pub fn write_content(content: &Content, out: &mut impl Write) -> std::io::Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(content.seed);
    let mut remaining = content.size;
    let mut buf = Vec::with_capacity(CHUNK);
    if content.style == Style::Binary {
        // Binaries start with an ELF identification, like the real thing.
        let header = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0";
        let n = header.len().min(remaining as usize);
        out.write_all(&header[..n])?;
        remaining -= n as u64;
    }
    while remaining > 0 {
        buf.clear();
        let want = (remaining as usize).min(CHUNK);
        match content.style {
            Style::Compressed => random_bytes(&mut rng, &mut buf, want),
            Style::Text => text_bytes(&mut rng, &mut buf, want),
            Style::Binary => {
                // Sections: code and data (random), string tables (text)
                // and alignment padding (zeros).
                let len = rng.gen_range(64..=4096u64).min(want as u64) as usize;
                match rng.gen_range(0..100u32) {
                    0..=59 => random_bytes(&mut rng, &mut buf, len),
                    60..=87 => text_bytes(&mut rng, &mut buf, len),
                    _ => buf.resize(len, 0),
                }
            }
        }
        out.write_all(&buf)?;
        remaining -= buf.len() as u64;
    }
    Ok(())
}

fn random_bytes(rng: &mut ChaCha8Rng, buf: &mut Vec<u8>, len: usize) {
    let start = buf.len();
    buf.resize(start + len, 0);
    rng.fill_bytes(&mut buf[start..]);
}

fn text_bytes(rng: &mut ChaCha8Rng, buf: &mut Vec<u8>, len: usize) {
    let end = buf.len() + len;
    while buf.len() < end {
        let w = pick(rng, WORDS).as_bytes();
        buf.extend_from_slice(w);
        // Identifiers and numbers keep text from compressing to nothing.
        if rng.gen_range(0..4u32) == 0 {
            let n: u32 = rng.gen();
            buf.extend_from_slice(format!("_{n:x}").as_bytes());
        }
        buf.push(if rng.gen_range(0..10u32) == 0 {
            b'\n'
        } else {
            b' '
        });
    }
    buf.truncate(end);
}

/// Writes `plan` below `root` (which must not exist), with every mode set
/// explicitly so the result does not depend on the umask.
pub fn write_tree(plan: &TreePlan, root: &Path) -> anyhow::Result<()> {
    create_dir_mode(root, 0o755)?;
    for (path, node) in &plan.entries {
        let p = root.join(path);
        match node {
            Node::Dir { .. } => {
                // Modes come last: a 0555 directory could not be filled.
                fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
            }
            Node::File { mode, content } => {
                let f =
                    fs::File::create(&p).with_context(|| format!("creating {}", p.display()))?;
                let mut w = BufWriter::with_capacity(CHUNK, f);
                write_content(content, &mut w)
                    .with_context(|| format!("writing {}", p.display()))?;
                w.flush()
                    .with_context(|| format!("writing {}", p.display()))?;
                // After writing: a write by a non-root owner clears setuid.
                set_mode(&p, *mode)?;
            }
            Node::Symlink { target } => {
                symlink(target, &p)
                    .with_context(|| format!("symlink {} -> {target}", p.display()))?;
            }
        }
    }
    for (path, node) in plan.entries.iter().rev() {
        if let Node::Dir { mode } = node {
            set_mode(&root.join(path), *mode)?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_deterministic() {
        for (scale, seed) in [(Scale::Small, SEED), (Scale::Small, 7), (Scale::Full, SEED)] {
            let a = plan_tree(scale, seed);
            let b = plan_tree(scale, seed);
            assert_eq!(a, b, "{scale} {seed}");
            let (a2, sa) = plan_update(&a, 0.05, seed + 1);
            let (b2, sb) = plan_update(&b, 0.05, seed + 1);
            assert_eq!(a2, b2, "{scale} {seed}");
            assert_eq!(sa, sb, "{scale} {seed}");
        }
        assert_ne!(plan_tree(Scale::Small, 1), plan_tree(Scale::Small, 2));
    }

    #[test]
    fn plans_have_the_intended_shape() {
        // (scale, files+symlinks range, bytes range in MiB, largest file at least MiB)
        let cases = [
            (Scale::Small, 1500..=3000u64, 30..=40u64, 2u64),
            (Scale::Full, 27_000..=33_000, 1000..=1050, 64),
        ];
        for (scale, files, mib, largest) in cases {
            let s = plan_tree(scale, SEED).stats();
            assert!(files.contains(&(s.files + s.symlinks)), "{scale}: {s:?}");
            assert!(mib.contains(&(s.bytes / MIB)), "{scale}: {s:?}");
            assert!(s.largest_file >= largest * MIB, "{scale}: {s:?}");
            assert!(
                s.symlinks > s.absolute_symlinks && s.absolute_symlinks > 0,
                "{scale}: {s:?}"
            );
            assert!(s.executables > 100, "{scale}: {s:?}");
            assert!(s.setuid >= 4, "{scale}: {s:?}");
            assert!(s.empty_files >= 5, "{scale}: {s:?}");
            assert!(s.max_depth >= 8, "{scale}: {s:?}");
        }
    }

    #[test]
    fn update_respects_share() {
        let v1 = plan_tree(Scale::Small, SEED);
        let n = v1.regular_files().len() as f64;
        for share in [0.0, 0.01, 0.05, 0.2, 1.0] {
            let (v2, s) = plan_update(&v1, share, 99);
            let expected = (share * n).round() as usize;
            assert_eq!(s.rewritten.len(), expected, "share {share}");
            assert_eq!(
                s.added.len() as u64,
                expected as u64 * ADDED_PER_MILLE_OF_REWRITTEN / 1000
            );
            // At share 1.0 nothing is left to remove: every file is rewritten.
            let removed = expected as u64 * REMOVED_PER_MILLE_OF_REWRITTEN / 1000;
            if share < 1.0 {
                assert_eq!(s.removed.len() as u64, removed, "share {share}");
            } else {
                assert!(s.removed.is_empty(), "share {share}");
            }
            // The summary is exactly the difference between the plans.
            let mut changed = Vec::new();
            for (p, n1) in &v1.entries {
                match (n1, v2.entries.get(p)) {
                    (Node::File { content: c1, .. }, Some(Node::File { content: c2, .. })) => {
                        if c1 != c2 {
                            changed.push(p.clone());
                        }
                    }
                    (_, None) => assert!(s.removed.contains(p), "{p} vanished"),
                    (a, Some(b)) => assert_eq!(a, b, "{p}"),
                }
            }
            assert_eq!(changed, s.rewritten, "share {share}");
            for p in &s.added {
                assert!(
                    !v1.entries.contains_key(p) && v2.entries.contains_key(p),
                    "{p}"
                );
            }
            if share == 0.0 {
                assert_eq!(v1, v2);
            }
        }
    }

    #[test]
    fn content_is_deterministic_and_sized() {
        for style in [Style::Binary, Style::Compressed, Style::Text] {
            for size in [0u64, 1, 15, 16, 17, 4096, 200_000] {
                let c = Content {
                    seed: 5,
                    size,
                    style,
                };
                let (mut a, mut b) = (Vec::new(), Vec::new());
                write_content(&c, &mut a).unwrap();
                write_content(&c, &mut b).unwrap();
                assert_eq!(a.len() as u64, size, "{style:?}");
                assert_eq!(a, b, "{style:?}");
            }
        }
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
