//! Mirrors for disconnected sites, from a `registries.conf` (v2 format, as
//! containers/image reads it).
//!
//! ```toml
//! [[registry]]
//! prefix = "quay.io/openshift-release-dev"    # optional; default: location
//! location = "quay.io/openshift-release-dev"
//! insecure = false                             # plain HTTP for the primary
//! blocked = false
//! mirror-by-digest-only = false
//! [[registry.mirror]]
//! location = "mirror.internal:5000/ocp"
//! insecure = true                              # plain HTTP for this mirror
//! pull-from-mirror = "all"                     # or "digest-only", "tag-only"
//! ```
//!
//! The entry whose prefix matches the image name most specifically applies
//! (`*.example.com` wildcards match hosts and lose to any literal prefix).
//! The matched prefix is replaced by each mirror's location (and by the
//! entry's `location` for the primary). The endpoints are tried in order:
//! the usable mirrors, then the primary, as containers/image does. Prefixes
//! with a tag or digest, and the v1 format, are not supported. `insecure`
//! means plain HTTP here (containers/image would also accept unverified
//! TLS; we never do).

use super::reference::{split_name, Reference};
use serde::Deserialize;

/// A registries.conf is a few dozen entries.
pub const MAX_REGISTRIES_CONF_BYTES: u64 = 1 << 20;

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub struct RegistriesConf {
    #[serde(default)]
    registry: Vec<RegistryEntry>,
    /// Present only in the v1 format.
    #[serde(default)]
    registries: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct RegistryEntry {
    prefix: Option<String>,
    location: Option<String>,
    #[serde(default)]
    insecure: bool,
    #[serde(default)]
    blocked: bool,
    #[serde(default)]
    mirror_by_digest_only: bool,
    #[serde(default)]
    mirror: Vec<MirrorEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct MirrorEntry {
    location: String,
    #[serde(default)]
    insecure: bool,
    pull_from_mirror: Option<String>,
}

/// One place to pull from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `host[:port]`.
    pub registry: String,
    pub repository: String,
    /// Plain HTTP.
    pub insecure: bool,
    pub mirror: bool,
}

impl Endpoint {
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

impl RegistriesConf {
    /// Parses a registries.conf's text (the server reads the file:
    /// `source::mirrors::load`).
    pub fn parse(s: &str) -> Result<Self, String> {
        let conf: RegistriesConf =
            toml::from_str(s).map_err(|e| format!("invalid registries.conf: {e}"))?;
        if conf.registries.is_some() {
            return Err("the registries.conf v1 format ([registries.*]) is not supported; use [[registry]] tables".into());
        }
        for (i, r) in conf.registry.iter().enumerate() {
            let prefix = r.prefix.as_deref().or(r.location.as_deref());
            match prefix {
                None | Some("") => {
                    return Err(format!(
                        "[[registry]] #{}: needs a prefix or a location",
                        i + 1
                    ))
                }
                Some(p)
                    if p.starts_with("*.")
                        && r.location.as_deref().is_some_and(|l| !l.is_empty()) =>
                {
                    return Err(format!(
                        "[[registry]] #{}: a wildcard prefix {p:?} cannot have a location",
                        i + 1
                    ))
                }
                Some(p)
                    if p.contains('@')
                        || p.rsplit('/')
                            .next()
                            .is_some_and(|last| last.contains(':') && p.contains('/')) =>
                {
                    return Err(format!(
                        "[[registry]] #{}: prefix {p:?} with a tag or digest is not supported",
                        i + 1
                    ))
                }
                _ => {}
            }
            for m in &r.mirror {
                match m.pull_from_mirror.as_deref() {
                    None | Some("all" | "digest-only" | "tag-only") => {}
                    Some(other) => {
                        return Err(format!(
                            "[[registry]] #{}: mirror {:?}: pull-from-mirror = {other:?} (expected all, digest-only or tag-only)",
                            i + 1,
                            m.location
                        ))
                    }
                }
            }
        }
        Ok(conf)
    }

    /// How much of `registry/repository` the entry's prefix matches, if it
    /// does: (literal?, matched length).
    fn matches(prefix: &str, registry: &str, name: &str) -> Option<(bool, usize)> {
        if let Some(suffix) = prefix.strip_prefix("*.") {
            let host = registry.rsplit_once(':').map_or(registry, |(h, _)| h);
            return host
                .ends_with(&format!(".{suffix}"))
                .then_some((false, registry.len()));
        }
        let hit = name == prefix
            || (name.starts_with(prefix) && name.as_bytes().get(prefix.len()) == Some(&b'/'));
        hit.then_some((true, prefix.len()))
    }

    /// The endpoints to try for an image, in order. `insecure` lists the
    /// `host[:port]`s to reach over plain HTTP in any case.
    pub fn endpoints(
        &self,
        registry: &str,
        repository: &str,
        reference: &Reference,
        insecure: &[String],
    ) -> Result<Vec<Endpoint>, String> {
        let name = format!("{registry}/{repository}");
        let forced_insecure = |host: &str| insecure.iter().any(|h| h == host);
        let best = self
            .registry
            .iter()
            .filter_map(|r| {
                let prefix = r.prefix.as_deref().or(r.location.as_deref())?;
                Self::matches(prefix, registry, &name).map(|m| (m, r))
            })
            .max_by_key(|(m, _)| *m);
        let Some(((_, matched), entry)) = best else {
            return Ok(vec![Endpoint {
                registry: registry.to_owned(),
                repository: repository.to_owned(),
                insecure: forced_insecure(registry),
                mirror: false,
            }]);
        };
        if entry.blocked {
            return Err(format!("{name} is blocked by registries.conf"));
        }
        let rest = &name[matched..];
        let endpoint = |location: &str, insecure: bool, mirror: bool| -> Result<Endpoint, String> {
            let rewritten = format!("{}{rest}", location.trim_end_matches('/'));
            let (host, repo) =
                split_name(&rewritten, &rewritten).map_err(|e| format!("registries.conf: {e}"))?;
            let insecure = insecure || forced_insecure(&host);
            Ok(Endpoint {
                registry: host,
                repository: repo,
                insecure,
                mirror,
            })
        };
        let mut out = Vec::new();
        for m in &entry.mirror {
            let usable = match reference {
                Reference::Digest(_) => m.pull_from_mirror.as_deref() != Some("tag-only"),
                Reference::Tag(_) => {
                    !entry.mirror_by_digest_only
                        && m.pull_from_mirror.as_deref() != Some("digest-only")
                }
            };
            if usable {
                out.push(endpoint(&m.location, m.insecure, true)?);
            }
        }
        let primary = entry
            .location
            .as_deref()
            .filter(|l| !l.is_empty())
            .unwrap_or(&name[..matched]);
        out.push(endpoint(primary, entry.insecure, false)?);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONF: &str = r#"
unqualified-search-registries = ["registry.fedoraproject.org"]

[[registry]]
location = "quay.io"
insecure = false
[[registry.mirror]]
location = "m1.local:5000"
insecure = true
[[registry.mirror]]
location = "m2.local/quay"
pull-from-mirror = "digest-only"

[[registry]]
prefix = "quay.io/openshift-release-dev/ocp-release"
location = "quay.io/openshift-release-dev/ocp-release"
mirror-by-digest-only = true
[[registry.mirror]]
location = "mirror.internal:5000/ocp4/release"

[[registry]]
prefix = "*.blocked.io"
blocked = true

[[registry]]
location = "127.0.0.1:1"
insecure = true
[[registry.mirror]]
location = "127.0.0.1:2"
insecure = true
[[registry.mirror]]
location = "127.0.0.1:5000/"
"#;

    fn tag() -> Reference {
        Reference::Tag("1".into())
    }
    fn digest() -> Reference {
        Reference::Digest(format!("sha256:{}", "0".repeat(64)))
    }
    fn names(v: &[Endpoint]) -> Vec<String> {
        v.iter()
            .map(|e| format!("{}{}", if e.insecure { "http://" } else { "" }, e.name()))
            .collect()
    }

    #[test]
    fn endpoints_in_order() {
        let c = RegistriesConf::parse(CONF).unwrap();
        let e = c.endpoints("quay.io", "coreos/os", &tag(), &[]).unwrap();
        assert_eq!(
            names(&e),
            ["http://m1.local:5000/coreos/os", "quay.io/coreos/os"]
        );
        let e = c.endpoints("quay.io", "coreos/os", &digest(), &[]).unwrap();
        assert_eq!(
            names(&e),
            [
                "http://m1.local:5000/coreos/os",
                "m2.local/quay/coreos/os",
                "quay.io/coreos/os"
            ]
        );
        // The more specific prefix wins; it mirrors digests only.
        let e = c
            .endpoints("quay.io", "openshift-release-dev/ocp-release", &tag(), &[])
            .unwrap();
        assert_eq!(names(&e), ["quay.io/openshift-release-dev/ocp-release"]);
        let e = c
            .endpoints(
                "quay.io",
                "openshift-release-dev/ocp-release",
                &digest(),
                &[],
            )
            .unwrap();
        assert_eq!(
            names(&e),
            [
                "mirror.internal:5000/ocp4/release",
                "quay.io/openshift-release-dev/ocp-release"
            ]
        );
        // A prefix matches whole components only.
        let e = c
            .endpoints(
                "quay.io",
                "openshift-release-dev/ocp-release-x",
                &digest(),
                &[],
            )
            .unwrap();
        assert_eq!(
            e[0].name(),
            "m1.local:5000/openshift-release-dev/ocp-release-x"
        );
        // Unmatched registries go direct; forced-insecure hosts use HTTP.
        let e = c
            .endpoints("r.io:5000", "a", &tag(), &["r.io:5000".into()])
            .unwrap();
        assert_eq!(names(&e), ["http://r.io:5000/a"]);
        assert!(c
            .endpoints("x.blocked.io", "a", &tag(), &[])
            .unwrap_err()
            .contains("blocked"));
        let e = c.endpoints("127.0.0.1:1", "os", &tag(), &[]).unwrap();
        assert_eq!(
            names(&e),
            [
                "http://127.0.0.1:2/os",
                "127.0.0.1:5000/os",
                "http://127.0.0.1:1/os"
            ]
        );
    }

    #[test]
    fn rejects_bad_configs() {
        let cases = [
            ("[[registry]]\ninsecure = true\n", "prefix or a location"),
            ("[[registry]]\nprefix = \"*.x.io\"\nlocation = \"y.io\"\n", "wildcard"),
            ("[[registry]]\nlocation = \"x.io/a:tag\"\n", "tag or digest"),
            ("[registries.search]\nregistries = [\"x\"]\n", "v1 format"),
            ("[[registry]]\nlocation = \"x.io\"\n[[registry.mirror]]\nlocation = \"y.io\"\npull-from-mirror = \"some\"\n", "pull-from-mirror"),
            ("[[registry]\n", "invalid registries.conf"),
        ];
        for (conf, why) in cases {
            let e = RegistriesConf::parse(conf).unwrap_err();
            assert!(e.contains(why), "{conf}: {e}");
        }
    }
}
