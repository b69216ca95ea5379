//! Harness for the end-to-end suites: run the real `oscontent-server` and
//! `oscontent` binaries and the stock `ostree` CLI against each other.
//!
//! Everything here is bounded: every wait has a deadline and every read a
//! size limit, and all traffic goes to 127.0.0.1. Helpers return
//! `anyhow::Result` with the child's stderr in the error, so a failing test
//! says why.
//!
//! Binaries are found in `$OSCONTENT_BIN_DIR`, else in the `target/<profile>`
//! directory the test executable was built into. Build them first with
//! `cargo build --workspace --bins` (or run `cargo xtask test`).

use anyhow::{anyhow, bail, ensure, Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

pub mod fixtures;
pub use fixtures::{Fixtures, Release};

pub mod oci;
pub mod proxy;
pub mod registry;
pub mod signing;

/// Environment variable naming the directory that holds the binaries.
pub const BIN_DIR_ENV: &str = "OSCONTENT_BIN_DIR";
/// How long a server may take to print its address and become ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Default bound for one `ostree` invocation (a full small pull takes
/// seconds; this only stops a hung test).
pub const OSTREE_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on bytes read from one HTTP response or one child's output.
pub const MAX_READ: usize = 256 << 20;
/// Bytes planted in files outside served repos; no response may contain them.
pub const SECRET_MARKER: &str = "OSCONTENT-E2E-SECRET-d0d1d2d3";

const BUILD_HINT: &str = "run `cargo build --workspace --bins` or `cargo xtask test`";

// ---------------------------------------------------------------------------
// Binaries and tools
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Bounded child processes
// ---------------------------------------------------------------------------

/// Removes proxy settings so that nothing but 127.0.0.1 is ever contacted.
pub fn local_only(cmd: &mut Command) -> &mut Command {
    for v in [
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
    ] {
        cmd.env_remove(v);
    }
    cmd.env("no_proxy", "*")
        .env("NO_PROXY", "*")
        .env("LC_ALL", "C.UTF-8")
}

fn drain<R: Read + Send + 'static>(r: R) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.take(MAX_READ as u64).read_to_end(&mut buf);
        buf
    })
}

