//! The HTTP surface in process: `app(state)` driven with
//! `tower::ServiceExt::oneshot` over small archive repos made with the
//! `ostree` CLI and published with the server's own publication code. The
//! assertions are those of the end-to-end tests in `tests/tests/serve`
//! (http.rs, traversal.rs, summary.rs), without spawning a binary.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod cache;
mod conditionals;
mod dates;
mod limits;
mod operations;
mod paths;
mod slots;
mod support;
mod verified;
