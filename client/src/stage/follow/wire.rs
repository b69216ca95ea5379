//! The staging-slot contract, the agent's side, pure: the names it sends
//! (node, pool), the lease it is given, the request body, and a response
//! (status, `Retry-After`, body) read into a [`SlotAnswer`]. The I/O is
//! `slots.rs`.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Where the server hands out slots, below the remote's base URL.
pub const SLOTS_PATH: &str = "oscontent/v1/stage/slots";
/// The longest slot response body read; the contract's are a few dozen bytes.
pub const MAX_ANSWER_SIZE: usize = 16 << 10;
/// The longest TTL believed: the contract's `--stage-lease-ttl` ends at an
/// hour. A longer one would leave the renewer idle past the server's real
/// TTL, so it is refused as a broken answer.
pub const MAX_TTL: Duration = Duration::from_secs(3600);

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{flag} {value:?}: must be 1 to {max} bytes, not {len}")]
    Length {
        flag: &'static str,
        value: String,
        len: usize,
        max: usize,
    },
    #[error("{flag} {value:?}: {what} only, not {bad:?}")]
    Character {
        flag: &'static str,
        value: String,
        what: &'static str,
        bad: char,
    },
}

fn check_name(
    flag: &'static str,
    value: &str,
    max: usize,
    what: &'static str,
    ok: fn(char) -> bool,
) -> Result<(), NameError> {
    if value.is_empty() || value.len() > max {
        return Err(NameError::Length {
            flag,
            value: value.to_owned(),
            len: value.len(),
            max,
        });
    }
    match value.chars().find(|c| !ok(*c)) {
        Some(bad) => Err(NameError::Character {
            flag,
            value: value.to_owned(),
            what,
            bad,
        }),
        None => Ok(()),
    }
}

/// `--node`: a Kubernetes node name (a lowercase DNS subdomain's characters).
pub fn check_node(s: &str) -> Result<(), NameError> {
    check_name("--node", s, 253, "a-z, 0-9, '.' and '-'", |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-'
    })
}

/// `--pool`: a machine config pool's name, as the server accepts it.
pub fn check_pool(s: &str) -> Result<(), NameError> {
    check_name("--pool", s, 63, "A-Z, a-z, 0-9, '.', '_' and '-'", |c| {
        c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
    })
}

/// A lease the server granted: 32 lowercase hex digits, checked before it
/// is put in a URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease(String);

