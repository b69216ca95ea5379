//! `cargo xtask bench fleet --stage`: the node agent across a fleet. The
//! server, in its namespace beside a registry holding v1 and v2 of the
//! native image, streams v2 (pinned by digest, signed with a throwaway
//! key) and hands out `--stage-slots`; every node, at v1 as the importer
//! left it, runs `oscontent stage --follow` of the ref at once. Reports
//! the most nodes staging at once (sampled from the server's
//! `oscontent_stage_slots_in_use`, and its own `_peak`), whether every node
//! staged, server egress against N × the new objects, and errors.
//!
//! Order: the fleet's network, the registry (in the server's namespace,
//! so that its traffic never crosses the nodes' links), the node template
//! (the importer's import of v1, run there too), then one wave per fleet
//! size ([`wave`]); the registry goes before the namespaces on every exit.

mod render;
pub mod wave;

use super::topology::Fleet;
use super::{Options, RunHeader};
use crate::bench::check_interrupted;
use crate::bench::new_objects::{new_objects, NewObjects};
use anyhow::{ensure, Context, Result};
use oscontent_testkit::encapsulate::{encapsulator, Imported};
use oscontent_testkit::fixtures::{NativeFixtures, DEFAULT_REF};
use oscontent_testkit::registry::Registry;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use wave::{StageWave, WaveSetup};

/// Where the registry listens, inside the server's namespace.
const REGISTRY_ADDR: &str = "127.0.0.1:5000";
/// One push, or the template's import, of a full-scale release.
const TOOL_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, serde::Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub run: RunHeader,
    pub slots: u32,
    pub retry_after_secs: u64,
    /// The image staged: `sha256:…` of v2's manifest.
    pub digest: String,
    pub new_objects: NewObjects,
    pub waves: Vec<StageWave>,
}

/// The binaries and fixtures [`run`] is given.
#[derive(Debug)]
pub struct Inputs<'a> {
    pub server_bin: &'a Path,
    pub server_profile: String,
    pub client_bin: &'a Path,
    pub fixtures: &'a NativeFixtures,
    pub started: SystemTime,
}

pub fn run(opts: &Options, i: Inputs<'_>) -> Result<()> {
    let f = i.fixtures;
    let [v1, v2] = &f.releases[..] else {
        anyhow::bail!("native fixtures with {} releases", f.releases.len());
    };
    let base = crate::bench::bench_dir()?;
    let work = tempfile::tempdir_in(&base).context("creating the work dir")?;
    let new = new_objects(&f.repo, &v1.commit, &v2.commit)?;
    let max_nodes = opts.nodes.iter().copied().max().unwrap_or(0);
    eprintln!("fleet --stage: creating {max_nodes} node namespaces");
    let fleet = Fleet::create(max_nodes, &opts.shaping)?;
    // Declared after the fleet, so dropped before it: nothing of the
    // registry is left in the namespace when it is deleted.
    let reg = Registry::builder()
        .storage_in(&base.join("tmp"))
        .netns(&fleet.server.name, REGISTRY_ADDR)
        .start()?;
    let img1 = reg.try_push(&f.oci_layout, &v1.version, "native:v1", &[], TOOL_TIMEOUT)?;
    reg.try_push(&f.oci_layout, &v2.version, "native:v2", &[], TOOL_TIMEOUT)?;
    let template = work.path().join("node-template");
    let imported = import_in(&fleet, &template, &img1)?;
    ensure!(
        imported.commit == v1.commit,
        "the importer got {} for v1 ({})",
        imported.commit,
        v1.commit
    );
    let keys = keygen(i.server_bin, &work.path().join("keys"))?;
    let setup = WaveSetup {
        fleet: &fleet,
        image: reg.image(&format!("native@{}", v2.image_manifest)),
        registry: REGISTRY_ADDR.to_owned(),
        digest: v2.image_manifest.clone(),
        ref_name: DEFAULT_REF.to_owned(),
        template,
        secret_key: keys.0,
        public_key: keys.1,
        slots: opts.stage_slots,
        retry_after_secs: opts.stage_retry_after,
        server_bin: i.server_bin,
        client_bin: i.client_bin,
    };
    let mut waves = Vec::new();
    for &n in &opts.nodes {
        for repeat in 0..opts.repeat.max(1) {
            check_interrupted()?;
            eprintln!("fleet --stage: {n} nodes, run {}", repeat + 1);
            let w = wave::run(&setup, n, repeat, &work.path().join("wave"))
                .with_context(|| format!("the {n}-node staging wave, run {}", repeat + 1))?;
            eprintln!("{}", render::one_line(&w, &new));
            waves.push(w);
        }
    }
    drop(reg);
    drop(fleet);
    let report = Report {
        run: RunHeader::new(opts, i.started, i.server_profile),
        slots: opts.stage_slots,
        retry_after_secs: opts.stage_retry_after,
        digest: v2.image_manifest.clone(),
        new_objects: new,
        waves,
    };
    crate::bench::report::publish("fleet-stage", i.started, &report, &render::table(&report))?;
    Ok(())
}

/// The importer's import of `image` into a new bare-user repo at `repo`,
/// run in the server's namespace, where the registry is; its output goes
/// to `repo`.log.
fn import_in(fleet: &Fleet, repo: &Path, image: &str) -> Result<Imported> {
    let mut cmd = fleet.server.exec(encapsulator()?);
    cmd.arg("import")
        .arg("--repo")
        .arg(repo)
        .args([image, "--insecure-registry"]);
    // Bounded, and ended by Ctrl-C, so that the namespaces go soon after.
    let log = repo.with_extension("log");
    crate::bench::run_bounded(&mut cmd, &log, TOOL_TIMEOUT)
        .with_context(|| format!("importing {image}"))?;
    let out =
        std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
    let line = out
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .with_context(|| format!("the importer printed no JSON: {out:?}"))?;
    serde_json::from_str(line).with_context(|| format!("parsing {line:?}"))
}

/// A throwaway signing key the server signs v2's commit and summary with,
/// so that agents can verify what they follow: (secret, public).
fn keygen(server_bin: &Path, dir: &Path) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (secret, public) = (dir.join("fleet.sec"), dir.join("fleet.pub"));
    let mut cmd = std::process::Command::new(server_bin);
    cmd.args(["keygen", "--uid", "fleet <fleet@example.com>"])
        .arg("--out-secret")
        .arg(&secret)
        .arg("--out-public")
        .arg(&public);
    oscontent_testkit::check_output(&mut cmd, Duration::from_secs(60))
        .context("oscontent-server keygen")?;
    Ok((secret, public))
}
