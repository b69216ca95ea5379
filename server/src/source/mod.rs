//! Sources: get an oscontainer onto local disk once, verified.
//!
//! A registry image, an OCI layout or an OCI archive is streamed: no
//! compressed blob is ever stored. Every blob's sha256 and size are checked
//! against its descriptor while the bytes go by, as are the manifest's
//! digest (against the reference, when pulling by digest; always recorded)
//! and the config's. Layers are decompressed (gzip, zstd, or plain tar) and
//! applied in order with OCI whiteouts, but only `srv/repo/**` is written
//! (see [`unpack`] for the entry rules), plus the config labels. If
//! anything fails, the whole staging directory is removed: nothing
//! unverified is ever kept.
//!
//! # API
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use oscontent_server::source::{self, FetchOptions, ImageRef};
//! let parent = std::path::Path::new("/var/lib/oscontent/images");
//! source::clean_staging(parent)?; // once, at startup, before any fetch
//! let image: ImageRef = "docker://quay.io/org/os@sha256:…".parse()?;
//! match source::fetch(&image, &FetchOptions::default(), parent).await {
//!     Ok(staged) => { /* publish Source::Oscontainer(staged.root) */ }
//!     Err(e) if e.is_retryable() => { /* back off and retry */ }
//!     Err(e) => { /* log it; retry slowly or give up */ }
//! }
//! # Ok(()) }
//! ```
//!
//! - [`ImageRef`] parses `docker://HOST[:PORT]/REPO[:TAG|@sha256:DIGEST]`,
//!   `oci:DIR[:TAG]` and `oci-archive:FILE[:TAG]`.
//! - [`fetch`] streams the image into `staging_parent/staging-XXXX`; on
//!   success, after `syncfs`, renames it to `staging_parent/image-XXXX` and
//!   returns it as a [`StagedImage`] (its `root` holds `srv/repo`). The
//!   caller owns it from then on (publish it; remove it with
//!   [`StagedImage::remove`] once no generation uses it).
//! - On error nothing is left under `staging_parent`, and the
//!   [`SourceError`] names the image, the object (manifest, config or
//!   layer, with its digest) and the reason.
//! - [`clean_staging`] removes what an earlier process left (`staging-*`
//!   from a crash mid-stream, and `image-*` it had fetched: this process
//!   fetches afresh).
//!
//! # Registries
//!
//! OCI distribution v2; OCI and Docker schema2 manifests, OCI indexes and
//! Docker manifest lists (the [`FetchOptions::platform`] entry is picked).
//! Auth: Basic and Bearer challenges with credentials from auth files
//! ([`auth`]); TLS: the system CAs plus [`FetchOptions::ca_files`];
//! [`FetchOptions::insecure_registries`] use plain HTTP. Mirrors come from a
//! `registries.conf` ([`mirrors`]): the mirrors are tried in order, then the
//! primary; an endpoint failing with a retryable error (connection,
//! timeout, 404, auth, 5xx, a corrupted blob) passes to the next, starting
//! again from a fresh staging directory; a fatal one (unsafe content,
//! limits, labels) stops at once.
//!
//! # Bounds
//!
//! Everything read from outside is bounded ([`Limits`]): manifest, config,
//! token and auth-file sizes, layer count, total compressed size (from the
//! manifest, before fetching), tar entries, extension headers, path length
//! and depth, total decompressed bytes and the compression ratio. Time:
//! connect and per-read timeouts, and [`FetchOptions::total_timeout`] for
//! the whole fetch.
//!
//! Cancelling (dropping) the future stops the blocking worker at its next
//! read, which removes the staging directory.
//!
//! # Why not oci-client
//!
//! The protocol part is small (two GETs and two challenges), and
//! `oci-client` 0.18 reads manifests unbounded into memory, swallows token
//! errors into anonymous retries, knows mirrors only as `?ns=` hosts (no
//! registries.conf path rewriting), and brings a second reqwest (0.13) with
//! aws-lc-sys. Here: reqwest 0.12 (already in the workspace) with rustls
//! and the system CA store, `http-auth` for challenge parsing, `oci-spec`
//! for the manifest, index and config types. The HTTP proxy variables are
//! honoured, as reqwest does by default.

