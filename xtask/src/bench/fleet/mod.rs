//! `cargo xtask bench fleet`: N node hosts, each in its own network
//! namespace behind a shaped link, all updating v1→v2 at once from one
//! server in its own namespace. oscontent-server and nginx (the anchor)
//! serve the same repo, without and with a v1→v2 static delta; stock
//! `ostree pull` and `oscontent pull` are the clients. Reports per-node
//! update time, requests and bytes, server CPU-seconds per node against
//! nginx's, server egress against what the nodes needed, errors, and
//! objects served twice to one node. Needs root (namespaces, tc).
//!
//! With `--stage`, the node agent instead: every node staging v2 of the
//! native image through `oscontent stage --follow`, the server handing
//! out staging slots ([`stage`]).

pub mod cpuacct;
mod render;
pub mod repos;
pub mod stage;
pub mod topology;
pub mod wave;

use super::{check_interrupted, require, utc_stamp, Tool};
use anyhow::{Context, Result};
use oscontent_testkit::fixtures::{
    ensure_native, native_default_dir, FixtureSpec, Scale, DEFAULT_REF,
};
use std::path::PathBuf;
use std::time::SystemTime;
use topology::{Fleet, Shaping};
use wave::{Client, ServerKind, WaveResult, WaveSpec};

const IP: Tool = Tool {
    command: "ip",
    package: "iproute2",
};
const TC: Tool = Tool {
    command: "tc",
    package: "iproute2",
};
const NGINX: Tool = Tool {
    command: "nginx",
    package: "nginx",
};
const OSTREE: Tool = Tool {
    command: "ostree",
    package: "ostree",
};
const CURL: Tool = Tool {
    command: "curl",
    package: "curl",
};

/// The benchmark's options.
#[derive(Debug, Clone)]
pub struct Options {
    pub nodes: Vec<usize>,
    pub scale: Scale,
    pub share: f64,
    pub shaping: Shaping,
    pub servers: Vec<ServerKind>,
    pub clients: Vec<Client>,
    /// Without (false) and/or with (true) the v1→v2 delta.
    pub deltas: Vec<bool>,
    /// Runs of each (nodes, deltas, client, server) wave, servers
    /// interleaved, so slow drift in the machine's load hits both alike.
    pub repeat: usize,
    pub server_bin: Option<PathBuf>,
    pub client_bin: Option<PathBuf>,
    /// Stage with the node agent instead of pulling ([`stage`]); the
    /// servers, clients and deltas are then not used.
    pub stage: bool,
    /// `--stage-slots` of the server in `--stage` waves.
    pub stage_slots: u32,
    /// `--stage-retry-after` of the server in `--stage` waves.
    pub stage_retry_after: u64,
}

/// What every fleet report (pulling waves and `--stage` waves) opens
/// with: when, on what, and the fixture and links the waves ran on. Its
/// fields sit at the top level of the JSON.
#[derive(Debug, serde::Serialize)]
pub struct RunHeader {
    pub started: String,
    pub git: Option<String>,
    pub kernel: String,
    /// 1-minute load average and CPUs when the run ended.
    pub load: (f64, usize),
    pub scale: String,
    pub share: f64,
    pub rate: String,
    pub delay_ms: f64,
    pub server_profile: String,
}

impl RunHeader {
    /// The header of a run of `opts` started at `started`, read as it ends.
    pub fn new(opts: &Options, started: SystemTime, server_profile: String) -> Self {
        Self {
            started: utc_stamp(started),
            git: super::git_state(),
            kernel: super::report::kernel(),
            load: super::load(),
            scale: opts.scale.to_string(),
            share: opts.share,
            rate: opts.shaping.rate.clone(),
            delay_ms: opts.shaping.delay.as_secs_f64() * 1e3,
            server_profile,
        }
    }

    /// `links …; server … build`, as both tables' titles say it.
    pub fn links_and_build(&self) -> String {
        format!(
            "links {} with {:.1} ms each way; server {} build",
            self.rate, self.delay_ms, self.server_profile
        )
    }

    /// `git; kernel; load … on … CPUs`, both tables' titles' ending.
    pub fn machine(&self) -> String {
        format!(
            "{}; {}; load {:.1} on {} CPUs",
            self.git.as_deref().unwrap_or("no git"),
            self.kernel,
            self.load.0,
            self.load.1
        )
    }
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    #[serde(flatten)]
    pub run: RunHeader,
    pub repeat: usize,
    pub new_objects: usize,
    pub new_bytes: u64,
    pub delta_bytes: Option<u64>,
    pub waves: Vec<WaveResult>,
}

pub fn run(opts: &Options) -> Result<()> {
    super::interrupt()?;
    if opts.stage {
        require(&[IP, TC, OSTREE, CURL, super::DOCKER_REGISTRY, super::SKOPEO])?;
    } else {
        require(&[IP, TC, NGINX, OSTREE])?;
    }
    let started = SystemTime::now();
    let (server_bin, server_profile) = super::report::server(opts.server_bin.as_deref())?;
    let client_bin = match &opts.client_bin {
        Some(p) => std::path::absolute(p).context("resolving --client-bin")?,
        None => {
            crate::cargo::cargo(&["build", "--release", "--quiet", "-p", "oscontent"])?;
            crate::cargo::target_dir().join("release/oscontent")
        }
    };
    let spec = FixtureSpec {
        update_share: opts.share,
        ..FixtureSpec::new(opts.scale)
    };
    let f = ensure_native(&spec, &native_default_dir(&spec))?;
    if opts.stage {
        return stage::run(
            opts,
            stage::Inputs {
                server_bin: &server_bin,
                server_profile,
                client_bin: &client_bin,
                fixtures: &f,
                started,
            },
        );
    }
    let [v1, v2] = &f.releases[..] else {
        anyhow::bail!("native fixtures with {} releases", f.releases.len());
    };
    let work = tempfile::tempdir_in(super::bench_dir()?).context("creating the work dir")?;
    let repos = repos::prepare(
        &f.repo,
        &v1.commit,
        &v2.commit,
        DEFAULT_REF,
        work.path(),
        &server_bin,
    )?;
    let max_nodes = opts.nodes.iter().copied().max().unwrap_or(0);
    eprintln!("fleet: creating {max_nodes} node namespaces");
    let fleet = Fleet::create(max_nodes, &opts.shaping)?;
    let mut waves = Vec::new();
    for &n in &opts.nodes {
        for &delta in &opts.deltas {
            for &client in &opts.clients {
                for repeat in 0..opts.repeat.max(1) {
                    for &server in &opts.servers {
                        check_interrupted()?;
                        let spec = WaveSpec {
                            nodes: n,
                            server,
                            client,
                            delta,
                        };
                        eprintln!("fleet: {spec:?}, run {}", repeat + 1);
                        let w = wave::run(
                            &fleet,
                            spec,
                            repeat,
                            &repos,
                            &server_bin,
                            &client_bin,
                            &work.path().join("wave"),
                        )
                        .with_context(|| format!("wave {spec:?}, run {}", repeat + 1))?;
                        eprintln!("{}", render::one_line(&w, &repos));
                        waves.push(w);
                    }
                }
            }
        }
    }
    drop(fleet);
    let report = Report {
        run: RunHeader::new(opts, started, server_profile),
        repeat: opts.repeat.max(1),
        new_objects: repos.new_objects,
        new_bytes: repos.new_bytes,
        delta_bytes: repos.with_delta.delta_bytes,
        waves,
    };
    super::report::publish("fleet", started, &report, &render::table(&report))?;
    Ok(())
}
