//! The OpenPGP core of the trust model (ARCHITECTURE.md, "Trust model"):
//! make keys, sign the exact bytes of a commit object or summary, and verify
//! such signatures against a keyring of trusted certificates.
//!
//! Everything is sequoia-openpgp; nothing here is hand-rolled crypto. The
//! constraint that shapes the defaults is interop with stock ostree, which
//! verifies through gpgme and GnuPG 2.2: keys are v4 (GnuPG 2.2 cannot read
//! v6/RFC 9580 keys, and Ed25519 must be the "EdDSA legacy" v4 encoding),
//! and signatures are v4, binary, detached, one packet each. What
//! [`verify_detached`] accepts, GnuPG 2.2 accepts too: we refuse v3/v6
//! signatures and text-mode signatures rather than trust something stock
//! ostree would reject.
//!
//! Pure apart from the clock and the RNG: no files, no network.

use anyhow::{anyhow, bail, Context, Result};
use sequoia_openpgp as sq;
use sq::cert::prelude::*;
use sq::packet::signature::SignatureBuilder;
use sq::packet::{Packet, Signature};
use sq::parse::{Dearmor, PacketParserBuilder, PacketParserResult, Parse};
use sq::policy::{HashAlgoSecurity, Policy, StandardPolicy};
use sq::serialize::SerializeInto;
use sq::types::{HashAlgorithm, RevocationStatus, SignatureType};
use sq::{KeyHandle, Profile};
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

// Re-exported so the server, xtask and tests can hold keys and name
// revocation reasons without depending on sequoia themselves.
pub use sq::types::ReasonForRevocation;
pub use sq::{Cert, Fingerprint};

// The signature bounds live with the container that carries them, which
// builds without sequoia (the fuzz targets' configuration).
pub use crate::gpgsigs::{MAX_SIGNATURES, MAX_SIGNATURE_SIZE};
/// Trusted-key files above this size are refused (a keyring of a few dozen
/// certificates is a few hundred KiB at most).
pub const MAX_KEYRING_SIZE: usize = 16 << 20;
/// Certificates beyond this count in one keyring are refused.
pub const MAX_CERTS: usize = 1024;
/// A signature dated this far past the verifier's clock is refused: a small
/// skew between signer and node is normal, a signature from the future is
/// a sign of a wrong clock or a forgery meant to win a downgrade check.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);
/// SHA-512: GnuPG's own choice for Ed25519, strong enough for RSA, and
/// accepted by every GnuPG 2.2 build.
const SIGNATURE_HASH: HashAlgorithm = HashAlgorithm::SHA512;

/// The public-key algorithm of a new key. All three give v4 keys that
/// GnuPG 2.2 imports and verifies with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyAlgo {
    /// EdDSA over Ed25519 (v4 "EdDSA legacy", algorithm 22).
    #[default]
    Ed25519,
    Rsa3072,
    Rsa4096,
}

impl KeyAlgo {
    pub const ALL: [KeyAlgo; 3] = [KeyAlgo::Ed25519, KeyAlgo::Rsa3072, KeyAlgo::Rsa4096];

    fn cipher_suite(self) -> CipherSuite {
        match self {
            KeyAlgo::Ed25519 => CipherSuite::Cv25519,
            KeyAlgo::Rsa3072 => CipherSuite::RSA3k,
            KeyAlgo::Rsa4096 => CipherSuite::RSA4k,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KeyAlgo::Ed25519 => "ed25519",
            KeyAlgo::Rsa3072 => "rsa3072",
            KeyAlgo::Rsa4096 => "rsa4096",
        }
    }
}

impl fmt::Display for KeyAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for KeyAlgo {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        KeyAlgo::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                anyhow!("unknown key algorithm {s:?}; want one of ed25519, rsa3072, rsa4096")
            })
    }
}

/// How to make a key; [`generate_key`] uses the defaults.
#[derive(Debug, Clone, Default)]
pub struct KeyOptions {
    pub algo: KeyAlgo,
    /// Defaults to a minute ago (sequoia backdates so that a verifier whose
    /// clock is slightly behind does not see a key from the future).
    pub creation_time: Option<SystemTime>,
    /// How long the key is valid after `creation_time`; `None` never
    /// expires. An OS-update key that expires strands nodes that were
    /// offline, so expiry is opt-in.
    pub validity: Option<Duration>,
}

