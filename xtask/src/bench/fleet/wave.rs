//! One wave: a server in its namespace, every node pulling v1→v2 at once,
//! and what that cost each side: per-node time, requests and bytes (from
//! the server's own access log, by client address), objects served twice
//! to one node, server CPU-seconds and egress.

use super::cpuacct::{CpuMeter, CpuSource};
use super::repos::{fresh_node, node_head, Repos, Served, REMOTE};
use super::topology::{node_ip, server_addr, Fleet, DEV, SERVER_IP};
use crate::bench::{check_interrupted, stopper, Stopper};
use anyhow::{bail, ensure, Context, Result};
use oscontent_testkit::nginx::Nginx;
use oscontent_testkit::{read_access_log, ServerProcess};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Server start and publication (small repos; full scale takes longer).
const READY_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// The whole wave: every node's pull.
const WAVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ServerKind {
    /// oscontent-server `--repo` of the served copy.
    Oscontent,
    /// nginx (sendfile, two workers) serving the same directory: the anchor.
    Nginx,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Client {
    /// Stock `ostree pull`.
    Stock,
    /// `oscontent pull --remote`: HTTP/2 (prior knowledge) where the server
    /// speaks it, as with oscontent-server; HTTP/1.1 with nginx, whose
    /// cleartext listener here speaks only that.
    Oscontent,
    /// `oscontent pull --remote --http1`: the same protocol for both
    /// servers, so the anchor compares like with like.
    OscontentH1,
}

/// What one wave runs.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct WaveSpec {
    pub nodes: usize,
    pub server: ServerKind,
    pub client: Client,
    pub delta: bool,
}

/// One node's update.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeOutcome {
    pub seconds: f64,
    pub error: Option<String>,
    pub requests: u64,
    pub bytes: u64,
    /// Object paths answered 200 more than once to this node.
    pub served_twice: u64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct WaveResult {
    pub spec: WaveSpec,
    pub nodes: Vec<NodeOutcome>,
    /// Which run of this spec (`--repeat`), from 0.
    pub repeat: usize,
    pub wall_seconds: f64,
    pub server_cpu_seconds: f64,
    /// How `server_cpu_seconds` was counted.
    pub cpu_source: CpuSource,
    pub server_egress_bytes: u64,
    pub server_peak_rss_kib: u64,
}

/// A server under test, stopped on drop.
#[derive(Debug)]
enum Running {
    Oscontent(ServerProcess, PathBuf),
    Nginx(Nginx),
}

impl Running {
    fn pid(&self) -> Option<u32> {
        match self {
            Running::Oscontent(p, _) => p.pid(),
            Running::Nginx(n) => Some(n.pid()),
        }
    }

    /// Stops the server (oscontent's) and returns (client address, path,
    /// status, bytes) of every request it logged. oscontent-server writes
    /// its log from a thread of its own and flushes the last lines at
    /// shutdown, so it is read after the exit; nginx writes each line
    /// before it takes the connection's next request, so its log is whole
    /// once every client has exited.
    fn finish(self) -> Result<Vec<(String, String, u16, u64)>> {
        Ok(match self {
            Running::Oscontent(mut p, log) => {
                p.stop();
                read_access_log(&log)?
                    .into_iter()
                    .map(|e| (e.client.unwrap_or_default(), e.path, e.status, e.bytes))
                    .collect()
            }
            Running::Nginx(n) => n
                .requests()?
                .into_iter()
                .map(|r| (r.client, r.path, r.status, r.bytes))
                .collect(),
        })
    }
}

