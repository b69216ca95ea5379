//! The hostile bundle: `serve --bundle DIR` over a bundle (made by
//! `oscontent-server mirror URL bundle:DIR` from the hostile upstream's
//! genuine repo) that is swapped, once the genuine release is served, for
//! a tampered one, as untrusted media would be. Some rows also fix up the
//! bundle's manifest so that its own file list agrees with the tampering:
//! the manifest is not a signature, only the objects' checksums are.

use crate::peers::*;
use crate::upstream::{obj, pristine, Pristine, Upstream, REF};
use oscontent_format::{build_summary, parse_summary};
use oscontent_testkit::proxy::Proxy;
use oscontent_testkit::*;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

const MANIFEST: &str = "oscontent-bundle.json";

/// Bundles of the pristine upstream with its ref at v1, v2 and v3.
struct Bundles {
    _tmp: tempfile::TempDir,
    at: Vec<PathBuf>,
}

fn bundles() -> &'static Bundles {
    static B: OnceLock<Bundles> = OnceLock::new();
    B.get_or_init(|| {
        let p = pristine();
        let tmp = tempdir();
        let sentinel = Sentinel::new();
        let (_copy, repo) = fresh_copy(&p.repo);
        let u = Upstream {
            p,
            repo,
            sentinel: &sentinel,
        };
        let proxy = Proxy::serve_dir(&u.repo, Arc::new(|_: &str| None)).unwrap();
        let at = (0..3)
            .map(|i| {
                u.point(i);
                let dir = tmp.path().join(format!("v{}", i + 1));
                let o = run_bounded(
                    Command::new(server_bin())
                        .env("NO_COLOR", "1")
                        .args(["mirror", &proxy.url])
                        .arg(format!("bundle:{}", dir.display())),
                    REFUSAL_TIMEOUT,
                )
                .unwrap();
                assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
                dir
            })
            .collect();
        Bundles { _tmp: tmp, at }
    })
}

/// Writes `bytes` at `rel` in bundle `b`; with `fix`, the manifest is
/// updated to list them (and the summary's digest, for the summary).
fn tamper(b: &Path, rel: &str, bytes: &[u8], fix: bool) {
    let path = b.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    if !fix {
        return;
    }
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(b.join(MANIFEST)).unwrap()).unwrap();
    let sha = hex::encode(Sha256::digest(bytes));
    m["files"][rel] = serde_json::json!({ "sha256": sha, "size": bytes.len() });
    if rel == "summary" {
        m["summary_sha256"] = sha.into();
    }
    std::fs::write(b.join(MANIFEST), serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

/// The bundle's summary with `f` applied, written back (manifest fixed).
fn forge_summary(b: &Path, f: impl FnOnce(&mut oscontent_format::Summary)) {
    let mut s = parse_summary(&std::fs::read(b.join("summary")).unwrap()).unwrap();
    f(&mut s);
    tamper(b, "summary", &build_summary(&s).unwrap(), true);
}

/// Where a row's attack happens: the served bundle dir, the releases.
struct Scene<'a> {
    dir: &'a Path,
    p: &'a Pristine,
    sentinel: &'a Sentinel,
}

impl Scene<'_> {
    /// The served bundle becomes a copy of the one at release `i`.
    fn swap_to(&self, i: usize) {
        std::fs::remove_dir_all(self.dir).unwrap();
        copy_dir(&bundles().at[i], self.dir).unwrap();
    }

    fn rel(checksum: &str, ext: &str) -> String {
        obj(checksum, ext).trim_start_matches('/').to_owned()
    }
}

struct Attack {
    id: &'static str,
    what: &'static str,
    attack: fn(&Scene),
    says: &'static str,
}

fn attacks() -> Vec<Attack> {
    [object_attacks(), path_attacks()]
        .into_iter()
        .flatten()
        .collect()
}

