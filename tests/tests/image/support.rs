//! Helpers for the image suite: a real `docker-registry` on loopback,
//! pushes with `skopeo`, hand-written OCI layouts and tar streams for the
//! attacks, a stalling TCP proxy, and the checks every failure must pass.

#![allow(dead_code)]

use oscontent_testkit::*;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const COMMIT_LABEL: &str = "com.coreos.ostree-commit";
pub const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Ref bound into the hand-made images' commits.
pub const TINY_REF: &str = "tiny/x86_64/stable";
/// Bound on one skopeo / gzip / umoci run.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a failing server may take to log an error (one attempt).
pub const ERROR_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a tool, which must succeed, within [`TOOL_TIMEOUT`]; stdout.
pub fn tool(cmd: &mut Command) -> String {
    local_only(cmd);
    check_output(cmd, TOOL_TIMEOUT).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `skopeo --insecure-policy ARGS...`.
pub fn skopeo(args: &[&str]) -> String {
    tool(Command::new("skopeo").arg("--insecure-policy").args(args))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---------------------------------------------------------------------------
// The registry
// ---------------------------------------------------------------------------

/// A `docker-registry serve` on 127.0.0.1 with tempdir storage, killed on
/// drop.
pub struct Registry {
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub creds: Option<(String, String)>,
    child: Child,
}

impl Registry {
    pub fn start() -> Registry {
        Self::start_inner(None, None)
    }

    /// A registry that requires these htpasswd (bcrypt) credentials.
    pub fn start_with_auth(user: &str, pass: &str) -> Registry {
        Self::start_inner(Some((user, pass)), None)
    }

    /// A registry serving HTTPS with this PEM certificate and key (and, if
    /// given, requiring htpasswd credentials).
    pub fn start_tls(cert: &Path, key: &Path, basic: Option<(&str, &str)>) -> Registry {
        Self::start_inner(basic, Some((cert, key)))
    }

    fn start_inner(basic: Option<(&str, &str)>, tls: Option<(&Path, &Path)>) -> Registry {
        let dir = tempdir();
        let auth = match basic {
            Some((u, p)) => {
                let line = tool(Command::new("htpasswd").args(["-Bbn", u, p]));
                let path = dir.path().join("htpasswd");
                std::fs::write(&path, line.trim()).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: e2e\n    path: {}\n",
                    path.display()
                )
            }
            None => String::new(),
        };
        let tls = match tls {
            Some((cert, key)) => format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            ),
            None => String::new(),
        };
        // A port picked here may be taken by the time the registry binds
        // it: a few tries.
        for _ in 0..5 {
            let port = free_port();
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{tls}{auth}",
                    dir.path().join("storage").display()
                ),
            )
            .unwrap();
            let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
            let mut cmd = Command::new("docker-registry");
            local_only(&mut cmd);
            let mut child = cmd
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("docker-registry (Debian package docker-registry) must be installed");
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let deadline = Instant::now() + Duration::from_secs(15);
            for _ in 0..1000 {
                if let Some(status) = child.try_wait().unwrap() {
                    eprintln!("registry exited early ({status}); retrying on another port");
                    break;
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Registry {
                        port,
                        dir,
                        creds: basic.map(|(u, p)| (u.to_owned(), p.to_owned())),
                        child,
                    };
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("registry did not listen on {addr} within 15 s");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("could not start docker-registry");
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `docker://127.0.0.1:PORT/NAME` (NAME is `repo:tag` or
    /// `repo@sha256:...`).
    pub fn image(&self, name: &str) -> String {
        format!("docker://{}/{name}", self.host())
    }

    /// Pushes `oci:LAYOUT:TAG` to `NAME` (`repo:tag`) with skopeo, with
    /// extra copy options (e.g. `--dest-compress-format zstd`).
    pub fn push(&self, layout: &Path, tag: &str, name: &str, extra: &[&str]) {
        let src = format!("oci:{}:{tag}", layout.display());
        let dst = self.image(name);
        let creds = self.creds.as_ref().map(|(u, p)| format!("{u}:{p}"));
        let mut args = vec!["copy", "-q", "--dest-tls-verify=false"];
        if let Some(c) = &creds {
            args.extend(["--dest-creds", c]);
        }
        args.extend_from_slice(extra);
        args.extend([src.as_str(), dst.as_str()]);
        skopeo(&args);
    }

    /// Pushes a fixture release (from the shared fixture layout) as
    /// `name`.
    pub fn push_release(&self, r: &Release, name: &str, extra: &[&str]) {
        self.push(&fixtures().oci_layout, &r.version, name, extra);
    }

    /// The manifest digest of `NAME` as skopeo sees it.
    pub fn digest(&self, name: &str) -> String {
        let creds = self.creds.as_ref().map(|(u, p)| format!("{u}:{p}"));
        let image = self.image(name);
        let mut args = vec!["inspect", "--tls-verify=false", "--format", "{{.Digest}}"];
        if let Some(c) = &creds {
            args.extend(["--creds", c]);
        }
        args.push(&image);
        let d = skopeo(&args).trim().to_owned();
        assert!(
            d.starts_with("sha256:") && d.len() == 71,
            "skopeo digest {d:?}"
        );
        d
    }

    /// The raw manifest for `repo:reference`, as the registry serves it,
    /// and its Docker-Content-Digest header.
    pub fn manifest(&self, repo: &str, reference: &str) -> (Vec<u8>, String) {
        let mut req = http1()
            .get(format!(
                "http://{}/v2/{repo}/manifests/{reference}",
                self.host()
            ))
            .header(
                "Accept",
                format!("{OCI_MANIFEST}, application/vnd.docker.distribution.manifest.v2+json"),
            );
        if let Some((u, p)) = &self.creds {
            req = req.basic_auth(u, Some(p));
        }
        let resp = req.send().unwrap().error_for_status().unwrap();
        let digest = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut body = Vec::new();
        resp.take(MAX_READ as u64).read_to_end(&mut body).unwrap();
        (body, digest)
    }

    /// The manifest, parsed.
    pub fn manifest_json(&self, repo: &str, reference: &str) -> serde_json::Value {
        serde_json::from_slice(&self.manifest(repo, reference).0).unwrap()
    }

    /// Digest of the first layer of `repo:reference`.
    pub fn first_layer(&self, repo: &str, reference: &str) -> String {
        self.manifest_json(repo, reference)["layers"][0]["digest"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Where the registry stores a blob (manifests too) with this digest.
    pub fn blob_data(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A server builder for `refs` from `reg`: plain HTTP to it, and a
/// one-second backoff so that retries show up quickly.
pub fn image_server(reg: &Registry, refs: &[String]) -> ServerBuilder {
    Server::images(refs).args(["--insecure-registry", &reg.host(), "--max-backoff", "1"])
}

/// Flips one byte of a file in place (xor 0xff) at `offset`.
pub fn flip_byte(path: &Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    b[0] ^= 0xff;
    f.write_all_at(&b, offset).unwrap();
    f.sync_all().unwrap();
}

/// Standard base64 (for auth.json).
pub fn base64(input: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Writes a containers auth.json with credentials for `host`.
pub fn write_authfile(path: &Path, host: &str, user: &str, pass: &str) {
    let json = serde_json::json!({
        "auths": { host: { "auth": base64(format!("{user}:{pass}").as_bytes()) } }
    });
    std::fs::write(path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
}

// ---------------------------------------------------------------------------
// Pulling with stock ostree
// ---------------------------------------------------------------------------

/// A fresh bare-user repo with the server as remote `os`; pulls `r` (a
/// ref bound into the commit), checks it resolves to `commit`, and fscks.
pub fn pull_and_fsck(server: &Server, r: &str, commit: &str) -> (tempfile::TempDir, Ostree) {
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    repo.remote_add("os", &server.url, &[]).unwrap();
    repo.pull(&["os", r]).unwrap_or_else(|e| {
        panic!(
            "stock ostree pull of {r}: {e:#}\nserver stderr:\n{}",
            server.stderr()
        )
    });
    assert_eq!(
        repo.rev_parse(&format!("os:{r}")).unwrap(),
        commit,
        "os:{r} points at the image's commit"
    );
    repo.fsck().unwrap();
    (tmp, repo)
}

/// `GET /refs/heads/NAME`: the commit it names (the server must be ready).
pub fn served_ref(server: &Server, name: &str) -> String {
    let r = server.get(&format!("/refs/heads/{name}")).unwrap();
    assert_eq!(r.status, 200, "/refs/heads/{name}");
    String::from_utf8(r.body).unwrap().trim().to_owned()
}

/// Starts (spawns) and waits for `/readyz`, with the stderr in the panic.
pub fn ready(b: ServerBuilder) -> Server {
    let mut s = b.spawn().unwrap_or_else(|e| panic!("{e:#}"));
    s.wait_ready(START_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    s
}

// ---------------------------------------------------------------------------
// What every failure must look like
// ---------------------------------------------------------------------------

/// Names under `dir` (none if it does not exist).
pub fn names(dir: &Path) -> BTreeSet<String> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
        Err(e) => panic!("{}: {e}", dir.display()),
    }
}

/// `staging-*` directories under STATE/images.
pub fn staging_dirs(state: &Path) -> Vec<String> {
    names(&state.join("images"))
        .into_iter()
        .filter(|n| n.starts_with("staging-"))
        .collect()
}

/// Paths that must not be served while no image is verified.
fn unserved_paths(commits: &[&str], refs: &[&str]) -> Vec<String> {
    let mut paths: Vec<String> = ["/summary", "/summary.sig", "/config"]
        .iter()
        .map(|p| (*p).to_owned())
        .collect();
    for r in refs {
        paths.push(format!("/refs/heads/{r}"));
    }
    for c in commits {
        paths.push(object_url_path(c, "commit"));
        paths.push(object_url_path(c, "commitmeta"));
    }
    paths
}

/// Asserts that nothing is served: `/readyz` 503, and every repo path
/// (summary, config, `refs`, the commits' objects) 404 or 503 without the
/// commits in the body.
pub fn assert_nothing_served(server: &Server, commits: &[&str], refs: &[&str]) {
    let r = server.get("/readyz").unwrap();
    assert_eq!(r.status, 503, "/readyz while no image is verified");
    for p in unserved_paths(commits, refs) {
        let r = server.get(&p).unwrap();
        assert!(
            r.status == 404 || r.status == 503,
            "{p} answered {} while no image is verified",
            r.status
        );
        let body = String::from_utf8_lossy(&r.body);
        for c in commits {
            assert!(!body.contains(c), "{p} mentions commit {c}: {body}");
        }
    }
}

/// What STATE/images and STATE/generations held just after the `n`th
/// error line appeared, and whether that sample is conclusive: taken less
/// than [`SAMPLE_WINDOW`] after the line was last seen absent, so well
/// within the one-second backoff, before any retry could create anything.
pub struct Sample {
    pub line: String,
    pub images: BTreeSet<String>,
    pub generations: BTreeSet<String>,
    pub conclusive: bool,
}

/// See [`Sample`]: the retry starts a second after the error is logged.
pub const SAMPLE_WINDOW: Duration = Duration::from_millis(600);

pub fn sample_after_error(server: &mut Server, n: usize) -> Sample {
    let deadline = Instant::now() + ERROR_TIMEOUT;
    let mut absent_at = Instant::now();
    for _ in 0..100_000 {
        let lines = server.stderr_lines(" ERROR ");
        if lines.len() >= n {
            let images = names(&server.state_dir.join("images"));
            let generations = names(&server.state_dir.join("generations"));
            return Sample {
                line: lines[n - 1].clone(),
                images,
                generations,
                conclusive: absent_at.elapsed() < SAMPLE_WINDOW,
            };
        }
        assert!(
            server.is_running(),
            "the server exited instead of logging error {n}:\n{}",
            server.stderr()
        );
        assert!(
            Instant::now() < deadline,
            "no error {n} logged within {ERROR_TIMEOUT:?}:\n{}",
            server.stderr()
        );
        absent_at = Instant::now();
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("no error {n} logged");
}

/// A failing server: for its first error line (or the next one, if this
/// test process was too slow to look within [`SAMPLE_WINDOW`]), asserts
/// that STATE/images and STATE/generations were empty when it was logged
/// (no staging leftovers), that it names every `needle` (and the attempt),
/// that nothing is served, and that nothing but the state dir and the
/// access log appeared next to the state dir; then that another error line
/// follows (the retry). Returns the first error line.
pub fn assert_fails_cleanly(
    server: &mut Server,
    needles: &[&str],
    commits: &[&str],
    refs: &[&str],
) -> String {
    let mut checked = 0;
    for n in 1..=4 {
        let s = sample_after_error(server, n);
        if n == 1 {
            eprintln!("failure as logged: {}", s.line);
        }
        for needle in needles
            .iter()
            .copied()
            .chain([format!("attempt={n}").as_str()])
        {
            assert!(
                s.line.contains(needle),
                "error {n} should mention {needle:?}:\n{}\nstderr:\n{}",
                s.line,
                server.stderr()
            );
        }
        if !s.conclusive {
            eprintln!("error {n} seen too late to sample the state dir; next one");
            continue;
        }
        assert!(
            s.images.is_empty(),
            "after the error {:?}, STATE/images holds {:?} (staging leftovers)",
            s.line,
            s.images
        );
        assert!(
            s.generations.is_empty(),
            "after the error {:?}, STATE/generations holds {:?}",
            s.line,
            s.generations
        );
        checked = n;
        break;
    }
    assert!(
        checked > 0,
        "could not sample the state dir in time after 4 errors"
    );
    assert_nothing_served(server, commits, refs);
    assert_only_state_written(server);
    // It keeps trying, with backoff.
    let again = sample_after_error(server, checked + 1);
    for needle in needles {
        assert!(
            again.line.contains(needle),
            "the retry fails the same way: {}",
            again.line
        );
    }
    assert!(
        server.is_running(),
        "a failed fetch must not stop the server"
    );
    assert_nothing_served(server, commits, refs);
    assert_only_state_written(server);
    server.stderr_lines(" ERROR ")[0].clone()
}

/// Next to the state dir (the harness's own temporary dir) there is only
/// the state dir and the access log.
pub fn assert_only_state_written(server: &Server) {
    let parent = server.state_dir.parent().unwrap();
    let state_name = server
        .state_dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let found = names(parent);
    let allowed: BTreeSet<String> = [state_name, "access.log".to_owned()].into();
    assert!(
        found.is_subset(&allowed),
        "files appeared next to the state dir {}: {:?}",
        server.state_dir.display(),
        found.difference(&allowed).collect::<Vec<_>>()
    );
    // Inside the state dir, only the server's own two directories.
    let top = names(&server.state_dir);
    let allowed: BTreeSet<String> = ["images".to_owned(), "generations".to_owned()].into();
    assert!(
        top.is_subset(&allowed),
        "unexpected entries in the state dir: {top:?}"
    );
}

/// `/etc/passwd`'s bytes and metadata, to compare before and after.
pub fn passwd_state() -> (Vec<u8>, String) {
    let m = std::fs::symlink_metadata("/etc/passwd").unwrap();
    use std::os::unix::fs::MetadataExt;
    (
        std::fs::read("/etc/passwd").unwrap(),
        format!("{} {} {} {}", m.ino(), m.size(), m.mtime(), m.mtime_nsec()),
    )
}

// ---------------------------------------------------------------------------
// Hand-made tar streams, layers and OCI layouts
// ---------------------------------------------------------------------------

/// A ustar stream written byte by byte, so that it can hold what a safe
/// writer refuses (`..`, absolute paths, escaping links, devices).
#[derive(Default)]
pub struct Tar {
    buf: Vec<u8>,
}

fn octal(field: &mut [u8], v: u64) {
    let s = format!("{:0width$o}\0", v, width = field.len() - 1);
    assert_eq!(s.len(), field.len(), "{v} does not fit");
    field.copy_from_slice(s.as_bytes());
}

/// One ustar header.
pub fn tar_header(path: &str, kind: u8, size: u64, link: &str, mode: u32) -> [u8; 512] {
    let mut h = [0u8; 512];
    let (prefix, name) = if path.len() <= 100 {
        ("", path)
    } else {
        let cut = path[..path.len().min(156)]
            .rfind('/')
            .expect("a long path needs a / to split at");
        (&path[..cut], &path[cut + 1..])
    };
    assert!(name.len() <= 100 && prefix.len() <= 155, "path {path:?}");
    assert!(link.len() <= 100, "link {link:?}");
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], u64::from(mode));
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 1_700_000_000);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[265..269].copy_from_slice(b"root");
    h[297..301].copy_from_slice(b"root");
    octal(&mut h[329..337], 0);
    octal(&mut h[337..345], 0);
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// Zero padding after `size` bytes of entry data.
pub fn tar_padding(size: u64) -> usize {
    ((512 - (size % 512)) % 512) as usize
}

impl Tar {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn entry(mut self, path: &str, kind: u8, data: &[u8], link: &str, mode: u32) -> Self {
        self.buf
            .extend_from_slice(&tar_header(path, kind, data.len() as u64, link, mode));
        self.buf.extend_from_slice(data);
        self.buf
            .extend(std::iter::repeat_n(0u8, tar_padding(data.len() as u64)));
        self
    }
    pub fn dir(self, path: &str) -> Self {
        self.entry(path, b'5', b"", "", 0o755)
    }
    pub fn file(self, path: &str, data: &[u8]) -> Self {
        self.entry(path, b'0', data, "", 0o644)
    }
    pub fn symlink(self, path: &str, target: &str) -> Self {
        self.entry(path, b'2', b"", target, 0o777)
    }
    pub fn hardlink(self, path: &str, target: &str) -> Self {
        self.entry(path, b'1', b"", target, 0o644)
    }
    /// A character device (1, 3 is /dev/null).
    pub fn chardev(self, path: &str) -> Self {
        let mut t = self;
        let mut h = tar_header(path, b'3', 0, "", 0o666);
        octal(&mut h[329..337], 1);
        octal(&mut h[337..345], 3);
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        t.buf.extend_from_slice(&h);
        t
    }

    /// A directory tree (directories and regular files only) as `prefix`.
    pub fn tree(mut self, prefix: &str, src: &Path) -> Self {
        self = self.dir(prefix);
        let mut stack = vec![(src.to_path_buf(), prefix.to_owned())];
        let mut budget = 100_000;
        while let Some((dir, name)) = stack.pop() {
            let mut ents: Vec<_> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap())
                .collect();
            ents.sort_by_key(|e| e.file_name());
            for e in ents {
                budget -= 1;
                assert!(budget > 0, "tree too big");
                let ft = e.file_type().unwrap();
                let n = format!("{name}/{}", e.file_name().to_string_lossy());
                if ft.is_dir() {
                    self = self.dir(&n);
                    stack.push((e.path(), n));
                } else if ft.is_file() {
                    self = self.file(&n, &std::fs::read(e.path()).unwrap());
                }
            }
        }
        self
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.buf.extend_from_slice(&[0u8; 1024]);
        self.buf
    }
}

/// `gzip -n` of what `feed` writes (the gzip CLI: no compression crate in
/// this crate's dependencies). Bounded in time.
pub fn gzip_with(
    feed: impl FnOnce(&mut dyn Write) -> std::io::Result<()> + Send + 'static,
) -> Vec<u8> {
    let mut cmd = Command::new("gzip");
    let mut child = local_only(&mut cmd)
        .args(["-n", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("gzip");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let r = feed(&mut stdin);
        drop(stdin);
        r
    });
    let mut out = Vec::new();
    child
        .stdout
        .take()
        .unwrap()
        .take(MAX_READ as u64)
        .read_to_end(&mut out)
        .unwrap();
    writer.join().unwrap().expect("feeding gzip");
    let status = poll(TOOL_TIMEOUT, || child.try_wait()).unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "gzip failed: {status:?}"
    );
    out
}

pub fn gzip(data: Vec<u8>) -> Vec<u8> {
    gzip_with(move |w| w.write_all(&data))
}

/// A layer blob and what the config says about it.
pub struct Layer {
    pub blob: Vec<u8>,
    pub media_type: &'static str,
    /// sha256 of the uncompressed tar.
    pub diff_id: String,
}

impl Layer {
    pub fn gz(tar: Vec<u8>) -> Self {
        let diff_id = format!("sha256:{}", sha256_hex(&tar));
        Self {
            blob: gzip(tar),
            media_type: GZIP,
            diff_id,
        }
    }
}

fn put_blob(layout: &Path, bytes: &[u8]) -> (String, usize) {
    let hex = sha256_hex(bytes);
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(&hex), bytes).unwrap();
    (format!("sha256:{hex}"), bytes.len())
}

/// Writes an OCI image layout at `layout` holding one image tagged `tag`:
/// blobs, config (with `labels`), manifest and index.json, by hand.
/// Returns the manifest digest.
pub fn write_layout(layout: &Path, tag: &str, layers: &[Layer], labels: &[(&str, &str)]) -> String {
    std::fs::create_dir_all(layout).unwrap();
    let mut descs = Vec::new();
    for l in layers {
        let (d, n) = put_blob(layout, &l.blob);
        descs.push(serde_json::json!({"mediaType": l.media_type, "digest": d, "size": n}));
    }
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "2025-01-01T00:00:00Z",
        "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
    }))
    .unwrap();
    let (cd, cn) = put_blob(layout, &config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cn},
        "layers": descs,
    }))
    .unwrap();
    let (md, mn) = put_blob(layout, &manifest);
    std::fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": OCI_MANIFEST,
            "digest": md,
            "size": mn,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    });
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    md
}