fn start_server(
    fleet: &Fleet,
    kind: ServerKind,
    served: &Served,
    repos: &Repos,
    server_bin: &Path,
    work: &Path,
) -> Result<Running> {
    let addr = server_addr();
    Ok(match kind {
        ServerKind::Oscontent => {
            let state = work.join("state");
            let log = work.join("access.log");
            let mut cmd = fleet.server.exec(server_bin);
            cmd.arg("serve")
                .arg("--repo")
                .arg(&served.dir)
                .args([
                    "--commit",
                    &repos.v2,
                    // The delta arm serves the delta exported into the copy
                    // (`repos.rs`), the same files nginx serves; none is
                    // compiled again during the wave.
                    "--deltas",
                    "none",
                    "--listen",
                    &addr.to_string(),
                    "--state-dir",
                ])
                .arg(&state)
                .arg("--access-log")
                .arg(&log);
            let proc = ServerProcess::spawn(&mut cmd, READY_TIMEOUT)?;
            let running = Running::Oscontent(proc, log);
            wait_ready(fleet, "/readyz")?;
            running
        }
        ServerKind::Nginx => {
            let block = format!(
                "sendfile on;\ntcp_nopush on;\nkeepalive_requests 100000;\n\
                 server {{\n listen {addr};\n root {};\n location / {{ }}\n}}\n",
                served.dir.display()
            );
            Running::Nginx(Nginx::start_in(
                &fleet.server,
                &work.join("nginx"),
                &block,
                addr,
                2,
            )?)
        }
    })
}

