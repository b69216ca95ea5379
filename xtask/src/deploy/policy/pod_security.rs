//! The hardened pod: pod-wide settings, its volumes, and every container
//! (init containers too).

use super::lookup::labels_match;
use super::report::Report;
use super::values::{pinned, quantity_bytes};
use k8s_openapi::api::core::v1::{Container, PodSecurityContext, PodSpec, SecurityContext};
use std::collections::BTreeMap;

/// Pod-wide hardening, then every container (init containers too).
pub(super) fn check_pod(pod: &PodSpec, pod_labels: &BTreeMap<String, String>, r: &mut Report<'_>) {
    check_pod_isolation(pod, r);
    check_volumes(pod, r);
    check_ephemeral_storage(pod, r);
    check_topology_spread(pod, pod_labels, r);
    let psc = pod.security_context.as_ref();
    let containers = pod
        .init_containers
        .iter()
        .flatten()
        .chain(pod.containers.iter());
    for c in containers {
        check_container(c, psc, r);
    }
}

/// No service account token, no host namespaces.
pub(super) fn check_pod_isolation(pod: &PodSpec, r: &mut Report<'_>) {
    r.ensure(
        pod.automount_service_account_token == Some(false),
        "automount-token",
        "automountServiceAccountToken must be false",
    );
    for (what, on) in [
        ("hostNetwork", pod.host_network),
        ("hostPID", pod.host_pid),
        ("hostIPC", pod.host_ipc),
    ] {
        r.ensure(
            on != Some(true),
            "host-namespaces",
            format!("{what} must not be set"),
        );
    }
}

/// No hostPath, every emptyDir bounded, every image volume pinned.
fn check_volumes(pod: &PodSpec, r: &mut Report<'_>) {
    for v in pod.volumes.iter().flatten() {
        r.ensure(
            v.host_path.is_none(),
            "host-path",
            format!("volume {} is a hostPath", v.name),
        );
        if let Some(e) = &v.empty_dir {
            r.ensure(
                e.size_limit.is_some(),
                "empty-dir-size",
                format!("emptyDir {} has no sizeLimit", v.name),
            );
        }
        if let Some(i) = &v.image {
            let reference = i.reference.as_deref().unwrap_or("");
            if let Err(e) = pinned(reference) {
                r.fail("image-pinned", format!("image volume {}: {e}", v.name));
            }
        }
    }
}

/// The containers' ephemeral-storage limits cover every emptyDir filled to
/// its sizeLimit: the kubelet evicts a pod whose emptyDirs outgrow them.
fn check_ephemeral_storage(pod: &PodSpec, r: &mut Report<'_>) {
    let empty_dirs: Option<u64> = pod
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| v.empty_dir.as_ref())
        .map(|e| e.size_limit.as_ref().and_then(|q| quantity_bytes(&q.0)))
        .sum();
    let limit: Option<u64> = pod
        .containers
        .iter()
        .map(|c| {
            c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("ephemeral-storage"))
                .and_then(|q| quantity_bytes(&q.0))
        })
        .sum();
    r.ensure(
        matches!((empty_dirs, limit), (Some(d), Some(l)) if l >= d),
        "empty-dir-size",
        format!("ephemeral-storage limits ({limit:?} bytes) must cover the emptyDirs' sizeLimits ({empty_dirs:?} bytes)"),
    );
}

/// The replicas spread over nodes, by constraints that select this pod.
fn check_topology_spread(pod: &PodSpec, pod_labels: &BTreeMap<String, String>, r: &mut Report<'_>) {
    let spread = pod.topology_spread_constraints.as_deref().unwrap_or(&[]);
    r.ensure(
        !spread.is_empty()
            && spread
                .iter()
                .all(|t| labels_match(t.label_selector.as_ref(), pod_labels)),
        "topology-spread",
        "topologySpreadConstraints must be set and select this pod",
    );
}

/// One container: its security context, resources, image and probes.
fn check_container(c: &Container, psc: Option<&PodSecurityContext>, r: &mut Report<'_>) {
    let name = &c.name;
    let sc = c.security_context.as_ref();
    check_identity(name, sc, psc, r);
    check_privileges(name, sc, r);
    check_resources(c, r);
    match c.image.as_deref() {
        Some(img) => {
            if let Err(e) = pinned(img) {
                r.fail("image-pinned", format!("{name}: {e}"));
            }
        }
        None => r.fail("image-pinned", format!("{name}: no image")),
    }
    check_no_exec_probes(c, r);
}

/// Not root, under the runtime's seccomp profile (the container's setting,
/// else the pod's).
fn check_identity(
    name: &str,
    sc: Option<&SecurityContext>,
    psc: Option<&PodSecurityContext>,
    r: &mut Report<'_>,
) {
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(psc.and_then(|p| p.run_as_non_root));
    r.ensure(
        non_root == Some(true),
        "run-as-non-root",
        format!("{name}: runAsNonRoot must be true"),
    );
    let uid = sc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|p| p.run_as_user));
    r.ensure(
        uid != Some(0),
        "run-as-non-root",
        format!("{name}: runAsUser 0"),
    );
    let seccomp = sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or(psc.and_then(|p| p.seccomp_profile.as_ref()))
        .map(|p| p.type_.as_str());
    r.ensure(
        seccomp == Some("RuntimeDefault"),
        "seccomp",
        format!("{name}: seccompProfile must be RuntimeDefault, is {seccomp:?}"),
    );
}

/// No escalation, a read-only root, not privileged, no capabilities.
fn check_privileges(name: &str, sc: Option<&SecurityContext>, r: &mut Report<'_>) {
    r.ensure(
        sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        "privilege-escalation",
        format!("{name}: allowPrivilegeEscalation must be false"),
    );
    r.ensure(
        sc.and_then(|s| s.read_only_root_filesystem) == Some(true),
        "read-only-root",
        format!("{name}: readOnlyRootFilesystem must be true"),
    );
    r.ensure(
        sc.and_then(|s| s.privileged) != Some(true),
        "privileged",
        format!("{name}: privileged"),
    );
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let drop_all = caps
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|x| x == "ALL"));
    let adds = caps
        .and_then(|c| c.add.as_ref())
        .is_some_and(|a| !a.is_empty());
    r.ensure(
        drop_all && !adds,
        "capabilities",
        format!("{name}: capabilities must drop ALL and add none"),
    );
}

/// CPU and memory, both requested and limited.
pub(super) fn check_resources(c: &Container, r: &mut Report<'_>) {
    let res = c.resources.as_ref();
    for (what, map) in [
        ("requests", res.and_then(|x| x.requests.as_ref())),
        ("limits", res.and_then(|x| x.limits.as_ref())),
    ] {
        for key in ["cpu", "memory"] {
            r.ensure(
                map.is_some_and(|m| m.contains_key(key)),
                "resources",
                format!("{}: resources.{what}.{key} must be set", c.name),
            );
        }
    }
}

/// Probes that exec fail: the image has no shell.
pub(super) fn check_no_exec_probes(c: &Container, r: &mut Report<'_>) {
    for (what, p) in [
        ("startupProbe", &c.startup_probe),
        ("readinessProbe", &c.readiness_probe),
        ("livenessProbe", &c.liveness_probe),
    ] {
        if let Some(p) = p {
            r.ensure(
                p.exec.is_none(),
                "probes",
                format!("{}: {what} must not exec (the image has no shell)", c.name),
            );
        }
    }
}
