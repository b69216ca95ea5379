//! `oscontent stage`'s flags and their dispatch: one stage, `--list`,
//! `--forget`, or the agent (`--follow`).

use super::{parse_duration, parse_rate, parse_timeout, report_error};
use crate::governor::IoMode;
use crate::pull::error::{exit, PullError, PullResult, Tag};
use crate::pull::report::{Output, Reporter};
use crate::pull::Source;
use crate::stage::follow::FollowOptions;
use crate::stage::{self, IoProfile, StageOptions, StageTarget};
use anyhow::anyhow;
use clap::Args;
use serde_json::json;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `--pool` and `--poll-interval` when not given.
const DEFAULT_POOL: &str = "worker";
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
pub struct StageArgs {
    /// The host repo (bare, bare-user or archive), e.g. /sysroot/ostree/repo.
    #[arg(long)]
    pub repo: PathBuf,
    /// Base URL of the remote (an oscontent server).
    #[arg(long, conflicts_with = "remote", required_unless_present_any = ["remote", "list", "forget"])]
    pub url: Option<String>,
    /// A remote configured in the repo: its URL and gpg-verify settings
    /// are used.
    #[arg(long)]
    pub remote: Option<String>,
    /// The image, pinned: REFERENCE@sha256:DIGEST (what the MCO's
    /// osImageURL holds). The digest is the trust root: no key is needed.
    #[arg(long, conflicts_with = "ref_name", required_unless_present_any = ["ref_name", "list", "forget"])]
    pub image: Option<String>,
    /// Stage the image the remote publishes at this ref instead (trust as
    /// for `pull`: the summary's signature when the remote or
    /// --trusted-keys asks).
    #[arg(long = "ref")]
    pub ref_name: Option<String>,
    /// Run as the node agent: follow --ref, staging each image published
    /// there once a staging slot is granted, until SIGTERM (exit 0). Needs
    /// --trusted-keys, or a --remote with gpg-verify and gpg-verify-summary.
    #[arg(long, requires = "ref_name", conflicts_with_all = ["image", "list", "forget"])]
    pub follow: bool,
    /// The node asking for slots (a Kubernetes node name). Default: $NODE_NAME,
    /// else the hostname, lowercased.
    #[arg(long, env = "NODE_NAME")]
    pub node: Option<String>,
    /// The pool whose slots it asks for (a machine config pool). Default:
    /// worker.
    // No clap default, so that the flag given without --follow is seen
    // (`agent_flag`).
    #[arg(long)]
    pub pool: Option<String>,
    /// The node is a control-plane node: its slot also counts against the
    /// server's control-plane cap, so control-plane nodes stage one at a time.
    #[arg(long)]
    pub control_plane: bool,
    /// How often the ref is checked (1s to 1h). Default: 60s.
    #[arg(long, value_parser = parse_duration)]
    pub poll_interval: Option<Duration>,
    /// Serve Prometheus metrics on ADDR (host:port) at /metrics.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// When the server hands out no slots (404 on its slot route), stage
    /// without one; by default that is a failure, retried with backoff.
    #[arg(long)]
    pub without_slots: bool,
    /// OpenPGP keys that must have signed the commit and the summary (also
    /// required when the remote has gpg-verify=true).
    #[arg(long)]
    pub trusted_keys: Option<PathBuf>,
    /// Show what is staged in the repo (digest, commit, layers present,
    /// bytes) and exit.
    #[arg(long, conflicts_with_all = ["url", "remote", "image", "ref_name", "forget"])]
    pub list: bool,
    /// Drop the stage of this digest (sha256:HEX): its staged ref and the
    /// layer refs it wrote that no other stage or imported image names.
    #[arg(long, value_name = "DIGEST", conflicts_with_all = ["url", "remote", "image", "ref_name"])]
    pub forget: Option<String>,
    /// I/O profile: the defaults of the four flags below.
    #[arg(long, value_enum, default_value = "background")]
    pub io_profile: IoProfile,
    /// How writes reach the disk (the profile's: paced).
    #[arg(long, value_enum)]
    pub io_mode: Option<IoMode>,
    /// Flush latency the paced mode steers toward (background: 5ms).
    #[arg(long, value_parser = parse_duration)]
    pub io_latency_target: Option<Duration>,
    /// Never write faster than this, e.g. 20M (MiB/s) (background: 16M).
    #[arg(long, value_name = "BYTES_PER_S", value_parser = parse_rate)]
    pub io_max_rate: Option<u64>,
    /// Requests (objects) in flight at once, 1 to 64 (background: 2).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Give up when fetching has not finished within this time (at most 7
    /// days). Nothing is written; the next stage resumes.
    #[arg(long, default_value = "6h", value_parser = parse_timeout)]
    pub timeout: Duration,
    /// Use HTTP/1.1 only.
    #[arg(long)]
    pub http1: bool,
    /// Line-delimited JSON events on stdout instead of a progress bar.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run_stage(a: StageArgs) -> u8 {
    let output = if a.json { Output::Json } else { Output::Human };
    let reporter = Arc::new(Reporter::new(output));
    match stage_command(a, &reporter) {
        Ok(()) => exit::OK,
        Err(e) => report_error(&reporter, &e),
    }
}

