//! The command line as a script sees it: usage errors exit 1 (not clap's
//! 2, which means a network failure here), as an `error` event too under
//! `--json`; and a `--url` pull moves `refs/heads/REF`, never judging it by
//! a remote's ref of the same name.

use super::support::*;
use oscontent_testkit::*;

/// Nothing listens here: a connection fails with 2.
const URL: &str = "http://127.0.0.1:9";

#[test]
fn usage_errors_exit_1_and_say_what_was_wrong() {
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    let r = repo.repo.display().to_string();
    // `pull --repo R` and then these (nothing listens at URL: only a usage
    // error can end these runs before a connection is tried).
    #[rustfmt::skip]
    let pulls: [(&[&str], &str); 10] = [
        (&["--url", URL, "--ref", "a", "--bogus"], "--bogus"),
        (&["--url", URL, "--commit", "zz"], "--commit"),
        (&["--url", URL, "--ref", "a", "--io-mode", "fast"], "fast"),
        (&["--url", URL, "--ref", "a", "--timeout", "0"], "--timeout"),
        (&["--url", URL, "--remote", "os", "--ref", "a"], "--remote"),
        (&["--ref", "a"], "--url"),
        (&["--url", "notaurl", "--ref", "a"], "must start with http"),
        (&["--url", "mirrorlist=http://h/l", "--ref", "a"], "mirrorlists are not supported"),
        (&["--url", URL, "--ref", "a", "--concurrency", "0"], "--concurrency"),
        (&["--url", URL, "--ref", "a", "--concurrency", "65"], "--concurrency must be 1 to 64"),
    ];
    // (args, what the message must contain)
    let mut cases: Vec<(Vec<&str>, &str)> = pulls
        .iter()
        .map(|(rest, says)| ([&["pull", "--repo", r.as_str()][..], rest].concat(), *says))
        .collect();
    cases.push((
        vec!["ls-remote", "--url", "notaurl"],
        "must start with http",
    ));
    cases.push((vec!["verify", "--url", URL], "--ref"));
    for (args, says) in cases {
        for json in [false, true] {
            let mut args = args.clone();
            if json {
                args.push("--json");
            }
            let what = args.join(" ");
            let out = run_client(&args);
            expect_code(&out, 1, &what);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains(says), "{what}: {stderr}");
            if json {
                let evs = events(&out);
                let e = event(&evs, "error");
                assert_eq!(e["kind"], "usage", "{what}: {e}");
                assert_eq!(e["exit_code"], 1, "{what}: {e}");
                assert!(e["message"].as_str().unwrap().contains(says), "{what}: {e}");
            } else {
                assert!(out.stdout.is_empty(), "{what}: stdout {:?}", out.stdout);
            }
        }
    }
    // Help is not an error.
    for args in [vec!["--help"], vec!["pull", "--help"], vec!["--version"]] {
        expect_code(&run_client(&args), 0, &args.join(" "));
    }
    // And a failed connection is the network's: 2, for ls-remote too.
    let out = run_client(&["ls-remote", "--url", URL, "--json"]);
    expect_code(&out, 2, "ls-remote, nothing listening");
    assert_eq!(event(&events(&out), "error")["kind"], "network");
}

#[test]
fn a_url_pull_moves_the_local_ref_whatever_a_remote_ref_says() {
    let tmp = tempdir();
    let served = tmp.path().join("served");
    let old = tiny_commit(&served, "1", Some(TINY_REF), 11).unwrap();
    let server = Server::repo(&served).start().unwrap();
    let node = Ostree::init(&tmp.path().join("node"), "bare-user").unwrap();
    node.remote_add("os", &server.url, &["--no-gpg-verify"])
        .unwrap();
    let remote_pull = [
        "pull",
        "--repo",
        &node.repo.display().to_string(),
        "--remote",
        "os",
        "--ref",
        TINY_REF,
        "--json",
    ];
    expect_ok(&run_client(&remote_pull), "pull --remote");
    assert_eq!(
        ref_target(&node, &format!("os:{TINY_REF}")),
        Some(old.clone())
    );
    assert_eq!(
        ref_target(&node, TINY_REF),
        Some(old.clone()),
        "rev-parse falls back"
    );

    // os:REF is at the target, refs/heads/REF does not exist: the pull
    // must create it, from nothing.
    let out = run_client(&pull_args(&node.repo, &server.url, TINY_REF, &[]));
    let evs = expect_ok(&out, "pull --url");
    let moved = event(&evs, "ref-moved");
    assert_eq!(moved["ref"], TINY_REF, "{moved}");
    assert!(moved["from"].is_null(), "{moved}");
    let heads = node.repo.join("refs/heads").join(TINY_REF);
    let at = std::fs::read_to_string(&heads).unwrap_or_else(|e| panic!("{}: {e}", heads.display()));
    assert_eq!(at.trim(), old);

    // A newer commit for the remote's ref only: the local ref is judged by
    // itself (a move from `old`), and the remote's ref is left alone.
    let newer = tmp.path().join("newer");
    let new = tiny_commit(&newer, "2", Some(TINY_REF), 12).unwrap();
    let server = Server::repo(&newer).start().unwrap();
    let out = run_client(&pull_args(&node.repo, &server.url, TINY_REF, &[]));
    let evs = expect_ok(&out, "pull --url of a newer commit");
    let moved = event(&evs, "ref-moved");
    assert_eq!(moved["from"], old.as_str(), "{moved}");
    assert_eq!(moved["to"], new.as_str(), "{moved}");
    assert_eq!(ref_target(&node, &format!("os:{TINY_REF}")), Some(old));
}

/// An https:// remote (here nginx terminating TLS in front of the server,
/// with a throwaway CA the client trusts through `SSL_CERT_FILE`, as
/// through the system store on a node): pulled over TLS; and one whose
/// certificate the client does not trust is refused.
#[test]
fn an_https_remote_is_pulled_over_tls() {
    use oscontent_testkit::nginx::Nginx;
    use oscontent_testkit::registry::Pki;
    let tmp = tempdir();
    let served = tmp.path().join("served");
    let commit = tiny_commit(&served, "1", Some(TINY_REF), 21).unwrap();
    let server = Server::repo(&served).start().unwrap();
    let pki = Pki::generate(&tmp.path().join("pki")).unwrap();
    let conf = format!(
        "server {{\n listen 127.0.0.1:PORT ssl;\n ssl_certificate {};\n ssl_certificate_key {};\n \
         location / {{ proxy_pass http://{}; }}\n}}\n",
        pki.cert.display(),
        pki.key.display(),
        server.addr
    );
    let nginx = Nginx::start(&tmp.path().join("nginx"), &conf).unwrap();
    let url = format!("https://127.0.0.1:{}", nginx.addr.port());
    let node = Ostree::init(&tmp.path().join("node"), "bare-user").unwrap();
    let args = pull_args(&node.repo, &url, TINY_REF, &[]);

    let untrusted = run_bounded(
        client(&args).env("SSL_CERT_FILE", tmp.path().join("none.crt")),
        CLIENT_TIMEOUT,
    )
    .unwrap();
    expect_code(&untrusted, 2, "an untrusted certificate");
    assert_eq!(ref_target(&node, TINY_REF), None);

    let out = run_bounded(client(&args).env("SSL_CERT_FILE", &pki.ca), CLIENT_TIMEOUT).unwrap();
    let evs = expect_ok(&out, "pull over TLS");
    assert_eq!(event(&evs, "start")["protocol"], "HTTP/1.1");
    assert_eq!(ref_target(&node, TINY_REF), Some(commit));
    node.fsck().unwrap();
}