/// Runs `cmd` to completion within `timeout`; kills it and fails after.
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning {what}"))?;
    let out = drain(child.stdout.take().expect("piped"));
    let err = drain(child.stderr.take().expect("piped"));
    let status = poll(timeout, || child.try_wait())?;
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => bail!(
            "{what} did not finish within {timeout:?}; killed.\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// Output of a command that must succeed; the error carries its stderr.
pub fn check_output(cmd: &mut Command, timeout: Duration) -> Result<String> {
    let what = format!("{cmd:?}");
    let o = run_bounded(cmd, timeout)?;
    ensure!(
        o.status.success(),
        "{what} failed ({}):\nstderr:\n{}\nstdout:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Strips ANSI colour escapes from log text.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------
// ostree CLI
// ---------------------------------------------------------------------------

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

/// Object kinds, normalised across repo modes (`.file` and `.filez` are
/// both content).
pub const CONTENT: &str = "content";

/// Objects of a repo: kind (`commit`, `dirtree`, `dirmeta`, `content`,
/// `commitmeta`, ...) to checksums.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectSet(pub BTreeMap<String, BTreeSet<String>>);

impl ObjectSet {
    pub fn get(&self, kind: &str) -> BTreeSet<String> {
        self.0.get(kind).cloned().unwrap_or_default()
    }

    pub fn contains(&self, kind: &str, checksum: &str) -> bool {
        self.0.get(kind).is_some_and(|s| s.contains(checksum))
    }

    pub fn len(&self) -> usize {
        self.0.values().map(BTreeSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Normalises an object file extension to a kind.
pub fn object_kind(ext: &str) -> &str {
    match ext {
        "file" | "filez" => CONTENT,
        other => other,
    }
}

/// Lists `objects/XX/*.EXT` of a repo directory without the ostree CLI (so
/// that shared fixtures are never opened by a tool that may write).
pub fn list_objects(repo: &Path) -> Result<ObjectSet> {
    let mut set = ObjectSet::default();
    let objects = repo.join("objects");
    for d in
        std::fs::read_dir(&objects).with_context(|| format!("listing {}", objects.display()))?
    {
        let d = d?;
        let prefix = d.file_name().to_string_lossy().into_owned();
        if prefix.len() != 2 || !d.file_type()?.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(d.path())? {
            let f = f?;
            let name = f.file_name().to_string_lossy().into_owned();
            let Some((rest, ext)) = name.split_once('.') else {
                continue;
            };
            if rest.len() != 62 {
                continue;
            }
            set.0
                .entry(object_kind(ext).to_owned())
                .or_default()
                .insert(format!("{prefix}{rest}"));
        }
    }
    Ok(set)
}

/// Path of an object file in an archive repo.
pub fn object_path(repo: &Path, checksum: &str, ext: &str) -> PathBuf {
    repo.join("objects")
        .join(&checksum[..2])
        .join(format!("{}.{ext}", &checksum[2..]))
}

/// The URL path of an object.
pub fn object_url_path(checksum: &str, ext: &str) -> String {
    format!("/objects/{}/{}.{ext}", &checksum[..2], &checksum[2..])
}

/// The largest `.filez` object of an archive repo: (checksum, size).
pub fn largest_filez(repo: &Path) -> Result<(String, u64)> {
    let objs = list_objects(repo)?;
    objs.get(CONTENT)
        .into_iter()
        .map(|c| {
            let len = std::fs::metadata(object_path(repo, &c, "filez"))
                .map(|m| m.len())
                .unwrap_or(0);
            (c, len)
        })
        .max_by_key(|(_, l)| *l)
        .ok_or_else(|| anyhow!("{} has no content objects", repo.display()))
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

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

/// `cp -a SRC DST` (DST must not exist). Use it before planting anything in
/// a fixture repo: the shared fixtures are read-only.
pub fn copy_dir(src: &Path, dst: &Path) -> Result<()> {
    ensure!(!dst.exists(), "{} already exists", dst.display());
    check_output(
        Command::new("cp")
            .arg("-a")
            .arg("--reflink=auto")
            .arg(src)
            .arg(dst),
        Duration::from_secs(300),
    )?;
    Ok(())
}

/// A recursive listing of a tree with everything a write would change:
/// type, mode, size, mtime, ctime, inode and symlink target. Symlinks are
/// listed, never followed.
pub type Snapshot = BTreeMap<String, String>;

pub fn snapshot(root: &Path) -> Result<Snapshot> {
    const MAX_ENTRIES: usize = 1_000_000;
    let mut out = Snapshot::new();
    let mut stack = vec![PathBuf::new()];
    let describe = |p: &Path, m: &std::fs::Metadata| -> String {
        let ft = m.file_type();
        let kind = if ft.is_dir() {
            "dir"
        } else if ft.is_file() {
            "file"
        } else if ft.is_symlink() {
            "symlink"
        } else {
            "other"
        };
        let target = if ft.is_symlink() {
            std::fs::read_link(p)
                .map(|t| t.display().to_string())
                .unwrap_or_default()
        } else {
            String::new()
        };
        format!(
            "{kind} mode={:o} size={} mtime={}.{:09} ctime={}.{:09} ino={} {target}",
            m.mode(),
            if ft.is_dir() { 0 } else { m.len() },
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
            m.ino()
        )
    };
    let top =
        std::fs::symlink_metadata(root).with_context(|| format!("stat {}", root.display()))?;
    out.insert(".".into(), describe(root, &top));
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        for e in std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e?;
            let r = rel.join(e.file_name());
            let p = root.join(&r);
            let m = std::fs::symlink_metadata(&p)?;
            if m.is_dir() {
                stack.push(r.clone());
            }
            out.insert(r.display().to_string(), describe(&p, &m));
            ensure!(
                out.len() <= MAX_ENTRIES,
                "{} has more than {MAX_ENTRIES} entries",
                root.display()
            );
        }
    }
    Ok(out)
}

/// Differences between two snapshots, for assertion messages ("" if none).
pub fn snapshot_diff(before: &Snapshot, after: &Snapshot) -> String {
    let mut lines = Vec::new();
    for (k, v) in before {
        match after.get(k) {
            None => lines.push(format!("- removed {k}: {v}")),
            Some(w) if w != v => {
                lines.push(format!("~ changed {k}:\n    before {v}\n    after  {w}"))
            }
            _ => {}
        }
    }
    for (k, v) in after {
        if !before.contains_key(k) {
            lines.push(format!("+ added {k}: {v}"));
        }
    }
    let n = lines.len();
    lines.truncate(30);
    if n > 30 {
        lines.push(format!("... and {} more", n - 30));
    }
    lines.join("\n")
}

/// Asserts that nothing under `root` changed since `before`.
pub fn assert_unchanged(root: &Path, before: &Snapshot, what: &str) {
    let after = snapshot(root).unwrap_or_else(|e| panic!("{e:#}"));
    let diff = snapshot_diff(before, &after);
    assert!(
        diff.is_empty(),
        "{what}: {} was written:\n{diff}",
        root.display()
    );
}

/// Writes a file outside any served tree with the secret marker in it.
pub fn plant_secret(path: &Path) -> Result<()> {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p)?;
    }
    std::fs::write(path, format!("root:x:0:0:{SECRET_MARKER}:/root:/bin/sh\n"))?;
    Ok(())
}

/// Whether `haystack` contains a secret: the marker, or bytes of the host's
/// `/etc/passwd`.
pub fn leaks_secret(haystack: &[u8]) -> bool {
    fn contains(h: &[u8], n: &[u8]) -> bool {
        !n.is_empty() && h.windows(n.len()).any(|w| w == n)
    }
    if contains(haystack, SECRET_MARKER.as_bytes()) || contains(haystack, b"root:x:0:0") {
        return true;
    }
    if let Ok(passwd) = std::fs::read("/etc/passwd") {
        if let Some(first) = passwd.split(|b| *b == b'\n').next() {
            if first.len() > 8 && contains(haystack, first) {
                return true;
            }
        }
    }
    false
}

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

/// One `oscontent-server serve` under test: own state dir and access log,
/// stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    status: Option<ExitStatus>,
    pub url: String,
    pub addr: SocketAddr,
    pub state_dir: PathBuf,
    pub access_log: PathBuf,
    stderr: Arc<Mutex<Vec<u8>>>,
    _tmp: tempfile::TempDir,
}

/// Arguments for [`Server`].
#[derive(Debug, Clone)]
pub struct ServerBuilder {
    source: Vec<OsString>,
    extra: Vec<OsString>,
    state_dir: Option<PathBuf>,
    /// Environment changes: `Some` sets, `None` removes.
    env: Vec<(OsString, Option<OsString>)>,
    /// Run exactly `oscontent-server SOURCE...` in an empty environment
    /// plus `env` ([`Server::verbatim`]).
    verbatim: bool,
}

impl ServerBuilder {
    /// Adds one argument after the source.
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.extra.push(a.as_ref().to_owned());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.extra
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Uses this state dir instead of a fresh temporary one.
    pub fn state_dir(mut self, d: &Path) -> Self {
        self.state_dir = Some(d.to_path_buf());
        self
    }

    /// Sets an environment variable for the server.
    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.env
            .push((k.as_ref().to_owned(), Some(v.as_ref().to_owned())));
        self
    }

    /// Removes an environment variable for the server.
    pub fn env_remove(mut self, k: impl AsRef<OsStr>) -> Self {
        self.env.push((k.as_ref().to_owned(), None));
        self
    }

    fn command(&self, tmp: &Path) -> (Command, PathBuf, PathBuf) {
        let state = self.state_dir.clone().unwrap_or_else(|| tmp.join("state"));
        let log = tmp.join("access.log");
        if self.verbatim {
            let mut cmd = Command::new(server_bin());
            cmd.env_clear().args(&self.source);
            for (k, v) in &self.env {
                if let Some(v) = v {
                    cmd.env(k, v);
                }
            }
            return (cmd, state, log);
        }
        let mut cmd = Command::new(server_bin());
        local_only(&mut cmd);
        cmd.arg("serve")
            .args(&self.source)
            .arg("--state-dir")
            .arg(&state)
            .args(["--listen", "127.0.0.1:0"])
            .arg("--access-log")
            .arg(&log)
            .args(&self.extra)
            .env("NO_COLOR", "1")
            .env_remove("OSCONTENT_STATE_DIR")
            .env_remove("OSCONTENT_LISTEN");
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        (cmd, state, log)
    }

    /// Starts the server and waits until `/readyz` answers 200.
    pub fn start(self) -> Result<Server> {
        let mut server = self.spawn()?;
        server.wait_ready(START_TIMEOUT)?;
        Ok(server)
    }

    /// Starts the server and waits only for its `listening on` line, not
    /// for `/readyz` (image sources are fetched after the server listens).
    pub fn spawn(self) -> Result<Server> {
        let tmp = tempdir();
        let (mut cmd, state_dir, access_log) = self.command(tmp.path());
        let what = format!("{cmd:?}");
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning {what}"))?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        {
            let sink = stderr.clone();
            let mut err = child.stderr.take().expect("piped");
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                loop {
                    match err.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let mut s = sink.lock().unwrap();
                            if s.len() < MAX_READ {
                                s.extend_from_slice(&buf[..n]);
                            }
                        }
                    }
                }
            });
        }
        let (tx, rx) = mpsc::channel::<String>();
        {
            let out = child.stdout.take().expect("piped");
            std::thread::spawn(move || {
                let mut lines = BufReader::new(out).lines();
                if let Some(Ok(first)) = lines.next() {
                    let _ = tx.send(first);
                }
                // Keep draining so the server never blocks on stdout.
                for _ in lines.by_ref() {}
            });
        }
        let mut server = Server {
            child: Some(child),
            status: None,
            url: String::new(),
            addr: "127.0.0.1:0".parse().expect("addr"),
            state_dir,
            access_log,
            stderr,
            _tmp: tmp,
        };
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(l) => l,
            Err(_) => {
                let status = server.wait_exit(Duration::from_secs(2)).ok().flatten();
                bail!(
                    "{what} did not print its address within {START_TIMEOUT:?} (exit: {status:?}).\nstderr:\n{}",
                    server.stderr()
                );
            }
        };
        let url = line
            .strip_prefix("listening on ")
            .ok_or_else(|| {
                anyhow!(
                    "unexpected first stdout line {line:?}; stderr:\n{}",
                    server.stderr()
                )
            })?
            .trim()
            .to_owned();
        let addr: SocketAddr = url
            .strip_prefix("http://")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| anyhow!("cannot parse the address in {line:?}"))?;
        ensure!(
            addr.ip().is_loopback(),
            "server listens on {addr}, not on loopback"
        );
        server.url = url;
        server.addr = addr;
        Ok(server)
    }

    /// Runs the server expecting it to refuse to start: returns its exit
    /// status and stderr. Fails if it starts serving instead.
    pub fn start_expect_failure(self) -> Result<Refusal> {
        let tmp = tempdir();
        let (mut cmd, _, _) = self.command(tmp.path());
        let what = format!("{cmd:?}");
        let o = run_bounded(&mut cmd, Duration::from_secs(60))
            .with_context(|| format!("{what} was expected to refuse to start"))?;
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        let stderr = strip_ansi(&String::from_utf8_lossy(&o.stderr));
        ensure!(
            !o.status.success(),
            "{what} exited successfully; expected a refusal.\nstderr:\n{stderr}"
        );
        ensure!(
            !stdout.contains("listening on"),
            "{what} started listening: {stdout}"
        );
        Ok(Refusal {
            status: o.status,
            stderr,
        })
    }
}

