//! `cargo xtask demo`: builds the demo oscontainers, serves v1 and then v2,
//! updates a fresh bare-user node repo with stock `ostree pull`, and prints
//! what the update fetched against what the whole image costs and, for
//! ostree-native images (the default), against the layers the container
//! path would download for the same update.

use crate::fixtures::{self, FixtureSpec, Fixtures, Scale};
use crate::{cargo, deps};
use anyhow::{Context, Result};
use oscontent_testkit::fixtures::{ensure_native, native_default_dir, NativeFixtures};
use oscontent_testkit::ServerProcess;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How long the server may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long it may take to verify and publish what it serves.
const READY_TIMEOUT: Duration = Duration::from_secs(600);

/// Which oscontainer format the demo builds and serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// ostree-native images (bootc, Fedora CoreOS, OpenShift 4.12+), made
    /// by ostree-ext's encapsulator and served with `--image oci:…`.
    Native,
    /// The legacy oscontainer (`/srv/repo`), served with `--oscontainer`.
    Legacy,
}

/// Demo options.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub scale: Scale,
    pub share: f64,
    pub format: Format,
    /// Keep the v2 server running until Ctrl-C.
    pub keep_serving: bool,
}

/// A running `oscontent-server`, stopped (SIGTERM) on drop.
struct Server {
    proc: ServerProcess,
    url: String,
    access_log: PathBuf,
}

impl Server {
    /// Serves `source` (`--oscontainer DIR` or `--image REF`), logging its
    /// stderr to `server-NAME.log` in `work` for whoever watches the demo.
    fn start(source: &[OsString], work: &Path, name: &str) -> Result<Self> {
        let bin = cargo::bin_dir().join("oscontent-server");
        let access_log = work.join(format!("access-{name}.log"));
        let log_path = work.join(format!("server-{name}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating the {name} server log"))?;
        let mut cmd = Command::new(&bin);
        cmd.arg("serve")
            .args(source)
            .arg("--state-dir")
            .arg(work.join(format!("state-{name}")))
            .args(["--listen", "127.0.0.1:0", "--access-log"])
            .arg(&access_log);
        let mut proc = ServerProcess::spawn_with_log(&mut cmd, START_TIMEOUT, Some(log))
            .with_context(|| format!("server {name} did not start; see {}", log_path.display()))?;
        // An image is converted before it is served: until then /readyz
        // says 503, and so would every pull.
        proc.wait_ready(READY_TIMEOUT).with_context(|| {
            format!(
                "server {name} did not get ready; see {}",
                log_path.display()
            )
        })?;
        Ok(Self {
            url: proc.url.clone(),
            proc,
            access_log,
        })
    }
}

fn ostree(repo: &Path, args: &[&str]) -> Result<String> {
    oscontent_testkit::Ostree::at(repo).run(args)
}

/// Requests in an access log, summed per kind over successful GETs.
#[derive(Debug, Default)]
pub struct Fetched {
    pub by_kind: BTreeMap<String, (u64, u64)>,
}

impl Fetched {
    pub fn from_access_log(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut f = Fetched::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("parsing access log line {line:?}"))?;
            if v["method"] != "GET" || v["status"] != 200 {
                continue;
            }
            let kind = v["kind"].as_str().unwrap_or("other").to_owned();
            let e = f.by_kind.entry(kind).or_default();
            e.0 += 1;
            e.1 += v["bytes"].as_u64().unwrap_or(0);
        }
        Ok(f)
    }

    pub fn objects(&self) -> (u64, u64) {
        ["commit", "dirtree", "dirmeta", "filez"]
            .iter()
            .filter_map(|k| self.by_kind.get(*k))
            .fold((0, 0), |(n, b), (n2, b2)| (n + n2, b + b2))
    }

    pub fn total_bytes(&self) -> u64 {
        self.by_kind.values().map(|(_, b)| b).sum()
    }
}

