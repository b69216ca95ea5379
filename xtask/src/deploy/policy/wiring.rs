//! The server's flags wired to the pod: every path it is given is mounted
//! (the root filesystem is read-only) and holds what it names, and each
//! rendering passes the flags its source and role need.

use super::contract::{
    Expect, Source, EXTERNAL_SECRETS, INJECTED_CA_KEY, INJECT_CA_LABEL, OSCONTAINER_REPO,
};
use super::lookup::mount_of;
use super::report::Report;
use super::values::flag;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Volume};
use std::collections::BTreeMap;

/// Every path flag names something mounted, of the right kind.
pub(super) fn check_path_flags(
    c: &Container,
    pod: &PodSpec,
    flags: &[(String, String)],
    config_maps: &BTreeMap<&str, &ConfigMap>,
    r: &mut Report<'_>,
) {
    for (k, v) in flags {
        if !v.starts_with('/') {
            continue;
        }
        // The server reads an oscontainer's DIR/srv/repo, not DIR itself.
        let read = if k == "--oscontainer" {
            format!("{}/{OSCONTAINER_REPO}", v.trim_end_matches('/'))
        } else {
            v.clone()
        };
        match mount_of(c, pod, &read) {
            None => r.fail(
                "flag-path-mounted",
                format!("{k}={v} is on the read-only root filesystem: mount it"),
            ),
            Some((m, vol, rel)) => {
                let Some(vol) = vol else {
                    r.fail("volumes", format!("mount {} has no volume", m.name));
                    continue;
                };
                if k == "--state-dir" {
                    r.ensure(
                        vol.empty_dir.is_some() && m.read_only != Some(true) && rel.is_empty(),
                        "state-dir-writable",
                        format!("{k}={v} must be a writable emptyDir mount"),
                    );
                }
                check_config_key(k, v, vol, &rel, config_maps, r);
                check_secret_key(k, v, vol, &rel, r);
            }
        }
    }
}

/// A file flag under a ConfigMap mount names a key that is there (or, for
/// an OpenShift-injected CA bundle, the key that will be).
fn check_config_key(
    k: &str,
    v: &str,
    vol: &Volume,
    rel: &str,
    config_maps: &BTreeMap<&str, &ConfigMap>,
    r: &mut Report<'_>,
) {
    let Some(cm) = &vol.config_map else { return };
    let Some(obj) = config_maps.get(cm.name.as_str()) else {
        r.fail(
            "config-key",
            format!("{k}={v}: ConfigMap {} is not rendered", cm.name),
        );
        return;
    };
    if rel.is_empty() {
        return; // A directory (the signature bundle).
    }
    let key = match &cm.items {
        Some(items) => items.iter().find(|i| i.path == rel).map(|i| i.key.as_str()),
        None => Some(rel),
    };
    let present = key.is_some_and(|key| {
        obj.data.as_ref().is_some_and(|d| d.contains_key(key))
            || obj
                .binary_data
                .as_ref()
                .is_some_and(|d| d.contains_key(key))
            || (key == INJECTED_CA_KEY
                && obj
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(INJECT_CA_LABEL))
                    .is_some_and(|x| x == "true"))
    });
    r.ensure(
        present,
        "config-key",
        format!("{k}={v}: ConfigMap {} has no key {key:?}", cm.name),
    );
}

/// A file flag under a Secret mount names a Secret the operator creates,
/// and a key the volume lists.
fn check_secret_key(k: &str, v: &str, vol: &Volume, rel: &str, r: &mut Report<'_>) {
    let Some(s) = &vol.secret else { return };
    let name = s.secret_name.as_deref().unwrap_or("");
    r.ensure(
        EXTERNAL_SECRETS.contains(&name),
        "config-key",
        format!("{k}={v}: Secret {name:?} is not one the operator is told to create"),
    );
    let listed = s
        .items
        .as_ref()
        .is_some_and(|items| items.iter().any(|i| i.path == rel));
    r.ensure(
        rel.is_empty() || listed,
        "config-key",
        format!("{k}={v}: list {rel:?} in the Secret volume's items"),
    );
}

/// The flags each source and role needs, and no leftovers of another.
pub(super) fn check_required_flags(
    flags: &[(String, String)],
    expect: &Expect,
    r: &mut Report<'_>,
) {
    let has = |name: &str| !flag(flags, name).is_empty();
    match expect.source {
        Source::Registry => {
            r.ensure(
                flag(flags, "--image").len() == 1 && !has("--oscontainer"),
                "source",
                "registry mode: exactly one --image and no --oscontainer",
            );
            for needed in ["--authfile", "--registries-conf", "--ca"] {
                r.ensure(
                    has(needed),
                    "wiring",
                    format!("registry mode needs {needed}"),
                );
            }
        }
        Source::ImageVolume | Source::InitCopy => {
            r.ensure(
                flag(flags, "--oscontainer").len() == 1 && !has("--image"),
                "source",
                "mounted mode: exactly one --oscontainer and no --image",
            );
        }
    }
    if expect.control_plane {
        r.ensure(
            has("--sign-key"),
            "sign-key",
            "control-plane mode signs: --sign-key",
        );
    } else {
        r.ensure(
            !has("--sign-key"),
            "sign-key",
            "a signing key belongs on control-plane nodes only",
        );
        for needed in ["--trusted-keys", "--signatures"] {
            r.ensure(has(needed), "wiring", format!("{needed} must be wired"));
        }
    }
    r.ensure(
        has("--state-dir"),
        "wiring",
        "--state-dir must be explicit (an emptyDir)",
    );
}
