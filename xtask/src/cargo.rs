//! Running cargo and finding what it built: the leaf every xtask command
//! (tests, demo, benchmarks, deploy checks) shares.

use crate::fixtures;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::Command;

pub use fixtures::target_dir;

/// The directory holding the debug binaries.
pub fn bin_dir() -> PathBuf {
    target_dir().join("debug")
}

/// `cargo ARGS` in the workspace root, not yet run.
pub fn command(args: &[&str]) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(args)
        .current_dir(fixtures::workspace_root())
        .env("OSCONTENT_BIN_DIR", bin_dir());
    cmd
}

/// Runs `cargo ARGS` in the workspace root, failing on a non-zero exit.
pub fn cargo(args: &[&str]) -> Result<()> {
    run(command(args), args)
}

/// Runs `cargo ARGS` with clippy's lints, denied, on every workspace
/// member it compiles (see [`with_lints`]).
pub fn linted(args: &[&str]) -> Result<()> {
    let mut cmd = command(args);
    with_lints(&mut cmd)?;
    run(cmd, args)
}

/// Makes cargo compile workspace members with clippy-driver in place of
/// rustc, which lints and then builds as rustc would: what `cargo clippy`
/// does (RUSTC_WORKSPACE_WRAPPER, and CLIPPY_ARGS for what follows its
/// `--`), but on a real build. `cargo clippy` beside `cargo build`
/// compiled every dependency twice, once for metadata and once for code,
/// which was 2.5 minutes of a cold CI run on 2 cores. Dependencies are
/// shared with builds without lints; workspace members are not (the
/// wrapper is in their hash), so every cargo command of one run must agree.
pub fn with_lints(cmd: &mut Command) -> Result<()> {
    let driver = clippy_driver()?;
    cmd.env("RUSTC_WORKSPACE_WRAPPER", driver)
        .env("CLIPPY_ARGS", clippy_args(&["-D", "warnings"]));
    Ok(())
}

/// cargo-clippy's encoding of the driver's arguments: each one followed by
/// a separator that no argument contains.
fn clippy_args(args: &[&str]) -> String {
    args.iter()
        .map(|a| format!("{a}__CLIPPY_HACKERY__"))
        .collect()
}

/// The toolchain's clippy-driver, beside its rustc.
fn clippy_driver() -> Result<PathBuf> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .context("running rustc --print sysroot")?;
    anyhow::ensure!(
        out.status.success(),
        "rustc --print sysroot failed: {}",
        out.status
    );
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let driver = sysroot.join("bin").join("clippy-driver");
    anyhow::ensure!(
        driver.is_file(),
        "no clippy-driver at {} (rustup component add clippy)",
        driver.display()
    );
    Ok(driver)
}

fn run(mut cmd: Command, args: &[&str]) -> Result<()> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = cmd
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    anyhow::ensure!(
        status.success(),
        "cargo {} failed: {status}",
        args.join(" ")
    );
    Ok(())
}
