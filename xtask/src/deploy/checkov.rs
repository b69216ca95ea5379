//! checkov (from PyPI, pinned) over every rendering at once, in a venv
//! under target/tools. A failed check fails the build unless the manifest
//! skips it inline with a reason (`checkov.io/skipN: CKV_K8S_xx=reason`).
//! A deliberately bad canary is scanned in the same run and must fail, so
//! a scanner that silently checks nothing cannot pass.

use super::Rendered;
use crate::venv::Tool;
use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The pinned checkov release.
pub const VERSION: &str = "3.3.30";
/// One scan of every rendering (about 20 s here).
const SCAN_TIMEOUT: Duration = Duration::from_secs(300);
/// Bound on checkov's JSON report.
const MAX_REPORT_BYTES: u64 = 64 << 20;
/// The canary: privileged, root, no limits. checkov must flag it.
const CANARY: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: canary
  namespace: canary
spec:
  selector:
    matchLabels: {app: canary}
  template:
    metadata:
      labels: {app: canary}
    spec:
      containers:
        - name: canary
          image: example.com/canary:latest
          securityContext:
            privileged: true
";
const CANARY_FILE: &str = "zz-canary.yaml";
/// Checks the canary must fail: privileged, and the `latest` tag.
const CANARY_MUST_FAIL: &[&str] = &["CKV_K8S_16", "CKV_K8S_14"];

/// checkov [`VERSION`], in its venv.
const CHECKOV: Tool = Tool {
    name: "checkov",
    package: "checkov",
    version: VERSION,
    bin: "checkov",
    version_prefix: "",
};

/// Installs checkov [`VERSION`] unless it is already there.
pub fn ensure_installed() -> Result<PathBuf> {
    CHECKOV.ensure_installed()
}

#[derive(Debug, Deserialize)]
struct Report {
    check_type: String,
    results: Results,
    summary: Summary,
}

