//! Unit tests for the OpenPGP core, plus the interop checks the trust model
//! rests on: GnuPG 2.2 verifies what we sign, we verify what GnuPG signs,
//! and stock ostree (libostree + gpgme) pulls a commit and summary we
//! signed. The interop tests fail, never skip, when gpg or ostree is
//! missing: a green run must mean interop was actually checked.
//!
//! `unit.rs` holds the former, `interop.rs` the latter; the keys and
//! hand-made signatures both use are here.

use super::*;
use sq::packet::key::{SecretParts, UnspecifiedRole};
use std::sync::OnceLock;

mod interop;
mod unit;

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