/// Makes a v4 certificate with secrets: a certification-only primary key
/// and one signing subkey, the layout GnuPG itself creates. Also returns
/// the revocation certificate sequoia makes alongside, to be stored
/// offline.
pub fn generate_cert(user_id: &str, opts: &KeyOptions) -> Result<(Cert, Signature)> {
    let mut b = CertBuilder::new()
        // Pin the profile: a sequoia upgrade that changes the default to
        // RFC 9580 would silently make keys GnuPG 2.2 cannot read.
        .set_profile(Profile::RFC4880)?
        .set_cipher_suite(opts.algo.cipher_suite())
        .add_userid(user_id)
        .add_signing_subkey()
        .set_validity_period(opts.validity);
    if let Some(t) = opts.creation_time {
        b = b.set_creation_time(t);
    }
    let (cert, rev) = b
        .generate()
        .with_context(|| format!("generating a {} key", opts.algo))?;
    debug_assert_eq!(cert.primary_key().key().version(), 4);
    Ok((cert, rev))
}

/// Makes a key as [`generate_cert`] with defaults and returns it armored:
/// `(secret key (TSK), public certificate)`.
pub fn generate_key(user_id: &str, algo: KeyAlgo) -> Result<(String, String)> {
    let (cert, _rev) = generate_cert(
        user_id,
        &KeyOptions {
            algo,
            ..Default::default()
        },
    )?;
    Ok((armor_tsk(&cert)?, armor_public(&cert)?))
}

/// The certificate with its secret key material, ASCII-armored.
pub fn armor_tsk(tsk: &Cert) -> Result<String> {
    let bytes = tsk
        .as_tsk()
        .armored()
        .to_vec()
        .context("serializing the secret key")?;
    String::from_utf8(bytes).context("armor is ASCII")
}

/// The public certificate only (secrets stripped), ASCII-armored: what
/// `ostree remote add --gpg-import` and `--trusted-keys` take.
pub fn armor_public(cert: &Cert) -> Result<String> {
    let bytes = cert
        .armored()
        .to_vec()
        .context("serializing the certificate")?;
    String::from_utf8(bytes).context("armor is ASCII")
}

/// Signs `data` with `tsk`'s signing key as of now. See
/// [`sign_detached_at`].
pub fn sign_detached(tsk: &Cert, data: &[u8]) -> Result<Vec<u8>> {
    sign_detached_at(tsk, data, None)
}

/// One binary v4 detached signature packet over exactly `data`, by the
/// first signing-capable, live, unrevoked key of `tsk` that has an
/// unencrypted secret, dated `time` (or now). The bytes go as one element
/// of an `ostree.gpgsigs` array.
pub fn sign_detached_at(tsk: &Cert, data: &[u8], time: Option<SystemTime>) -> Result<Vec<u8>> {
    let policy = StandardPolicy::new();
    let at = time.unwrap_or_else(SystemTime::now);
    let key = signing_key(&policy, tsk, at)?;
    let mut signer = key.into_keypair().context("unlocking the signing key")?;
    let mut b = SignatureBuilder::new(SignatureType::Binary).set_hash_algo(SIGNATURE_HASH);
    if let Some(t) = time {
        b = b.set_signature_creation_time(t)?;
    }
    let sig = b.sign_message(&mut signer, data).context("signing")?;
    Packet::from(sig)
        .to_vec()
        .context("serializing the signature")
}

type SecretKey = sq::packet::Key<sq::packet::key::SecretParts, sq::packet::key::UnspecifiedRole>;

