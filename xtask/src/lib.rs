//! Library half of xtask: the pieces that end-to-end tests share with the
//! `cargo xtask` commands (fixtures above all), so tests can build what they
//! need without shelling out to cargo.

pub mod bench;
pub mod cargo;
pub mod demo;
pub mod deploy;
pub mod deps;
pub mod testrun;

/// The deterministic oscontainer fixtures live in the testkit, which the
/// end-to-end suites share; xtask builds them for `fixtures`, the demo and
/// the benchmarks.
pub use oscontent_testkit::fixtures;
