//! The repos of a fleet run: what the servers serve (the fixtures' archive
//! repo with v2 on the ref and a summary, with or without the v1→v2 static
//! delta oscontent-server generates, exported once into the copy so that
//! nginx serves exactly the same files), and the node
//! repos (bare-user, at v1, as nodes are before the update). Objects are
//! hardlinked from the fixtures and from one node template: nothing in
//! them is ever rewritten, and a hundred nodes cost the disk only what
//! each one pulls.

use super::topology::server_addr;
use anyhow::{ensure, Context, Result};
use oscontent_testkit::{check_output, Ostree, ServerProcess};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Bound on one `ostree` or `cp` over a full-scale repo.
const REPO_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// The remote every node has.
pub const REMOTE: &str = "os";

/// One served repo.
#[derive(Debug, Clone)]
pub struct Served {
    pub dir: PathBuf,
    /// Bytes of the v1→v2 delta's files (superblock and parts), if any.
    pub delta_bytes: Option<u64>,
}

/// Everything the waves share.
#[derive(Debug, Clone)]
pub struct Repos {
    pub plain: Served,
    pub with_delta: Served,
    pub template: PathBuf,
    pub v1: String,
    pub v2: String,
    pub ref_name: String,
    /// Objects v2 reaches and v1 does not, and their bytes as served
    /// (archive files: `.filez` compressed, metadata as is).
    pub new_objects: usize,
    pub new_bytes: u64,
}

fn run(cmd: &mut Command) -> Result<String> {
    check_output(cmd, REPO_TIMEOUT)
}

/// `cp -a SRC/. DST` except `objects`, which is hardlinked (`cp -al`).
pub fn link_copy(src: &Path, dst: &Path) -> Result<()> {
    std::fs::create_dir_all(dst).with_context(|| format!("creating {}", dst.display()))?;
    for e in std::fs::read_dir(src).with_context(|| format!("listing {}", src.display()))? {
        let e = e?;
        let flag = if e.file_name() == "objects" {
            "-al"
        } else {
            "-a"
        };
        run(Command::new("cp").arg(flag).arg(e.path()).arg(dst))?;
    }
    Ok(())
}

/// Replaces `repo`'s `refs/heads/REF` (never writing through a hardlink).
fn set_ref(repo: &Path, ref_name: &str, commit: &str) -> Result<()> {
    let path = repo.join("refs/heads").join(ref_name);
    let parent = path.parent().context("ref path")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, format!("{commit}\n"))
        .with_context(|| format!("writing {}", path.display()))
}

fn served(source: &Path, dir: &Path, r: &Repos, delta: Option<&Path>) -> Result<Served> {
    link_copy(source, dir)?;
    set_ref(dir, &r.ref_name, &r.v2)?;
    let delta_bytes = match delta {
        Some(server_bin) => {
            export_server_delta(server_bin, dir, r)?;
            Some(dir_bytes(&dir.join("deltas"))?)
        }
        None => {
            let repo = format!("--repo={}", dir.display());
            run(Command::new("ostree").args([&repo, "summary", "-u"]))?;
            None
        }
    };
    Ok(Served {
        dir: dir.to_owned(),
        delta_bytes,
    })
}

