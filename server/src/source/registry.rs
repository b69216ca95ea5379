//! The registry side of the OCI distribution protocol (v2), pull only:
//! manifests and blobs over HTTP(S), with the Basic and Bearer-token
//! challenges.
//!
//! Runs on a blocking thread (reqwest's blocking client): the unpacker is
//! plain `Read`, and a blob's response body is read straight into it.
//!
//! Auth: requests go out anonymous; a 401 carries `WWW-Authenticate`.
//! `Basic` → retry with the credentials for that registry (and keep sending
//! them to it). `Bearer realm=…,service=…` → GET the realm with
//! `scope=repository:REPO:pull` (and the credentials, if any), then retry
//! with `Authorization: Bearer`; tokens are cached per registry and
//! repository, and a 401 later on (an expired token) renews once. Redirects
//! (blob storage on a CDN) are followed, never from https to http
//! (`crate::redirect`); reqwest drops `Authorization` when a redirect
//! leaves the host. Credentials never go to an `http://` token realm
//! unless the registry itself is plain HTTP.

use super::auth::{AuthStore, Credentials};
use super::error::{SourceError, Subject};
use super::mirrors::Endpoint;
use super::pipeline::{Root, Store};
use super::reference::Reference;
use super::verify;
use super::FetchOptions;
use std::collections::{HashMap, HashSet};
use std::io::Read;

/// Manifest media types we accept, most wanted first.
pub const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
     application/vnd.oci.image.manifest.v1+json, \
     application/vnd.docker.distribution.manifest.list.v2+json, \
     application/vnd.docker.distribution.manifest.v2+json";
/// A token response is a small JSON document.
const MAX_TOKEN_RESPONSE: u64 = 1 << 20;
/// How much of an error body goes into a message.
const MAX_ERROR_BODY: u64 = 4096;

/// One registry client for one fetch (all endpoints).
pub struct Client {
    http: reqwest::blocking::Client,
    auth: AuthStore,
    /// Bearer tokens by (registry, repository).
    tokens: HashMap<(String, String), String>,
    /// Registries that asked for Basic auth.
    basic: HashSet<String>,
}

#[derive(Debug)]
enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

fn parse_challenge(header: &str) -> Option<Challenge> {
    let parser = http_auth::parser::ChallengeParser::new(header);
    for c in parser.flatten() {
        if c.scheme.eq_ignore_ascii_case("bearer") {
            let get = |k: &str| {
                c.params
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(k))
                    .map(|(_, v)| v.to_unescaped())
            };
            if let Some(realm) = get("realm") {
                return Some(Challenge::Bearer {
                    realm,
                    service: get("service"),
                });
            }
        } else if c.scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
    }
    None
}

/// The `detail` of an error response: the registry's error codes and
/// messages, if it sent the usual JSON.
fn error_detail(resp: reqwest::blocking::Response) -> String {
    let mut body = Vec::new();
    let _ = resp.take(MAX_ERROR_BODY).read_to_end(&mut body);
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<ErrorItem>,
    }
    #[derive(serde::Deserialize)]
    struct ErrorItem {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Errors>(&body) {
        Ok(e) if !e.errors.is_empty() => {
            let items: Vec<String> = e
                .errors
                .iter()
                .map(|i| format!("{} {}", i.code, i.message))
                .collect();
            format!(" ({})", items.join("; "))
        }
        _ => String::new(),
    }
}

fn net_err(subject: &Subject, url: &str, e: reqwest::Error) -> SourceError {
    // The URL is in the message already.
    let e = e.without_url();
    let mut reason = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        reason = format!("{reason}: {s}");
        src = s.source();
    }
    SourceError::Network {
        subject: subject.clone(),
        url: url.to_owned(),
        reason,
    }
}

