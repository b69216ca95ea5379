//! The `oscontent` command line: `pull`, `stage`, `verify`, `ls-remote`.
//! Thin: the work is in [`crate::pull`] and [`crate::stage`].

use crate::governor::IoMode;
use crate::pull::error::{exit, PullError, PullResult, Tag};
use crate::pull::report::{Output, Reporter};
use crate::pull::{self, origin, PullOptions, Source, VerifyOptions};
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use oscontent_format::{parse_summary, Checksum, Summary};
use serde_json::json;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

mod stage_command;
pub use stage_command::StageArgs;

const EXIT_CODES: &str = "\
Exit codes:
  0  success (the ref moved, or was already at the target)
  1  usage error, or an unexpected failure
  2  network or server failure (after retries); the remote lacks the ref or an
     object; not an archive remote; --timeout passed; a redirect to another origin
  3  verification failed: object checksum, signature, summary signature, ref or
     collection binding, an object larger than its header or ostree.sizes says
  4  downgrade refused (older timestamp or lower version; see --allow-downgrade),
     or an unverified target dated past --max-future-skew
  5  local repo error (open, read, write, disk full, the free-space reserve)
  130 interrupted (SIGINT or SIGTERM)
On any failure the ref does not move.";

const VERIFY_EXIT_CODES: &str = "\
Exit codes:
  0  the summary, the commit and its ref binding verify
  1  usage error (such as an unreadable --trusted-keys), or an unexpected failure
  2  network or server failure (after retries); the remote lacks the ref or the
     commit; not an archive remote; --timeout passed; a redirect to another origin
  3  verification failed: summary signature, commit checksum or signature, ref binding
Nothing is written anywhere.";

const STAGE_EXIT_CODES: &str = "\
Exit codes (those of pull):
  0  success (staged, already staged, listed or forgotten)
  1  usage error, or an unexpected failure
  2  network or server failure (after retries); the remote does not stage the
     image or does not serve its manifest, config or an object; --timeout passed
  3  verification failed: the manifest does not hash to the pinned digest, the
     config to the manifest's, the config names another commit, a layer ref the
     manifest lacks, an object set that does not recompute or lists an object
     outside the commit, an object checksum, a signature
  5  local repo error (open, read, write, disk full)
  130 interrupted (SIGINT or SIGTERM)
On any failure no ref is written: no layer ref, no staged ref.";