fn signing_key(policy: &dyn Policy, tsk: &Cert, at: SystemTime) -> Result<SecretKey> {
    let fpr = tsk.fingerprint();
    let vc = tsk
        .with_policy(policy, at)
        .with_context(|| format!("key {fpr} is not valid under the standard policy"))?;
    if let RevocationStatus::Revoked(_) = vc.revocation_status() {
        bail!("key {fpr} is revoked");
    }
    vc.alive()
        .with_context(|| format!("key {fpr} has expired"))?;
    let mut saw_encrypted = false;
    for ka in vc.keys().for_signing().alive().revoked(false).secret() {
        let key = ka.key().clone();
        if key.has_unencrypted_secret() {
            return Ok(key.role_into_unspecified());
        }
        saw_encrypted = true;
    }
    if saw_encrypted {
        bail!("key {fpr}: the signing key is passphrase-protected; export it without a passphrase for unattended signing");
    }
    if !tsk.is_tsk() {
        bail!("{fpr} is a public certificate; signing needs the secret key (TSK)");
    }
    bail!("key {fpr} has no live, unrevoked signing-capable key with secret material")
}

/// Parses one or more certificates, armored or binary. Secret material, if
/// present, is kept (callers that only verify never use it). Several
/// armored blocks may be concatenated, as `cat *.asc` produces.
pub fn load_certs(bytes: &[u8]) -> Result<Vec<Cert>> {
    if bytes.len() > MAX_KEYRING_SIZE {
        bail!(
            "keyring is {} bytes, over the {MAX_KEYRING_SIZE} byte limit",
            bytes.len()
        );
    }
    let mut certs = Vec::new();
    for block in armor_blocks(bytes) {
        let parser = CertParser::from_bytes(block)
            .context("not OpenPGP certificates (want armored or binary keys)")?;
        for c in parser {
            certs.push(c.with_context(|| {
                format!("not OpenPGP: certificate #{} is malformed", certs.len() + 1)
            })?);
            if certs.len() > MAX_CERTS {
                bail!("more than {MAX_CERTS} certificates in one keyring");
            }
        }
    }
    if certs.is_empty() {
        bail!("no OpenPGP certificate found (want an armored or binary public key)");
    }
    Ok(certs)
}

/// Splits concatenated armored blocks, because sequoia's armor reader
/// stops after the first one; binary input is returned whole.
fn armor_blocks(bytes: &[u8]) -> Vec<&[u8]> {
    const BEGIN: &[u8] = b"-----BEGIN PGP ";
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| bytes[i..].starts_with(BEGIN) && (i == 0 || bytes[i - 1] == b'\n'))
        .collect();
    if starts.len() < 2 {
        return vec![bytes];
    }
    let mut out = Vec::with_capacity(starts.len());
    for (n, &s) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(bytes.len());
        out.push(&bytes[s..end]);
    }
    out
}

/// Parses exactly one secret key (TSK) that can sign now: a live,
/// unrevoked, signing-capable key with unencrypted secret material.
pub fn load_tsk(bytes: &[u8]) -> Result<Cert> {
    let mut certs = load_certs(bytes).context("reading the signing key")?;
    if certs.len() != 1 {
        bail!(
            "want exactly one secret key, found {} certificates",
            certs.len()
        );
    }
    let tsk = certs.remove(0);
    if !tsk.is_tsk() {
        bail!(
            "{} is a public certificate; signing needs the secret key (TSK)",
            tsk.fingerprint()
        );
    }
    signing_key(&StandardPolicy::new(), &tsk, SystemTime::now())?;
    Ok(tsk)
}

/// Revokes the whole certificate as compromised, now. The result keeps
/// `tsk`'s secrets; publish it with [`armor_public`] so verifiers learn
/// about the revocation.
pub fn revoke(tsk: &Cert) -> Result<Cert> {
    revoke_at(tsk, ReasonForRevocation::KeyCompromised, None)
}

/// Revokes the whole certificate with `reason`, dated `time` (or now).
/// "Compromised" and "unspecified" revocations invalidate every signature
/// ever made; "superseded" and "retired" only those made afterwards (but
/// [`verify_detached`] also refuses keys revoked by the time it runs).
pub fn revoke_at(
    tsk: &Cert,
    reason: ReasonForRevocation,
    time: Option<SystemTime>,
) -> Result<Cert> {
    let primary = tsk.primary_key().key().clone();
    let mut signer = primary
        .parts_into_secret()
        .context("revoking needs the primary secret key")?
        .into_keypair()
        .context("unlocking the primary key")?;
    let mut b =
        CertRevocationBuilder::new().set_reason_for_revocation(reason, b"revoked by oscontent")?;
    if let Some(t) = time {
        b = b.set_signature_creation_time(t)?;
    }
    let rev = b
        .build(&mut signer, tsk, None)
        .context("making the revocation")?;
    let (cert, _) = tsk.clone().insert_packets(rev)?;
    Ok(cert)
}