pub mod auth;
mod layout;
pub mod mirrors;
pub mod native;
pub(crate) mod pipeline;
mod registry;
pub mod unpack;

// The parsers of untrusted bytes live in `oscontent-parse` (the fuzz
// targets build it without the server's dependency tree); their paths
// here are unchanged.
pub use oscontent_parse::source::detect;
/// The fuzz targets' way in (tests/fuzz); not an API.
#[doc(hidden)]
pub use oscontent_parse::source::fuzzing;
pub(crate) use oscontent_parse::source::verify;
use oscontent_parse::source::{error, reference};
pub use oscontent_parse::source::{
    FetchOptions, Limits, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_COMPRESSED_BYTES,
    DEFAULT_MAX_CONFIG_BYTES, DEFAULT_MAX_DECOMPRESSED_BYTES, DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_ENTRIES, DEFAULT_MAX_EXTENSION_BYTES, DEFAULT_MAX_LAYERS,
    DEFAULT_MAX_MANIFEST_BYTES, DEFAULT_MAX_PATH_BYTES, DEFAULT_MAX_RATIO,
    DEFAULT_RATIO_GRACE_BYTES, DEFAULT_READ_TIMEOUT, DEFAULT_TOTAL_TIMEOUT,
};
pub use oscontent_parse::source::{ImageRef, Platform, Reference, SourceError, Subject};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use detect::ImageFormat;
/// The label naming the ostree commit a legacy oscontainer carries (a
/// native image's is [`detect::NATIVE_COMMIT_LABEL`]).
pub const COMMIT_LABEL: &str = detect::LEGACY_COMMIT_LABEL;
/// The label naming the release version (it names the ref).
pub const VERSION_LABEL: &str = detect::VERSION_LABEL;

/// Name prefix of in-progress (unverified) staging directories.
pub const STAGING_PREFIX: &str = "staging-";
/// Name prefix of fetched, verified and synced image directories.
pub const IMAGE_PREFIX: &str = "image-";

/// A fetched, verified, synced oscontainer tree.
#[derive(Debug, Clone)]
pub struct StagedImage {
    /// The oscontainer root: it holds `srv/repo` and nothing else.
    pub root: PathBuf,
    /// The image config's labels.
    pub labels: BTreeMap<String, String>,
    /// Digest of the image manifest used (for a multi-platform image, the
    /// platform's manifest).
    pub manifest_digest: String,
    /// Digest of the index the manifest was picked from, if any.
    pub index_digest: Option<String>,
    pub config_digest: String,
    /// Bytes read: config plus layers, as stored (compressed).
    pub compressed_bytes: u64,
    /// Bytes written into files under `root`.
    pub written_bytes: u64,
    /// The commit label (`com.coreos.ostree-commit`, or `ostree.commit`
    /// for a native image); its `.commit` object exists under `srv/repo`
    /// (that it is the repo's commit is for the publisher to check).
    pub commit: String,
    /// The version label (`version`; for a native image
    /// `org.opencontainers.image.version` first).
    pub version: Option<String>,
    /// Which layout the image had: a native image's `srv/repo` is the
    /// archive repo its layers were converted into.
    pub format: ImageFormat,
    /// For a native image the importer can take as staged: its manifest,
    /// config and object sets.
    pub staging: Option<Arc<native::staging::NativeStaging>>,
}

impl StagedImage {
    /// Deletes the tree (once no generation serves it).
    pub fn remove(self) -> std::io::Result<()> {
        std::fs::remove_dir_all(&self.root)
    }
}

/// Sets the flag when the fetch future is dropped.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Streams `image` into a new directory under `staging_parent` (created if
/// needed), verifying everything; see the module docs.
pub async fn fetch(
    image: &ImageRef,
    opts: &FetchOptions,
    staging_parent: &Path,
) -> Result<StagedImage, SourceError> {
    let cancel = Arc::new(AtomicBool::new(false));
    let _guard = CancelOnDrop(cancel.clone());
    let (image, opts, parent) = (image.clone(), opts.clone(), staging_parent.to_path_buf());
    let name = image.to_string();
    let result =
        tokio::task::spawn_blocking(move || fetch_blocking(&image, &opts, &parent, &cancel)).await;
    match result {
        Ok(r) => r,
        Err(e) => Err(SourceError::Io {
            subject: Subject::new(name, "fetch worker"),
            path: "(none)".into(),
            source: std::io::Error::other(format!("fetch worker failed: {e}")),
        }),
    }
}

