//! Helpers: a registry inside a namespace, the server binary inside one,
//! mirror runs and their JSON reports, fixture object sets.

use crate::netns::{NetNs, SuiteNs};
use anyhow::{bail, Result};
pub use oscontent_testkit::registry::Registry;
use oscontent_testkit::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Bound on one mirror, sign or skopeo run.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a server may take to publish (an image is streamed first).
pub const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The registry's address inside its namespace (loopback only: nothing
/// outside that namespace can reach it).
pub const REGISTRY: &str = "127.0.0.1:5000";

/// `oscontent-server ARGS...` inside `ns`.
pub fn server(ns: &NetNs) -> Command {
    let mut c = ns.exec(server_bin());
    c.env("NO_COLOR", "1").env_remove("REGISTRY_AUTH_FILE");
    c
}

/// Runs a command that must succeed; its stdout.
pub fn ok(cmd: &mut Command) -> String {
    check_output(cmd, TOOL_TIMEOUT).unwrap_or_else(|e| panic!("{e:#}"))
}

/// A `docker-registry` on loopback inside `ns`, storage in a tempdir.
pub fn ns_registry(ns: &NetNs) -> Registry {
    Registry::builder()
        .netns(&ns.name, REGISTRY)
        .start()
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// Pushes a fixture release as `os:VERSION` (from inside the registry's
/// namespace); the image reference.
pub fn push_release(registry: &Registry, r: &Release) -> String {
    registry.push_release(r, &format!("os:{}", r.version), &[])
}

/// A server inside a namespace, listening where it was told.
pub struct NsServer {
    pub proc: ServerProcess,
    pub url: String,
    _state: tempfile::TempDir,
}

impl NsServer {
    /// `serve ARGS... --listen ADDR --state-dir (fresh)`; waits for the
    /// `listening on` line only.
    pub fn spawn(ns: &NetNs, listen: &str, args: &[&str]) -> Result<NsServer> {
        let state = tempdir();
        let proc = ServerProcess::spawn(
            server(ns)
                .arg("serve")
                .args(args)
                .args(["--listen", listen, "--max-backoff", "2"])
                .arg("--state-dir")
                .arg(state.path()),
            READY_TIMEOUT,
        )?;
        let url = proc.url.clone();
        Ok(NsServer {
            proc,
            url,
            _state: state,
        })
    }

    /// Spawns and waits until `/readyz` answers 200 (from inside `ns`).
    pub fn ready(ns: &NetNs, listen: &str, args: &[&str]) -> NsServer {
        let s = Self::spawn(ns, listen, args).unwrap_or_else(|e| panic!("{e:#}"));
        s.wait_ready(ns);
        s
    }

    pub fn wait_ready(&self, ns: &NetNs) {
        ns.wait_http(&format!("{}/readyz", self.url), READY_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e:#}\nserver stderr:\n{}", self.proc.stderr()));
    }
}

/// `oscontent-server mirror SRC DEST ARGS...` inside `ns`, to completion;
/// its JSON report.
pub fn mirror(ns: &NetNs, src: &str, dest: &str, args: &[&str]) -> serde_json::Value {
    let out = ok(server(ns).args(["mirror", src, dest]).args(args));
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("mirror report {out:?}: {e}"))
}

/// A mirror expected to fail: its stderr.
pub fn mirror_fails(ns: &NetNs, src: &str, dest: &str, args: &[&str]) -> String {
    let o = run_bounded(
        server(ns).args(["mirror", src, dest]).args(args),
        TOOL_TIMEOUT,
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        !o.status.success(),
        "mirror {src} {dest} succeeded; expected a refusal"
    );
    strip_ansi(&String::from_utf8_lossy(&o.stderr))
}

pub fn u64_of(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("report has no number {key:?}: {v}"))
}

/// Object files of a fixture repo: repo-relative path → size.
pub fn object_files(repo: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for d in std::fs::read_dir(repo.join("objects")).unwrap() {
        let d = d.unwrap();
        for f in std::fs::read_dir(d.path()).unwrap() {
            let f = f.unwrap();
            out.insert(
                format!(
                    "objects/{}/{}",
                    d.file_name().to_str().unwrap(),
                    f.file_name().to_str().unwrap()
                ),
                f.metadata().unwrap().len(),
            );
        }
    }
    out
}

/// Objects (and bytes) in `new` but not in `old`.
pub fn new_objects(old: &Path, new: &Path) -> (u64, u64) {
    let old = object_files(old);
    let fresh: Vec<u64> = object_files(new)
        .into_iter()
        .filter(|(p, _)| !old.contains_key(p))
        .map(|(_, s)| s)
        .collect();
    (fresh.len() as u64, fresh.iter().sum())
}

/// Copies a bundle directory (the "USB stick" handed on).
pub fn copy_bundle(src: &Path, dst: &Path) {
    ok(Command::new("cp").arg("-a").arg(src).arg(dst));
}

/// Flips one byte in the middle of a file.
pub fn flip_byte(path: &Path) {
    let mut b = std::fs::read(path).unwrap();
    let i = b.len() / 2;
    b[i] ^= 0x20;
    std::fs::write(path, b).unwrap();
}

/// The bundle manifest.
pub fn manifest(bundle: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(bundle.join("oscontent-bundle.json")).unwrap()).unwrap()
}

/// A repo with a remote that verifies commits and the summary with only
/// `public` (stock ostree, gpgme).
pub fn node_repo(dir: &Path, url: &str, public: &Path) -> Ostree {
    let repo = Ostree::init(dir, "bare-user").unwrap();
    oscontent_testkit::signing::add_signed_remote(&repo, "site", url, public, true).unwrap();
    repo
}

/// `ostree pull site REF` from inside `ns`; Ok(stdout) or Err(stderr).
pub fn node_pull(ns: &NetNs, repo: &Path, r: &str) -> Result<String> {
    let o = run_bounded(
        ns.exec("ostree")
            .arg(format!("--repo={}", repo.display()))
            .args(["pull", "site", r]),
        OSTREE_TIMEOUT,
    )?;
    if !o.status.success() {
        bail!("{}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// `tempdir()`, as a `PathBuf` kept alive by the returned guard.
pub fn dir() -> (tempfile::TempDir, PathBuf) {
    let t = tempdir();
    let p = t.path().to_path_buf();
    (t, p)
}

/// A minimal static file server on 127.0.0.1 (GET and HEAD of plain files
/// under a root, one request per connection), standing for "any web
/// server": it knows nothing about ostree or bundles.
pub struct StaticServer {
    pub url: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long a static server may run at most.
const STATIC_LIFETIME: Duration = Duration::from_secs(600);

impl StaticServer {
    pub fn start(root: &Path) -> StaticServer {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (flag, root) = (stop.clone(), root.to_path_buf());
        let thread = std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + STATIC_LIFETIME;
            while !flag.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = serve_one(s, &root);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        StaticServer {
            url,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for StaticServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_one(mut s: std::net::TcpStream, root: &Path) -> std::io::Result<()> {
    use std::io::{Read, Write};
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let rel = target
        .split('?')
        .next()
        .unwrap_or("")
        .trim_start_matches('/');
    let safe = !rel.is_empty()
        && rel
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('%'));
    let path = root.join(rel);
    match (method, safe && path.is_file()) {
        ("GET" | "HEAD", true) => {
            let body = std::fs::read(&path)?;
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )?;
            if method == "GET" {
                s.write_all(&body)?;
            }
        }
        _ => s.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )?,
    }
    s.flush()
}
