//! The hostile upstream: `serve --upstream` fed by a stock `ostree` repo
//! (served as files by the testkit proxy) that turns hostile once the
//! site server has published its genuine release. Each row changes the
//! upstream's files or what the proxy answers, then SIGHUP asks for a
//! refresh; the site server must refuse it, keep serving the genuine
//! release (verified by a stock pull), and write nothing beside its state
//! dir.

use crate::peers::*;
use oscontent_format::{build_summary, parse_summary};
use oscontent_testkit::proxy::{only, Action, Proxy, Rule};
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

pub const REF: &str = "os/stable";

/// The pristine upstream, built once: commits v1 < v2 < v3 (versions and
/// content), the ref at v2, and the objects only v3 has.
pub struct Pristine {
    _tmp: tempfile::TempDir,
    pub repo: PathBuf,
    pub commits: Vec<String>,
    /// A `.filez` and a `.dirtree` that v3 has and v2 does not.
    pub v3_filez: String,
    pub v3_dirtree: String,
    /// A `.filez` of v2 (valid, but not the one asked for).
    pub v2_filez: String,
    /// Every object only v3 has.
    pub v3_only: Vec<String>,
}

pub fn pristine() -> &'static Pristine {
    static P: OnceLock<Pristine> = OnceLock::new();
    P.get_or_init(|| {
        require_ostree();
        let tmp = tempdir();
        let commits: Vec<TinyCommit<'_>> = ["1.0", "2.0", "3.0"]
            .iter()
            .zip(1..)
            .map(|(version, seed)| TinyCommit {
                version,
                bind_ref: Some(REF),
                seed,
            })
            .collect();
        // The same content without v3, to tell v3's own objects apart.
        let two = tmp.path().join("two");
        tiny_repo(&two, &commits[..2]).unwrap();
        let repo = tmp.path().join("upstream");
        let made = tiny_repo(&repo, &commits).unwrap();
        let old = list_objects(&two).unwrap();
        let all = list_objects(&repo).unwrap();
        let only_v3 = |kind: &str| {
            all.get(kind)
                .difference(&old.get(kind))
                .next()
                .cloned()
                .unwrap_or_else(|| panic!("v3 has no {kind} of its own"))
        };
        let (v3_filez, v3_dirtree) = (only_v3(CONTENT), only_v3("dirtree"));
        let v2_filez = old.get(CONTENT).into_iter().next().unwrap();
        let v3_only = [CONTENT, "dirtree", "dirmeta", "commit"]
            .iter()
            .flat_map(|k| {
                all.get(k)
                    .difference(&old.get(k))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .collect();
        Pristine {
            _tmp: tmp,
            repo,
            commits: made,
            v3_filez,
            v3_dirtree,
            v2_filez,
            v3_only,
        }
    })
}

/// One row's upstream: a copy of the pristine one, the ref at v2.
pub struct Upstream<'a> {
    pub p: &'a Pristine,
    pub repo: PathBuf,
    pub sentinel: &'a Sentinel,
}

impl Upstream<'_> {
    pub fn point(&self, i: usize) {
        let r = Ostree::at(&self.repo);
        r.run(["refs", "--delete", REF]).ok();
        r.run(["refs", &format!("--create={REF}"), &self.p.commits[i]])
            .unwrap();
        r.run(["summary", "-u"]).unwrap();
    }

    pub fn summary(&self) -> oscontent_format::Summary {
        parse_summary(&std::fs::read(self.repo.join("summary")).unwrap()).unwrap()
    }
}

pub fn obj(checksum: &str, ext: &str) -> String {
    format!("/objects/{}/{}.{ext}", &checksum[..2], &checksum[2..])
}

/// A rule answering `path` with `bytes`.
fn bytes(path: &str, b: Vec<u8>) -> Option<Rule> {
    Some(only(path, Action::Bytes(b.into())))
}

fn file(repo: &Path, checksum: &str, ext: &str) -> Vec<u8> {
    std::fs::read(repo.join(obj(checksum, ext).trim_start_matches('/'))).unwrap()
}

/// One attack: what it does to the upstream (files, proxy rule) after the
/// genuine v2 is served, and what the server's refusal must say.
struct Attack {
    id: &'static str,
    what: &'static str,
    attack: fn(&Upstream) -> Option<Rule>,
    says: &'static str,
}

