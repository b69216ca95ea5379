//! End-to-end: `oscontent-server serve --image` against a real
//! `docker-registry` on loopback, images pushed with `skopeo`, and the
//! stock `ostree` CLI pulling from the server. Each test has its own
//! registry, server, state dir and temporary dirs; the shared fixtures are
//! only ever read.
//!
//! Build the binaries first: `cargo build --workspace --bins`, then
//! `cargo test -p oscontent-tests --test image`. Needs `docker-registry`,
//! `skopeo`, `umoci`, `htpasswd` (apache2-utils), `gzip` and `ostree`.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod attacks;
mod derived;
mod follow;
mod importer;
mod lifecycle;
mod native;
mod pull;
mod refresh;
mod rollback;
mod root;
mod space;
mod stage;
mod staging;
mod state_full;
mod support;
