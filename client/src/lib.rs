//! oscontent: the node-side client. It pulls only the objects a host lacks,
//! verifies them before anything becomes visible, and paces its writes.
//!
//! The protocol model it shares with the server (object names, the archive
//! URL grammar, commits, summaries, signatures) is the `oscontent-format`
//! crate.

pub mod cli;
pub mod governor;
pub mod pull;
pub mod stage;
mod sys;

pub use sys::io_priority_class;
