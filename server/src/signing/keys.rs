//! Keys: loading the signer's secret key and the gate's trusted keys,
//! `keygen`, and key lifetimes.

use anyhow::{bail, Context, Result};
use oscontent_format::openpgp::{self, Cert};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Armored secret keys are a few KiB; an environment variable or file far
/// larger than this is not one.
const MAX_KEY_SIZE: usize = 1 << 20;

/// Reads a secret key (armored TSK) that can sign now.
pub fn load_secret_key_file(path: &Path) -> Result<Cert> {
    let bytes = read_bounded(path, MAX_KEY_SIZE)
        .with_context(|| format!("reading secret key {}", path.display()))?;
    openpgp::load_tsk(&bytes).with_context(|| format!("secret key {}", path.display()))
}

/// Reads a secret key (armored TSK) from an environment variable, so it can
/// come from a Kubernetes Secret without touching a disk.
pub fn load_secret_key_env(var: &str) -> Result<Cert> {
    let v =
        std::env::var_os(var).with_context(|| format!("environment variable {var} is not set"))?;
    let bytes = v.as_encoded_bytes();
    anyhow::ensure!(!bytes.is_empty(), "environment variable {var} is empty");
    anyhow::ensure!(
        bytes.len() <= MAX_KEY_SIZE,
        "environment variable {var} is {} bytes, over the {MAX_KEY_SIZE} byte limit for a key",
        bytes.len()
    );
    openpgp::load_tsk(bytes).with_context(|| format!("secret key in ${var}"))
}

/// Reads a keyring of trusted public certificates (armored or binary).
pub fn load_trusted_keys(path: &Path) -> Result<Vec<Cert>> {
    let bytes = read_bounded(path, openpgp::MAX_KEYRING_SIZE)
        .with_context(|| format!("reading trusted keys {}", path.display()))?;
    openpgp::load_certs(&bytes).with_context(|| format!("trusted keys {}", path.display()))
}

fn read_bounded(path: &Path, max: usize) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    f.take(max as u64 + 1).read_to_end(&mut buf)?;
    anyhow::ensure!(buf.len() <= max, "over the {max} byte limit");
    Ok(buf)
}

/// Options of `keygen`.
#[derive(Debug, Clone)]
pub struct KeygenRequest {
    pub user_id: String,
    pub algo: openpgp::KeyAlgo,
    pub validity: Option<Duration>,
    pub out_secret: PathBuf,
    pub out_public: PathBuf,
    /// Where to put the revocation certificate, if anywhere.
    pub out_revocation: Option<PathBuf>,
}

/// Makes a v4 key GnuPG 2.2 accepts and writes it: the secret key mode
/// 0600, never over an existing file. On error, files this call created
/// are removed. Returns the fingerprint.
pub fn keygen(req: &KeygenRequest) -> Result<openpgp::Fingerprint> {
    let outputs: Vec<&PathBuf> = [Some(&req.out_secret), Some(&req.out_public)]
        .into_iter()
        .chain([req.out_revocation.as_ref()])
        .flatten()
        .collect();
    for (i, p) in outputs.iter().enumerate() {
        if p.symlink_metadata().is_ok() {
            bail!("{} already exists; refusing to overwrite it", p.display());
        }
        if outputs[..i].contains(p) {
            bail!("{} is named twice", p.display());
        }
    }
    let (cert, _) = openpgp::generate_cert(
        &req.user_id,
        &openpgp::KeyOptions {
            algo: req.algo,
            validity: req.validity,
            ..Default::default()
        },
    )?;
    let secret = openpgp::armor_tsk(&cert)?;
    let public = openpgp::armor_public(&cert)?;
    let mut created: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<()> {
        write_new(&req.out_secret, secret.as_bytes(), 0o600)?;
        created.push(req.out_secret.clone());
        write_new(&req.out_public, public.as_bytes(), 0o644)?;
        created.push(req.out_public.clone());
        if let Some(p) = &req.out_revocation {
            // Importing this (gpg --import, or appending it to a
            // --trusted-keys file) revokes the key everywhere.
            let revoked =
                openpgp::revoke_at(&cert, openpgp::ReasonForRevocation::Unspecified, None)
                    .context("making the revocation certificate")?;
            let armored = openpgp::armor_public(&revoked)?;
            write_new(p, armored.as_bytes(), 0o600)?;
            created.push(p.clone());
        }
        Ok(())
    })();
    if let Err(e) = result {
        for p in created {
            let _ = std::fs::remove_file(p);
        }
        return Err(e);
    }
    Ok(cert.fingerprint())
}

