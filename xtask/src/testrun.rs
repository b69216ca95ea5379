//! `cargo xtask test`: every check and test, in the order CI runs them.

use crate::{deps, fixtures};
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// Where cargo puts build outputs for this workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixtures::workspace_root().join("target"))
}

/// The directory holding the debug binaries.
pub fn bin_dir() -> PathBuf {
    target_dir().join("debug")
}

/// Runs `cargo ARGS` in the workspace root, failing on a non-zero exit.
pub fn cargo(args: &[&str]) -> Result<()> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(fixtures::workspace_root())
        .env("OSCONTENT_BIN_DIR", bin_dir())
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    anyhow::ensure!(
        status.success(),
        "cargo {} failed: {status}",
        args.join(" ")
    );
    Ok(())
}

/// Formatting and lints; part of `test` so CI enforces them.
pub fn check() -> Result<()> {
    cargo(&["fmt", "--all", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--quiet",
        "--",
        "-D",
        "warnings",
    ])
}

/// Installs what is missing, checks (code, then deploy/), builds, prepares
/// fixtures once (so test processes do not queue on the fixture lock), then
/// runs every test.
pub fn test() -> Result<()> {
    deps::ensure()?;
    // checkov's install is mostly network wait (minutes on a fresh
    // machine); it overlaps the CPU-bound lints instead of adding to them.
    let checkov = std::thread::spawn(crate::deploy::checkov::ensure_installed);
    let checked = check();
    let installed = checkov
        .join()
        .map_err(|_| anyhow::anyhow!("the checkov install thread panicked"))?;
    checked?;
    installed.context("installing checkov")?;
    crate::deploy::check_deploy().context("cargo xtask check-deploy")?;
    cargo(&["build", "--workspace", "--bins", "--tests"])?;
    let f = fixtures::small().context("building the small fixtures")?;
    eprintln!("xtask: fixtures ready at {}", f.root.display());
    cargo(&["test", "--workspace", "--no-fail-fast"])
}
