//! The node-agent component (`deploy/components/node-agent`): two
//! DaemonSets running `oscontent stage --follow`, one for workers and one
//! for control-plane nodes. Its pods write the host repo, so they are root,
//! which the server's hardened-pod rules refuse; these rules say what it
//! may have instead: the host repo and nothing else of the host, only the
//! capabilities a bare repo write needs, and the flags that make it follow
//! verified content with the node's own name.

use super::lookup::mount_of;
use super::pod_security::{check_no_exec_probes, check_pod_isolation, check_resources};
use super::report::{Report, Violation};
use super::Expect;
use crate::deploy::decode::Object;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The agent's container name.
pub const AGENT_CONTAINER: &str = "agent";
/// The client binary in the image.
pub const AGENT_COMMAND: &str = "/usr/bin/oscontent";
/// The host repo: the one hostPath an agent mounts, where it mounts it.
pub const HOST_REPO: &str = "/sysroot/ostree/repo";
/// What writing a bare repo's objects needs (deploy/components/node-agent/
/// daemonset-workers.yaml says why each).
pub const AGENT_CAPABILITIES: &[&str] = &["CHOWN", "FOWNER", "FSETID", "DAC_OVERRIDE", "SETFCAP"];
/// The agents' pod label (`app.kubernetes.io/name`).
pub const AGENT_NAME: &str = "oscontent-node-agent";
/// Where an agent may connect: DNS, and the server pods' port.
pub const AGENT_EGRESS: &[(&str, i32)] = &[
    ("UDP", 53),
    ("TCP", 53),
    ("UDP", 5353),
    ("TCP", 5353),
    ("TCP", 8080),
];
/// The taint a control-plane DaemonSet must tolerate.
pub const CONTROL_PLANE_TAINT: &str = "node-role.kubernetes.io/control-plane";

/// Every DaemonSet of a rendering: none without the component, the two
/// agents with it.
pub(super) fn check_node_agents(objects: &[Object], expect: &Expect, out: &mut Vec<Violation>) {
    let sets: Vec<&DaemonSet> = objects
        .iter()
        .filter_map(|o| match o {
            Object::DaemonSet(d) => Some(d),
            _ => None,
        })
        .collect();
    let mut r = Report::new(out, "DaemonSet");
    let want = if expect.node_agent { 2 } else { 0 };
    r.ensure(
        sets.len() == want,
        "node-agent",
        format!(
            "expected {want} node-agent DaemonSets, found {}",
            sets.len()
        ),
    );
    let control_planes = sets.iter().filter(|d| tolerates_control_plane(d)).count();
    r.ensure(
        want == 0 || control_planes == 1,
        "node-agent",
        format!("expected one DaemonSet for control-plane nodes, found {control_planes}"),
    );
    for d in sets {
        let id = format!(
            "DaemonSet/{}",
            d.metadata.name.as_deref().unwrap_or("<unnamed>")
        );
        check_agent(d, &mut Report::new(r.out, id));
    }
    check_agent_network(objects, expect, r.out);
}

/// With the component, one NetworkPolicy selects the agents; without it,
/// none.
fn check_agent_network(objects: &[Object], expect: &Expect, out: &mut Vec<Violation>) {
    let policies: Vec<&NetworkPolicy> = objects
        .iter()
        .filter_map(|o| match o {
            Object::NetworkPolicy(n) if selects_agents(n) => Some(n),
            _ => None,
        })
        .collect();
    let mut r = Report::new(out, "NetworkPolicy");
    let want = usize::from(expect.node_agent);
    r.ensure(
        policies.len() == want,
        "node-agent-network",
        format!(
            "expected {want} NetworkPolicy selecting the agents, found {}",
            policies.len()
        ),
    );
    for n in policies {
        check_agent_network_policy(n, metrics_ports(objects), &mut r);
    }
}

/// Whether a NetworkPolicy is the agents' (it selects their pods).
pub(super) fn selects_agents(n: &NetworkPolicy) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.pod_selector.as_ref())
        .and_then(|s| s.match_labels.as_ref())
        .and_then(|l| l.get("app.kubernetes.io/name"))
        .is_some_and(|v| v == AGENT_NAME)
}