const LS_REMOTE_EXIT_CODES: &str = "\
Exit codes:
  0  the refs were listed
  1  usage error (a URL that is not http:// or https://), or an unexpected failure
  2  network or server failure; the remote has no summary";

/// Node-side client for oscontent servers.
#[derive(Debug, Parser)]
#[command(version, about, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Fetch a commit into a local ostree repo (any mode): only the objects
    /// it lacks, verified before anything becomes visible, written under
    /// the I/O governor, and the ref moved only after a durability barrier.
    #[command(after_help = EXIT_CODES)]
    Pull(PullArgs),
    /// Check a remote's signed summary and a commit's signatures and ref
    /// binding, without writing anything.
    #[command(after_help = VERIFY_EXIT_CODES)]
    Verify(VerifyArgs),
    /// Seed a host repo with an image's objects and the layer refs
    /// ostree-ext's container importer looks for, so that rpm-ostree, bootc
    /// or the MCO later import the image without downloading its ostree
    /// layers. Paced in the background by default.
    #[command(after_help = STAGE_EXIT_CODES)]
    Stage(StageArgs),
    /// List the refs a remote publishes, from its summary.
    #[command(after_help = LS_REMOTE_EXIT_CODES)]
    LsRemote {
        /// Base URL of the remote (an oscontent server or any archive repo).
        #[arg(long)]
        url: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct PullArgs {
    /// The local ostree repo (bare, bare-user or archive).
    #[arg(long)]
    pub repo: PathBuf,
    /// Base URL of the remote; the ref is then written under refs/heads/.
    #[arg(long, conflicts_with = "remote", required_unless_present = "remote")]
    pub url: Option<String>,
    /// A remote configured in the repo: its URL and gpg-verify settings are
    /// used, and the ref is written as REMOTE:REF.
    #[arg(long)]
    pub remote: Option<String>,
    /// The ref to pull (resolved through the summary, else refs/heads/REF).
    #[arg(long = "ref", required_unless_present = "commit")]
    pub ref_name: Option<String>,
    /// Pin the target commit (64 hex digits). With --ref, the ref moves to it.
    #[arg(long)]
    pub commit: Option<Checksum>,
    /// OpenPGP keys (armored or binary) that must have signed the commit
    /// and the summary. Verification is also required when the remote has
    /// gpg-verify=true.
    #[arg(long)]
    pub trusted_keys: Option<PathBuf>,
    /// Accept a target older (timestamp or version) than the ref's commit.
    #[arg(long)]
    pub allow_downgrade: bool,
    /// How far ahead of this node's clock an unverified target (no
    /// verified signature, no --commit) may be dated, in seconds. A later
    /// one is refused: once the ref points at it, every honest release
    /// until then would be refused as a downgrade.
    #[arg(long, default_value_t = oscontent_format::age::DEFAULT_MAX_FUTURE_SKEW, value_name = "SECONDS")]
    pub max_future_skew: u64,
    /// How writes reach the disk.
    #[arg(long, value_enum, default_value = "paced")]
    pub io_mode: IoMode,
    /// Flush latency the paced mode steers toward (e.g. 10ms, 0.5s).
    #[arg(long, default_value = "10ms", value_parser = parse_duration)]
    pub io_latency_target: Duration,
    /// Never write faster than this in `paced` mode, e.g. 20M (MiB/s),
    /// 512K, 1G; each object also counts a 16 KiB create. Default: no
    /// ceiling but the feedback loop's.
    #[arg(long, value_name = "BYTES_PER_S", value_parser = parse_rate)]
    pub io_max_rate: Option<u64>,
    /// Requests (objects) in flight at once (1 to 64).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Give up when fetching has not finished within this time (e.g. 90s,
    /// 30m, 2h; at most 7 days): a server that sends a byte now and then
    /// cannot hold the node forever. The ref does not move; the next pull
    /// resumes.
    #[arg(long, default_value = "1h", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Use HTTP/1.1 only (by default, on http:// URLs, the object walk
    /// tries HTTP/2 with prior knowledge; config, summary, commit and
    /// static deltas always come over HTTP/1.1).
    #[arg(long)]
    pub http1: bool,
    /// Line-delimited JSON events on stdout instead of a progress bar.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Base URL of the remote.
    #[arg(long)]
    pub url: String,
    /// The ref to check.
    #[arg(long = "ref")]
    pub ref_name: String,
    /// OpenPGP keys (armored or binary) that must have signed.
    #[arg(long)]
    pub trusted_keys: PathBuf,
    /// Verify this commit instead of the one the summary names for the ref.
    #[arg(long)]
    pub commit: Option<Checksum>,
    /// Give up when the checks have not finished within this time.
    #[arg(long, default_value = "10m", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Use HTTP/1.1 only.
    #[arg(long)]
    pub http1: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Longest `--timeout`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// `10ms`, `1.5s`, `2m`, `1h`, or bare seconds, up to an hour.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_duration_within(s, Duration::from_secs(3600))
}

/// A `--io-max-rate`: a positive number with a K, M or G suffix (binary
/// units, an optional `iB` and `/s`), or bare bytes per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("/s").unwrap_or(t);
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.as_bytes().last() {
        Some(b'K' | b'k') => (&t[..t.len() - 1], 10),
        Some(b'M') => (&t[..t.len() - 1], 20),
        Some(b'G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let bad = || format!("invalid rate {s:?}: want e.g. 20M (MiB/s), 512K, 1G");
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    let bytes = v * (1u64 << shift) as f64;
    if !(1.0..=1e15).contains(&bytes) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// A `--timeout`: what [`parse_duration`] takes, hours (`2h`) too, up to
/// [`MAX_TIMEOUT`].
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    parse_duration_within(s, MAX_TIMEOUT)
}

fn parse_duration_within(s: &str, max: Duration) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: want e.g. 10ms, 0.5s, 2m"))?;
    if !v.is_finite() || v <= 0.0 || v * mult > max.as_secs_f64() {
        return Err(format!(
            "duration {s:?} must be positive and at most {}s",
            max.as_secs()
        ));
    }
    Ok(Duration::from_secs_f64(v * mult))
}

/// Sets up logging once: `RUST_LOG` filters, stderr output.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal, not in log files.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Parses the command line, or returns the exit code to leave with. A
/// usage error exits 1, as the exit codes say, not clap's 2, which here
/// means a network failure: a supervisor branching on it must not take a
/// typo for an outage. With `--json` the error is also an `error` event.
pub fn parse<I, T>(args: I) -> Result<Cli, u8>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    Cli::try_parse_from(&args).map_err(|e| {
        // Help and --version are printed the same way, to stdout.
        if !e.use_stderr() {
            let _ = e.print();
            return exit::OK;
        }
        if args.iter().any(|a| a == "--json") {
            let message = e.kind().as_str().map_or_else(
                || e.to_string().trim().to_owned(),
                |k| format!("{k}: {}", e.to_string().trim()),
            );
            Reporter::new(Output::Json).event(
                "error",
                json!({"kind": "usage", "exit_code": exit::USAGE, "message": message}),
                None,
            );
        }
        let _ = e.print();
        exit::USAGE
    })
}

/// Runs a command; returns the process exit code.
pub fn run(cli: Cli) -> u8 {
    match cli.cmd {
        Cmd::Pull(a) => run_pull(a),
        Cmd::Verify(a) => run_verify(a),
        Cmd::Stage(a) => stage_command::run_stage(a),
        Cmd::LsRemote { url, json } => {
            let output = if json { Output::Json } else { Output::Human };
            match ls_remote(&url, json) {
                Ok(()) => exit::OK,
                Err(e) => report_error(&Reporter::new(output), &e),
            }
        }
    }
}

fn report_error(reporter: &Reporter, e: &PullError) -> u8 {
    reporter.event(
        "error",
        json!({"kind": e.kind(), "exit_code": e.exit_code(), "message": format!("{e:#}")}),
        None,
    );
    eprintln!("error: {e:#}");
    e.exit_code()
}

fn run_pull(a: PullArgs) -> u8 {
    let output = if a.json { Output::Json } else { Output::Human };
    let reporter = Arc::new(Reporter::new(output));
    let source = match (a.url, a.remote) {
        (Some(u), None) => Source::Url(u),
        (None, Some(r)) => Source::Remote(r),
        _ => unreachable!("clap enforces exactly one of --url and --remote"),
    };
    let opts = PullOptions {
        repo: a.repo,
        source,
        ref_name: a.ref_name,
        commit: a.commit,
        trusted_keys: a.trusted_keys,
        allow_downgrade: a.allow_downgrade,
        max_future_skew: a.max_future_skew,
        io_mode: a.io_mode,
        io_latency_target: a.io_latency_target,
        io_max_rate: a.io_max_rate,
        concurrency: a.concurrency,
        timeout: a.timeout,
        http1_only: a.http1,
        output,
    };
    match pull::pull(&opts, reporter.clone()) {
        Ok(()) => exit::OK,
        Err(e) => report_error(&reporter, &e),
    }
}

fn run_verify(a: VerifyArgs) -> u8 {
    let output = if a.json { Output::Json } else { Output::Human };
    let reporter = Arc::new(Reporter::new(output));
    let opts = VerifyOptions {
        url: a.url,
        ref_name: a.ref_name,
        commit: a.commit,
        trusted_keys: a.trusted_keys,
        timeout: a.timeout,
        http1_only: a.http1,
    };
    match pull::verify(&opts, reporter.clone()) {
        Ok(r) => {
            if a.json {
                let mut v = serde_json::to_value(&r).expect("serialisable");
                v["event"] = "verified".into();
                v["ok"] = true.into();
                println!("{v}");
            } else {
                println!(
                    "OK: {} -> {} (version {}), summary and commit signed by {}",
                    r.ref_name,
                    r.commit,
                    r.version.as_deref().unwrap_or("-"),
                    r.commit_signature["cert"].as_str().unwrap_or("?")
                );
            }
            exit::OK
        }
        Err(e) => report_error(&reporter, &e),
    }
}

fn fetch_summary(url: &str) -> PullResult<Summary> {
    origin::check_remote_url(url).usage()?;
    let u = format!("{}/summary", url.trim_end_matches('/'));
    let shown = origin::redact(&u);
    let client = reqwest::blocking::Client::builder()
        .redirect(origin::redirect_policy())
        .timeout(Duration::from_secs(300))
        .build()
        .context("starting the HTTP client")
        .usage()?;
    let resp = client
        .get(&u)
        .send()
        .map_err(reqwest::Error::without_url)
        .with_context(|| format!("fetching {shown}"))
        .net()?;
    let u = shown;
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Err(PullError::Network(anyhow::anyhow!(
            "{u}: not found: the remote publishes no summary"
        )));
    }
    if !status.is_success() {
        return Err(PullError::Network(anyhow::anyhow!(
            "fetching {u}: HTTP {status}"
        )));
    }
    let bytes = resp.bytes().with_context(|| format!("reading {u}")).net()?;
    parse_summary(&bytes)
        .with_context(|| format!("parsing {u}"))
        .net()
}