/// One release as the demo serves it.
#[derive(Debug)]
struct Stage {
    version: String,
    commit: String,
    /// The server's source arguments.
    source: Vec<OsString>,
    /// Where it comes from, for the reader.
    shown: String,
}

/// What the update is compared against.
#[derive(Debug)]
struct Costs {
    /// v2's whole image, compressed.
    image_bytes: u64,
    image_layers: usize,
    /// Regular files and symlinks in v2's tree.
    tree_files: u64,
    /// v2's layers that v1 lacks, and their bytes: what a node on the
    /// container path downloads (native images only).
    new_layers: Option<(usize, u64)>,
}

/// The legacy demo: one-layer oscontainers served from their `/srv/repo`.
fn legacy(spec: &FixtureSpec) -> Result<(Stage, Stage, Costs)> {
    let fx: Fixtures = fixtures::ensure(spec, &fixtures::default_dir(spec))?;
    let stage = |r: &crate::fixtures::Release| Stage {
        version: r.version.clone(),
        commit: r.commit.clone(),
        source: vec!["--oscontainer".into(), r.oscontainer.clone().into()],
        shown: r.oscontainer.display().to_string(),
    };
    let (v1, v2) = (&fx.releases[0], &fx.releases[1]);
    let costs = Costs {
        image_bytes: v2.image_bytes,
        image_layers: 1,
        tree_files: v2.tree_files,
        new_layers: None,
    };
    Ok((stage(v1), stage(v2), costs))
}

