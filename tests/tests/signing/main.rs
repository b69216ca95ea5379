//! End-to-end: `oscontent-server keygen`, `sign` and `serve --signatures /
//! --trusted-keys / --sign-key`, through the binaries, against stock
//! `ostree` (gpgme) and GnuPG 2.2.
//!
//! Build the binaries first: `cargo build --workspace --bins`.

mod gate;
mod interop;
mod keys;
mod summary;
mod support;