/// [`fetch`], on the calling thread (which must not be an async one).
pub fn fetch_blocking(
    image: &ImageRef,
    opts: &FetchOptions,
    staging_parent: &Path,
    cancel: &Arc<AtomicBool>,
) -> Result<StagedImage, SourceError> {
    let name = image.to_string();
    let started = std::time::Instant::now();
    let stop = verify::Stop {
        pace: opts.pace.clone(),
        cancel: cancel.clone(),
        deadline: opts.total_timeout.map(|t| (started + t, t)),
    };
    let result = with_store(image, opts, &mut |store, label| {
        pull(store, label, opts, staging_parent, &stop)
    });
    match &result {
        Ok(s) => tracing::info!(
            image = name,
            manifest = s.manifest_digest,
            format = %s.format,
            commit = s.commit,
            compressed_bytes = s.compressed_bytes,
            written_bytes = s.written_bytes,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "image fetched and verified"
        ),
        Err(e) => tracing::debug!(image = name, error = %e, "fetch failed"),
    }
    result
}

/// Resolves `image` to the digest of the manifest a fetch would use now
/// (for a multi-platform image, the [`FetchOptions::platform`] entry's),
/// reading only manifests and indexes: the cheap check behind refreshes.
pub fn resolve_digest_blocking(
    image: &ImageRef,
    opts: &FetchOptions,
) -> Result<String, SourceError> {
    with_store(image, opts, &mut |store, label| {
        pipeline::resolve(store, label, opts).map(|r| r.manifest_digest)
    })
}

/// [`resolve_digest_blocking`] on the blocking pool.
pub async fn resolve_digest(image: &ImageRef, opts: &FetchOptions) -> Result<String, SourceError> {
    let (image, opts) = (image.clone(), opts.clone());
    let name = image.to_string();
    tokio::task::spawn_blocking(move || resolve_digest_blocking(&image, &opts))
        .await
        .unwrap_or_else(|e| {
            Err(SourceError::Io {
                subject: Subject::new(name, "resolve worker"),
                path: "(none)".into(),
                source: std::io::Error::other(format!("resolve worker failed: {e}")),
            })
        })
}

/// Runs `op` against the store `image` names. For a registry, against
/// each endpoint in turn (mirrors first, then the primary) until one
/// succeeds or fails fatally; `op` gets a label naming the endpoint used.
pub(crate) fn with_store<T>(
    image: &ImageRef,
    opts: &FetchOptions,
    op: &mut dyn FnMut(&mut dyn pipeline::Store, &str) -> Result<T, SourceError>,
) -> Result<T, SourceError> {
    let name = image.to_string();
    match image {
        ImageRef::OciLayout { dir, tag } => {
            let mut store = layout::LayoutStore::new(dir, tag.clone());
            op(&mut store, &name)
        }
        ImageRef::OciArchive { file, tag } => {
            let subject = Subject::new(name.clone(), "");
            let mut store = layout::ArchiveStore::open(file, tag.clone(), &subject, opts)?;
            op(&mut store, &name)
        }
        ImageRef::Registry {
            registry,
            repository,
            reference,
        } => with_registry(&name, registry, repository, reference, opts, op),
    }
}

