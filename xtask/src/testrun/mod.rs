//! `cargo xtask test`: every check and test, in the order CI runs them.

mod suites;

use crate::cargo::cargo;
use crate::{deps, fixtures};
use anyhow::{Context, Result};

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
    suites::run(test_jobs())
}

/// Test executables run at once: `OSCONTENT_TEST_JOBS`, else 2 (the
/// suites wait on child processes, so two share 2 cores well).
fn test_jobs() -> usize {
    std::env::var("OSCONTENT_TEST_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}