/// Polls `path` from inside the server's namespace until it answers 200.
pub(super) fn wait_ready(fleet: &Fleet, path: &str) -> Result<()> {
    let url = format!("http://{}{path}", server_addr());
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        check_interrupted()?;
        let mut curl = fleet.server.exec("curl");
        curl.args(["-sf", "-o", "/dev/null", "--max-time", "2", &url]);
        if oscontent_testkit::run_bounded(&mut curl, Duration::from_secs(5))
            .is_ok_and(|o| o.status.success())
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{url} not ready within {READY_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The pull one node runs.
fn pull_command(
    fleet: &Fleet,
    i: usize,
    client: Client,
    client_bin: &Path,
    repo: &Path,
    repos: &Repos,
) -> Command {
    match client {
        Client::Stock => {
            let mut c = fleet.nodes[i].exec("ostree");
            c.arg(format!("--repo={}", repo.display()))
                .args(["pull", REMOTE, &repos.ref_name]);
            c
        }
        Client::Oscontent | Client::OscontentH1 => {
            let mut c = fleet.nodes[i].exec(client_bin);
            c.arg("pull").arg("--repo").arg(repo).args([
                "--remote",
                REMOTE,
                "--ref",
                &repos.ref_name,
                "--json",
            ]);
            if client == Client::OscontentH1 {
                c.arg("--http1");
            }
            c
        }
    }
}

/// Runs one wave (run `repeat` of its spec); `work` is emptied first.
pub fn run(
    fleet: &Fleet,
    spec: WaveSpec,
    repeat: usize,
    repos: &Repos,
    server_bin: &Path,
    client_bin: &Path,
    work: &Path,
) -> Result<WaveResult> {
    if work.exists() {
        std::fs::remove_dir_all(work).with_context(|| format!("emptying {}", work.display()))?;
    }
    std::fs::create_dir_all(work.join("logs"))?;
    let node_dirs: Vec<PathBuf> = (0..spec.nodes)
        .map(|i| work.join(format!("node{i}")))
        .collect();
    for d in &node_dirs {
        fresh_node(repos, d)?;
    }
    let served = if spec.delta {
        &repos.with_delta
    } else {
        &repos.plain
    };
    let server = start_server(fleet, spec.server, served, repos, server_bin, work)?;
    let pid = server.pid().context("the server has no pid")?;
    let meter = CpuMeter::start(pid)?;
    let (tx0, _) = fleet.server.counters(DEV)?;
    let start = Instant::now();
    let mut running = Vec::with_capacity(spec.nodes);
    for (i, dir) in node_dirs.iter().enumerate() {
        let log = File::create(work.join("logs").join(format!("node{i}.log")))?;
        let mut cmd = pull_command(fleet, i, spec.client, client_bin, dir, repos);
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting node {i}'s pull"))?;
        running.push(Some(stopper(child, &format!("node {i}'s pull"))));
    }
    let (finished, peak_rss) = wait_all(running, start, pid)?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = meter.seconds()?;
    let (tx1, _) = fleet.server.counters(DEV)?;
    let requests = server.finish()?;
    let cpu_source = meter.source();
    drop(meter);
    let nodes = outcomes(finished, requests, &node_dirs, repos, work)?;
    // The node repos are the bulk of the disk a wave used.
    for d in &node_dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(WaveResult {
        spec,
        nodes,
        repeat,
        wall_seconds: wall,
        server_cpu_seconds: cpu,
        cpu_source,
        server_egress_bytes: tx1.saturating_sub(tx0),
        server_peak_rss_kib: peak_rss,
    })
}

/// When a node's pull ended (seconds into the wave) and whether it
/// succeeded.
type Ended = (f64, bool);

/// Waits for every node's pull (bounded by [`WAVE_TIMEOUT`]): when each
/// ended and whether it succeeded, and the server's peak RSS meanwhile.
fn wait_all(
    mut running: Vec<Option<Stopper>>,
    start: Instant,
    pid: u32,
) -> Result<(Vec<Option<Ended>>, u64)> {
    let mut finished: Vec<Option<Ended>> = vec![None; running.len()];
    let mut peak_rss = 0;
    while finished.iter().any(Option::is_none) {
        check_interrupted()?;
        if start.elapsed() > WAVE_TIMEOUT {
            bail!("the wave did not finish within {WAVE_TIMEOUT:?}");
        }
        for (i, slot) in running.iter_mut().enumerate() {
            let Some(child) = slot else { continue };
            if let Some(status) = child.try_wait()? {
                finished[i] = Some((start.elapsed().as_secs_f64(), status.success()));
                *slot = None;
            }
        }
        peak_rss = peak_rss.max(crate::bench::tree_rss_kib(pid));
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((finished, peak_rss))
}

/// Each node's outcome, from its exit, its repo and the server's access
/// log (`(client, path, status, bytes)`); every request must come from a
/// node.
fn outcomes(
    finished: Vec<Option<Ended>>,
    requests: Vec<(String, String, u16, u64)>,
    node_dirs: &[PathBuf],
    repos: &Repos,
    work: &Path,
) -> Result<Vec<NodeOutcome>> {
    let mut by_node: BTreeMap<String, Vec<(String, u16, u64)>> = BTreeMap::new();
    for (client, path, status, bytes) in requests {
        if client != SERVER_IP.to_string() {
            by_node
                .entry(client)
                .or_default()
                .push((path, status, bytes));
        }
    }
    let mut nodes = Vec::with_capacity(finished.len());
    for (i, f) in finished.into_iter().enumerate() {
        let (seconds, ok) = f.context("a node without an outcome")?;
        let reqs = by_node.remove(&node_ip(i).to_string()).unwrap_or_default();
        let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
        for (path, status, _) in &reqs {
            if *status == 200 && path.starts_with("/objects/") {
                *seen.entry(path).or_default() += 1;
            }
        }
        let error = if !ok {
            Some(oscontent_testkit::process::tail(
                &work.join("logs").join(format!("node{i}.log")),
                3,
            ))
        } else {
            match node_head(&node_dirs[i], &repos.ref_name) {
                Ok(h) if h == repos.v2 => None,
                Ok(h) => Some(format!("the ref is at {h}, not v2")),
                Err(e) => Some(format!("{e:#}")),
            }
        };
        nodes.push(NodeOutcome {
            seconds,
            error,
            requests: reqs.len() as u64,
            bytes: reqs.iter().map(|r| r.2).sum(),
            served_twice: seen.values().filter(|n| **n > 1).count() as u64,
        });
    }
    ensure!(
        by_node.is_empty(),
        "requests from unknown clients: {:?}",
        by_node.keys().collect::<Vec<_>>()
    );
    Ok(nodes)
}
