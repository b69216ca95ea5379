//! Interop with GnuPG 2.2 and stock ostree.

use super::*;
use crate::gpgsigs::{build_gpgsigs, parse_gpgsigs};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A directory removed on drop; gpg's agent socket path limit (~107
/// bytes) rules out deep paths, so it lives directly under the temp dir.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "oscpgp-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs a tool the interop tests depend on; a missing tool is a failure
/// with instructions, not a skip.
fn run(cmd: &mut Command) -> Output {
    let prog = cmd.get_program().to_string_lossy().into_owned();
    cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| {
        panic!(
            "cannot run {prog:?} ({e}). This interop test needs GnuPG 2.2 (`gpg`, package gnupg) and \
             stock ostree (package ostree) on PATH; install them, do not skip the test."
        )
    })
}

fn ok(cmd: &mut Command) -> String {
    let desc = format!("{cmd:?}");
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{desc} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A throwaway GNUPGHOME; kills the agent gpg may have started in it.
struct GpgHome(Scratch);

impl GpgHome {
    fn new() -> GpgHome {
        let s = Scratch::new("gpg");
        std::fs::set_permissions(&s.0, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        GpgHome(s)
    }
    fn dir(&self) -> &Path {
        &self.0 .0
    }
    fn gpg(&self) -> Command {
        let mut c = Command::new("gpg");
        c.env("GNUPGHOME", self.dir()).args(["--batch", "--no-tty"]);
        c
    }
}

impl Drop for GpgHome {
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
            .env("GNUPGHOME", self.dir())
            .args(["--kill", "gpg-agent"])
            .stdin(Stdio::null())
            .output();
    }
}

fn gpg_version_is_2_2(home: &GpgHome) {
    let v = ok(home.gpg().arg("--version"));
    assert!(v.starts_with("gpg (GnuPG) 2."), "unexpected gpg: {v}");
}

#[test]
fn openpgp_gnupg_verifies_sequoia_signatures() {
    for algo in KeyAlgo::ALL {
        let home = GpgHome::new();
        gpg_version_is_2_2(&home);
        let (tsk, _) = generate_cert(
            &format!("Seq {algo} <seq@example.com>"),
            &KeyOptions {
                algo,
                ..Default::default()
            },
        )
        .unwrap();
        let files = Scratch::new("files");
        std::fs::write(files.path("key.asc"), armor_public(&tsk).unwrap()).unwrap();
        std::fs::write(files.path("data"), DATA).unwrap();
        std::fs::write(files.path("data.sig"), sign_detached(&tsk, DATA).unwrap()).unwrap();
        ok(home.gpg().arg("--import").arg(files.path("key.asc")));

        let status = ok(home
            .gpg()
            .args(["--status-fd", "1", "--verify"])
            .arg(files.path("data.sig"))
            .arg(files.path("data")));
        let subkey = signing_subkey(&tsk).fingerprint().to_string();
        eprintln!("gpg --verify ({algo}):\n{status}");
        assert!(status.contains("[GNUPG:] GOODSIG"), "{algo}: {status}");
        let validsig = status
            .lines()
            .find(|l| l.starts_with("[GNUPG:] VALIDSIG"))
            .unwrap_or_else(|| panic!("{algo}: {status}"));
        // VALIDSIG <signing key fpr> ... <primary key fpr>
        assert!(
            validsig.contains(&subkey) && validsig.ends_with(&tsk.fingerprint().to_string()),
            "{algo}: {validsig}"
        );

        // And GnuPG notices tampering.
        std::fs::write(files.path("data"), b"tampered").unwrap();
        let out = run(home
            .gpg()
            .args(["--status-fd", "1", "--verify"])
            .arg(files.path("data.sig"))
            .arg(files.path("data")));
        assert!(
            !out.status.success() && String::from_utf8_lossy(&out.stdout).contains("BADSIG"),
            "{algo}"
        );
    }
}

/// Makes a key with GnuPG itself, as an operator following gpg docs would.
fn gpg_key(home: &GpgHome, uid: &str) -> (String, Vec<Cert>) {
    ok(home.gpg().args([
        "--passphrase",
        "",
        "--quick-gen-key",
        uid,
        "ed25519",
        "sign",
        "0",
    ]));
    let armored = ok(home.gpg().args(["--armor", "--export", uid]));
    let certs = load_certs(armored.as_bytes()).unwrap();
    let fpr = certs[0].fingerprint().to_string();
    (fpr, certs)
}

#[test]
fn openpgp_sequoia_verifies_gnupg_signatures() {
    let home = GpgHome::new();
    gpg_version_is_2_2(&home);
    let (fpr, ring) = gpg_key(&home, "Test <t@example.com>");
    let files = Scratch::new("files");
    std::fs::write(files.path("data"), DATA).unwrap();
    ok(home
        .gpg()
        .args(["--local-user", &fpr, "--detach-sign", "--output"])
        .arg(files.path("data.sig"))
        .arg(files.path("data")));
    let sig = std::fs::read(files.path("data.sig")).unwrap();

    let v = verify_detached(&ring, DATA, std::slice::from_ref(&sig), now()).unwrap();
    assert_eq!(v.cert_fingerprint.to_string(), fpr);
    assert_eq!(
        kind(&verify_detached(
            &ring,
            b"other bytes",
            std::slice::from_ref(&sig),
            now()
        )),
        "BadSignature"
    );
    assert_eq!(
        kind(&verify_detached(&[public(alice())], DATA, &[sig], now())),
        "UnknownKey"
    );
}

/// ostree's own `gpg-sign` and `summary --gpg-sign` write the container
/// format that [`parse_gpgsigs`] reads, and we verify what they hold.
#[test]
fn openpgp_reads_ostree_gpg_signed_metadata() {
    let home = GpgHome::new();
    let (fpr, ring) = gpg_key(&home, "Ostree Signer <os@example.com>");
    let s = Scratch::new("ostree");
    let repo = s.path("repo");
    let commit = commit_repo(&s, &repo);
    let homedir = format!("--gpg-homedir={}", home.dir().display());
    ok(Command::new("ostree")
        .arg(format!("--repo={}", repo.display()))
        .args(["gpg-sign", &homedir, &commit, &fpr]));
    ok(Command::new("ostree")
        .arg(format!("--repo={}", repo.display()))
        .args(["summary", "-u", &homedir])
        .arg(format!("--gpg-sign={fpr}")));

    let (commit_bytes, meta) = commit_files(&repo, &commit);
    let sigs = parse_gpgsigs(&std::fs::read(meta).unwrap()).unwrap();
    assert_eq!(sigs.len(), 1);
    verify_detached(&ring, &commit_bytes, &sigs, now()).unwrap();

    let summary = std::fs::read(repo.join("summary")).unwrap();
    let sigs = parse_gpgsigs(&std::fs::read(repo.join("summary.sig")).unwrap()).unwrap();
    assert_eq!(sigs.len(), 1);
    verify_detached(&ring, &summary, &sigs, now()).unwrap();
}

/// An archive repo with one commit on ref `os/test`; returns its checksum.
fn commit_repo(s: &Scratch, repo: &Path) -> String {
    let tree = s.path("tree");
    std::fs::create_dir_all(tree.join("usr/bin")).unwrap();
    std::fs::write(tree.join("usr/bin/hello"), b"#!/bin/sh\necho hello\n").unwrap();
    let r = format!("--repo={}", repo.display());
    ok(Command::new("ostree").args([&r, "init", "--mode=archive"]));
    let out = ok(Command::new("ostree")
        .args([&r, "commit", "-b", "os/test", "-s", "signed by sequoia"])
        .arg(format!("--tree=dir={}", tree.display())));
    out.trim().to_owned()
}

/// (the commit object's bytes, where its detached metadata lives)
fn commit_files(repo: &Path, commit: &str) -> (Vec<u8>, PathBuf) {
    let dir = repo.join("objects").join(&commit[..2]);
    let bytes = std::fs::read(dir.join(format!("{}.commit", &commit[2..]))).unwrap();
    (bytes, dir.join(format!("{}.commitmeta", &commit[2..])))
}

/// The acceptance test of the trust model's interop line: stock `ostree
/// pull` with `gpg-verify` and `gpg-verify-summary` accepts a commit and
/// summary signed here, and refuses them when it trusts a different key.
#[test]
fn openpgp_stock_ostree_pulls_sequoia_signed_commit() {
    let s = Scratch::new("pull");
    let src = s.path("src");
    let commit = commit_repo(&s, &src);
    let signer = alice();
    let (commit_bytes, meta) = commit_files(&src, &commit);
    // Exactly what the signer does: sign the object's bytes, store as aay.
    std::fs::write(
        &meta,
        build_gpgsigs(&[sign_detached(signer, &commit_bytes).unwrap()]).unwrap(),
    )
    .unwrap();
    ok(Command::new("ostree")
        .arg(format!("--repo={}", src.display()))
        .args(["summary", "-u"]));
    let summary = std::fs::read(src.join("summary")).unwrap();
    std::fs::write(
        src.join("summary.sig"),
        build_gpgsigs(&[sign_detached(signer, &summary).unwrap()]).unwrap(),
    )
    .unwrap();

    std::fs::write(s.path("good.asc"), armor_public(signer).unwrap()).unwrap();
    std::fs::write(s.path("other.asc"), armor_public(bob()).unwrap()).unwrap();
    std::fs::write(
        s.path("revoked.asc"),
        armor_public(&revoke(signer).unwrap()).unwrap(),
    )
    .unwrap();
    let cases = [
        ("trusted key, commit only", "good.asc", false, true),
        ("trusted key, commit and summary", "good.asc", true, true),
        ("other key, commit only", "other.asc", false, false),
        ("other key, commit and summary", "other.asc", true, false),
        // gpgme reports REVKEYSIG; ostree must not count it as valid.
        ("revoked key, commit only", "revoked.asc", false, false),
    ];
    for (n, (name, key, verify_summary, want_ok)) in cases.into_iter().enumerate() {
        let dst = s.path(&format!("dst{n}"));
        let r = format!("--repo={}", dst.display());
        ok(Command::new("ostree").args([&r, "init", "--mode=archive"]));
        ok(Command::new("ostree")
            .args([&r, "remote", "add", "--set=gpg-verify=true"])
            .arg(format!("--set=gpg-verify-summary={verify_summary}"))
            .arg(format!("--gpg-import={}", s.path(key).display()))
            .arg("origin")
            .arg(format!("file://{}", src.display())));
        let out = run(Command::new("ostree").args([&r, "pull", "origin", "os/test"]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.success(), want_ok, "{name}: {stderr}");
        if want_ok {
            let head = ok(Command::new("ostree").args([&r, "rev-parse", "origin:os/test"]));
            assert_eq!(head.trim(), commit, "{name}");
        } else {
            eprintln!(
                "{name}: ostree pull refused as it should: {}",
                stderr.trim()
            );
            assert!(
                stderr.to_ascii_lowercase().contains("signature"),
                "{name}: not a signature failure: {stderr}"
            );
            let refs = ok(Command::new("ostree").args([&r, "refs"]));
            assert!(
                refs.trim().is_empty(),
                "{name}: a ref appeared despite the failure: {refs}"
            );
        }
    }
}
