//! Where the binaries and the stock tools are, and the shared small fixtures.

use crate::fixtures::{Fixtures, Release};
use anyhow::Result;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

/// Environment variable naming the directory that holds the binaries.
pub const BIN_DIR_ENV: &str = "OSCONTENT_BIN_DIR";

const BUILD_HINT: &str = "run `cargo build --workspace --bins` or `cargo xtask test`";

/// The directory holding `oscontent-server` and `oscontent`.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    // target/<profile>/deps/<test-exe>: the binaries are in target/<profile>.
    let exe = std::env::current_exe().expect("current test executable");
    let deps = exe.parent().expect("test executable has a directory");
    if deps.file_name() == Some(OsStr::new("deps")) {
        deps.parent().expect("deps has a parent").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

fn binary(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} not found ({}): {BUILD_HINT}",
        p.display(),
        if std::env::var_os(BIN_DIR_ENV).is_some() {
            format!("${BIN_DIR_ENV} is set")
        } else {
            format!("set ${BIN_DIR_ENV} to use binaries from elsewhere")
        }
    );
    warn_if_stale(&p);
    p
}

/// Warns (once per binary) when the sources are newer than the binary: the
/// tests would then exercise old code.
fn warn_if_stale(bin: &Path) {
    static WARNED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
    if !WARNED.lock().unwrap().insert(bin.to_path_buf()) {
        return;
    }
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return;
    };
    let root = crate::fixtures::workspace_root();
    let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
    for dir in ["server/src", "client/src"] {
        let mut stack = vec![root.join(dir)];
        let mut budget = 10_000;
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                budget -= 1;
                if budget == 0 {
                    return;
                }
                let p = e.path();
                let Ok(m) = e.metadata() else { continue };
                if m.is_dir() {
                    stack.push(p);
                } else if let Ok(t) = m.modified() {
                    if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                        newest = Some((t, p));
                    }
                }
            }
        }
    }
    if let Some((t, p)) = newest {
        if t > built {
            eprintln!(
                "warning: {} is older than {}; the tests run the old binary ({BUILD_HINT})",
                bin.display(),
                p.display()
            );
        }
    }
}

/// Path of `oscontent-server`.
pub fn server_bin() -> PathBuf {
    binary("oscontent-server")
}

/// `oscontent-server mirror URL bundle:DIR`, bounded by `timeout`: its
/// output, and its stderr with colours stripped (what the tests read).
pub fn mirror_to_bundle(
    url: &str,
    bundle: &Path,
    timeout: std::time::Duration,
) -> (std::process::Output, String) {
    let o = crate::process::run_bounded(
        Command::new(server_bin())
            .env("NO_COLOR", "1")
            .args(["mirror", url])
            .arg(format!("bundle:{}", bundle.display())),
        timeout,
    )
    .unwrap_or_else(|e| panic!("oscontent-server mirror {url}: {e:#}"));
    let err = crate::process::strip_ansi(&String::from_utf8_lossy(&o.stderr));
    (o, err)
}

/// Path of the `oscontent` client.
pub fn client_bin() -> PathBuf {
    binary("oscontent")
}

/// Panics with an install hint unless the `ostree` CLI runs. Tests never
/// skip silently.
pub fn require_ostree() {
    static CHECK: OnceLock<Result<String, String>> = OnceLock::new();
    let r = CHECK.get_or_init(|| {
        let out = Command::new("ostree")
            .arg("--version")
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
            Ok(o) => Err(format!(
                "`ostree --version` failed: {}",
                String::from_utf8_lossy(&o.stderr)
            )),
            Err(e) => Err(format!("cannot run `ostree`: {e}")),
        }
    });
    if let Err(e) = r {
        panic!("{e}\nthe end-to-end tests need the stock ostree CLI: `apt-get install ostree` (Debian 12 ships 2022.7)");
    }
}

/// The small fixtures (v1, v2), built on first use and shared read-only by
/// every test. Never modify anything under them: copy first.
pub fn fixtures() -> &'static Fixtures {
    static F: OnceLock<Fixtures> = OnceLock::new();
    F.get_or_init(|| {
        require_ostree();
        let f = crate::fixtures::small().unwrap_or_else(|e| {
            panic!("building the small fixtures (`cargo xtask fixtures`): {e:#}")
        });
        assert_eq!(f.releases.len(), 2, "fixtures must have v1 and v2: {f:?}");
        f
    })
}

pub fn v1() -> &'static Release {
    &fixtures().releases[0]
}

pub fn v2() -> &'static Release {
    &fixtures().releases[1]
}

/// The ref bound into every fixture commit.
pub fn fixture_ref() -> &'static str {
    &fixtures().spec.ref_name
}

/// A fresh temporary directory (removed on drop).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("oscontent-e2e-")
        .tempdir()
        .expect("creating a temporary directory")
}
