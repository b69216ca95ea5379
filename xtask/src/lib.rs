//! Library half of xtask: every `cargo xtask` command's logic (tests,
//! checks, the demo, benchmarks), so the binary stays a thin dispatcher and
//! the pieces are unit-tested. What the end-to-end suites share with xtask
//! (the fixtures, bounded processes, the server under test) lives in the
//! testkit, `tests/testkit`.

pub mod bench;
pub mod cargo;
pub mod demo;
pub mod deny;
pub mod deploy;
pub mod deps;
pub mod fuzz;
pub mod layers;
pub mod testrun;
pub mod venv;

/// The deterministic oscontainer fixtures live in the testkit, which the
/// end-to-end suites share; xtask builds them for `fixtures`, the demo and
/// the benchmarks.
pub use oscontent_testkit::fixtures;
