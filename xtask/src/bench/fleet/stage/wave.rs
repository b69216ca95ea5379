//! One staging wave: the server started in its namespace, N agents started
//! at once, the server's slot gauge sampled until every node has staged
//! (or the bound), then the agents stopped (SIGTERM) and what it cost:
//! per-node time to staged, requests and bytes (the server's access log,
//! by client address), egress, the slot metrics, errors.

use super::super::cpuacct::{CpuMeter, CpuSource};
use super::super::repos::link_copy;
use super::super::topology::{node_ip, server_addr, Fleet, DEV, SERVER_IP};
use crate::bench::{check_interrupted, stopper, Stopper};
use anyhow::{bail, ensure, Context, Result};
use oscontent_testkit::{read_access_log, Metrics, ServerProcess};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Server start: streaming and converting the image (full scale: minutes).
const READY_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// The whole wave, slot waits included.
const WAVE_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Between two samples of the server's slot gauge.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// Bound on the agents exiting after SIGTERM, all together.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);
/// The pool every agent asks in (the agent's default).
const POOL: &str = "worker";

/// What every wave of a run shares.
#[derive(Debug)]
pub struct WaveSetup<'a> {
    pub fleet: &'a Fleet,
    /// `docker://HOST:PORT/native@sha256:…`, as the server is given it.
    pub image: String,
    /// The registry's `HOST:PORT` (plain HTTP).
    pub registry: String,
    pub digest: String,
    pub ref_name: String,
    /// A bare-user repo at v1, as the importer left it.
    pub template: PathBuf,
    pub secret_key: PathBuf,
    pub public_key: PathBuf,
    pub slots: u32,
    pub retry_after_secs: u64,
    pub server_bin: &'a Path,
    pub client_bin: &'a Path,
}

/// One node's stage.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageNode {
    /// Seconds into the wave its `staged` event came, if it did.
    pub staged_seconds: Option<f64>,
    pub error: Option<String>,
    /// Slot requests the server refused it.
    pub refusals: u64,
    pub requests: u64,
    /// Response bytes the server's access log has for it.
    pub bytes: u64,
    /// Object paths answered 200 more than once to it.
    pub served_twice: u64,
}

/// The server's slot metrics at the end of a wave.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct SlotMetrics {
    pub peak: f64,
    pub in_use: f64,
    pub grants: f64,
    pub refusals: f64,
    pub expiries: f64,
    pub releases: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StageWave {
    pub nodes: Vec<StageNode>,
    pub repeat: usize,
    pub wall_seconds: f64,
    /// The most `oscontent_stage_slots_in_use` any sample showed.
    pub sampled_max_in_use: f64,
    pub samples: usize,
    pub slots: SlotMetrics,
    pub server_cpu_seconds: f64,
    pub cpu_source: CpuSource,
    /// What the server's namespace sent on its link to the nodes.
    pub server_egress_bytes: u64,
    /// The nodes' requests and response bytes by what was asked
    /// ([`kind`]), all nodes together.
    pub by_kind: BTreeMap<String, (u64, u64)>,
}

/// An agent: its child and its `--json` events file.
struct Agent {
    child: Stopper,
    events: PathBuf,
    staged: Option<f64>,
    exited: Option<std::process::ExitStatus>,
}

/// Runs one wave of `n` nodes; `work` is emptied first.
pub fn run(s: &WaveSetup<'_>, n: usize, repeat: usize, work: &Path) -> Result<StageWave> {
    if work.exists() {
        std::fs::remove_dir_all(work).with_context(|| format!("emptying {}", work.display()))?;
    }
    std::fs::create_dir_all(work.join("logs"))?;
    let dirs: Vec<PathBuf> = (0..n).map(|i| work.join(format!("node{i}"))).collect();
    for d in &dirs {
        link_copy(&s.template, d)?;
    }
    let log = work.join("access.log");
    let mut server = start_server(s, work, &log)?;
    let pid = server.pid().context("the server has no pid")?;
    let meter = CpuMeter::start(pid)?;
    let (tx0, _) = s.fleet.server.counters(DEV)?;
    let start = Instant::now();
    let mut agents = Vec::with_capacity(n);
    for (i, dir) in dirs.iter().enumerate() {
        agents.push(start_agent(s, i, dir, &work.join("logs"))?);
    }
    let (max_in_use, samples) = watch(s, &mut agents, start)?;
    let wall = start.elapsed().as_secs_f64();
    stop_agents(&mut agents)?;
    let slots = slot_metrics(&scrape(s.fleet)?);
    let cpu = meter.seconds()?;
    let (tx1, _) = s.fleet.server.counters(DEV)?;
    let cpu_source = meter.source();
    drop(meter);
    server.stop();
    let (nodes, by_kind) = outcomes(&agents, &dirs, s, &log)?;
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(StageWave {
        nodes,
        repeat,
        wall_seconds: wall,
        sampled_max_in_use: max_in_use,
        samples,
        slots,
        server_cpu_seconds: cpu,
        cpu_source,
        server_egress_bytes: tx1.saturating_sub(tx0),
        by_kind,
    })
}

