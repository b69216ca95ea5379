//! Signing helpers for the suites: keys and bundles made with the real
//! `oscontent-server keygen` / `sign` binaries, signed ostree remotes, and
//! what a repo's refs point at.

use crate::{check_output, local_only, server_bin, Ostree, OSTREE_TIMEOUT};
use anyhow::{ensure, Context, Result};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Bound on one `keygen` or `sign` run (RSA-4096 generation in a debug
/// build is the slow case).
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// A key made by `oscontent-server keygen`.
#[derive(Debug, Clone)]
pub struct Key {
    pub secret: PathBuf,
    pub public: PathBuf,
    /// As `keygen` printed it (uppercase hex).
    pub fingerprint: String,
}

/// `oscontent-server ARGS...` with local-only networking, not yet run.
pub fn server_command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = Command::new(server_bin());
    local_only(&mut cmd)
        .env("NO_COLOR", "1")
        .env_remove("REGISTRY_AUTH_FILE")
        .args(args);
    cmd
}

/// `keygen --uid "NAME <NAME@example.com>"` into `dir/NAME.{sec,pub}`.
pub fn keygen(dir: &Path, name: &str, extra: &[&str]) -> Result<Key> {
    std::fs::create_dir_all(dir)?;
    let secret = dir.join(format!("{name}.sec"));
    let public = dir.join(format!("{name}.pub"));
    let out = check_output(
        server_command(["keygen", "--uid", &format!("{name} <{name}@example.com>")])
            .arg("--out-secret")
            .arg(&secret)
            .arg("--out-public")
            .arg(&public)
            .args(extra),
        TOOL_TIMEOUT,
    )?;
    let fingerprint = out.trim().to_owned();
    ensure!(
        fingerprint.len() == 40 && fingerprint.bytes().all(|b| b.is_ascii_hexdigit()),
        "keygen printed {out:?}, not a v4 fingerprint"
    );
    Ok(Key {
        secret,
        public,
        fingerprint,
    })
}

/// `sign SOURCE_ARGS... --key KEY --out OUT`; returns the bundle manifest.
pub fn sign<S: AsRef<OsStr>>(source: &[S], key: &Key, out: &Path) -> Result<serde_json::Value> {
    check_output(
        server_command(["sign"])
            .args(source)
            .arg("--key")
            .arg(&key.secret)
            .arg("--out")
            .arg(out),
        TOOL_TIMEOUT,
    )?;
    read_manifest(out)
}

/// A bundle's `manifest.json`.
pub fn read_manifest(bundle: &Path) -> Result<serde_json::Value> {
    let p = bundle.join("manifest.json");
    let bytes = std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", p.display()))
}

/// The summary SHA-256 a bundle signs.
pub fn manifest_summary_sha256(m: &serde_json::Value) -> String {
    m["summary_sha256"].as_str().unwrap_or_default().to_owned()
}

/// Adds a remote that verifies commit signatures (and, if asked, the
/// summary's) with `public` as its only trusted key.
pub fn add_signed_remote(
    repo: &Ostree,
    name: &str,
    url: &str,
    public: &Path,
    verify_summary: bool,
) -> Result<()> {
    repo.run([
        "remote".as_ref(),
        "add".as_ref(),
        "--set=gpg-verify=true".as_ref(),
        OsStr::new(&format!("--set=gpg-verify-summary={verify_summary}")),
        OsStr::new(&format!("--gpg-import={}", public.display())),
        name.as_ref(),
        url.as_ref(),
    ])
    .map(drop)
}

/// Points an existing remote at another URL, keeping its keys and options.
pub fn set_remote_url(repo: &Ostree, name: &str, url: &str) -> Result<()> {
    repo.run(["config", "set", &format!("remote \"{name}\".url"), url])
        .map(drop)
}

/// Every ref of a repo (as `ostree refs` names them) and its commit.
pub fn ref_targets(repo: &Ostree) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for r in repo.refs()? {
        let c = repo.rev_parse(&r)?;
        out.insert(r, c);
    }
    Ok(out)
}

/// Copies a repo for one destructive run (`cp -a`).
pub fn fork_repo(src: &Path, dst: &Path) -> Result<Ostree> {
    crate::copy_dir(src, dst)?;
    Ok(Ostree::at(dst))
}

/// Commits `tree` into `repo` as an orphan bound to `bind_ref`, with
/// explicit `version` and `timestamp` (seconds or an ISO date), so that
/// tests control what "newer" means. Returns the checksum.
pub fn commit_tree(
    repo: &Ostree,
    tree: &Path,
    bind_ref: &str,
    version: &str,
    timestamp: &str,
    parent: Option<&str>,
) -> Result<String> {
    let mut args = vec![
        "commit".to_owned(),
        "--orphan".into(),
        "--no-xattrs".into(),
        format!("--tree=dir={}", tree.display()),
        format!("--bind-ref={bind_ref}"),
        format!("--add-metadata-string=version={version}"),
        format!("--timestamp={timestamp}"),
        format!("--subject={version}"),
    ];
    if let Some(p) = parent {
        args.push(format!("--parent={p}"));
    }
    let c = check_output(&mut repo.command(&args), OSTREE_TIMEOUT)?
        .trim()
        .to_owned();
    ensure!(c.len() == 64, "ostree commit printed {c:?}");
    Ok(c)
}
