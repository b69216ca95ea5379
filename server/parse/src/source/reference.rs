//! Image references (`docker://`, `oci:`, `oci-archive:`) and platforms.

use super::error::SourceError;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Longest repository name (distribution spec: 255 including the host).
const MAX_NAME: usize = 255;
/// Longest tag (distribution spec).
const MAX_TAG: usize = 128;

/// Where an oscontainer image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    /// `docker://HOST[:PORT]/REPO[:TAG|@sha256:DIGEST]` (no default
    /// registry: the host is always explicit; no tag means `latest`).
    Registry {
        registry: String,
        repository: String,
        reference: Reference,
    },
    /// `oci:DIR[:TAG]`: an OCI image layout directory.
    OciLayout { dir: PathBuf, tag: Option<String> },
    /// `oci-archive:FILE[:TAG]`: a tar of an OCI image layout.
    OciArchive { file: PathBuf, tag: Option<String> },
}

/// A tag or a digest within a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    Tag(String),
    /// `sha256:<64 hex>`: the manifest (or index) digest, verified.
    Digest(String),
}

impl Reference {
    /// The path segment in `/v2/<name>/manifests/<segment>`.
    pub fn as_str(&self) -> &str {
        match self {
            Reference::Tag(t) | Reference::Digest(t) => t,
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageRef::Registry {
                registry,
                repository,
                reference,
            } => {
                let sep = match reference {
                    Reference::Tag(_) => ':',
                    Reference::Digest(_) => '@',
                };
                write!(
                    f,
                    "docker://{registry}/{repository}{sep}{}",
                    reference.as_str()
                )
            }
            ImageRef::OciLayout { dir, tag } => {
                write!(f, "oci:{}", dir.display())?;
                tag.iter().try_for_each(|t| write!(f, ":{t}"))
            }
            ImageRef::OciArchive { file, tag } => {
                write!(f, "oci-archive:{}", file.display())?;
                tag.iter().try_for_each(|t| write!(f, ":{t}"))
            }
        }
    }
}

