//! Finding things in the typed objects: what a selector selects, the volume
//! behind a path, the server's flags.

use super::values::server_flags;
use k8s_openapi::api::core::v1::{Container, PodSpec, Volume, VolumeMount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// The selector selects exactly by labels (no expressions), and `labels`
/// has all of them.
pub(super) fn labels_match(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> bool {
    let Some(s) = selector else { return false };
    if s.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
        return false;
    }
    match &s.match_labels {
        Some(m) if !m.is_empty() => m.iter().all(|(k, v)| labels.get(k) == Some(v)),
        _ => false,
    }
}

/// The container's `--flag=value` pairs, none when its args are malformed
/// (the server check reports that once).
pub(super) fn flags_of(c: &Container) -> Vec<(String, String)> {
    let args = c.args.clone().unwrap_or_default();
    server_flags(&args).unwrap_or_default()
}

fn volume<'a>(pod: &'a PodSpec, name: &str) -> Option<&'a Volume> {
    pod.volumes.iter().flatten().find(|v| v.name == name)
}

/// The mount (and its volume) holding `path`: the longest mountPath that
/// is `path` or a parent of it.
pub(super) fn mount_of<'a>(
    c: &'a Container,
    pod: &'a PodSpec,
    path: &str,
) -> Option<(&'a VolumeMount, Option<&'a Volume>, String)> {
    c.volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| {
            let mp = m.mount_path.trim_end_matches('/');
            let rel = if path == mp {
                Some(String::new())
            } else {
                path.strip_prefix(mp)
                    .and_then(|r| r.strip_prefix('/'))
                    .map(str::to_owned)
            }?;
            Some((m, volume(pod, &m.name), rel))
        })
        .max_by_key(|(m, _, _)| m.mount_path.len())
}
