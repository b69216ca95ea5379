//! Credentials handed to the server reach no log and no file: an
//! `--upstream` URL's userinfo (sent as basic auth to an nginx that
//! demands it, so the test fails if they were simply dropped) and a
//! registry's basic-auth password from `--authfile`. Every stderr line
//! (text and JSON logs, at debug level), the JSON access log, the state
//! dir, a bundle `mirror` wrote and its report are searched for the
//! password and for its `Authorization: Basic` form.

use crate::peers::*;
use crate::upstream::{pristine, Upstream, REF};
use oscontent_testkit::nginx::Nginx;
use oscontent_testkit::oci::crafted;
use oscontent_testkit::registry::{base64, write_authfile, Registry};
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const USER: &str = "site-user";
const SECRET: &str = "s3cret-upstream-pw";
/// Refused by nginx: its failures are logged, and must not show it either.
const WRONG: &str = "wr0ng-upstream-pw";
const REGISTRY_SECRET: &str = "s3cret-registry-pw";
const MIRROR_TIMEOUT: Duration = Duration::from_secs(120);

/// What must appear nowhere: each password, and each `user:password`
/// in the base64 a basic-auth header or an auth file carries.
fn needles() -> Vec<String> {
    let mut out = Vec::new();
    for pw in [SECRET, WRONG, REGISTRY_SECRET] {
        out.push(pw.to_owned());
        for user in [USER, "reg-user"] {
            out.push(base64(format!("{user}:{pw}").as_bytes()));
        }
    }
    out
}

/// The needles `text` contains.
fn found(text: &str) -> Vec<String> {
    needles().into_iter().filter(|n| text.contains(n)).collect()
}

/// Every regular file under `dir` holding a needle, with which.
fn files_with_secrets(dir: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    // Bounded: the state dirs here hold a few thousand entries.
    for _ in 0..100_000 {
        let Some(d) = todo.pop() else { break };
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                let text = String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned();
                let hit = found(&text);
                if !hit.is_empty() {
                    out.push((e.path(), hit));
                }
            }
        }
    }
    assert!(out.len() < 100_000);
    out
}

/// Everything `server` wrote: its stderr, its access log, its state dir.
fn assert_nothing_leaked(what: &str, server: &Server, exposes: &[&Path]) {
    let stderr = server.stderr();
    assert!(
        stderr.lines().count() > 3,
        "{what}: logged nothing?\n{stderr}"
    );
    let leaked: Vec<&str> = stderr.lines().filter(|l| !found(l).is_empty()).collect();
    assert!(
        leaked.is_empty(),
        "{what}: logged a credential: {leaked:#?}"
    );
    let log = std::fs::read_to_string(&server.access_log).unwrap();
    assert!(!log.is_empty(), "{what}: no access log");
    assert!(found(&log).is_empty(), "{what}: in the access log");
    for dir in [&server.state_dir as &Path]
        .into_iter()
        .chain(exposes.iter().copied())
    {
        let files = files_with_secrets(dir);
        assert!(files.is_empty(), "{what}: written to {files:#?}");
    }
}

/// nginx serving `root` only to `USER:SECRET`.
fn guarded(root: &Path, dir: &Path) -> Nginx {
    std::fs::create_dir_all(dir).unwrap();
    let line = check_output(
        local_only(&mut std::process::Command::new("htpasswd")).args(["-bn", USER, SECRET]),
        Duration::from_secs(30),
    )
    .unwrap();
    std::fs::write(dir.join("htpasswd"), line.trim()).unwrap();
    let conf = format!(
        "server {{ listen 127.0.0.1:PORT; root {}; \
         auth_basic \"upstream\"; auth_basic_user_file PREFIX/htpasswd; }}",
        root.display()
    );
    Nginx::start(dir, &conf).unwrap()
}

/// `http://USER:PASSWORD@HOST:PORT/`.
fn with_userinfo(url: &str, password: &str) -> String {
    url.replacen("http://", &format!("http://{USER}:{password}@"), 1)
}

