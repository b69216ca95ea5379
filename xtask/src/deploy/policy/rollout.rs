//! The Deployment's rollout: enough replicas, and a new ReplicaSet ready
//! (verified content published) before an old pod goes away.

use super::lookup::labels_match;
use super::report::Report;
use k8s_openapi::api::apps::v1::DeploymentSpec;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// The selector matches the pods, a drain keeps one serving, and a rollout
/// surges before it takes a pod away.
pub(super) fn check_rollout(
    spec: &DeploymentSpec,
    replicas: i32,
    pod_labels: &BTreeMap<String, String>,
    r: &mut Report<'_>,
) {
    r.ensure(
        labels_match(Some(&spec.selector), pod_labels),
        "selector",
        "the selector must match the pod template's labels",
    );
    r.ensure(
        replicas >= 2,
        "replicas",
        format!("{replicas} replica(s): a node drain or rollout would stop serving"),
    );
    let rolling = spec
        .strategy
        .as_ref()
        .filter(|s| s.type_.as_deref().unwrap_or("RollingUpdate") == "RollingUpdate")
        .and_then(|s| s.rolling_update.as_ref());
    match rolling {
        Some(ru) => {
            r.ensure(
                ru.max_unavailable == Some(IntOrString::Int(0)),
                "rollout",
                "maxUnavailable must be 0",
            );
            r.ensure(
                matches!(ru.max_surge, Some(IntOrString::Int(n)) if n >= 1),
                "rollout",
                "maxSurge must be at least 1",
            );
        }
        None => r.fail(
            "rollout",
            "strategy must be RollingUpdate with rollingUpdate set",
        ),
    }
}

/// A rollout waiting for a new release to stream must not be declared
/// failed before the startup probe itself gives up.
pub(super) fn check_progress_deadline(
    spec: &DeploymentSpec,
    server: &Container,
    r: &mut Report<'_>,
) {
    let startup_budget = server.startup_probe.as_ref().map(|p| {
        p.initial_delay_seconds.unwrap_or(0)
            + p.period_seconds.unwrap_or(10) * p.failure_threshold.unwrap_or(3)
    });
    let deadline = spec.progress_deadline_seconds.unwrap_or(600);
    r.ensure(
        startup_budget.is_some_and(|b| deadline > b),
        "rollout",
        format!("progressDeadlineSeconds {deadline} must exceed the startup probe's budget {startup_budget:?}"),
    );
}
