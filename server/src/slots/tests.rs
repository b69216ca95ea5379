//! Every rule of the table, a row each: a script of asks, renewals and
//! releases at given seconds, and what each must get.

use super::request::{self, BadRequest};
use super::*;
use std::net::Ipv4Addr;

/// What an ask must get.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    /// A new lease.
    New,
    /// The lease the node already holds, renewed.
    Again,
    Refused(Reason),
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// node, pool, control plane, the address's last octet, at second.
    Ask(&'static str, &'static str, bool, u8, u64, Want),
    /// node (its last lease), at second, whether the table knew it.
    Renew(&'static str, u64, bool),
    Release(&'static str, u64, bool),
}
use Step::{Ask as A, Release as Rel, Renew as Ren};
use Want::{Again, New, Refused};

/// A pool's counts at the end: in use, peak, grants, expiries, releases,
/// refusals by `Reason::ALL`.
type Counts = (&'static str, u32, u32, u64, u64, u64, [u64; 4]);

struct Case {
    name: &'static str,
    config: SlotConfig,
    steps: Vec<Step>,
    /// When the report is read.
    end: u64,
    pools: Vec<Counts>,
    unknown_pool_refusals: u64,
}

fn config(per_pool: u32, control_plane: u32, max_pools: u32, per_address: u32) -> SlotConfig {
    SlotConfig {
        per_pool,
        control_plane,
        ttl: Duration::from_secs(60),
        retry_after: Duration::from_secs(30),
        max_pools,
        per_address,
    }
}

// long-fn: the table of lease-table cases, one entry a case
fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "a pool holds at most per_pool leases",
            config: config(2, 1, 64, 10),
            steps: vec![
                A("a", "worker", false, 1, 0, New),
                A("b", "worker", false, 1, 0, New),
                A("c", "worker", false, 1, 0, Refused(Reason::Full)),
                A("d", "infra", false, 1, 0, New),
            ],
            end: 1,
            pools: vec![
                ("infra", 1, 1, 1, 0, 0, [0; 4]),
                ("worker", 2, 2, 2, 0, 0, [1, 0, 0, 0]),
            ],
            unknown_pool_refusals: 0,
        },
        Case {
            name: "a released slot is granted again, once",
            config: config(1, 1, 64, 10),
            steps: vec![
                A("a", "worker", false, 1, 0, New),
                A("b", "worker", false, 1, 1, Refused(Reason::Full)),
                Rel("a", 2, true),
                Rel("a", 3, false),
                Ren("a", 3, false),
                A("b", "worker", false, 1, 4, New),
            ],
            end: 5,
            pools: vec![("worker", 1, 1, 2, 0, 1, [1, 0, 0, 0])],
            unknown_pool_refusals: 0,
        },
        Case {
            name: "a node that died frees its slot after one TTL",
            config: config(1, 1, 64, 10),
            steps: vec![
                A("a", "worker", false, 1, 0, New),
                A("b", "worker", false, 1, 59, Refused(Reason::Full)),
                A("b", "worker", false, 1, 60, New),
                Ren("a", 61, false),
                Rel("a", 61, false),
            ],
            end: 61,
            pools: vec![("worker", 1, 1, 2, 1, 0, [1, 0, 0, 0])],
            unknown_pool_refusals: 0,
        },
        Case {
            name: "renewing keeps a slot past its first TTL",
            config: config(1, 1, 64, 10),
            steps: vec![
                A("a", "worker", false, 1, 0, New),
                Ren("a", 40, true),
                A("b", "worker", false, 1, 70, Refused(Reason::Full)),
                Ren("a", 90, true),
                A("b", "worker", false, 1, 149, Refused(Reason::Full)),
                A("b", "worker", false, 1, 150, New),
            ],
            end: 150,
            pools: vec![("worker", 1, 1, 2, 1, 0, [2, 0, 0, 0])],
            unknown_pool_refusals: 0,
        },
        Case {
            name: "a node asking again from its address gets its lease back, past every cap; from another, not",
            config: config(1, 1, 1, 1),
            steps: vec![
                A("a", "master", true, 1, 0, New),
                // Full, control plane, the address cap and the pool count
                // would each refuse a second lease.
                A("a", "master", true, 1, 30, Again),
                // From another address (a restarted pod, or a client that
                // names the node to learn its lease): refused, and the
                // lease is not extended, so it expires at 90.
                A("a", "master", true, 2, 45, Refused(Reason::Address)),
                A("b", "master", false, 3, 89, Refused(Reason::Full)),
                A("b", "master", false, 3, 90, New),
            ],
            end: 91,
            pools: vec![("master", 1, 1, 2, 1, 0, [1, 0, 0, 1])],
            unknown_pool_refusals: 0,
        },
        Case {
            name: "control-plane nodes stage one at a time across pools",
            config: config(8, 1, 64, 10),
            steps: vec![
                A("m1", "master", true, 1, 0, New),
                A("m2", "master", true, 2, 0, Refused(Reason::ControlPlane)),
                A("w1", "master", false, 3, 0, New),
                A("m3", "infra", true, 4, 0, Refused(Reason::ControlPlane)),
                Rel("m1", 1, true),
                A("m2", "master", true, 2, 2, New),
            ],
            end: 3,
            pools: vec![
                ("infra", 0, 0, 0, 0, 0, [0, 1, 0, 0]),
                ("master", 2, 2, 3, 0, 1, [0, 1, 0, 0]),
            ],
            unknown_pool_refusals: 0,
        },
        Case {
            name: "one address holds at most per_address leases",
            config: config(8, 1, 64, 2),
            steps: vec![
                A("a", "worker", false, 1, 0, New),
                A("b", "worker", false, 1, 0, New),
                A("c", "worker", false, 1, 0, Refused(Reason::Address)),
                A("c", "worker", false, 2, 0, New),
                Rel("a", 1, true),
                A("d", "worker", false, 1, 2, New),
            ],
            end: 3,
            pools: vec![("worker", 3, 3, 4, 0, 1, [0, 0, 0, 1])],
            unknown_pool_refusals: 0,
        },
        Case {
            name: "at most max_pools pools are known",
            config: config(8, 1, 2, 10),
            steps: vec![
                A("a", "p1", false, 1, 0, New),
                A("b", "p2", false, 1, 0, New),
                A("c", "p3", false, 1, 0, Refused(Reason::Pools)),
                A("d", "p1", false, 1, 0, New),
                // A pool stays known once its leases are gone.
                Rel("b", 1, true),
                A("c", "p3", false, 1, 2, Refused(Reason::Pools)),
            ],
            end: 3,
            pools: vec![("p1", 2, 2, 2, 0, 0, [0; 4]), ("p2", 0, 1, 1, 0, 1, [0; 4])],
            unknown_pool_refusals: 2,
        },
        Case {
            name: "the peak is the high-water mark",
            config: config(3, 1, 64, 10),
            steps: vec![
                A("a", "worker", false, 1, 0, New),
                A("b", "worker", false, 1, 0, New),
                A("c", "worker", false, 2, 0, New),
                Rel("a", 1, true),
                Rel("b", 1, true),
                A("d", "worker", false, 2, 2, New),
            ],
            end: 3,
            pools: vec![("worker", 2, 3, 4, 0, 2, [0; 4])],
            unknown_pool_refusals: 0,
        },
        Case {
            name: "an expired lease leaves the control-plane and address counts",
            config: config(8, 1, 64, 1),
            steps: vec![
                A("m1", "master", true, 1, 0, New),
                A("m2", "master", true, 1, 10, Refused(Reason::Address)),
                A("m2", "master", true, 2, 10, Refused(Reason::ControlPlane)),
                A("m2", "master", true, 1, 60, New),
            ],
            end: 61,
            pools: vec![("master", 1, 1, 2, 1, 0, [0, 1, 0, 1])],
            unknown_pool_refusals: 0,
        },
    ]
}