/// The agents' declared container ports.
fn metrics_ports(objects: &[Object]) -> Vec<i32> {
    objects
        .iter()
        .filter_map(|o| match o {
            Object::DaemonSet(d) => pod_of(d),
            _ => None,
        })
        .flat_map(|p| p.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| p.container_port)
        .collect()
}

fn port_of(p: &NetworkPolicyPort) -> (String, Option<i32>) {
    let proto = p.protocol.clone().unwrap_or_else(|| "TCP".to_owned());
    let n = match &p.port {
        Some(IntOrString::Int(n)) => Some(*n),
        _ => None,
    };
    (proto, n)
}

/// Every rule names ports, and each is one `allowed` accepts.
fn only_ports<T>(
    rules: &[T],
    ports: impl Fn(&T) -> Option<&Vec<NetworkPolicyPort>>,
    allowed: impl Fn(&str, i32) -> bool,
) -> bool {
    rules.iter().all(|rule| {
        ports(rule).is_some_and(|ps| {
            !ps.is_empty()
                && ps.iter().all(|p| {
                    let (proto, port) = port_of(p);
                    port.is_some_and(|n| allowed(&proto, n))
                })
        })
    })
}

/// Both directions restricted: in, only the metrics port; out, only DNS
/// and the server.
fn check_agent_network_policy(n: &NetworkPolicy, metrics: Vec<i32>, r: &mut Report<'_>) {
    let Some(spec) = &n.spec else {
        r.fail("node-agent-network", "no spec");
        return;
    };
    let types: Vec<&str> = spec
        .policy_types
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    r.ensure(
        types.contains(&"Ingress") && types.contains(&"Egress"),
        "node-agent-network",
        "policyTypes must be Ingress and Egress",
    );
    let ingress = spec.ingress.as_deref().unwrap_or(&[]);
    r.ensure(
        only_ports(
            ingress,
            |x| x.ports.as_ref(),
            |proto, n| proto == "TCP" && metrics.contains(&n),
        ),
        "node-agent-network",
        "ingress only to the agents' metrics port",
    );
    let egress = spec.egress.as_deref().unwrap_or(&[]);
    r.ensure(
        !egress.is_empty()
            && only_ports(
                egress,
                |x| x.ports.as_ref(),
                |proto, n| AGENT_EGRESS.contains(&(proto, n)),
            ),
        "node-agent-network",
        format!("egress only to {AGENT_EGRESS:?} (DNS and the server)"),
    );
}

fn tolerates_control_plane(d: &DaemonSet) -> bool {
    pod_of(d)
        .and_then(|p| p.tolerations.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key.as_deref() == Some(CONTROL_PLANE_TAINT))
        })
}

fn pod_of(d: &DaemonSet) -> Option<&PodSpec> {
    d.spec.as_ref().and_then(|s| s.template.spec.as_ref())
}

/// `--flag=value` and bare `--flag` (value empty) of the agent's args.
fn flags(c: &Container) -> Vec<(String, String)> {
    c.args
        .iter()
        .flatten()
        .filter_map(|a| a.strip_prefix("--"))
        .map(|f| match f.split_once('=') {
            Some((k, v)) => (k.to_owned(), v.to_owned()),
            None => (f.to_owned(), String::new()),
        })
        .collect()
}

fn check_agent(d: &DaemonSet, r: &mut Report<'_>) {
    let Some(pod) = pod_of(d) else {
        r.fail("node-agent", "no pod spec");
        return;
    };
    check_pod_isolation(pod, r);
    check_host_paths(pod, r);
    let Some(c) = pod.containers.iter().find(|c| c.name == AGENT_CONTAINER) else {
        r.fail(
            "node-agent",
            format!("no container named {AGENT_CONTAINER:?}"),
        );
        return;
    };
    check_agent_privileges(c, pod, r);
    check_resources(c, r);
    check_no_exec_probes(c, r);
    check_agent_flags(c, pod, tolerates_control_plane(d), r);
}

/// The host repo, as a directory that must exist, is the only hostPath.
fn check_host_paths(pod: &PodSpec, r: &mut Report<'_>) {
    for v in pod.volumes.iter().flatten() {
        let Some(h) = &v.host_path else { continue };
        r.ensure(
            h.path.trim_end_matches('/') == HOST_REPO && h.type_.as_deref() == Some("Directory"),
            "host-path",
            format!(
                "volume {}: hostPath {} (type {:?}); only {HOST_REPO}, type Directory",
                v.name, h.path, h.type_
            ),
        );
    }
}

