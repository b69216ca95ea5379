//! The redirect policy of every HTTP client the server runs, in one
//! place: which `Location` a response may send a request on to.
//!
//! - [`Rule::SameOrigin`], the site server's `--upstream` (and `mirror`):
//!   an upstream is a directory of files; a redirect off its origin
//!   (scheme, host, port) would let a hijacked or hostile upstream point
//!   the mirror at a host the operator never named, so it is refused.
//! - [`Rule::NoDowngrade`], registries: a blob is routinely redirected to
//!   blob storage on another host (a CDN, S3), as containers/image
//!   follows, and the digest is verified whatever serves it. reqwest drops
//!   `Authorization` (and cookies) when a hop changes host or port, so
//!   credentials never reach the other origin; what it does not do is
//!   refuse `https` → `http` on the same host and port, which would send
//!   them in clear. That, and any scheme but the two, is refused.
//!
//! Errors name origins only (`scheme://host:port`), never a URL's user
//! name or password.

use reqwest::Url;

/// Redirects followed for one request at most.
pub const MAX_REDIRECTS: usize = 5;

/// Which redirects a client follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Only to the origin the request was first sent to.
    SameOrigin,
    /// Anywhere over `http(s)`, but never from `https` to `http`.
    NoDowngrade,
}

/// Whether a redirect from the hops in `previous` (the first request's
/// URL first) to `next` may be followed under `rule`; the error says why
/// not.
pub fn judge(rule: Rule, previous: &[Url], next: &Url) -> Result<(), String> {
    let (Some(first), Some(last)) = (previous.first(), previous.last()) else {
        return Ok(());
    };
    if previous.len() > MAX_REDIRECTS {
        return Err(format!(
            "more than {MAX_REDIRECTS} redirects from {}",
            origin(first)
        ));
    }
    if !matches!(next.scheme(), "http" | "https") {
        return Err(format!(
            "refusing a redirect from {} to a {}: URL",
            origin(last),
            next.scheme()
        ));
    }
    match rule {
        Rule::SameOrigin if next.origin() != first.origin() => Err(format!(
            "refusing a redirect from {} to another origin, {}",
            origin(first),
            origin(next)
        )),
        Rule::NoDowngrade
            if previous.iter().any(|u| u.scheme() == "https") && next.scheme() == "http" =>
        {
            Err(format!(
                "refusing a redirect from https to plain http ({} to {})",
                origin(last),
                origin(next)
            ))
        }
        _ => Ok(()),
    }
}

/// The policy a client is built with.
pub fn policy(rule: Rule) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        match judge(rule, attempt.previous(), attempt.url()) {
            Ok(()) => attempt.follow(),
            Err(why) => attempt.error(why),
        }
    })
}

/// `scheme://host:port`, without credentials or path.
fn origin(u: &Url) -> String {
    u.origin().ascii_serialization()
}

#[cfg(test)]
mod tests {
    use super::*;

    // long-fn: a table of redirects, one row a case
    #[test]
    fn redirects_are_judged() {
        use Rule::*;
        // (rule, hops so far, next, refusal says; None: followed)
        let cases: &[(Rule, &[&str], &str, Option<&str>)] = &[
            (
                SameOrigin,
                &["http://up:8080/summary"],
                "http://up:8080/moved/summary",
                None,
            ),
            (
                SameOrigin,
                &["http://up/summary"],
                "http://up:80/summary",
                None,
            ),
            (
                SameOrigin,
                &["http://up:8080/s"],
                "http://up:8081/s",
                Some("another origin, http://up:8081"),
            ),
            (
                SameOrigin,
                &["http://up/s"],
                "http://evil/s",
                Some("another origin"),
            ),
            (
                SameOrigin,
                &["http://up/s"],
                "https://up/s",
                Some("another origin, https://up"),
            ),
            (
                SameOrigin,
                &["https://up/s"],
                "http://up/s",
                Some("another origin"),
            ),
            (
                SameOrigin,
                &["http://u:secret@up/s"],
                "http://evil/s",
                Some("from http://up to"),
            ),
            (
                SameOrigin,
                &["http://up/s"],
                "file:///etc/passwd",
                Some("a file: URL"),
            ),
            (
                NoDowngrade,
                &["https://reg/v2/r/blobs/x"],
                "https://cdn.example/blob?sig=1",
                None,
            ),
            (
                NoDowngrade,
                &["http://reg:5000/v2/r/blobs/x"],
                "http://cdn:9000/b",
                None,
            ),
            (
                NoDowngrade,
                &["http://reg:5000/v2/r/blobs/x"],
                "https://cdn/b",
                None,
            ),
            (
                NoDowngrade,
                &["https://reg:5000/v2/r/blobs/x"],
                "http://reg:5000/b",
                Some("https to plain http"),
            ),
            (
                NoDowngrade,
                &["https://reg/b", "https://cdn/b"],
                "http://cdn2/b",
                Some("https to plain http"),
            ),
            (
                NoDowngrade,
                &["https://reg/b"],
                "ftp://cdn/b",
                Some("a ftp: URL"),
            ),
            (
                NoDowngrade,
                &[
                    "https://a/1",
                    "https://a/2",
                    "https://a/3",
                    "https://a/4",
                    "https://a/5",
                    "https://a/6",
                ],
                "https://a/7",
                Some("more than 5 redirects"),
            ),
        ];
        for (rule, hops, next, says) in cases {
            let hops: Vec<Url> = hops.iter().map(|u| Url::parse(u).unwrap()).collect();
            let got = judge(*rule, &hops, &Url::parse(next).unwrap());
            match (says, got) {
                (None, Ok(())) => {}
                (None, Err(e)) => panic!("{rule:?} {hops:?} -> {next}: refused: {e}"),
                (Some(s), Ok(())) => {
                    panic!("{rule:?} {hops:?} -> {next}: followed, expected {s:?}")
                }
                (Some(s), Err(e)) => {
                    assert!(e.contains(s), "{rule:?} -> {next}: {e}");
                    assert!(!e.contains("secret"), "credentials shown: {e}");
                }
            }
        }
    }
}