fn start_server(s: &WaveSetup<'_>, work: &Path, log: &Path) -> Result<ServerProcess> {
    let mut cmd = s.fleet.server.exec(s.server_bin);
    cmd.args(["serve", "--image", &s.image])
        .args(["--insecure-registry", &s.registry])
        .arg("--sign-key")
        .arg(&s.secret_key)
        .args(["--stage-slots", &s.slots.to_string()])
        .args(["--stage-retry-after", &s.retry_after_secs.to_string()])
        .args(["--listen", &server_addr().to_string(), "--state-dir"])
        .arg(work.join("state"))
        .arg("--access-log")
        .arg(log);
    let proc = ServerProcess::spawn(&mut cmd, READY_TIMEOUT)?;
    super::super::wave::wait_ready(s.fleet, "/readyz")?;
    Ok(proc)
}

fn start_agent(s: &WaveSetup<'_>, i: usize, repo: &Path, logs: &Path) -> Result<Agent> {
    let events = logs.join(format!("node{i}.json"));
    let stderr = File::create(logs.join(format!("node{i}.err")))?;
    let mut cmd = s.fleet.nodes[i].exec(s.client_bin);
    // The poll interval is the longest allowed: after its stage an agent
    // sits idle, so what the server sends it is its one stage.
    cmd.args(["stage", "--follow", "--json", "--poll-interval", "60m"])
        .arg("--repo")
        .arg(repo)
        .args(["--url", &format!("http://{}", server_addr())])
        .args(["--ref", &s.ref_name, "--node", &format!("node-{i}")])
        .arg("--trusted-keys")
        .arg(&s.public_key)
        .stdin(Stdio::null())
        .stdout(File::create(&events)?)
        .stderr(stderr);
    let child = cmd
        .spawn()
        .with_context(|| format!("starting node {i}'s agent"))?;
    Ok(Agent {
        child: stopper(child, &format!("node {i}'s agent")),
        events,
        staged: None,
        exited: None,
    })
}

/// The `--json` events called `name` an agent has written so far.
fn events_named(path: &Path, name: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == name)
        .collect()
}

/// Samples the slot gauge until every agent has staged or exited (bounded
/// by [`WAVE_TIMEOUT`]): the most in use at once, and how many samples.
fn watch(s: &WaveSetup<'_>, agents: &mut [Agent], start: Instant) -> Result<(f64, usize)> {
    let (mut max_in_use, mut samples) = (0.0f64, 0);
    loop {
        check_interrupted()?;
        if let Ok(m) = scrape(s.fleet) {
            samples += 1;
            max_in_use = max_in_use.max(
                m.get("oscontent_stage_slots_in_use", &[("pool", POOL)])
                    .unwrap_or(0.0),
            );
        }
        let now = start.elapsed().as_secs_f64();
        for a in agents.iter_mut().filter(|a| a.staged.is_none()) {
            if a.exited.is_none() {
                a.exited = a.child.try_wait()?;
            }
            if !events_named(&a.events, "staged").is_empty() {
                a.staged = Some(now);
            }
        }
        if agents
            .iter()
            .all(|a| a.staged.is_some() || a.exited.is_some())
        {
            return Ok((max_in_use, samples));
        }
        if start.elapsed() > WAVE_TIMEOUT {
            bail!(
                "{} of {} nodes staged within {WAVE_TIMEOUT:?}",
                agents.iter().filter(|a| a.staged.is_some()).count(),
                agents.len()
            );
        }
        std::thread::sleep(SAMPLE_EVERY);
    }
}

