//! `cargo xtask bench serve`: what one request costs the server. The
//! request mix of one stock `ostree pull` of the fixture repo (recorded
//! once from oscontent-server's access log, cached under target/bench),
//! replayed with `h2load` over HTTP/1.1 and h2c at several concurrencies
//! (each connection an h2load of its own with its share of the mix, so that
//! every path is asked for once, as in the pull)
//! against nginx (sendfile), `ostree trivial-httpd` and oscontent-server,
//! all serving the same repo in the same run, interleaved so that the
//! machine's other load falls on each alike. Reported: req/s, MiB/s,
//! p50/p99, errors, server CPU-seconds, requests per CPU-second and peak
//! RSS, each also as a ratio to nginx.
//!
//! With two or more CPUs the servers are pinned to CPU 0 and h2load to
//! CPU 1 (`taskset`), so the load generator does not steal the measured
//! core; nginx runs one worker, tokio one worker thread (it sizes its pool
//! from the affinity mask).

pub mod h2load;
pub mod report;
pub mod servers;

use super::{check_interrupted, run_bounded, utc_stamp};
use anyhow::{bail, ensure, Context, Result};
use h2load::Proto;
use oscontent_testkit::fixtures::{ensure_native, native_default_dir, FixtureSpec, Scale};
use oscontent_testkit::ServerProcess;
use report::{Report, Sample};
use servers::Arm;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

/// One h2load replay (a full-scale mix at trivial-httpd's pace is ~5 s).
const REPLAY_TIMEOUT: Duration = Duration::from_secs(180);
/// The one stock pull that records the mix.
const RECORD_TIMEOUT: Duration = Duration::from_secs(20 * 60);

/// The benchmark's options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Fixture scale: full (31k objects, 720 MiB; the real benchmark) or
    /// small (a quick run).
    #[arg(long, value_enum, default_value_t = Scale::Full)]
    pub scale: Scale,
    /// Repetitions of each (server, protocol, concurrency).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Concurrencies: connections for HTTP/1.1, streams for h2c.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 64, 256])]
    pub concurrency: Vec<u32>,
    /// Protocols.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Proto::H1, Proto::H2c])]
    pub proto: Vec<Proto>,
    /// How the mix is spread over the connections: split (every path once,
    /// as one pull asks) or shared (as `h2load -i -c N` does it, and as
    /// the earliest HISTORY.md tables were measured: every connection from
    /// the first path).
    #[arg(long, value_enum, default_value_t = h2load::Replay::Split)]
    pub replay: h2load::Replay,
    /// Servers (nginx is the anchor of every ratio and always runs).
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Arm::Nginx, Arm::TrivialHttpd, Arm::Oscontent])]
    pub arms: Vec<Arm>,
    /// Do not pin the servers and h2load to separate CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// Extra arguments for `oscontent-server serve` (e.g. `--cache-size=0`).
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    pub server_args: Vec<String>,
    /// This oscontent-server binary instead of building the release one.
    #[arg(long, value_name = "PATH")]
    pub server_bin: Option<PathBuf>,
}

pub fn run(opts: &Options) -> Result<()> {
    super::interrupt()?;
    check_tools()?;
    let started = SystemTime::now();
    let (bin, profile) = super::report::server(opts.server_bin.as_deref())?;
    let spec = FixtureSpec::new(opts.scale);
    let f = ensure_native(&spec, &native_default_dir(&spec))?;
    let v1 = f
        .releases
        .first()
        .context("native fixtures without releases")?;
    let base = super::bench_dir()?;
    let logs = super::report::logs_dir("serve", started)?;
    let mix = mix(&bin, &f.repo, &v1.commit, opts.scale, &logs)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (server_cpu, client_cpu) = if opts.no_pin || cpus < 2 {
        (None, None)
    } else {
        (Some(0), Some(1))
    };
    let work = servers::work_dir(&base)?;
    let state = tempfile::tempdir_in(&base).context("creating the server's state dir")?;
    let mut arms = vec![(Arm::Nginx, servers::nginx(&f.repo, &work, server_cpu)?)];
    for &arm in opts.arms.iter().filter(|a| **a != Arm::Nginx) {
        let r = match arm {
            Arm::TrivialHttpd => servers::trivial_httpd(&f.repo, &work, server_cpu)?,
            _ => servers::oscontent(
                &bin,
                &f.repo,
                &v1.commit,
                state.path(),
                &opts.server_args,
                server_cpu,
            )?,
        };
        arms.push((arm, r));
    }
    let replays = Replays {
        mix: &mix,
        how: opts.replay,
        logs: &logs,
        client_cpu,
    };
    let mut samples = Vec::new();
    for rep in 0..opts.runs {
        for &proto in &opts.proto {
            for &conc in &opts.concurrency {
                for (arm, r) in &arms {
                    check_interrupted()?;
                    if let Some(s) = replays.one(*arm, r, proto, conc, rep)? {
                        samples.push(s);
                    }
                }
            }
        }
    }
    let peak_rss = arms
        .iter()
        .map(|(a, r)| (*a, servers::tree_peak_rss(r.pid)))
        .collect();
    let (load, cpus) = super::load();
    let report = Report {
        started: utc_stamp(started),
        git: super::git_state(),
        kernel: super::report::kernel(),
        scale: opts.scale.to_string(),
        server_profile: profile,
        server_args: opts.server_args.clone(),
        pinned: server_cpu.is_some(),
        load_average: load,
        cpus,
        requests_per_replay: mix.len(),
        mix_bytes: mix_bytes(&f.repo, &mix),
        replay: opts.replay,
        samples,
        peak_rss,
    };
    super::report::publish("serve", started, &report, &report::render(&report))?;
    Ok(())
}