#[derive(Debug, Deserialize)]
struct Results {
    #[serde(default)]
    failed_checks: Vec<Finding>,
    #[serde(default)]
    skipped_checks: Vec<Finding>,
    #[serde(default)]
    parsing_errors: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Finding {
    check_id: String,
    #[serde(default)]
    check_name: Option<String>,
    file_path: String,
    resource: String,
    #[serde(default)]
    check_result: CheckResult,
}

#[derive(Debug, Default, Deserialize)]
struct CheckResult {
    #[serde(default)]
    suppress_comment: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Summary {
    passed: u64,
    failed: u64,
    resource_count: u64,
    checkov_version: String,
}

/// What a clean scan found.
#[derive(Debug)]
pub struct Outcome {
    pub passed: u64,
    /// `CHECK on FILE RESOURCE: reason`, one per skip.
    pub skipped: Vec<String>,
}

/// Judges checkov's JSON report: the canary fails what it must and nothing
/// else fails; every skip has a reason; nothing failed to parse; every
/// object was seen.
fn judge(json: &str, objects: u64) -> Result<Outcome> {
    let report: Report = serde_json::from_str(json).context("parsing checkov's JSON report")?;
    ensure!(
        report.check_type == "kubernetes",
        "checkov ran {}",
        report.check_type
    );
    ensure!(
        report.summary.checkov_version == VERSION,
        "checkov {} ran, not {VERSION}",
        report.summary.checkov_version
    );
    ensure!(
        report.results.parsing_errors.is_empty(),
        "checkov could not parse: {:?}",
        report.results.parsing_errors
    );
    let is_canary = |f: &Finding| f.file_path.ends_with(CANARY_FILE);
    let (canary, real): (Vec<&Finding>, Vec<&Finding>) = report
        .results
        .failed_checks
        .iter()
        .partition(|f| is_canary(f));
    for must in CANARY_MUST_FAIL {
        ensure!(
            canary.iter().any(|f| f.check_id == *must),
            "checkov did not flag {must} on its canary: it is not checking"
        );
    }
    if !real.is_empty() {
        let lines: Vec<String> = real
            .iter()
            .map(|f| {
                format!(
                    "{} {} on {} ({})",
                    f.check_id,
                    f.check_name.as_deref().unwrap_or(""),
                    f.resource,
                    f.file_path
                )
            })
            .collect();
        bail!(
            "checkov: {} failed check(s) (fix them, or skip one inline with a reason: \
             metadata.annotations `checkov.io/skipN: CKV_K8S_xx=why`):\n  {}",
            lines.len(),
            lines.join("\n  ")
        );
    }
    let mut skipped = Vec::new();
    for s in &report.results.skipped_checks {
        let why = s
            .check_result
            .suppress_comment
            .as_deref()
            .unwrap_or("")
            .trim();
        ensure!(
            why.len() >= 20 && !why.eq_ignore_ascii_case("No comment provided"),
            "checkov: {} is skipped on {} ({}) without a real reason",
            s.check_id,
            s.resource,
            s.file_path
        );
        skipped.push(format!(
            "{} on {} {}: {why}",
            s.check_id, s.file_path, s.resource
        ));
    }
    // Our objects plus the canary; checkov also counts containers.
    ensure!(
        report.summary.resource_count > objects,
        "checkov saw {} resources; the renderings hold {objects} objects and the canary",
        report.summary.resource_count
    );
    ensure!(
        report.summary.failed as usize == canary.len(),
        "checkov's summary disagrees with its findings"
    );
    Ok(Outcome {
        passed: report.summary.passed,
        skipped,
    })
}

/// Writes every rendering and the canary under `work/rendered` and scans
/// them in one checkov run.
pub fn scan(work: &Path, rendered: &[Rendered]) -> Result<Outcome> {
    let bin = ensure_installed()?;
    let dir = work.join("rendered");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut objects = 0u64;
    for r in rendered {
        let p = dir.join(format!("{}.yaml", r.target.name));
        std::fs::write(&p, &r.yaml).with_context(|| format!("writing {}", p.display()))?;
        objects += r.objects.len() as u64;
    }
    std::fs::write(dir.join(CANARY_FILE), CANARY).context("writing the canary")?;
    let mut cmd = Command::new(&bin);
    cmd.arg("--directory")
        .arg(&dir)
        .args([
            "--framework",
            "kubernetes",
            "--output",
            "json",
            "--compact",
            // No Bridgecrew platform: offline, no API key, nothing uploaded.
            "--skip-download",
        ])
        .env("BC_SKIP_MAPPING", "TRUE")
        .env("CHECKOV_RUN_SCA_PACKAGE_SCAN_V2", "false");
    // checkov exits 1 when anything fails, which the canary always does;
    // the report is judged instead.
    let json = run_report(&mut cmd)?;
    judge(&json, objects)
}

fn run_report(cmd: &mut Command) -> Result<String> {
    let out = tempfile::NamedTempFile::new().context("creating a temporary file")?;
    let err = tempfile::NamedTempFile::new().context("creating a temporary file")?;
    let what = format!("{cmd:?}");
    let child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(out.reopen()?)
        .stderr(err.reopen()?)
        .spawn()
        .with_context(|| format!("spawning {what}"))?;
    let mut child = crate::bench::stopper(child, "checkov");
    let status = child.wait_bounded(SCAN_TIMEOUT)?;
    let size = out.as_file().metadata()?.len();
    ensure!(size <= MAX_REPORT_BYTES, "checkov's report is {size} bytes");
    let json = std::fs::read_to_string(out.path()).context("reading checkov's report")?;
    if status.code() != Some(0) && status.code() != Some(1) || json.trim().is_empty() {
        let stderr = std::fs::read_to_string(err.path()).unwrap_or_default();
        bail!("{what} failed ({status}):\n{}", stderr.trim());
    }
    Ok(json)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(failed: &[(&str, &str)], skipped: &[(&str, &str)], count: u64) -> String {
        let f: Vec<_> = failed
            .iter()
            .map(|(id, file)| serde_json::json!({"check_id": id, "file_path": file, "resource": "Deployment.x"}))
            .collect();
        let s: Vec<_> = skipped
            .iter()
            .map(|(id, why)| serde_json::json!({"check_id": id, "file_path": "/base.yaml", "resource": "Deployment.x", "check_result": {"result": "SKIPPED", "suppress_comment": why}}))
            .collect();
        serde_json::json!({
            "check_type": "kubernetes",
            "results": {"failed_checks": f, "skipped_checks": s, "parsing_errors": []},
            "summary": {"passed": 10, "failed": failed.len(), "skipped": skipped.len(), "parsing_errors": 0, "resource_count": count, "checkov_version": VERSION},
        })
        .to_string()
    }

    const CANARY_FAILS: &[(&str, &str)] = &[
        ("CKV_K8S_16", "/zz-canary.yaml"),
        ("CKV_K8S_14", "/zz-canary.yaml"),
    ];
    const REASON: &str = "pinned by tag in the base; digests are set per deployment";

    #[test]
    fn judging_reports() {
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = CANARY_FAILS.to_vec();
            v.extend_from_slice(extra);
            v
        };
        let cases: Vec<(&str, String, Result<usize, &str>)> = vec![
            (
                "clean",
                report(CANARY_FAILS, &[("CKV_K8S_43", REASON)], 20),
                Ok(1),
            ),
            (
                "a real failure",
                report(&with(&[("CKV_K8S_20", "/base.yaml")]), &[], 20),
                Err("CKV_K8S_20"),
            ),
            (
                "canary not flagged",
                report(&[], &[], 20),
                Err("not checking"),
            ),
            (
                "canary half flagged",
                report(&CANARY_FAILS[..1], &[], 20),
                Err("CKV_K8S_14"),
            ),
            (
                "skip without reason",
                report(CANARY_FAILS, &[("CKV_K8S_43", "No comment provided")], 20),
                Err("without a real reason"),
            ),
            (
                "saw too little",
                report(CANARY_FAILS, &[], 3),
                Err("resources"),
            ),
            ("not JSON", "Passed checks: 1".into(), Err("parsing")),
        ];
        for (name, json, want) in cases {
            match (judge(&json, 5), want) {
                (Ok(o), Ok(n)) => assert_eq!(o.skipped.len(), n, "{name}"),
                (Err(e), Err(frag)) => {
                    let e = format!("{e:#}");
                    assert!(e.contains(frag), "{name}: {e}");
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }
}
