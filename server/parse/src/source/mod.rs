//! The source's parsers of untrusted bytes and the types they share with
//! the server's fetch (`oscontent_server::source`, which re-exports them
//! under the same paths): references, errors, bounds and options.

pub mod auth;
pub mod decode;
pub mod detect;
pub mod error;
/// The fuzz targets' way in (tests/fuzz); not an API.
#[doc(hidden)]
pub mod fuzzing;
pub mod mirrors;
pub mod native_path;
pub mod reference;
pub mod resolve;
pub mod verify;

pub use detect::ImageFormat;
pub use error::{SourceError, Subject};
pub use reference::{ImageRef, Platform, Reference};

use std::path::PathBuf;
use std::time::Duration;

/// Default [`Limits::max_manifest_bytes`]: the distribution spec's 4 MiB.
pub const DEFAULT_MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// Default [`Limits::max_config_bytes`].
pub const DEFAULT_MAX_CONFIG_BYTES: u64 = 8 << 20;
/// Default [`Limits::max_layers`] (Docker's historic 127, and some).
pub const DEFAULT_MAX_LAYERS: usize = 256;
/// Default [`Limits::max_decompressed_bytes`]: 64 GiB, all layers (an
/// RHCOS repo is a few GiB).
pub const DEFAULT_MAX_DECOMPRESSED_BYTES: u64 = 64 << 30;
/// Default [`Limits::max_ratio`]: ostree archive objects are already
/// zlib-compressed, so real layers are near 1:1; gzip tops out near 1032:1.
pub const DEFAULT_MAX_RATIO: u64 = 100;
/// Default [`Limits::ratio_grace_bytes`].
pub const DEFAULT_RATIO_GRACE_BYTES: u64 = 64 << 20;
/// Default [`Limits::max_entries`]: tar entries, all layers.
pub const DEFAULT_MAX_ENTRIES: u64 = 2_000_000;
/// Default [`Limits::max_path_bytes`] (PATH_MAX).
pub const DEFAULT_MAX_PATH_BYTES: usize = 4096;
/// Default [`Limits::max_depth`].
pub const DEFAULT_MAX_DEPTH: usize = 64;
/// Default [`Limits::max_extension_bytes`].
pub const DEFAULT_MAX_EXTENSION_BYTES: u64 = 1 << 20;
/// Default [`FetchOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Default [`FetchOptions::read_timeout`].
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`FetchOptions::total_timeout`]: a few GiB over a slow link.
pub const DEFAULT_TOTAL_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// Default [`Limits::max_compressed_bytes`].
pub const DEFAULT_MAX_COMPRESSED_BYTES: u64 = 64 << 30;

/// Bounds on everything read from an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest manifest, index or layout `index.json`.
    pub max_manifest_bytes: u64,
    /// Largest image config.
    pub max_config_bytes: u64,
    /// Most layers in a manifest.
    pub max_layers: usize,
    /// Most compressed bytes, all layers together (checked against the
    /// manifest before anything is fetched; the descriptors' sizes are
    /// then enforced while reading).
    pub max_compressed_bytes: u64,
    /// Most decompressed tar bytes, all layers together (what is skipped
    /// counts too: it still has to be decompressed).
    pub max_decompressed_bytes: u64,
    /// Largest decompressed:compressed ratio of a layer, checked once the
    /// layer has produced `ratio_grace_bytes`.
    pub max_ratio: u64,
    /// Decompressed bytes a layer may produce before the ratio applies.
    pub ratio_grace_bytes: u64,
    /// Most tar entries, all layers (also bounds an OCI archive's entries).
    pub max_entries: u64,
    /// Longest entry path or link target.
    pub max_path_bytes: usize,
    /// Most path components of an extracted entry.
    pub max_depth: usize,
    /// Largest PAX or GNU long-name header.
    pub max_extension_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_manifest_bytes: DEFAULT_MAX_MANIFEST_BYTES,
            max_config_bytes: DEFAULT_MAX_CONFIG_BYTES,
            max_layers: DEFAULT_MAX_LAYERS,
            max_compressed_bytes: DEFAULT_MAX_COMPRESSED_BYTES,
            max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES,
            max_ratio: DEFAULT_MAX_RATIO,
            ratio_grace_bytes: DEFAULT_RATIO_GRACE_BYTES,
            max_entries: DEFAULT_MAX_ENTRIES,
            max_path_bytes: DEFAULT_MAX_PATH_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
            max_extension_bytes: DEFAULT_MAX_EXTENSION_BYTES,
        }
    }
}

/// How to fetch.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Which manifest to take from an index (default `linux/amd64`).
    pub platform: Platform,
    /// Credentials file; else `$REGISTRY_AUTH_FILE`, else the containers
    /// and docker defaults (see [`auth`]).
    pub authfile: Option<PathBuf>,
    /// PEM files of extra CAs to trust, besides the system's.
    pub ca_files: Vec<PathBuf>,
    /// `HOST[:PORT]`s reached over plain HTTP.
    pub insecure_registries: Vec<String>,
    /// A `registries.conf` with mirrors (see [`mirrors`]).
    pub registries_conf: Option<PathBuf>,
    pub limits: Limits,
    /// TCP (and TLS) connect timeout.
    pub connect_timeout: Duration,
    /// Longest wait for a response, and for each read of a body.
    pub read_timeout: Duration,
    /// Longest a whole fetch may take (all endpoints); `None`: no limit
    /// beyond the per-read timeout and the sizes.
    pub total_timeout: Option<Duration>,
    /// For an ostree-native image with derived layers (after
    /// `ostree.final-diffid`): stage its base commit (the derived layers are
    /// not fetched) instead of refusing the image.
    pub serve_base_commit: bool,
    /// The rate blobs are read at (`mirror --max-rate`); `None`: as fast
    /// as they come.
    pub pace: Option<std::sync::Arc<dyn verify::Pace>>,
}

impl Default for FetchOptions {
    fn default() -> Self {
        Self {
            platform: Platform::default(),
            authfile: None,
            ca_files: Vec::new(),
            insecure_registries: Vec::new(),
            registries_conf: None,
            limits: Limits::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            total_timeout: Some(DEFAULT_TOTAL_TIMEOUT),
            serve_base_commit: false,
            pace: None,
        }
    }
}
