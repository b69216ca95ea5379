//! Image references on the command line: the transports our fixtures and
//! registries use, taken without signature verification (the images are
//! ours, and what is under test is the content, not containers' policy).

use anyhow::{bail, Context};
use ostree_ext::container::{ImageReference, OstreeImageReference, SignatureSource, Transport};

/// `oci:DIR[:TAG]`, `oci-archive:FILE[:TAG]` or `docker://HOST/REPO[:TAG|@DIGEST]`.
pub(crate) fn parse(s: &str) -> anyhow::Result<OstreeImageReference> {
    let imgref = ImageReference::try_from(s).with_context(|| format!("image reference {s:?}"))?;
    match imgref.transport {
        Transport::OciDir | Transport::OciArchive | Transport::Registry => {}
        other => bail!(
            "image reference {s:?}: transport {} is not supported here (oci:, oci-archive:, docker://)",
            other.serializable_name()
        ),
    }
    Ok(OstreeImageReference {
        sigverify: SignatureSource::ContainerPolicyAllowInsecure,
        imgref,
    })
}

/// The OCI layout directory of an `oci:DIR[:TAG]` reference, which
/// encapsulate writes into directly.
pub(crate) fn oci_dir(r: &OstreeImageReference) -> Option<&str> {
    (r.imgref.transport == Transport::OciDir).then(|| {
        r.imgref
            .name
            .split_once(':')
            .map_or(r.imgref.name.as_str(), |(d, _)| d)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        // (input, Ok(transport name, name) or Err(part of the message))
        type Case<'a> = (&'a str, Result<(&'a str, &'a str), &'a str>);
        let cases: &[Case] = &[
            ("oci:/tmp/x:v1", Ok(("oci", "/tmp/x:v1"))),
            ("oci:/tmp/x", Ok(("oci", "/tmp/x"))),
            (
                "oci-archive:/tmp/x.tar:v1",
                Ok(("oci-archive", "/tmp/x.tar:v1")),
            ),
            (
                "docker://127.0.0.1:5000/os:v1",
                Ok(("registry", "127.0.0.1:5000/os:v1")),
            ),
            ("docker:127.0.0.1:5000/os", Err("Missing //")),
            ("dir:/tmp/x", Err("not supported")),
            ("/tmp/x", Err("Missing ':'")),
            ("oci:", Err("empty name")),
        ];
        for (input, want) in cases {
            match (parse(input), want) {
                (Ok(r), Ok((t, n))) => {
                    assert_eq!(r.imgref.transport.serializable_name(), *t, "{input}");
                    assert_eq!(r.imgref.name, *n, "{input}");
                }
                (Err(e), Err(msg)) => assert!(format!("{e:#}").contains(msg), "{input}: {e:#}"),
                (got, _) => panic!("{input}: {got:?}"),
            }
        }
        assert_eq!(oci_dir(&parse("oci:/tmp/x:v1").unwrap()), Some("/tmp/x"));
        assert_eq!(oci_dir(&parse("docker://h/x:v1").unwrap()), None);
    }
}
