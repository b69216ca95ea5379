//! The scale-out component: one HorizontalPodAutoscaler owns the server
//! Deployment's replica count, on CPU, never below what a drain needs, with
//! a CPU request it can measure against and replicas spread over nodes.

use super::contract::Expect;
use super::lookup::labels_match;
use super::report::Report;
use crate::deploy::decode::Object;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use std::collections::BTreeMap;

/// Below this request, utilization means little: a pod serving a handful of
/// nodes would already look busy and the autoscaler would grow for nothing.
const MIN_CPU_REQUEST_MILLIS: u64 = 500;
/// Above this target, a replica is saturated before a new one is ready
/// (a new pod streams and verifies the release first).
const MAX_TARGET_UTILIZATION: i32 = 85;
const HOSTNAME: &str = "kubernetes.io/hostname";

fn autoscalers(objects: &[Object]) -> Vec<&HorizontalPodAutoscaler> {
    objects
        .iter()
        .filter_map(|o| match o {
            Object::HorizontalPodAutoscaler(h) => Some(h),
            _ => None,
        })
        .collect()
}

/// How many pods serve at least: the Deployment's own count, or, when an
/// autoscaler owns it, the autoscaler's floor (Kubernetes' default: one).
pub(super) fn replicas(d: &Deployment, objects: &[Object]) -> i32 {
    let own = d.spec.as_ref().and_then(|s| s.replicas);
    let floor = autoscalers(objects)
        .first()
        .map(|h| h.spec.as_ref().and_then(|s| s.min_replicas).unwrap_or(1));
    own.or(floor).unwrap_or(1)
}

/// CPU millicores in a Kubernetes quantity (`2`, `500m`, `1.5`).
pub(super) fn cpu_millis(q: &str) -> Option<u64> {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    let (whole, frac) = q.split_once('.').unwrap_or((q, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_millis = format!("{frac:0<3}").parse::<u64>().ok()?;
    whole
        .parse::<u64>()
        .ok()?
        .checked_mul(1000)?
        .checked_add(frac_millis)
}

/// With the component: exactly one autoscaler, aimed at this Deployment,
/// on CPU utilization, and a Deployment that leaves the count to it.
/// Without: none, and the Deployment states its count.
pub(super) fn check_autoscaling(
    d: &Deployment,
    pod: &PodSpec,
    server: &Container,
    pod_labels: &BTreeMap<String, String>,
    objects: &[Object],
    expect: &Expect,
    r: &mut Report<'_>,
) {
    let hpas = autoscalers(objects);
    let own_replicas = d.spec.as_ref().and_then(|s| s.replicas);
    if !expect.autoscaled {
        r.ensure(
            hpas.is_empty(),
            "autoscaling",
            "the autoscaler is optional: only the scale-out component adds it",
        );
        r.ensure(
            own_replicas.is_some(),
            "replicas",
            "without an autoscaler the Deployment must state its replicas",
        );
        return;
    }
    r.ensure(
        own_replicas.is_none(),
        "autoscaling",
        "the autoscaler owns the replica count: a fixed spec.replicas is re-applied over its decision",
    );
    let [hpa] = hpas.as_slice() else {
        r.fail(
            "autoscaling",
            format!("expected one HorizontalPodAutoscaler, found {}", hpas.len()),
        );
        return;
    };
    check_hpa(hpa, d, r);
    let request = server
        .resources
        .as_ref()
        .and_then(|res| res.requests.as_ref())
        .and_then(|req| req.get("cpu"))
        .and_then(|q| cpu_millis(&q.0));
    r.ensure(
        request.is_some_and(|m| m >= MIN_CPU_REQUEST_MILLIS),
        "autoscaling",
        format!(
            "the server's CPU request ({request:?} millicores) must be at least {MIN_CPU_REQUEST_MILLIS}m: utilization is measured against it"
        ),
    );
    check_spread(pod, pod_labels, r);
}

fn check_hpa(hpa: &HorizontalPodAutoscaler, d: &Deployment, r: &mut Report<'_>) {
    let Some(spec) = &hpa.spec else {
        r.fail("autoscaling", "the autoscaler has no spec");
        return;
    };
    let target = &spec.scale_target_ref;
    r.ensure(
        target.kind == "Deployment"
            && target.api_version.as_deref() == Some("apps/v1")
            && Some(target.name.as_str()) == d.metadata.name.as_deref(),
        "autoscaling",
        format!(
            "scaleTargetRef must be apps/v1 Deployment {:?}",
            d.metadata.name
        ),
    );
    let min = spec.min_replicas.unwrap_or(1);
    r.ensure(
        spec.max_replicas > min,
        "autoscaling",
        format!(
            "maxReplicas {} must exceed minReplicas {min}",
            spec.max_replicas
        ),
    );
    let cpu_target = spec.metrics.iter().flatten().find_map(|m| {
        let res = m.resource.as_ref().filter(|_| m.type_ == "Resource")?;
        (res.name == "cpu" && res.target.type_ == "Utilization")
            .then_some(res.target.average_utilization)
            .flatten()
    });
    r.ensure(
        cpu_target.is_some_and(|u| (1..=MAX_TARGET_UTILIZATION).contains(&u)),
        "autoscaling",
        format!(
            "one metric must target CPU Utilization in 1..={MAX_TARGET_UTILIZATION}%, found {cpu_target:?}"
        ),
    );
}

/// Replicas prefer (or require) distinct nodes.
fn check_spread(pod: &PodSpec, pod_labels: &BTreeMap<String, String>, r: &mut Report<'_>) {
    let anti = pod
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref());
    let preferred = anti
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .map(|w| &w.pod_affinity_term);
    let required = anti
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten();
    let spread = preferred
        .chain(required)
        .any(|t| t.topology_key == HOSTNAME && labels_match(t.label_selector.as_ref(), pod_labels));
    r.ensure(
        spread,
        "autoscaling",
        format!("replicas must be kept apart: a podAntiAffinity term on {HOSTNAME} selecting the server pods"),
    );
}

#[cfg(test)]
mod tests {
    use super::cpu_millis;

    #[test]
    fn cpu_quantities() {
        let cases: &[(&str, Option<u64>)] = &[
            ("1", Some(1000)),
            ("2", Some(2000)),
            ("500m", Some(500)),
            ("1.5", Some(1500)),
            ("0.25", Some(250)),
            ("1.2345", None),
            ("", None),
            ("one", None),
            ("1.x", None),
        ];
        for (q, want) in cases {
            assert_eq!(cpu_millis(q), *want, "{q}");
        }
    }
}
