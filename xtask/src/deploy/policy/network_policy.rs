//! The NetworkPolicy: it selects the server pods and allows ingress to the
//! server's port only and egress to DNS and registries only.

use super::contract::{Expect, Source, ALLOWED_EGRESS};
use super::lookup::labels_match;
use super::report::Report;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::{BTreeMap, BTreeSet};

/// Selects the server pods, restricts both directions, and lets traffic
/// through only on the ports the server needs.
pub(super) fn check_network_policy(
    n: &NetworkPolicy,
    pod_labels: &BTreeMap<String, String>,
    port: Option<i32>,
    expect: &Expect,
    r: &mut Report<'_>,
) {
    let Some(spec) = &n.spec else {
        r.fail("network-policy", "no spec");
        return;
    };
    r.ensure(
        labels_match(spec.pod_selector.as_ref(), pod_labels),
        "network-policy",
        "podSelector must select the server pods",
    );
    let types: BTreeSet<&str> = spec
        .policy_types
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    r.ensure(
        types == BTreeSet::from(["Ingress", "Egress"]),
        "network-policy",
        "policyTypes must be Ingress and Egress",
    );
    let ingress = spec.ingress.as_deref().unwrap_or(&[]);
    let ingress_ok = !ingress.is_empty()
        && port.is_some()
        && ingress.iter().all(|rule| {
            port_set(rule.ports.as_ref()).flatten()
                == Some(BTreeSet::from([("TCP".to_owned(), port.unwrap_or(0))]))
        });
    r.ensure(
        ingress_ok,
        "network-policy",
        format!("ingress must allow exactly TCP {port:?}"),
    );
    let egress = spec.egress.as_deref().unwrap_or(&[]);
    let allowed: BTreeSet<(String, i32)> = ALLOWED_EGRESS
        .iter()
        .map(|(p, n)| ((*p).to_owned(), *n))
        .collect();
    let egress_ok = egress.iter().all(|rule| {
        port_set(rule.ports.as_ref())
            .flatten()
            .is_some_and(|s| !s.is_empty() && s.is_subset(&allowed))
    });
    r.ensure(
        egress_ok,
        "network-policy",
        "egress only to DNS and registry ports, each rule naming its ports",
    );
    if expect.source != Source::Registry {
        r.ensure(
            egress.is_empty(),
            "network-policy",
            "the kubelet pulls the image: the pod needs no egress",
        );
    }
}

/// A rule's ports as (protocol, number): None when the rule names none,
/// Some(None) when one is a range or a name (never an exact match).
fn port_set(ports: Option<&Vec<NetworkPolicyPort>>) -> Option<Option<BTreeSet<(String, i32)>>> {
    ports.map(|ps| {
        ps.iter()
            .map(|p| {
                let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                match &p.port {
                    Some(IntOrString::Int(n)) if p.end_port.is_none() => Some((proto, *n)),
                    _ => None,
                }
            })
            .collect::<Option<BTreeSet<(String, i32)>>>()
    })
}
