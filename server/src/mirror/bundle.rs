//! Bundles: a self-contained, served remote in a directory, to carry
//! across an air gap.
//!
//! A bundle is an ostree archive repo as a remote serves it (`config`,
//! `summary`, `summary.sig`, `refs/`, `objects/` with `.commitmeta`
//! signatures, `deltas/`), so any static web server serves it and stock
//! `ostree pull --mirror` reads it, plus `oscontent-bundle.json`: the list
//! of every file with its SHA-256 and size, the summary's SHA-256 and the
//! releases it holds. The manifest is the "complete" marker: an update
//! first moves it aside and writes it again only after everything else is
//! in place and synced, so a bundle that is being (or was, when a mirror
//! was killed) updated never looks complete. An update that fails while
//! it only added objects puts the manifest back
//! ([`Destination::abandon_update`]). `.oscontent-mirror/` holds a
//! mirror's work: temporary files, the previous manifest while an update
//! runs (how a resumed run knows what it can trust without reading it), and
//! staged images.
//!
//! Releases accumulate: without `--keep` every release a bundle ever held
//! stays in it, pullable by checksum; `--keep N` keeps the last N mirrored
//! (and what the source publishes now) and removes every object,
//! signature and delta no kept release reaches, reporting what it freed.
//!
//! At the site, [`verify_bundle`] checks every listed file before anything
//! is imported, and the import ([`super::upstream`]) verifies every object
//! and, with trusted keys, every signature again: a bundle tampered with in
//! transit is refused, and nothing of it is served.
//!
//! [`manifest`] is the format, [`verify`] the check at the site and the
//! bundle as a remote, [`destination`] an update in progress, [`files`]
//! the writes and listings they share.

mod destination;
mod files;
mod manifest;
mod verify;

pub use destination::{Destination, Pruned};
pub use files::{entry_of, list_files, refuse_foreign_dir, write_atomic, write_remote_files};
pub use manifest::{
    is_bundle, read_manifest, BundleManifest, ReleaseEntry, FORMAT, KIND, MANIFEST,
    MAX_MANIFEST_SIZE, WORK_DIR,
};
pub use verify::{verify_bundle, BundleRemote};

#[cfg(test)]
mod tests;
