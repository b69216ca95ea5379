//! End-to-end: `oscontent-server` against the stock `ostree` CLI and plain
//! HTTP clients. Every test starts its own server(s) with their own state
//! dirs; the shared fixtures are only ever read.
//!
//! Build the binaries first: `cargo build --workspace --bins`, then
//! `cargo test -p oscontent-tests`.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod cli;
mod conditionals;
mod h1;
mod http;
mod pull;
mod repo_mode;
mod shutdown;
mod slots;
mod summary;
mod traversal;
mod verified;
