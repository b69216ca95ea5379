//! Unit tests for the OpenPGP core, plus the interop checks the trust model
//! rests on: GnuPG 2.2 verifies what we sign, we verify what GnuPG signs,
//! and stock ostree (libostree + gpgme) pulls a commit and summary we
//! signed. The interop tests fail, never skip, when gpg or ostree is
//! missing: a green run must mean interop was actually checked.

use super::*;
use crate::{build_gpgsigs, parse_gpgsigs};
use sq::packet::key::{SecretParts, UnspecifiedRole};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

const DAY: Duration = Duration::from_secs(24 * 3600);
const DATA: &[u8] = b"the exact bytes of a commit object";

fn now() -> SystemTime {
    SystemTime::now()
}

/// One Ed25519 key for the many tests that do not care which: key
/// generation is the slow part.
fn alice() -> &'static Cert {
    static K: OnceLock<Cert> = OnceLock::new();
    K.get_or_init(|| {
        generate_cert("Alice <alice@example.com>", &KeyOptions::default())
            .unwrap()
            .0
    })
}

fn bob() -> &'static Cert {
    static K: OnceLock<Cert> = OnceLock::new();
    K.get_or_init(|| {
        generate_cert("Bob <bob@example.com>", &KeyOptions::default())
            .unwrap()
            .0
    })
}

fn public(c: &Cert) -> Cert {
    c.clone().strip_secret_key_material()
}

fn parse_sig(raw: &[u8]) -> Signature {
    parse_signature(raw).unwrap()
}

fn signing_subkey(tsk: &Cert) -> sq::packet::Key<SecretParts, UnspecifiedRole> {
    let ka = tsk
        .keys()
        .subkeys()
        .secret()
        .next()
        .expect("a signing subkey");
    ka.key().clone().role_into_unspecified()
}

/// A signature built by hand, bypassing [`sign_detached_at`]'s checks that
/// the key is live, to model a signer that ignored them.
fn raw_sign(tsk: &Cert, data: &[u8], b: SignatureBuilder) -> Vec<u8> {
    let mut kp = signing_subkey(tsk).into_keypair().unwrap();
    let sig = b.sign_message(&mut kp, data).unwrap();
    Packet::from(sig).to_vec().unwrap()
}

fn kind(r: &Result<VerifiedSig, VerifyError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(VerifyError::NoSignatures) => "NoSignatures",
        Err(VerifyError::UnknownKey { .. }) => "UnknownKey",
        Err(VerifyError::BadSignature { .. }) => "BadSignature",
        Err(VerifyError::Expired { .. }) => "Expired",
        Err(VerifyError::Revoked { .. }) => "Revoked",
        Err(VerifyError::Malformed(_)) => "Malformed",
    }
}

#[test]
fn openpgp_roundtrip_every_algorithm() {
    for algo in KeyAlgo::ALL {
        let (tsk_armor, pub_armor) =
            generate_key(&format!("Roundtrip {algo} <rt@example.com>"), algo).unwrap();
        assert!(
            tsk_armor.starts_with("-----BEGIN PGP PRIVATE KEY BLOCK-----"),
            "{algo}"
        );
        assert!(
            pub_armor.starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----"),
            "{algo}"
        );
        assert!(!pub_armor.contains("PRIVATE"), "{algo}");
        let tsk = load_tsk(tsk_armor.as_bytes()).unwrap();
        let keyring = load_certs(pub_armor.as_bytes()).unwrap();
        assert!(
            !keyring[0].is_tsk(),
            "{algo}: public export must carry no secrets"
        );

        // v4 throughout: GnuPG 2.2 reads nothing newer.
        assert_eq!(tsk.primary_key().key().version(), 4, "{algo}");
        let sig = sign_detached(&tsk, DATA).unwrap();
        let s = parse_sig(&sig);
        assert_eq!(
            (s.version(), s.typ(), s.hash_algo()),
            (4, SignatureType::Binary, SIGNATURE_HASH),
            "{algo}"
        );

        let before = now();
        let v = verify_detached(&keyring, DATA, &[sig], now()).unwrap();
        assert_eq!(v.cert_fingerprint, tsk.fingerprint(), "{algo}");
        assert_eq!(
            v.key_fingerprint,
            signing_subkey(&tsk).fingerprint(),
            "{algo}: the subkey signs"
        );
        assert_eq!(v.index, 0);
        assert_eq!(
            v.user_id.as_deref(),
            Some(format!("Roundtrip {algo} <rt@example.com>").as_str())
        );
        // Made "now", to the second.
        let age = before.duration_since(v.created).unwrap_or_default();
        assert!(
            age < Duration::from_secs(5),
            "{algo}: created {:?} ago",
            age
        );
    }
}

