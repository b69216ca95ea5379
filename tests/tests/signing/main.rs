//! End-to-end: `oscontent-server keygen`, `sign` and `serve --signatures /
//! --trusted-keys / --sign-key`, through the binaries, against stock
//! `ostree` (gpgme) and GnuPG 2.2.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod gate;
mod interop;
mod keys;
mod live_repo;
mod pinned;
mod summary;
mod support;
