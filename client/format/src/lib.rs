//! oscontent-format: the ostree repository format, as far as a remote speaks
//! it, and the OpenPGP signatures it carries. Shared by the server, the signer
//! and the node client, so all of them parse and build the same bytes.
//!
//! Everything here is pure: bytes in, values out, no I/O (the OpenPGP tests
//! cross-check against GnuPG and stock ostree).
//!
//! References: ostree `docs/formats.md` and `docs/repo.md`; the byte layouts
//! were checked against libostree 2022.7 (`ostree summary --view --raw`).

mod checksum;
pub mod commit;
pub mod content;
pub mod delta;
pub mod gpgsigs;
pub mod openpgp;
mod path;
mod refname;
pub mod summary;
pub mod tree;

pub use checksum::Checksum;
pub use commit::{Commit, COMMIT_GVARIANT_TYPE};
pub use delta::Superblock;
pub use gpgsigs::{build_gpgsigs, merge_gpgsigs, parse_gpgsigs};
pub use path::{DeltaFile, DeltaName, ObjectKind, ObjectName, RefNamespace, RepoPath};
pub use refname::{sanitize_ref_component, validate_collection_id, validate_ref};
pub use summary::{build_summary, parse_summary, Summary, SummaryDelta, SummaryRef};
pub use tree::{check_dirmeta, parse_dirtree, DirTree};

/// Why some bytes or a name are not valid ostree format. Callers branch on
/// this (404 versus 500 on the server, refuse versus retry on the client).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("invalid checksum {0:?}: want 64 lowercase hex digits")]
    Checksum(String),
    #[error("invalid modified-base64 checksum {0:?}")]
    Mbase64(String),
    #[error("invalid ref name {0:?}")]
    RefName(String),
    #[error("invalid collection ID {0:?}")]
    CollectionId(String),
    #[error("invalid {what}: {why}")]
    Variant { what: &'static str, why: String },
    #[error("duplicate ref {0:?} in summary")]
    DuplicateRef(String),
}

/// The repository mode string a summary advertises; ostree's archive mode is
/// still called `archive-z2` on the wire.
pub const ARCHIVE_MODE: &str = "archive-z2";
