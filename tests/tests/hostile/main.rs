//! The hostile-server suite: a compromised worker (a man-in-the-middle
//! proxy in front of a genuine, signed server) tries every attack in
//! [`attacks`] on a node that updates with verification on. For each
//! client (stock `ostree pull` and our `oscontent pull`), every attack must
//! fail, and leave the node's refs, commit and repo as they were, its disk
//! no fuller than the genuine objects fetched before the lie was found.
//!
//! Stock ostree runs as a careful admin would: `gpg-verify=true`,
//! `gpg-verify-summary=true`, the key imported with `--gpg-import`, and
//! `pull --timestamp-check` (without which stock ostree accepts a replayed
//! older release; see attack 6a).
//!
//! Build the binaries first: `cargo build --workspace --bins`.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod bundle;
mod credentials;
mod image;
mod lab;
mod peers;
mod upstream;

use lab::{lab, Base, Lab, REF};
use oscontent_testkit::proxy::{Action, Proxy, Rule};
use oscontent_testkit::signing::*;
use oscontent_testkit::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What an endless body is cut at by the proxy, if the client never stops
/// reading: well past every client's metadata limit.
const GARBAGE_CAP: u64 = 1 << 30;
/// "1 GiB" announced in Content-Length.
const ONE_GIB: u64 = 1 << 30;
/// What a stopped attack may leave on the node's disk: the genuine
/// objects fetched before the lie was found (the releases are small),
/// not the gigabytes some attacks offer.
const DISK_SLACK: u64 = 16 << 20;
/// Bound on one client run (an attack must not hang the suite).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(180);

fn obj(checksum: &str, ext: &str) -> String {
    format!("/objects/{}/{}.{ext}", &checksum[..2], &checksum[2..])
}

fn garbage(n: usize) -> bytes::Bytes {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31) ^ 0xa5)
        .collect::<Vec<u8>>()
        .into()
}

/// A rule from path → action pairs (exact paths).
fn table(pairs: Vec<(String, Action)>) -> Rule {
    let map: BTreeMap<String, Action> = pairs.into_iter().collect();
    Arc::new(move |p: &str| map.get(p).cloned())
}

/// One attack: where the node starts, where the proxy forwards by default,
/// and what it rewrites.
struct Attack {
    id: &'static str,
    what: &'static str,
    base: Base,
    setup: fn(&Lab) -> (String, Rule),
    /// The exit codes `oscontent pull` documents for this failure.
    ours: &'static [i32],
}

/// `oscontent pull` exit codes (its `--help` and README.md).
mod exit {
    /// The server or the network failed, or the remote lacks something.
    pub const NETWORK: i32 = 2;
    /// An object checksum, a signature, the summary signature or the ref
    /// binding did not verify.
    pub const VERIFICATION: i32 = 3;
    /// Older than what the ref has.
    pub const DOWNGRADE: i32 = 4;
}
/// Verification failures.
const VERIFY: &[i32] = &[exit::VERIFICATION];
/// Oversized or endless metadata: refused as a bad server or as
/// unverifiable, both documented.
const OVERSIZED: &[i32] = &[exit::NETWORK, exit::VERIFICATION];

/// The genuine v2 server, where most attacks forward by default.
fn v2(l: &Lab) -> String {
    l.s2.url.clone()
}

/// Every attack, in id order.
fn attacks() -> Vec<Attack> {
    [
        content_swaps(),
        ref_hijacks(),
        signature_attacks(),
        replays(),
        summary_lies(),
        object_lies(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Objects swapped for others: valid ones, or garbage.
fn content_swaps() -> Vec<Attack> {
    vec![
        Attack {
            id: "1a",
            what: "a content object replaced by another valid object",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        obj(&l.new_filez, "filez"),
                        Action::Bytes(l.other_filez_bytes.clone().into()),
                    )]),
                )
            },
            ours: VERIFY,
        },
        Attack {
            id: "1b",
            what: "a content object replaced by garbage",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        obj(&l.new_filez, "filez"),
                        Action::Bytes(garbage(4096)),
                    )]),
                )
            },
            ours: VERIFY,
        },
        Attack {
            id: "1c",
            what: "a content object with its own header and size, one byte of its content changed",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        obj(&l.new_filez, "filez"),
                        Action::Bytes(l.tampered_filez_bytes.clone().into()),
                    )]),
                )
            },
            ours: VERIFY,
        },
        Attack {
            id: "2a",
            what: "a dirtree replaced by another valid dirtree",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        obj(&l.new_dirtree, "dirtree"),
                        Action::Bytes(l.other_dirtree_bytes.clone().into()),
                    )]),
                )
            },
            ours: VERIFY,
        },
        Attack {
            id: "2b",
            what: "the root dirtree replaced by v1's",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        obj(&l.root_dirtree, "dirtree"),
                        Action::Bytes(l.other_dirtree_bytes.clone().into()),
                    )]),
                )
            },
            ours: VERIFY,
        },
    ]
}