/// A signature that verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedSig {
    /// The certificate (primary key) it chains to: what a keyring lists.
    pub cert_fingerprint: Fingerprint,
    /// The (sub)key that made it.
    pub key_fingerprint: Fingerprint,
    /// The signature's creation time, as the signer claimed it.
    pub created: SystemTime,
    /// Its position in the list handed to [`verify_detached`].
    pub index: usize,
    /// The certificate's primary User ID, for messages.
    pub user_id: Option<String>,
}

/// Why no signature verified. When several signatures fail, the most
/// telling failure is reported: a bad signature by a trusted key, then
/// revoked, then expired, then unknown keys (all of them named), then
/// malformed bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("no signatures")]
    NoSignatures,
    /// `issuers` are what the signatures name: usually a signing subkey's
    /// fingerprint, not the certificate's that keygen and GnuPG show
    /// first; `trusted` says which certificates, and which of their keys,
    /// the keyring holds, so that the two can be compared.
    #[error(
        "signed only by keys not in the trusted keyring: {} (signing keys; the keyring trusts {})",
        if issuers.is_empty() { "(none named)".to_owned() } else { issuers.join(", ") },
        if trusted.is_empty() { "no keys".to_owned() } else { trusted.join("; ") }
    )]
    UnknownKey {
        issuers: Vec<String>,
        trusted: Vec<String>,
    },
    #[error("bad signature by {fingerprint}: {reason}")]
    BadSignature { fingerprint: String, reason: String },
    #[error("signature by {fingerprint} is expired: {reason}")]
    Expired { fingerprint: String, reason: String },
    #[error("key {fingerprint} is revoked: {reason}")]
    Revoked { fingerprint: String, reason: String },
    #[error("malformed signature: {0}")]
    Malformed(String),
}

impl VerifyError {
    /// How far a signature got before failing: a signature by a trusted key
    /// that fails says more than one by a stranger, which says more than
    /// bytes that are not a signature at all. Tampering (a bad signature by
    /// a trusted key) is the most telling of all.
    fn rank(&self) -> u8 {
        match self {
            VerifyError::NoSignatures => 0,
            VerifyError::Malformed(_) => 1,
            VerifyError::UnknownKey { .. } => 2,
            VerifyError::Expired { .. } => 3,
            VerifyError::Revoked { .. } => 4,
            VerifyError::BadSignature { .. } => 5,
        }
    }

    fn worst(a: Option<VerifyError>, b: VerifyError) -> VerifyError {
        match a {
            // Keep every stranger's name: the operator needs to know which
            // key to trust (or to investigate).
            Some(VerifyError::UnknownKey {
                mut issuers,
                trusted,
            }) if matches!(b, VerifyError::UnknownKey { .. }) => {
                if let VerifyError::UnknownKey { issuers: more, .. } = b {
                    for i in more {
                        if !issuers.contains(&i) {
                            issuers.push(i);
                        }
                    }
                }
                VerifyError::UnknownKey { issuers, trusted }
            }
            Some(a) if a.rank() >= b.rank() => a,
            _ => b,
        }
    }
}

/// Checks detached signatures over exactly `data`. Succeeds with the first
/// signature that is cryptographically valid by a signing-capable key of a
/// certificate in `keyring`, under sequoia's [`StandardPolicy`], where
/// certificate and key are neither revoked nor expired both when the
/// signature was made and at `policy_time` (normally now), and the
/// signature itself has not expired by then.
pub fn verify_detached(
    keyring: &[Cert],
    data: &[u8],
    sigs: &[Vec<u8>],
    policy_time: SystemTime,
) -> Result<VerifiedSig, VerifyError> {
    if sigs.is_empty() {
        return Err(VerifyError::NoSignatures);
    }
    if sigs.len() > MAX_SIGNATURES {
        return Err(VerifyError::Malformed(format!(
            "{} signatures exceeds the limit of {MAX_SIGNATURES}",
            sigs.len()
        )));
    }
    let policy = StandardPolicy::new();
    let mut worst = None;
    for (index, raw) in sigs.iter().enumerate() {
        match verify_one(&policy, keyring, data, raw, policy_time) {
            Ok(mut v) => {
                v.index = index;
                return Ok(v);
            }
            // Say which element is broken: the others may be fine.
            Err(VerifyError::Malformed(why)) => {
                let e = VerifyError::Malformed(format!("signature {index}: {why}"));
                worst = Some(VerifyError::worst(worst, e))
            }
            Err(e) => worst = Some(VerifyError::worst(worst, e)),
        }
    }
    Err(worst.unwrap_or(VerifyError::NoSignatures))
}