fn with_registry<T>(
    name: &str,
    registry: &str,
    repository: &str,
    reference: &Reference,
    opts: &FetchOptions,
    op: &mut dyn FnMut(&mut dyn pipeline::Store, &str) -> Result<T, SourceError>,
) -> Result<T, SourceError> {
    let subject = Subject::new(name, "");
    let config = |reason: String| SourceError::Config {
        subject: subject.clone(),
        reason,
    };
    let conf = match &opts.registries_conf {
        Some(p) => mirrors::load(p).map_err(config)?,
        None => mirrors::RegistriesConf::default(),
    };
    let endpoints = conf
        .endpoints(registry, repository, reference, &opts.insecure_registries)
        .map_err(config)?;
    let mut client = registry::Client::new(opts, &subject)?;
    let mut attempts = Vec::new();
    let n = endpoints.len();
    for (i, ep) in endpoints.iter().enumerate() {
        let shown = format!(
            "{}://{}",
            if ep.insecure { "http" } else { "https" },
            ep.name()
        );
        let label = if ep.mirror || ep.registry != registry || ep.repository != repository {
            format!(
                "{name} (via {}{shown})",
                if ep.mirror { "mirror " } else { "" }
            )
        } else {
            name.to_owned()
        };
        let mut store = registry::RegistryStore {
            client: &mut client,
            endpoint: ep,
            reference,
        };
        match op(&mut store, &label) {
            Ok(s) => return Ok(s),
            Err(e) if e.is_retryable() && i + 1 < n => {
                tracing::warn!(image = name, endpoint = shown, error = %e, "endpoint failed; trying the next");
                attempts.push(e.to_string());
            }
            Err(e) if attempts.is_empty() => return Err(e),
            Err(e) => {
                return Err(SourceError::AllSourcesFailed {
                    image: name.to_owned(),
                    attempts,
                    last: Box::new(e),
                })
            }
        }
    }
    unreachable!("endpoints() returns at least the primary")
}

/// One attempt from one store, in a fresh staging directory that is
/// removed unless everything succeeds.
fn pull(
    store: &mut dyn pipeline::Store,
    image: &str,
    opts: &FetchOptions,
    staging_parent: &Path,
    stop: &verify::Stop,
) -> Result<StagedImage, SourceError> {
    let subject = Subject::new(image, "staging");
    let io =
        |p: &Path, e: std::io::Error| SourceError::from_io(&subject, p.display().to_string(), e);
    std::fs::create_dir_all(staging_parent).map_err(|e| io(staging_parent, e))?;
    // Resolve before creating anything: most failures happen here.
    let resolved = pipeline::resolve(store, image, opts)?;
    let staging = tempfile::Builder::new()
        .prefix(STAGING_PREFIX)
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .tempdir_in(staging_parent)
        .map_err(|e| io(staging_parent, e))?;
    let mut tree = unpack::Tree::open(staging.path()).map_err(|e| io(staging.path(), e))?;
    let mut staged = pipeline::pull_into(
        store,
        image,
        opts,
        resolved,
        &mut tree,
        staging.path(),
        stop,
    )?;
    // Verified and synced: give it its final name, durably.
    let suffix = staging
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(STAGING_PREFIX))
        .unwrap_or("x")
        .to_owned();
    let short = staged
        .manifest_digest
        .trim_start_matches("sha256:")
        .get(..12)
        .unwrap_or("")
        .to_owned();
    let dest = staging_parent.join(format!("{IMAGE_PREFIX}{short}-{suffix}"));
    std::fs::rename(staging.path(), &dest).map_err(|e| io(&dest, e))?;
    // The directory is no longer at the TempDir's path: nothing to delete.
    let _ = staging.keep();
    let dir = std::fs::File::open(staging_parent).map_err(|e| io(staging_parent, e))?;
    if let Err(e) = dir.sync_all() {
        let _ = std::fs::remove_dir_all(&dest);
        return Err(io(staging_parent, e));
    }
    staged.root = dest;
    Ok(staged)
}

/// Removes what an earlier process left under `staging_parent`: partial
/// `staging-*` directories, and `image-*` trees (a new process fetches
/// afresh). Other entries are left alone. Absent parent: nothing to do.
pub fn clean_staging(staging_parent: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    let rd = match std::fs::read_dir(staging_parent) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", staging_parent.display())),
    };
    for ent in rd {
        let ent = ent.with_context(|| format!("listing {}", staging_parent.display()))?;
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(STAGING_PREFIX) || name.starts_with(IMAGE_PREFIX)) {
            continue;
        }
        let p = ent.path();
        let ft = ent
            .file_type()
            .with_context(|| format!("inspecting {}", p.display()))?;
        if ft.is_dir() {
            std::fs::remove_dir_all(&p)
                .with_context(|| format!("removing stale {}", p.display()))?;
        } else {
            std::fs::remove_file(&p).with_context(|| format!("removing stale {}", p.display()))?;
        }
        tracing::info!(path = %p.display(), "removed a leftover from an earlier run");
    }
    Ok(())
}
