//! Registry credentials from a containers `auth.json` or a docker
//! `config.json` (how a Kubernetes pull secret arrives).
//!
//! Files, first match wins (containers/image's order):
//! 1. `--authfile` if given (then only that file, and it must exist);
//! 2. else `$REGISTRY_AUTH_FILE` (likewise);
//! 3. else `$XDG_RUNTIME_DIR/containers/auth.json`,
//!    `$XDG_CONFIG_HOME/containers/auth.json` (`~/.config/…`) and
//!    `~/.docker/config.json`, each if it exists.
//!
//! Within a file, `auths` keys may name a registry (`quay.io`,
//! `https://quay.io/v1/`) or, containers-style, a namespace or repository
//! (`quay.io/openshift`); the most specific key matching the endpoint wins.
//! Entries are `{"auth": base64(user:password)}`. Credential helpers and
//! identity tokens are not supported (such entries are skipped).

use base64::Engine;
use serde::Deserialize;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// An auth file is a few entries; anything bigger is not one.
pub const MAX_AUTH_FILE_BYTES: u64 = 1 << 20;

/// A user name and password for one registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Debug, Deserialize)]
struct AuthFile {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
}

#[derive(Debug, Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
}

/// The parsed auth files, in lookup order.
#[derive(Debug, Default)]
pub struct AuthStore {
    files: Vec<(PathBuf, HashMap<String, Credentials>)>,
}

/// Strips a scheme and a docker-style `/v1/`/`/v2/` suffix from a key:
/// `https://index.docker.io/v1/` → `index.docker.io`.
fn normalize_key(k: &str) -> String {
    let (had_scheme, k) = match k
        .strip_prefix("https://")
        .or_else(|| k.strip_prefix("http://"))
    {
        Some(rest) => (true, rest),
        None => (false, k),
    };
    let k = k.trim_end_matches('/');
    if had_scheme {
        // Docker writes URLs; only the host part is meaningful.
        k.split('/').next().unwrap_or(k).to_owned()
    } else {
        k.to_owned()
    }
}

pub(super) fn parse(path: &Path, bytes: &[u8]) -> Result<HashMap<String, Credentials>, String> {
    let f: AuthFile = serde_json::from_slice(bytes)
        .map_err(|e| format!("{}: not valid JSON: {e}", path.display()))?;
    let mut out = HashMap::new();
    for (key, entry) in f.auths {
        let Some(auth) = entry.auth.filter(|a| !a.is_empty()) else {
            tracing::debug!(file = %path.display(), key, "auth entry without `auth` (credential helper or identity token): skipped");
            continue;
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|e| format!("{}: auths[{key:?}].auth is not base64: {e}", path.display()))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| format!("{}: auths[{key:?}].auth is not UTF-8", path.display()))?;
        let Some((u, p)) = decoded.split_once(':') else {
            return Err(format!(
                "{}: auths[{key:?}].auth is not base64(user:password)",
                path.display()
            ));
        };
        out.insert(
            normalize_key(&key),
            Credentials {
                username: u.to_owned(),
                password: p.to_owned(),
            },
        );
    }
    Ok(out)
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    let f = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    f.take(MAX_AUTH_FILE_BYTES + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_AUTH_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_AUTH_FILE_BYTES} bytes"),
        ));
    }
    Ok(buf)
}

