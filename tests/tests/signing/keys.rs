//! `keygen` and the key options of `sign` / `serve`: what GnuPG 2.2 makes
//! of the keys, file modes, refusals.

use crate::support::*;
use oscontent_testkit::signing::*;
use oscontent_testkit::*;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

/// `gpg --homedir HOME --batch ARGS...`; must succeed.
fn gpg(home: &std::path::Path, args: &[&str]) -> String {
    let mut cmd = Command::new("gpg");
    local_only(&mut cmd)
        .arg("--homedir")
        .arg(home)
        .args(["--batch", "--no-tty"])
        .args(args);
    check_output(&mut cmd, TOOL_TIMEOUT)
        .unwrap_or_else(|e| panic!("gpg (GnuPG 2.2, package gnupg) is required: {e:#}"))
}

#[test]
fn keygen_makes_v4_keys_that_gnupg_imports() {
    let tmp = tempdir();
    // (name, extra args, GnuPG public-key algorithm id, expires)
    let cases: &[(&str, &[&str], &str, bool)] = &[
        ("ed", &[], "22", false),
        (
            "rsa",
            &["--cipher", "rsa3072", "--expires", "2y"],
            "1",
            true,
        ),
    ];
    for (name, extra, algo, expires) in cases {
        let key = keygen(tmp.path(), name, extra).unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&key.secret), 0o600, "{name}: secret key mode");
        assert_eq!(
            mode(&key.public) & 0o077,
            0o044,
            "{name}: public key is readable"
        );
        let public = std::fs::read_to_string(&key.public).unwrap();
        assert!(
            public.starts_with("-----BEGIN PGP PUBLIC KEY BLOCK-----"),
            "{name}"
        );
        assert!(
            !public.contains("PRIVATE"),
            "{name}: the public file has no secrets"
        );
        let secret = std::fs::read_to_string(&key.secret).unwrap();
        assert!(
            secret.starts_with("-----BEGIN PGP PRIVATE KEY BLOCK-----"),
            "{name}"
        );

        let home = tmp.path().join(format!("gnupg-{name}"));
        std::fs::create_dir(&home).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        gpg(&home, &["--import", key.public.to_str().unwrap()]);
        let listing = gpg(&home, &["--with-colons", "--list-keys", &key.fingerprint]);
        // pub:<validity>:<len>:<algo>:<keyid>:<created>:<expires>:...
        let pubrec: Vec<&str> = listing
            .lines()
            .find(|l| l.starts_with("pub:"))
            .unwrap_or_else(|| panic!("{name}: no pub record in {listing}"))
            .split(':')
            .collect();
        assert_eq!(pubrec[3], *algo, "{name}: algorithm in {listing}");
        assert_eq!(
            !pubrec[6].is_empty(),
            *expires,
            "{name}: expiry in {listing}"
        );
        assert!(
            listing.contains(&format!("fpr:::::::::{}:", key.fingerprint)),
            "{name}: GnuPG sees fingerprint {}: {listing}",
            key.fingerprint
        );
        // A signing-capable subkey ("s" capability), as GnuPG makes them.
        assert!(
            listing
                .lines()
                .any(|l| l.starts_with("sub:")
                    && l.split(':').nth(11).is_some_and(|c| c.contains('s'))),
            "{name}: no signing subkey: {listing}"
        );
    }
}

/// Owned copies of `args`.
fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// `SUBCOMMAND SRC... REST...`, as a `server_command` argument list.
fn with_source(subcommand: &str, src: &[String], rest: &[&str]) -> Vec<String> {
    [strings(&[subcommand]), src.to_vec(), strings(rest)].concat()
}