/// The native demo: images chunked by ostree-ext, served from the OCI
/// layout as a registry would hand them out.
fn native(spec: &FixtureSpec) -> Result<(Stage, Stage, Costs)> {
    let fx: NativeFixtures = ensure_native(spec, &native_default_dir(spec))?;
    let stage = |r: &oscontent_testkit::fixtures::NativeRelease| Stage {
        version: r.version.clone(),
        commit: r.commit.clone(),
        source: vec!["--image".into(), fx.image_ref(r).into()],
        shown: fx.image_ref(r),
    };
    let (v1, v2) = (&fx.releases[0], &fx.releases[1]);
    let new: Vec<_> = v2
        .layers
        .iter()
        .filter(|l| !v1.layers.iter().any(|o| o.digest == l.digest))
        .collect();
    let costs = Costs {
        image_bytes: v2.image_bytes,
        image_layers: v2.layers.len(),
        tree_files: v2.tree_files,
        new_layers: Some((new.len(), new.iter().map(|l| l.size).sum())),
    };
    Ok((stage(v1), stage(v2), costs))
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

pub fn demo(opts: &DemoOptions) -> Result<()> {
    deps::ensure()?;
    cargo::cargo(&["build", "--workspace", "--bins", "--quiet"])?;
    let spec = FixtureSpec {
        update_share: opts.share,
        ..FixtureSpec::new(opts.scale)
    };
    eprintln!(
        "xtask: building (or reusing) the {:?} {:?} demo oscontainers",
        opts.scale, opts.format
    );
    let (v1, v2, costs) = match opts.format {
        Format::Native => native(&spec)?,
        Format::Legacy => legacy(&spec)?,
    };
    let work = cargo::target_dir().join("demo");
    let node = fresh_node(&work)?;
    install_v1(&node, &work, &spec, &v1)?;
    let (s2, took) = update_to_v2(&node, &work, &spec, &v2)?;
    report(&s2, took, &costs)?;
    if opts.keep_serving {
        keep_serving(s2, &spec)?;
    }
    Ok(())
}

/// Empties `work` and creates the node's repo inside it.
fn fresh_node(work: &Path) -> Result<PathBuf> {
    if work.exists() {
        std::fs::remove_dir_all(work).with_context(|| format!("clearing {}", work.display()))?;
    }
    std::fs::create_dir_all(work).with_context(|| format!("creating {}", work.display()))?;
    let node = work.join("node-repo");
    ostree(&node, &["init", "--mode=bare-user"])?;
    Ok(node)
}

/// Serves v1 and installs it on the node with stock `ostree pull`.
fn install_v1(node: &Path, work: &Path, spec: &FixtureSpec, v1: &Stage) -> Result<()> {
    println!(
        "== v1 {} ({}) served from {}",
        v1.version,
        &v1.commit[..12],
        v1.shown
    );
    let s1 = Server::start(&v1.source, work, "v1")?;
    ostree(
        node,
        &["remote", "add", "--no-gpg-verify", "oscontent", &s1.url],
    )?;
    ostree(node, &["pull", "oscontent", &spec.ref_name])?;
    println!(
        "   node installed v1 with stock `ostree pull` from {}",
        s1.url
    );
    Ok(())
}

/// Serves v2, updates the node to it and checks the result; returns the
/// v2 server (whose access log says what was fetched) and the pull's time.
fn update_to_v2(
    node: &Path,
    work: &Path,
    spec: &FixtureSpec,
    v2: &Stage,
) -> Result<(Server, Duration)> {
    println!(
        "== v2 {} ({}): the new release rolls out",
        v2.version,
        &v2.commit[..12]
    );
    let s2 = Server::start(&v2.source, work, "v2")?;
    ostree(node, &["remote", "delete", "oscontent"])?;
    ostree(
        node,
        &["remote", "add", "--no-gpg-verify", "oscontent", &s2.url],
    )?;
    let t = Instant::now();
    ostree(node, &["pull", "oscontent", &spec.ref_name])?;
    let took = t.elapsed();
    let head = ostree(
        node,
        &["rev-parse", &format!("oscontent:{}", spec.ref_name)],
    )?;
    anyhow::ensure!(
        head.trim() == v2.commit,
        "node is at {} after the update, expected {}",
        head.trim(),
        v2.commit
    );
    ostree(node, &["fsck", "--quiet"])?;
    Ok((s2, took))
}

/// Prints what the update fetched, against the size of the whole v2 image
/// and of the layers the container path downloads.
fn report(s2: &Server, took: Duration, v2: &Costs) -> Result<()> {
    let fetched = Fetched::from_access_log(&s2.access_log)?;
    let (objs, obj_bytes) = fetched.objects();
    let content = fetched.by_kind.get("filez").copied().unwrap_or_default();
    println!(
        "   node updated to v2 in {:.2}s; `ostree fsck` is clean",
        took.as_secs_f64()
    );
    println!();
    println!(
        "   what the update fetched        {objs} objects ({} content), {}",
        content.0,
        mib(obj_bytes)
    );
    println!(
        "   all HTTP bytes (with summary)  {}",
        mib(fetched.total_bytes())
    );
    println!(
        "   the whole v2 image             {} compressed in {} layer(s), {} files",
        mib(v2.image_bytes),
        v2.image_layers,
        v2.tree_files
    );
    if let Some((n, bytes)) = v2.new_layers {
        println!(
            "   the container path             {n} of {} layers changed, {} to download",
            v2.image_layers,
            mib(bytes)
        );
        println!(
            "   fetched / container path       {:.1}%  ({:.1}x less than pulling the changed layers)",
            100.0 * fetched.total_bytes() as f64 / bytes.max(1) as f64,
            bytes as f64 / fetched.total_bytes().max(1) as f64
        );
    }
    println!(
        "   fetched / image                {:.1}%  ({:.0}x less to download and write)",
        100.0 * fetched.total_bytes() as f64 / v2.image_bytes.max(1) as f64,
        v2.image_bytes as f64 / fetched.total_bytes().max(1) as f64
    );
    Ok(())
}

/// Keeps v2 served until Ctrl-C.
fn keep_serving(mut s2: Server, spec: &FixtureSpec) -> Result<()> {
    println!();
    println!(
        "v2 is served at {} (ref {}); Ctrl-C to stop.",
        s2.url, spec.ref_name
    );
    // Ctrl-C reaches the server too (same process group); it drains and
    // exits, and this wait returns.
    s2.proc.wait().context("waiting for the server")?;
    Ok(())
}
