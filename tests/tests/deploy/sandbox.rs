//! The server run as the shipped Deployment runs it, in a bubblewrap
//! sandbox built from the rendered manifests: a read-only root (the
//! image's `/var/tmp` included), each `emptyDir` as a tmpfs of its
//! `sizeLimit` at its mount path, the pod's `runAsUser`/`runAsGroup`, no
//! capabilities. Under those constraints two oscontainers from a real
//! registry that differ in one 40 MB file are published, the delta
//! between them is compiled within the default bounds or refused with an
//! error naming the bound, and a stock node updates; nothing is written
//! past a volume's size (ENOSPC would be the eviction the kubelet does).
//!
//! Substituted, and only these: the image references (a plain-HTTP
//! registry on loopback, `--insecure-registry`), the listen address, and
//! the flags that name files of the ConfigMap and Secret volumes (the pull
//! secret, CA, trust material: `base_args_serve_probes_and_ostree_pull`
//! covers them), whose volumes are not mounted here.

use crate::manifest::{Manifest, Volume};
use oscontent_testkit::deploy::server_flags;
use oscontent_testkit::registry::Registry;
use oscontent_testkit::*;
use serde_json::Value;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The ref both oscontainers bind their commit to.
const STREAM: &str = "os/x86_64/stable";
/// The changed file (the audit's S6).
const BIG: usize = 40 << 20;
const READY_WAIT: Duration = Duration::from_secs(300);
/// The delta round of the 40 MB pair: compiled, or stopped by a bound.
const ROUND_WAIT: Duration = Duration::from_secs(600);
const TOOL_TIMEOUT: Duration = Duration::from_secs(300);
/// Where the config volumes are mounted: their flags are dropped.
const CONFIG_MOUNTS: &str = "/etc/oscontent/";

/// `5Gi`, `64Mi`, `512Ki`, `1000` as bytes.
fn quantity(q: &str) -> u64 {
    let table: &[(&str, u64)] = &[("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    for (suffix, unit) in table {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().unwrap() * unit;
        }
    }
    q.parse()
        .unwrap_or_else(|_| panic!("sizeLimit {q:?} is not a quantity this test reads"))
}

/// An `emptyDir` of the server container: where, and its `sizeLimit`.
struct EmptyDir {
    path: String,
    size: u64,
}

fn empty_dirs(m: &Manifest) -> Vec<EmptyDir> {
    let mut out = Vec::new();
    for mount in m.volume_mounts() {
        if !matches!(m.volume(&mount.name), Some(Volume::EmptyDir)) {
            continue;
        }
        let v = m.pod["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == mount.name.as_str())
            .unwrap();
        let limit = v["emptyDir"]["sizeLimit"]
            .as_str()
            .unwrap_or_else(|| panic!("emptyDir {} has no sizeLimit", mount.name));
        out.push(EmptyDir {
            path: mount.mount_path,
            size: quantity(limit),
        });
    }
    out
}

/// The container's setting, else the pod's.
fn security<'a>(m: &'a Manifest, key: &str) -> &'a Value {
    let c = &m.server["securityContext"][key];
    if c.is_null() {
        &m.pod["securityContext"][key]
    } else {
        c
    }
}

/// `bwrap` and its arguments for the manifests' pod: the host's top-level
/// directories bound read-only (not those the pod has its own of), each
/// emptyDir a tmpfs of its size, the root remounted read-only.
fn sandbox(m: &Manifest, dirs: &[EmptyDir]) -> Vec<OsString> {
    assert_eq!(
        security(m, "readOnlyRootFilesystem"),
        &Value::Bool(true),
        "the sandbox assumes a read-only root"
    );
    assert_eq!(
        m.server["securityContext"]["capabilities"]["drop"],
        serde_json::json!(["ALL"]),
        "the sandbox drops every capability, as the manifests do"
    );
    let uid = security(m, "runAsUser").as_u64().expect("runAsUser");
    let gid = security(m, "runAsGroup").as_u64().expect("runAsGroup");
    let mut a: Vec<OsString> = [
        "bwrap",
        "--unshare-user",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
    ]
    .map(OsString::from)
    .to_vec();
    a.extend([
        "--uid".into(),
        uid.to_string().into(),
        "--gid".into(),
        gid.to_string().into(),
    ]);
    a.extend(["--tmpfs".into(), "/".into()]);
    let own = ["proc", "dev", "sys", "tmp", "var", "run"];
    for e in std::fs::read_dir("/").unwrap().flatten() {
        let name = e.file_name();
        let top = name.to_string_lossy().into_owned();
        if own.contains(&top.as_str()) {
            continue;
        }
        assert!(
            dirs.iter()
                .all(|d| !d.path.starts_with(&format!("/{top}/")) && d.path != format!("/{top}")),
            "an emptyDir under /{top}, which the sandbox binds from the host"
        );
        let path = e.path();
        if path.is_symlink() {
            let target = std::fs::read_link(&path).unwrap();
            a.extend(["--symlink".into(), target.into(), path.into()]);
        } else {
            a.extend(["--ro-bind".into(), path.clone().into(), path.into()]);
        }
    }
    a.extend(["--dev", "/dev", "--proc", "/proc", "--dir", "/var/tmp"].map(OsString::from));
    for d in dirs {
        a.extend([
            "--size".into(),
            d.size.to_string().into(),
            "--perms".into(),
            "0755".into(),
            "--tmpfs".into(),
            d.path.clone().into(),
        ]);
    }
    a.extend(["--remount-ro".into(), "/".into()]);
    a
}

