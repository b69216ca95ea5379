//! Helpers for the image suite: the testkit's registry and OCI builders,
//! hand-made oscontainers for the attacks, a stalling TCP proxy, and the
//! checks every failure must pass.

#![allow(dead_code)]

mod failure;
mod native;
mod pull;

pub use failure::*;
pub use native::*;
pub use pull::*;

pub use oscontent_testkit::oci::*;
pub use oscontent_testkit::proxy::Proxy;
pub use oscontent_testkit::registry::{write_authfile, Registry};
use oscontent_testkit::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Ref bound into the hand-made images' commits.
/// Bound on one skopeo / gzip / umoci run.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a failing server may take to log an error (one attempt).
pub const ERROR_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a tool, which must succeed, within [`TOOL_TIMEOUT`]; stdout.
pub fn tool(cmd: &mut Command) -> String {
    local_only(cmd);
    check_output(cmd, TOOL_TIMEOUT).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `skopeo --insecure-policy ARGS...`.
pub fn skopeo(args: &[&str]) -> String {
    tool(Command::new("skopeo").arg("--insecure-policy").args(args))
}

/// A server builder for `refs` from `reg`: plain HTTP to it, and a
/// one-second backoff so that retries show up quickly.
pub fn image_server(reg: &Registry, refs: &[String]) -> ServerBuilder {
    Server::images(refs).args(["--insecure-registry", &reg.host(), "--max-backoff", "1"])
}

/// Flips one byte of a file in place (xor 0xff) at `offset`.
pub fn flip_byte(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0xff;
    f.write_all_at(&b, offset).unwrap();
    f.sync_all().unwrap();
}