/// How a server refused to start.
#[derive(Debug)]
pub struct Refusal {
    pub status: ExitStatus,
    pub stderr: String,
}

impl Refusal {
    /// The `error: ...` lines.
    pub fn error(&self) -> String {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("error"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Server {
    /// `serve --oscontainer DIR`.
    pub fn oscontainer(dir: &Path) -> ServerBuilder {
        ServerBuilder {
            source: vec!["--oscontainer".into(), dir.into()],
            extra: Vec::new(),
            state_dir: None,
            env: Vec::new(),
            verbatim: false,
        }
    }

    /// `serve --repo DIR`.
    pub fn repo(dir: &Path) -> ServerBuilder {
        ServerBuilder {
            source: vec!["--repo".into(), dir.into()],
            extra: Vec::new(),
            state_dir: None,
            env: Vec::new(),
            verbatim: false,
        }
    }

    /// `serve --image REF [--image REF]...`. `REGISTRY_AUTH_FILE` is
    /// removed from the environment (set it with [`ServerBuilder::env`]).
    pub fn images<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(refs: I) -> ServerBuilder {
        let mut source = Vec::new();
        for r in refs {
            source.push(OsString::from("--image"));
            source.push(r.as_ref().to_owned());
        }
        ServerBuilder {
            source,
            extra: Vec::new(),
            state_dir: None,
            env: vec![("REGISTRY_AUTH_FILE".into(), None)],
            verbatim: false,
        }
    }

    /// `oscontent-server ARGS...` exactly (the first is the subcommand): no
    /// state dir, listen address or access log is added, and the
    /// environment is only `env`. ARGS must make it listen on loopback
    /// port 0 and print its address; [`ServerBuilder::state_dir`] only
    /// tells the harness where the state dir is.
    pub fn verbatim<I, S>(args: I, env: &[(String, String)]) -> ServerBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        ServerBuilder {
            source: args.into_iter().map(|a| a.as_ref().to_owned()).collect(),
            extra: Vec::new(),
            state_dir: None,
            env: env
                .iter()
                .map(|(k, v)| (OsString::from(k), Some(OsString::from(v))))
                .collect(),
            verbatim: true,
        }
    }

    /// Serves a fixture release's oscontainer with default settings.
    pub fn release(r: &Release) -> Server {
        Self::oscontainer(&r.oscontainer)
            .start()
            .unwrap_or_else(|e| panic!("starting the server: {e:#}"))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `url` + `path`.
    pub fn url_for(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// What the server wrote to stderr so far (colours stripped).
    pub fn stderr(&self) -> String {
        strip_ansi(&String::from_utf8_lossy(&self.stderr.lock().unwrap()))
    }

    /// Waits until `/readyz` answers 200, at most `timeout`; fails if the
    /// server exits first.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let client = http1();
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        for _ in 0..10_000 {
            if let Some(s) = self.try_status()? {
                bail!(
                    "server exited ({s}) before becoming ready.\nstderr:\n{}",
                    self.stderr()
                );
            }
            match client
                .get(self.url_for("/readyz"))
                .timeout(Duration::from_secs(5))
                .send()
            {
                Ok(r) if r.status() == 200 => return Ok(()),
                Ok(r) => last = format!("HTTP {}", r.status()),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!(
            "server not ready within {timeout:?} (last /readyz: {last}).\nstderr:\n{}",
            self.stderr()
        )
    }

    fn try_status(&mut self) -> Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        let Some(c) = self.child.as_mut() else {
            return Ok(None);
        };
        let s = c.try_wait()?;
        self.status = s;
        Ok(s)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.try_status(), Ok(None))
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn sigterm(&mut self) -> Result<()> {
        self.signal(rustix::process::Signal::TERM)
    }

    /// Sends SIGHUP (check the source now).
    pub fn sighup(&mut self) -> Result<()> {
        self.signal(rustix::process::Signal::HUP)
    }

    /// SIGKILL (no cleanup at all), then reaps the process.
    pub fn sigkill(&mut self) -> Result<ExitStatus> {
        self.signal(rustix::process::Signal::KILL)?;
        self.wait_exit(Duration::from_secs(10))?
            .ok_or_else(|| anyhow!("server still running 10 s after SIGKILL"))
    }

    /// Lines of stderr (colours stripped) that contain `needle`.
    pub fn stderr_lines(&self, needle: &str) -> Vec<String> {
        self.stderr()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until stderr has at least `n` lines containing `needle`,
    /// polling every 10 ms for at most `timeout`; returns those lines.
    /// Fails if the server exits first.
    pub fn wait_stderr_lines(
        &mut self,
        needle: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<String>> {
        let found = poll(timeout, || -> Result<Option<Vec<String>>> {
            let lines = self.stderr_lines(needle);
            if lines.len() >= n {
                return Ok(Some(lines));
            }
            if let Some(s) = self.try_status()? {
                bail!(
                    "server exited ({s}) before logging {n} line(s) with {needle:?}.\nstderr:\n{}",
                    self.stderr()
                );
            }
            Ok(None)
        })?;
        found.ok_or_else(|| {
            anyhow!(
                "no {n} line(s) with {needle:?} on stderr within {timeout:?}.\nstderr:\n{}",
                self.stderr()
            )
        })
    }

    fn signal(&mut self, sig: rustix::process::Signal) -> Result<()> {
        if self.try_status()?.is_some() {
            return Ok(());
        }
        let pid = self.pid().ok_or_else(|| anyhow!("no child"))?;
        let pid =
            rustix::process::Pid::from_raw(pid as i32).ok_or_else(|| anyhow!("bad pid {pid}"))?;
        rustix::process::kill_process(pid, sig).with_context(|| format!("signalling {pid:?}"))?;
        Ok(())
    }

    /// Waits for the process to exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        poll(timeout, || self.try_status())
    }

    /// SIGTERM, then the exit status (SIGKILL and an error after `timeout`).
    pub fn stop(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.sigterm()?;
        if let Some(s) = self.wait_exit(timeout)? {
            return Ok(s);
        }
        self.signal(rustix::process::Signal::KILL)?;
        let _ = self.wait_exit(Duration::from_secs(10));
        bail!(
            "server did not exit within {timeout:?} of SIGTERM; killed.\nstderr:\n{}",
            self.stderr()
        )
    }

    /// Every access-log line so far. A trailing partial line is left out.
    pub fn access_log(&self) -> Result<Vec<AccessEntry>> {
        read_access_log(&self.access_log)
    }

    /// `GET /metrics`, parsed.
    pub fn metrics(&self) -> Result<Metrics> {
        let r = http1().get(self.url_for("/metrics")).send()?;
        ensure!(r.status() == 200, "/metrics: HTTP {}", r.status());
        Metrics::parse(&r.text()?)
    }

    /// GET over HTTP/1.1: status, headers and body.
    pub fn get(&self, path: &str) -> Result<HttpResponse> {
        fetch(&http1(), &self.url_for(path), &[])
    }

    /// GET with extra request headers.
    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Result<HttpResponse> {
        fetch(&http1(), &self.url_for(path), headers)
    }

    /// A raw HTTP/1.1 request (nothing normalises the target).
    pub fn raw(&self, method: &str, target: &str, headers: &[(&str, &str)]) -> Result<RawResponse> {
        raw_request(self.addr, method, target, headers)
    }

    /// The served summary's bytes (must be 200).
    pub fn summary_bytes(&self) -> Result<Vec<u8>> {
        let r = self.get("/summary")?;
        ensure!(r.status == 200, "/summary: HTTP {}", r.status);
        Ok(r.body)
    }

    /// The served summary, parsed.
    pub fn summary(&self) -> Result<oscontent_format::Summary> {
        Ok(oscontent_format::parse_summary(&self.summary_bytes()?)?)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if matches!(c.try_wait(), Ok(None)) {
                if let Some(pid) = rustix::process::Pid::from_raw(c.id() as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
                let exited = poll(Duration::from_secs(10), || c.try_wait());
                if !matches!(exited, Ok(Some(_))) {
                    let _ = c.kill();
                }
            }
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// Access log and metrics
// ---------------------------------------------------------------------------

/// One access-log line.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct AccessEntry {
    pub ts: String,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub bytes: u64,
    pub kind: String,
    pub version: String,
    pub duration_ms: f64,
}

impl AccessEntry {
    /// For object paths: (checksum, extension).
    pub fn object(&self) -> Option<(String, String)> {
        let rest = self.path.strip_prefix("/objects/")?;
        let (prefix, file) = rest.split_once('/')?;
        let (tail, ext) = file.split_once('.')?;
        (prefix.len() == 2 && tail.len() == 62).then(|| (format!("{prefix}{tail}"), ext.to_owned()))
    }
}

/// Parses an access log file.
pub fn read_access_log(path: &Path) -> Result<Vec<AccessEntry>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| {
                format!("{}:{}: not an access-log entry: {l}", path.display(), i + 1)
            })
        })
        .collect()
}

/// The path kinds the server may log.
pub const KINDS: &[&str] = &[
    "config",
    "summary",
    "summary_sig",
    "ref",
    "commit",
    "dirtree",
    "dirmeta",
    "filez",
    "commitmeta",
    "delta",
    "delta_index",
    "health",
    "metrics",
    "other",
];

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed `/metrics` page.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
    /// `# TYPE` lines: metric name to type.
    pub types: BTreeMap<String, String>,
}

impl Metrics {
    /// Parses the Prometheus text exposition format (0.0.4).
    pub fn parse(text: &str) -> Result<Self> {
        let mut m = Metrics::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest
                    .split_once(' ')
                    .ok_or_else(|| anyhow!("line {}: bad TYPE {line}", i + 1))?;
                m.types.insert(name.into(), ty.trim().into());
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            m.samples.push(
                parse_sample(line).with_context(|| format!("metrics line {}: {line:?}", i + 1))?,
            );
        }
        Ok(m)
    }

    /// The sample with exactly these labels.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// Sum over samples whose labels include `filter`.
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && filter
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Samples of one metric.
    pub fn of<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }
}

