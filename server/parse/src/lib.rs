//! oscontent-parse: the server's parsers of untrusted bytes, apart from
//! its I/O, so that the fuzz targets (tests/fuzz) build them without the
//! server's dependency tree (tokio, hyper, reqwest, zstd, prometheus...).
//!
//! Pure: bytes (or a `Read` of bytes handed in) in, values or errors out;
//! no files, sockets or clock beyond a deadline check. The server
//! re-exports every module under its old path (`conditional`,
//! `source::{detect, mirrors, auth, ...}`, `mirror::bundle`), which is
//! where they are documented in use.
//!
//! Modules:
//! - [`conditional`]: the Range and conditional request headers.
//! - [`bundle`]: a mirror bundle's `oscontent-bundle.json`.
//! - [`source`]: image references, `registries.conf`, `auth.json`, the
//!   OCI index/manifest resolution over a [`source::resolve::Store`], the
//!   tar entry decoder with its [`source::Limits`], native layer paths,
//!   and the errors they return.

pub mod bundle;
pub mod conditional;
pub mod source;