impl AuthStore {
    /// Loads the auth files (see the module docs). An explicitly named file
    /// must exist and parse; default locations may be absent, but must parse
    /// if present.
    pub fn load(explicit: Option<&Path>) -> Result<Self, String> {
        let env = std::env::var_os("REGISTRY_AUTH_FILE")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let (required, candidates): (bool, Vec<PathBuf>) = match explicit
            .map(Path::to_path_buf)
            .or(env)
        {
            Some(p) => (true, vec![p]),
            None => {
                let mut v = Vec::new();
                if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
                    v.push(PathBuf::from(d).join("containers/auth.json"));
                }
                let home = std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from);
                match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
                    Some(d) => v.push(PathBuf::from(d).join("containers/auth.json")),
                    None => v.extend(home.iter().map(|h| h.join(".config/containers/auth.json"))),
                }
                v.extend(home.iter().map(|h| h.join(".docker/config.json")));
                (false, v)
            }
        };
        let mut files = Vec::new();
        for p in candidates {
            match read_bounded(&p) {
                Ok(bytes) => files.push((p.clone(), parse(&p, &bytes)?)),
                Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("reading auth file {}: {e}", p.display())),
            }
        }
        Ok(Self { files })
    }

    /// For tests: a store from in-memory files.
    #[cfg(test)]
    fn from_json(files: &[&str]) -> Self {
        let files = files
            .iter()
            .enumerate()
            .map(|(i, j)| {
                let p = PathBuf::from(format!("mem{i}"));
                let m = parse(&p, j.as_bytes()).unwrap();
                (p, m)
            })
            .collect();
        Self { files }
    }

    /// Credentials for `registry` (`host[:port]`) and `repository`: the most
    /// specific key in the first file that has any matching key.
    pub fn lookup(&self, registry: &str, repository: &str) -> Option<&Credentials> {
        let full = format!("{registry}/{repository}");
        for (_, map) in &self.files {
            let mut key = full.as_str();
            loop {
                if let Some(c) = map.get(key) {
                    return Some(c);
                }
                match key.rfind('/') {
                    Some(i) => key = &key[..i],
                    None => break,
                }
            }
            // Docker Hub's historic spellings.
            if registry == "docker.io" || registry == "registry-1.docker.io" {
                if let Some(c) = map.get("index.docker.io") {
                    return Some(c);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn most_specific_key_in_first_matching_file() {
        let f1 = format!(
            r#"{{"auths": {{"quay.io/org": {{"auth": "{}"}}, "quay.io/org/repo": {{"auth": "{}"}}, "other.io": {{}} }}}}"#,
            b64("org:1"),
            b64("repo:2")
        );
        let f2 = format!(
            r#"{{"auths": {{"https://quay.io/v1/": {{"auth": "{}"}}, "r.io:5000": {{"auth": "{}"}}}}, "credsStore": "x"}}"#,
            b64("host:3"),
            b64("port:4:with:colons")
        );
        let s = AuthStore::from_json(&[&f1, &f2]);
        let user = |r: &str, p: &str| {
            s.lookup(r, p)
                .map(|c| (c.username.clone(), c.password.clone()))
        };
        assert_eq!(
            user("quay.io", "org/repo"),
            Some(("repo".into(), "2".into()))
        );
        assert_eq!(
            user("quay.io", "org/repo2"),
            Some(("org".into(), "1".into()))
        );
        assert_eq!(user("quay.io", "else/x"), Some(("host".into(), "3".into())));
        assert_eq!(
            user("r.io:5000", "x"),
            Some(("port".into(), "4:with:colons".into()))
        );
        assert_eq!(user("r.io", "x"), None);
        assert_eq!(user("other.io", "x"), None);
    }

    #[test]
    fn rejects_malformed_files() {
        let p = Path::new("f");
        assert!(parse(p, b"not json")
            .unwrap_err()
            .contains("not valid JSON"));
        assert!(parse(p, br#"{"auths":{"a":{"auth":"!!"}}}"#)
            .unwrap_err()
            .contains("not base64"));
        let no_colon = format!(r#"{{"auths":{{"a":{{"auth":"{}"}}}}}}"#, b64("nocolon"));
        assert!(parse(p, no_colon.as_bytes())
            .unwrap_err()
            .contains("user:password"));
        assert!(parse(p, b"{}").unwrap().is_empty());
    }

    #[test]
    fn debug_redacts_password() {
        let c = Credentials {
            username: "u".into(),
            password: "secret".into(),
        };
        assert!(!format!("{c:?}").contains("secret"));
    }
}
