//! Runs the workspace's test executables two at a time.
//!
//! `cargo test` runs one test binary after another, and the end-to-end
//! suites spend most of their time waiting on child processes (servers,
//! registries, `ostree`), so the machine's cores idle. Two cargo processes
//! cannot share the target directory either: the second waits on the
//! first's lock for its whole run. So this asks cargo for the executables
//! it built and runs them itself, longest first, each with the
//! environment and working directory `cargo test` would give it, its
//! output kept in a log and printed whole when it ends. The fuzz targets
//! (their build and a short run, [`crate::fuzz::ci`]) are one more job in
//! the same schedule: mostly CPU where the suites mostly wait.

use crate::cargo::{bin_dir, target_dir};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Bound on one test executable.
const SUITE_TIMEOUT: Duration = Duration::from_secs(25 * 60);
/// Suites that spend their time waiting out the server's timeouts (`abuse`:
/// about 18 CPU-seconds in 115 s): they run on a lane of their own beside
/// the `jobs` workers, instead of holding one of them while the cores idle.
const WAITING: &[&str] = &["abuse"];
/// The slowest suites, started first so that the short ones fill the gaps
/// at the end (measured two at a time on 2 cores: pull and image ~225 s,
/// mirror and abuse ~135 s, the rest under a minute).
const SLOW_FIRST: &[&str] = &[
    "pull", "image", "mirror", "abuse", "hostile", "serve", "signing", "deploy",
];

/// One job of the schedule.
#[derive(Debug, Clone)]
enum Job {
    Test(Executable),
    /// Build every fuzz target and run each briefly.
    Fuzz,
}

impl Job {
    /// Where it goes in the queue: the fuzz build (minutes on a cold
    /// target dir) and run are the longest job, so they start first.
    fn rank(&self) -> usize {
        match self {
            Job::Fuzz => 0,
            Job::Test(e) => {
                let target = e.name.rsplit('/').next().unwrap_or_default();
                1 + SLOW_FIRST
                    .iter()
                    .position(|s| *s == target)
                    .unwrap_or(SLOW_FIRST.len())
            }
        }
    }

    fn waits(&self) -> bool {
        match self {
            Job::Fuzz => false,
            Job::Test(e) => WAITING.contains(&e.name.rsplit('/').next().unwrap_or_default()),
        }
    }

    fn run(&self, logs: &Path, tmp: Option<&Path>) -> Outcome {
        match self {
            Job::Test(e) => run_one(e, logs, tmp),
            Job::Fuzz => run_fuzz(),
        }
    }
}

/// One test executable as cargo reported it.
#[derive(Debug, Clone)]
struct Executable {
    /// `package-folder/target` for messages and log names.
    name: String,
    path: PathBuf,
    /// The package's directory: cargo runs tests there.
    manifest_dir: PathBuf,
}

/// How one executable ended.
#[derive(Debug)]
struct Outcome {
    name: String,
    passed: bool,
    took: Duration,
    /// Tests passed, failed and ignored, from its `test result:` lines.
    counts: [u64; 3],
}

