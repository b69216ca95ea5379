//! What a remote URL may lead to, and what of it may be shown: redirects
//! stay within the origin the pull was pointed at (a hostile or hijacked
//! server must not send the node to a host the operator never named), and
//! credentials in the URL (`https://user:pass@host/`) never reach a log
//! line, an event or an error. Pure.

use reqwest::Url;

/// Redirects followed for one request at most.
pub const MAX_REDIRECTS: usize = 3;

/// Whether `to` has the scheme, host and port of `from` (ports compared
/// after defaults, so `http://h/` and `http://h:80/` are one origin).
pub fn same_origin(from: &Url, to: &Url) -> bool {
    from.scheme() == to.scheme()
        && from.host_str() == to.host_str()
        && from.port_or_known_default() == to.port_or_known_default()
}

/// Whether `url` can be a remote's: `http://` or `https://` and a host
/// (stock ostree's `file://`, `mirrorlist=` and metalinks are not served
/// over this client). The error shows the URL redacted.
pub fn check_remote_url(url: &str) -> anyhow::Result<()> {
    let shown = redact(url);
    if url.starts_with("mirrorlist=") {
        anyhow::bail!("remote URL {shown:?}: mirrorlists are not supported; give the mirror's URL");
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        anyhow::bail!("remote URL {shown:?} must start with http:// or https://");
    }
    match Url::parse(url) {
        Ok(u) if u.has_host() => Ok(()),
        Ok(_) => anyhow::bail!("remote URL {shown:?} has no host"),
        Err(e) => anyhow::bail!("remote URL {shown:?}: {e}"),
    }
}

/// The redirect policy of every client: within the origin, at most
/// [`MAX_REDIRECTS`] hops. Anything else fails the request (not retried:
/// the server would say the same again).
pub fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let Some(first) = attempt.previous().first() else {
            return attempt.follow();
        };
        if attempt.previous().len() > MAX_REDIRECTS {
            let n = attempt.previous().len();
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects ({n})"));
        }
        if same_origin(first, attempt.url()) {
            return attempt.follow();
        }
        let why = format!(
            "refusing a redirect from {} to another origin, {}",
            redact(first.as_str()),
            redact(attempt.url().as_str())
        );
        attempt.error(why)
    })
}

/// `url` with any user name and password replaced by `***`; text that is
/// not a URL is returned as it is, minus anything before an `@` in its
/// authority, so that a malformed URL's secret is not shown either.
pub fn redact(url: &str) -> String {
    // `u:pw@h/r` parses too, as scheme `u`: only URLs with a host are
    // taken as URLs here.
    if let Some(mut u) = Url::parse(url).ok().filter(Url::has_host) {
        if u.username().is_empty() && u.password().is_none() {
            return url.to_owned();
        }
        // Both setters fail only for URLs that cannot have credentials,
        // which the check above has excluded.
        let _ = u.set_username("***");
        let _ = u.set_password(None);
        let shown = u.to_string();
        // `Url` normalises (adds a trailing `/` to a bare host); keep the
        // caller's spelling otherwise.
        return if url.ends_with('/') || !shown.ends_with('/') {
            shown
        } else {
            shown.trim_end_matches('/').to_owned()
        };
    }
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..auth_end].rfind('@') {
        Some(at) if scheme.is_empty() => format!("***@{}", &rest[at + 1..]),
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins() {
        // (from, to, same origin)
        let cases = [
            ("http://h:8080/a", "http://h:8080/b/c", true),
            ("http://h/a", "http://h:80/b", true),
            ("https://h/a", "https://h:443/b", true),
            ("http://h/a", "https://h/a", false),
            ("http://h:8080/a", "http://h:8081/a", false),
            ("http://h/a", "http://evil/a", false),
            ("http://h/a", "http://h.evil/a", false),
            ("http://127.0.0.1:1/", "http://localhost:1/", false),
            ("http://u:p@h/a", "http://h/b", true),
        ];
        for (from, to, want) in cases {
            let (f, t) = (Url::parse(from).unwrap(), Url::parse(to).unwrap());
            assert_eq!(same_origin(&f, &t), want, "{from} -> {to}");
        }
    }

    #[test]
    fn remote_urls() {
        // (url, accepted, words the refusal must contain)
        let cases = [
            ("http://h:8080/repo", true, ""),
            ("https://u:pw@h/", true, ""),
            ("file:///srv/repo", false, "must start with http"),
            ("notaurl", false, "must start with http"),
            (
                "mirrorlist=http://h/list",
                false,
                "mirrorlists are not supported",
            ),
            ("http://", false, "http://"),
            ("http://h:99999/", false, "invalid port"),
        ];
        for (url, ok, words) in cases {
            match check_remote_url(url) {
                Ok(()) => assert!(ok, "{url} accepted"),
                Err(e) => {
                    assert!(!ok, "{url} refused: {e:#}");
                    let msg = format!("{e:#}");
                    assert!(msg.contains(words), "{url}: {msg}");
                    assert!(!msg.contains("pw"), "{msg}");
                }
            }
        }
    }

    #[test]
    fn redacts_credentials() {
        // (input, shown)
        let cases = [
            ("http://h:8080/repo", "http://h:8080/repo"),
            ("http://h:8080", "http://h:8080"),
            ("https://user:s3cret@h/repo", "https://***@h/repo"),
            ("https://user:s3cret@h", "https://***@h"),
            ("https://user:s3cret@h/", "https://***@h/"),
            ("https://token@h/x?y=1", "https://***@h/x?y=1"),
            ("http://u:p%40ss@h:1/r/summary", "http://***@h:1/r/summary"),
            // Not URLs (bad port): still no secret.
            ("http://u:s3cret@h:99999/r", "http://***@h:99999/r"),
            ("u:s3cret@h/r", "***@h/r"),
            ("no url at all", "no url at all"),
        ];
        for (input, want) in cases {
            let got = redact(input);
            assert_eq!(got, want, "{input}");
            assert!(!got.contains("s3cret") && !got.contains("p%40ss"), "{got}");
        }
    }
}
