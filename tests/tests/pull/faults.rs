//! Retries: injected 503s and connections reset mid-body, through a
//! proxy that speaks only HTTP/1.1 (so the HTTP/2 attempt falls back).

use super::support::*;
use oscontent_testkit::proxy::{FaultStats, Faults, Proxy};
use oscontent_testkit::*;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A pull of the fixture ref into a new bare-user repo at `dir`, through
/// an HTTP/1.1 proxy in front of `server` injecting `faults`: the client's
/// output, the proxy, the fault counters and the repo.
fn pull_through(
    server: &Server,
    dir: &Path,
    faults: Faults,
    extra: &[&str],
) -> (Output, Proxy, Arc<FaultStats>, Ostree) {
    let (proxy, stats) = faults.start(&server.url).unwrap();
    let repo = Ostree::init(dir, "bare-user").unwrap();
    let out = run_client(&pull_args(&repo.repo, &proxy.url, fixture_ref(), extra));
    (out, proxy, stats, repo)
}

#[test]
fn retries_past_503s_and_resets_then_completes() {
    let v1 = v1();
    let tmp = tempdir();
    let server = Server::release(v1);
    let faults = Faults {
        fail_first: 3,
        fail_path_every: 200,
        fail_each: 2,
        reset_every: 97,
        ..Default::default()
    };
    let (out, proxy, faults, repo) = pull_through(
        &server,
        &tmp.path().join("repo"),
        faults,
        &["--concurrency", "4"],
    );
    let evs = expect_ok(&out, "pull through faults");

    assert!(proxy.h2_prefaces() >= 1, "no HTTP/2 attempt");
    assert_eq!(event(&evs, "start")["protocol"], "HTTP/1.1");
    let injected = faults.injected_503.load(Ordering::SeqCst);
    // 3 at the start, then 2 for each of the ~14 chosen paths.
    assert!(injected >= 3 + 2 * 10, "only {injected} 503s injected");
    let resets = proxy.cuts();
    assert!(resets >= 10, "only {resets} resets injected");
    let retries: Vec<_> = evs.iter().filter(|e| e["event"] == "retry").collect();
    assert_eq!(
        retries.len(),
        injected + resets,
        "one retry per injected fault"
    );
    assert!(retries
        .iter()
        .any(|e| e["error"].as_str().unwrap().contains("503")));
    assert_eq!(
        event(&evs, "done")["retries"].as_u64().unwrap() as usize,
        retries.len()
    );
    assert_eq!(repo.rev_parse(fixture_ref()).unwrap(), v1.commit);
    repo.fsck().unwrap();
    // What reached the server: every object, and nothing twice except the
    // ones whose responses were cut.
    let log = server.access_log().unwrap();
    let objects = log
        .iter()
        .filter(|e| e.object().is_some() && e.kind != "commitmeta")
        .count();
    let unique = fetched_objects(&log).len();
    assert_eq!(objects, unique + resets, "unexpected refetches");
}

/// A server that keeps failing gets five attempts, then exit 2: also when
/// it says `Retry-After: 0` (no request to wait, so no fast loop), and when
/// the header comes on a status that does not mean "later" (500).
#[test]
fn gives_up_with_exit_2_when_the_server_keeps_failing() {
    let v1 = v1();
    let tmp = tempdir();
    let server = Server::release(v1);
    // (status, Retry-After)
    let table: [(u16, Option<&str>); 3] = [(503, None), (503, Some("0")), (500, Some("1"))];
    for (i, (status, after)) in table.into_iter().enumerate() {
        let faults = Faults {
            fail_first: usize::MAX,
            status,
            retry_after: after.map(str::to_owned),
            ..Default::default()
        };
        let dir = tmp.path().join(format!("repo-{i}"));
        let (out, _proxy, faults, repo) = pull_through(&server, &dir, faults, &[]);
        let case = format!("{status} Retry-After {after:?}");
        expect_code(&out, 2, &case);
        let evs = events(&out);
        let err = event(&evs, "error");
        assert_eq!(err["kind"], "network", "{case}");
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains(&status.to_string()),
            "{case}: {err}"
        );
        // Bounded attempts: the commit object was tried MAX_ATTEMPTS times.
        assert_eq!(faults.matched.load(Ordering::SeqCst), 5, "{case}");
        assert!(repo.refs().unwrap().is_empty());
        repo.fsck().unwrap();
    }
}