/// What the replay needs that does not come from `Options`.
fn check_tools() -> Result<()> {
    for (tool, pkg) in [
        ("h2load", "nghttp2-client"),
        ("nginx", "nginx-light"),
        ("taskset", "util-linux"),
    ] {
        ensure!(
            crate::deps::which(tool).is_some(),
            "`{tool}` is not on PATH: apt-get install -y {pkg}"
        );
    }
    ensure!(
        Path::new(servers::TRIVIAL_HTTPD).exists(),
        "{} is missing: apt-get install -y ostree-tests",
        servers::TRIVIAL_HTTPD
    );
    Ok(())
}

/// What every replay of the run shares.
struct Replays<'a> {
    mix: &'a [String],
    how: h2load::Replay,
    logs: &'a Path,
    client_cpu: Option<usize>,
}

impl Replays<'_> {
    /// One replay of the mix against one server; `None` where the server
    /// does not speak `proto` (trivial-httpd and h2c).
    fn one(
        &self,
        arm: Arm,
        r: &servers::Running,
        proto: Proto,
        conc: u32,
        rep: usize,
    ) -> Result<Option<Sample>> {
        let addr = match proto {
            Proto::H1 => r.h1,
            Proto::H2c => match r.h2 {
                Some(a) => a,
                None => return Ok(None),
            },
        };
        let uris: Vec<String> = self
            .mix
            .iter()
            .map(|p| format!("http://{addr}{p}"))
            .collect();
        let log = self
            .logs
            .join(format!("{arm:?}-{proto:?}-{conc}-{rep}.log"));
        let cpu0 = servers::tree_cpu(r.pid);
        let replay = h2load::replay(
            &uris,
            self.how,
            proto,
            conc,
            self.client_cpu,
            &log,
            REPLAY_TIMEOUT,
        );
        // A server that gives up (trivial-httpd at 256 connections) is a
        // result, every request an error.
        let (counts, (p50, p99)) = match replay {
            Ok(r) => r,
            Err(e) => {
                check_interrupted()?;
                eprintln!("{arm:?} {proto:?} c={conc} run {rep}: replay failed: {e:#}");
                let failed = h2load::Counts {
                    seconds: f64::NAN,
                    errors: self.mix.len() as u64,
                    ..Default::default()
                };
                (failed, (f64::NAN, f64::NAN))
            }
        };
        let cpu = servers::tree_cpu(r.pid) - cpu0;
        eprintln!(
            "{arm:?} {proto:?} c={conc} run {rep}: {:.0} req/s, {cpu:.2} CPU-s, p99 {p99:.2} ms, {} errors",
            counts.done as f64 / counts.seconds,
            counts.errors
        );
        Ok(Some(Sample::new(
            arm, proto, conc, rep, counts, p50, p99, cpu,
        )))
    }
}

/// The paths one stock `ostree pull` of `commit` requests, in order, less
/// those the server derives (summary, refs): every server must answer the
/// same bytes. Recorded once per scale into target/bench.
fn mix(bin: &Path, repo: &Path, commit: &str, scale: Scale, logs: &Path) -> Result<Vec<String>> {
    let cache = super::bench_dir()?.join(format!("serve-mix-{scale}.txt"));
    if let Ok(text) = std::fs::read_to_string(&cache) {
        let paths: Vec<String> = text.lines().map(str::to_owned).collect();
        if !paths.is_empty() {
            return Ok(paths);
        }
    }
    eprintln!("recording the request mix of one stock ostree pull ({scale})...");
    let tmp = tempfile::tempdir_in(super::bench_dir()?).context("creating a temp dir")?;
    let access = tmp.path().join("access.log");
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--repo"])
        .arg(repo)
        .args(["--commit", commit, "--state-dir"])
        .arg(tmp.path().join("state"))
        .arg("--access-log")
        .arg(&access);
    let mut srv = ServerProcess::spawn(&mut cmd, Duration::from_secs(60))?;
    srv.wait_ready(Duration::from_secs(120))?;
    let node = tmp.path().join("node");
    let log = logs.join("record-pull.log");
    let ostree = |args: &[&str]| -> Result<()> {
        let mut c = oscontent_testkit::Ostree::at(&node).command(args);
        run_bounded(&mut c, &log, RECORD_TIMEOUT).map(drop)
    };
    ostree(&["init", "--mode=archive"])?;
    ostree(&["remote", "add", "--no-gpg-verify", "bench", &srv.url])?;
    ostree(&["pull", "bench", oscontent_testkit::fixtures::DEFAULT_REF])?;
    srv.stop();
    let text = std::fs::read_to_string(&access).context("reading the access log")?;
    let mut paths = Vec::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).context("an access log line")?;
        let (Some(path), Some(200)) = (v["path"].as_str(), v["status"].as_u64()) else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if repo.join(rel).is_file() {
            paths.push(path.to_owned());
        }
    }
    if paths.len() < 10 {
        bail!("the recorded pull made only {} requests", paths.len());
    }
    std::fs::write(&cache, paths.join("\n") + "\n")
        .with_context(|| format!("writing {}", cache.display()))?;
    Ok(paths)
}

/// Bytes of the files the mix names (each once).
fn mix_bytes(repo: &Path, mix: &[String]) -> u64 {
    mix.iter()
        .filter_map(|p| std::fs::metadata(repo.join(p.trim_start_matches('/'))).ok())
        .map(|m| m.len())
        .sum()
}
