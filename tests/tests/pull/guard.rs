//! The node client trusts nothing from outside:
//! a hidden or empty signed artifact is a verification failure, never a
//! reason to skip verification; a slow-drip server is cut off by the
//! pull's deadline; redirects stay within the origin; collection bindings
//! are checked as stock ostree checks them; a dirtree is read no further
//! than its declared size; credentials in the URL are never shown.
//! Each against [`Proxy::serve_dir`], a server that lies about one thing.

use super::support::*;
use super::support::{serve_lying, serve_lying_about};
use oscontent_format::build_gpgsigs;
use oscontent_format::openpgp::{self, KeyAlgo};
use oscontent_testkit::proxy::{self, Action};
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

pub const REF: &str = "guard/stable";

/// An archive repo with one commit at `REF` (and its summary).
pub struct Src {
    pub repo: PathBuf,
    pub commit: String,
}

/// Commits `files` (path, bytes) into a new archive repo under `dir`, with
/// `extra` arguments for `ostree commit`, and updates its summary.
pub fn source(dir: &Path, files: &[(&str, Vec<u8>)], extra: &[&str]) -> Src {
    let repo = dir.join("src");
    let r = Ostree::init(&repo, "archive").unwrap();
    let tree = dir.join("tree");
    for (p, bytes) in files {
        let f = tree.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, bytes).unwrap();
    }
    let mut args = vec![
        "commit".to_owned(),
        "--no-xattrs".into(),
        format!("--branch={REF}"),
        format!("--tree=dir={}", tree.display()),
        "--add-metadata-string=version=1.0".into(),
        "--subject=guard".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let commit = r.run(&args).unwrap().trim().to_owned();
    r.run(["summary", "-u"]).unwrap();
    Src { repo, commit }
}

/// A small tree: a script and a text file.
pub fn small_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("usr/bin/hello", b"#!/bin/sh\necho hello\n".to_vec()),
        (
            "usr/share/doc/README",
            (0..500)
                .flat_map(|i| format!("line {i}\n").into_bytes())
                .collect(),
        ),
    ]
}

/// stderr and stdout, for messages and leak checks.
pub fn said(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    )
}

/// Asserts the exit code and that the output says `needle`.
pub fn expect_refusal(out: &Output, code: i32, needle: &str, what: &str) {
    expect_code(out, code, what);
    let text = said(out);
    assert!(text.contains(needle), "{what}: want {needle:?} in:\n{text}");
}

/// The commit and the summary signed with a fresh key; returns the path
/// of its public key.
pub fn sign(dir: &Path, src: &Src) -> PathBuf {
    let (tsk, public) =
        openpgp::generate_key("guard <guard@example.com>", KeyAlgo::Ed25519).unwrap();
    let key = dir.join("good.asc");
    std::fs::write(&key, public).unwrap();
    let tsk = openpgp::load_tsk(tsk.as_bytes()).unwrap();
    let commit = std::fs::read(object_path(&src.repo, &src.commit, "commit")).unwrap();
    let sig = openpgp::sign_detached(&tsk, &commit).unwrap();
    let meta = object_path(&src.repo, &src.commit, "commitmeta");
    std::fs::write(meta, build_gpgsigs(&[sig]).unwrap()).unwrap();
    let summary = std::fs::read(src.repo.join("summary")).unwrap();
    let sig = openpgp::sign_detached(&tsk, &summary).unwrap();
    std::fs::write(src.repo.join("summary.sig"), build_gpgsigs(&[sig]).unwrap()).unwrap();
    key
}

/// `pull --remote origin --ref REF --json` into `node`.
fn pull_remote(node: &Ostree) -> Output {
    run_client(&[
        "pull",
        "--repo",
        node.repo.to_str().unwrap(),
        "--remote",
        "origin",
        "--ref",
        REF,
        "--json",
    ])
}