fn address(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, last))
}

#[test]
fn every_rule_of_the_table() {
    for case in cases() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut slots = Slots::new(case.config.clone());
        let mut drawn = 0u128;
        let mut held: HashMap<&str, LeaseId> = HashMap::new();
        for (i, step) in case.steps.iter().enumerate() {
            let what = format!("{}: step {i} {step:?}", case.name);
            match *step {
                A(node, pool, control_plane, last, s, want) => {
                    let ask = Ask {
                        node,
                        pool,
                        control_plane,
                        address: address(last),
                    };
                    let fresh = || {
                        drawn += 1;
                        drawn.to_be_bytes()
                    };
                    match (slots.grant(&ask, at(s), fresh, 0.5), want) {
                        (Ok(g), New) => {
                            assert!(!g.renewed, "{what}");
                            assert_eq!(g.pool, pool, "{what}");
                            assert_ne!(held.get(node), Some(&g.lease), "{what}: a new lease");
                            held.insert(node, g.lease);
                        }
                        (Ok(g), Again) => {
                            assert!(g.renewed, "{what}");
                            assert_eq!(held.get(node), Some(&g.lease), "{what}: the same lease");
                        }
                        (Err(r), Refused(reason)) => {
                            assert_eq!(r.reason(), reason, "{what}: {r}");
                            assert_eq!(r.retry_after(), Duration::from_secs(30), "{what}");
                        }
                        (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
                    }
                }
                Ren(node, s, known) => {
                    let got = slots.renew(held[node], at(s));
                    assert_eq!(got.is_some(), known, "{what}");
                    if let Some(ttl) = got {
                        assert_eq!(ttl, case.config.ttl, "{what}");
                    }
                }
                Rel(node, s, known) => {
                    let got = slots.release(held[node], at(s));
                    assert_eq!(got.is_some(), known, "{what}");
                    if let Some(e) = got {
                        assert_eq!(e.node, node, "{what}");
                    }
                }
            }
        }
        let report = slots.report(at(case.end));
        let got: Vec<Counts> = report
            .pools
            .iter()
            .map(|(name, s)| {
                let name = case
                    .pools
                    .iter()
                    .find(|p| p.0 == name)
                    .map_or("unexpected", |p| p.0);
                let c = (s.in_use, s.peak, s.grants, s.expiries, s.releases);
                (name, c.0, c.1, c.2, c.3, c.4, s.refusals)
            })
            .collect();
        assert_eq!(got, case.pools, "{}", case.name);
        assert_eq!(
            report.unknown_pool_refusals, case.unknown_pool_refusals,
            "{}",
            case.name
        );
        assert_eq!(report.per_pool, case.config.per_pool, "{}", case.name);
    }
}

