//! The OpenPGP core on its own: signing, verification outcomes, expiry,
//! revocation, key loading.

use super::*;

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

/// Alice's keyring, and signatures over [`DATA`] made right and wrong.
struct Crafted {
    ring: [Cert; 1],
    good: Vec<u8>,
    by_bob: Vec<u8>,
    flipped: Vec<u8>,
}

fn crafted() -> Crafted {
    let a = alice();
    let good = sign_detached(a, DATA).unwrap();
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x01;
    Crafted {
        ring: [public(a)],
        by_bob: sign_detached(bob(), DATA).unwrap(),
        good,
        flipped,
    }
}

/// (name, data, signatures, expected outcome)
type Case<'a> = (&'static str, &'a [u8], Vec<Vec<u8>>, &'static str);

fn check_cases(ring: &[Cert], cases: Vec<Case>) {
    for (name, data, sigs, want) in cases {
        let got = verify_detached(ring, data, &sigs, now());
        assert_eq!(kind(&got), want, "{name}: {got:?}");
    }
}

#[test]
fn openpgp_verify_outcomes() {
    let Crafted {
        ring,
        good,
        by_bob,
        flipped,
    } = crafted();
    let a = alice();
    let sha1 = raw_sign(
        a,
        DATA,
        SignatureBuilder::new(SignatureType::Binary).set_hash_algo(HashAlgorithm::SHA1),
    );
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
    check_cases(&ring, cases);
}

#[test]
fn openpgp_verify_refuses_malformed_signatures() {
    let Crafted { ring, good, .. } = crafted();
    let a = alice();
    let text = raw_sign(a, DATA, SignatureBuilder::new(SignatureType::Text));
    let armored = {
        let mut w = sq::armor::Writer::new(Vec::new(), sq::armor::Kind::Signature).unwrap();
        std::io::Write::write_all(&mut w, &good).unwrap();
        w.finalize().unwrap()
    };
    let two_packets = [good.clone(), good.clone()].concat();
    let a_key_packet = Packet::from(public(a).primary_key().key().clone())
        .to_vec()
        .unwrap();
    let cases: Vec<Case> = vec![
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
    ];
    check_cases(&ring, cases);
}

#[test]
fn openpgp_verify_reports_position_and_strangers() {
    let Crafted {
        ring, good, by_bob, ..
    } = crafted();
    // Good signature reported with its position.
    let v = verify_detached(&ring, DATA, &[by_bob.clone(), good.clone()], now()).unwrap();
    assert_eq!(v.index, 1);
    // An empty keyring trusts no one.
    assert_eq!(
        kind(&verify_detached(&[], DATA, &[good], now())),
        "UnknownKey"
    );
    // Strangers are named by fingerprint so an operator can act.
    // The message also names what the keyring trusts, subkeys included:
    // a signature names a signing subkey, keygen and GnuPG the primary.
    match verify_detached(&ring, DATA, &[by_bob], now()) {
        Err(e @ VerifyError::UnknownKey { .. }) => {
            let msg = e.to_string();
            let VerifyError::UnknownKey { issuers, trusted } = e else {
                unreachable!()
            };
            assert_eq!(
                issuers,
                vec![signing_subkey(bob()).fingerprint().to_string()]
            );
            assert_eq!(trusted.len(), ring.len());
            for cert in &ring {
                assert!(msg.contains(&cert.fingerprint().to_string()), "{msg}");
                for k in cert.keys().subkeys() {
                    assert!(msg.contains(&k.key().fingerprint().to_string()), "{msg}");
                }
            }
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