/// Older releases and tampered objects.
fn object_attacks() -> Vec<Attack> {
    vec![
        Attack {
            id: "B1",
            what: "the ref moved back to an older release",
            attack: |s| s.swap_to(0),
            says: "would move back",
        },
        Attack {
            id: "B2",
            what: "a new release with a content object replaced by garbage",
            attack: |s| {
                s.swap_to(2);
                let rel = Scene::rel(&s.p.v3_filez, "filez");
                tamper(s.dir, &rel, &[0xa5; 4096], false);
            },
            says: "ERROR",
        },
        Attack {
            id: "B3",
            what: "a content object swapped for a valid other, the manifest agreeing",
            attack: |s| {
                s.swap_to(2);
                let held = list_objects(s.dir).unwrap().get(CONTENT);
                let other = held.iter().find(|c| **c != s.p.v3_filez).unwrap();
                let other = std::fs::read(s.dir.join(Scene::rel(other, "filez"))).unwrap();
                tamper(s.dir, &Scene::rel(&s.p.v3_filez, "filez"), &other, true);
            },
            says: "ERROR",
        },
        Attack {
            id: "B4",
            what: "a dirtree replaced by garbage, the manifest agreeing",
            attack: |s| {
                s.swap_to(2);
                let rel = Scene::rel(&s.p.v3_dirtree, "dirtree");
                tamper(s.dir, &rel, &[7; 300], true);
            },
            says: "ERROR",
        },
    ]
}

/// Paths climbing out, and a missing commit.
fn path_attacks() -> Vec<Attack> {
    vec![
        Attack {
            id: "B5",
            what: "a collection ID with ../ in the summary, the manifest agreeing",
            attack: |s| {
                s.swap_to(2);
                let bad = s.sentinel.traversal();
                forge_summary(s.dir, |sum| {
                    sum.collection_map.insert(bad, sum.refs.clone());
                });
            },
            says: "invalid collection ID",
        },
        Attack {
            id: "B6",
            what: "a ref name with ../ in the summary, the manifest agreeing",
            attack: |s| {
                s.swap_to(2);
                let bad = format!("{}/x", s.sentinel.traversal());
                forge_summary(s.dir, |sum| {
                    let mut r = sum.refs[0].clone();
                    r.name = bad;
                    sum.refs.push(r);
                });
            },
            says: "ERROR",
        },
        Attack {
            id: "B7",
            what: "a manifest listing a path with ../",
            attack: |s| {
                s.swap_to(2);
                let bad = s.sentinel.traversal();
                tamper(
                    s.dir,
                    "summary",
                    &std::fs::read(s.dir.join("summary")).unwrap(),
                    true,
                );
                let mut m: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(s.dir.join(MANIFEST)).unwrap()).unwrap();
                m["files"][bad] = serde_json::json!({ "sha256": "00".repeat(32), "size": 1 });
                std::fs::write(s.dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
            },
            says: "not an archive repo path",
        },
        Attack {
            id: "B8",
            what: "a new release whose commit object is missing, the manifest agreeing",
            attack: |s| {
                s.swap_to(2);
                let rel = Scene::rel(&s.p.commits[2], "commit");
                std::fs::remove_file(s.dir.join(&rel)).unwrap();
                let mut m: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(s.dir.join(MANIFEST)).unwrap()).unwrap();
                m["files"].as_object_mut().unwrap().remove(&rel);
                std::fs::write(s.dir.join(MANIFEST), serde_json::to_vec(&m).unwrap()).unwrap();
            },
            says: "ERROR",
        },
    ]
}

fn run(p: &Pristine, a: &Attack) -> Result<(), String> {
    let sentinel = Sentinel::new();
    // The untrusted media: outside the sentinel parent (the server only
    // reads it).
    let usb = tempdir();
    let dir = usb.path().join("os");
    copy_dir(&bundles().at[1], &dir).unwrap();
    let mut server = Server::bundle(&dir)
        .state_dir(&sentinel.state())
        .start()
        .map_err(|e| format!("the genuine bundle: {e:#}"))?;
    let genuine = [(REF, p.commits[1].as_str())];
    serves_only(&server, &genuine).map_err(|e| format!("before the attack: {e}"))?;
    let before = refusals(&server);
    (a.attack)(&Scene {
        dir: &dir,
        p,
        sentinel: &sentinel,
    });
    server.sighup().map_err(|e| format!("{e:#}"))?;
    wait_refused(&server, before, a.says)?;
    serves_only(&server, &genuine)?;
    nothing_outside(&sentinel)
}