fn parse_sample(line: &str) -> Result<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => bail!("no value"),
    };
    let mut labels = BTreeMap::new();
    let rest = if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let end;
        loop {
            // key
            let mut key = String::new();
            let mut c = chars.next();
            while let Some((_, ch)) = c {
                if ch == '=' || ch == '}' {
                    break;
                }
                if ch != ',' && !ch.is_whitespace() {
                    key.push(ch);
                }
                c = chars.next();
            }
            match c {
                Some((i, '}')) => {
                    end = i;
                    break;
                }
                Some((_, '=')) => {}
                _ => bail!("unterminated labels"),
            }
            ensure!(
                matches!(chars.next(), Some((_, '"'))),
                "label value must be quoted"
            );
            let mut val = String::new();
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => val.push('\n'),
                        Some((_, c)) => val.push(c),
                        None => bail!("bad escape"),
                    },
                    Some((_, '"')) => break,
                    Some((_, c)) => val.push(c),
                    None => bail!("unterminated label value"),
                }
            }
            labels.insert(key, val);
        }
        &body[end + 1..]
    } else {
        rest
    };
    let value_str = rest
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow!("no value"))?;
    let value = match value_str {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().with_context(|| format!("bad value {v:?}"))?,
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

fn client_builder() -> reqwest::blocking::ClientBuilder {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
}

/// An HTTP/1.1 client (keep-alive).
pub fn http1() -> reqwest::blocking::Client {
    client_builder()
        .http1_only()
        .build()
        .expect("building an HTTP/1.1 client")
}

/// An HTTP/2 client with prior knowledge (h2c).
pub fn http2() -> reqwest::blocking::Client {
    client_builder()
        .http2_prior_knowledge()
        .build()
        .expect("building an HTTP/2 client")
}

/// A response, read in full.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    pub status: u16,
    pub version: reqwest::Version,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// GET `url` with extra headers.
pub fn fetch(
    client: &reqwest::blocking::Client,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse> {
    request(client, reqwest::Method::GET, url, headers)
}

/// Any method.
pub fn request(
    client: &reqwest::blocking::Client,
    method: reqwest::Method,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<HttpResponse> {
    let mut rb = client.request(method.clone(), url);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    let r = rb.send().with_context(|| format!("{method} {url}"))?;
    let status = r.status().as_u16();
    let version = r.version();
    let headers = r.headers().clone();
    let mut body = Vec::new();
    r.take(MAX_READ as u64)
        .read_to_end(&mut body)
        .with_context(|| format!("reading {url}"))?;
    Ok(HttpResponse {
        status,
        version,
        headers,
        body,
    })
}

/// A response read off a raw socket.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub status_line: String,
    pub headers: Vec<(String, String)>,
    /// The decoded body (chunked encoding undone).
    pub body: Vec<u8>,
    /// Everything the server sent.
    pub raw: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request on a fresh connection with `Connection: close` and
/// reads the response to EOF. The target is sent byte for byte.
pub fn raw_request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Result<RawResponse> {
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let raw = raw_exchange(addr, req.as_bytes(), Duration::from_secs(30))?;
    parse_raw_response(&raw, method == "HEAD")
}

/// Writes `request` and reads until the server closes, within `timeout`.
pub fn raw_exchange(addr: SocketAddr, request: &[u8], timeout: Duration) -> Result<Vec<u8>> {
    ensure!(addr.ip().is_loopback(), "refusing to talk to {addr}");
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("connecting {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(request)?;
    let deadline = Instant::now() + timeout;
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        ensure!(
            Instant::now() < deadline,
            "no EOF from {addr} within {timeout:?} (got {} bytes)",
            raw.len()
        );
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                ensure!(
                    raw.len() <= MAX_READ,
                    "response from {addr} over {MAX_READ} bytes"
                );
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            // A reset after the full response is still a response.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !raw.is_empty() => break,
            Err(e) => return Err(e).with_context(|| format!("reading from {addr}")),
        }
    }
    Ok(raw)
}

/// Parses a raw HTTP/1.1 response (one, up to EOF).
pub fn parse_raw_response(raw: &[u8], head_request: bool) -> Result<RawResponse> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            anyhow!(
                "no end of headers in {:?}",
                String::from_utf8_lossy(&raw[..raw.len().min(500)])
            )
        })?;
    let head = std::str::from_utf8(&raw[..end]).context("non-UTF-8 response head")?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default().to_owned();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let rest = &raw[end + 4..];
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked && !head_request {
        dechunk(rest)?
    } else {
        rest.to_vec()
    };
    Ok(RawResponse {
        status,
        status_line,
        headers,
        body,
        raw: raw.to_vec(),
    })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for _ in 0..1_000_000 {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| anyhow!("bad chunk header"))?;
        let size_str = std::str::from_utf8(&b[..eol])?
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        let size = usize::from_str_radix(&size_str, 16)
            .with_context(|| format!("chunk size {size_str:?}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        ensure!(b.len() >= size + 2, "truncated chunk");
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
    bail!("too many chunks")
}

/// Polls `f` every 10 ms until it returns `Some`: bounded in time and in
/// the number of polls.
pub fn poll<T, E>(
    timeout: Duration,
    mut f: impl FnMut() -> std::result::Result<Option<T>, E>,
) -> std::result::Result<Option<T>, E> {
    let interval = Duration::from_millis(10);
    let deadline = Instant::now() + timeout;
    let max_polls = timeout.as_millis() / interval.as_millis() + 2;
    for _ in 0..max_polls {
        if let Some(v) = f()? {
            return Ok(Some(v));
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(interval);
    }
    f()
}

/// Polls `f` every `interval` until it returns `Some`, at most `timeout`.
pub fn wait_for<T>(
    timeout: Duration,
    interval: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    let max_polls = (timeout.as_millis() / interval.as_millis().max(1)) as usize + 2;
    for _ in 0..max_polls {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(interval);
    }
    None
}

/// SHA-256 of bytes, hex.
pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
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