/// Item 8: with summary or commit verification on, every way of hiding
/// or emptying a signed artifact fails verification (exit 3), and the
/// ref stays absent; stock ostree refuses the same way ("GPG verification
/// enabled, but no summary found").
#[test]
fn hidden_signed_artifacts_fail_verification() {
    let t = tempdir();
    let src = source(t.path(), &small_files(), &[]);
    let key = sign(t.path(), &src);
    let meta = obj_path(&src.commit, "commitmeta");
    let empty = || Action::Bytes(bytes::Bytes::new());
    // (what, path, lie, gpg-verify, gpg-verify-summary, exit, message)
    type Case<'a> = (&'a str, &'a str, Option<Action>, bool, bool, i32, &'a str);
    let e404 = || Some(Action::Status(404));
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("genuine", "/", None, true, true, 0, ""),
        ("summary 404, summary verification", "/summary", e404(), false, true, 3, "no summary found"),
        ("summary 404, both", "/summary", e404(), true, true, 3, "no summary found"),
        ("summary empty", "/summary", Some(empty()), false, true, 3, "summary"),
        ("summary 304", "/summary", Some(Action::Status(304)), false, true, 2, "HTTP 304"),
        ("summary.sig 404", "/summary.sig", e404(), false, true, 3, "not signed"),
        ("summary.sig empty", "/summary.sig", Some(empty()), false, true, 3, "summary signature"),
        ("commitmeta 404", &meta, e404(), true, false, 3, "no detached metadata"),
        ("commitmeta empty", &meta, Some(empty()), true, false, 3, "signature of commit"),
        ("commitmeta 404, both", &meta, e404(), true, true, 3, "no detached metadata"),
    ];
    for (i, (what, path, lie, gpg, gpg_summary, code, needle)) in cases.into_iter().enumerate() {
        let liar = match lie {
            Some(l) => serve_lying_about(&src.repo, path, l),
            None => serve_lying(&src.repo, Arc::new(|_: &str| None)),
        };
        let node = Ostree::init(&t.path().join(format!("node{i}")), "bare-user").unwrap();
        node.run([
            "remote".to_owned(),
            "add".into(),
            format!("--set=gpg-verify={gpg}"),
            format!("--set=gpg-verify-summary={gpg_summary}"),
            format!("--set=gpgkeypath={}", key.display()),
            "origin".into(),
            liar.url.clone(),
        ])
        .unwrap();
        let out = pull_remote(&node);
        let at = ref_target(&node, &format!("origin:{REF}"));
        if code == 0 {
            expect_ok(&out, what);
            assert_eq!(at.as_deref(), Some(src.commit.as_str()), "{what}");
            continue;
        }
        expect_refusal(&out, code, needle, what);
        assert_eq!(at, None, "{what}: the ref moved");
    }
}

/// Item 8 for `verify`: a hidden summary is a verification failure there
/// too (it always requires signatures).
#[test]
fn verify_refuses_a_hidden_summary() {
    let t = tempdir();
    let src = source(t.path(), &small_files(), &[]);
    let key = sign(t.path(), &src);
    let liar = serve_lying_about(&src.repo, "/summary", Action::Status(404));
    let args = |url: &str| {
        vec![
            "verify".to_owned(),
            "--url".into(),
            url.to_owned(),
            "--ref".into(),
            REF.into(),
            "--trusted-keys".into(),
            key.display().to_string(),
            "--json".into(),
        ]
    };
    let out = run_client(&args(&liar.url));
    expect_refusal(&out, 3, "no summary found", "verify, summary hidden");
    let genuine = serve_lying(&src.repo, Arc::new(|_: &str| None));
    expect_ok(&run_client(&args(&genuine.url)), "verify, genuine");
}

/// `/objects/XX/REST.EXT`.
pub fn obj_path(checksum: &str, ext: &str) -> String {
    format!(
        "/{}",
        object_url_path(checksum, ext).trim_start_matches('/')
    )
}

/// Item 10: a server that sends a byte now and then (each within the
/// read timeout) is cut off by `--timeout`, with exit 2 and a message
/// naming it; the ref does not move.
#[test]
fn slow_drip_is_cut_off_by_the_deadline() {
    let t = tempdir();
    let src = source(t.path(), &small_files(), &[]);
    let liar = serve_lying_about(
        &src.repo,
        "/summary",
        Action::Drip {
            len: 100_000,
            every: Duration::from_millis(200),
        },
    );
    let node = Ostree::init(&t.path().join("node"), "bare-user").unwrap();
    let out = run_client(&pull_args(&node.repo, &liar.url, REF, &["--timeout", "3s"]));
    expect_refusal(&out, 2, "did not finish within --timeout 3s", "slow drip");
    assert!(liar.dripped() < 100_000, "the drip ran to its end");
    assert_eq!(ref_target(&node, REF), None);
}

