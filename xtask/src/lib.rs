//! Library half of xtask: the pieces that end-to-end tests share with the
//! `cargo xtask` commands (fixtures above all), so tests can build what they
//! need without shelling out to cargo.

pub mod bench;
pub mod demo;
pub mod deploy;
pub mod deps;
pub mod fixtures;
pub mod testrun;
