//! A real `docker-registry` for the suites and the server's integration
//! tests: on loopback (a free port) by default, or at a fixed address
//! inside a network namespace; optionally behind htpasswd (bcrypt) basic
//! auth and TLS. Storage is a temporary directory; the registry is killed
//! on drop. Pushes go through `skopeo`, run where the registry is.
//!
//! Also what a registry's clients need: a containers auth.json, and a
//! throwaway CA with a registry certificate for 127.0.0.1.

use crate::{check_output, fixtures, free_port, http1, local_only, tempdir, Release, MAX_READ};
use anyhow::{bail, ensure, Context, Result};
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on one skopeo / htpasswd / openssl run.
pub const REGISTRY_TOOL_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on the registry starting to listen.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Ports picked on loopback may be taken by the time the registry binds
/// them: this many tries.
const PORT_TRIES: usize = 5;
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// How to start a [`Registry`].
#[derive(Debug, Default, Clone)]
pub struct RegistryBuilder {
    auth: Option<(String, String)>,
    tls: Option<(PathBuf, PathBuf)>,
    netns: Option<(String, String)>,
    storage_in: Option<PathBuf>,
}

impl RegistryBuilder {
    /// Require these htpasswd (bcrypt) credentials.
    pub fn auth(mut self, user: &str, pass: &str) -> Self {
        self.auth = Some((user.to_owned(), pass.to_owned()));
        self
    }

    /// Serve HTTPS with this PEM certificate and key.
    pub fn tls(mut self, cert: &Path, key: &Path) -> Self {
        self.tls = Some((cert.to_owned(), key.to_owned()));
        self
    }

    /// Run inside network namespace `ns` (`ip netns exec`), listening on
    /// `addr` there: nothing outside the namespace can reach it.
    pub fn netns(mut self, ns: &str, addr: &str) -> Self {
        self.netns = Some((ns.to_owned(), addr.to_owned()));
        self
    }

    /// Keep its storage in a fresh directory under `parent` (benchmarks:
    /// on a real disk, not tmpfs, so that dropping the page cache makes
    /// its blobs cold).
    pub fn storage_in(mut self, parent: &Path) -> Self {
        self.storage_in = Some(parent.to_owned());
        self
    }

    /// Starts the registry and waits (bounded) until it accepts
    /// connections.
    pub fn start(self) -> Result<Registry> {
        let mut dir = match &self.storage_in {
            Some(parent) => {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
                tempfile::Builder::new()
                    .prefix("registry-")
                    .tempdir_in(parent)
                    .with_context(|| format!("creating a registry dir in {}", parent.display()))?
            }
            None => tempdir(),
        };
        let auth = self.auth_config(dir.path())?;
        let tls = match &self.tls {
            Some((cert, key)) => format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            ),
            None => String::new(),
        };
        let tries = if self.netns.is_some() { 1 } else { PORT_TRIES };
        for _ in 0..tries {
            let addr = match &self.netns {
                Some((_, addr)) => addr.clone(),
                None => format!("127.0.0.1:{}", free_port()?),
            };
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n{tls}{auth}",
                    dir.path().join("storage").display()
                ),
            )
            .context("writing the registry config")?;
            let mut reg = Registry {
                addr,
                dir,
                creds: self.auth.clone(),
                netns: self.netns.as_ref().map(|(ns, _)| ns.clone()),
                child: None,
            };
            reg.spawn(&config)?;
            if reg.wait_listening()? {
                return Ok(reg);
            }
            eprintln!("registry exited early; retrying on another port");
            dir = reg.into_dir();
        }
        bail!("could not start docker-registry")
    }

    /// The `auth:` section of the config, with its htpasswd file in `dir`.
    fn auth_config(&self, dir: &Path) -> Result<String> {
        let Some((u, p)) = &self.auth else {
            return Ok(String::new());
        };
        let line = check_output(
            local_only(&mut Command::new("htpasswd")).args(["-Bbn", u, p]),
            REGISTRY_TOOL_TIMEOUT,
        )
        .context("htpasswd (Debian package apache2-utils)")?;
        let path = dir.join("htpasswd");
        std::fs::write(&path, line.trim()).context("writing htpasswd")?;
        Ok(format!(
            "auth:\n  htpasswd:\n    realm: e2e\n    path: {}\n",
            path.display()
        ))
    }
}