/// A server that says when to come back is waited for, at least as long as
/// it asks, and its answers do not use up the five attempts a failing
/// server gets: seven `Retry-After: 1` answers in a row still end in a
/// complete pull.
#[test]
fn waits_as_long_as_retry_after_asks_without_using_up_attempts() {
    let v1 = v1();
    let tmp = tempdir();
    let server = Server::release(v1);
    let faults = Faults {
        fail_first: 7,
        retry_after: Some("1".into()),
        ..Default::default()
    };
    let (out, _proxy, faults, repo) = pull_through(&server, &tmp.path().join("repo"), faults, &[]);
    let evs = expect_ok(&out, "pull past Retry-After");

    assert_eq!(faults.injected_503.load(Ordering::SeqCst), 7);
    let retries: Vec<_> = evs.iter().filter(|e| e["event"] == "retry").collect();
    assert_eq!(retries.len(), 7, "{retries:?}");
    for r in &retries {
        let ms = r["delay_ms"].as_u64().unwrap();
        // At least what was asked, at most half as much again.
        assert!((1000..=1500).contains(&ms), "{r}");
    }
    assert_eq!(repo.rev_parse(fixture_ref()).unwrap(), v1.commit);
    repo.fsck().unwrap();
}

/// A `Retry-After` longer than the client waits fails the request at once,
/// and the message says what the server asked for.
#[test]
fn a_retry_after_past_the_limit_fails_at_once_and_says_so() {
    let v1 = v1();
    let tmp = tempdir();
    let server = Server::release(v1);
    let table = [
        ("3600", "retry after 3600 s"),
        // An HTTP-date decades ahead.
        (
            "Fri, 01 Jan 2100 00:00:00 GMT",
            "more than the 60 s waited at most",
        ),
    ];
    for (after, says) in table {
        let faults = Faults {
            fail_first: usize::MAX,
            retry_after: Some(after.into()),
            ..Default::default()
        };
        let dir = tmp.path().join(format!("repo-{}", after.len()));
        let (out, _proxy, faults, repo) = pull_through(&server, &dir, faults, &[]);
        expect_code(&out, 2, after);
        let evs = events(&out);
        let err = event(&evs, "error");
        assert_eq!(err["kind"], "network", "{after}");
        let msg = err["message"].as_str().unwrap();
        assert!(
            msg.contains("HTTP 503") && msg.contains(says),
            "{after}: {msg}"
        );
        assert_eq!(faults.matched.load(Ordering::SeqCst), 1, "{after}: retried");
        assert!(repo.refs().unwrap().is_empty());
    }
}

/// A server that is not ready yet (503 and `Retry-After`, as
/// oscontent-server answers before its first publication) is waited for
/// until `--timeout`, and the error then says what was being waited on.
#[test]
fn a_timeout_while_told_to_come_back_later_says_so() {
    let v1 = v1();
    let tmp = tempdir();
    let server = Server::release(v1);
    let faults = Faults {
        prefix: "/config".into(),
        fail_first: usize::MAX,
        retry_after: Some("5".into()),
        ..Default::default()
    };
    let (out, _proxy, faults, repo) = pull_through(
        &server,
        &tmp.path().join("repo"),
        faults,
        &["--timeout", "3s"],
    );
    expect_code(&out, 2, "timeout while unready");
    let evs = events(&out);
    let msg = event(&evs, "error")["message"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("did not finish within --timeout 3s (last retried: config: HTTP 503)"),
        "{msg}"
    );
    // Waited as asked: one 503, then the deadline struck during the wait.
    assert_eq!(faults.injected_503.load(Ordering::SeqCst), 1);
    assert!(repo.refs().unwrap().is_empty());
}
