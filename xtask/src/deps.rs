//! The system packages the project needs. The list is `xtask/packages.txt`,
//! in one place for the shell and for xtask: `.ci/run` starts installing it
//! before xtask is built, and `cargo xtask deps`, `test` and `demo` install
//! whatever is still missing, so a fresh Debian 12 machine needs nothing by
//! hand.

use anyhow::{bail, Context, Result};
use std::process::Command;

const LIST: &str = include_str!("../packages.txt");

/// The Debian packages, each with why it is here: `NAME  REASON` lines of
/// `packages.txt`, blank lines and `#` comments skipped.
pub fn packages() -> impl Iterator<Item = (&'static str, &'static str)> {
    parse(LIST)
}

fn parse(list: &str) -> impl Iterator<Item = (&str, &str)> {
    list.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(char::is_whitespace) {
            Some((name, why)) => (name, why.trim()),
            None => (l, ""),
        })
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).contains("install ok installed")
        })
        .unwrap_or(false)
}

/// Packages from [`packages`] that are not installed.
pub fn missing() -> Vec<&'static str> {
    packages()
        .map(|(p, _)| p)
        .filter(|p| !installed(p))
        .collect()
}

/// The cargo-fuzz release `cargo xtask fuzz` is written against.
pub const CARGO_FUZZ_VERSION: &str = "0.13.1";

/// Installs the Debian packages that are missing (as root, with apt-get,
/// or explains what to run). cargo-fuzz is installed by the fuzz build
/// itself, when it first runs: the default test run does not need it.
pub fn ensure() -> Result<()> {
    ensure_packages()
}

/// Whether `cargo fuzz` runs (any version: one installed by hand is kept).
fn has_cargo_fuzz() -> bool {
    Command::new("cargo-fuzz")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// cargo-fuzz, pinned, from crates.io with its own lock file, only if
/// missing (a fresh machine): the fuzz targets need it. Unoptimised: it only
/// runs cargo and then the fuzzer, and its cold build takes 59 CPU-seconds
/// against 88 in release.
/// At `niceness` when given (an install beside other work).
pub fn ensure_cargo_fuzz(niceness: Option<&str>) -> Result<()> {
    if has_cargo_fuzz() {
        return Ok(());
    }
    eprintln!("xtask: installing cargo-fuzz {CARGO_FUZZ_VERSION}");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = match niceness {
        Some(n) => {
            let mut c = Command::new("nice");
            c.args(["-n", n]).arg(cargo);
            c
        }
        None => Command::new(cargo),
    };
    let status = cmd
        .args([
            "install",
            "--debug",
            "cargo-fuzz",
            "--locked",
            "--version",
            CARGO_FUZZ_VERSION,
        ])
        .status()
        .context("running cargo install cargo-fuzz")?;
    anyhow::ensure!(
        status.success(),
        "cargo install cargo-fuzz failed: {status}"
    );
    anyhow::ensure!(
        has_cargo_fuzz(),
        "cargo-fuzz installed but not on PATH (is ~/.cargo/bin in PATH?)"
    );
    Ok(())
}

/// Installs the missing Debian packages (as root, with apt-get), or
/// explains what to run.
fn ensure_packages() -> Result<()> {
    let missing = missing();
    if missing.is_empty() {
        return Ok(());
    }
    let is_root = rustix::process::geteuid().is_root();
    if !is_root || which("apt-get").is_none() {
        bail!(
            "missing system packages: {}\ninstall them with: sudo apt-get install -y {}",
            missing.join(" "),
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    let update = Command::new("apt-get")
        .args(["update", "-qq"])
        .status()
        .context("running apt-get update")?;
    anyhow::ensure!(update.success(), "apt-get update failed: {update}");
    let status = Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get install")?;
    anyhow::ensure!(
        status.success(),
        "apt-get install {} failed: {status}",
        missing.join(" ")
    );
    let still = self::missing();
    anyhow::ensure!(
        still.is_empty(),
        "still missing after install: {}",
        still.join(" ")
    );
    Ok(())
}

/// The first `name` on PATH.
pub fn which(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_into_names_and_reasons() {
        let cases: &[(&str, &[(&str, &str)])] = &[
            ("", &[]),
            ("# a comment\n\n", &[]),
            ("fio  the neighbour", &[("fio", "the neighbour")]),
            ("  nginx\tthe peer  \n", &[("nginx", "the peer")]),
            ("curl", &[("curl", "")]),
            (
                "a  one\n# b  not this\nc  three",
                &[("a", "one"), ("c", "three")],
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).collect::<Vec<_>>(), *want, "{text:?}");
        }
    }

    /// What `.ci/run` hands apt-get must be names it accepts, each once,
    /// each with its reason.
    #[test]
    fn the_list_is_well_formed() {
        let mut seen = std::collections::BTreeSet::new();
        for (name, why) in packages() {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-.".contains(c)),
                "{name:?} is not a Debian package name"
            );
            assert!(!why.is_empty(), "{name} has no reason");
            assert!(seen.insert(name), "{name} is listed twice");
        }
        for needed in ["libostree-dev", "nettle-dev", "libzstd-dev", "ostree"] {
            assert!(seen.contains(needed), "{needed} is missing");
        }
    }
}