fn invalid(input: &str, reason: impl Into<String>) -> SourceError {
    SourceError::InvalidReference {
        input: input.to_owned(),
        reason: reason.into(),
    }
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`, the distribution path component.
pub fn valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// A host name, IPv4 address or `[IPv6]`, with an optional port.
pub fn valid_host(h: &str) -> bool {
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.is_empty()
            || !v6
                .bytes()
                .all(|x| x.is_ascii_hexdigit() || x == b':' || x == b'.')
        {
            return false;
        }
        match after {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(p) => ("x", Some(p)),
                None => return false,
            },
        }
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        }
    };
    let host_ok = !host.is_empty()
        && host.split('.').all(|l| {
            !l.is_empty()
                && l.bytes().all(|x| x.is_ascii_alphanumeric() || x == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.parse::<u16>().is_ok());
    host_ok && port_ok
}

/// Does the first component of a name look like a registry host (rather
/// than a Docker Hub namespace)? The usual rule: a dot, a port, or
/// `localhost`.
fn looks_like_host(c: &str) -> bool {
    c.contains('.') || c.contains(':') || c.starts_with('[') || c == "localhost"
}

pub fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_TAG
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&x| x.is_ascii_alphanumeric() || x == b'_' || x == b'.' || x == b'-')
}

/// `sha256:` and 64 lowercase hex digits: the only digest algorithm the
/// server verifies.
pub fn valid_sha256_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|x| x.is_ascii_digit() || (b'a'..=b'f').contains(&x))
    })
}

/// Checks a `HOST[:PORT]/REPO` name and splits it.
pub fn split_name(input: &str, name: &str) -> Result<(String, String), SourceError> {
    let Some((host, repo)) = name.split_once('/') else {
        if looks_like_host(name) {
            return Err(invalid(
                input,
                "expected HOST[:PORT]/REPOSITORY: no repository",
            ));
        }
        return Err(invalid(
            input,
            format!("expected HOST[:PORT]/REPOSITORY: {name:?} is not a registry host (write the registry explicitly, e.g. docker://quay.io/{name})"),
        ));
    };
    if !looks_like_host(host) {
        return Err(invalid(
            input,
            format!("{host:?} is not a registry host (write the registry explicitly, e.g. docker://quay.io/{name})"),
        ));
    }
    if !valid_host(host) {
        return Err(invalid(input, format!("invalid registry host {host:?}")));
    }
    if name.len() > MAX_NAME {
        return Err(invalid(
            input,
            format!("name longer than {MAX_NAME} characters"),
        ));
    }
    if let Some(bad) = repo.split('/').find(|c| !valid_path_component(c)) {
        return Err(invalid(
            input,
            format!("invalid repository component {bad:?} (lowercase letters, digits and . _ __ - separators)"),
        ));
    }
    Ok((host.to_owned(), repo.to_owned()))
}

fn parse_docker(input: &str, rest: &str) -> Result<ImageRef, SourceError> {
    let rest = rest
        .strip_prefix("//")
        .ok_or_else(|| invalid(input, "expected docker://HOST/REPO"))?;
    let (name_tag, digest) = match rest.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (rest, None),
    };
    // A tag is after the last ':' that follows the last '/'.
    let last_slash = name_tag.rfind('/').unwrap_or(0);
    let (name, tag) = match name_tag[last_slash..].rfind(':') {
        Some(i) => (
            &name_tag[..last_slash + i],
            Some(&name_tag[last_slash + i + 1..]),
        ),
        None => (name_tag, None),
    };
    let (registry, repository) = split_name(input, name)?;
    if let Some(t) = tag {
        if !valid_tag(t) {
            return Err(invalid(input, format!("invalid tag {t:?}")));
        }
    }
    let reference = match digest {
        Some(d) => {
            if !valid_sha256_digest(d) {
                return Err(invalid(
                    input,
                    format!("invalid digest {d:?} (expected sha256: and 64 lowercase hex digits)"),
                ));
            }
            // NAME:TAG@DIGEST pulls by digest, as containers/image does; the
            // tag is only decoration.
            Reference::Digest(d.to_owned())
        }
        None => Reference::Tag(tag.unwrap_or("latest").to_owned()),
    };
    Ok(ImageRef::Registry {
        registry,
        repository,
        reference,
    })
}

fn parse_local(input: &str, rest: &str) -> Result<(PathBuf, Option<String>), SourceError> {
    // As containers/image: the path ends at the first ':'.
    let (path, tag) = match rest.split_once(':') {
        Some((p, t)) => (p, Some(t)),
        None => (rest, None),
    };
    if path.is_empty() {
        return Err(invalid(input, "empty path"));
    }
    if let Some(t) = tag {
        if t.is_empty()
            || t.len() > MAX_NAME
            || t.chars().any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(invalid(input, format!("invalid tag {t:?}")));
        }
    }
    Ok((PathBuf::from(path), tag.map(str::to_owned)))
}

impl FromStr for ImageRef {
    type Err = SourceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("docker:") {
            parse_docker(s, rest)
        } else if let Some(rest) = s.strip_prefix("oci-archive:") {
            let (file, tag) = parse_local(s, rest)?;
            Ok(ImageRef::OciArchive { file, tag })
        } else if let Some(rest) = s.strip_prefix("oci:") {
            let (dir, tag) = parse_local(s, rest)?;
            Ok(ImageRef::OciLayout { dir, tag })
        } else {
            Err(invalid(s, "expected docker://HOST/REPO[:TAG|@sha256:DIGEST], oci:DIR[:TAG] or oci-archive:FILE[:TAG]"))
        }
    }
}

/// The platform to pick from an image index: `os/arch[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Default for Platform {
    fn default() -> Self {
        Self {
            os: "linux".into(),
            architecture: "amd64".into(),
            variant: None,
        }
    }
}

/// GOARCH names for the usual aliases.
pub fn normalize_arch(a: &str) -> &str {
    match a {
        "x86_64" | "x86-64" => "amd64",
        "aarch64" => "arm64",
        "i386" | "i686" => "386",
        a => a,
    }
}

impl FromStr for Platform {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok = |p: &str| {
            !p.is_empty()
                && p.bytes()
                    .all(|x| x.is_ascii_alphanumeric() || x == b'_' || x == b'-')
        };
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => {
                Ok(Platform { os: os.to_string(), architecture: normalize_arch(arch).to_owned(), variant: None })
            }
            [os, arch, v] if ok(os) && ok(arch) && ok(v) => Ok(Platform {
                os: os.to_string(),
                architecture: normalize_arch(arch).to_owned(),
                variant: Some(v.to_string()),
            }),
            _ => Err(format!("invalid platform {s:?}: expected OS/ARCH[/VARIANT], e.g. linux/amd64 or linux/arm/v7")),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        self.variant.iter().try_for_each(|v| write!(f, "/{v}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(r: &str, repo: &str, reference: Reference) -> ImageRef {
        ImageRef::Registry {
            registry: r.into(),
            repository: repo.into(),
            reference,
        }
    }

    #[test]
    fn parses_references() {
        let d = format!("sha256:{}", "a".repeat(64));
        let cases: Vec<(String, ImageRef)> = vec![
            (
                "docker://quay.io/os/rhcos:4.16".into(),
                reg("quay.io", "os/rhcos", Reference::Tag("4.16".into())),
            ),
            (
                "docker://127.0.0.1:5000/os".into(),
                reg("127.0.0.1:5000", "os", Reference::Tag("latest".into())),
            ),
            (
                "docker://localhost/a-b/c__d".into(),
                reg("localhost", "a-b/c__d", Reference::Tag("latest".into())),
            ),
            (
                format!("docker://r.io:443/os@{d}"),
                reg("r.io:443", "os", Reference::Digest(d.clone())),
            ),
            (
                format!("docker://r.io/os:1@{d}"),
                reg("r.io", "os", Reference::Digest(d.clone())),
            ),
            (
                "docker://[::1]:5000/os:x".into(),
                reg("[::1]:5000", "os", Reference::Tag("x".into())),
            ),
            (
                "oci:/tmp/lay".into(),
                ImageRef::OciLayout {
                    dir: "/tmp/lay".into(),
                    tag: None,
                },
            ),
            (
                "oci:/tmp/lay:4.16".into(),
                ImageRef::OciLayout {
                    dir: "/tmp/lay".into(),
                    tag: Some("4.16".into()),
                },
            ),
            (
                "oci-archive:x.tar:t".into(),
                ImageRef::OciArchive {
                    file: "x.tar".into(),
                    tag: Some("t".into()),
                },
            ),
        ];
        for (s, want) in cases {
            let got: ImageRef = s.parse().unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(got, want, "{s}");
            if !s.contains(":1@") {
                assert_eq!(
                    got.to_string().trim_end_matches(":latest"),
                    s.trim_end_matches(":latest")
                );
            }
        }
    }

    #[test]
    fn rejects_bad_references() {
        let cases = [
            ("docker://fedora:latest", "not a registry host"),
            ("docker://library/fedora", "not a registry host"),
            ("docker:quay.io/x", "expected docker://"),
            ("docker://quay.io", "no repository"),
            ("docker://quay.io/UPPER", "invalid repository component"),
            ("docker://quay.io/a//b", "invalid repository component"),
            ("docker://quay.io/a/../b", "invalid repository component"),
            ("docker://quay.io/a:b:c", "invalid repository component"),
            ("docker://quay.io/a:-x", "invalid tag"),
            ("docker://quay.io/a@sha256:abc", "invalid digest"),
            ("docker://quay.io/a@sha512:abc", "invalid digest"),
            ("docker://quay.io:99999/a", "invalid registry host"),
            ("oci:", "empty path"),
            ("oci::tag", "empty path"),
            ("oci:/x:", "invalid tag"),
            ("containers-storage:x", "expected docker://"),
            ("/some/dir", "expected docker://"),
        ];
        for (s, why) in cases {
            let e = s.parse::<ImageRef>().expect_err(s).to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn platforms() {
        assert_eq!(
            "linux/amd64".parse::<Platform>().unwrap(),
            Platform::default()
        );
        assert_eq!(
            "linux/x86_64".parse::<Platform>().unwrap(),
            Platform::default()
        );
        let p: Platform = "linux/arm/v7".parse().unwrap();
        assert_eq!(p.to_string(), "linux/arm/v7");
        for bad in ["linux", "linux/", "a/b/c/d", "linux/am d64"] {
            assert!(bad.parse::<Platform>().is_err(), "{bad}");
        }
    }
}