/// Lists the test executables (building them if needed), runs them (and
/// the fuzz job, with `fuzz`) `jobs` at a time, then the doc tests; fails
/// if any failed, after all ran.
pub fn run(jobs: usize, fuzz: bool) -> Result<()> {
    let mut queue: Vec<Job> = executables()?.into_iter().map(Job::Test).collect();
    if fuzz {
        queue.push(Job::Fuzz);
    }
    queue.sort_by_key(Job::rank);
    let (waiting, queue): (Vec<Job>, Vec<Job>) = queue.into_iter().partition(Job::waits);
    let logs = target_dir().join("test-logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    eprintln!(
        "xtask: running {} jobs, {jobs} at a time, and {} mostly waiting beside them (logs in {})",
        queue.len(),
        waiting.len(),
        logs.display()
    );
    let scratch = scratch()?;
    let tmp = scratch.as_ref().map(|d| d.path().to_owned());
    if let Some(t) = &tmp {
        eprintln!(
            "xtask: the suites' temporary files in {} (tmpfs)",
            t.display()
        );
    }
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let lane = |queue: Arc<Mutex<std::vec::IntoIter<Job>>>| {
        let (outcomes, logs, tmp) = (outcomes.clone(), logs.clone(), tmp.clone());
        std::thread::spawn(move || {
            // The guard must not live through the run (a `while let`
            // scrutinee's temporaries would, in edition 2021).
            let next = || queue.lock().ok().and_then(|mut q| q.next());
            while let Some(job) = next() {
                let outcome = job.run(&logs, tmp.as_deref());
                if let Ok(mut o) = outcomes.lock() {
                    o.push(outcome);
                }
            }
        })
    };
    let queue = Arc::new(Mutex::new(queue.into_iter()));
    let mut workers: Vec<_> = (0..jobs.max(1)).map(|_| lane(queue.clone())).collect();
    if !waiting.is_empty() {
        workers.push(lane(Arc::new(Mutex::new(waiting.into_iter()))));
    }
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a test runner thread panicked"))?;
    }
    let doc = crate::cargo::linted(&["test", "--workspace", "--doc", "--quiet"]);
    let outcomes = std::mem::take(&mut *outcomes.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    report(&outcomes);
    let failed: Vec<_> = outcomes
        .iter()
        .filter(|o| !o.passed)
        .map(|o| &o.name)
        .collect();
    if !failed.is_empty() {
        bail!("test executables failed: {failed:?}");
    }
    doc.context("doc tests")
}

/// Runs one executable with its output in `logs/NAME.log`, then prints the
/// log (whole on failure, its result lines on success).
fn run_one(exe: &Executable, logs: &Path, tmp: Option<&Path>) -> Outcome {
    let file: String = exe
        .name
        .chars()
        .filter(|c| !matches!(c, '(' | ')'))
        .map(|c| if c == '/' || c == ' ' { '-' } else { c })
        .collect();
    let log = logs.join(format!("{file}.log"));
    let start = Instant::now();
    let passed = match spawn_logged(exe, &log, tmp) {
        Ok(status) => status,
        Err(e) => {
            eprintln!("xtask: {}: {e:#}", exe.name);
            false
        }
    };
    let took = start.elapsed();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let shown: String = if passed {
        text.lines()
            .filter(|l| l.starts_with("test result:") || l.contains(" attacks tried, "))
            .map(|l| format!("    {l}\n"))
            .collect()
    } else {
        text.clone()
    };
    eprintln!(
        "xtask: {} {} in {:.0} s\n{shown}",
        exe.name,
        if passed { "passed" } else { "FAILED" },
        took.as_secs_f64()
    );
    Outcome {
        name: exe.name.clone(),
        passed,
        took,
        counts: counts(&text),
    }
}

/// The fuzz job: its report printed when it ends, like a suite's; its
/// counts are targets passed and failed.
fn run_fuzz() -> Outcome {
    let start = Instant::now();
    let result = crate::fuzz::ci();
    let took = start.elapsed();
    let (passed, counts) = match &result {
        Ok(o) => (true, [o.len() as u64, 0, 0]),
        Err(e) => {
            eprintln!("xtask: fuzz: {e:#}");
            (false, [0, 1, 0])
        }
    };
    eprintln!(
        "xtask: fuzz {} in {:.0} s",
        if passed { "passed" } else { "FAILED" },
        took.as_secs_f64()
    );
    Outcome {
        name: "fuzz".into(),
        passed,
        took,
        counts,
    }
}