/// A hand-made oscontainer: a tiny archive repo (one commit bound to
/// [`TINY_REF`], version `version`) as `srv/repo`, then whatever `extra`
/// appends to the same layer (after the repo, so that the staging dir has
/// content when the bad entry comes).
pub struct Crafted {
    pub work: tempfile::TempDir,
    pub layout: PathBuf,
    pub tag: String,
    pub commit: String,
    pub version: String,
}

pub fn crafted(seed: u32, extra: impl FnOnce(Tar) -> Tar) -> Crafted {
    let work = tempdir();
    let version = format!("1.{seed}");
    let repo = work.path().join("repo");
    let commit = tiny_repo(
        &repo,
        &[TinyCommit {
            version: &version,
            bind_ref: Some(TINY_REF),
            seed,
        }],
    )
    .unwrap()
    .remove(0);
    let tar = extra(Tar::new().dir("srv").tree("srv/repo", &repo)).finish();
    let layout = work.path().join("oci");
    let tag = "crafted".to_owned();
    write_layout(
        &layout,
        &tag,
        &[Layer::gz(tar)],
        &[(COMMIT_LABEL, &commit), ("version", &version)],
    );
    Crafted {
        work,
        layout,
        tag,
        commit,
        version,
    }
}

// ---------------------------------------------------------------------------
// A TCP proxy that stalls after a number of bytes
// ---------------------------------------------------------------------------

