//! The server's life around a fetch: refused flag combinations, a kill in
//! the middle of a stream and the restart after it, a SIGTERM while a
//! transfer is stalled.

use crate::support::*;
use oscontent_testkit::*;
use std::path::Path;
use std::time::{Duration, Instant};

#[test]
fn commit_and_ref_with_image_are_refused() {
    let v1 = v1();
    let image = "docker://127.0.0.1:1/os:v1";
    for extra in [
        vec!["--commit", v1.commit.as_str()],
        vec!["--ref", "fedora/x86_64/coreos/stable"],
    ] {
        let r = Server::images([image])
            .args(&extra)
            .start_expect_failure()
            .unwrap_or_else(|e| panic!("{e:#}"));
        let err = r.error();
        assert!(
            err.contains(extra[0]) && err.contains("image"),
            "{extra:?}: the refusal names the flag and the image source: {err}\nstderr:\n{}",
            r.stderr
        );
    }
    // An image and a local source at once; a reference of no known kind.
    let tmp = tempdir();
    let r = Server::images([image])
        .arg("--oscontainer")
        .arg(tmp.path())
        .start_expect_failure()
        .unwrap();
    assert!(r.stderr.contains("--oscontainer"), "{}", r.stderr);
    let r = Server::images(["ftp://127.0.0.1/os:v1"])
        .start_expect_failure()
        .unwrap();
    assert!(r.stderr.contains("ftp://127.0.0.1/os:v1"), "{}", r.stderr);
}

/// A staging dir with files in it (the stream has written something).
fn staging_with_content(state: &std::path::Path) -> Option<String> {
    staging_dirs(state).into_iter().find(|d| {
        let objects = state.join("images").join(d).join("srv/repo/objects");
        std::fs::read_dir(objects).is_ok_and(|mut rd| rd.next().is_some())
    })
}

#[test]
fn a_restart_after_a_killed_stream_leaves_no_staging_leftovers() {
    let v1 = v1();
    let reg = Registry::start();
    reg.push_release(v1, "os:v1", &[]);
    // The layer (27 MB) stalls after 8 MiB.
    let proxy = Proxy::builder(&format!("http://{}", reg.host()))
        .stall_after(8 << 20)
        .start()
        .unwrap();
    let image = format!("docker://{}/os:v1", proxy.host());
    let work = tempdir();
    let state = work.path().join("state");
    let builder = Server::images([&image])
        .args(["--insecure-registry", &proxy.host(), "--max-backoff", "1"])
        .state_dir(&state);

    let mut first = builder.clone().spawn().unwrap();
    let partial = wait_for(Duration::from_secs(60), Duration::from_millis(10), || {
        if proxy.stalled() {
            staging_with_content(&state)
        } else {
            None
        }
    })
    .unwrap_or_else(|| {
        panic!(
            "no partial staging dir while the stream stalled.\nstderr:\n{}",
            first.stderr()
        )
    });
    assert_eq!(first.get("/readyz").unwrap().status, 503);
    first.sigkill().unwrap();
    let left = staging_dirs(&state);
    assert!(
        left.contains(&partial),
        "the killed server left its staging dir {partial} ({left:?})"
    );

    // Start again on the same state dir: the leftovers go before it listens.
    proxy.unthrottle();
    let mut second = builder.spawn().unwrap();
    let now = names(&state.join("images"));
    assert!(
        !now.contains(&partial),
        "the leftover {partial} is still there once the server runs: {now:?}"
    );
    second
        .wait_ready(START_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let now = names(&state.join("images"));
    assert_eq!(now.len(), 1, "only the new image: {now:?}");
    assert!(now.iter().all(|n| n.starts_with("image-")), "{now:?}");
    assert!(second.stderr().contains("leftover"), "{}", second.stderr());
    pull_and_fsck(&second, fixture_ref(), &v1.commit);
}

/// Bytes of regular files under `dir` (bounded walk).
fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    let mut budget = 200_000;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            budget -= 1;
            if budget == 0 {
                return total;
            }
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.len();
            }
        }
    }
    total
}

#[test]
fn sigterm_during_a_stalled_stream_exits_promptly_without_leftovers() {
    let v1 = v1();
    let reg = Registry::start();
    reg.push_release(v1, "os:v1", &[]);
    let proxy = Proxy::builder(&format!("http://{}", reg.host()))
        .stall_after(8 << 20)
        .start()
        .unwrap();
    let image = format!("docker://{}/os:v1", proxy.host());
    let work = tempdir();
    let state = work.path().join("state");
    let builder = Server::images([&image])
        .args(["--insecure-registry", &proxy.host(), "--max-backoff", "1"])
        .args(["--shutdown-timeout", "5"])
        .state_dir(&state);
    let mut server = builder.clone().spawn().unwrap();
    // Stalled for real: the server has written everything the proxy let
    // through and is blocked reading (its read timeout is 60 s).
    let staging = wait_for(Duration::from_secs(60), Duration::from_millis(10), || {
        if proxy.stalled() {
            staging_with_content(&state)
        } else {
            None
        }
    })
    .unwrap_or_else(|| panic!("the stream did not stall.\nstderr:\n{}", server.stderr()));
    let dir = state.join("images").join(&staging);
    let mut last = (tree_bytes(&dir), Instant::now());
    wait_for(Duration::from_secs(40), Duration::from_millis(100), || {
        let now = tree_bytes(&dir);
        if now != last.0 {
            last = (now, Instant::now());
        }
        (last.1.elapsed() >= Duration::from_millis(1500)).then_some(())
    })
    .unwrap_or_else(|| panic!("the staging dir kept growing while the stream stalled"));

    let t = Instant::now();
    server.sigterm().unwrap();
    let status = server.wait_exit(Duration::from_secs(12)).unwrap();
    let took = t.elapsed();
    let stderr = server.stderr();
    if status.is_none() {
        let _ = server.sigkill();
    }
    assert!(
        status.is_some(),
        "still running {took:?} after SIGTERM with --shutdown-timeout 5: a fetch blocked on a stalled \
         registry read holds up the exit (until the 60 s read timeout).\nstderr:\n{stderr}"
    );
    // Either it removed its staging dir on the way out, or the next start
    // on the same state dir does before it listens.
    if !staging_dirs(&state).is_empty() {
        proxy.unthrottle();
        let _next = builder.spawn().unwrap();
        let left = staging_dirs(&state);
        assert!(
            !left.contains(&staging),
            "{staging} left by the SIGTERMed server survives a restart: {left:?}"
        );
    }
}