#[test]
fn upstream_and_registry_credentials_reach_no_log_and_no_file() {
    let p = pristine();
    let sentinel = Sentinel::new();
    let (_copy, repo) = fresh_copy(&p.repo);
    let u = Upstream {
        p,
        repo,
        sentinel: &sentinel,
    };
    u.point(1);
    let work = tempdir();
    let nginx = guarded(&u.repo, &work.path().join("nginx"));

    // Refused credentials: every attempt fails and is logged, URL and all.
    let mut refused = Server::upstream(&with_userinfo(&nginx.url, WRONG))
        .args(["--max-backoff", "1"])
        .env("RUST_LOG", "debug")
        .spawn()
        .unwrap();
    let says = refused
        .wait_stderr_lines("HTTP 401", 2, REFUSAL_TIMEOUT)
        .unwrap();
    assert!(
        says.iter()
            .any(|l| l.contains(&format!("GET {}/", nginx.url))),
        "the failure names the upstream, without its userinfo: {says:?}"
    );
    assert_eq!(refused.get("/readyz").unwrap().status, 503);
    refused.stop(REFUSAL_TIMEOUT).unwrap();
    assert_nothing_leaked("refused upstream", &refused, &[]);

    // The right ones, JSON logs: published, then a refresh.
    let mut server = Server::upstream(&with_userinfo(&nginx.url, SECRET))
        .env("RUST_LOG", "debug")
        .env("OSCONTENT_LOG_FORMAT", "json")
        .state_dir(&sentinel.state())
        .start()
        .unwrap();
    serves_only(&server, &[(REF, &p.commits[1])]).unwrap();
    u.point(2);
    server.sighup().unwrap();
    let moved = poll(REFUSAL_TIMEOUT, || -> anyhow::Result<Option<()>> {
        let refs = served_refs(&server).map_err(anyhow::Error::msg)?;
        Ok((refs == [(REF.to_owned(), p.commits[2].clone())]).then_some(()))
    })
    .unwrap();
    assert!(moved.is_some(), "{}", server.stderr());
    stock_pull(&server, REF, &p.commits[2]).unwrap();
    server.stop(REFUSAL_TIMEOUT).unwrap();
    assert_nothing_leaked("upstream", &server, &[]);

    // `mirror` into a bundle: its report, its log and the bundle.
    let bundle = work.path().join("bundle");
    let (out, err) = mirror_to_bundle(&with_userinfo(&nginx.url, SECRET), &bundle, MIRROR_TIMEOUT);
    assert!(out.status.success(), "mirror failed: {err}");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        found(&report).is_empty() && found(&err).is_empty(),
        "{report}\n{err}"
    );
    assert!(
        report.contains("***@127.0.0.1"),
        "the source is shown, masked: {report}"
    );
    let files = files_with_secrets(&bundle);
    assert!(
        files.is_empty(),
        "the bundle holds a credential: {files:#?}"
    );

    // A registry behind basic auth, the password from --authfile.
    let reg = Registry::with_auth("reg-user", REGISTRY_SECRET);
    let c = crafted(1, |t| t);
    reg.push(&c.layout, &c.tag, "os:1", &[]);
    let auth = work.path().join("auth.json");
    write_authfile(&auth, &reg.host(), "reg-user", REGISTRY_SECRET);
    let mut image = Server::images([reg.image("os:1")])
        .args(["--insecure-registry", &reg.host(), "--authfile"])
        .arg(&auth)
        .env("RUST_LOG", "debug")
        .start()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(
            &image
                .get(&format!("/refs/heads/{}", TINY_REF))
                .unwrap()
                .body
        )
        .trim(),
        c.commit
    );
    image.stop(REFUSAL_TIMEOUT).unwrap();
    assert_nothing_leaked("registry", &image, &[]);
    drop(nginx);
}