fn attacks() -> Vec<Attack> {
    [summary_attacks(), object_attacks()]
        .into_iter()
        .flatten()
        .collect()
}

/// Lies in the summary: paths, an older release.
fn summary_attacks() -> Vec<Attack> {
    vec![
        Attack {
            id: "U1",
            what: "a collection ID with ../ in the summary's collection map",
            attack: |u| {
                let mut s = u.summary();
                s.collection_map
                    .insert(u.sentinel.traversal(), s.refs.clone());
                bytes("/summary", build_summary(&s).unwrap())
            },
            says: "invalid collection ID",
        },
        Attack {
            id: "U2",
            what: "a ref name with ../ in the summary",
            attack: |u| {
                let mut s = u.summary();
                let mut r = s.refs[0].clone();
                r.name = format!("{}/x", u.sentinel.traversal());
                s.refs.push(r);
                bytes("/summary", build_summary(&s).unwrap())
            },
            says: "ERROR",
        },
        Attack {
            id: "U3",
            what: "the ref moved back to an older release",
            attack: |u| {
                u.point(0);
                None
            },
            says: "would move back",
        },
        Attack {
            id: "U11",
            what: "the ref moved to a commit dated ten years ahead, nothing verifying it (it would freeze every later release)",
            attack: |u| {
                far_future(u);
                None
            },
            says: "ahead of the local clock",
        },
    ]
}

/// Points the upstream's ref at a new commit dated ten years ahead.
fn far_future(u: &Upstream) {
    use oscontent_testkit::signing::commit_tree;
    let tree = tempdir();
    std::fs::create_dir_all(tree.path().join("usr/bin")).unwrap();
    std::fs::write(tree.path().join("usr/bin/hello"), "from the future\n").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let at = format!("@{}", now + 10 * 365 * 24 * 3600);
    let r = Ostree::at(&u.repo);
    let c = commit_tree(&r, tree.path(), REF, "9.0", &at, None).unwrap();
    r.run(["refs", "--delete", REF]).ok();
    r.run(["refs", &format!("--create={REF}"), &c]).unwrap();
    r.run(["summary", "-u"]).unwrap();
}

/// A new release whose objects or metadata lie.
fn object_attacks() -> Vec<Attack> {
    vec![
        Attack {
            id: "U4",
            what: "a new release with a content object replaced by garbage",
            attack: |u| {
                u.point(2);
                bytes(&obj(&u.p.v3_filez, "filez"), vec![0xa5; 4096])
            },
            says: "ERROR",
        },
        Attack {
            id: "U5",
            what: "a new release with a content object swapped for a valid other",
            attack: |u| {
                u.point(2);
                let other = file(&u.repo, &u.p.v2_filez, "filez");
                bytes(&obj(&u.p.v3_filez, "filez"), other)
            },
            says: "ERROR",
        },
        Attack {
            id: "U6",
            what: "a new release with a dirtree replaced by garbage",
            attack: |u| {
                u.point(2);
                bytes(&obj(&u.p.v3_dirtree, "dirtree"), vec![7; 300])
            },
            says: "ERROR",
        },
        Attack {
            id: "U7",
            what: "a new release whose commit object is garbage",
            attack: |u| {
                u.point(2);
                bytes(&obj(&u.p.commits[2], "commit"), vec![1; 200])
            },
            says: "ERROR",
        },
        Attack {
            id: "U8",
            what: "an endless summary",
            attack: |_| {
                Some(only(
                    "/summary",
                    Action::Garbage {
                        announce: None,
                        cap: 1 << 30,
                    },
                ))
            },
            says: "ERROR",
        },
        Attack {
            id: "U9",
            what: "a new release with a config announcing 1 GiB",
            attack: |u| {
                u.point(2);
                Some(only(
                    "/config",
                    Action::Garbage {
                        announce: Some(1 << 30),
                        cap: 1 << 30,
                    },
                ))
            },
            says: "ERROR",
        },
        Attack {
            id: "U10",
            what: "a new release whose commit the upstream does not have",
            attack: |u| {
                u.point(2);
                Some(only(&obj(&u.p.commits[2], "commit"), Action::Status(404)))
            },
            says: "ERROR",
        },
    ]
}

