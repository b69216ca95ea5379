//! The stock `ostree` CLI, and parsing what it prints.

use crate::objects::{list_objects, ObjectSet};
use crate::process::{check_output, local_only, run_bounded};
use crate::tools::{require_ostree, tempdir};
use anyhow::{ensure, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Default bound for one `ostree` invocation (a full small pull takes
/// seconds; this only stops a hung test).
pub const OSTREE_TIMEOUT: Duration = Duration::from_secs(300);

/// `ostree ARGS...`, which must succeed; returns stdout.
pub fn ostree<I, S>(args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    require_ostree();
    let mut cmd = Command::new("ostree");
    local_only(&mut cmd).args(args);
    check_output(&mut cmd, OSTREE_TIMEOUT)
}

/// [`ostree`], panicking with stderr on failure.
pub fn ostree_ok<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    ostree(args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// One local ostree repo, driven through the CLI.
#[derive(Debug, Clone)]
pub struct Ostree {
    pub repo: PathBuf,
}

impl Ostree {
    /// `ostree init --mode=MODE`.
    pub fn init(repo: &Path, mode: &str) -> Result<Self> {
        std::fs::create_dir_all(repo).with_context(|| format!("creating {}", repo.display()))?;
        ostree([
            format!("--repo={}", repo.display()),
            "init".into(),
            format!("--mode={mode}"),
        ])?;
        Ok(Self {
            repo: repo.to_path_buf(),
        })
    }

    /// An existing repo.
    pub fn at(repo: &Path) -> Self {
        Self {
            repo: repo.to_path_buf(),
        }
    }

    /// `ostree --repo=REPO` with local-only networking, not yet run.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        require_ostree();
        let mut cmd = Command::new("ostree");
        local_only(&mut cmd);
        let mut repo = OsString::from("--repo=");
        repo.push(&self.repo);
        cmd.arg(repo).args(args);
        cmd
    }

    /// Runs and returns stdout; fails with stderr.
    pub fn run<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        check_output(&mut self.command(args), OSTREE_TIMEOUT)
    }

    /// Runs and returns the raw output, whatever the exit status.
    pub fn output<I, S>(&self, args: I) -> Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_bounded(&mut self.command(args), OSTREE_TIMEOUT)
    }

    /// `remote add --no-gpg-verify NAME URL [EXTRA...]`.
    pub fn remote_add(&self, name: &str, url: &str, extra: &[&str]) -> Result<()> {
        let mut args = vec!["remote", "add", "--no-gpg-verify"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[name, url]);
        self.run(args).map(drop)
    }

    /// Points an existing remote somewhere else, keeping its options.
    pub fn remote_replace(&self, name: &str, url: &str, extra: &[&str]) -> Result<()> {
        self.run(["remote", "delete", name])?;
        self.remote_add(name, url, extra)
    }

    /// `pull --disable-fsync ARGS...` (fsync only slows tests down).
    pub fn pull(&self, args: &[&str]) -> Result<String> {
        let mut a = vec!["pull", "--disable-fsync"];
        a.extend_from_slice(args);
        self.run(a)
    }

    pub fn rev_parse(&self, r: &str) -> Result<String> {
        Ok(self.run(["rev-parse", r])?.trim().to_owned())
    }

    /// `fsck`, which must report no errors.
    pub fn fsck(&self) -> Result<String> {
        let out = self.run(["fsck"])?;
        ensure!(
            !out.to_lowercase().contains("corrupt"),
            "fsck of {} reports corruption:\n{out}",
            self.repo.display()
        );
        Ok(out)
    }

    /// Refs as `ostree refs` lists them.
    pub fn refs(&self) -> Result<BTreeSet<String>> {
        Ok(self
            .run(["refs"])?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// The objects stored locally, read from the object directory.
    pub fn objects(&self) -> Result<ObjectSet> {
        list_objects(&self.repo)
    }
}

/// Parses `ostree remote summary` / `ostree summary --view` output into
/// ref name to its lines (commit, size, metadata).
pub fn parse_summary_view(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("* ") {
            current = Some(name.trim().to_owned());
            out.entry(name.trim().to_owned()).or_default();
        } else if line.trim().is_empty() {
            current = None;
        } else if let Some(c) = &current {
            out.get_mut(c)
                .expect("inserted")
                .push(line.trim().to_owned());
        }
    }
    out
}

/// Metadata lines after the ref list of `ostree summary --view` output.
pub fn summary_view_metadata(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_ref = false;
    for line in text.lines() {
        if line.starts_with("* ") {
            in_ref = true;
        } else if line.trim().is_empty() {
            in_ref = false;
        } else if !in_ref {
            out.insert(line.trim().to_owned());
        }
    }
    out
}

/// A commit made by [`tiny_repo`].
#[derive(Debug, Clone)]
pub struct TinyCommit<'a> {
    pub version: &'a str,
    /// `--bind-ref`; `None` commits without any `ostree.ref-binding` key
    /// (`--no-bindings`: the CLI otherwise writes an empty binding, which
    /// stock ostree treats as "pullable under no ref").
    pub bind_ref: Option<&'a str>,
    /// Varies the file contents.
    pub seed: u32,
}