fn stage_command(a: StageArgs, reporter: &Arc<Reporter>) -> PullResult<()> {
    if a.list {
        return list_staged(&a.repo, a.json);
    }
    if let Some(d) = &a.forget {
        let dropped = stage::forget(&a.repo, d)?;
        reporter.event(
            "forgotten",
            json!({"digest": d, "refs_deleted": dropped}),
            Some(format!("{d}: {} refs deleted", dropped.len())),
        );
        return Ok(());
    }
    if let (false, Some(flag)) = (a.follow, agent_flag(&a)) {
        return Err(PullError::Usage(anyhow!(
            "{flag} is for the agent: give --follow too"
        )));
    }
    let source = match (a.url, a.remote) {
        (Some(u), None) => Source::Url(u),
        (None, Some(r)) => Source::Remote(r),
        _ => unreachable!("clap enforces exactly one of --url and --remote"),
    };
    let target = match (a.image, a.ref_name) {
        (Some(i), None) => StageTarget::Image(stage::image::PinnedImage::parse(&i).usage()?),
        (None, Some(r)) => {
            oscontent_format::validate_ref(&r).usage()?;
            StageTarget::Ref(r)
        }
        _ => unreachable!("clap enforces exactly one of --image and --ref"),
    };
    let follow = a.follow;
    let opts = StageOptions {
        repo: a.repo,
        source,
        target,
        trusted_keys: a.trusted_keys,
        io: stage::options::IoChoice {
            profile: a.io_profile,
            mode: a.io_mode,
            latency_target: a.io_latency_target,
            max_rate: a.io_max_rate,
            concurrency: a.concurrency,
        },
        timeout: a.timeout,
        http1_only: a.http1,
        output: reporter_output(a.json),
    };
    if !follow {
        return stage::stage(&opts, reporter.clone());
    }
    let opts = FollowOptions {
        ref_name: match &opts.target {
            StageTarget::Ref(r) => r.clone(),
            StageTarget::Image(_) => unreachable!("clap: --follow requires --ref"),
        },
        stage: opts,
        node: match a.node {
            Some(n) => n,
            None => hostname()?,
        },
        pool: a.pool.unwrap_or_else(|| DEFAULT_POOL.to_owned()),
        control_plane: a.control_plane,
        poll_interval: a.poll_interval.unwrap_or(DEFAULT_POLL_INTERVAL),
        metrics_listen: a.metrics_listen,
        without_slots: a.without_slots,
    };
    stage::follow::follow(&opts, reporter.clone())
}

/// The first agent-only flag given. (Not clap's `requires`: a `bool` flag
/// is always present to it, so that would never refuse.) `--node` is left
/// out: `NODE_NAME` may be set where one-off stages run too.
fn agent_flag(a: &StageArgs) -> Option<&'static str> {
    [
        (a.pool.is_some(), "--pool"),
        (a.control_plane, "--control-plane"),
        (a.poll_interval.is_some(), "--poll-interval"),
        (a.metrics_listen.is_some(), "--metrics-listen"),
        (a.without_slots, "--without-slots"),
    ]
    .into_iter()
    .find_map(|(given, flag)| given.then_some(flag))
}

/// `--node`'s default after `$NODE_NAME`: the hostname, lowercased as
/// Kubernetes names nodes.
fn hostname() -> PullResult<String> {
    let name = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .to_lowercase();
    if name.is_empty() {
        return Err(PullError::Usage(anyhow!(
            "no --node given, NODE_NAME is unset and the hostname is empty"
        )));
    }
    Ok(name)
}

fn reporter_output(json: bool) -> Output {
    if json {
        Output::Json
    } else {
        Output::Human
    }
}

fn list_staged(repo: &std::path::Path, json: bool) -> PullResult<()> {
    let staged = stage::list(repo)?;
    if json {
        println!("{}", json!({"event": "staged-list", "staged": staged}));
        return Ok(());
    }
    println!("DIGEST\tCOMMIT\tLAYERS PRESENT\tBYTES\tIMPORTED");
    for s in &staged {
        println!(
            "{}\t{}\t{}/{}\t{}\t{}",
            s["digest"].as_str().unwrap_or_default(),
            s["commit"].as_str().unwrap_or_default(),
            s["layers_present"],
            s["layer_refs"],
            s["bytes"],
            s["imported"]
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Cmd};
    use clap::Parser;

    #[test]
    fn agent_flags_need_follow() {
        let one_off = ["--image", "r@sha256:00"];
        let follow = ["--follow", "--ref", "os/stable"];
        // (flags beside --repo and --url, the agent-only flag given)
        let table: [(&[&str], &[&str], Option<&str>); 7] = [
            (&one_off, &[], None),
            (
                &follow,
                &["--pool", "infra", "--control-plane"],
                Some("--pool"),
            ),
            (&one_off, &["--pool", "infra"], Some("--pool")),
            (&one_off, &["--control-plane"], Some("--control-plane")),
            (
                &one_off,
                &["--poll-interval", "5s"],
                Some("--poll-interval"),
            ),
            (
                &one_off,
                &["--metrics-listen", "127.0.0.1:1"],
                Some("--metrics-listen"),
            ),
            (&one_off, &["--without-slots"], Some("--without-slots")),
        ];
        for (target, extra, want) in table {
            let mut args = vec!["oscontent", "stage", "--repo", "r", "--url", "http://h/"];
            args.extend(target);
            args.extend(extra);
            let Cmd::Stage(a) = Cli::try_parse_from(&args).unwrap().cmd else {
                panic!("not stage")
            };
            assert_eq!(agent_flag(&a), want, "{args:?}");
        }
    }
}
