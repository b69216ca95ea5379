//! The `staged+importer` arm: a node that imported v1 with the importer
//! runs `oscontent stage` of v2, pinned by digest, against the server
//! streaming v2 from the registry; then the importer imports v2 from the
//! registry, finding every ostree layer staged. Counted at both sources:
//! the server's response bytes for the stage, the registry's access log
//! for the import (layer blobs apart from manifests and the config).

use super::report::{registry_bytes, ArmResult, StagedParts, STAGED_ARM};
use super::{measured, served_bytes, PULL_TIMEOUT};
use crate::bench::scratch::ScratchFs;
use anyhow::{ensure, Context, Result};
use oscontent_testkit::encapsulate::import;
use oscontent_testkit::fixtures::NativeRelease;
use oscontent_testkit::registry::Registry;
use oscontent_testkit::ServerProcess;
use std::path::Path;
use std::process::Command;

/// What the arm needs from the update under test.
#[derive(Debug)]
pub struct Setup<'a> {
    pub scratch: &'a ScratchFs,
    pub reg: &'a Registry,
    pub srv: &'a ServerProcess,
    pub client: &'a Path,
    /// `docker://…` of v1 and v2, by tag.
    pub img1: &'a str,
    pub img2: &'a str,
    pub v1: &'a NativeRelease,
    pub v2: &'a NativeRelease,
}

pub fn arm(s: &Setup<'_>) -> Result<(ArmResult, StagedParts)> {
    let node = s.scratch.path().join("staged");
    import(&node, s.img1, true)?;
    // What a node is given: REFERENCE@sha256:DIGEST, as the MCO's osImageURL.
    let pinned = format!(
        "{}@{}",
        s.img2.strip_prefix("docker://").unwrap_or(s.img2),
        s.v2.image_manifest
    );
    let served = served_bytes(s.srv)?;
    let (stdout, stage_written, stage_seconds) = measured(s.scratch, || {
        let mut cmd = Command::new(s.client);
        cmd.arg("stage")
            .arg("--repo")
            .arg(&node)
            .args(["--url", &s.srv.url, "--image", &pinned, "--json"]);
        oscontent_testkit::check_output(&mut cmd, PULL_TIMEOUT)
            .with_context(|| format!("oscontent stage of {pinned}"))
    })?;
    let oscontent_bytes = served_bytes(s.srv)? - served;
    let staged = staged_event(&stdout)?;
    let count = |key: &str| staged[key].as_u64().unwrap_or(0) as usize;
    let log_before = s.reg.log().len();
    let (imported, import_written, import_seconds) =
        measured(s.scratch, || import(&node, s.img2, true))?;
    ensure!(
        imported.commit == s.v2.commit,
        "the importer got {} for v2 ({}) after the stage",
        imported.commit,
        s.v2.commit
    );
    let log = s.reg.log();
    let layers: Vec<&str> =
        s.v1.layers
            .iter()
            .chain(&s.v2.layers)
            .map(|l| l.digest.as_str())
            .collect();
    let registry = registry_bytes(log.get(log_before..).unwrap_or_default(), &layers);
    let parts = StagedParts {
        registry,
        oscontent_bytes,
        importer_fetched_layers: imported.fetched.len(),
        object_sets_written: count("object_sets_written"),
        object_sets_present: count("object_sets_present"),
        stage_written_bytes: stage_written,
        import_written_bytes: import_written,
        stage_seconds,
        import_seconds,
    };
    let arm = ArmResult {
        arm: STAGED_ARM.into(),
        downloaded_bytes: oscontent_bytes + registry.layers + registry.manifest_and_config,
        reported_bytes: Some(imported.fetched_bytes),
        written_bytes: stage_written + import_written,
        seconds: stage_seconds + import_seconds,
    };
    Ok((arm, parts))
}

/// The stage's `staged` event, from its `--json` output.
fn staged_event(stdout: &str) -> Result<serde_json::Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["event"] == "staged")
        .with_context(|| format!("the stage printed no staged event:\n{stdout}"))
}