impl Client {
    pub fn new(opts: &FetchOptions, subject: &Subject) -> Result<Self, SourceError> {
        let config = |reason: String| SourceError::Config {
            subject: subject.clone(),
            reason,
        };
        let mut b = reqwest::blocking::Client::builder()
            .user_agent(concat!("oscontent-server/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(opts.connect_timeout)
            // The blocking client applies this to the response headers and
            // then to each read of the body: a stalled transfer fails.
            .timeout(opts.read_timeout)
            .redirect(crate::redirect::policy(crate::redirect::Rule::NoDowngrade));
        for ca in &opts.ca_files {
            let pem = std::fs::read(ca)
                .map_err(|e| config(format!("reading CA file {}: {e}", ca.display())))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| config(format!("CA file {}: {e}", ca.display())))?;
            if certs.is_empty() {
                return Err(config(format!(
                    "CA file {} has no PEM certificate",
                    ca.display()
                )));
            }
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        let http = b
            .build()
            .map_err(|e| config(format!("building the HTTP client: {e}")))?;
        let auth = AuthStore::load(opts.authfile.as_deref()).map_err(config)?;
        Ok(Self {
            http,
            auth,
            tokens: HashMap::new(),
            basic: HashSet::new(),
        })
    }

    fn base(ep: &Endpoint) -> String {
        format!(
            "{}://{}/v2/{}",
            if ep.insecure { "http" } else { "https" },
            ep.registry,
            ep.repository
        )
    }

    pub fn manifest_url(ep: &Endpoint, reference: &str) -> String {
        format!("{}/manifests/{reference}", Self::base(ep))
    }

    pub fn blob_url(ep: &Endpoint, digest: &str) -> String {
        format!("{}/blobs/{digest}", Self::base(ep))
    }

    fn creds(&self, ep: &Endpoint) -> Option<Credentials> {
        self.auth.lookup(&ep.registry, &ep.repository).cloned()
    }

    fn fetch_token(
        &mut self,
        ep: &Endpoint,
        realm: &str,
        service: Option<&str>,
        subject: &Subject,
    ) -> Result<(), SourceError> {
        let auth_err = |reason: String| SourceError::Auth {
            subject: subject.clone(),
            registry: ep.registry.clone(),
            reason,
        };
        let mut url = reqwest::Url::parse(realm)
            .map_err(|e| auth_err(format!("bad token realm {realm:?}: {e}")))?;
        let plain_ok = ep.insecure;
        match url.scheme() {
            "https" => {}
            "http" if plain_ok => {}
            s => {
                return Err(auth_err(format!(
                    "refusing token realm {realm:?} ({s}) for an HTTPS registry"
                )))
            }
        }
        {
            let mut q = url.query_pairs_mut();
            if let Some(s) = service {
                q.append_pair("service", s);
            }
            q.append_pair("scope", &format!("repository:{}:pull", ep.repository));
        }
        let mut req = self.http.get(url.clone());
        if let Some(c) = self.creds(ep) {
            req = req.basic_auth(c.username, Some(c.password));
        }
        let resp = req.send().map_err(|e| net_err(subject, url.as_str(), e))?;
        let status = resp.status();
        if !status.is_success() {
            let detail = error_detail(resp);
            if status.is_server_error() || status.as_u16() == 429 {
                return Err(SourceError::Http {
                    subject: subject.clone(),
                    url: url.to_string(),
                    status: status.as_u16(),
                    detail,
                });
            }
            return Err(auth_err(format!(
                "the token server {} answered {status}{detail}",
                url.origin().ascii_serialization()
            )));
        }
        let body = verify::read_bounded(
            resp,
            subject,
            url.as_str(),
            MAX_TOKEN_RESPONSE,
            "token response size",
        )?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body)
            .map_err(|e| auth_err(format!("bad token response: {e}")))?;
        let token = t
            .token
            .or(t.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| auth_err("token response without a token".into()))?;
        self.tokens
            .insert((ep.registry.clone(), ep.repository.clone()), token);
        Ok(())
    }

    /// GET `url` on `ep`, handling the auth challenges; returns a 2xx
    /// response (body unread).
    pub fn get(
        &mut self,
        ep: &Endpoint,
        url: &str,
        accept: Option<&str>,
        subject: &Subject,
    ) -> Result<reqwest::blocking::Response, SourceError> {
        let key = (ep.registry.clone(), ep.repository.clone());
        let mut renewed = false;
        loop {
            let mut req = self.http.get(url);
            if let Some(a) = accept {
                req = req.header(reqwest::header::ACCEPT, a);
            }
            if let Some(t) = self.tokens.get(&key) {
                req = req.bearer_auth(t);
            } else if self.basic.contains(&ep.registry) {
                if let Some(c) = self.creds(ep) {
                    req = req.basic_auth(c.username, Some(c.password));
                }
            }
            let resp = req.send().map_err(|e| net_err(subject, url, e))?;
            let status = resp.status();
            if status.is_success() {
                return Ok(resp);
            }
            let auth_err = |reason: String| SourceError::Auth {
                subject: subject.clone(),
                registry: ep.registry.clone(),
                reason,
            };
            match status.as_u16() {
                401 if !renewed => {
                    renewed = true;
                    let challenge = resp
                        .headers()
                        .get_all(reqwest::header::WWW_AUTHENTICATE)
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .find_map(parse_challenge);
                    match challenge {
                        Some(Challenge::Bearer { realm, service }) => {
                            self.tokens.remove(&key);
                            self.fetch_token(ep, &realm, service.as_deref(), subject)?;
                        }
                        Some(Challenge::Basic) => {
                            if self.creds(ep).is_none() {
                                return Err(auth_err(format!(
                                    "the registry wants credentials and the auth files have none for {}",
                                    ep.name()
                                )));
                            }
                            self.basic.insert(ep.registry.clone());
                        }
                        None => {
                            return Err(auth_err("401 without a Basic or Bearer challenge".into()))
                        }
                    }
                }
                401 | 403 => {
                    let had = if self.creds(ep).is_some() {
                        "credentials were rejected"
                    } else {
                        "no credentials found"
                    };
                    return Err(auth_err(format!(
                        "{status} for {url} ({had}){}",
                        error_detail(resp)
                    )));
                }
                404 => {
                    return Err(SourceError::NotFound {
                        subject: subject.clone(),
                        reason: format!("{url} answered 404{}", error_detail(resp)),
                    })
                }
                s => {
                    return Err(SourceError::Http {
                        subject: subject.clone(),
                        url: url.to_owned(),
                        status: s,
                        detail: error_detail(resp),
                    })
                }
            }
        }
    }
}

/// One endpoint (mirror or primary) of a registry image, as a [`Store`].
pub struct RegistryStore<'a> {
    pub client: &'a mut Client,
    pub endpoint: &'a Endpoint,
    pub reference: &'a Reference,
}