/// Where the suites' temporary files go, unless the caller chose with
/// TMPDIR: a directory of our own on /dev/shm when that is a tmpfs
/// (removed when the run ends, whatever the tests left). On the root ext4
/// of a CI machine, after the suites' thousands of repos created and
/// deleted, each new inode cost a scan of recently deleted ones
/// (`recently_deleted`, `find_inode_bit`: 17% of all CPU during the pull
/// suite), and the suite took 136 s against 58 s on tmpfs. The tests that
/// need a filesystem's limits or durability mount their own (a small tmpfs
/// for a full disk, XFS on a loop device in the benchmarks).
///
/// Only with room to spare: the suites peaked at 585 MiB there (two lanes
/// and the waiting one), and a container's /dev/shm may be 64 MiB.
fn scratch() -> Result<Option<tempfile::TempDir>> {
    const SHM: &str = "/dev/shm";
    const ROOM: u64 = 4 << 30;
    if std::env::var_os("TMPDIR").is_some() || !tmpfs_with_room(Path::new(SHM), ROOM) {
        return Ok(None);
    }
    let dir = tempfile::Builder::new()
        .prefix("oscontent-tests-")
        .tempdir_in(SHM)
        .with_context(|| format!("creating a scratch directory in {SHM}"))?;
    Ok(Some(dir))
}

fn tmpfs_with_room(path: &Path, room: u64) -> bool {
    // linux/magic.h
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    rustix::fs::statfs(path).is_ok_and(|s| {
        s.f_type == TMPFS_MAGIC && s.f_bavail.saturating_mul(s.f_bsize as u64) >= room
    })
}

/// Whether the executable passed, bounded by [`SUITE_TIMEOUT`].
fn spawn_logged(exe: &Executable, log: &Path, tmp: Option<&Path>) -> Result<bool> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(&exe.path);
    if let Some(t) = tmp {
        cmd.env("TMPDIR", t);
    }
    cmd.current_dir(&exe.manifest_dir)
        .env("CARGO_MANIFEST_DIR", &exe.manifest_dir)
        .env("OSCONTENT_BIN_DIR", bin_dir())
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {}", exe.path.display()))?;
    let mut child = oscontent_testkit::process::Stopper::new(child, &exe.name);
    child.grace = Duration::from_secs(10);
    Ok(child.wait_bounded(SUITE_TIMEOUT)?.success())
}

/// Passed, failed and ignored tests summed over libtest's `test result:`
/// lines ("test result: ok. 8 passed; 0 failed; 1 ignored; ...").
fn counts(log: &str) -> [u64; 3] {
    let mut total = [0; 3];
    for line in log.lines().filter(|l| l.starts_with("test result:")) {
        for part in line.split(['.', ';']) {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let slot = match what {
                "passed" => 0,
                "failed" => 1,
                "ignored" => 2,
                _ => continue,
            };
            total[slot] += n.parse::<u64>().unwrap_or(0);
        }
    }
    total
}

/// Each executable's time, slowest first, and the totals.
fn report(outcomes: &[Outcome]) {
    let sum = |i: usize| outcomes.iter().map(|o| o.counts[i]).sum::<u64>();
    eprintln!(
        "xtask: {} tests passed, {} failed, {} ignored in {} executables",
        sum(0),
        sum(1),
        sum(2),
        outcomes.len()
    );
    let mut sorted: Vec<_> = outcomes.iter().collect();
    sorted.sort_by_key(|o| std::cmp::Reverse(o.took));
    eprintln!("xtask: test executables, slowest first:");
    for o in sorted {
        eprintln!(
            "    {:>6.1} s  {}  {}",
            o.took.as_secs_f64(),
            if o.passed { "ok    " } else { "FAILED" },
            o.name
        );
    }
}