/// Creates `path` with `mode` and writes `bytes`, refusing to replace
/// anything. The mode applies from creation: a secret is never readable by
/// others, not even for an instant.
pub(super) fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow::anyhow!(
                    "{} already exists; refusing to overwrite it",
                    path.display()
                )
            } else {
                anyhow::Error::new(e).context(format!("creating {}", path.display()))
            }
        })?;
    let written = f
        .write_all(bytes)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", path.display()));
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

/// Parses a key lifetime: a number with a unit, `s`, `min`, `h`, `d`, `w`
/// or `y` (365 days), possibly several (`1y30d`), or `never`.
pub fn parse_validity(s: &str) -> Result<Option<Duration>> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("never") {
        return Ok(None);
    }
    const UNITS: &[(&str, u64)] = &[
        ("min", 60),
        ("s", 1),
        ("h", 3600),
        ("d", 86_400),
        ("w", 7 * 86_400),
        ("y", 365 * 86_400),
    ];
    let bad =
        || anyhow::anyhow!("invalid duration {s:?}: want e.g. 2y, 365d, 12w, 36h, 90min or never");
    let mut rest = s;
    let mut total: u64 = 0;
    anyhow::ensure!(!rest.is_empty(), bad());
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        anyhow::ensure!(digits > 0, bad());
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let (unit, mult) = UNITS
            .iter()
            .find(|(u, _)| rest.starts_with(u))
            .ok_or_else(bad)?;
        rest = &rest[unit.len()..];
        total = n
            .checked_mul(*mult)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
    }
    anyhow::ensure!(total > 0, "duration {s:?} is zero; use never for no expiry");
    Ok(Some(Duration::from_secs(total)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_parsing() {
        let cases: &[(&str, Option<Option<u64>>)] = &[
            ("never", Some(None)),
            ("2y", Some(Some(2 * 365 * 86_400))),
            ("1y30d", Some(Some(395 * 86_400))),
            ("36h", Some(Some(36 * 3600))),
            ("90min", Some(Some(90 * 60))),
            ("12w", Some(Some(84 * 86_400))),
            ("10s", Some(Some(10))),
            ("", None),
            ("0d", None),
            ("5", None),
            ("d", None),
            ("3 months", None),
            ("99999999999999999999y", None),
        ];
        for (s, want) in cases {
            let got = parse_validity(s).ok().map(|d| d.map(|d| d.as_secs()));
            assert_eq!(got, *want, "{s:?}");
        }
    }

    #[test]
    fn keygen_refuses_to_overwrite_or_alias() {
        let t = tempfile::tempdir().unwrap();
        let existing = t.path().join("existing");
        std::fs::write(&existing, "keep").unwrap();
        let req = |secret: &Path, public: &Path| KeygenRequest {
            user_id: "t <t@example.com>".into(),
            algo: openpgp::KeyAlgo::Ed25519,
            validity: None,
            out_secret: secret.to_owned(),
            out_public: public.to_owned(),
            out_revocation: None,
        };
        let fresh = t.path().join("fresh");
        for (secret, public, phrase) in [
            (&existing, &fresh, "refusing to overwrite"),
            (&fresh, &existing, "refusing to overwrite"),
            (&fresh, &fresh, "named twice"),
        ] {
            let err = keygen(&req(secret, public)).unwrap_err();
            assert!(format!("{err:#}").contains(phrase), "{err:#}");
        }
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep");
        assert!(!fresh.exists(), "nothing half-written");
    }
}