#[test]
fn openpgp_key_layout_is_what_gnupg_makes() {
    let c = alice();
    let p = StandardPolicy::new();
    let vc = c.with_policy(&p, None).unwrap();
    let primary = vc.primary_key();
    assert!(primary.for_certification() && !primary.for_signing());
    // EdDSA legacy (algorithm 22), the only Ed25519 encoding GnuPG 2.2 has.
    assert_eq!(
        primary.key().pk_algo(),
        sq::types::PublicKeyAlgorithm::EdDSA
    );
    let subs: Vec<_> = vc.keys().subkeys().collect();
    assert_eq!(subs.len(), 1);
    assert!(subs[0].for_signing());
    assert_eq!(subs[0].key().version(), 4);
    assert!(
        vc.alive().is_ok()
            && c.primary_key()
                .with_policy(&p, None)
                .unwrap()
                .key_expiration_time()
                .is_none()
    );
}

#[test]
fn openpgp_verify_outcomes() {
    let a = alice();
    let ring = [public(a)];
    let good = sign_detached(a, DATA).unwrap();
    let by_bob = sign_detached(bob(), DATA).unwrap();
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x01;
    let sha1 = raw_sign(
        a,
        DATA,
        SignatureBuilder::new(SignatureType::Binary).set_hash_algo(HashAlgorithm::SHA1),
    );
    let text = raw_sign(a, DATA, SignatureBuilder::new(SignatureType::Text));
    let future = raw_sign(
        a,
        DATA,
        SignatureBuilder::new(SignatureType::Binary)
            .set_signature_creation_time(now() + DAY)
            .unwrap(),
    );
    let short_lived = raw_sign(
        a,
        DATA,
        SignatureBuilder::new(SignatureType::Binary)
            // Alice's key dates from a minute ago; the signature must not
            // predate it.
            .set_signature_creation_time(now() - Duration::from_secs(30))
            .unwrap()
            .set_signature_validity_period(Duration::from_secs(10))
            .unwrap(),
    );
    let armored = {
        let mut w = sq::armor::Writer::new(Vec::new(), sq::armor::Kind::Signature).unwrap();
        std::io::Write::write_all(&mut w, &good).unwrap();
        w.finalize().unwrap()
    };
    let two_packets = [good.clone(), good.clone()].concat();
    let a_key_packet = Packet::from(public(a).primary_key().key().clone())
        .to_vec()
        .unwrap();

    // (name, data, signatures, expected outcome)
    type Case<'a> = (&'static str, &'a [u8], Vec<Vec<u8>>, &'static str);
    let cases: Vec<Case> = vec![
        ("good", DATA, vec![good.clone()], "ok"),
        (
            "tampered data",
            b"the exact bytes of a commit objecT",
            vec![good.clone()],
            "BadSignature",
        ),
        ("empty data", b"", vec![good.clone()], "BadSignature"),
        (
            "flipped signature bit",
            DATA,
            vec![flipped.clone()],
            "BadSignature",
        ),
        ("untrusted key", DATA, vec![by_bob.clone()], "UnknownKey"),
        ("no signatures", DATA, vec![], "NoSignatures"),
        (
            "garbage",
            DATA,
            vec![b"not a signature at all".to_vec()],
            "Malformed",
        ),
        ("empty element", DATA, vec![vec![]], "Malformed"),
        (
            "oversized element",
            DATA,
            vec![vec![0x88; MAX_SIGNATURE_SIZE + 1]],
            "Malformed",
        ),
        (
            "too many",
            DATA,
            vec![good.clone(); MAX_SIGNATURES + 1],
            "Malformed",
        ),
        ("armored, not binary", DATA, vec![armored], "Malformed"),
        (
            "two packets in one element",
            DATA,
            vec![two_packets],
            "Malformed",
        ),
        (
            "a key, not a signature",
            DATA,
            vec![a_key_packet],
            "Malformed",
        ),
        ("text-mode signature", DATA, vec![text], "Malformed"),
        ("SHA-1 refused by policy", DATA, vec![sha1], "BadSignature"),
        ("from the future", DATA, vec![future], "BadSignature"),
        (
            "signature validity lapsed",
            DATA,
            vec![short_lived],
            "Expired",
        ),
        (
            "garbage then good",
            DATA,
            vec![b"junk".to_vec(), good.clone()],
            "ok",
        ),
        (
            "stranger then good",
            DATA,
            vec![by_bob.clone(), good.clone()],
            "ok",
        ),
        // The most telling failure wins: a forgery over a stranger.
        (
            "stranger and forgery",
            DATA,
            vec![by_bob.clone(), flipped.clone()],
            "BadSignature",
        ),
        (
            "garbage and stranger",
            DATA,
            vec![b"junk".to_vec(), by_bob.clone()],
            "UnknownKey",
        ),
    ];
    for (name, data, sigs, want) in cases {
        let got = verify_detached(&ring, data, &sigs, now());
        assert_eq!(kind(&got), want, "{name}: {got:?}");
    }

    // Good signature reported with its position.
    let v = verify_detached(&ring, DATA, &[by_bob.clone(), good.clone()], now()).unwrap();
    assert_eq!(v.index, 1);
    // An empty keyring trusts no one.
    assert_eq!(
        kind(&verify_detached(&[], DATA, &[good], now())),
        "UnknownKey"
    );
    // Strangers are named by fingerprint so an operator can act.
    match verify_detached(&ring, DATA, &[by_bob], now()) {
        Err(VerifyError::UnknownKey { issuers }) => {
            assert_eq!(
                issuers,
                vec![signing_subkey(bob()).fingerprint().to_string()]
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn openpgp_expiry() {
    // Valid for two days, starting three days ago: dead since yesterday.
    let opts = KeyOptions {
        creation_time: Some(now() - 3 * DAY),
        validity: Some(2 * DAY),
        ..Default::default()
    };
    let (tsk, _) = generate_cert("Expiring <exp@example.com>", &opts).unwrap();
    let ring = [public(&tsk)];
    let while_alive = sign_detached_at(&tsk, DATA, Some(now() - 2 * DAY)).unwrap();
    let after_death = raw_sign(
        &tsk,
        DATA,
        SignatureBuilder::new(SignatureType::Binary)
            .set_signature_creation_time(now() - DAY / 2)
            .unwrap(),
    );
    let cases = [
        (
            "made while alive, checked while alive",
            &while_alive,
            now() - 2 * DAY + Duration::from_secs(60),
            "ok",
        ),
        (
            "made while alive, checked after expiry",
            &while_alive,
            now(),
            "Expired",
        ),
        (
            "made after expiry",
            &after_death,
            now() - DAY / 4,
            "Expired",
        ),
    ];
    for (name, sig, at, want) in cases {
        let got = verify_detached(&ring, DATA, std::slice::from_ref(sig), at);
        assert_eq!(kind(&got), want, "{name}: {got:?}");
    }
    // The signer refuses an expired key outright.
    let err = sign_detached(&tsk, DATA).unwrap_err();
    assert!(format!("{err:#}").contains("expired"), "{err:#}");
    assert!(load_tsk(armor_tsk(&tsk).unwrap().as_bytes()).is_err());
}

#[test]
fn openpgp_revocation() {
    let (tsk, _) = generate_cert("Revoked <rev@example.com>", &KeyOptions::default()).unwrap();
    let sig = sign_detached(&tsk, DATA).unwrap();
    assert!(verify_detached(&[public(&tsk)], DATA, std::slice::from_ref(&sig), now()).is_ok());

    let hard = revoke(&tsk).unwrap();
    // A "retired" revocation dated after the signature still counts at
    // verification time: a retired key must not keep releases flowing.
    let soft = revoke_at(&tsk, ReasonForRevocation::KeyRetired, Some(now())).unwrap();
    for (name, cert) in [("compromised", &hard), ("retired", &soft)] {
        let got = verify_detached(
            &[public(cert)],
            DATA,
            std::slice::from_ref(&sig),
            now() + Duration::from_secs(2),
        );
        assert_eq!(kind(&got), "Revoked", "{name}: {got:?}");
    }
    // The revocation survives the armored public export verifiers get.
    let ring = load_certs(armor_public(&hard).unwrap().as_bytes()).unwrap();
    match verify_detached(&ring, DATA, &[sig], now()) {
        Err(VerifyError::Revoked { reason, .. }) => {
            assert!(reason.contains("compromised"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(sign_detached(&hard, DATA).is_err());
}

#[test]
fn openpgp_revoked_subkey() {
    let (tsk, _) = generate_cert("Subkey <sub@example.com>", &KeyOptions::default()).unwrap();
    let sig = sign_detached(&tsk, DATA).unwrap();
    let p = StandardPolicy::new();
    let mut primary = tsk
        .primary_key()
        .key()
        .clone()
        .parts_into_secret()
        .unwrap()
        .into_keypair()
        .unwrap();
    let sub = tsk.keys().subkeys().next().unwrap();
    let rev = SubkeyRevocationBuilder::new()
        .set_reason_for_revocation(ReasonForRevocation::KeyCompromised, b"lost")
        .unwrap()
        .build(&mut primary, &tsk, sub.key(), None)
        .unwrap();
    let (revoked, _) = tsk.clone().insert_packets(rev).unwrap();
    assert!(revoked
        .with_policy(&p, None)
        .unwrap()
        .keys()
        .subkeys()
        .revoked(true)
        .next()
        .is_some());
    let got = verify_detached(&[public(&revoked)], DATA, &[sig], now());
    assert_eq!(kind(&got), "Revoked", "{got:?}");
}

#[test]
fn openpgp_load_keys() {
    let a = armor_public(alice()).unwrap();
    let b = armor_public(bob()).unwrap();
    let binary = public(alice()).to_vec().unwrap();
    let both_binary = [binary.clone(), public(bob()).to_vec().unwrap()].concat();
    let cases: Vec<(&str, Vec<u8>, Option<usize>)> = vec![
        ("armored", a.clone().into_bytes(), Some(1)),
        ("binary", binary.clone(), Some(1)),
        (
            "two armored blocks, concatenated",
            format!("{a}\n{b}").into_bytes(),
            Some(2),
        ),
        ("two binary certs", both_binary, Some(2)),
        (
            "a secret key (secrets kept, usable as a keyring)",
            armor_tsk(alice()).unwrap().into_bytes(),
            Some(1),
        ),
        ("empty", vec![], None),
        ("garbage", b"hello world".to_vec(), None),
        ("oversized", vec![b'\n'; MAX_KEYRING_SIZE + 1], None),
    ];
    for (name, bytes, want) in cases {
        let got = load_certs(&bytes);
        assert_eq!(
            got.as_ref().ok().map(Vec::len),
            want,
            "{name}: {:?}",
            got.err()
        );
    }

    let tsk_armor = armor_tsk(alice()).unwrap();
    assert_eq!(
        load_tsk(tsk_armor.as_bytes()).unwrap().fingerprint(),
        alice().fingerprint()
    );
    let two = format!("{tsk_armor}\n{}", armor_tsk(bob()).unwrap());
    let encrypted = {
        let (k, _) = CertBuilder::new()
            .set_profile(Profile::RFC4880)
            .unwrap()
            .add_userid("Locked")
            .add_signing_subkey()
            .set_password(Some("hunter2".into()))
            .generate()
            .unwrap();
        armor_tsk(&k).unwrap()
    };
    let cases = [
        ("public only", a.clone(), "secret key"),
        ("two secret keys", two, "exactly one"),
        ("passphrase-protected", encrypted, "passphrase"),
        ("garbage", "garbage".to_owned(), "not OpenPGP"),
    ];
    for (name, input, want) in cases {
        let err = load_tsk(input.as_bytes()).unwrap_err();
        assert!(format!("{err:#}").contains(want), "{name}: {err:#}");
    }
    assert!(format!("{:#}", sign_detached(&public(alice()), DATA).unwrap_err()).contains("secret"));
}

#[test]
fn openpgp_key_algo_names() {
    for a in KeyAlgo::ALL {
        assert_eq!(a.to_string().parse::<KeyAlgo>().unwrap(), a);
    }
    assert_eq!("ED25519".parse::<KeyAlgo>().unwrap(), KeyAlgo::Ed25519);
    assert!("dsa".parse::<KeyAlgo>().is_err());
}

#[test]
fn openpgp_armor_blocks_split() {
    assert_eq!(armor_blocks(b"\x99binary").len(), 1);
    let two = b"-----BEGIN PGP PUBLIC KEY BLOCK-----\nA\n-----END PGP PUBLIC KEY BLOCK-----\n-----BEGIN PGP PUBLIC KEY BLOCK-----\nB\n";
    let blocks = armor_blocks(two);
    assert_eq!(blocks.len(), 2);
    assert!(blocks[1].starts_with(b"-----BEGIN"));
}

// ---------------------------------------------------------------------------
// Interop with GnuPG 2.2 and stock ostree.

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