#[test]
fn hostile_bundle() {
    let p = pristine();
    try_each(
        "hostile bundle",
        &attacks(),
        |a| (a.id, a.what),
        |_, a| run(p, a),
    );
}

/// The control: the genuine next bundle is published.
#[test]
fn a_genuine_newer_bundle_is_published() {
    let p = pristine();
    let sentinel = Sentinel::new();
    let usb = tempdir();
    let dir = usb.path().join("os");
    copy_dir(&bundles().at[1], &dir).unwrap();
    let mut server = Server::bundle(&dir)
        .state_dir(&sentinel.state())
        .start()
        .unwrap();
    Scene {
        dir: &dir,
        p,
        sentinel: &sentinel,
    }
    .swap_to(2);
    server.sighup().unwrap();
    published_only(&server, REF, &p.commits[2], &sentinel);
}

/// `mirror URL bundle:DIR` into a bundle someone tampered with: symlinks
/// planted where the next release's objects and the refs go, pointing
/// outside. The mirror refuses, naming the symlink, and writes nothing
/// through it.
#[test]
fn mirror_into_a_tampered_bundle_writes_nothing_through_a_symlink() {
    let p = pristine();
    let sentinel = Sentinel::new();
    let (_copy, repo) = fresh_copy(&p.repo);
    let u = Upstream {
        p,
        repo,
        sentinel: &sentinel,
    };
    u.point(2);
    let proxy = Proxy::serve_dir(&u.repo, Arc::new(|_: &str| None)).unwrap();
    let usb = tempdir();
    let dir = usb.path().join("os");
    copy_dir(&bundles().at[1], &dir).unwrap();
    let outside = tempdir();
    // (where, what the mirror writes there next)
    let planted = [
        p.v3_only
            .iter()
            .map(|c| dir.join("objects").join(&c[..2]))
            .find(|d| !d.exists())
            .expect("an object directory only v3 needs"),
        dir.join("refs/heads/os"),
    ];
    for (i, at) in planted.iter().enumerate() {
        let target = outside.path().join(i.to_string());
        std::fs::create_dir(&target).unwrap();
        if at.exists() {
            std::fs::remove_dir_all(at).unwrap();
        }
        std::os::unix::fs::symlink(&target, at).unwrap();
        let (o, err) = mirror_to_bundle(&proxy.url, &dir, REFUSAL_TIMEOUT);
        assert!(!o.status.success(), "{}: mirrored through it", at.display());
        assert!(err.contains("is a symlink or not a directory"), "{err}");
        let leaked: Vec<_> = std::fs::read_dir(&target).unwrap().collect();
        assert!(
            leaked.is_empty(),
            "written through {}: {leaked:?}",
            at.display()
        );
        std::fs::remove_file(at).unwrap();
    }
}

/// What the site server may peak at while refusing a manifest bomb (it
/// idles at a few tens of MiB; the audit saw 1,010 MiB).
const MAX_PEAK_RSS_KIB: u64 = 100 << 10;

/// The process's peak resident set (`VmHWM`), KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

/// A manifest whose one release names copies of `name`, `bytes` long at
/// least: otherwise well-formed, so only its bounds can refuse it.
fn ref_bomb(name: &str, bytes: usize) -> Vec<u8> {
    let head = format!(
        r#"{{"kind":"oscontent-bundle","format":1,"source":"x","summary_sha256":"","summary_signed":false,"releases":[{{"commit":"{}","timestamp":0,"refs":["#,
        "a".repeat(64)
    );
    let item = format!("{name:?},");
    let mut out = head.into_bytes();
    out.reserve(bytes + 64);
    while out.len() < bytes {
        out.extend_from_slice(item.as_bytes());
    }
    out.extend_from_slice(format!("{name:?}]}}],\"files\":{{}}}}").as_bytes());
    out
}

/// The served bundle at v2 with a server on it.
struct Site {
    usb: tempfile::TempDir,
    dir: PathBuf,
    sentinel: Sentinel,
    server: Server,
}