impl Store for RegistryStore<'_> {
    fn root(&mut self, subject: &Subject, opts: &FetchOptions) -> Result<Root, SourceError> {
        let subject = &Subject::new(
            subject.image.clone(),
            format!("manifest {}", self.reference.as_str()),
        );
        let url = Client::manifest_url(self.endpoint, self.reference.as_str());
        let resp = self
            .client
            .get(self.endpoint, &url, Some(MANIFEST_ACCEPT), subject)?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let media_type = header("content-type");
        let advertised = header("docker-content-digest");
        let bytes = verify::read_bounded(
            resp,
            subject,
            &url,
            opts.limits.max_manifest_bytes,
            "manifest size",
        )?;
        let digest = verify::sha256_digest(&bytes);
        if let Reference::Digest(want) = self.reference {
            if *want != digest {
                return Err(SourceError::DigestMismatch {
                    subject: subject.clone(),
                    expected: want.clone(),
                    actual: digest,
                });
            }
        }
        if let Some(adv) = advertised.filter(|a| a.starts_with("sha256:")) {
            if adv != digest {
                return Err(SourceError::DigestMismatch {
                    subject: Subject::new(
                        subject.image.clone(),
                        format!("{} (Docker-Content-Digest)", subject.object),
                    ),
                    expected: adv,
                    actual: digest,
                });
            }
        }
        Ok(Root::Document {
            bytes,
            digest,
            media_type,
        })
    }

    fn manifest(
        &mut self,
        digest: &str,
        size: u64,
        subject: &Subject,
        opts: &FetchOptions,
    ) -> Result<Vec<u8>, SourceError> {
        let url = Client::manifest_url(self.endpoint, digest);
        let resp = self
            .client
            .get(self.endpoint, &url, Some(MANIFEST_ACCEPT), subject)?;
        verify::read_small(
            resp,
            subject,
            &url,
            digest,
            size,
            opts.limits.max_manifest_bytes,
            "manifest size",
        )
    }

    fn blob(
        &mut self,
        digest: &str,
        subject: &Subject,
    ) -> Result<(Box<dyn Read + '_>, String), SourceError> {
        let url = Client::blob_url(self.endpoint, digest);
        let resp = self.client.get(self.endpoint, &url, None, subject)?;
        Ok((Box::new(resp), url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        let b = parse_challenge(
            r#"Bearer realm="https://auth.io/token",service="registry.io",scope="repository:a:pull""#,
        );
        match b {
            Some(Challenge::Bearer { realm, service }) => {
                assert_eq!(realm, "https://auth.io/token");
                assert_eq!(service.as_deref(), Some("registry.io"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_challenge(r#"Basic realm="x""#),
            Some(Challenge::Basic)
        ));
        assert!(matches!(
            parse_challenge(r#"Negotiate, Basic realm="x""#),
            Some(Challenge::Basic)
        ));
        assert!(parse_challenge("Bearer service=\"x\"").is_none());
        assert!(parse_challenge("garbage").is_none());
    }
}