/// Bound on the server's publication and delta generation at prepare time.
const DELTA_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Serves `dir` (v1 on a `version/` ref beside v2 on the ref, no summary
/// of its own) with oscontent-server on loopback until it has generated
/// the v1→v2 delta, then writes what it serves into `dir`: the delta's
/// files, its index and the summary (which says to use delta indexes).
fn export_server_delta(server_bin: &Path, dir: &Path, r: &Repos) -> Result<()> {
    set_ref(dir, "version/v1", &r.v1)?;
    let state = tempfile::tempdir().context("a scratch state dir")?;
    let mut cmd = Command::new(server_bin);
    cmd.arg("serve")
        .arg("--repo")
        .arg(dir)
        .arg("--state-dir")
        .arg(state.path())
        .args(["--listen", "127.0.0.1:0"]);
    let server = ServerProcess::spawn(&mut cmd, DELTA_TIMEOUT)?;
    let client = oscontent_testkit::http::http1();
    let get = |path: &str| -> Result<Vec<u8>> {
        let r = oscontent_testkit::http::fetch(&client, &format!("{}/{path}", server.url), &[])?;
        ensure!(r.status == 200, "{path}: HTTP {}", r.status);
        Ok(r.body)
    };
    let published = oscontent_testkit::wait_for(DELTA_TIMEOUT, Duration::from_millis(200), || {
        let m = oscontent_testkit::Metrics::parse(&String::from_utf8_lossy(&get("metrics").ok()?))
            .ok()?;
        (m.get("oscontent_deltas_published", &[]) >= Some(1.0)).then_some(())
    });
    ensure!(
        published.is_some(),
        "oscontent-server made no delta within {DELTA_TIMEOUT:?}"
    );
    // The one stored delta, laid out as in a repo: deltas/XX/<from>-<to>.
    let stored = std::fs::read_dir(state.path().join("deltas"))?
        .filter_map(|e| e.ok().map(|e| e.path().join("deltas")))
        .find(|p| p.is_dir())
        .context("the stored delta")?;
    run(Command::new("cp").arg("-a").arg(&stored).arg(dir))?;
    let prefix = std::fs::read_dir(&stored)?.next().context("deltas/XX")??;
    let rest = std::fs::read_dir(prefix.path())?
        .next()
        .context("deltas/XX/REST")??;
    let joined = format!(
        "{}{}",
        prefix.file_name().to_string_lossy(),
        rest.file_name().to_string_lossy()
    );
    // The index is named by the target's modified base64, the part after '-'.
    let to = joined.split_once('-').context("a from-to delta")?.1;
    let index = format!("delta-indexes/{}/{}.index", &to[..2], &to[2..]);
    let bytes = get(&index)?;
    let index_path = dir.join(&index);
    std::fs::create_dir_all(index_path.parent().context("index dir")?)?;
    std::fs::write(&index_path, bytes)?;
    let summary = get("summary")?;
    std::fs::write(dir.join("summary"), summary)?;
    Ok(())
}

/// Apparent bytes of the regular files under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let files =
        oscontent_testkit::files::walk_tree(dir, |_, m| Ok(if m.is_file() { m.len() } else { 0 }))?;
    Ok(files.values().sum())
}

/// Builds everything under `work` from the fixtures' archive repo.
pub fn prepare(
    source: &Path,
    v1: &str,
    v2: &str,
    ref_name: &str,
    work: &Path,
    server_bin: &Path,
) -> Result<Repos> {
    let new = crate::bench::new_objects::new_objects(source, v1, v2)?;
    let mut r = Repos {
        plain: Served {
            dir: PathBuf::new(),
            delta_bytes: None,
        },
        with_delta: Served {
            dir: PathBuf::new(),
            delta_bytes: None,
        },
        template: work.join("node-template"),
        v1: v1.to_owned(),
        v2: v2.to_owned(),
        ref_name: ref_name.to_owned(),
        new_objects: new.count,
        new_bytes: new.bytes,
    };
    r.plain = served(source, &work.join("served-plain"), &r, None)?;
    r.with_delta = served(source, &work.join("served-delta"), &r, Some(server_bin))?;
    let node = Ostree::init(&r.template, "bare-user")?;
    node.run(["pull-local".as_ref(), source.as_os_str(), v1.as_ref()])?;
    node.remote_add(REMOTE, &format!("http://{}", server_addr()), &[])?;
    node.run(["refs", &format!("--create={REMOTE}:{ref_name}"), v1])?;
    Ok(r)
}

/// A fresh node repo at `dir` from the template.
pub fn fresh_node(r: &Repos, dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    link_copy(&r.template, dir)
}

/// The commit `REMOTE:REF` points at in a node repo.
pub fn node_head(dir: &Path, ref_name: &str) -> Result<String> {
    let p = dir.join("refs/remotes").join(REMOTE).join(ref_name);
    let s = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    let s = s.trim().to_owned();
    ensure!(s.len() == 64, "{} holds {s:?}", p.display());
    Ok(s)
}