#[test]
fn expiry_reports_whose_leases_ended() {
    let t0 = Instant::now();
    let mut slots = Slots::new(config(8, 1, 64, 10));
    let mut n = 0u8;
    for (node, pool, s) in [("a", "p", 0), ("b", "q", 10), ("c", "p", 20)] {
        let ask = Ask {
            node,
            pool,
            control_plane: false,
            address: address(1),
        };
        let fresh = || {
            n += 1;
            [n; 16]
        };
        slots
            .grant(&ask, t0 + Duration::from_secs(s), fresh, 0.0)
            .unwrap();
    }
    let gone = slots.expire(t0 + Duration::from_secs(70));
    let names: Vec<_> = gone
        .iter()
        .map(|e| (e.node.as_str(), e.pool.as_str()))
        .collect();
    assert_eq!(names, [("a", "p"), ("b", "q")]);
    assert!(slots.expire(t0 + Duration::from_secs(70)).is_empty());
}

#[test]
fn a_repeating_random_source_gets_no_second_lease_of_the_same_name() {
    let t0 = Instant::now();
    let mut slots = Slots::new(config(8, 1, 64, 10));
    let ask = |node| Ask {
        node,
        pool: "p",
        control_plane: false,
        address: address(1),
    };
    let first = slots.grant(&ask("a"), t0, || [7; 16], 0.0).unwrap();
    let refused = slots.grant(&ask("b"), t0, || [7; 16], 0.0).unwrap_err();
    assert_eq!(refused.reason(), Reason::Full);
    let mut fresh = [[7; 16], [7; 16], [8; 16]].into_iter();
    let second = slots
        .grant(&ask("b"), t0, || fresh.next().unwrap(), 0.0)
        .unwrap();
    assert_ne!(first.lease, second.lease);
}

