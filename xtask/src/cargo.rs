//! Running cargo and finding what it built: the leaf every xtask command
//! (tests, demo, benchmarks, deploy checks) shares.

use crate::fixtures;
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
