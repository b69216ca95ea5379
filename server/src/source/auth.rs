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
//!
//! The file format is parsed in `oscontent-parse` (what the fuzz targets
//! build); this module finds and reads the files.

pub use oscontent_parse::source::auth::{parse, Credentials, MAX_AUTH_FILE_BYTES};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The parsed auth files, in lookup order.
#[derive(Debug, Default)]
pub struct AuthStore {
    files: Vec<(PathBuf, HashMap<String, Credentials>)>,
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
    use base64::Engine;

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
}