/// Item 10: redirects are followed within the origin only (scheme, host,
/// port), and a bounded number of times.
#[test]
fn redirects_stay_within_the_origin() {
    let t = tempdir();
    let src = source(t.path(), &small_files(), &[]);
    let summary = bytes::Bytes::from(std::fs::read(src.repo.join("summary")).unwrap());
    let elsewhere = serve_lying(&src.repo, Arc::new(|_: &str| None));
    let other_origin = format!("{}/summary", elsewhere.url);
    // (what, rule, exit, message)
    type Case = (&'static str, proxy::Rule, i32, &'static str);
    let cases: Vec<Case> = vec![
        (
            "same origin",
            Arc::new(move |p: &str| match p {
                "/summary" => Some(Action::Redirect("/moved/summary".into())),
                "/moved/summary" => Some(Action::Bytes(summary.clone())),
                _ => None,
            }),
            0,
            "",
        ),
        (
            "another port",
            Arc::new(move |p: &str| {
                (p == "/summary").then(|| Action::Redirect(other_origin.clone()))
            }),
            2,
            "another origin",
        ),
        (
            "a loop",
            Arc::new(|p: &str| (p == "/summary").then(|| Action::Redirect("/summary".into()))),
            2,
            "redirects",
        ),
    ];
    for (i, (what, rule, code, needle)) in cases.into_iter().enumerate() {
        let liar = serve_lying(&src.repo, rule);
        let node = Ostree::init(&t.path().join(format!("node{i}")), "bare-user").unwrap();
        let out = run_client(&pull_args(&node.repo, &liar.url, REF, &[]));
        if code == 0 {
            expect_ok(&out, what);
            continue;
        }
        expect_refusal(&out, code, needle, what);
        assert_eq!(ref_target(&node, REF), None, "{what}");
    }
}

/// Item 10: the collection bindings, as stock ostree checks them
/// (`_ostree_repo_verify_bindings`): from a remote configured with a
/// `collection-id`, a commit needs a ref binding and a collection binding
/// naming that collection; otherwise a binding to another collection is
/// refused. Every case is run by stock `ostree pull` too, and both must
/// agree.
#[test]
fn collection_bindings_match_stock_ostree() {
    const OS: &str = "org.example.Os";
    let t = tempdir();
    let bind_os = format!("--add-metadata-string=ostree.collection-binding={OS}");
    // (what the commit carries, its `ostree commit` arguments)
    let commits: [(&str, Vec<&str>); 3] = [
        ("no bindings", vec!["--no-bindings"]),
        ("a ref binding only", vec![]),
        ("ref and collection bindings", vec![bind_os.as_str()]),
    ];
    // (commit, remote's collection-id, refusal; "" accepted)
    let cases = [
        (0, None, ""),
        (0, Some(OS), "no ref binding"),
        (1, None, ""),
        (1, Some(OS), "no collection binding"),
        (2, None, ""),
        (2, Some(OS), ""),
        (
            2,
            Some("org.example.Other"),
            "bound to collection \"org.example.Os\"",
        ),
    ];
    let liars: Vec<_> = commits
        .iter()
        .enumerate()
        .map(|(i, (_, extra))| {
            let src = source(&t.path().join(format!("src{i}")), &small_files(), extra);
            serve_lying(&src.repo, Arc::new(|_: &str| None))
        })
        .collect();
    for (i, (c, cid, says)) in cases.into_iter().enumerate() {
        let what = format!("{} from a remote of collection {cid:?}", commits[c].0);
        let set = cid.map(|c| format!("--set=collection-id={c}"));
        let extra: Vec<&str> = set.as_deref().into_iter().collect();
        let stock = Ostree::init(&t.path().join(format!("stock{i}")), "bare-user").unwrap();
        stock.remote_add("origin", &liars[c].url, &extra).unwrap();
        let stock_ok = stock.pull(&["origin", REF]).is_ok();
        assert_eq!(stock_ok, says.is_empty(), "stock ostree, {what}");

        let node = Ostree::init(&t.path().join(format!("node{i}")), "bare-user").unwrap();
        node.remote_add("origin", &liars[c].url, &extra).unwrap();
        let out = pull_remote(&node);
        if says.is_empty() {
            expect_ok(&out, &what);
            continue;
        }
        expect_refusal(&out, 3, says, &what);
        assert_eq!(ref_target(&node, &format!("origin:{REF}")), None, "{what}");
    }
}

