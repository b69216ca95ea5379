//! End-to-end: the `oscontent pull` / `verify` client against the real
//! server, compared with the stock `ostree` CLI, through a fault-injecting
//! proxy, and killed with SIGKILL across a pull.
//!
//! Build the binaries first: `cargo build --workspace --bins`, then
//! `cargo test -p oscontent-tests --test pull`.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod bounded_deltas;
mod cli;
mod crash;
mod deltas;
mod diskfill;
mod faults;
mod fetch;
mod forged_delta;
mod guard;
mod support;
mod trust;
