//! A real `docker-registry` (distribution 2.x) on 127.0.0.1 with its
//! storage in a temporary directory on the normal disk, and `skopeo`
//! pushes into it. Killed and deleted on drop.

use super::{run_bounded, Stopper};
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the registry may take to listen.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one push may take (a 1 GiB image on a slow disk).
const PUSH_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// Prefix of every registry directory; the owner's pid follows.
const PREFIX: &str = "registry-";

/// A running registry.
#[derive(Debug)]
pub struct Registry {
    // Field order is drop order: the process goes before its storage.
    process: Stopper,
    port: u16,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry without auth, storing under a fresh directory in
    /// `parent` (which should be on a real disk, not tmpfs: benchmarks
    /// drop the page cache to read it cold).
    pub fn start(parent: &Path) -> Result<Registry> {
        super::require(&[super::DOCKER_REGISTRY])?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let dir = tempfile::Builder::new()
            .prefix("registry-")
            .tempdir_in(parent)
            .with_context(|| format!("creating a registry dir in {}", parent.display()))?;
        // A port picked here may be taken before the registry binds it:
        // a few tries.
        let mut last = String::new();
        for _ in 0..5 {
            super::check_interrupted()?;
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .context("picking a free port")?
                .port();
            let config = dir.path().join("config.yml");
            std::fs::write(
                &config,
                format!(
                    "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                    dir.path().join("storage").display()
                ),
            )
            .context("writing the registry config")?;
            let log_path = dir.path().join("registry.log");
            let log = File::create(&log_path).context("creating the registry log")?;
            let child = Command::new("docker-registry")
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting docker-registry")?;
            let mut process = Stopper::new(child, "docker-registry");
            process.grace = Duration::from_secs(5);
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let deadline = Instant::now() + LISTEN_TIMEOUT;
            loop {
                super::check_interrupted()?;
                if let Some(status) = process.try_wait()? {
                    last = format!("exited ({status}): {}", super::tail(&log_path, 5));
                    break;
                }
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    return Ok(Registry { process, port, dir });
                }
                if Instant::now() >= deadline {
                    bail!("docker-registry did not listen on {addr} within {LISTEN_TIMEOUT:?}");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        bail!("could not start docker-registry: {last}")
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Where its blobs are stored.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// Its log: stdout and stderr, the access log (one line per request,
    /// with the bytes sent) included.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("registry.log")
    }

    /// The registry's process id.
    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Pushes `oci:LAYOUT:TAG` as `REPO:TAG` with skopeo and returns
    /// `HOST/REPO:TAG`.
    pub fn push_oci(&self, layout: &Path, tag: &str, repo: &str) -> Result<String> {
        super::require(&[super::SKOPEO])?;
        let dest = format!("{}/{repo}:{tag}", self.host());
        run_bounded(
            Command::new("skopeo")
                .args([
                    "--insecure-policy",
                    "copy",
                    "--quiet",
                    "--dest-tls-verify=false",
                ])
                .arg(format!("oci:{}:{tag}", layout.display()))
                .arg(format!("docker://{dest}")),
            &self.dir.path().join("push.log"),
            PUSH_TIMEOUT,
        )
        .with_context(|| format!("pushing {tag} from {} to {dest}", layout.display()))?;
        Ok(dest)
    }
}

/// Stops the registries that dead benchmark processes (killed with
/// SIGKILL, say) left running, and removes their directories under
/// `parent`: a directory `registry-<pid>-*` whose owner is gone, and the
/// `docker-registry` processes serving that directory's config. Best
/// effort.
pub fn reap_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(owner) = name
            .strip_prefix(PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        let config = entry.path().join("config.yml");
        for pid in processes_with_arg(config.as_os_str().as_encoded_bytes()) {
            eprintln!(
                "xtask: stopping stale docker-registry {pid} (its benchmark, pid {owner}, is gone)"
            );
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        eprintln!("xtask: removing stale {}", entry.path().display());
        let _ = std::fs::remove_dir_all(entry.path());
    }
}

/// Pids of `docker-registry` processes with `arg` among their arguments.
fn processes_with_arg(arg: &[u8]) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let mut args = cmdline.split(|b| *b == 0);
            args.next()
                .is_some_and(|a0| a0.ends_with(b"docker-registry"))
                && args.any(|a| a == arg)
        })
        .collect()
}
