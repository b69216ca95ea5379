//! The invariants every rendering of deploy/ must keep, checked on the typed
//! objects: the hardened pod (for every pod template, every container), the
//! probes' meaning, the rollout, the Service, PDB and NetworkPolicy, that
//! every path the server is given is mounted, what each overlay is for, and
//! the node agent's DaemonSets.

mod autoscale;
mod companions;
mod contract;
mod lookup;
mod network_policy;
mod node_agent;
mod overlays;
mod pod_security;
mod report;
mod rollout;
mod server;
mod values;
mod wiring;

pub use contract::{
    Expect, Source, ALLOWED_EGRESS, EXTERNAL_SECRETS, HEALTH_PATH, INJECTED_CA_KEY,
    INJECT_CA_LABEL, OSCONTAINER_REPO, PORT_NAME, READY_PATH, SERVE, SERVER_CONTAINER,
    SERVICE_PORT,
};
pub use report::Violation;
pub use values::{pinned, quantity_bytes, server_flags};

use super::decode::Object;
use companions::Workload;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use report::Report;
use std::collections::BTreeMap;

/// Every violation in one rendering.
pub fn check(objects: &[Object], expect: &Expect) -> Vec<Violation> {
    let mut out = Vec::new();
    let config_maps: BTreeMap<&str, &ConfigMap> = objects
        .iter()
        .filter_map(|o| match o {
            Object::ConfigMap(c) => Some((c.metadata.name.as_deref().unwrap_or(""), c)),
            _ => None,
        })
        .collect();
    let deployments: Vec<&Deployment> = objects
        .iter()
        .filter_map(|o| match o {
            Object::Deployment(d) => Some(d),
            _ => None,
        })
        .collect();
    for o in objects {
        check_object(o, &mut Report::new(&mut out, o.id()));
    }
    Report::new(&mut out, "Deployment").ensure(
        deployments.len() == 1,
        "deployment",
        format!("expected one Deployment, found {}", deployments.len()),
    );
    for d in &deployments {
        check_deployment(d, objects, &config_maps, expect, &mut out);
    }
    node_agent::check_node_agents(objects, expect, &mut out);
    out
}

/// What holds for every object: a namespace of its own, and no secret
/// data in git.
fn check_object(o: &Object, r: &mut Report<'_>) {
    if !matches!(o, Object::Namespace(_)) {
        let ns = o.metadata().namespace.as_deref().unwrap_or("");
        r.ensure(
            !ns.is_empty() && ns != "default",
            "namespace",
            format!("namespace {ns:?}: set one, not the default"),
        );
    }
    if let Object::Secret(s) = o {
        r.ensure(
            s.data.as_ref().is_none_or(|d| d.is_empty())
                && s.string_data.as_ref().is_none_or(|d| d.is_empty()),
            "no-secret-data",
            "credentials never live in git: reference a Secret the operator creates",
        );
    }
}

/// The Deployment's rollout, its pod, its server container, what its
/// overlay is for, and the objects around it.
fn check_deployment(
    d: &Deployment,
    objects: &[Object],
    config_maps: &BTreeMap<&str, &ConfigMap>,
    expect: &Expect,
    out: &mut Vec<Violation>,
) {
    let id = format!(
        "Deployment/{}",
        d.metadata.name.as_deref().unwrap_or("<unnamed>")
    );
    let mut r = Report::new(out, id.clone());
    let Some(spec) = &d.spec else {
        r.fail("deployment", "no spec");
        return;
    };
    let pod_labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let replicas = autoscale::replicas(d, objects);
    rollout::check_rollout(spec, replicas, &pod_labels, &mut r);
    let Some(pod) = &spec.template.spec else {
        r.fail("pod", "no pod spec");
        return;
    };
    pod_security::check_pod(pod, &pod_labels, &mut r);
    let server = pod.containers.iter().find(|c| c.name == SERVER_CONTAINER);
    let Some(server) = server else {
        r.fail("server", format!("no container named {SERVER_CONTAINER:?}"));
        return;
    };
    rollout::check_progress_deadline(spec, server, &mut r);
    autoscale::check_autoscaling(d, pod, server, &pod_labels, objects, expect, &mut r);
    let port = server::check_server(server, pod, config_maps, expect, &mut r);
    overlays::check_source(server, pod, expect, &mut r);
    overlays::check_control_plane(pod, server, expect, &mut r);
    if expect.mirror {
        overlays::check_mirror(server, pod, config_maps, &mut r);
    }
    let workload = Workload {
        id: &id,
        pod_labels: &pod_labels,
        service_account: pod.service_account_name.as_deref().unwrap_or("default"),
        port,
        replicas,
    };
    companions::check_companions(objects, &workload, expect, r.out);
}

#[cfg(test)]
mod tests;
