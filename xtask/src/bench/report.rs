//! What every benchmark reports, one way: summary statistics, where the
//! results JSON goes and how it is written next to the printed table, the
//! git revision and the machine it ran on.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cargo;

/// Median, minimum and maximum of a sample.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Summary {
    pub fn of(values: &[f64]) -> Summary {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Summary {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                n: 0,
            };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Summary {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        }
    }
}

/// `target/bench`, created.
pub fn bench_dir() -> Result<PathBuf> {
    let dir = cargo::target_dir().join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// `target/bench/<name>-<UTC timestamp of started>.json`.
pub fn results_path(name: &str, started: SystemTime) -> Result<PathBuf> {
    Ok(bench_dir()?.join(format!("{name}-{}.json", utc_stamp(started))))
}

/// `YYYYMMDDTHHMMSSZ` for a time (UTC; civil-from-days, no time crate).
pub fn utc_stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The workspace's git commit and whether the tree is dirty, for the
/// record (best effort).
pub fn git_state() -> Option<String> {
    let root = crate::fixtures::workspace_root();
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(&root)
        .output()
        .ok()
        .is_some_and(|o| !o.stdout.is_empty());
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    Some(if dirty { format!("{head}-dirty") } else { head })
}

/// The 1-minute load average and CPU count (how busy the machine was).
pub fn load() -> (f64, usize) {
    let la = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
        .unwrap_or(f64::NAN);
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    (la, cpus)
}

/// `target/bench/<name>-<UTC timestamp of started>.logs`, created.
pub fn logs_dir(name: &str, started: SystemTime) -> Result<PathBuf> {
    let logs = bench_dir()?.join(format!("{name}-{}.logs", utc_stamp(started)));
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    Ok(logs)
}

/// The running kernel's release (`uname -r`), empty if unknown.
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// The server binary a benchmark runs and how it was built: the given one
/// ("given"), or the release build ([`super::process::server_binary`]).
pub fn server(given: Option<&Path>) -> Result<(PathBuf, String)> {
    let (bin, profile) = match given {
        Some(p) => (
            std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))?,
            "given".to_owned(),
        ),
        None => {
            let (p, prof) = super::process::server_binary()?;
            (p, prof.to_owned())
        }
    };
    anyhow::ensure!(bin.is_file(), "no server binary at {}", bin.display());
    Ok((bin, profile))
}

/// Writes `report` as `target/bench/<name>-<stamp>.json`, then prints
/// `table` and where the JSON went.
pub fn publish<R: serde::Serialize>(
    name: &str,
    started: SystemTime,
    report: &R,
    table: &str,
) -> Result<PathBuf> {
    let mut json = serde_json::to_string_pretty(report)?;
    json.push('\n');
    let (mut file, path) = create_results(name, started)?;
    std::io::Write::write_all(&mut file, json.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    print!("{table}");
    println!("results: {}", path.display());
    Ok(path)
}

/// A new file at [`results_path`], or, when a run started in the same
/// second has it (two shares run at once), at `<name>-<stamp>-2.json` and
/// so on: one run's results never overwrite another's.
fn create_results(name: &str, started: SystemTime) -> Result<(std::fs::File, PathBuf)> {
    let first = results_path(name, started)?;
    let mut path = first.clone();
    for n in 2..=100 {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => return Ok((f, path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                path = first.with_file_name(format!("{name}-{}-{n}.json", utc_stamp(started)));
            }
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
    anyhow::bail!("{} and 99 more names taken", first.display())
}

/// `scratch: XFS on loop (direct-io), 12.3 MiB`, the head of a table's
/// machine line.
pub fn scratch_line(direct_io: bool, bytes: u64) -> String {
    format!(
        "scratch: XFS on loop ({}), {}",
        if direct_io {
            "direct-io"
        } else {
            "NO direct-io"
        },
        mib(bytes as f64)
    )
}

/// `12.3 MiB`.
pub fn mib(b: f64) -> String {
    format!("{:.1} MiB", b / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn stamp() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_736_899_200 + 3_723);
        assert_eq!(utc_stamp(t), "20250115T010203Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(utc_stamp(leap), "20000229T000000Z");
    }

    #[test]
    fn runs_started_in_the_same_second_get_files_of_their_own() {
        let name = format!("publish-test-{}", std::process::id());
        let t = UNIX_EPOCH + Duration::from_secs(1);
        let (_, a) = create_results(&name, t).unwrap();
        let (_, b) = create_results(&name, t).unwrap();
        let (_, c) = create_results(&name, t).unwrap();
        let names: Vec<String> = [&a, &b, &c]
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for p in [&a, &b, &c] {
            std::fs::remove_file(p).unwrap();
        }
        assert_eq!(
            names,
            [
                format!("{name}-19700101T000001Z.json"),
                format!("{name}-19700101T000001Z-2.json"),
                format!("{name}-19700101T000001Z-3.json"),
            ]
        );
    }

    #[test]
    fn summary() {
        let s = Summary::of(&[3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        assert_eq!(Summary::of(&[4.0, 1.0]).median, 2.5);
        assert!(Summary::of(&[]).median.is_nan());
    }
}
