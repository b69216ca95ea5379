//! The system packages the project needs, in one place: `.ci/run`, `cargo
//! xtask test` and `cargo xtask demo` all install from this list, so a fresh
//! Debian 12 machine needs nothing by hand.

use anyhow::{bail, Context, Result};
use std::process::Command;

/// Debian packages, each with why it is here.
pub const PACKAGES: &[(&str, &str)] = &[
    ("libostree-dev", "the ostree crate links libostree 2022.7"),
    ("libglib2.0-dev", "glib/gio for the ostree crate"),
    ("pkg-config", "locating libostree, glib and nettle"),
    (
        "clang",
        "sequoia-openpgp's nettle backend generates bindings",
    ),
    ("nettle-dev", "sequoia-openpgp crypto-nettle backend"),
    (
        "ostree",
        "the stock client and independent verifier in tests",
    ),
    (
        "gnupg",
        "cross-checks sequoia signatures; ostree's gpgme backend",
    ),
    ("curl", "raw HTTP probes in tests"),
    ("umoci", "builds OCI image layouts of the fixtures"),
    ("skopeo", "pushes fixture images to the test registry"),
    (
        "docker-registry",
        "a real OCI distribution registry on loopback",
    ),
    ("apache2-utils", "htpasswd for registry basic auth"),
    (
        "python3-venv",
        "check-deploy installs checkov from PyPI into a venv",
    ),
    (
        "openssl",
        "a throwaway CA and TLS certificate for the deploy test's registry",
    ),
    ("fio", "the latency-sensitive neighbour in I/O benchmarks"),
    (
        "iproute2",
        "ip netns and veth pairs for the air-gap (mirror) e2e suite",
    ),
    (
        "etcd-server",
        "a real etcd as an optional benchmark neighbour",
    ),
    (
        "libzstd-dev",
        "the zstd crate's system libzstd (pkg-config): the server's zstd layers, the suites', and ostree-ext's in xtask/encapsulate",
    ),
    ("libssl-dev", "ostree-ext's openssl in xtask/encapsulate"),
    (
        "nghttp2-client",
        "h2load, the load generator of `bench serve`",
    ),
    (
        "ostree-tests",
        "ostree-trivial-httpd, stock ostree's test server, in `bench serve`",
    ),
    (
        "nginx",
        "the HTTP peer: deploy/object-cache's cache in the deploy suite, the anchor of `bench serve` and `bench fleet`",
    ),
    (
        "xfsprogs",
        "isolated XFS filesystems on loop devices for benchmarks",
    ),
];

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

/// Packages from [`PACKAGES`] that are not installed.
pub fn missing() -> Vec<&'static str> {
    PACKAGES
        .iter()
        .map(|(p, _)| *p)
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
/// missing (a fresh machine): the fuzz targets need it, and a build of it
/// takes under a minute.
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