/// A fresh copy of the pristine upstream at release 1, served through the
/// proxy under `rule`, and a server (with `args`) mirroring it that has
/// published it: where every row and control starts. The copy lives as
/// long as the first element.
fn genuine_upstream<'a>(
    p: &'a Pristine,
    sentinel: &'a Sentinel,
    rule: Rule,
    args: &[&str],
) -> anyhow::Result<(tempfile::TempDir, Upstream<'a>, Proxy, Server)> {
    let (copy, repo) = fresh_copy(&p.repo);
    let u = Upstream { p, repo, sentinel };
    u.point(1);
    let proxy = Proxy::serve_dir(&u.repo, rule)?;
    let server = Server::upstream(&proxy.url)
        .args(args)
        .state_dir(&sentinel.state())
        .start()?;
    Ok((copy, u, proxy, server))
}

fn run(p: &Pristine, a: &Attack) -> Result<(), String> {
    let sentinel = Sentinel::new();
    let switch = Switch::default();
    let (_copy, u, _proxy, mut server) = genuine_upstream(p, &sentinel, switch.rule(), &[])
        .map_err(|e| format!("the genuine upstream: {e:#}"))?;
    let genuine = [(REF, p.commits[1].as_str())];
    serves_only(&server, &genuine).map_err(|e| format!("before the attack: {e}"))?;
    let before = refusals(&server);
    switch.set((a.attack)(&u));
    server.sighup().map_err(|e| format!("{e:#}"))?;
    wait_refused(&server, before, a.says)?;
    serves_only(&server, &genuine)?;
    nothing_outside(&sentinel)
}

#[test]
fn hostile_upstream() {
    let p = pristine();
    try_each(
        "hostile upstream",
        &attacks(),
        |a| (a.id, a.what),
        |_, a| run(p, a),
    );
}

/// Not an attack, the control: the same upstream moving forward is
/// published, so the rows above fail for what they did.
#[test]
fn an_upstream_moving_forward_is_published() {
    let p = pristine();
    let sentinel = Sentinel::new();
    let (_copy, u, _proxy, mut server) =
        genuine_upstream(p, &sentinel, Arc::new(|_: &str| None), &[]).unwrap();
    u.point(2);
    server.sighup().unwrap();
    published_only(&server, REF, &p.commits[2], &sentinel);
}

/// Item 1's last clause: a symlink planted inside the state dir (here the
/// store's object directory the next release writes into, pointing
/// outside) is never followed: the refresh is refused, naming it, and
/// nothing lands outside.
#[test]
fn a_symlink_planted_in_the_state_dir_is_never_followed() {
    let p = pristine();
    let sentinel = Sentinel::new();
    let (_copy, u, _proxy, mut server) =
        genuine_upstream(p, &sentinel, Arc::new(|_: &str| None), &[]).unwrap();
    let outside = tempdir();
    // A directory v3 writes into and nothing served uses yet.
    let objects = sentinel.state().join("mirror/repo/objects");
    let planted = p
        .v3_only
        .iter()
        .map(|c| objects.join(&c[..2]))
        .find(|d| !d.exists())
        .expect("an object directory only v3 needs");
    std::os::unix::fs::symlink(outside.path(), &planted).unwrap();
    let before = refusals(&server);
    u.point(2);
    server.sighup().unwrap();
    wait_refused(&server, before, "is a symlink or not a directory").unwrap();
    let leaked: Vec<_> = std::fs::read_dir(outside.path()).unwrap().collect();
    assert!(leaked.is_empty(), "written through the symlink: {leaked:?}");
    serves_only(&server, &[(REF, &p.commits[1])]).unwrap();
    nothing_outside(&sentinel).unwrap();
}

