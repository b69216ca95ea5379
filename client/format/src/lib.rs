//! oscontent-format: the ostree repository format, as far as a remote speaks
//! it, and the OpenPGP signatures it carries. Shared by the server, the signer
//! and the node client, so all of them parse and build the same bytes.
//!
//! Everything here is pure: bytes in, values out, no I/O (the OpenPGP tests
//! cross-check against GnuPG and stock ostree).
//!
//! Modules:
//! - [`age`]: the version order and the downgrade decision (node and
//!   server refuse the same rollbacks).
//! - `checksum`: [`Checksum`] (hex, and ostree's modified base64 for delta
//!   names).
//! - `path`: [`RepoPath`], the exact URL grammar of an archive remote.
//! - `refname`: ostree's ref and collection-ID grammar.
//! - [`config`]: the repo `config` ([`RepoConfig`], read with glib's
//!   `GKeyFile`).
//! - `variant`: [`parse_normal`], the first step of every GVariant parser.
//! - [`commit`]: commit objects.
//! - [`tree`]: dirtree and dirmeta objects, with size caps and name checks.
//! - [`content`]: the archive content header (`.filez`).
//! - [`filez`]: building content objects: the bare content checksum and
//!   the `.filez` encoder (what the server converts native images with).
//! - [`summary`]: deterministic summary building and bounded parsing.
//! - [`delta`]: static delta superblocks.
//! - [`deltapart`]: static delta parts: the op-stream checker.
//! - [`staging`]: what a node stages an ostree-native image with: the
//!   importer's layer refs, object-set commits, and the index of served
//!   images the summary carries.
//! - [`digits`]: numbers as text without the formatter.
//! - [`gpgsigs`]: the `ostree.gpgsigs` container of `.commitmeta` and
//!   `summary.sig`.
//! - `openpgp`: keys, detached signatures and their verification
//!   (feature `openpgp`, on by default; off, the crate builds without
//!   sequoia, as the fuzz targets do).
//! - `retry`: [`RetryPolicy`], how requests to a remote are retried (the
//!   node client and the mirror share it).
//! - `error`: [`FormatError`], what every parser returns.
//!
//! References: ostree `docs/formats.md` and `docs/repo.md`; the byte layouts
//! were checked against libostree 2022.7 (`ostree summary --view --raw`).

pub mod age;
mod checksum;
pub mod commit;
pub mod config;
pub mod content;
pub mod delta;
pub mod deltapart;
pub mod digits;
mod error;
pub mod filez;
pub mod gpgsigs;
#[cfg(feature = "openpgp")]
pub mod openpgp;
mod path;
mod refname;
mod retry;
pub mod staging;
pub mod summary;
pub mod tree;
mod variant;

pub use checksum::Checksum;
pub use commit::{Commit, COMMIT_GVARIANT_TYPE};
pub use config::{RepoConfig, ARCHIVE_MODE};
pub use delta::Superblock;
pub use error::FormatError;
pub use gpgsigs::{build_gpgsigs, merge_gpgsigs, parse_gpgsigs};
pub use path::{DeltaFile, DeltaName, ObjectKind, ObjectName, RefNamespace, RepoPath};
pub use refname::{sanitize_ref_component, validate_collection_id, validate_ref, MAX_REF_LEN};
pub use retry::{parse_retry_after, response_retry_after, GiveUp, Retries, RetryPolicy};
pub use summary::{
    build_delta_index, build_summary, parse_delta_index, parse_summary, Summary, SummaryDelta,
    SummaryRef,
};
pub use tree::{check_dirmeta, parse_dirtree, DirTree};
pub use variant::parse_normal;