#[test]
fn retry_after_is_jittered_within_half_to_one_and_a_half_times_the_base() {
    let cases: &[(u64, f64, u64)] = &[
        (30, 0.0, 15),
        (30, 0.5, 30),
        (30, 0.999_999, 44),
        (30, 1.0, 44),
        (30, -1.0, 15),
        (30, f64::NAN, 30),
        (30, f64::INFINITY, 44),
        (1, 0.0, 1),
        (1, 0.99, 1),
        (2, 0.0, 1),
        (2, 0.99, 2),
        (31, 0.0, 16),
        (31, 0.999_999, 46),
        (3600, 0.0, 1800),
        (3600, 0.999_999_9, 5399),
    ];
    for &(base, jitter, want) in cases {
        let got = retry_after(Duration::from_secs(base), jitter);
        assert_eq!(
            got,
            Duration::from_secs(want),
            "base {base}, jitter {jitter}"
        );
    }
    for base in 1..=120u64 {
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..1000 {
            let got = retry_after(Duration::from_secs(base), f64::from(i) / 1000.0).as_secs();
            let b = base as f64;
            assert!(got >= 1, "base {base}: {got}");
            assert!(
                (got as f64) >= 0.5 * b && (got as f64) < 1.5 * b,
                "base {base}: {got}"
            );
            seen.insert(got);
        }
        // Every whole second of the range is reached, none favoured away.
        let lo = base.div_ceil(2).max(1);
        let hi = (3 * base).div_ceil(2).max(2);
        assert_eq!(seen.len() as u64, hi - lo, "base {base}: {seen:?}");
    }
    let refused = {
        let mut slots = Slots::new(config(0, 1, 64, 10));
        let ask = Ask {
            node: "a",
            pool: "p",
            control_plane: false,
            address: address(1),
        };
        slots
            .grant(&ask, Instant::now(), || [1; 16], 0.0)
            .unwrap_err()
    };
    assert_eq!(refused.retry_after(), Duration::from_secs(15));
    assert_eq!(refused.held(), Held { in_use: 0, cap: 0 });
}

#[test]
fn lease_names_are_32_lowercase_hex_digits() {
    let id = LeaseId::from_bytes([0xab; 16]);
    assert_eq!(id.to_string(), "ab".repeat(16));
    let cases: &[(&str, bool)] = &[
        ("0123456789abcdef0123456789abcdef", true),
        ("0123456789ABCDEF0123456789abcdef", false),
        ("0123456789abcdef0123456789abcde", false),
        ("0123456789abcdef0123456789abcdef0", false),
        ("0123456789abcdef0123456789abcdeg", false),
        ("", false),
        ("0123456789abcdef0123456789abcd\u{e9}", false),
    ];
    for &(text, ok) in cases {
        let got = LeaseId::parse(text);
        assert_eq!(got.is_some(), ok, "{text:?}");
        if let Some(id) = got {
            assert_eq!(id.to_string(), text);
        }
    }
}

fn body(node: &str, pool: &str, control_plane: &str, digest: &str) -> String {
    format!(
        r#"{{"node": {node}, "pool": {pool}, "control_plane": {control_plane}, "digest": {digest}}}"#
    )
}

