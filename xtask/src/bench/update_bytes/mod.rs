//! `cargo xtask bench update-bytes`: what a node downloads, and writes, to
//! go from v1 to v2 of an ostree-native image (the `native-*` fixtures,
//! made by ostree-ext's encapsulator, v2 a package-shaped update packed
//! like v1), three ways:
//!
//! - **importer**: ostree-ext's ImageImporter pulling v2 over v1 from a
//!   loopback registry, as nodes on the container path do (layers it has
//!   are skipped); counted at the registry, from its access log;
//! - **ostree**: stock `ostree pull` from oscontent-server;
//! - **oscontent**: `oscontent pull` from the same server;
//!   both counted at the server (`oscontent_http_response_bytes_total`);
//! - **staged+importer**: `oscontent stage` of v2 from the server, then the
//!   importer from the registry, which then fetches no layer ([`staged`]).
//!
//! The yardstick is what v2 adds over v1: its new objects, compressed as
//! an archive repo stores them ([`crate::bench::new_objects`]).
//!
//! Each node is on one scratch XFS loop device, whose write counter gives
//! the bytes written for the v2 step (after a syncfs). Needs root.

pub mod report;
mod staged;

use super::scratch::ScratchFs;
use super::{check_interrupted, http_status, require, utc_stamp};
use anyhow::{bail, ensure, Context, Result};
use oscontent_testkit::encapsulate::import;
use oscontent_testkit::fixtures::{
    ensure_native, native_default_dir, FixtureSpec, Scale, DEFAULT_REF,
};
use oscontent_testkit::registry::Registry;
use oscontent_testkit::ServerProcess;
use report::{blob_bytes_sent, ArmResult, Report, UpdateResult};
use staged::Setup;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

/// Server start, image streaming and verification included (full scale).
const READY_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// One push of a full-scale release into the registry.
const PUSH_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// One pull (or stage) of a full-scale release.
const PULL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// What the server under test serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ServerSource {
    /// `--image` of v1 and v2 from the registry: the native images
    /// themselves (needs the server's native-image support).
    Image,
    /// `--repo` of the archive repo the images were encapsulated from:
    /// the same commits, for servers without native-image support.
    Repo,
}

/// The benchmark's options.
#[derive(Debug, Clone)]
pub struct Options {
    pub scale: Scale,
    /// Update shares (0.05 and 0.3 by default).
    pub shares: Vec<f64>,
    pub server_source: ServerSource,
    pub server_bin: Option<PathBuf>,
    pub client_bin: Option<PathBuf>,
}

pub fn run(opts: &Options) -> Result<()> {
    super::interrupt()?;
    let mut tools = vec![super::DOCKER_REGISTRY, super::SKOPEO];
    tools.extend_from_slice(super::SCRATCH_TOOLS);
    require(&tools)?;
    let started = SystemTime::now();
    let (server, server_profile) = super::report::server(opts.server_bin.as_deref())?;
    let client = match &opts.client_bin {
        Some(p) => std::path::absolute(p).context("resolving --client-bin")?,
        None => {
            crate::cargo::cargo(&["build", "--release", "--quiet", "-p", "oscontent"])?;
            crate::cargo::target_dir().join("release/oscontent")
        }
    };
    let mut updates = Vec::new();
    for &share in &opts.shares {
        check_interrupted()?;
        updates.push(
            one_update(opts, share, &server, &client)
                .with_context(|| format!("the {share} update"))?,
        );
    }
    let report = Report {
        started: utc_stamp(started),
        git: super::git_state(),
        kernel: super::report::kernel(),
        scale: opts.scale.to_string(),
        server_source: format!("{:?}", opts.server_source).to_lowercase(),
        server_profile,
        updates,
    };
    super::report::publish("update-bytes", started, &report, &report::render(&report))?;
    Ok(())
}

/// The fixtures, the registry, the server and the scratch filesystem for
/// one update, then the four arms on it.
fn one_update(opts: &Options, share: f64, server: &Path, client: &Path) -> Result<UpdateResult> {
    let spec = FixtureSpec {
        update_share: share,
        ..FixtureSpec::new(opts.scale)
    };
    let f = ensure_native(&spec, &native_default_dir(&spec))?;
    let [v1, v2] = &f.releases[..] else {
        bail!("native fixtures with {} releases", f.releases.len());
    };
    let base = super::bench_dir()?;
    let reg = Registry::builder().storage_in(&base.join("tmp")).start()?;
    let push = |version: &str| {
        let name = format!("native:{version}");
        reg.try_push(&f.oci_layout, version, &name, &[], PUSH_TIMEOUT)
    };
    let (img1, img2) = (push(&v1.version)?, push(&v2.version)?);
    // Four nodes, each with v1 and v2 (bare-user stores content
    // uncompressed), and room to spare.
    let size = 5 * (v1.tree_bytes + v2.tree_bytes) + (1 << 30);
    let scratch = ScratchFs::create(size)?;
    let state = tempfile::tempdir_in(&base).context("creating the server's state dir")?;
    let mut cmd = Command::new(server);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state.path());
    match opts.server_source {
        ServerSource::Image => {
            cmd.args([
                "--image",
                &img1,
                "--image",
                &img2,
                "--insecure-registry",
                &reg.host(),
            ]);
        }
        ServerSource::Repo => {
            cmd.arg("--repo")
                .arg(&f.repo)
                .args(["--commit", &v2.commit]);
        }
    }
    let mut srv = ServerProcess::spawn(&mut cmd, Duration::from_secs(60))?;
    wait_ready(&mut srv)?;

    let v1_changed = v2
        .layers
        .iter()
        .filter(|l| !v1.layers.iter().any(|p| p.digest == l.digest))
        .count();
    let new_objects = crate::bench::new_objects::new_objects(&f.repo, &v1.commit, &v2.commit)?;
    let mut arms = vec![
        importer_arm(&scratch, &reg, &img1, &img2, &v2.commit)?,
        ostree_arm(&scratch, &srv, &v1.commit, &v2.commit)?,
        oscontent_arm(&scratch, &srv, client, &v1.commit, &v2.commit)?,
    ];
    // Staging needs the image itself served: a `--repo` has no staging index.
    let staged = match opts.server_source {
        ServerSource::Image => {
            let (arm, parts) = staged::arm(&Setup {
                scratch: &scratch,
                reg: &reg,
                srv: &srv,
                client,
                img1: &img1,
                img2: &img2,
                v1,
                v2,
            })?;
            arms.push(arm);
            Some(parts)
        }
        ServerSource::Repo => None,
    };
    srv.stop();
    Ok(UpdateResult {
        share,
        packages_changed: f.packages_changed.len(),
        files_rewritten: f.files_rewritten,
        v2_image_bytes: v2.image_bytes,
        layers: v2.layers.len(),
        layers_changed: v1_changed,
        new_objects,
        arms,
        staged,
    })
}