/// Item 9: a dirtree is read no further than the size the verified
/// commit declares for it (`ostree.sizes`), not up to the 16 MiB cap of
/// its kind: a server announcing megabytes is refused before a byte of
/// the body is read.
#[test]
fn a_dirtree_is_capped_at_its_declared_size() {
    let t = tempdir();
    let src = source(t.path(), &small_files(), &["--generate-sizes"]);
    let commit = std::fs::read(object_path(&src.repo, &src.commit, "commit")).unwrap();
    let root = oscontent_format::Commit::parse(&commit).unwrap().root_tree;
    let declared = std::fs::metadata(object_path(&src.repo, &root.to_hex(), "dirtree"))
        .unwrap()
        .len();
    let liar = serve_lying_about(
        &src.repo,
        &obj_path(&root.to_hex(), "dirtree"),
        Action::Garbage {
            announce: Some(8 << 20),
            cap: 8 << 20,
        },
    );
    let node = Ostree::init(&t.path().join("node"), "bare-user").unwrap();
    node.remote_add("origin", &liar.url, &[]).unwrap();
    let out = pull_remote(&node);
    let text = said(&out);
    // The count is the announced length, so the refusal came from the
    // headers: once the body is read, the error counts the bytes received.
    // What the liar managed to send is no proof either way, since HTTP/2's
    // 2 MiB stream window and socket buffers take bytes nobody reads.
    assert!(
        text.contains(&format!(
            "{} bytes exceeds the {declared} byte limit",
            8 << 20
        )),
        "refused on the announced length, against the declared {declared} bytes:\n{text}"
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        liar.garbage_sent() < 8 << 20,
        "the liar's whole body was taken: {} bytes",
        liar.garbage_sent()
    );
    assert_eq!(ref_target(&node, &format!("origin:{REF}")), None);
}

/// Item 10: credentials in the remote URL never appear in an error, an
/// event or a debug log line, from `pull`, `verify` or `ls-remote`.
#[test]
fn url_credentials_are_never_shown() {
    const SECRET: &str = "s3cretPassw0rd";
    let t = tempdir();
    let src = source(t.path(), &small_files(), &[]);
    let key = sign(t.path(), &src);
    let liar = serve_lying(
        &src.repo,
        Arc::new(|p: &str| p.ends_with(".filez").then_some(Action::Status(404))),
    );
    let hidden = serve_lying_about(&src.repo, "/summary", Action::Status(404));
    let with_creds = |url: &str| url.replace("http://", &format!("http://node:{SECRET}@"));
    let node = Ostree::init(&t.path().join("node"), "bare-user").unwrap();
    let runs: Vec<(&str, Vec<String>, i32)> = vec![
        (
            "pull",
            pull_args(&node.repo, &with_creds(&liar.url), REF, &[]),
            2,
        ),
        (
            "verify",
            [
                "verify",
                "--url",
                &with_creds(&hidden.url),
                "--ref",
                REF,
                "--trusted-keys",
            ]
            .iter()
            .map(|s| s.to_string())
            .chain([key.display().to_string()])
            .collect(),
            3,
        ),
        (
            "ls-remote",
            vec!["ls-remote".into(), "--url".into(), with_creds(&hidden.url)],
            2,
        ),
    ];
    for (what, args, code) in runs {
        let mut cmd = client(&args);
        cmd.env("RUST_LOG", "debug");
        let out = run_bounded(&mut cmd, CLIENT_TIMEOUT).unwrap();
        expect_code(&out, code, what);
        let text = said(&out);
        assert!(!text.contains(SECRET), "{what} shows the password:\n{text}");
        assert!(
            text.contains("***@127.0.0.1"),
            "{what}: no redacted URL in:\n{text}"
        );
    }
}
