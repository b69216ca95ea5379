//! What a private key may sign: only content whose identity the operator
//! fixed. A name that can be moved by someone else (a registry tag, an OCI
//! layout's tag, a `--repo`'s refs) would make the signer an oracle for
//! whoever can move it, so every way of being told what to sign (`serve
//! --sign-key` at start and at each publication, `sign`, the site mirror)
//! asks [`decide`] first.

use oscontent_format::Checksum;
use oscontent_parse::source::{ImageRef, Reference};
use std::collections::BTreeSet;

/// Who signs, for the message: `--sign-key` (serve) or `sign`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    SignKey,
    SignCommand,
}

impl std::fmt::Display for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signer::SignKey => "--sign-key",
            Signer::SignCommand => "sign",
        })
    }
}

/// Something the signer was told to sign.
#[derive(Debug, Clone, Copy)]
pub enum Named<'a> {
    /// An `--image` reference.
    Image(&'a ImageRef),
    /// `--oscontainer` or `--repo`, with the `--commit` checksums given and
    /// whether `--trusted-keys` is.
    Local {
        pins: &'a BTreeSet<Checksum>,
        trusted_keys: bool,
    },
    /// `--upstream` or `--bundle`: republished with the source's own
    /// signatures, never signed here.
    Site,
    /// At publication, a commit a generation would publish: pinned by
    /// `--commit`, or already carrying a signature `--trusted-keys`
    /// verifies.
    Commit {
        commit: &'a Checksum,
        pins: &'a BTreeSet<Checksum>,
        trusted_signature: bool,
    },
}

/// Why something may not be signed; each says what to pin instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unpinned {
    #[error("{signer} signs only pinned content: give the image by digest (docker://{name}@sha256:…) instead of the tag :{tag}")]
    Tag {
        signer: Signer,
        name: String,
        tag: String,
    },
    #[error("{signer} signs only pinned content: {image} is whatever the layout's index names, which a writer of it can change; push it to a registry and give it by digest (docker://HOST/REPO@sha256:…)")]
    Layout { signer: Signer, image: String },
    #[error("{signer} signs only pinned content: name each commit it may sign with --commit CHECKSUM{}", if *.signer == Signer::SignKey { " (or give --trusted-keys, to sign only commits that already carry a signature they verify)" } else { "" })]
    Local { signer: Signer },
    #[error("{signer} does not apply to --upstream and --bundle: the source's own signatures are republished as they are (verify them with --trusted-keys)")]
    Site { signer: Signer },
    #[error("commit {commit} is not pinned: {signer} signs only the commits named by --commit{}, and a publication that would serve another is refused", if *.trusted { " or carrying a signature --trusted-keys verifies" } else { "" })]
    Commit {
        signer: Signer,
        commit: Checksum,
        trusted: bool,
    },
}

/// Whether `signer` may sign what `named` names. Pure.
pub fn decide(signer: Signer, named: Named<'_>) -> Result<(), Unpinned> {
    match named {
        Named::Image(ImageRef::Registry {
            reference: Reference::Digest(_),
            ..
        }) => Ok(()),
        Named::Image(ImageRef::Registry {
            registry,
            repository,
            reference: Reference::Tag(tag),
        }) => Err(Unpinned::Tag {
            signer,
            name: format!("{registry}/{repository}"),
            tag: tag.clone(),
        }),
        Named::Image(image @ (ImageRef::OciLayout { .. } | ImageRef::OciArchive { .. })) => {
            Err(Unpinned::Layout {
                signer,
                image: image.to_string(),
            })
        }
        Named::Local { pins, trusted_keys } => {
            let by_keys = trusted_keys && signer == Signer::SignKey;
            if pins.is_empty() && !by_keys {
                Err(Unpinned::Local { signer })
            } else {
                Ok(())
            }
        }
        Named::Site => Err(Unpinned::Site { signer }),
        Named::Commit {
            commit,
            pins,
            trusted_signature,
        } => {
            if pins.contains(commit) || trusted_signature {
                Ok(())
            } else {
                Err(Unpinned::Commit {
                    signer,
                    commit: *commit,
                    trusted: signer == Signer::SignKey,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(s: &str) -> ImageRef {
        s.parse().unwrap()
    }

    #[test]
    fn only_what_the_operator_pinned_is_signed() {
        let c1 = Checksum::digest(b"c1");
        let c2 = Checksum::digest(b"c2");
        let none = BTreeSet::new();
        let pins = BTreeSet::from([c1]);
        let digest = format!("docker://reg.example/os@sha256:{}", "a".repeat(64));
        let tagged = image("docker://reg.example/os:v2");
        let latest = image("docker://reg.example/os");
        let by_digest = image(&digest);
        let tag_and_digest = image(&format!(
            "docker://reg.example/os:v2@sha256:{}",
            "b".repeat(64)
        ));
        let layout = image("oci:/srv/layout:v2");
        let archive = image("oci-archive:/srv/os.tar");
        use Signer::{SignCommand as Cmd, SignKey as Key};
        // (signer, what, allowed, a part the refusal must name)
        #[rustfmt::skip]
        let cases: Vec<(Signer, Named, Result<(), &str>)> = vec![
            (Key, Named::Image(&by_digest), Ok(())),
            (Cmd, Named::Image(&by_digest), Ok(())),
            (Key, Named::Image(&tag_and_digest), Ok(())),
            (Key, Named::Image(&tagged), Err("give the image by digest (docker://reg.example/os@sha256:…) instead of the tag :v2")),
            (Cmd, Named::Image(&tagged), Err("sign signs only pinned content")),
            (Key, Named::Image(&latest), Err("instead of the tag :latest")),
            (Key, Named::Image(&layout), Err("oci:/srv/layout:v2 is whatever")),
            (Cmd, Named::Image(&archive), Err("oci-archive:/srv/os.tar")),
            (Key, Named::Local { pins: &pins, trusted_keys: false }, Ok(())),
            (Key, Named::Local { pins: &none, trusted_keys: true }, Ok(())),
            (Key, Named::Local { pins: &none, trusted_keys: false }, Err("with --commit CHECKSUM (or give --trusted-keys")),
            (Cmd, Named::Local { pins: &pins, trusted_keys: false }, Ok(())),
            // `sign` verifies nothing, so keys are no pin there.
            (Cmd, Named::Local { pins: &none, trusted_keys: true }, Err("with --commit CHECKSUM")),
            (Key, Named::Site, Err("does not apply to --upstream and --bundle")),
            (Cmd, Named::Site, Err("does not apply")),
            (Key, Named::Commit { commit: &c1, pins: &pins, trusted_signature: false }, Ok(())),
            (Key, Named::Commit { commit: &c2, pins: &none, trusted_signature: true }, Ok(())),
            (Key, Named::Commit { commit: &c2, pins: &pins, trusted_signature: false }, Err("is not pinned")),
            (Cmd, Named::Commit { commit: &c2, pins: &pins, trusted_signature: false }, Err("named by --commit, and")),
        ];
        for (signer, named, want) in cases {
            let got = decide(signer, named).map_err(|e| e.to_string());
            match (&got, want) {
                (Ok(()), Ok(())) => {}
                (Err(msg), Err(part)) => assert!(msg.contains(part), "{named:?}: {msg}"),
                _ => panic!("{signer} {named:?}: got {got:?}, want {want:?}"),
            }
        }
    }
}
