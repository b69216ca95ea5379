//! The body of a slot request, parsed and checked, apart from any I/O:
//! `{"node": NAME, "pool": POOL, "control_plane": BOOL, "digest":
//! "sha256:<64 hex>"}`, nothing else. Every error names the field.

use serde::Deserialize;
use serde_json::Value;

/// The largest body read (`http::slots` refuses a longer one before it
/// holds it): four fields of at most a few hundred bytes.
pub const MAX_BODY: usize = 4096;
/// A Kubernetes node name is a DNS subdomain: at most 253 bytes.
pub const MAX_NODE: usize = 253;
pub const MAX_POOL: usize = 63;

/// A checked slot request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotRequest {
    pub node: String,
    pub pool: String,
    pub control_plane: bool,
    /// The image being staged: for the log only.
    pub digest: String,
}

/// What was wrong with a body; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// Not JSON, not an object, a field missing, unknown or repeated
    /// (serde's own words, which name the field).
    #[error("body: {0}")]
    Body(String),
    #[error("{field}: {why}")]
    Field { field: &'static str, why: String },
}

/// The fields by name, each value still unchecked: serde refuses unknown,
/// missing and repeated fields naming them, which a map would not.
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a JSON object with node, pool, control_plane and digest"
)]
struct Fields {
    node: Value,
    pool: Value,
    control_plane: Value,
    digest: Value,
}

/// Parses and checks a slot request's body.
pub fn parse(body: &[u8]) -> Result<SlotRequest, BadRequest> {
    // serde also reads a struct from an array of its values.
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(BadRequest::Body("not a JSON object".into()));
    }
    let f: Fields = serde_json::from_slice(body).map_err(|e| BadRequest::Body(e.to_string()))?;
    let node = text(f.node, "node")?;
    check("node", node_name(&node))?;
    let pool = text(f.pool, "pool")?;
    check("pool", pool_name(&pool))?;
    let Value::Bool(control_plane) = f.control_plane else {
        return Err(field("control_plane", "not true or false"));
    };
    let digest = text(f.digest, "digest")?;
    check("digest", image_digest(&digest))?;
    Ok(SlotRequest {
        node,
        pool,
        control_plane,
        digest,
    })
}

fn field(field: &'static str, why: impl Into<String>) -> BadRequest {
    BadRequest::Field {
        field,
        why: why.into(),
    }
}

fn text(v: Value, name: &'static str) -> Result<String, BadRequest> {
    match v {
        Value::String(s) => Ok(s),
        _ => Err(field(name, "not a string")),
    }
}

fn check(name: &'static str, r: Result<(), String>) -> Result<(), BadRequest> {
    r.map_err(|why| field(name, why))
}

/// A Kubernetes node name: a lowercase RFC 1123 DNS subdomain, 1 to 253
/// bytes of dot-separated labels of `a-z0-9-`, each starting and ending
/// with a letter or digit.
pub fn node_name(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > MAX_NODE {
        return Err(format!("{} bytes, not 1 to {MAX_NODE}", s.len()));
    }
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if let Some(c) = s
        .chars()
        .find(|&c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'))
    {
        return Err(format!(
            "{c:?} is not a lowercase letter, digit, '-' or '.'"
        ));
    }
    let bad_label = s.split('.').any(|l| {
        let b = l.as_bytes();
        b.first().is_none_or(|&c| !alnum(c)) || b.last().is_none_or(|&c| !alnum(c))
    });
    if bad_label {
        return Err(
            "a dot-separated label is empty or starts or ends with something other than a letter or digit"
                .into(),
        );
    }
    Ok(())
}

/// A pool name: 1 to 63 bytes of `A-Za-z0-9._-`.
pub fn pool_name(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > MAX_POOL {
        return Err(format!("{} bytes, not 1 to {MAX_POOL}", s.len()));
    }
    match s
        .chars()
        .find(|&c| !(c.is_ascii_alphanumeric() || "._-".contains(c)))
    {
        Some(c) => Err(format!("{c:?} is not a letter, digit, '.', '_' or '-'")),
        None => Ok(()),
    }
}

/// `sha256:` and 64 lowercase hex digits.
pub fn image_digest(s: &str) -> Result<(), String> {
    let hex = s
        .strip_prefix("sha256:")
        .ok_or("does not start with \"sha256:\"")?;
    let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    if hex.len() != 64 || !hex.bytes().all(lower_hex) {
        return Err("not \"sha256:\" and 64 lowercase hex digits".into());
    }
    Ok(())
}
