//! The node side of `bench io`: the seeded target repo (a filesystem image
//! made once and copied into every trial), the served update, and what a
//! pull added to the repo.

use super::super::scratch::{ScratchFs, ScratchOptions};
use super::super::{check_interrupted, run_bounded, stopper, Stopper};
use crate::fixtures::Release;
use anyhow::{bail, Context, Result};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The remote every target repo pulls from.
pub const REMOTE: &str = "oscontent";
/// The target repo, at the root of each trial's filesystem.
pub const REPO_DIR: &str = "repo";
/// Bump when the way templates are built changes, so old ones are rebuilt.
const TEMPLATE_VERSION: u32 = 1;
/// How long the server may take to start listening and be ready.
const SERVER_START: Duration = Duration::from_secs(120);

/// ostree repo modes a node may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RepoMode {
    /// What `ostree admin` nodes use for their system repo.
    Bare,
    /// Unprivileged bare (metadata in xattrs): the default here, as on a node that runs the
    /// client unprivileged.
    BareUser,
    /// Compressed objects.
    Archive,
}

impl RepoMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RepoMode::Bare => "bare",
            RepoMode::BareUser => "bare-user",
            RepoMode::Archive => "archive",
        }
    }
}

/// Runs `ostree --repo=REPO ARGS`, returning stdout; the error quotes stderr.
pub fn ostree(repo: &Path, args: &[&str]) -> Result<String> {
    oscontent_testkit::Ostree::at(repo).run(args)
}

/// Points the target repo's remote at `url` (no GPG: the bench measures
/// I/O, and the fixtures are unsigned).
pub fn set_remote(repo: &Path, url: &str) -> Result<()> {
    ostree(
        repo,
        &["config", "set", &format!("remote \"{REMOTE}\".url"), url],
    )
    .map(drop)
}

/// The commit `REMOTE:ref` (or the local `ref`) points to, if any.
pub fn ref_commit(repo: &Path, ref_name: &str) -> Option<String> {
    [format!("{REMOTE}:{ref_name}"), ref_name.to_owned()]
        .iter()
        .find_map(|r| ostree(repo, &["rev-parse", r]).ok())
        .map(|s| s.trim().to_owned())
}

// ---------------------------------------------------------------------------
// The server
// ---------------------------------------------------------------------------

/// The nice of the bench's server, which stands for another machine: its
/// CPU time should not compete with the node's neighbour, in every arm
/// alike (and the baseline's burner burns the server's share at it).
pub const SERVER_NICE: i32 = 19;

/// A running `oscontent-server serve --oscontainer`, stopped on drop.
#[derive(Debug)]
pub struct Server {
    pub url: String,
    pub addr: SocketAddr,
    pub process: Stopper,
}