/// Two oscontainers (`srv/repo`, one orphan commit each, bound to
/// `STREAM`, version 1 and 2) differing in `usr/lib/big`, every 4 KiB of it changed by a byte, in
/// one OCI layout tagged `1` and `2`; their commits.
fn oscontainers(dir: &Path) -> (PathBuf, [String; 2]) {
    let layout = dir.join("oci");
    let run = |program: &str, args: &[&str]| {
        check_output(Command::new(program).args(args), TOOL_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e:#}"))
    };
    run(
        "umoci",
        &["init", &format!("--layout={}", layout.display())],
    );
    let mut data = noise(BIG, 11);
    let mut commits = Vec::new();
    for version in ["1", "2"] {
        let tree = dir.join(format!("tree-{version}"));
        std::fs::create_dir_all(tree.join("usr/lib")).unwrap();
        std::fs::write(tree.join("usr/lib/big"), &data).unwrap();
        std::fs::write(
            tree.join("usr/lib/os-release"),
            format!("VERSION={version}\n"),
        )
        .unwrap();
        let oc = dir.join(format!("oc-{version}"));
        let repo = oc.join("srv/repo");
        let r = Ostree::init(&repo, "archive").unwrap();
        let commit = r
            .run([
                "commit".to_owned(),
                "--orphan".into(),
                "--no-xattrs".into(),
                format!("--bind-ref={STREAM}"),
                format!("--tree=dir={}", tree.display()),
                format!("--add-metadata-string=version={version}"),
            ])
            .unwrap()
            .trim()
            .to_owned();
        let image = format!("--image={}:{version}", layout.display());
        run("umoci", &["new", &image]);
        run(
            "umoci",
            &[
                "insert",
                &image,
                &oc.join("srv").display().to_string(),
                "/srv",
            ],
        );
        run(
            "umoci",
            &[
                "config",
                &image,
                "--os=linux",
                "--architecture=amd64",
                &format!("--config.label=com.coreos.ostree-commit={commit}"),
                &format!("--config.label=version={version}"),
            ],
        );
        commits.push(commit);
        for b in data.iter_mut().step_by(4096) {
            *b ^= 0x5a;
        }
    }
    let [a, b]: [String; 2] = commits.try_into().unwrap();
    (layout, [a, b])
}

/// The pid of the server inside the sandbox (bwrap's descendant).
fn server_pid(bwrap: u32) -> Option<u32> {
    let mut frontier = vec![bwrap];
    for _ in 0..4 {
        let mut next = Vec::new();
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            let Some((head, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
            if !frontier.contains(&ppid) {
                continue;
            }
            let pid: u32 = e.file_name().to_string_lossy().parse().ok()?;
            if head.ends_with("(oscontent-serve") {
                return Some(pid);
            }
            next.push(pid);
        }
        frontier = next;
    }
    None
}

/// Bytes used on the filesystem at `path` as the server sees it.
fn used(pid: u32, path: &str) -> Option<u64> {
    let p = format!("/proc/{pid}/root{path}");
    let s = rustix::fs::statvfs(p.as_str()).ok()?;
    Some((s.f_blocks - s.f_bfree) * s.f_frsize)
}

// long-fn: one sandbox (minutes to build) checked through publish, compile and pull in order
#[test]
fn the_deployment_sandbox_publishes_compiles_a_big_delta_within_bounds_and_serves_a_pull() {
    require_ostree();
    let m = crate::manifest::manifest();
    let dirs = empty_dirs(&m);
    assert!(dirs.len() >= 2, "the manifests' emptyDirs: state and /tmp");
    let tmp = tempdir();
    let (layout, [v1, v2]) = oscontainers(tmp.path());
    let reg = Registry::start();
    let images: Vec<String> = ["1", "2"]
        .iter()
        .map(|t| reg.push(&layout, t, &format!("os/oscontainer:{t}"), &[]))
        .collect();

    let mut args = vec!["serve".to_owned()];
    let flags = server_flags(&m.args()).unwrap_or_else(|e| panic!("{e}"));
    let mut state_dir = None;
    for (k, v) in flags {
        match k.as_str() {
            "--image" | "--listen" => continue,
            _ if v.starts_with(CONFIG_MOUNTS) => continue,
            "--state-dir" => state_dir = Some(v.clone()),
            _ => {}
        }
        args.push(format!("{k}={v}"));
    }
    let state_dir = state_dir.expect("the manifests pass --state-dir");
    assert!(
        dirs.iter().any(|d| state_dir.starts_with(&d.path)),
        "--state-dir={state_dir} is on an emptyDir"
    );
    for i in &images {
        args.push(format!("--image={i}"));
    }
    args.push(format!("--insecure-registry={}", reg.host()));
    args.push("--listen=127.0.0.1:0".into());
    let env: Vec<(String, String)> = m
        .env()
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect();
    let mut server = Server::verbatim(&args, &env)
        .wrapped_in(sandbox(&m, &dirs))
        .spawn()
        .unwrap_or_else(|e| panic!("{e:#}"));

    // The most each volume held while the server ran.
    let stop = Arc::new(AtomicBool::new(false));
    let bwrap = server.pid().unwrap();
    let paths: Vec<String> = dirs.iter().map(|d| d.path.clone()).collect();
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = vec![0u64; paths.len()];
            // Bounded: at most the round's wait, every 50 ms.
            for _ in 0..(ROUND_WAIT.as_millis() / 50 + READY_WAIT.as_millis() / 50) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Some(pid) = server_pid(bwrap) {
                    for (p, path) in peak.iter_mut().zip(&paths) {
                        *p = (*p).max(used(pid, path).unwrap_or(0));
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        })
    };

    server
        .wait_ready(READY_WAIT)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr()));
    // Compiled within the default bounds, or stopped by one with an error
    // that names it; either way counted.
    let outcome = poll(ROUND_WAIT, || {
        let mm = server.metrics()?;
        let published = mm.get("oscontent_deltas_published", &[]).unwrap_or(0.0);
        let failed = mm
            .get("oscontent_deltas_total", &[("result", "failed")])
            .unwrap_or(0.0);
        anyhow::Ok((published >= 1.0 || failed >= 1.0).then_some(published >= 1.0))
    })
    .unwrap()
    .unwrap_or_else(|| panic!("no delta round ended\n{}", server.stderr()));
    if !outcome {
        let lines = server.stderr_lines("static delta not generated");
        assert_eq!(lines.len(), 1, "{}", server.stderr());
        assert!(
            lines[0].contains(&v1) && lines[0].contains(&v2) && lines[0].contains("--delta-"),
            "the error names the pair and the bound: {}",
            lines[0]
        );
        let mm = server.metrics().unwrap();
        let bounds = mm
            .get("oscontent_delta_bounds_hit_total", &[("bound", "memory")])
            .unwrap_or(0.0)
            + mm.get("oscontent_delta_bounds_hit_total", &[("bound", "time")])
                .unwrap_or(0.0);
        assert_eq!(bounds, 1.0, "{}", server.stderr());
    }

    // A stock node at v1 updates to v2 (through the delta if there is one).
    let node = Ostree::init(&tmp.path().join("node"), "bare-user").unwrap();
    let src = tmp.path().join("oc-1/srv/repo").display().to_string();
    node.run(["pull-local", "--untrusted", &src, &v1]).unwrap();
    node.remote_add("os", &server.url, &[]).unwrap();
    let local = format!("os:{STREAM}");
    node.run(["refs", "--create", &local, &v1]).unwrap();
    let out = node
        .pull(&["os", STREAM])
        .unwrap_or_else(|e| panic!("{e:#}\n{}", server.stderr()));
    assert_eq!(out.contains("delta parts"), outcome, "{out}");
    assert_eq!(node.rev_parse(&local).unwrap(), v2);
    node.fsck().unwrap();

    assert!(server.is_running(), "{}", server.stderr());
    assert_eq!(
        server.metrics().unwrap().get("oscontent_ready", &[]),
        Some(1.0)
    );
    stop.store(true, Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    let log = server.stderr();
    assert!(!log.contains("No space left"), "a volume filled up:\n{log}");
    for (d, p) in dirs.iter().zip(&peak) {
        eprintln!("{}: peak {} MiB of {} MiB", d.path, p >> 20, d.size >> 20);
        assert!(
            *p < d.size,
            "{} held {p} bytes, its sizeLimit is {}",
            d.path,
            d.size
        );
    }
    assert!(
        peak.iter().any(|p| *p > 0),
        "the volumes were never sampled"
    );
}