/// Forwards 127.0.0.1:port to an upstream; each connection forwards at most
/// `limit` response bytes and then holds the connection open without
/// sending more (a stalled transfer), until the limit is raised or the
/// proxy is dropped.
pub struct StallProxy {
    pub port: u16,
    limit: Arc<AtomicU64>,
    stalled: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

/// Longest a proxy thread lives.
const PROXY_LIFETIME: Duration = Duration::from_secs(300);

impl StallProxy {
    pub fn start(upstream: SocketAddr, limit: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let limit = Arc::new(AtomicU64::new(limit));
        let stalled = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s, st) = (limit.clone(), stalled.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            let deadline = Instant::now() + PROXY_LIFETIME;
            while !st.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(up) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5))
                        else {
                            continue;
                        };
                        let (l, s, st) = (l.clone(), s.clone(), st.clone());
                        std::thread::spawn(move || proxy_conn(client, up, l, s, st));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            port,
            limit,
            stalled,
            stop,
            accept: Some(accept),
        }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Whether a connection has reached the limit and is holding.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::Relaxed)
    }

    /// No limit from now on (held connections resume).
    pub fn unthrottle(&self) {
        self.limit.store(u64::MAX, Ordering::Relaxed);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn proxy_conn(
    client: TcpStream,
    up: TcpStream,
    limit: Arc<AtomicU64>,
    stalled: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) {
    let tick = Some(Duration::from_millis(100));
    let _ = client.set_read_timeout(tick);
    let _ = up.set_read_timeout(tick);
    let (mut c_r, mut c_w) = (client.try_clone().unwrap(), client);
    let (mut u_r, mut u_w) = (up.try_clone().unwrap(), up);
    let done = Arc::new(AtomicBool::new(false));
    // Requests: client to upstream, unthrottled.
    let (d, st) = (done.clone(), stop.clone());
    let requests = std::thread::spawn(move || {
        let deadline = Instant::now() + PROXY_LIFETIME;
        let mut buf = [0u8; 16384];
        while !d.load(Ordering::Relaxed) && !st.load(Ordering::Relaxed) && Instant::now() < deadline
        {
            match c_r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if u_w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        d.store(true, Ordering::Relaxed);
        let _ = u_w.shutdown(std::net::Shutdown::Both);
    });
    // Responses: upstream to client, at most `limit` bytes.
    let deadline = Instant::now() + PROXY_LIFETIME;
    let mut sent: u64 = 0;
    let mut buf = [0u8; 16384];
    while !done.load(Ordering::Relaxed)
        && !stop.load(Ordering::Relaxed)
        && Instant::now() < deadline
    {
        let room = limit.load(Ordering::Relaxed).saturating_sub(sent);
        if room == 0 {
            stalled.store(true, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        match u_r.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => {
                if c_w.write_all(&buf[..n]).is_err() {
                    break;
                }
                sent += n as u64;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    done.store(true, Ordering::Relaxed);
    let _ = c_w.shutdown(std::net::Shutdown::Both);
    let _ = requests.join();
}