/// The ref tiny oscontainers bind their commit to.
pub const TINY_REF: &str = "tiny/x86_64/stable";

/// [`tiny_repo`] with one commit (version `version`, bound to `bind_ref` or
/// to nothing, contents varied by `seed`); returns its checksum.
pub fn tiny_commit(
    repo: &Path,
    version: &str,
    bind_ref: Option<&str>,
    seed: u32,
) -> Result<String> {
    let mut commits = tiny_repo(
        repo,
        &[TinyCommit {
            version,
            bind_ref,
            seed,
        }],
    )?;
    commits.pop().context("tiny_repo made no commit")
}

/// Creates an archive repo at `repo` with orphan commits (no refs, no
/// summary), like an oscontainer's. Returns the commit checksums.
pub fn tiny_repo(repo: &Path, commits: &[TinyCommit<'_>]) -> Result<Vec<String>> {
    let r = Ostree::init(repo, "archive")?;
    let mut out = Vec::new();
    for c in commits {
        let tree = tempdir();
        let t = tree.path();
        std::fs::create_dir_all(t.join("usr/bin"))?;
        std::fs::create_dir_all(t.join("usr/share/doc/tiny"))?;
        std::fs::create_dir_all(t.join("etc"))?;
        std::fs::write(
            t.join("usr/bin/hello"),
            format!("#!/bin/sh\necho hello {}\n", c.seed),
        )?;
        std::fs::set_permissions(
            t.join("usr/bin/hello"),
            std::fs::Permissions::from_mode(0o755),
        )?;
        let doc: String = (0..2000)
            .map(|i| format!("line {i} of release {} seed {}\n", c.version, c.seed))
            .collect();
        std::fs::write(t.join("usr/share/doc/tiny/README"), doc)?;
        std::fs::write(t.join("usr/share/doc/tiny/empty"), b"")?;
        std::fs::write(
            t.join("etc/os-release"),
            format!("VERSION_ID={}\n", c.version),
        )?;
        std::os::unix::fs::symlink("../usr/bin/hello", t.join("etc/hello-link"))?;
        let mut args = vec![
            "commit".to_owned(),
            "--orphan".into(),
            "--no-xattrs".into(),
            format!("--tree=dir={}", t.display()),
            format!("--add-metadata-string=version={}", c.version),
            format!("--subject=tiny {}", c.version),
        ];
        match c.bind_ref {
            Some(b) => args.push(format!("--bind-ref={b}")),
            None => args.push("--no-bindings".into()),
        }
        let checksum = r.run(&args)?.trim().to_owned();
        ensure!(
            checksum.len() == 64,
            "unexpected `ostree commit` output {checksum:?}"
        );
        out.push(checksum);
    }
    Ok(out)
}
