//! `oscontent stage --follow`, the node agent, against one real server
//! handing out two staging slots with a 5 s lease: an agent SIGKILLed
//! while holding a slot holds it only until its lease expires, one stopped
//! by SIGTERM mid-stage releases its slot and exits 0 with nothing staged,
//! and every other agent stages the image the ref names, never more than
//! two at once (the server's own high-water mark); SIGTERM ends an idle
//! agent with exit 0 too. And an agent that could not verify what it follows is
//! refused at start.

use crate::support::*;
use oscontent_testkit::fixtures::{native_small, DEFAULT_REF};
use oscontent_testkit::process::Stopper;
use oscontent_testkit::signing::{keygen, Key};
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Bound on the whole fleet staging, slot waits and lease expiry included.
const FLEET_TIMEOUT: Duration = Duration::from_secs(240);
/// Bound on a slow agent getting its slot.
const GRANT_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on an agent exiting after SIGTERM.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const SLOTS: u32 = 2;

/// An agent: its repo, and its `--json` events and stderr in files.
struct Agent {
    repo: PathBuf,
    events: PathBuf,
    stderr: PathBuf,
    child: Stopper,
}

impl Agent {
    fn start(dir: &Path, name: &str, url: &str, key: &Key, extra: &[&str]) -> Agent {
        let repo = dir.join(name);
        Ostree::init(&repo, "archive").unwrap();
        let (events, stderr) = (
            dir.join(format!("{name}.json")),
            dir.join(format!("{name}.err")),
        );
        let mut cmd = Command::new(client_bin());
        local_only(&mut cmd)
            .args(["stage", "--follow", "--json", "--poll-interval", "1s"])
            .args(["--repo", &repo.display().to_string(), "--url", url])
            .args(["--ref", DEFAULT_REF, "--node", name])
            .args(["--trusted-keys", &key.public.display().to_string()])
            .args(extra)
            .env("RUST_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&events).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap());
        let child = Stopper::new(cmd.spawn().unwrap(), name);
        Agent {
            repo,
            events,
            stderr,
            child,
        }
    }

    fn log(&self) -> String {
        format!(
            "events:\n{}\nstderr:\n{}",
            std::fs::read_to_string(&self.events).unwrap_or_default(),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Its `--json` events called `name`.
    fn events_named(&self, name: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.events)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["event"] == name)
            .collect()
    }

    fn has_event(&self, name: &str) -> bool {
        !self.events_named(name).is_empty()
    }

    /// The digests `stage --list` shows in its repo.
    fn staged(&self) -> Vec<String> {
        let mut cmd = Command::new(client_bin());
        cmd.args(["stage", "--list", "--json", "--repo"])
            .arg(&self.repo);
        let out = check_output(local_only(&mut cmd), TOOL_TIMEOUT).unwrap();
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        v["staged"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["digest"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// SIGTERM, then an exit 0 within [`EXIT_TIMEOUT`] saying it stopped.
fn sigterm(a: &mut Agent) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(a.child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = a.child.wait_bounded(EXIT_TIMEOUT).unwrap();
    assert_eq!(status.code(), Some(0), "SIGTERM: {}", a.log());
    assert!(a.has_event("agent-stopped"), "{}", a.log());
}

/// A loopback port free a moment ago, for `--metrics-listen`.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// long-fn: one server and its agents through a kill and a stop, each step depending on the last
#[test]
fn agents_stage_two_at_a_time_and_a_killed_or_stopped_holder_frees_its_slot() {
    let f = native_small().unwrap_or_else(|e| panic!("{e:#}"));
    let v2 = &f.releases[1];
    let tmp = tempdir();
    let key = keygen(&tmp.path().join("keys"), "release", &[]).unwrap();
    let reg = Registry::start();
    reg.push(&f.oci_layout, &v2.version, "native:v2", &[]);
    let digest = reg.digest("native:v2");
    assert_eq!(digest, v2.image_manifest);
    let pinned = reg.image(&format!("native@{digest}"));
    let server = ready(image_server(&reg, &[pinned]).args([
        "--sign-key",
        &key.secret.display().to_string(),
        "--stage-slots",
        &SLOTS.to_string(),
        "--stage-lease-ttl",
        "5",
        // Refused agents come back within a second or two, not 15 to 45.
        "--stage-retry-after",
        "1",
        // Every agent here has the one loopback address.
        "--stage-leases-per-address",
        "16",
    ]));
    let dir = tmp.path();

    // Two agents paced to a crawl take both slots. One is SIGKILLed holding
    // its slot, which nothing then releases but its expiry; the other gets
    // SIGTERM mid-stage: it stops, releases its slot and exits 0.
    let mut holders: Vec<Agent> = (0..SLOTS)
        .map(|i| {
            Agent::start(
                dir,
                &format!("holder-{i}"),
                &server.url,
                &key,
                &["--io-max-rate", "4096"],
            )
        })
        .collect();
    for h in &holders {
        let granted = wait_for(GRANT_TIMEOUT, Duration::from_millis(50), || {
            h.has_event("slot-granted").then_some(())
        });
        assert!(
            granted.is_some(),
            "no slot granted within {GRANT_TIMEOUT:?}: {}",
            h.log()
        );
    }
    holders[0].child.child_mut().kill().unwrap();
    holders[0].child.child_mut().wait().unwrap();
    sigterm(&mut holders[1]);
    let released = holders[1].events_named("slot-released");
    assert!(
        released.len() == 1 && released[0]["released"] == true,
        "SIGTERM mid-stage: {}",
        holders[1].log()
    );
    assert!(
        holders[1].staged().is_empty(),
        "a stopped stage left a stage behind"
    );

    let metrics_port = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics_port}");
    let mut agents: Vec<Agent> = (0..4)
        .map(|i| {
            let extra: &[&str] = if i == 0 {
                &["--metrics-listen", &metrics_addr]
            } else {
                &[]
            };
            Agent::start(dir, &format!("node-{i}"), &server.url, &key, extra)
        })
        .collect();
    let all = wait_for(FLEET_TIMEOUT, Duration::from_millis(250), || {
        agents
            .iter()
            .all(|a| a.staged().contains(&digest))
            .then_some(())
    });
    let logs = || {
        agents
            .iter()
            .map(Agent::log)
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    assert!(
        all.is_some(),
        "not every agent staged {digest} within {FLEET_TIMEOUT:?}:\n{}",
        logs()
    );

    let pool = [("pool", "worker")];
    // An agent hands its slot back after its stage is written, so the last
    // release may follow the last `stage --list` by a moment: the figures
    // are read once the slots are all back (or, failing that, as they are,
    // for the assertions below to say what is wrong).
    let settled = wait_for(FLEET_TIMEOUT, Duration::from_millis(250), || {
        let m = server.metrics().ok()?;
        let back = m.get("oscontent_stage_slots_in_use", &pool) == Some(0.0)
            && m.get("oscontent_stage_slot_releases_total", &pool)? >= 5.0;
        back.then_some(m)
    });
    let m = match settled {
        Some(m) => m,
        None => server.metrics().unwrap(),
    };
    let peak = m.get("oscontent_stage_slots_peak", &pool).unwrap();
    assert!(peak <= f64::from(SLOTS), "peak {peak} slots in use at once");
    assert_eq!(peak, f64::from(SLOTS), "the holders took both slots");
    let expired = m
        .get("oscontent_stage_slot_expiries_total", &pool)
        .unwrap_or(0.0);
    assert!(
        expired >= 1.0,
        "{expired} leases expired: the killed holder's is"
    );
    let releases = m.get("oscontent_stage_slot_releases_total", &pool).unwrap();
    assert!(
        releases >= 5.0,
        "{releases} releases: the stopped holder's and the agents'"
    );
    let refused = m.sum("oscontent_stage_slot_refusals_total", &[("reason", "full")]);
    assert!(
        refused >= 1.0,
        "no agent was refused while the dead held both slots"
    );
    let grants = m.get("oscontent_stage_slot_grants_total", &pool).unwrap();
    assert!(grants >= 6.0, "{grants} grants for 2 holders and 4 agents");
    assert_eq!(
        m.get("oscontent_stage_slots_in_use", &pool),
        Some(0.0),
        "{}",
        logs()
    );
    assert!(
        agents.iter().any(|a| a.has_event("slot-refused")),
        "{}",
        logs()
    );

    // The agent's own metrics say what it staged, and that it is idle.
    let text = http1()
        .get(format!("http://{metrics_addr}/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let am = Metrics::parse(&text).unwrap();
    let staged_info = am
        .of("oscontent_agent_staged_info")
        .find(|s| s.labels.get("digest").map(String::as_str) == Some(digest.as_str()));
    assert!(staged_info.is_some(), "{text}");
    assert_eq!(
        am.get("oscontent_agent_state", &[("state", "idle")]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        am.get(
            "oscontent_agent_info",
            &[("node", "node-0"), ("pool", "worker")]
        ),
        Some(1.0)
    );
    let other = http1()
        .get(format!("http://{metrics_addr}/other"))
        .send()
        .unwrap();
    assert_eq!(other.status(), 404);

    for a in &mut agents {
        sigterm(a);
    }
}

/// `--follow` without keys to verify the summary that names the image is
/// refused at start, naming the flag to give; so are names the slot
/// contract refuses. Nothing is asked of the server (there is none).
#[test]
fn an_agent_that_cannot_verify_what_it_follows_is_refused_at_start() {
    let tmp = tempdir();
    let repo = tmp.path().join("repo");
    let node = Ostree::init(&repo, "archive").unwrap();
    let url = "http://127.0.0.1:9";
    for (name, commits, summary) in [("plain", false, false), ("commits-only", true, false)] {
        node.run([
            "remote",
            "add",
            &format!("--set=gpg-verify={commits}"),
            &format!("--set=gpg-verify-summary={summary}"),
            name,
            url,
        ])
        .unwrap();
    }
    let remote_refused = "must have gpg-verify=true and gpg-verify-summary=true";
    // (source and names, what the refusal says)
    let table: [(&[&str], &str); 5] = [
        (
            &["--url", url, "--node", "n"],
            "--follow needs --trusted-keys FILE",
        ),
        (&["--remote", "plain", "--node", "n"], remote_refused),
        (&["--remote", "commits-only", "--node", "n"], remote_refused),
        (
            &[
                "--url",
                url,
                "--node",
                "Node_1",
                "--trusted-keys",
                "/dev/null",
            ],
            "--node \"Node_1\"",
        ),
        (
            &[
                "--url",
                url,
                "--node",
                "n",
                "--pool",
                "a/b",
                "--trusted-keys",
                "/dev/null",
            ],
            "--pool \"a/b\"",
        ),
    ];
    for (args, want) in table {
        let mut cmd = Command::new(client_bin());
        local_only(&mut cmd)
            .args(["stage", "--follow", "--ref", DEFAULT_REF, "--repo"])
            .arg(&repo)
            .args(args);
        let o = run_bounded(&mut cmd, TOOL_TIMEOUT).unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
    }
}