/// Root, but not privileged, no escalation, a read-only root, seccomp,
/// every capability dropped but [`AGENT_CAPABILITIES`].
fn check_agent_privileges(c: &Container, pod: &PodSpec, r: &mut Report<'_>) {
    let sc = c.security_context.as_ref();
    let psc = pod.security_context.as_ref();
    r.ensure(
        sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        "privilege-escalation",
        "agent: allowPrivilegeEscalation must be false",
    );
    r.ensure(
        sc.and_then(|s| s.read_only_root_filesystem) == Some(true),
        "read-only-root",
        "agent: readOnlyRootFilesystem must be true",
    );
    r.ensure(
        sc.and_then(|s| s.privileged) != Some(true),
        "privileged",
        "agent: privileged",
    );
    let seccomp = sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or(psc.and_then(|p| p.seccomp_profile.as_ref()))
        .map(|p| p.type_.as_str());
    r.ensure(
        seccomp == Some("RuntimeDefault"),
        "seccomp",
        format!("agent: seccompProfile must be RuntimeDefault, is {seccomp:?}"),
    );
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let drop_all = caps
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|x| x == "ALL"));
    let extra: Vec<&String> = caps
        .and_then(|c| c.add.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| !AGENT_CAPABILITIES.contains(&a.as_str()))
        .collect();
    r.ensure(
        drop_all && extra.is_empty(),
        "capabilities",
        format!(
            "agent: capabilities must drop ALL and add only {AGENT_CAPABILITIES:?}, adds {extra:?}"
        ),
    );
}

/// `stage --follow` on the host repo it mounts, verified with keys it
/// mounts, as the node it runs on, with its metrics on the port it names;
/// a control-plane agent says so and stages in the background.
fn check_agent_flags(c: &Container, pod: &PodSpec, control_plane: bool, r: &mut Report<'_>) {
    let command = c.command.as_deref().unwrap_or(&[]);
    r.ensure(
        command == [AGENT_COMMAND],
        "node-agent",
        format!("agent: command {command:?} must be [{AGENT_COMMAND}]"),
    );
    let args = c.args.as_deref().unwrap_or(&[]);
    r.ensure(
        args.len() >= 2 && args[0] == "stage" && args[1] == "--follow",
        "node-agent",
        "agent: args must start with `stage --follow`",
    );
    let f = flags(c);
    let flag = |k: &str| f.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    r.ensure(
        flag("repo") == Some(HOST_REPO)
            && mount_of(c, pod, HOST_REPO).is_some_and(|(_, v, rel)| {
                rel.is_empty() && v.is_some_and(|v| v.host_path.is_some())
            }),
        "node-agent",
        format!("agent: --repo={HOST_REPO} must be the hostPath mounted there"),
    );
    let keys = flag("trusted-keys").filter(|k| !k.is_empty());
    r.ensure(
        keys.is_some_and(|k| mount_of(c, pod, k).is_some_and(|(m, _, _)| m.read_only == Some(true))),
        "node-agent",
        "agent: --trusted-keys must name a file of a read-only mount (--follow verifies what the server names)",
    );
    let node_name = c.env.iter().flatten().find(|e| e.name == "NODE_NAME");
    let field = node_name
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .map(|f| f.field_path.as_str());
    r.ensure(
        field == Some("spec.nodeName"),
        "node-agent",
        "agent: NODE_NAME must come from the downward API (spec.nodeName)",
    );
    let metrics_port = flag("metrics-listen")
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<i32>().ok());
    let declared = c
        .ports
        .iter()
        .flatten()
        .any(|p| Some(p.container_port) == metrics_port);
    r.ensure(
        metrics_port.is_some() && declared,
        "node-agent",
        format!("agent: --metrics-listen port {metrics_port:?} must be a declared containerPort"),
    );
    let cp = flag("control-plane").is_some();
    let background = flag("io-profile").is_none_or(|p| p == "background");
    r.ensure(
        cp == control_plane
            && (!control_plane || flag("io-profile") == Some("background"))
            && background,
        "node-agent",
        format!(
            "agent: --control-plane ({cp}) must be given exactly on the DaemonSet tolerating \
             control-plane nodes ({control_plane}), there with --io-profile=background"
        ),
    );
}

#[cfg(test)]
mod tests;
