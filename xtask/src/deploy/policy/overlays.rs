//! What each overlay is for: where the oscontainer comes from, whether the
//! pods run (and sign) on control-plane nodes, and the mirror.

use super::contract::{Expect, Source};
use super::lookup::{flags_of, mount_of};
use super::report::Report;
use super::values::flag;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Volume};
use std::collections::{BTreeMap, BTreeSet};

/// The role labels (and taint keys) of control-plane nodes.
const CONTROL_PLANE_KEYS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// The oscontainer source matches what the rendering is for.
pub(super) fn check_source(server: &Container, pod: &PodSpec, expect: &Expect, r: &mut Report<'_>) {
    let flags = flags_of(server);
    let oscontainer = flag(&flags, "--oscontainer").first().map(|s| s.to_string());
    let inits = pod.init_containers.as_deref().unwrap_or(&[]);
    let image_volumes: Vec<&Volume> = pod
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.image.is_some())
        .collect();
    match expect.source {
        Source::Registry => {
            r.ensure(
                inits.is_empty() && image_volumes.is_empty(),
                "source",
                "registry mode has no init container or image volume",
            );
        }
        Source::ImageVolume => {
            let ok = oscontainer.as_deref().is_some_and(|d| {
                matches!(mount_of(server, pod, d), Some((_, Some(v), rel)) if v.image.is_some() && rel.is_empty())
            });
            r.ensure(
                ok,
                "source",
                "--oscontainer must be the mount of an image volume",
            );
        }
        Source::InitCopy => {
            let ok = init_fills_srv(server, pod, inits, oscontainer.as_deref());
            r.ensure(
                ok,
                "source",
                "--oscontainer's srv/ must be an emptyDir that the one init container writes",
            );
        }
    }
}

/// The server's DIR/srv is an emptyDir the one init container writes.
fn init_fills_srv(
    server: &Container,
    pod: &PodSpec,
    inits: &[Container],
    oscontainer: Option<&str>,
) -> bool {
    let srv = oscontainer.map(|d| format!("{}/srv", d.trim_end_matches('/')));
    let shared = srv.as_deref().and_then(|s| match mount_of(server, pod, s) {
        Some((m, Some(v), rel)) if v.empty_dir.is_some() && rel.is_empty() => Some(m.name.clone()),
        _ => None,
    });
    shared.as_ref().is_some_and(|vol| {
        inits.len() == 1
            && inits[0]
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| &m.name == vol && m.read_only != Some(true))
    })
}

/// Only the control-plane overlay schedules onto control-plane nodes, and
/// there it requires them, tolerates their taints and signs with a key
/// from a Secret.
pub(super) fn check_control_plane(
    pod: &PodSpec,
    server: &Container,
    expect: &Expect,
    r: &mut Report<'_>,
) {
    let pinned_to_cp = requires_control_plane(pod);
    let tolerated = tolerated_no_schedule(pod);
    if expect.control_plane {
        r.ensure(
            pinned_to_cp,
            "control-plane",
            "must require control-plane nodes (node affinity or nodeSelector)",
        );
        r.ensure(
            CONTROL_PLANE_KEYS.iter().all(|k| tolerated.contains(k)),
            "control-plane",
            "must tolerate the control-plane NoSchedule taints",
        );
        let flags = flags_of(server);
        let key_from_secret = flag(&flags, "--sign-key").first().is_some_and(
            |p| matches!(mount_of(server, pod, p), Some((_, Some(v), _)) if v.secret.is_some()),
        );
        r.ensure(
            key_from_secret,
            "sign-key",
            "--sign-key must be a file from a Secret volume",
        );
        // The server refuses a tag under --sign-key (it would sign whatever
        // the tag moved to); the rendering must not ship one.
        for image in flag(&flags, "--image") {
            let image = expand_env(server, image);
            r.ensure(
                pinned_by_digest(&image),
                "sign-pinned",
                format!("--image={image}: a signing server takes its image by digest (docker://HOST/REPO@sha256:DIGEST)"),
            );
        }
    } else {
        r.ensure(
            !pinned_to_cp && tolerated.is_empty(),
            "control-plane",
            "only the control-plane overlay schedules onto control-plane nodes",
        );
    }
}

/// The pod only schedules onto control-plane nodes: every required node
/// affinity term (they are ORed) demands a control-plane role label, or
/// the nodeSelector names one.
fn requires_control_plane(pod: &PodSpec) -> bool {
    let terms = pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|s| s.node_selector_terms.as_slice())
        .unwrap_or(&[]);
    !terms.is_empty()
        && terms.iter().all(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .any(|e| CONTROL_PLANE_KEYS.contains(&e.key.as_str()) && e.operator == "Exists")
        })
        || pod
            .node_selector
            .as_ref()
            .is_some_and(|n| CONTROL_PLANE_KEYS.iter().any(|k| n.contains_key(*k)))
}

/// The keys of the NoSchedule taints the pod tolerates.
fn tolerated_no_schedule(pod: &PodSpec) -> BTreeSet<&str> {
    pod.tolerations
        .iter()
        .flatten()
        .filter(|t| t.effect.as_deref() == Some("NoSchedule"))
        .filter_map(|t| t.key.as_deref())
        .collect()
}

/// registries.conf names a mirror and the CA bundle holds its CA.
pub(super) fn check_mirror(
    server: &Container,
    pod: &PodSpec,
    config_maps: &BTreeMap<&str, &ConfigMap>,
    r: &mut Report<'_>,
) {
    let flags = flags_of(server);
    let data_of = |flag_name: &str| -> Option<String> {
        let path = flag(&flags, flag_name).first()?.to_string();
        let (_, vol, rel) = mount_of(server, pod, &path)?;
        let cm = config_maps.get(vol?.config_map.as_ref()?.name.as_str())?;
        cm.data.as_ref()?.get(&rel).cloned()
    };
    r.ensure(
        data_of("--registries-conf").is_some_and(|c| c.contains("[[registry.mirror]]")),
        "mirror",
        "registries.conf must configure a [[registry.mirror]]",
    );
    r.ensure(
        data_of("--ca").is_some_and(|c| c.contains("-----BEGIN CERTIFICATE-----")),
        "mirror",
        "the CA bundle must hold the mirror's CA certificate",
    );
}

/// `value` with each `$(NAME)` replaced by the container's literal env
/// value, as the kubelet expands args (an unknown name stays as it is).
fn expand_env(c: &Container, value: &str) -> String {
    let mut out = value.to_owned();
    for e in c.env.iter().flatten() {
        if let Some(v) = &e.value {
            out = out.replace(&format!("$({})", e.name), v);
        }
    }
    out
}

/// `docker://…@sha256:` and 64 lowercase hex digits.
fn pinned_by_digest(image: &str) -> bool {
    image.starts_with("docker://")
        && image.rsplit_once("@sha256:").is_some_and(|(_, hex)| {
            hex.len() == 64
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}
