//! The one error type of the format crate.

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
    #[error("invalid repo config: {0}")]
    Config(String),
    #[error("duplicate ref {0:?} in summary")]
    DuplicateRef(String),
}