/// SIGTERM to every agent still running, then each one's exit (bounded
/// by [`EXIT_TIMEOUT`] all together).
fn stop_agents(agents: &mut [Agent]) -> Result<()> {
    for a in agents.iter_mut().filter(|a| a.exited.is_none()) {
        if let Some(pid) = rustix::process::Pid::from_raw(a.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
    }
    let deadline = Instant::now() + EXIT_TIMEOUT;
    for a in agents.iter_mut().filter(|a| a.exited.is_none()) {
        let left = deadline.saturating_duration_since(Instant::now());
        a.exited = Some(a.child.wait_bounded(left.max(Duration::from_millis(1)))?);
    }
    Ok(())
}

/// The server's `/metrics`, read from inside its namespace.
fn scrape(fleet: &Fleet) -> Result<Metrics> {
    let url = format!("http://{}/metrics", server_addr());
    let mut curl = fleet.server.exec("curl");
    curl.args(["-sf", "--max-time", "2", &url]);
    let text = oscontent_testkit::check_output(&mut curl, Duration::from_secs(5))?;
    Metrics::parse(&text)
}

fn slot_metrics(m: &Metrics) -> SlotMetrics {
    let pool = [("pool", POOL)];
    let get = |name: &str| m.get(name, &pool).unwrap_or(0.0);
    SlotMetrics {
        peak: get("oscontent_stage_slots_peak"),
        in_use: get("oscontent_stage_slots_in_use"),
        grants: get("oscontent_stage_slot_grants_total"),
        refusals: m.sum("oscontent_stage_slot_refusals_total", &pool),
        expiries: get("oscontent_stage_slot_expiries_total"),
        releases: get("oscontent_stage_slot_releases_total"),
    }
}

/// What a request asked for: an object's kind (`filez`, `dirtree`, ...),
/// or the path's first component (`summary`, `blobs`, `oscontent`: the
/// slot routes, ...).
pub fn kind(path: &str) -> &str {
    if let Some(rest) = path.strip_prefix("/objects/") {
        return rest.rsplit_once('.').map_or("objects", |(_, ext)| ext);
    }
    let first = path.trim_start_matches('/').split('/').next();
    first.filter(|f| !f.is_empty()).unwrap_or("/")
}

/// Requests and bytes of one node, from the access log.
#[derive(Debug, Default)]
struct Served {
    requests: u64,
    bytes: u64,
    objects: BTreeMap<String, u64>,
}

type Outcomes = (Vec<StageNode>, BTreeMap<String, (u64, u64)>);

/// Each node's outcome: its events, its exit, its repo (the staged ref)
/// and the server's access log; every request must come from a node.
fn outcomes(agents: &[Agent], dirs: &[PathBuf], s: &WaveSetup<'_>, log: &Path) -> Result<Outcomes> {
    let mut by_node: BTreeMap<String, Served> = BTreeMap::new();
    let mut by_kind: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for e in read_access_log(log)? {
        let client = e.client.unwrap_or_default();
        if client == SERVER_IP.to_string() {
            continue;
        }
        let k = by_kind.entry(kind(&e.path).to_owned()).or_default();
        k.0 += 1;
        k.1 += e.bytes;
        let n = by_node.entry(client).or_default();
        n.requests += 1;
        n.bytes += e.bytes;
        if e.status == 200 && e.path.starts_with("/objects/") {
            *n.objects.entry(e.path).or_default() += 1;
        }
    }
    let hex = s.digest.strip_prefix("sha256:").unwrap_or(&s.digest);
    let mut nodes = Vec::with_capacity(agents.len());
    for (i, a) in agents.iter().enumerate() {
        let served = by_node.remove(&node_ip(i).to_string()).unwrap_or_default();
        let failed = events_named(&a.events, "round-failed");
        let staged_ref = dirs[i].join("refs/heads/oscontent/staged").join(hex);
        let error = if let Some(f) = failed.first() {
            Some(format!(
                "{} failed rounds, first: {}",
                failed.len(),
                f["message"]
            ))
        } else if let Some(x) = a.exited.filter(|x| !x.success()) {
            Some(format!(
                "the agent exited {x}: {}",
                oscontent_testkit::process::tail(&a.events.with_extension("err"), 3)
            ))
        } else if a.staged.is_none() {
            Some("no staged event".to_owned())
        } else {
            match std::fs::read_to_string(&staged_ref) {
                Ok(c) if c.trim().len() == 64 => None,
                Ok(c) => Some(format!("{} holds {c:?}", staged_ref.display())),
                Err(e) => Some(format!("{}: {e}", staged_ref.display())),
            }
        };
        nodes.push(StageNode {
            staged_seconds: a.staged,
            error,
            refusals: events_named(&a.events, "slot-refused").len() as u64,
            requests: served.requests,
            bytes: served.bytes,
            served_twice: served.objects.values().filter(|n| **n > 1).count() as u64,
        });
    }
    ensure!(
        by_node.is_empty(),
        "requests from unknown clients: {:?}",
        by_node.keys().collect::<Vec<_>>()
    );
    Ok((nodes, by_kind))
}

#[cfg(test)]
mod tests {
    #[test]
    fn requests_are_told_apart_by_what_they_ask() {
        let cases = [
            ("/objects/ab/cdef.filez", "filez"),
            ("/objects/ab/cdef.dirtree", "dirtree"),
            ("/objects/ab/cdef.commitmeta", "commitmeta"),
            ("/objects/ab", "objects"),
            ("/summary", "summary"),
            ("/summary.sig", "summary.sig"),
            ("/blobs/sha256/ab", "blobs"),
            ("/oscontent/v1/stage/slots", "oscontent"),
            ("/", "/"),
        ];
        for (path, want) in cases {
            assert_eq!(super::kind(path), want, "{path}");
        }
    }
}
