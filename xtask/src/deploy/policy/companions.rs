//! The objects around the Deployment: ServiceAccount, Service, PDB,
//! NetworkPolicy, ServiceMonitor.

use super::contract::{Expect, PORT_NAME, SERVICE_PORT};
use super::lookup::labels_match;
use super::network_policy::check_network_policy;
use super::node_agent;
use super::report::{Report, Violation};
use crate::deploy::decode::Object;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// What the companions must fit: the server pods of one Deployment.
pub(super) struct Workload<'a> {
    /// `Deployment/NAME`, for findings about the set of objects.
    pub(super) id: &'a str,
    pub(super) pod_labels: &'a BTreeMap<String, String>,
    pub(super) service_account: &'a str,
    /// The container port the server listens on.
    pub(super) port: Option<i32>,
    pub(super) replicas: i32,
}

/// The objects around the Deployment: ServiceAccount, Service, PDB,
/// NetworkPolicy, ServiceMonitor.
pub(super) fn check_companions(
    objects: &[Object],
    w: &Workload<'_>,
    expect: &Expect,
    out: &mut Vec<Violation>,
) {
    let mut r = Report::new(out, w.id);
    check_service_account(objects, w.service_account, &mut r);
    let mut seen = BTreeMap::<&str, usize>::new();
    for o in objects {
        let mut r = Report::new(r.out, o.id());
        let kind = match o {
            Object::Service(s) => {
                check_service(s, w, &mut r);
                "Service"
            }
            Object::PodDisruptionBudget(p) => {
                check_pdb(p, w, &mut r);
                "PodDisruptionBudget"
            }
            // The node agent's own, checked with its DaemonSets.
            Object::NetworkPolicy(n) if node_agent::selects_agents(n) => continue,
            Object::NetworkPolicy(n) => {
                check_network_policy(n, w.pod_labels, w.port, expect, &mut r);
                "NetworkPolicy"
            }
            Object::ServiceMonitor(m) => {
                r.ensure(
                    labels_match(Some(&m.spec.selector), w.pod_labels)
                        && m.spec.endpoints.len() == 1
                        && m.spec.endpoints[0].port == PORT_NAME
                        && m.spec.endpoints[0].path.as_deref() == Some("/metrics"),
                    "service-monitor",
                    "must scrape /metrics on the Service's http port",
                );
                "ServiceMonitor"
            }
            _ => continue,
        };
        *seen.entry(kind).or_default() += 1;
    }
    check_counts(&seen, expect, &mut r);
}

/// The pods' ServiceAccount is rendered and mounts no token.
fn check_service_account(objects: &[Object], sa_name: &str, r: &mut Report<'_>) {
    let sa = objects.iter().find_map(|o| match o {
        Object::ServiceAccount(s) if s.metadata.name.as_deref() == Some(sa_name) => Some(s),
        _ => None,
    });
    r.ensure(
        sa.is_some_and(|s| s.automount_service_account_token == Some(false)),
        "service-account",
        format!(
            "ServiceAccount {sa_name} must be rendered, with automountServiceAccountToken false"
        ),
    );
}

/// A ClusterIP Service selecting the server pods, with one port onto the
/// server's.
fn check_service(s: &Service, w: &Workload<'_>, r: &mut Report<'_>) {
    let spec = s.spec.as_ref();
    r.ensure(
        spec.and_then(|s| s.type_.as_deref()).unwrap_or("ClusterIP") == "ClusterIP",
        "service",
        "type must be ClusterIP",
    );
    let sel = spec.and_then(|s| s.selector.clone()).unwrap_or_default();
    r.ensure(
        !sel.is_empty() && sel.iter().all(|(k, v)| w.pod_labels.get(k) == Some(v)),
        "service",
        "selector must select the server pods",
    );
    let port = w.port;
    let ports = spec.and_then(|s| s.ports.clone()).unwrap_or_default();
    let ok = ports.len() == 1
        && ports[0].name.as_deref() == Some(PORT_NAME)
        && ports[0].port == SERVICE_PORT
        && ports[0].protocol.as_deref().unwrap_or("TCP") == "TCP"
        && match &ports[0].target_port {
            Some(IntOrString::Int(n)) => Some(*n) == port,
            Some(IntOrString::String(n)) => n == PORT_NAME,
            None => false,
        };
    r.ensure(
        ok,
        "service",
        format!("one port {PORT_NAME:?} {SERVICE_PORT} -> the server's {port:?}"),
    );
}

/// A PDB selecting the server pods that lets a drain take one of them.
fn check_pdb(p: &PodDisruptionBudget, w: &Workload<'_>, r: &mut Report<'_>) {
    let spec = p.spec.as_ref();
    r.ensure(
        labels_match(spec.and_then(|s| s.selector.as_ref()), w.pod_labels),
        "pdb",
        "selector must select the server pods",
    );
    let min = match spec.and_then(|s| s.min_available.as_ref()) {
        Some(IntOrString::Int(n)) => Some(*n),
        _ => None,
    };
    let replicas = w.replicas;
    r.ensure(
        min.is_some_and(|m| m >= 1 && m < replicas),
        "pdb",
        format!("minAvailable must be in 1..{replicas}, is {min:?}"),
    );
}

/// Exactly one of each companion, and a ServiceMonitor only where its
/// component is included.
fn check_counts(seen: &BTreeMap<&str, usize>, expect: &Expect, r: &mut Report<'_>) {
    let mut want = vec!["Service", "PodDisruptionBudget", "NetworkPolicy"];
    if expect.service_monitor {
        want.push("ServiceMonitor");
    }
    for kind in want {
        r.ensure(
            seen.get(kind) == Some(&1),
            "companions",
            format!(
                "expected exactly one {kind}, found {}",
                seen.get(kind).unwrap_or(&0)
            ),
        );
    }
    if !expect.service_monitor {
        r.ensure(
            !seen.contains_key("ServiceMonitor"),
            "companions",
            "the ServiceMonitor is optional: only its component adds it",
        );
    }
}