impl Server {
    /// Serves `oscontainer` on 127.0.0.1 (port chosen by the kernel), with
    /// its state dir at `state` (keep it off the measured filesystem) and
    /// its log in `log`. Returns once `/readyz` answers 200.
    pub fn start(bin: &Path, oscontainer: &Path, state: &Path, log: &Path) -> Result<Server> {
        let err =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new("nice")
            .args(["-n", &SERVER_NICE.to_string()])
            .arg(bin)
            .arg("serve")
            .arg("--oscontainer")
            .arg(oscontainer)
            .arg("--state-dir")
            .arg(state)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut process = stopper(child, "oscontent-server");
        process.grace = Duration::from_secs(10);
        let stdout = process.child_mut().stdout.take().context("server stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let start = Instant::now();
        let line = loop {
            check_interrupted()?;
            if let Ok(line) = rx.recv_timeout(Duration::from_millis(100)) {
                break line;
            }
            if let Some(status) = process.try_wait()? {
                bail!(
                    "oscontent-server exited ({status}) before listening; log:\n{}",
                    super::super::tail(log, 20)
                );
            }
            if start.elapsed() > SERVER_START {
                bail!("oscontent-server did not listen within {SERVER_START:?}");
            }
        };
        let (url, addr) = oscontent_testkit::parse_listening(&line)
            .with_context(|| format!("unexpected first line from the server: {line:?}"))?;
        while crate::bench::http_status(addr, "/readyz") != Some(200) {
            check_interrupted()?;
            if start.elapsed() > SERVER_START {
                bail!("oscontent-server at {url} not ready within {SERVER_START:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Server { url, addr, process })
    }
}

// ---------------------------------------------------------------------------
// The seeded target repo
// ---------------------------------------------------------------------------

/// What a template image holds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TemplateMeta {
    pub version: u32,
    pub v1_commit: String,
    pub ref_name: String,
    pub mode: String,
    pub fs_bytes: u64,
    /// Objects in the repo (files under `objects/`).
    pub objects: usize,
    /// How long the seeding `ostree pull` took (for the record).
    pub seed_pull_s: f64,
}

/// An XFS image whose `repo/` is a `mode` repo at v1, and the set of its
/// objects (paths under `objects/`, e.g. `ab/cdef….file`).
#[derive(Debug, Clone)]
pub struct Template {
    pub image: PathBuf,
    pub meta: TemplateMeta,
    pub objects: HashSet<String>,
}

/// What a template is seeded from: the server that serves v1, and the
/// repo mode, ref and filesystem size it is made with.
#[derive(Debug, Clone, Copy)]
pub struct Seed<'a> {
    pub server_bin: &'a Path,
    pub v1: &'a Release,
    pub ref_name: &'a str,
    pub mode: RepoMode,
    pub fs_bytes: u64,
}

/// Where a template's three files live under its directory.
struct TemplatePaths {
    image: PathBuf,
    meta: PathBuf,
    objects: PathBuf,
    /// The image while it is being written.
    tmp: PathBuf,
}

impl TemplatePaths {
    fn new(dir: &Path, seed: &Seed<'_>) -> TemplatePaths {
        let stem = format!(
            "v1-{}-{}-{}m",
            &seed.v1.commit[..12],
            seed.mode.as_str(),
            seed.fs_bytes >> 20
        );
        TemplatePaths {
            image: dir.join(format!("{stem}.img")),
            meta: dir.join(format!("{stem}.json")),
            objects: dir.join(format!("{stem}.objects")),
            tmp: dir.join(format!(".{stem}.img.tmp")),
        }
    }
}

/// Builds (or reuses) the template: a fresh XFS of `seed.fs_bytes`, a
/// `seed.mode` repo pulled to v1 with stock `ostree pull` from our server,
/// saved as an image under `dir`. Reused when a previous run made the
/// same one.
pub fn template(dir: &Path, seed: &Seed<'_>, logs: &Path, timeout: Duration) -> Result<Template> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let paths = TemplatePaths::new(dir, seed);
    if let Some(t) = reuse(&paths, seed)? {
        eprintln!("xtask: reusing the seeded repo image {}", t.image.display());
        return Ok(t);
    }
    // The meta file is written last: without it, the rest is stale.
    let _ = std::fs::remove_file(&paths.meta);
    eprintln!(
        "xtask: seeding a {} repo with v1 {} (stock ostree pull; not measured)",
        seed.mode.as_str(),
        seed.v1.version
    );
    let fs = ScratchFs::create_with(&ScratchOptions::new(seed.fs_bytes))?;
    let repo = fs.path().join(REPO_DIR);
    let took = seed_repo(&repo, seed, logs, timeout)?;
    let objects = list_objects(&repo)?;
    fs.syncfs()?;
    fs.into_image(&paths.tmp)?;
    std::fs::rename(&paths.tmp, &paths.image).with_context(|| {
        format!(
            "renaming {} to {}",
            paths.tmp.display(),
            paths.image.display()
        )
    })?;
    save(&paths, seed, objects, took)
}

/// A template an earlier run left, if it was made from the same v1, ref
/// and mode and is complete (its meta file, image and object list).
fn reuse(paths: &TemplatePaths, seed: &Seed<'_>) -> Result<Option<Template>> {
    let want = |m: &TemplateMeta| {
        m.version == TEMPLATE_VERSION
            && m.v1_commit == seed.v1.commit
            && m.ref_name == seed.ref_name
            && m.mode == seed.mode.as_str()
    };
    let Ok(text) = std::fs::read_to_string(&paths.meta) else {
        return Ok(None);
    };
    let Ok(meta) = serde_json::from_str::<TemplateMeta>(&text) else {
        return Ok(None);
    };
    if !(want(&meta) && paths.image.is_file()) {
        return Ok(None);
    }
    let objects: HashSet<String> = std::fs::read_to_string(&paths.objects)
        .with_context(|| format!("reading {}", paths.objects.display()))?
        .lines()
        .map(str::to_owned)
        .collect();
    if objects.len() != meta.objects {
        return Ok(None);
    }
    Ok(Some(Template {
        image: paths.image.clone(),
        meta,
        objects,
    }))
}

/// `ostree init` and a stock `ostree pull` of v1 from a server of our
/// own into `repo`; checks the ref landed on v1. Returns the pull's time.
fn seed_repo(repo: &Path, seed: &Seed<'_>, logs: &Path, timeout: Duration) -> Result<Duration> {
    ostree(repo, &["init", &format!("--mode={}", seed.mode.as_str())])?;
    let state = tempfile::Builder::new()
        .prefix("seed-state-")
        .tempdir_in(logs)
        .context("creating the seeding server's state dir")?;
    let server = Server::start(
        seed.server_bin,
        &seed.v1.oscontainer,
        state.path(),
        &logs.join("seed-server.log"),
    )?;
    ostree(
        repo,
        &["remote", "add", "--no-gpg-verify", REMOTE, &server.url],
    )?;
    let took = run_bounded(
        &mut oscontent_testkit::Ostree::at(repo).command(["pull", REMOTE, seed.ref_name]),
        &logs.join("seed-pull.log"),
        timeout,
    )?;
    drop(server);
    let head = ref_commit(repo, seed.ref_name).context("the seeded repo has no ref")?;
    anyhow::ensure!(
        head == seed.v1.commit,
        "the seeded repo is at {head}, expected v1 {}",
        seed.v1.commit
    );
    Ok(took)
}

/// The object list, then the meta file (last: it marks the template
/// complete).
fn save(
    paths: &TemplatePaths,
    seed: &Seed<'_>,
    objects: HashSet<String>,
    took: Duration,
) -> Result<Template> {
    let mut sorted: Vec<&String> = objects.iter().collect();
    sorted.sort();
    let mut text = String::new();
    for o in sorted {
        text += o;
        text.push('\n');
    }
    std::fs::write(&paths.objects, text)
        .with_context(|| format!("writing {}", paths.objects.display()))?;
    let meta = TemplateMeta {
        version: TEMPLATE_VERSION,
        v1_commit: seed.v1.commit.clone(),
        ref_name: seed.ref_name.to_owned(),
        mode: seed.mode.as_str().to_owned(),
        fs_bytes: seed.fs_bytes,
        objects: objects.len(),
        seed_pull_s: took.as_secs_f64(),
    };
    std::fs::write(&paths.meta, serde_json::to_string_pretty(&meta)?)
        .with_context(|| format!("writing {}", paths.meta.display()))?;
    Ok(Template {
        image: paths.image.clone(),
        meta,
        objects,
    })
}

/// Paths of the files under `repo/objects`, relative to it.
pub fn list_objects(repo: &Path) -> Result<HashSet<String>> {
    let root = repo.join("objects");
    let mut out = HashSet::new();
    for fan in std::fs::read_dir(&root).with_context(|| format!("reading {}", root.display()))? {
        let fan = fan?;
        if !fan.file_type()?.is_dir() {
            continue;
        }
        let prefix = fan.file_name().to_string_lossy().into_owned();
        for e in std::fs::read_dir(fan.path())
            .with_context(|| format!("reading {}", fan.path().display()))?
        {
            let e = e?;
            out.insert(format!("{prefix}/{}", e.file_name().to_string_lossy()));
        }
    }
    Ok(out)
}

/// The objects a pull added: how many, and their apparent (st_size) and
/// allocated (st_blocks × 512) bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct NewObjects {
    pub count: u64,
    pub apparent_bytes: u64,
    pub allocated_bytes: u64,
}

/// Objects in `repo` now that are not in `before`.
pub fn new_objects(repo: &Path, before: &HashSet<String>) -> Result<NewObjects> {
    let mut n = NewObjects::default();
    let mut seen = HashSet::new();
    for rel in list_objects(repo)?.difference(before) {
        let path = repo.join("objects").join(rel);
        let md =
            std::fs::symlink_metadata(&path).with_context(|| format!("stat {}", path.display()))?;
        // bare-user-only and bare repos may hardlink identical content.
        if md.nlink() > 1 && !seen.insert(md.ino()) {
            continue;
        }
        n.count += 1;
        n.apparent_bytes += md.len();
        n.allocated_bytes += md.blocks() * 512;
    }
    Ok(n)
}

/// Reads every file under `dir` once, so that a server reading it later
/// finds it in the page cache (the server stands for a remote machine:
/// its reads should not compete with the node's writes for the disk).
pub fn warm(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 20];
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            let ft = e.file_type()?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                let mut f = std::fs::File::open(e.path())
                    .with_context(|| format!("opening {}", e.path().display()))?;
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_objects_counts_only_added_files() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        std::fs::create_dir_all(repo.join("objects/ab")).unwrap();
        std::fs::create_dir_all(repo.join("objects/cd")).unwrap();
        std::fs::write(repo.join("objects/ab/1.file"), b"old").unwrap();
        let before = list_objects(repo).unwrap();
        assert_eq!(before.len(), 1);
        std::fs::write(repo.join("objects/ab/2.file"), vec![1u8; 5000]).unwrap();
        std::fs::write(repo.join("objects/cd/3.dirtree"), b"xy").unwrap();
        let n = new_objects(repo, &before).unwrap();
        assert_eq!((n.count, n.apparent_bytes), (2, 5002));
        assert!(n.allocated_bytes >= 5000);
    }
}