/// The ref moved to an attacker's commit, signed or not.
fn ref_hijacks() -> Vec<Attack> {
    vec![
        Attack {
            id: "3a",
            what: "the ref (summary and refs/heads) points at an attacker's unsigned commit",
            base: Base::V1,
            setup: |l| {
                let strip = l.attacker_commit.clone();
                let rule: Rule = Arc::new(move |p: &str| {
                    (p == "/summary.sig" || p == obj(&strip, "commitmeta"))
                        .then_some(Action::Status(404))
                });
                (l.sa.url.clone(), rule)
            },
            ours: VERIFY,
        },
        Attack {
            id: "3b",
            what: "the ref points at an attacker's commit signed by the attacker's key",
            base: Base::V1,
            setup: |l| (l.sa.url.clone(), table(vec![])),
            ours: VERIFY,
        },
        Attack {
            id: "3c",
            what: "the ref points at an attacker's commit wearing the genuine signatures",
            base: Base::V1,
            setup: |l| {
                (
                    l.sa.url.clone(),
                    table(vec![
                        (
                            "/summary.sig".into(),
                            Action::Bytes(l.v2_summary_sig.clone().into()),
                        ),
                        (
                            obj(&l.attacker_commit, "commitmeta"),
                            Action::Bytes(l.v2_commitmeta.clone().into()),
                        ),
                    ]),
                )
            },
            ours: VERIFY,
        },
        Attack {
            id: "3d",
            what: "the attacker's commit served under the genuine commit's name",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        obj(&l.v2.commit, "commit"),
                        Action::Bytes(l.attacker_commit_bytes.clone().into()),
                    )]),
                )
            },
            ours: VERIFY,
        },
    ]
}

/// Signatures stripped, or made by an untrusted key.
fn signature_attacks() -> Vec<Attack> {
    vec![
        Attack {
            id: "4a",
            what: "signatures stripped (commitmeta and summary.sig 404)",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![
                        ("/summary.sig".into(), Action::Status(404)),
                        (obj(&l.v2.commit, "commitmeta"), Action::Status(404)),
                    ]),
                )
            },
            ours: VERIFY,
        },
        Attack {
            id: "4b",
            what: "the commit signature stripped",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(obj(&l.v2.commit, "commitmeta"), Action::Status(404))]),
                )
            },
            ours: VERIFY,
        },
        Attack {
            id: "4c",
            what: "the summary signature stripped",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![("/summary.sig".into(), Action::Status(404))]),
                )
            },
            ours: VERIFY,
        },
        Attack {
            id: "5a",
            what: "genuine content with signatures by an untrusted key",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![
                        (
                            "/summary.sig".into(),
                            Action::Bytes(l.attacker_v2_summary_sig.clone().into()),
                        ),
                        (
                            obj(&l.v2.commit, "commitmeta"),
                            Action::Bytes(l.attacker_v2_commitmeta.clone().into()),
                        ),
                    ]),
                )
            },
            ours: VERIFY,
        },
    ]
}

/// A genuine older release replayed.
fn replays() -> Vec<Attack> {
    vec![Attack {
        id: "6a",
        what: "downgrade: the validly signed v1 summary and commit replayed to a node at v2",
        base: Base::V2,
        setup: |l| (l.s1.url.clone(), table(vec![])),
        ours: &[exit::DOWNGRADE],
    }]
}

/// A summary announced as huge, endless, or garbage.
fn summary_lies() -> Vec<Attack> {
    vec![
        Attack {
            id: "7a",
            what: "a summary announced as 1 GiB",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        "/summary".into(),
                        Action::Garbage {
                            announce: Some(ONE_GIB),
                            cap: GARBAGE_CAP,
                        },
                    )]),
                )
            },
            ours: OVERSIZED,
        },
        Attack {
            id: "7b",
            what: "an endless chunked summary",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        "/summary".into(),
                        Action::Garbage {
                            announce: None,
                            cap: GARBAGE_CAP,
                        },
                    )]),
                )
            },
            ours: OVERSIZED,
        },
        Attack {
            id: "7c",
            what: "a garbage summary with the genuine summary.sig",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![("/summary".into(), Action::Bytes(garbage(64 << 10)))]),
                )
            },
            ours: VERIFY,
        },
    ]
}

