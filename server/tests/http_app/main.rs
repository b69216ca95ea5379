//! The HTTP surface in process: `app(state)` driven with
//! `tower::ServiceExt::oneshot` over small archive repos made with the
//! `ostree` CLI and published with the server's own publication code. The
//! assertions are those of the end-to-end tests in `tests/tests/serve`
//! (http.rs, traversal.rs, summary.rs), without spawning a binary.

mod conditionals;
mod operations;
mod paths;
mod support;