/// A running `docker-registry serve`, killed on drop.
pub struct Registry {
    /// `HOST:PORT` it listens on (inside its namespace, if any).
    addr: String,
    pub dir: tempfile::TempDir,
    pub creds: Option<(String, String)>,
    netns: Option<String>,
    child: Option<Child>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("addr", &self.addr)
            .field("netns", &self.netns)
            .finish()
    }
}

impl Registry {
    /// Options: auth, TLS, a network namespace.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// A plain HTTP registry on loopback, no auth.
    pub fn start() -> Registry {
        Self::builder().start().unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A registry on loopback that requires these htpasswd credentials.
    pub fn with_auth(user: &str, pass: &str) -> Registry {
        Self::builder()
            .auth(user, pass)
            .start()
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// `program`, run where the registry is (inside its namespace, if
    /// any), with no proxy in its environment.
    pub fn command(&self, program: &str) -> Command {
        let mut c = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => Command::new(program),
        };
        local_only(&mut c);
        c
    }

    fn spawn(&mut self, config: &Path) -> Result<()> {
        let log_path = self.dir.path().join("registry.log");
        let log = std::fs::File::create(&log_path).context("creating registry.log")?;
        let child = self
            .command("docker-registry")
            .arg("serve")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("docker-registry (Debian package docker-registry) must be installed")?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the registry accepts connections: `Ok(false)` if it
    /// exited first (its port was taken), an error after the deadline.
    fn wait_listening(&mut self) -> Result<bool> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    eprintln!("registry exited ({status}):\n{}", self.log());
                    self.child = None;
                    return Ok(false);
                }
            }
            if self.accepts()? {
                return Ok(true);
            }
            ensure!(
                Instant::now() < deadline,
                "registry did not listen on {} within {READY_TIMEOUT:?}:\n{}",
                self.addr,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether a TCP connection to the registry succeeds (from inside its
    /// namespace: bash's /dev/tcp, bounded by `timeout`).
    fn accepts(&self) -> Result<bool> {
        match &self.netns {
            None => {
                let addr: SocketAddr = self.addr.parse().context("registry address")?;
                Ok(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
            }
            Some(_) => {
                let (host, port) = self.addr.rsplit_once(':').context("HOST:PORT")?;
                let probe = format!("exec 3<>/dev/tcp/{host}/{port}");
                let o = crate::run_bounded(
                    self.command("timeout").args(["2", "bash", "-c", &probe]),
                    Duration::from_secs(5),
                )?;
                Ok(o.status.success())
            }
        }
    }

    /// The registry's log (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Stops the registry, keeping its directory for another try.
    fn into_dir(mut self) -> tempfile::TempDir {
        self.kill();
        std::mem::replace(&mut self.dir, tempdir())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `HOST:PORT`.
    pub fn host(&self) -> String {
        self.addr.clone()
    }

    /// `docker://HOST:PORT/NAME` (NAME is `repo:tag` or
    /// `repo@sha256:...`).
    pub fn image(&self, name: &str) -> String {
        format!("docker://{}/{name}", self.host())
    }

    fn creds_arg(&self) -> Option<String> {
        self.creds.as_ref().map(|(u, p)| format!("{u}:{p}"))
    }

    /// `skopeo --insecure-policy ARGS...`, where the registry is; stdout.
    pub fn skopeo(&self, args: &[&str]) -> String {
        check_output(
            self.command("skopeo").arg("--insecure-policy").args(args),
            REGISTRY_TOOL_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Pushes `oci:LAYOUT:TAG` to `NAME` (`repo:tag`) with skopeo, with
    /// extra copy options (e.g. `--dest-compress-format zstd`); returns
    /// the image reference.
    pub fn push(&self, layout: &Path, tag: &str, name: &str, extra: &[&str]) -> String {
        self.try_push(layout, tag, name, extra, REGISTRY_TOOL_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// [`Registry::push`], bounded by `timeout` (a full-scale image takes
    /// minutes), with the failure as an error.
    pub fn try_push(
        &self,
        layout: &Path,
        tag: &str,
        name: &str,
        extra: &[&str],
        timeout: Duration,
    ) -> Result<String> {
        let src = format!("oci:{}:{tag}", layout.display());
        let dst = self.image(name);
        let creds = self.creds_arg();
        let mut args = vec!["copy", "-q", "--dest-tls-verify=false"];
        if let Some(c) = &creds {
            args.extend(["--dest-creds", c]);
        }
        args.extend_from_slice(extra);
        args.extend([src.as_str(), dst.as_str()]);
        check_output(
            self.command("skopeo").arg("--insecure-policy").args(&args),
            timeout,
        )
        .with_context(|| format!("pushing {src} to {dst}"))?;
        Ok(dst)
    }

    /// Pushes a fixture release (from the shared fixture layout) as
    /// `name`; returns the image reference.
    pub fn push_release(&self, r: &Release, name: &str, extra: &[&str]) -> String {
        self.push(&fixtures().oci_layout, &r.version, name, extra)
    }

    /// The manifest digest of `NAME` as skopeo sees it.
    pub fn digest(&self, name: &str) -> String {
        let creds = self.creds_arg();
        let image = self.image(name);
        let mut args = vec!["inspect", "--tls-verify=false", "--format", "{{.Digest}}"];
        if let Some(c) = &creds {
            args.extend(["--creds", c]);
        }
        args.push(&image);
        let d = self.skopeo(&args).trim().to_owned();
        assert!(
            d.starts_with("sha256:") && d.len() == 71,
            "skopeo digest {d:?}"
        );
        d
    }

    /// The raw manifest for `repo:reference`, as the (plain HTTP, loopback)
    /// registry serves it, and its Docker-Content-Digest header.
    pub fn manifest(&self, repo: &str, reference: &str) -> (Vec<u8>, String) {
        let mut req = http1()
            .get(format!(
                "http://{}/v2/{repo}/manifests/{reference}",
                self.host()
            ))
            .header("Accept", format!("{OCI_MANIFEST}, {DOCKER_MANIFEST}"));
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
        self.kill();
    }
}

/// Standard base64 (for auth.json), so that the testkit needs no base64
/// crate.
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

/// A throwaway CA and a registry certificate for 127.0.0.1 it signed.
#[derive(Debug)]
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// An EC P-256 key, unencrypted.
const EC: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
];

impl Pki {
    /// Generates the CA and the certificate with `openssl` in `dir`.
    pub fn generate(dir: &Path) -> Result<Pki> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        openssl(dir, &[&["req", "-x509"], &EC[..], &CA_ARGS].concat())?;
        openssl(dir, &[&["req"], &EC[..], &CSR_ARGS].concat())?;
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .context("writing ext.cnf")?;
        openssl(dir, &SIGN_ARGS)?;
        Ok(Pki {
            ca: dir.join("ca.crt"),
            cert: dir.join("reg.crt"),
            key: dir.join("reg.key"),
        })
    }
}

const CA_ARGS: [&str; 8] = [
    "-days",
    "2",
    "-subj",
    "/CN=oscontent e2e CA",
    "-keyout",
    "ca.key",
    "-out",
    "ca.crt",
];
const CSR_ARGS: [&str; 6] = [
    "-subj",
    "/CN=127.0.0.1",
    "-keyout",
    "reg.key",
    "-out",
    "reg.csr",
];
const SIGN_ARGS: [&str; 15] = [
    "x509",
    "-req",
    "-in",
    "reg.csr",
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-days",
    "2",
    "-extfile",
    "ext.cnf",
    "-out",
    "reg.crt",
];

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let mut cmd = Command::new("openssl");
    cmd.current_dir(dir).args(args);
    check_output(&mut cmd, REGISTRY_TOOL_TIMEOUT).context("openssl (Debian package openssl)")?;
    Ok(())
}