/// A commit, its detached metadata or the summary signature: huge,
/// endless, or garbage.
fn object_lies() -> Vec<Attack> {
    vec![
        Attack {
            id: "7d",
            what: "a garbage commit object",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        obj(&l.v2.commit, "commit"),
                        Action::Bytes(garbage(4096)),
                    )]),
                )
            },
            ours: VERIFY,
        },
        Attack {
            id: "7e",
            what: "endless chunked detached metadata",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        obj(&l.v2.commit, "commitmeta"),
                        Action::Garbage {
                            announce: None,
                            cap: GARBAGE_CAP,
                        },
                    )]),
                )
            },
            ours: OVERSIZED,
        },
        Attack {
            id: "7f",
            what: "a summary.sig announced as 1 GiB",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![(
                        "/summary.sig".into(),
                        Action::Garbage {
                            announce: Some(ONE_GIB),
                            cap: GARBAGE_CAP,
                        },
                    )]),
                )
            },
            ours: OVERSIZED,
        },
        Attack {
            id: "7g",
            what: "a garbage summary.sig",
            base: Base::V1,
            setup: |l| {
                (
                    v2(l),
                    table(vec![("/summary.sig".into(), Action::Bytes(garbage(4096)))]),
                )
            },
            ours: VERIFY,
        },
    ]
}

/// One client's attempt at one attack.
#[derive(Debug)]
struct Outcome {
    /// The client exited non-zero.
    failed: bool,
    exit: String,
    code: Option<i32>,
    /// First lines of its error output.
    error: String,
    refs_before: BTreeMap<String, String>,
    refs_after: BTreeMap<String, String>,
    /// `ostree fsck` of the node repo afterwards.
    fsck: Result<(), String>,
    /// Disk the node repo takes, before and after.
    disk: (u64, u64),
    garbage_sent: u64,
    elapsed: Duration,
    requests: Vec<String>,
}

impl Outcome {
    fn stopped(&self) -> bool {
        self.failed
            && self.refs_before == self.refs_after
            && self.fsck.is_ok()
            && self.disk.1 <= self.disk.0 + DISK_SLACK
    }
}

/// A client under test: how it pulls the ref into a node repo
/// whose remote `origin` points at the proxy.
trait Client {
    fn name(&self) -> &'static str;
    fn pull(&self, lab: &Lab, repo: &Ostree) -> std::process::Output;
    /// Extra checks on a failure (e.g. the documented exit code).
    fn check_failure(&self, _attack: &Attack, _out: &Outcome) -> Result<(), String> {
        Ok(())
    }
}

struct StockOstree;

impl Client for StockOstree {
    fn name(&self) -> &'static str {
        "stock ostree"
    }
    fn pull(&self, _lab: &Lab, repo: &Ostree) -> std::process::Output {
        run_bounded(
            &mut repo.command([
                "pull",
                "--disable-fsync",
                "--timestamp-check",
                "origin",
                REF,
            ]),
            CLIENT_TIMEOUT,
        )
        .unwrap_or_else(|e| panic!("{e:#}"))
    }
}

/// Runs one attack against one client on a fresh copy of the node repo.
fn run(lab: &Lab, attack: &Attack, client: &dyn Client) -> Outcome {
    let dir = tempdir();
    let repo = fork_repo(lab.base(attack.base), &dir.path().join("node")).unwrap();
    let (upstream, rule) = (attack.setup)(lab);
    let proxy = Proxy::start(&upstream, rule).unwrap();
    set_remote_url(&repo, "origin", &proxy.url).unwrap();
    let refs_before = ref_targets(&repo).unwrap();
    assert_eq!(
        refs_before
            .get(&format!("origin:{}", REF))
            .map(String::as_str),
        Some(lab.base_commit(attack.base)),
        "{}: the node starts where it should",
        attack.id
    );
    let disk_before = disk_used(&repo.repo).unwrap();
    let start = Instant::now();
    let out = client.pull(lab, &repo);
    let elapsed = start.elapsed();
    let requests = proxy.requests();
    let garbage_sent = proxy.garbage_sent();
    drop(proxy);
    let stderr = strip_ansi(&String::from_utf8_lossy(&out.stderr));
    Outcome {
        failed: !out.status.success(),
        exit: format!("{}", out.status),
        code: out.status.code(),
        error: stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .take(3)
            .collect::<Vec<_>>()
            .join(" | "),
        refs_before,
        refs_after: ref_targets(&repo).unwrap_or_default(),
        fsck: repo.fsck().map(drop).map_err(|e| format!("{e:#}")),
        disk: (disk_before, disk_used(&repo.repo).unwrap_or(u64::MAX)),
        garbage_sent,
        elapsed,
        requests,
    }
}

