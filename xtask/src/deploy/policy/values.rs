//! Reading the strings the objects carry: quantities, image references and
//! the server's flags.

/// Bytes in a Kubernetes quantity with a binary or decimal suffix
/// (`64Mi`, `5Gi`, `1G`, `1000`); None for anything else.
pub fn quantity_bytes(q: &str) -> Option<u64> {
    const SUFFIXES: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (num, mult) = SUFFIXES
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
        .unwrap_or((q, 1));
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// An image reference pinned by digest, or by a tag other than `latest`.
pub fn pinned(image: &str) -> Result<(), String> {
    if image.is_empty() {
        return Err("empty image reference".into());
    }
    if let Some((_, digest)) = image.split_once('@') {
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        return if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(())
        } else {
            Err(format!("{image}: malformed digest"))
        };
    }
    // A tag is what follows the last ':' after the last '/' (a ':' before
    // it is a registry port).
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) => Err(format!("{image}: the tag `latest` is not a pin")),
        Some((_, tag)) if !tag.is_empty() => Ok(()),
        _ => Err(format!("{image}: no tag or digest")),
    }
}

pub use oscontent_testkit::deploy::server_flags;

/// Every value given to the flag `name`, in order.
pub(super) fn flag<'a>(flags: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    flags
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .collect()
}
