//! What a generation serves of deltas it did not find in its sources (the
//! server's own, `crate::deltas`): it asks them first, on every request,
//! and decides nothing about them. The owner of the deltas implements this
//! and hands them over in [`super::Generation::attach_deltas`], so what a
//! generation serves does not depend on how deltas are made and kept.

use super::Resolved;
use oscontent_format::RepoPath;
use std::os::fd::BorrowedFd;

/// Deltas verified before they were handed over, and their indexes.
pub trait ServedDeltas: std::fmt::Debug + Send + Sync {
    /// What a request path resolves to among these deltas, if it names one
    /// of them or the index of one of their targets.
    fn resolve(&self, path: &RepoPath) -> Option<Resolved>;
    /// The directory fd the file [`Self::resolve`] named is opened beneath.
    fn dir_fd(&self, path: &RepoPath) -> Option<BorrowedFd<'_>>;
    /// How many deltas (for the metrics).
    fn count(&self) -> usize;
}