/// Exactly one v4 binary signature packet, nothing before or after it.
fn parse_signature(raw: &[u8]) -> Result<Signature, VerifyError> {
    let malformed = |why: String| VerifyError::Malformed(why);
    if raw.is_empty() || raw.len() > MAX_SIGNATURE_SIZE {
        return Err(malformed(format!(
            "{} bytes, want 1..={MAX_SIGNATURE_SIZE}",
            raw.len()
        )));
    }
    // Binary only (ostree stores packets, not armor), and never descend
    // into compressed containers: a signature has none.
    let ppr = PacketParserBuilder::from_bytes(raw)
        .and_then(|b| b.dearmor(Dearmor::Disabled).max_recursion_depth(0).build())
        .map_err(|e| malformed(format!("{e:#}")))?;
    let PacketParserResult::Some(pp) = ppr else {
        return Err(malformed("no OpenPGP packet".into()));
    };
    let (packet, rest) = pp.next().map_err(|e| malformed(format!("{e:#}")))?;
    if !matches!(rest, PacketParserResult::EOF(_)) {
        return Err(malformed(
            "more than one packet; want exactly one signature".into(),
        ));
    }
    let sig = match packet {
        Packet::Signature(s) => s,
        Packet::Unknown(u) => {
            return Err(malformed(format!(
                "unparseable {} packet: {:#}",
                u.tag(),
                u.error()
            )))
        }
        p => return Err(malformed(format!("a {} packet, not a signature", p.tag()))),
    };
    if sig.version() != 4 {
        return Err(malformed(format!(
            "version {} signature; GnuPG 2.2 needs version 4",
            sig.version()
        )));
    }
    if sig.typ() != SignatureType::Binary {
        return Err(malformed(format!(
            "{} signature; want a binary document signature",
            sig.typ()
        )));
    }
    Ok(sig)
}

fn verify_one(
    policy: &dyn Policy,
    keyring: &[Cert],
    data: &[u8],
    raw: &[u8],
    now: SystemTime,
) -> Result<VerifiedSig, VerifyError> {
    let sig = parse_signature(raw)?;
    let created = sig
        .signature_creation_time()
        .ok_or_else(|| VerifyError::Malformed("no signature creation time".into()))?;
    let issuers = sig.get_issuers();
    if issuers.is_empty() {
        return Err(VerifyError::Malformed("names no issuer key".into()));
    }
    let mut worst = None;
    let mut tried = false;
    for cert in keyring {
        for ka in cert.keys().key_handles(issuers.iter()) {
            tried = true;
            match check_candidate(
                policy,
                cert,
                ka.key().fingerprint(),
                &sig,
                data,
                created,
                now,
            ) {
                Ok(v) => return Ok(v),
                Err(e) => worst = Some(VerifyError::worst(worst, e)),
            }
        }
    }
    if !tried {
        return Err(VerifyError::UnknownKey {
            issuers: issuer_names(&issuers),
            trusted: keyring.iter().map(describe_cert).collect(),
        });
    }
    Err(worst.expect("at least one candidate was tried"))
}

/// A trusted certificate for messages: its fingerprint and its subkeys'.
fn describe_cert(cert: &Cert) -> String {
    let subkeys: Vec<String> = cert
        .keys()
        .subkeys()
        .map(|k| k.key().fingerprint().to_string())
        .collect();
    if subkeys.is_empty() {
        cert.fingerprint().to_string()
    } else {
        format!("{} (subkeys {})", cert.fingerprint(), subkeys.join(", "))
    }
}

