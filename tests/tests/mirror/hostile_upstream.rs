//! A hostile upstream whose summary names a collection `../../…`: neither
//! `serve --upstream` nor `mirror URL bundle:DIR` may create anything
//! outside its own directory, and both say which ID they refused. The
//! upstream is a stock `ostree` repo served by the testkit proxy on
//! loopback, with only the summary forged.

use crate::support::TOOL_TIMEOUT;
use std::time::Duration;

/// The refusal comes with the first refresh, within seconds.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(60);
use oscontent_format::{build_summary, parse_summary};
use oscontent_testkit::proxy::{only, Action, Proxy};
use oscontent_testkit::*;
use std::path::Path;
use std::process::Command;

/// Every path under `root`, except those under `skip` (bounded: the tree
/// is the test's own).
fn files_outside(root: &Path, skip: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.starts_with(skip) {
                continue;
            }
            out.push(p.display().to_string());
            if p.is_dir() && out.len() < 1000 {
                stack.push(p);
            }
        }
    }
    out
}

#[test]
fn hostile_collection_id_writes_nothing_outside_the_state_dir() {
    require_ostree();
    let t = tempdir();
    let upstream = t.path().join("upstream");
    let commit = tiny_commit(&upstream, "1.0", None, 7).unwrap();
    let repo = Ostree::at(&upstream);
    repo.run(["refs", "--create=os/stable", &commit]).unwrap();
    repo.run(["summary", "-u"]).unwrap();
    // Enough `..` to climb out of any state layout: the key lands in
    // `<tempdir>/escaped` if it is ever joined onto a path.
    let escaped = t.path().join("escaped");
    let hostile = format!(
        "{}{}",
        "../".repeat(32),
        escaped.strip_prefix("/").unwrap().display()
    );
    let mut s = parse_summary(&std::fs::read(upstream.join("summary")).unwrap()).unwrap();
    s.collection_map.insert(hostile.clone(), s.refs.clone());
    let forged = build_summary(&s).unwrap();
    let proxy =
        Proxy::serve_dir(&upstream, only("/summary", Action::Bytes(forged.into()))).unwrap();

    let work = t.path().join("work");
    let state = work.join("state");
    let server = ServerProcess::spawn(
        Command::new(server_bin())
            .env("NO_COLOR", "1")
            .args(["serve", "--listen", "127.0.0.1:0", "--upstream", &proxy.url])
            .arg("--state-dir")
            .arg(&state),
        TOOL_TIMEOUT,
    )
    .unwrap();
    let want = format!(
        "invalid collection ID {:?}",
        hostile.chars().take(80).collect::<String>()
    );
    server
        .wait_stderr(&[&want], REFUSAL_TIMEOUT)
        .unwrap_or_else(|e| panic!("serve --upstream: {e:#}\n{}", server.stderr()));
    let ready = fetch(&http1(), &format!("{}/readyz", server.url), &[]).unwrap();
    assert_eq!(
        ready.status, 503,
        "nothing published from a hostile summary"
    );
    drop(server);

    let bundle = work.join("bundle");
    let (o, err) = mirror_to_bundle(&proxy.url, &bundle, TOOL_TIMEOUT);
    assert!(!o.status.success(), "mirror of a hostile summary succeeded");
    assert!(err.contains(&want), "mirror's refusal: {err}");

    assert!(!escaped.exists(), "{} was created", escaped.display());
    let outside = files_outside(t.path(), &work);
    let expected = [upstream.display().to_string()];
    let stray: Vec<_> = outside
        .iter()
        .filter(|p| !p.starts_with(&expected[0]))
        .collect();
    assert!(stray.is_empty(), "written outside the work dir: {stray:?}");
}
