//! Harness for the end-to-end suites: run the real `oscontent-server` and
//! `oscontent` binaries and the stock `ostree` CLI against each other.
//!
//! Everything here is bounded: every wait has a deadline and every read a
//! size limit, and all traffic goes to 127.0.0.1. Helpers return
//! `anyhow::Result` with the child's stderr in the error, so a failing test
//! says why.
//!
//! Binaries are found in `$OSCONTENT_BIN_DIR`, else in the `target/<profile>`
//! directory the test executable was built into. Build them first with
//! `cargo build --workspace --bins` (or run `cargo xtask test`).

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

pub mod access_log;
pub mod checkout;
pub mod deploy;
pub mod encapsulate;
pub mod files;
pub mod fixtures;
pub mod http;
pub mod metrics;
#[cfg(feature = "format")]
pub mod native;
pub mod netns;
pub mod nginx;
pub mod objects;
pub mod oci;
pub mod ostree;
pub mod process;
#[cfg(feature = "proxy")]
pub mod proxy;
pub mod registry;
pub mod server;
pub mod signing;
pub mod tmpfs;
pub mod tools;
pub mod workspace;

pub use access_log::*;
pub use files::*;
pub use fixtures::{Fixtures, Release};
pub use http::*;
pub use metrics::*;
pub use objects::*;
pub use ostree::*;
pub use process::*;
pub use server::builder::*;
pub use server::launch::*;
pub use server::*;
pub use tmpfs::SmallFs;
pub use tools::*;