fn site() -> Site {
    let sentinel = Sentinel::new();
    let usb = tempdir();
    let dir = usb.path().join("os");
    copy_dir(&bundles().at[1], &dir).unwrap();
    let server = Server::bundle(&dir)
        .state_dir(&sentinel.state())
        .start()
        .unwrap();
    serves_only(&server, &[(REF, pristine().commits[1].as_str())]).unwrap();
    Site {
        usb,
        dir,
        sentinel,
        server,
    }
}

impl Site {
    /// `attack` on the bundle, a refresh, and its refusal saying `says`;
    /// the genuine v2 still served, nothing written beside the state dir.
    fn refused(&mut self, attack: impl FnOnce(&Path), says: &str) -> Result<(), String> {
        let before = refusals(&self.server);
        attack(&self.dir);
        self.server.sighup().map_err(|e| format!("{e:#}"))?;
        wait_refused(&self.server, before, says)?;
        serves_only(&self.server, &[(REF, pristine().commits[1].as_str())])?;
        nothing_outside(&self.sentinel)
    }
}

/// S5: a manifest of tens of MiB of tiny ref strings, read whole and
/// deserialised before any check, took the site server past 1 GiB at
/// every refresh. Now one over the size cap is refused by its size, and
/// one under it at the first ref past the count cap; the peak stays small
/// and the previous bundle is still served.
#[test]
fn bundle_manifest_bomb_is_refused_in_bounded_memory() {
    struct Bomb {
        what: &'static str,
        bytes: fn() -> Vec<u8>,
        says: &'static str,
    }
    let bombs = [
        Bomb {
            what: "64 MiB of empty ref strings",
            bytes: || ref_bomb("", 64 << 20),
            says: "byte limit of a bundle manifest",
        },
        Bomb {
            what: "16 MiB of one-letter ref strings",
            bytes: || ref_bomb("a", 16 << 20),
            says: "more than 100000 refs in one release",
        },
    ];
    for b in bombs {
        let mut s = site();
        let bomb = (b.bytes)();
        let refused = s.refused(|d| std::fs::write(d.join(MANIFEST), &bomb).unwrap(), b.says);
        // The peak first: whatever the refresh said, it has run by now.
        let peak = peak_rss_kib(s.server.pid().unwrap());
        assert!(
            peak < MAX_PEAK_RSS_KIB,
            "{}: the site server peaked at {peak} KiB (limit {MAX_PEAK_RSS_KIB} KiB)",
            b.what
        );
        refused.unwrap_or_else(|e| panic!("{}: {e}", b.what));
        eprintln!("{}: refused, peak RSS {peak} KiB", b.what);
    }
}

/// A manifest that is a FIFO blocked the refresh (and every later one)
/// in `open`. Now it is refused without waiting, and the next genuine
/// bundle is still picked up.
#[test]
fn fifo_bundle_manifest_does_not_block_refreshes() {
    let mut s = site();
    s.refused(
        |d| {
            std::fs::remove_file(d.join(MANIFEST)).unwrap();
            rustix::fs::mknodat(
                rustix::fs::CWD,
                d.join(MANIFEST),
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o644),
                0,
            )
            .unwrap();
        },
        "is a FIFO, not a regular file",
    )
    .unwrap();
    let p = pristine();
    Scene {
        dir: &s.dir,
        p,
        sentinel: &s.sentinel,
    }
    .swap_to(2);
    s.server.sighup().unwrap();
    published_only(&s.server, REF, &p.commits[2], &s.sentinel);
}

/// A manifest that is a symlink (here to the genuine next bundle's
/// manifest, moved aside): followed, it would publish whatever the link
/// names. Refused, naming the link.
#[test]
fn symlinked_bundle_manifest_is_refused() {
    let mut s = site();
    let aside = s.usb.path().join("elsewhere.json");
    let p = pristine();
    let scene_dir = s.dir.clone();
    s.refused(
        |d| {
            Scene {
                dir: &scene_dir,
                p,
                sentinel: &Sentinel::new(),
            }
            .swap_to(2);
            std::fs::rename(d.join(MANIFEST), &aside).unwrap();
            std::os::unix::fs::symlink(&aside, d.join(MANIFEST)).unwrap();
        },
        "is a symlink: a bundle manifest is read only as a regular file",
    )
    .unwrap();
}
