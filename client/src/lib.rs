//! oscontent: the node-side client, and the ostree protocol model that the
//! server shares (object names, the archive URL grammar, commits, summaries).
//!
//! Everything under [`format`] is pure: bytes in, values out, no I/O, so it
//! can be tested table-driven and reused by the server, the signer and the
//! client alike.

pub mod cli;
pub mod format;
pub mod governor;
pub mod openpgp;
pub mod pull;
mod sys;

pub use sys::io_priority_class;