/// The test executables of the workspace, from cargo's build messages.
fn executables() -> Result<Vec<Executable>> {
    // With the lints of the build before it, or it would compile every
    // workspace member again.
    let mut cmd = crate::cargo::command(&[
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    crate::cargo::with_lints(&mut cmd)?;
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo test --no-run")?;
    anyhow::ensure!(
        out.status.success(),
        "cargo test --no-run failed: {}",
        out.status
    );
    parse_messages(&String::from_utf8_lossy(&out.stdout))
}

/// Test executables in cargo's JSON messages (one object per line).
fn parse_messages(stdout: &str) -> Result<Vec<Executable>> {
    let mut found = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let m: serde_json::Value = serde_json::from_str(line).context("a cargo JSON message")?;
        if m["reason"] != "compiler-artifact" || m["profile"]["test"] != true {
            continue;
        }
        let Some(path) = m["executable"].as_str() else {
            continue;
        };
        let manifest = m["manifest_path"].as_str().context("manifest_path")?;
        let target = m["target"]["name"].as_str().context("target name")?;
        // A crate's lib and bin may share a name: say which.
        let kind = match m["target"]["kind"][0].as_str() {
            Some(k @ ("lib" | "bin")) => format!(" ({k})"),
            _ => String::new(),
        };
        let pkg_dir = Path::new(manifest)
            .parent()
            .context("manifest without a directory")?;
        let folder = pkg_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        found.push(Executable {
            name: format!("{folder}/{target}{kind}"),
            path: PathBuf::from(path),
            manifest_dir: pkg_dir.to_owned(),
        });
    }
    anyhow::ensure!(!found.is_empty(), "cargo reported no test executables");
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_test_executables_only() {
        let lines = [
            r#"{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"name":"image","kind":["test"]},"profile":{"test":true},"executable":"/t/debug/deps/image-1"}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/server/Cargo.toml","target":{"name":"oscontent_server","kind":["lib"]},"profile":{"test":false},"executable":null}"#,
            r#"{"reason":"compiler-artifact","manifest_path":"/w/server/Cargo.toml","target":{"name":"oscontent-server","kind":["bin"]},"profile":{"test":false},"executable":"/t/debug/oscontent-server"}"#,
            r#"{"reason":"build-finished","success":true}"#,
        ];
        let found = parse_messages(&lines.join("\n")).unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].name, "tests/image");
        assert_eq!(found[0].manifest_dir, Path::new("/w/tests"));
    }

    #[test]
    fn counts_libtest_results() {
        let table = [
            ("test result: ok. 8 passed; 0 failed; 1 ignored; 0 measured", [8, 0, 1]),
            (
                "test result: FAILED. 2 passed; 3 failed; 0 ignored\ntest result: ok. 1 passed; 0 failed; 0 ignored",
                [3, 3, 0],
            ),
            ("no result at all", [0, 0, 0]),
        ];
        for (log, want) in table {
            assert_eq!(counts(log), want, "{log}");
        }
    }

    #[test]
    fn fuzz_job_first_then_slowest_suites() {
        let exe = |name: &str| {
            Job::Test(Executable {
                name: name.into(),
                path: PathBuf::new(),
                manifest_dir: PathBuf::new(),
            })
        };
        let mut jobs = [
            exe("server/http_app"),
            exe("tests/image"),
            Job::Fuzz,
            exe("tests/pull"),
        ];
        jobs.sort_by_key(Job::rank);
        let order: Vec<String> = jobs
            .iter()
            .map(|j| match j {
                Job::Fuzz => "fuzz".into(),
                Job::Test(e) => e.name.clone(),
            })
            .collect();
        assert_eq!(
            order,
            ["fuzz", "tests/pull", "tests/image", "server/http_app"]
        );
    }

    #[test]
    fn only_the_waiting_suites_get_their_own_lane() {
        let exe = |name: &str| {
            Job::Test(Executable {
                name: name.into(),
                path: PathBuf::new(),
                manifest_dir: PathBuf::new(),
            })
        };
        let table = [
            (exe("tests/abuse"), true),
            (exe("tests/pull"), false),
            (exe("server/abuse_free"), false),
            (Job::Fuzz, false),
        ];
        for (job, waits) in table {
            assert_eq!(job.waits(), waits, "{job:?}");
        }
    }

    #[test]
    fn no_executables_is_an_error() {
        assert!(parse_messages(r#"{"reason":"build-finished","success":true}"#).is_err());
    }
}