/// Fingerprints where the signature names them, else key IDs.
fn issuer_names(issuers: &[KeyHandle]) -> Vec<String> {
    let fprs: Vec<String> = issuers
        .iter()
        .filter(|h| matches!(h, KeyHandle::Fingerprint(_)))
        .map(|h| h.to_string())
        .collect();
    if fprs.is_empty() {
        issuers.iter().map(|h| h.to_string()).collect()
    } else {
        fprs
    }
}

fn show_time(t: SystemTime) -> String {
    sq::types::Timestamp::try_from(t)
        .map(|ts| ts.to_string())
        .unwrap_or_else(|_| format!("{t:?}"))
}

fn revocation_reason(revs: &[&Signature]) -> String {
    revs.first()
        .and_then(|r| r.reason_for_revocation())
        .map(|(code, msg)| {
            let msg = String::from_utf8_lossy(msg);
            if msg.is_empty() {
                code.to_string()
            } else {
                format!("{code}: {msg}")
            }
        })
        .unwrap_or_else(|| "no reason given".to_owned())
}

fn check_candidate(
    policy: &dyn Policy,
    cert: &Cert,
    key_fpr: Fingerprint,
    sig: &Signature,
    data: &[u8],
    created: SystemTime,
    now: SystemTime,
) -> Result<VerifiedSig, VerifyError> {
    let fingerprint = key_fpr.to_string();
    let bad = |reason: String| VerifyError::BadSignature {
        fingerprint: fingerprint.clone(),
        reason,
    };
    let expired = |reason: String| VerifyError::Expired {
        fingerprint: fingerprint.clone(),
        reason,
    };
    let revoked = |reason: String| VerifyError::Revoked {
        fingerprint: fingerprint.clone(),
        reason,
    };

    let key = cert
        .keys()
        .key_handle(key_fpr.clone())
        .next()
        .ok_or_else(|| bad("key vanished from its certificate".into()))?;
    // The mathematics first: a forged signature is reported as forged even
    // when the key it names is also expired or revoked.
    sig.verify_message(key.key(), data)
        .map_err(|e| bad(format!("{e:#}")))?;
    policy
        .signature(sig, HashAlgoSecurity::CollisionResistance)
        .map_err(|e| bad(format!("rejected by the standard policy: {e:#}")))?;
    if created > now + MAX_CLOCK_SKEW {
        return Err(bad(format!("made in the future ({})", show_time(created))));
    }
    if let Some(exp) = sig.signature_expiration_time() {
        if exp <= now {
            return Err(expired(format!(
                "the signature expired at {}",
                show_time(exp)
            )));
        }
    }

    let mut user_id = None;
    for (when, t) in [("when it signed", created), ("now", now)] {
        let vc = cert.with_policy(policy, t).map_err(|e| {
            bad(format!(
                "certificate {} not valid {when}: {e:#}",
                cert.fingerprint()
            ))
        })?;
        if let RevocationStatus::Revoked(revs) = vc.revocation_status() {
            return Err(revoked(format!(
                "certificate revoked ({}), checked {when}",
                revocation_reason(&revs)
            )));
        }
        let vka = vc
            .keys()
            .key_handle(key_fpr.clone())
            .next()
            .ok_or_else(|| {
                bad(format!(
                    "key not bound to its certificate under the standard policy {when}"
                ))
            })?;
        if let RevocationStatus::Revoked(revs) = vka.revocation_status() {
            return Err(revoked(format!(
                "key revoked ({}), checked {when}",
                revocation_reason(&revs)
            )));
        }
        vc.alive()
            .map_err(|e| expired(format!("certificate not live {when}: {e:#}")))?;
        vka.alive()
            .map_err(|e| expired(format!("key not live {when}: {e:#}")))?;
        if !vka.for_signing() {
            return Err(bad("the key is not signing-capable".into()));
        }
        user_id = vc
            .primary_userid()
            .ok()
            .map(|u| String::from_utf8_lossy(u.userid().value()).into_owned());
    }
    Ok(VerifiedSig {
        cert_fingerprint: cert.fingerprint(),
        key_fingerprint: key_fpr,
        created,
        index: 0,
        user_id,
    })
}

#[cfg(test)]
mod tests;