/// With `--allow-rollback`, the upstream moved back is published (with a
/// warning, counted as allowed), and nothing was pruned from under it.
#[test]
fn allow_rollback_publishes_an_upstream_moved_back() {
    let p = pristine();
    let sentinel = Sentinel::new();
    let (_copy, u, _proxy, mut server) = genuine_upstream(
        p,
        &sentinel,
        Arc::new(|_: &str| None),
        &["--allow-rollback", "--keep", "1"],
    )
    .unwrap();
    u.point(0);
    server.sighup().unwrap();
    let moved = poll(REFUSAL_TIMEOUT, || -> anyhow::Result<Option<()>> {
        let refs = served_refs(&server).map_err(anyhow::Error::msg)?;
        Ok((refs == [(REF.to_owned(), p.commits[0].clone())]).then_some(()))
    })
    .unwrap();
    assert!(moved.is_some(), "{}", server.stderr());
    let m = server.metrics().unwrap();
    assert_eq!(
        m.get("oscontent_rollbacks_total", &[("result", "allowed")]),
        Some(1.0)
    );
    assert_eq!(m.get("oscontent_rollback_allowed", &[]), Some(1.0));
    assert!(!server
        .stderr_lines("publishing it (--allow-rollback)")
        .is_empty());
    serves_only(&server, &[(REF, &p.commits[0])]).unwrap();
    nothing_outside(&sentinel).unwrap();
}

/// The server restarted on its state dir after the upstream moved back
/// while it was down: the marks it kept refuse the first summary (nothing
/// served, not ready, counted), and `--allow-rollback` publishes it.
#[test]
fn an_upstream_moved_back_while_the_server_was_down_is_refused_at_restart() {
    let p = pristine();
    let sentinel = Sentinel::new();
    let (_copy, u, proxy, mut server) =
        genuine_upstream(p, &sentinel, Arc::new(|_: &str| None), &[]).unwrap();
    serves_only(&server, &[(REF, &p.commits[1])]).unwrap();
    server.stop(REFUSAL_TIMEOUT).unwrap();

    u.point(0);
    let restart = |args: &[&str]| {
        Server::upstream(&proxy.url)
            .args(args)
            .state_dir(&sentinel.state())
    };
    let mut refused = restart(&[]).spawn().unwrap();
    wait_refused(&refused, 0.0, "nothing to publish").unwrap();
    let m = refused.metrics().unwrap();
    assert_eq!(
        m.get("oscontent_rollbacks_total", &[("result", "refused")]),
        Some(1.0)
    );
    assert_eq!(refused.get("/readyz").unwrap().status, 503);
    let says = refused.stderr_lines("would move back");
    assert!(
        says.iter()
            .any(|l| l.contains(&p.commits[0]) && l.contains(&p.commits[1])),
        "the refusal names both commits: {says:?}"
    );
    refused.stop(REFUSAL_TIMEOUT).unwrap();

    let mut allowed = restart(&["--allow-rollback"]).start().unwrap();
    serves_only(&allowed, &[(REF, &p.commits[0])]).unwrap();
    assert_eq!(
        allowed
            .metrics()
            .unwrap()
            .get("oscontent_rollbacks_total", &[("result", "allowed")]),
        Some(1.0)
    );
    allowed.stop(REFUSAL_TIMEOUT).unwrap();
    nothing_outside(&sentinel).unwrap();
}

/// The upstream's summary redirected off its origin: to another port
/// (the same upstream moved forward, which the site server would mirror,
/// a host the operator never named), and to another scheme. Each is
/// refused, naming the origins, and the genuine release stays served.
#[test]
fn upstream_redirect_to_another_origin_or_scheme_is_refused() {
    let p = pristine();
    let sentinel = Sentinel::new();
    let switch = Switch::default();
    let (_copy, _u, proxy, mut server) =
        genuine_upstream(p, &sentinel, switch.rule(), &[]).unwrap();
    let genuine = [(REF, p.commits[1].as_str())];
    serves_only(&server, &genuine).unwrap();
    let (_other_copy, other_repo) = fresh_copy(&p.repo);
    let other = Upstream {
        p,
        repo: other_repo,
        sentinel: &sentinel,
    };
    other.point(2);
    let elsewhere = Proxy::serve_dir(&other.repo, Arc::new(|_: &str| None)).unwrap();
    let rows = [
        ("another port", format!("{}/summary", elsewhere.url)),
        (
            "another scheme",
            format!("{}/summary", proxy.url.replacen("http://", "https://", 1)),
        ),
    ];
    for (what, to) in rows {
        let before = refusals(&server);
        switch.set(Some(only("/summary", Action::Redirect(to))));
        server.sighup().unwrap();
        wait_refused(&server, before, "refusing a redirect from http://127.0.0.1")
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        switch.set(None);
        serves_only(&server, &genuine).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    nothing_outside(&sentinel).unwrap();
}
