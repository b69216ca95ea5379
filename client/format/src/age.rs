//! How old a commit is, compared: the CoreOS version order, the
//! downgrade decision, and which releases may become the newest a ref has
//! been. One home for the node client (a ref never moves back) and the
//! server (a refresh never publishes a rollback).

use std::cmp::Ordering;

/// Compares CoreOS-style dotted versions (`41.20250101.3.0`): components
/// split on `.`, numeric ones compared as numbers, others as text; a
/// numeric component sorts before a textual one; when one version is a
/// prefix of the other, the longer one is newer (`41.1` < `41.1.0`).
pub fn compare_versions(a: &str, b: &str) -> Ordering {
    let mut x = a.split('.');
    let mut y = b.split('.');
    loop {
        match (x.next(), y.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(p), Some(q)) => {
                let ord = match (p.parse::<u128>(), q.parse::<u128>()) {
                    (Ok(m), Ok(n)) => m.cmp(&n),
                    (Ok(_), Err(_)) => Ordering::Less,
                    (Err(_), Ok(_)) => Ordering::Greater,
                    (Err(_), Err(_)) => p.cmp(q),
                };
                if ord != Ordering::Equal {
                    return ord;
                }
            }
        }
    }
}

/// What a commit says about its age.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Age<'a> {
    pub timestamp: u64,
    pub version: Option<&'a str>,
}

impl Age<'_> {
    /// Which of two commits is newer: timestamp first, then version (a
    /// commit without one sorts before one with), so that picking the
    /// newest release agrees with [`downgrade_reason`].
    pub fn order(&self, other: &Age<'_>) -> Ordering {
        self.timestamp
            .cmp(&other.timestamp)
            .then_with(|| match (self.version, other.version) {
                (Some(a), Some(b)) => compare_versions(a, b),
                (a, b) => a.is_some().cmp(&b.is_some()),
            })
    }
}

/// Why a target is older than what the ref has now, or `None` if it is
/// not. A replay of an older, validly signed release is refused on either
/// signal: an older timestamp, or a lower version.
pub fn downgrade_reason(current: &Age<'_>, target: &Age<'_>) -> Option<String> {
    if target.timestamp < current.timestamp {
        return Some(format!(
            "target commit timestamp {} is older than the current commit's {}",
            target.timestamp, current.timestamp
        ));
    }
    if let (Some(cur), Some(tgt)) = (current.version, target.version) {
        if compare_versions(tgt, cur) == Ordering::Less {
            return Some(format!(
                "target version {tgt} is lower than the current version {cur}"
            ));
        }
    }
    None
}

/// [`downgrade_reason`] against the newest release a ref has been (its
/// mark), saying whether something vouched for that mark. An unverified
/// mark's timestamp was bounded when it was recorded ([`mark_refusal`]);
/// its version was not, so a forged `version: 9999` would hold back every
/// later release. It therefore holds back a lower-versioned target only
/// while the target is dated within `max_future_skew` of the mark; past
/// that, only the timestamps are compared. A verified mark's version
/// holds for good.
pub fn downgrade_reason_from(
    mark: &Age<'_>,
    mark_vouched: Vouched,
    target: &Age<'_>,
    max_future_skew: u64,
) -> Option<String> {
    let why = downgrade_reason(mark, target)?;
    // Not older: refused for its version alone.
    let version_only = target.timestamp >= mark.timestamp;
    let expired = target.timestamp.saturating_sub(mark.timestamp) > max_future_skew;
    if mark_vouched == Vouched::Unverified && version_only && expired {
        return None;
    }
    Some(why)
}

/// How far, by default, a release nothing vouches for may be dated ahead
/// of the local clock: a day covers a build machine's clock skew, and is
/// the longest one forged timestamp can hold back the releases after it.
pub const DEFAULT_MAX_FUTURE_SKEW: u64 = 24 * 60 * 60;

/// Whether something the operator trusts vouches for a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vouched {
    /// Its signature verified against trusted keys, or the operator
    /// pinned it (an image digest, a commit checksum).
    Verified,
    /// Whoever could write the source chose it.
    Unverified,
}