// long-fn: a table of request bodies, one row a field
#[test]
fn a_slot_request_is_checked_field_by_field() {
    let digest = format!("\"sha256:{}\"", "a".repeat(64));
    let long_node = format!(
        "\"{}.{}.{}.{}\"",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    let too_long_node = format!(
        "\"{}.{}.{}.{}\"",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(62)
    );
    let pool63 = format!("\"{}\"", "p".repeat(63));
    let pool64 = format!("\"{}\"", "p".repeat(64));
    let ok = |n: &str, p: &str| body(n, p, "false", &digest);
    // The body, and the start of the error (None: accepted).
    let cases: Vec<(String, Option<&str>)> = vec![
        (ok("\"worker-1.example.com\"", "\"worker\""), None),
        (ok(&long_node, "\"Pool_1.x-y\""), None),
        (ok("\"0\"", &pool63), None),
        (body("\"m\"", "\"master\"", "true", &digest), None),
        (ok(&too_long_node, "\"p\""), Some("node: 254 bytes")),
        (ok("\"\"", "\"p\""), Some("node: 0 bytes")),
        (ok("\"Node1\"", "\"p\""), Some("node: 'N'")),
        (ok("\"a_b\"", "\"p\""), Some("node: '_'")),
        (ok("\"-a\"", "\"p\""), Some("node: a dot-separated label")),
        (ok("\"a..b\"", "\"p\""), Some("node: a dot-separated label")),
        (ok("\"a.\"", "\"p\""), Some("node: a dot-separated label")),
        (ok("5", "\"p\""), Some("node: not a string")),
        (ok("\"a\"", "\"\""), Some("pool: 0 bytes")),
        (ok("\"a\"", &pool64), Some("pool: 64 bytes")),
        (ok("\"a\"", "\"a b\""), Some("pool: ' '")),
        (ok("\"a\"", "\"a/b\""), Some("pool: '/'")),
        (ok("\"a\"", "null"), Some("pool: not a string")),
        (
            body("\"a\"", "\"p\"", "\"yes\"", &digest),
            Some("control_plane: not true or false"),
        ),
        (
            body("\"a\"", "\"p\"", "1", &digest),
            Some("control_plane: not true or false"),
        ),
        (
            body(
                "\"a\"",
                "\"p\"",
                "false",
                &format!("\"sha256:{}\"", "a".repeat(63)),
            ),
            Some("digest: not"),
        ),
        (
            body(
                "\"a\"",
                "\"p\"",
                "false",
                &format!("\"sha256:{}\"", "A".repeat(64)),
            ),
            Some("digest: not"),
        ),
        (
            body(
                "\"a\"",
                "\"p\"",
                "false",
                &format!("\"sha512:{}\"", "a".repeat(64)),
            ),
            Some("digest: does not start"),
        ),
        (
            body("\"a\"", "\"p\"", "false", "7"),
            Some("digest: not a string"),
        ),
        ("{}".into(), Some("body: missing field `node`")),
        (
            r#"{"node": "a", "pool": "p", "control_plane": false}"#.into(),
            Some("body: missing field `digest`"),
        ),
        (
            format!(
                r#"{{"node": "a", "pool": "p", "control_plane": false, "digest": {digest}, "extra": 1}}"#
            ),
            Some("body: unknown field `extra`"),
        ),
        (
            format!(
                r#"{{"node": "a", "node": "b", "pool": "p", "control_plane": false, "digest": {digest}}}"#
            ),
            Some("body: duplicate field `node`"),
        ),
        ("[]".into(), Some("body: not a JSON object")),
        (
            r#"["a", "p", false, "sha256:0"]"#.into(),
            Some("body: not a JSON object"),
        ),
        ("nope".into(), Some("body: not a JSON object")),
        ("".into(), Some("body: not a JSON object")),
        (r#" {"node": "a""#.into(), Some("body: EOF while parsing")),
        (
            r#"{"node": "a", "pool": "p", "control_plane": false, "digest": "x", "#.into(),
            Some("body: "),
        ),
        (
            format!("{} trailing", ok("\"a\"", "\"p\"")),
            Some("body: trailing characters"),
        ),
    ];
    for (text, want) in cases {
        match (request::parse(text.as_bytes()), want) {
            (Ok(r), None) => {
                assert!(!r.node.is_empty() && !r.pool.is_empty(), "{text}");
            }
            (Err(e), Some(start)) => {
                let msg = e.to_string();
                assert!(
                    msg.starts_with(start),
                    "{text}: {msg:?} should start {start:?}"
                );
                let is_body = matches!(e, BadRequest::Body(_));
                assert_eq!(is_body, start.starts_with("body:"), "{text}: {e:?}");
            }
            (got, want) => panic!("{text}: got {got:?}, want {want:?}"),
        }
    }
}
