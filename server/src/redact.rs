//! URLs that may carry credentials (`--upstream http://user:secret@host/`,
//! a `mirror` source), kept whole for the requests that need them and
//! shown everywhere else (logs, error messages, a bundle's `source`) with
//! the userinfo and any query (where tokens travel) replaced by `***`.
//! A leaf: pure, no I/O.

use std::fmt;

/// What stands in for a secret.
pub const MASK: &str = "***";

/// A URL whose `Display` and `Debug` never show its userinfo or query.
/// [`RedactedUrl::expose`] is for building requests only.
#[derive(Clone, PartialEq, Eq)]
pub struct RedactedUrl(String);

impl RedactedUrl {
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL as given, credentials included: never log or store it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether showing it hides anything.
    pub fn has_secrets(&self) -> bool {
        redact(&self.0) != self.0
    }
}

impl std::str::FromStr for RedactedUrl {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::new(s))
    }
}

impl fmt::Display for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

impl fmt::Debug for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", redact(&self.0))
    }
}

/// `url` with the userinfo (before the authority's last `@`), the query
/// and the fragment each replaced by [`MASK`]. Text without `://` is
/// taken as all authority-less path and only its query is masked.
pub fn redact(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => (&url[..i + 3], &url[i + 3..]),
        None => ("", url),
    };
    // The authority ends at the first '/', '?' or '#'.
    let end = match scheme.is_empty() {
        true => 0,
        false => rest.find(['/', '?', '#']).unwrap_or(rest.len()),
    };
    let (authority, tail) = rest.split_at(end);
    let mut out = String::with_capacity(url.len());
    out.push_str(scheme);
    match authority.rfind('@') {
        Some(at) => {
            out.push_str(MASK);
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    match tail.find(['?', '#']) {
        Some(q) => {
            out.push_str(&tail[..q]);
            out.push_str(&tail[q..q + 1]);
            out.push_str(MASK);
        }
        None => out.push_str(tail),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_and_the_rest_kept() {
        let cases = [
            ("http://h:1/base/", "http://h:1/base/"),
            ("https://user:secret@h/repo", "https://***@h/repo"),
            ("http://user@h:8080/", "http://***@h:8080/"),
            ("http://a:b@c@h/x", "http://***@h/x"),
            ("http://u:p@[::1]:80/r", "http://***@[::1]:80/r"),
            ("http://h/x?token=secret", "http://h/x?***"),
            ("http://u:p@h?t=1#f", "http://***@h?***"),
            ("http://h/x#secret", "http://h/x#***"),
            ("http://h/a@b/c", "http://h/a@b/c"),
            ("http://u:p@h", "http://***@h"),
            ("not a url", "not a url"),
            ("", ""),
        ];
        for (url, want) in cases {
            assert_eq!(redact(url), want, "{url}");
            let r = RedactedUrl::new(url);
            assert_eq!(r.to_string(), want, "Display of {url}");
            assert_eq!(format!("{r:?}"), format!("{want:?}"), "Debug of {url}");
            assert_eq!(r.expose(), url);
            assert_eq!(r.has_secrets(), url != want, "{url}");
        }
    }
}