fn wait_ready(srv: &mut ServerProcess) -> Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    while http_status(srv.addr, "/readyz") != Some(200) {
        check_interrupted()?;
        if let Some(status) = srv.try_wait()? {
            bail!("the server exited ({status}):\n{}", srv.stderr());
        }
        ensure!(
            Instant::now() < deadline,
            "the server was not ready within {READY_TIMEOUT:?}:\n{}",
            srv.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// Runs `step` and returns what it wrote to the scratch device (after a
/// syncfs, so that what the step left dirty counts) and how long it took.
fn measured<T>(scratch: &ScratchFs, step: impl FnOnce() -> Result<T>) -> Result<(T, u64, f64)> {
    scratch.syncfs()?;
    let before = scratch.device_written_bytes()?;
    let t = Instant::now();
    let out = step()?;
    scratch.syncfs()?;
    let secs = t.elapsed().as_secs_f64();
    Ok((out, scratch.device_written_bytes()? - before, secs))
}

fn importer_arm(
    scratch: &ScratchFs,
    reg: &Registry,
    img1: &str,
    img2: &str,
    v2: &str,
) -> Result<ArmResult> {
    let node = scratch.path().join("importer");
    import(&node, img1, true)?;
    let log_before = reg.log().len();
    let (imported, written, seconds) = measured(scratch, || import(&node, img2, true))?;
    ensure!(
        imported.commit == v2,
        "the importer got {} for v2 ({v2})",
        imported.commit
    );
    let log = reg.log();
    let since = log.get(log_before..).unwrap_or_default();
    Ok(ArmResult {
        arm: "importer".into(),
        downloaded_bytes: blob_bytes_sent(since),
        reported_bytes: Some(imported.fetched_bytes),
        written_bytes: written,
        seconds,
    })
}

fn ostree_arm(scratch: &ScratchFs, srv: &ServerProcess, v1: &str, v2: &str) -> Result<ArmResult> {
    let node = scratch.path().join("ostree");
    let repo = oscontent_testkit::Ostree::init(&node, "bare-user")?;
    repo.remote_add("oscontent", &srv.url, &[])?;
    repo.run(["pull", "oscontent", v1])?;
    let served = served_bytes(srv)?;
    let (_, written, seconds) = measured(scratch, || repo.run(["pull", "oscontent", DEFAULT_REF]))?;
    ensure!(
        repo.rev_parse(&format!("oscontent:{DEFAULT_REF}"))? == v2,
        "ostree pulled something other than v2"
    );
    Ok(ArmResult {
        arm: "ostree".into(),
        downloaded_bytes: served_bytes(srv)? - served,
        reported_bytes: None,
        written_bytes: written,
        seconds,
    })
}

fn oscontent_arm(
    scratch: &ScratchFs,
    srv: &ServerProcess,
    client: &Path,
    v1: &str,
    v2: &str,
) -> Result<ArmResult> {
    let node = scratch.path().join("oscontent");
    oscontent_testkit::Ostree::init(&node, "bare-user")?;
    let pull = |target: &[&str]| -> Result<()> {
        let mut cmd = Command::new(client);
        cmd.arg("pull")
            .arg("--repo")
            .arg(&node)
            .args(["--url", &srv.url])
            .args(target);
        oscontent_testkit::check_output(&mut cmd, PULL_TIMEOUT).map(drop)
    };
    pull(&["--commit", v1])?;
    let served = served_bytes(srv)?;
    let (_, written, seconds) = measured(scratch, || pull(&["--ref", DEFAULT_REF]))?;
    let head = std::fs::read_to_string(node.join("refs/heads").join(DEFAULT_REF))
        .context("reading the pulled ref")?;
    ensure!(
        head.trim() == v2,
        "oscontent pulled {} for v2 ({v2})",
        head.trim()
    );
    Ok(ArmResult {
        arm: "oscontent".into(),
        downloaded_bytes: served_bytes(srv)? - served,
        reported_bytes: None,
        written_bytes: written,
        seconds,
    })
}

/// Response bytes the server has sent so far, from its metrics.
fn served_bytes(srv: &ServerProcess) -> Result<u64> {
    let r = oscontent_testkit::http::fetch(
        &oscontent_testkit::http::http1(),
        &format!("{}/metrics", srv.url.trim_end_matches('/')),
        &[],
    )?;
    ensure!(r.status == 200, "/metrics answered {}", r.status);
    let m = oscontent_testkit::metrics::Metrics::parse(&String::from_utf8_lossy(&r.body))?;
    Ok(m.sum("oscontent_http_response_bytes_total", &[]) as u64)
}
