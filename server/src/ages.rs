//! A published ref's age: what the rollback check and the delta planner
//! order releases by (through `format::age::Age::order`), and the refs
//! that are named for a version rather than bound by the commit.

use oscontent_format::{self as format, Checksum};

/// Prefix of refs derived from `version` metadata.
pub const VERSION_REF_PREFIX: &str = "version/";

/// A published ref and how old its commit is: what the rollback check
/// and the delta planner order releases by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefAge {
    pub name: String,
    pub commit: Checksum,
    pub timestamp: u64,
    pub version: Option<String>,
}

impl RefAge {
    pub fn age(&self) -> format::age::Age<'_> {
        format::age::Age {
            timestamp: self.timestamp,
            version: self.version.as_deref(),
        }
    }
}