/// Why a release may not become the newest a ref has been (the mark every
/// later release is judged against by [`downgrade_reason`]), or `None` if
/// it may. A verified release may carry any date: the keys' owner chose
/// it. An unverified one dated more than `max_future_skew` seconds past
/// `now` is refused: recorded as the mark, it would make every honest
/// release until then look older, and so freeze the ref.
pub fn mark_refusal(
    target: &Age<'_>,
    vouched: Vouched,
    now: u64,
    max_future_skew: u64,
) -> Option<String> {
    let ahead = target.timestamp.saturating_sub(now);
    if vouched == Vouched::Verified || ahead <= max_future_skew {
        return None;
    }
    Some(format!(
        "commit timestamp {} is {ahead} s ahead of the local clock ({now}), more than the \
         {max_future_skew} s allowed for a release nothing verified (no trusted keys, not \
         pinned): as the newest release it would hold back every later one until then",
        target.timestamp
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use Ordering::*;

    #[test]
    fn version_order() {
        let cases = [
            ("41.20250101.3.0", "41.20250115.3.0", Less),
            ("41.20250115.3.0", "41.20250115.3.0", Equal),
            ("42.20240101.1.0", "41.20250101.3.0", Greater),
            ("41.20250101.3.10", "41.20250101.3.9", Greater),
            ("41.1", "41.1.0", Less),
            ("41.1.rc1", "41.1.1", Greater),
            ("41.a", "41.b", Less),
            ("9", "10", Less),
            ("", "", Equal),
        ];
        for (a, b, want) in cases {
            assert_eq!(compare_versions(a, b), want, "{a} vs {b}");
            assert_eq!(compare_versions(b, a), want.reverse(), "{b} vs {a}");
        }
    }

    #[test]
    fn newer_by_timestamp_then_version() {
        let age = |timestamp, version| Age { timestamp, version };
        let cases = [
            (age(1, Some("9")), age(2, Some("1")), Less),
            (age(2, Some("1")), age(1, Some("9")), Greater),
            (age(5, Some("41.9")), age(5, Some("41.10")), Less),
            (age(5, None), age(5, Some("1")), Less),
            (age(5, Some("1")), age(5, Some("1")), Equal),
            (age(5, None), age(5, None), Equal),
        ];
        for (a, b, want) in cases {
            assert_eq!(a.order(&b), want, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn downgrades() {
        let age = |timestamp, version| Age { timestamp, version };
        let cases = [
            (age(100, Some("41.2")), age(200, Some("41.3")), false),
            (age(100, Some("41.2")), age(100, Some("41.2")), false),
            (age(200, Some("41.2")), age(100, Some("41.3")), true),
            (age(100, Some("41.3")), age(200, Some("41.2")), true),
            (age(100, None), age(200, Some("1")), false),
            (age(100, Some("41.3")), age(200, None), false),
            (age(100, None), age(99, None), true),
        ];
        for (cur, tgt, refused) in cases {
            assert_eq!(
                downgrade_reason(&cur, &tgt).is_some(),
                refused,
                "{cur:?} -> {tgt:?}"
            );
        }
    }

    #[test]
    fn only_a_vouched_release_may_be_dated_far_ahead() {
        use Vouched::*;
        const NOW: u64 = 1_700_000_000;
        const DAY: u64 = DEFAULT_MAX_FUTURE_SKEW;
        let ten_years = NOW + 10 * 365 * DAY;
        let cases = [
            ("in the past", NOW - 1000, Unverified, false),
            ("now", NOW, Unverified, false),
            ("within the skew", NOW + DAY, Unverified, false),
            ("one second past the skew", NOW + DAY + 1, Unverified, true),
            ("ten years ahead", ten_years, Unverified, true),
            ("ten years ahead, verified", ten_years, Verified, false),
            ("the largest timestamp", u64::MAX, Unverified, true),
            ("the largest timestamp, verified", u64::MAX, Verified, false),
        ];
        for (what, timestamp, vouched, refused) in cases {
            let age = Age {
                timestamp,
                version: Some("41.1"),
            };
            let got = mark_refusal(&age, vouched, NOW, DAY);
            assert_eq!(got.is_some(), refused, "{what}: {got:?}");
        }
        let why = mark_refusal(
            &Age {
                timestamp: ten_years,
                version: None,
            },
            Unverified,
            NOW,
            DAY,
        )
        .unwrap();
        for want in [
            &ten_years.to_string(),
            "ahead of the local clock",
            "86400 s",
        ] {
            assert!(why.contains(want), "{why:?} lacks {want:?}");
        }
    }

    #[test]
    fn an_unverified_version_holds_back_only_within_the_skew() {
        use Vouched::*;
        const DAY: u64 = DEFAULT_MAX_FUTURE_SKEW;
        let age = |timestamp, version| Age { timestamp, version };
        let mark = age(1000, Some("9999"));
        let cases = [
            (
                "lower version, same second",
                age(1000, Some("41.1")),
                Unverified,
                true,
            ),
            (
                "lower version, within the skew",
                age(1000 + DAY, Some("41.1")),
                Unverified,
                true,
            ),
            (
                "lower version, past the skew",
                age(1001 + DAY, Some("41.1")),
                Unverified,
                false,
            ),
            (
                "lower version, past the skew, verified",
                age(1001 + DAY, Some("41.1")),
                Verified,
                true,
            ),
            (
                "older timestamp, unverified",
                age(999, Some("99999")),
                Unverified,
                true,
            ),
            (
                "older timestamp, long before",
                age(0, None),
                Unverified,
                true,
            ),
            ("newer in both", age(2000, Some("10000")), Unverified, false),
        ];
        for (what, target, vouched, refused) in cases {
            let got = downgrade_reason_from(&mark, vouched, &target, DAY);
            assert_eq!(got.is_some(), refused, "{what}: {got:?}");
        }
    }
}