/// The bad inputs of `keygen_and_key_loading_refuse_bad_input`:
/// (what, args, a phrase the error must contain).
fn bad_input_cases(
    tmp: &std::path::Path,
    key: &Key,
    garbage: &std::path::Path,
    nonempty: &std::path::Path,
    src: &[String],
) -> Vec<(&'static str, Vec<String>, &'static str)> {
    let p = |p: &std::path::Path| p.display().to_string();
    let (secret, public, garbage) = (p(&key.secret), p(&key.public), p(garbage));
    vec![
        (
            "overwriting a secret key",
            strings(&[
                "keygen",
                "--uid",
                "x",
                "--out-secret",
                &secret,
                "--out-public",
                &p(&tmp.join("new.pub")),
            ]),
            "refusing to overwrite",
        ),
        (
            "a bad --expires",
            strings(&[
                "keygen",
                "--uid",
                "x",
                "--expires",
                "3 months",
                "--out-secret",
                &p(&tmp.join("a.sec")),
                "--out-public",
                &p(&tmp.join("a.pub")),
            ]),
            "invalid duration",
        ),
        (
            "signing with a public key",
            with_source(
                "sign",
                src,
                &["--key", &public, "--out", &p(&tmp.join("b1"))],
            ),
            "public certificate",
        ),
        (
            "signing with garbage",
            with_source(
                "sign",
                src,
                &["--key", &garbage, "--out", &p(&tmp.join("b2"))],
            ),
            "garbage.asc",
        ),
        (
            "signing with an unset --key-env",
            with_source(
                "sign",
                src,
                &[
                    "--key-env",
                    "OSCONTENT_TEST_NO_SUCH_VAR",
                    "--out",
                    &p(&tmp.join("b3")),
                ],
            ),
            "OSCONTENT_TEST_NO_SUCH_VAR is not set",
        ),
        (
            "a non-empty --out",
            with_source("sign", src, &["--key", &secret, "--out", &p(nonempty)]),
            "not empty",
        ),
        (
            "serving with garbage trusted keys",
            with_source(
                "serve",
                src,
                &[
                    "--state-dir",
                    &p(&tmp.join("st")),
                    "--listen",
                    "127.0.0.1:0",
                    "--trusted-keys",
                    &garbage,
                ],
            ),
            "trusted keys",
        ),
    ]
}

#[test]
fn keygen_and_key_loading_refuse_bad_input() {
    let tmp = tempdir();
    let key = keygen(tmp.path(), "k", &[]).unwrap();
    let before = std::fs::read(&key.secret).unwrap();
    let garbage = tmp.path().join("garbage.asc");
    std::fs::write(&garbage, "not a key\n").unwrap();
    let nonempty = tmp.path().join("nonempty");
    std::fs::create_dir(&nonempty).unwrap();
    std::fs::write(nonempty.join("keep"), "x").unwrap();
    let tiny = tiny_oscontainer(&tmp.path().join("tiny"), 1);
    let src = oscontainer_args(&tiny);

    for (what, args, phrase) in bad_input_cases(tmp.path(), &key, &garbage, &nonempty, &src) {
        let o = run_bounded(&mut server_command(&args), TOOL_TIMEOUT).unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{what}: succeeded.\n{stderr}");
        assert!(
            stderr.contains(phrase),
            "{what}: error lacks {phrase:?}:\n{stderr}"
        );
        assert!(!announced_listening(&o.stdout), "{what}");
    }
    assert_eq!(
        std::fs::read(&key.secret).unwrap(),
        before,
        "the secret key was not touched"
    );
    assert!(!tmp.path().join("new.pub").exists(), "nothing half-written");
    assert_eq!(std::fs::read_dir(&nonempty).unwrap().count(), 1);

    // The key from the environment works like the file.
    let out = tmp.path().join("from-env");
    let o = run_bounded(
        server_command(["sign"])
            .args(&src)
            .args(["--key-env", "OSCONTENT_TEST_KEY", "--out"])
            .arg(&out)
            .env(
                "OSCONTENT_TEST_KEY",
                std::fs::read_to_string(&key.secret).unwrap(),
            ),
        TOOL_TIMEOUT,
    )
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        read_manifest(&out).unwrap()["signer"],
        key.fingerprint.as_str()
    );
}