/// Runs the whole table for one client; prints the tally and fails on any
/// attack not stopped (or a control pull that does not succeed).
fn suite(client: &dyn Client) {
    let lab = lab();
    // Control: the same proxy, lying about nothing, must let the update
    // through; otherwise a "stopped" attack proves nothing.
    let control = Attack {
        id: "control",
        what: "no attack",
        base: Base::V1,
        setup: |l| (l.s2.url.clone(), table(vec![])),
        ours: &[],
    };
    let c = run(&lab, &control, client);
    assert!(
        !c.failed && c.refs_after.get(&format!("origin:{}", REF)) == Some(&lab.v2.commit),
        "{}: the control update through an honest proxy failed ({}): {}\nrequests: {:#?}",
        client.name(),
        c.exit,
        c.error,
        c.requests
    );

    let attacks = attacks();
    let mut not_stopped = Vec::new();
    for a in &attacks {
        let t0 = Instant::now();
        let o = run(&lab, a, client);
        let total = t0.elapsed();
        let mut verdict = if o.stopped() {
            "stopped"
        } else {
            "NOT STOPPED"
        }
        .to_owned();
        if o.stopped() {
            if let Err(why) = client.check_failure(a, &o) {
                verdict = format!("stopped, but {why}");
                not_stopped.push(format!("{} ({}): {why}", a.id, a.what));
            }
        } else {
            not_stopped.push(format!(
                "{} ({}): exit {}, refs before {:?} after {:?}, fsck {:?}, disk {:?}; stderr: {}",
                a.id, a.what, o.exit, o.refs_before, o.refs_after, o.fsck, o.disk, o.error
            ));
        }
        eprintln!(
            "[{}] {} {:<70} {verdict} in {:.1}s of {:.1}s ({}; garbage sent {} bytes): {}",
            client.name(),
            a.id,
            a.what,
            o.elapsed.as_secs_f64(),
            total.as_secs_f64(),
            o.exit,
            o.garbage_sent,
            o.error
        );
    }
    let stopped = attacks.len() - not_stopped.len();
    // Straight to stderr, past the test harness's capture: CI logs show
    // the tally whether the test passes or not.
    let tally = format!(
        "hostile suite: {} attacks tried, {stopped} stopped ({})\n",
        attacks.len(),
        client.name()
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), tally.as_bytes());
    assert!(
        not_stopped.is_empty(),
        "{}: {} attack(s) not stopped:\n  {}",
        client.name(),
        not_stopped.len(),
        not_stopped.join("\n  ")
    );
}

#[test]
fn hostile_suite_stock_ostree() {
    suite(&StockOstree);
}

/// Our client, with the CLI agreed in COMMON.md: `oscontent pull --repo
/// PATH --remote NAME --ref REF --trusted-keys FILE`.
struct OurClient;

impl OurClient {
    /// Fails loudly (never skips) when `oscontent pull` is not there.
    fn require() {
        let bin = bin_dir().join("oscontent");
        let help = std::process::Command::new(&bin)
            .args(["pull", "--help"])
            .output();
        match help {
            Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--trusted-keys") => {}
            other => panic!(
                "the hostile suite's client half needs `oscontent pull --trusted-keys` ({}), which is not available: {other:?}. \
                 This is a failure, not a skip: every attack must also be tried against our client.",
                bin.display()
            ),
        }
    }
}

impl Client for OurClient {
    fn name(&self) -> &'static str {
        "oscontent pull"
    }

    fn pull(&self, lab: &Lab, repo: &Ostree) -> std::process::Output {
        let mut cmd = std::process::Command::new(client_bin());
        local_only(&mut cmd)
            .arg("pull")
            .arg("--repo")
            .arg(&repo.repo)
            .args(["--remote", "origin", "--ref", REF, "--trusted-keys"])
            .arg(&lab.trusted.public);
        run_bounded(&mut cmd, CLIENT_TIMEOUT).unwrap_or_else(|e| panic!("{e:#}"))
    }

    fn check_failure(&self, attack: &Attack, o: &Outcome) -> Result<(), String> {
        match o.code {
            Some(c) if attack.ours.contains(&c) => {}
            _ => {
                return Err(format!(
                    "exit {} where the documented code is one of {:?}",
                    o.exit, attack.ours
                ))
            }
        }
        if !o.error.to_lowercase().contains("error") || o.error.len() < 20 {
            return Err(format!("no clear error message: {:?}", o.error));
        }
        Ok(())
    }
}

#[test]
fn hostile_suite_oscontent_client() {
    OurClient::require();
    suite(&OurClient);
}
