//! The contents of a containers `auth.json` or a docker `config.json`
//! (how a Kubernetes pull secret arrives): `auths` keys name a registry
//! (`quay.io`, `https://quay.io/v1/`) or, containers-style, a namespace or
//! repository (`quay.io/openshift`); entries are
//! `{"auth": base64(user:password)}`. Credential helpers and identity
//! tokens are not supported (such entries are skipped). Which files are
//! read, and the lookup, are the server's (`source::auth`).

use base64::Engine;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;

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

/// The credentials in one auth file, by normalized key; `path` names the
/// file in errors.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<HashMap<String, Credentials>, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
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