impl Lease {
    pub fn parse(s: &str) -> Option<Self> {
        (s.len() == 32 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
            .then(|| Lease(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `POST …/stage/slots`.
#[derive(Debug, Clone, Serialize)]
pub struct SlotRequest<'a> {
    pub node: &'a str,
    pub pool: &'a str,
    pub control_plane: bool,
    pub digest: &'a str,
}

#[derive(Debug, Deserialize)]
struct Granted {
    lease: String,
    ttl_secs: u64,
}

#[derive(Debug, Deserialize)]
struct Refusal {
    error: Option<String>,
    retry_after_secs: Option<u64>,
    in_use: Option<u64>,
    slots: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Renewed {
    ttl_secs: u64,
}

/// What the server said to a slot request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotAnswer {
    Granted {
        lease: Lease,
        ttl: Duration,
    },
    /// 429: the pool (or the control plane, the pool count, this address)
    /// is full; ask again later.
    Refused {
        retry_after: Option<Duration>,
        reason: String,
        in_use: Option<u64>,
        slots: Option<u64>,
    },
    /// 404: the server hands out no slots.
    NoSlots,
}

/// A slot answer the contract does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("the server refused the slot request: HTTP {status}: {message}")]
    Status { status: u16, message: String },
    #[error("the server's slot answer (HTTP {status}) is not what the contract allows: {why}")]
    Malformed { status: u16, why: String },
}

fn ttl(status: u16, secs: u64) -> Result<Duration, AnswerError> {
    let t = Duration::from_secs(secs);
    if secs == 0 || t > MAX_TTL {
        return Err(AnswerError::Malformed {
            status,
            why: format!("ttl_secs {secs} is not within 1 to {}", MAX_TTL.as_secs()),
        });
    }
    Ok(t)
}

/// The `{"error": …}` of an error body, or the body itself, shortened.
fn error_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct E {
        error: String,
    }
    match serde_json::from_slice::<E>(body) {
        Ok(e) => e.error.chars().take(200).collect(),
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
    }
}

/// The answer to `POST …/stage/slots`. `retry_after` is the header, already
/// parsed; the body's `retry_after_secs` stands in when the header is absent.
pub fn slot_answer(
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
) -> Result<SlotAnswer, AnswerError> {
    let malformed = |why: String| AnswerError::Malformed { status, why };
    match status {
        200 => {
            let g: Granted =
                serde_json::from_slice(body).map_err(|e| malformed(format!("body: {e}")))?;
            let lease = Lease::parse(&g.lease)
                .ok_or_else(|| malformed(format!("lease {:?} is not 32 hex digits", g.lease)))?;
            Ok(SlotAnswer::Granted {
                lease,
                ttl: ttl(status, g.ttl_secs)?,
            })
        }
        429 => {
            let r: Option<Refusal> = serde_json::from_slice(body).ok();
            let r = r.unwrap_or(Refusal {
                error: None,
                retry_after_secs: None,
                in_use: None,
                slots: None,
            });
            Ok(SlotAnswer::Refused {
                retry_after: retry_after.or(r.retry_after_secs.map(Duration::from_secs)),
                reason: r.error.unwrap_or_else(|| "no slot free".to_owned()),
                in_use: r.in_use,
                slots: r.slots,
            })
        }
        404 => Ok(SlotAnswer::NoSlots),
        _ => Err(AnswerError::Status {
            status,
            message: error_message(body),
        }),
    }
}

/// The answer to a renewal: the new TTL, `None` for 404 (the lease is gone).
pub fn renew_answer(status: u16, body: &[u8]) -> Result<Option<Duration>, AnswerError> {
    match status {
        200 => {
            let r: Renewed = serde_json::from_slice(body).map_err(|e| AnswerError::Malformed {
                status,
                why: format!("body: {e}"),
            })?;
            Ok(Some(ttl(status, r.ttl_secs)?))
        }
        404 => Ok(None),
        _ => Err(AnswerError::Status {
            status,
            message: error_message(body),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: &str = "0123456789abcdef0123456789abcdef";

    type Check = fn(&str) -> Result<(), NameError>;
    /// A renewal's TTL in seconds, `None` for a lease gone, `Err` refused.
    type RenewWant = Result<Option<u64>, ()>;

    #[test]
    fn names() {
        let long_node = "a".repeat(254);
        let long_pool = "p".repeat(64);
        let table: [(Check, &str, bool); 12] = [
            (check_node, "worker-0.example.com", true),
            (check_node, "a", true),
            (check_node, &long_node[..253], true),
            (check_node, &long_node, false),
            (check_node, "", false),
            (check_node, "Worker-0", false),
            (check_node, "node_1", false),
            (check_pool, "worker", true),
            (check_pool, "Infra_1.x-y", true),
            (check_pool, &long_pool, false),
            (check_pool, "", false),
            (check_pool, "a/b", false),
        ];
        for (check, name, ok) in table {
            assert_eq!(check(name).is_ok(), ok, "{name:?}");
        }
        let e = check_node("Worker").unwrap_err().to_string();
        assert!(e.contains("--node") && e.contains("'W'"), "{e}");
        let e = check_pool("").unwrap_err().to_string();
        assert!(e.contains("--pool") && e.contains("1 to 63"), "{e}");
    }

    #[test]
    fn leases() {
        for (s, ok) in [
            (LEASE, true),
            ("0123456789ABCDEF0123456789abcdef", false),
            ("0123456789abcdef", false),
            ("../../0123456789abcdef0123456789a", false),
            ("", false),
        ] {
            assert_eq!(Lease::parse(s).is_some(), ok, "{s:?}");
        }
    }

    #[test]
    fn slot_answers() {
        let lease = Lease::parse(LEASE).unwrap();
        let granted = format!(r#"{{"lease":"{LEASE}","ttl_secs":60,"pool":"worker"}}"#);
        let ttl_zero = granted.replace("60", "0");
        let ttl_long = granted.replace("60", "86400");
        let full = r#"{"error":"pool worker is full","retry_after_secs":7,"pool":"worker","in_use":2,"slots":2}"#;
        let s = Duration::from_secs;
        type Want = Result<SlotAnswer, &'static str>;
        let refused = |ra, reason: &str, in_use, slots| SlotAnswer::Refused {
            retry_after: ra,
            reason: reason.to_owned(),
            in_use,
            slots,
        };
        let table: Vec<(u16, Option<Duration>, &str, Want)> = vec![
            (
                200,
                None,
                &granted,
                Ok(SlotAnswer::Granted {
                    lease: lease.clone(),
                    ttl: s(60),
                }),
            ),
            (200, None, r#"{"lease":"zz","ttl_secs":60}"#, Err("lease")),
            (200, None, &ttl_zero, Err("ttl_secs 0")),
            (200, None, &ttl_long, Err("ttl_secs 86400")),
            (200, None, "not json", Err("body")),
            (
                429,
                Some(s(3)),
                full,
                Ok(refused(Some(s(3)), "pool worker is full", Some(2), Some(2))),
            ),
            (
                429,
                None,
                full,
                Ok(refused(Some(s(7)), "pool worker is full", Some(2), Some(2))),
            ),
            (429, None, "", Ok(refused(None, "no slot free", None, None))),
            (404, None, "", Ok(SlotAnswer::NoSlots)),
            (
                400,
                None,
                r#"{"error":"node: too long"}"#,
                Err("node: too long"),
            ),
            (500, None, "oops", Err("HTTP 500: oops")),
        ];
        for (status, ra, body, want) in table {
            let got = slot_answer(status, ra, body.as_bytes());
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, w, "{status} {body}"),
                (Err(e), Err(w)) => assert!(e.to_string().contains(w), "{status} {body}: {e}"),
                (g, w) => panic!("{status} {body}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn renew_answers() {
        let table: [(u16, &str, RenewWant); 5] = [
            (200, r#"{"ttl_secs":5}"#, Ok(Some(5))),
            (404, r#"{"error":"lease expired or unknown"}"#, Ok(None)),
            (200, r#"{"ttl_secs":0}"#, Err(())),
            (200, "{}", Err(())),
            (503, "", Err(())),
        ];
        for (status, body, want) in table {
            let got = renew_answer(status, body.as_bytes())
                .map(|t| t.map(|t| t.as_secs()))
                .map_err(|_| ());
            assert_eq!(got, want, "{status} {body}");
        }
    }
}