fn ls_remote(url: &str, json: bool) -> PullResult<()> {
    let s = fetch_summary(url)?;
    if json {
        let refs: Vec<_> = s
            .refs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "ref": r.name, "commit": r.commit.to_hex(), "commit_size": r.commit_size,
                    "timestamp": r.timestamp, "version": r.version,
                })
            })
            .collect();
        let deltas: Vec<_> = s.deltas.iter().map(|d| d.name.summary_name()).collect();
        let out =
            serde_json::json!({ "refs": refs, "deltas": deltas, "last_modified": s.last_modified });
        println!("{out}");
    } else {
        for r in &s.refs {
            println!(
                "{}\t{}\t{}",
                r.name,
                r.commit,
                r.version.as_deref().unwrap_or("-")
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("10ms", 10_000u64),
            ("0.5s", 500_000),
            ("2", 2_000_000),
            ("1m", 60_000_000),
            ("250us", 250),
            // The bound itself, in its own unit.
            ("1h", 3_600_000_000),
            ("60m", 3_600_000_000),
        ];
        for (s, us) in ok {
            assert_eq!(parse_duration(s).unwrap().as_micros() as u64, us, "{s}");
        }
        for bad in ["", "ms", "-1s", "0", "abc", "2h", "1.01h", "61m", "nan"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn rates() {
        let ok = [
            ("20M", 20u64 << 20),
            ("20MiB/s", 20 << 20),
            ("512K", 512 << 10),
            ("1.5G", 3 << 29),
            ("4096", 4096),
            ("8MB/s", 8 << 20),
        ];
        for (s, want) in ok {
            assert_eq!(parse_rate(s), Ok(want), "{s}");
        }
        for bad in ["", "M", "-1M", "0", "abc", "nan", "1T", "0.5"] {
            assert!(parse_rate(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn timeouts() {
        let ok = [
            ("90s", 90u64),
            ("30m", 1800),
            ("2h", 7200),
            ("168h", 604800),
        ];
        for (s, secs) in ok {
            assert_eq!(parse_timeout(s).unwrap().as_secs(), secs, "{s}");
        }
        for bad in ["", "0", "-1h", "169h", "h", "1d"] {
            assert!(parse_timeout(bad).is_err(), "{bad:?} accepted");
        }
    }
}
