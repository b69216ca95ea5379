//! The invariants every rendering of deploy/ must keep, checked on the typed
//! objects: the hardened pod (for every pod template, every container), the
//! probes' meaning, the rollout, the Service, PDB and NetworkPolicy, that
//! every path the server is given is mounted, and what each overlay is for.

use super::decode::Object;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Probe, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::{BTreeMap, BTreeSet};

/// The server container's name in the Deployment.
pub const SERVER_CONTAINER: &str = "server";
/// The server's subcommand, first in its args.
pub const SERVE: &str = "serve";
/// Where an oscontainer keeps its repo (`--oscontainer DIR` serves DIR/srv/repo).
pub const OSCONTAINER_REPO: &str = "srv/repo";
/// Readiness and startup: verified content is published.
pub const READY_PATH: &str = "/readyz";
/// Liveness: the HTTP server answers.
pub const HEALTH_PATH: &str = "/healthz";
/// What the Service exposes, and its port name.
pub const SERVICE_PORT: i32 = 80;
pub const PORT_NAME: &str = "http";
/// Ports the server may reach: DNS (53, and 5353 behind OpenShift's DNS
/// service), registries over TLS (443) and the usual mirror port (5000).
pub const ALLOWED_EGRESS: &[(&str, i32)] = &[
    ("UDP", 53),
    ("TCP", 53),
    ("UDP", 5353),
    ("TCP", 5353),
    ("TCP", 443),
    ("TCP", 5000),
];
/// The label OpenShift's cluster network operator acts on to inject the
/// cluster's trusted CA bundle into a ConfigMap (as `ca-bundle.crt`).
pub const INJECT_CA_LABEL: &str = "config.openshift.io/inject-trusted-cabundle";
pub const INJECTED_CA_KEY: &str = "ca-bundle.crt";
/// Secrets the operator creates (credentials are never in git); everything
/// else a pod mounts must be rendered.
pub const EXTERNAL_SECRETS: &[&str] = &["oscontent-pull-secret", "oscontent-sign-key"];

/// Where the oscontainer comes from in a rendering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `--image docker://...` streamed by the server.
    Registry,
    /// A Kubernetes image volume mounted at `--oscontainer`.
    ImageVolume,
    /// An init container copying `/srv/repo` into an emptyDir.
    InitCopy,
}

/// What one rendering is for, beyond the common invariants.
#[derive(Debug, Clone, Copy)]
pub struct Expect {
    pub source: Source,
    /// Control-plane nodes only, tolerating their taints, signing with a
    /// key from a Secret.
    pub control_plane: bool,
    /// registries.conf has a mirror and the CA bundle is filled in.
    pub mirror: bool,
    /// A ServiceMonitor scrapes the Service's port.
    pub service_monitor: bool,
}

impl Expect {
    pub const fn registry() -> Self {
        Expect {
            source: Source::Registry,
            control_plane: false,
            mirror: false,
            service_monitor: false,
        }
    }
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub object: String,
    pub rule: &'static str,
    pub detail: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} [{}]: {}", self.object, self.rule, self.detail)
    }
}

struct Report<'a> {
    out: &'a mut Vec<Violation>,
    object: String,
}

impl Report<'_> {
    fn fail(&mut self, rule: &'static str, detail: impl Into<String>) {
        self.out.push(Violation {
            object: self.object.clone(),
            rule,
            detail: detail.into(),
        });
    }

    fn ensure(&mut self, ok: bool, rule: &'static str, detail: impl Into<String>) {
        if !ok {
            self.fail(rule, detail);
        }
    }
}

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
        let mut r = Report {
            out: &mut out,
            object: o.id(),
        };
        let meta = o.metadata();
        if !matches!(o, Object::Namespace(_)) {
            let ns = meta.namespace.as_deref().unwrap_or("");
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

    let mut r = Report {
        out: &mut out,
        object: "Deployment".into(),
    };
    r.ensure(
        deployments.len() == 1,
        "deployment",
        format!("expected one Deployment, found {}", deployments.len()),
    );
    for d in &deployments {
        check_deployment(d, objects, &config_maps, expect, &mut out);
    }
    out
}

fn labels_match(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(s) = selector else { return false };
    if s.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
        return false;
    }
    match &s.match_labels {
        Some(m) if !m.is_empty() => m.iter().all(|(k, v)| labels.get(k) == Some(v)),
        _ => false,
    }
}

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
    let mut r = Report {
        out,
        object: id.clone(),
    };
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
    r.ensure(
        labels_match(Some(&spec.selector), &pod_labels),
        "selector",
        "the selector must match the pod template's labels",
    );
    let replicas = spec.replicas.unwrap_or(1);
    r.ensure(
        replicas >= 2,
        "replicas",
        format!("{replicas} replica(s): a node drain or rollout would stop serving"),
    );
    // The new ReplicaSet is ready (verified content published) before an
    // old pod goes away.
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
    let Some(pod) = &spec.template.spec else {
        r.fail("pod", "no pod spec");
        return;
    };
    check_pod(pod, &pod_labels, &mut r);
    let server = pod.containers.iter().find(|c| c.name == SERVER_CONTAINER);
    let Some(server) = server else {
        r.fail("server", format!("no container named {SERVER_CONTAINER:?}"));
        return;
    };
    // A rollout waiting for a new release to stream must not be declared
    // failed before the startup probe itself gives up.
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
    let port = check_server(server, pod, config_maps, expect, &mut r);
    check_source(server, pod, expect, &mut r);
    check_control_plane(pod, server, expect, &mut r);
    if expect.mirror {
        check_mirror(server, pod, config_maps, &mut r);
    }
    check_companions(
        objects,
        &pod_labels,
        pod,
        port,
        replicas,
        expect,
        &id,
        r.out,
    );
}

/// Pod-wide hardening, then every container (init containers too).
fn check_pod(pod: &PodSpec, pod_labels: &BTreeMap<String, String>, r: &mut Report<'_>) {
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
    let psc = pod.security_context.as_ref();
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
    // The kubelet evicts a pod whose emptyDirs outgrow its ephemeral-storage
    // limit: the limit must cover every emptyDir filled to its sizeLimit.
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
    let spread = pod.topology_spread_constraints.as_deref().unwrap_or(&[]);
    r.ensure(
        !spread.is_empty()
            && spread
                .iter()
                .all(|t| labels_match(t.label_selector.as_ref(), pod_labels)),
        "topology-spread",
        "topologySpreadConstraints must be set and select this pod",
    );
    let containers = pod
        .init_containers
        .iter()
        .flatten()
        .chain(pod.containers.iter());
    for c in containers {
        check_container(c, psc, r);
    }
}

fn check_container(
    c: &Container,
    psc: Option<&k8s_openapi::api::core::v1::PodSecurityContext>,
    r: &mut Report<'_>,
) {
    let name = &c.name;
    let sc = c.security_context.as_ref();
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
    let res = c.resources.as_ref();
    for (what, map) in [
        ("requests", res.and_then(|x| x.requests.as_ref())),
        ("limits", res.and_then(|x| x.limits.as_ref())),
    ] {
        for key in ["cpu", "memory"] {
            r.ensure(
                map.is_some_and(|m| m.contains_key(key)),
                "resources",
                format!("{name}: resources.{what}.{key} must be set"),
            );
        }
    }
    match c.image.as_deref() {
        Some(img) => {
            if let Err(e) = pinned(img) {
                r.fail("image-pinned", format!("{name}: {e}"));
            }
        }
        None => r.fail("image-pinned", format!("{name}: no image")),
    }
    for (what, p) in [
        ("startupProbe", &c.startup_probe),
        ("readinessProbe", &c.readiness_probe),
        ("livenessProbe", &c.liveness_probe),
    ] {
        if let Some(p) = p {
            r.ensure(
                p.exec.is_none(),
                "probes",
                format!("{name}: {what} must not exec (the image has no shell)"),
            );
        }
    }
}

/// Bytes in a Kubernetes quantity with a binary or decimal suffix
/// (`64Mi`, `5Gi`, `1G`, `1000`); None for anything else.
pub fn quantity_bytes(q: &str) -> Option<u64> {
    const SUFFIXES: &[(&str, u64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (num, mult) = SUFFIXES
        .iter()
        .find_map(|(s, m)| q.strip_suffix(s).map(|n| (n, *m)))
        .unwrap_or((q, 1));
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// An image reference pinned by digest, or by a tag other than `latest`.
pub fn pinned(image: &str) -> Result<(), String> {
    if image.is_empty() {
        return Err("empty image reference".into());
    }
    if let Some((_, digest)) = image.split_once('@') {
        let hex = digest.strip_prefix("sha256:").unwrap_or("");
        return if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(())
        } else {
            Err(format!("{image}: malformed digest"))
        };
    }
    // A tag is what follows the last ':' after the last '/' (a ':' before
    // it is a registry port).
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) => Err(format!("{image}: the tag `latest` is not a pin")),
        Some((_, tag)) if !tag.is_empty() => Ok(()),
        _ => Err(format!("{image}: no tag or digest")),
    }
}

/// `--flag=value` pairs of the server's args (after `serve`); every flag
/// must use that form, so that patches and this check read them alike.
pub fn server_flags(args: &[String]) -> Result<Vec<(String, String)>, String> {
    let Some((first, rest)) = args.split_first() else {
        return Err("no args".into());
    };
    if first != SERVE {
        return Err(format!("args must start with {SERVE:?}, not {first:?}"));
    }
    rest.iter()
        .map(
            |a| match a.strip_prefix("--").and_then(|x| x.split_once('=')) {
                Some((k, v)) if !k.is_empty() => Ok((format!("--{k}"), v.to_owned())),
                _ => Err(format!("{a:?} is not --flag=value")),
            },
        )
        .collect()
}

fn flag<'a>(flags: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    flags
        .iter()
        .filter(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

fn volume<'a>(pod: &'a PodSpec, name: &str) -> Option<&'a Volume> {
    pod.volumes.iter().flatten().find(|v| v.name == name)
}

/// The mount (and its volume) holding `path`: the longest mountPath that
/// is `path` or a parent of it.
fn mount_of<'a>(
    c: &'a Container,
    pod: &'a PodSpec,
    path: &str,
) -> Option<(
    &'a k8s_openapi::api::core::v1::VolumeMount,
    Option<&'a Volume>,
    String,
)> {
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

/// The server container: args, probes, ports, and that every path it is
/// given is mounted (the root filesystem is read-only). Returns the
/// container port it listens on.
fn check_server(
    c: &Container,
    pod: &PodSpec,
    config_maps: &BTreeMap<&str, &ConfigMap>,
    expect: &Expect,
    r: &mut Report<'_>,
) -> Option<i32> {
    let args = c.args.clone().unwrap_or_default();
    let flags = match server_flags(&args) {
        Ok(f) => f,
        Err(e) => {
            r.fail("flag-form", e);
            Vec::new()
        }
    };
    r.ensure(
        c.command.is_none(),
        "command",
        "leave `command` to the image's ENTRYPOINT (deploy/Containerfile)",
    );
    // --listen and the named container port agree.
    let listen = flag(&flags, "--listen");
    let listen_port = listen
        .first()
        .and_then(|l| l.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<i32>().ok());
    r.ensure(
        listen.len() == 1 && listen_port.is_some(),
        "listen",
        format!("exactly one --listen=ADDR:PORT, found {listen:?}"),
    );
    let ports = c.ports.as_deref().unwrap_or(&[]);
    let named = ports.iter().find(|p| p.name.as_deref() == Some(PORT_NAME));
    r.ensure(
        named.is_some_and(|p| Some(p.container_port) == listen_port),
        "ports",
        format!("container port {PORT_NAME:?} must be the --listen port {listen_port:?}"),
    );
    for p in ports {
        r.ensure(
            p.host_port.is_none(),
            "host-namespaces",
            format!("port {:?} uses hostPort", p.name),
        );
    }
    let resolve = |port: &IntOrString| -> Option<i32> {
        match port {
            IntOrString::Int(n) => Some(*n),
            IntOrString::String(s) => ports
                .iter()
                .find(|p| p.name.as_deref() == Some(s))
                .map(|p| p.container_port),
        }
    };
    // Ready (and started) means verified content is published; alive means
    // the HTTP server answers.
    for (what, probe, path) in [
        ("startupProbe", &c.startup_probe, READY_PATH),
        ("readinessProbe", &c.readiness_probe, READY_PATH),
        ("livenessProbe", &c.liveness_probe, HEALTH_PATH),
    ] {
        match probe.as_ref().and_then(|p: &Probe| p.http_get.as_ref()) {
            Some(h) => {
                r.ensure(
                    h.path.as_deref() == Some(path),
                    "probes",
                    format!("{what} must GET {path}, not {:?}", h.path),
                );
                r.ensure(
                    resolve(&h.port).is_some() && resolve(&h.port) == listen_port,
                    "probe-port",
                    format!("{what} port {:?} is not the --listen port", h.port),
                );
                r.ensure(
                    h.scheme.as_deref().unwrap_or("HTTP") == "HTTP",
                    "probes",
                    format!("{what}: the server speaks plain HTTP"),
                );
            }
            None => r.fail("probes", format!("{what} must be an httpGet on {path}")),
        }
    }
    // Every path flag names something mounted, of the right kind.
    for (k, v) in &flags {
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
            }
        }
    }
    // The flags each source needs, and no source-specific leftovers.
    let has = |name: &str| !flag(&flags, name).is_empty();
    match expect.source {
        Source::Registry => {
            r.ensure(
                flag(&flags, "--image").len() == 1 && !has("--oscontainer"),
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
                flag(&flags, "--oscontainer").len() == 1 && !has("--image"),
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
    listen_port
}

/// A file flag under a ConfigMap or Secret mount names a key that is there
/// (or, for an OpenShift-injected CA bundle, the key that will be).
fn check_config_key(
    k: &str,
    v: &str,
    vol: &Volume,
    rel: &str,
    config_maps: &BTreeMap<&str, &ConfigMap>,
    r: &mut Report<'_>,
) {
    if let Some(cm) = &vol.config_map {
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
    if let Some(s) = &vol.secret {
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
}

/// The oscontainer source matches what the rendering is for.
fn check_source(server: &Container, pod: &PodSpec, expect: &Expect, r: &mut Report<'_>) {
    let args = server.args.clone().unwrap_or_default();
    let flags = server_flags(&args).unwrap_or_default();
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
            // The server's DIR/srv is an emptyDir the init container fills.
            let srv = oscontainer.map(|d| format!("{}/srv", d.trim_end_matches('/')));
            let shared = srv.as_deref().and_then(|s| match mount_of(server, pod, s) {
                Some((m, Some(v), rel)) if v.empty_dir.is_some() && rel.is_empty() => {
                    Some(m.name.clone())
                }
                _ => None,
            });
            let ok = shared.as_ref().is_some_and(|vol| {
                inits.len() == 1
                    && inits[0]
                        .volume_mounts
                        .iter()
                        .flatten()
                        .any(|m| &m.name == vol && m.read_only != Some(true))
            });
            r.ensure(
                ok,
                "source",
                "--oscontainer's srv/ must be an emptyDir that the one init container writes",
            );
        }
    }
}

fn check_control_plane(pod: &PodSpec, server: &Container, expect: &Expect, r: &mut Report<'_>) {
    let cp_keys = [
        "node-role.kubernetes.io/control-plane",
        "node-role.kubernetes.io/master",
    ];
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
    // Every term (they are ORed) must demand a control-plane role label.
    let pinned_to_cp = !terms.is_empty()
        && terms.iter().all(|t| {
            t.match_expressions
                .iter()
                .flatten()
                .any(|e| cp_keys.contains(&e.key.as_str()) && e.operator == "Exists")
        })
        || pod
            .node_selector
            .as_ref()
            .is_some_and(|n| cp_keys.iter().any(|k| n.contains_key(*k)));
    let tolerated: BTreeSet<&str> = pod
        .tolerations
        .iter()
        .flatten()
        .filter(|t| t.effect.as_deref() == Some("NoSchedule"))
        .filter_map(|t| t.key.as_deref())
        .collect();
    if expect.control_plane {
        r.ensure(
            pinned_to_cp,
            "control-plane",
            "must require control-plane nodes (node affinity or nodeSelector)",
        );
        r.ensure(
            cp_keys.iter().all(|k| tolerated.contains(k)),
            "control-plane",
            "must tolerate the control-plane NoSchedule taints",
        );
        let args = server.args.clone().unwrap_or_default();
        let flags = server_flags(&args).unwrap_or_default();
        let key_from_secret = flag(&flags, "--sign-key").first().is_some_and(
            |p| matches!(mount_of(server, pod, p), Some((_, Some(v), _)) if v.secret.is_some()),
        );
        r.ensure(
            key_from_secret,
            "sign-key",
            "--sign-key must be a file from a Secret volume",
        );
    } else {
        r.ensure(
            !pinned_to_cp && tolerated.is_empty(),
            "control-plane",
            "only the control-plane overlay schedules onto control-plane nodes",
        );
    }
}

fn check_mirror(
    server: &Container,
    pod: &PodSpec,
    config_maps: &BTreeMap<&str, &ConfigMap>,
    r: &mut Report<'_>,
) {
    let args = server.args.clone().unwrap_or_default();
    let flags = server_flags(&args).unwrap_or_default();
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

/// The objects around the Deployment: ServiceAccount, Service, PDB,
/// NetworkPolicy, ServiceMonitor.
#[allow(clippy::too_many_arguments)]
fn check_companions(
    objects: &[Object],
    pod_labels: &BTreeMap<String, String>,
    pod: &PodSpec,
    port: Option<i32>,
    replicas: i32,
    expect: &Expect,
    deployment: &str,
    out: &mut Vec<Violation>,
) {
    let mut r = Report {
        out,
        object: deployment.to_owned(),
    };
    let sa_name = pod.service_account_name.as_deref().unwrap_or("default");
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
    let mut seen = BTreeMap::<&str, usize>::new();
    for o in objects {
        let mut r = Report {
            out: r.out,
            object: o.id(),
        };
        match o {
            Object::Service(s) => {
                *seen.entry("Service").or_default() += 1;
                let spec = s.spec.as_ref();
                r.ensure(
                    spec.and_then(|s| s.type_.as_deref()).unwrap_or("ClusterIP") == "ClusterIP",
                    "service",
                    "type must be ClusterIP",
                );
                let sel = spec.and_then(|s| s.selector.clone()).unwrap_or_default();
                r.ensure(
                    !sel.is_empty() && sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
                    "service",
                    "selector must select the server pods",
                );
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
            Object::PodDisruptionBudget(p) => {
                *seen.entry("PodDisruptionBudget").or_default() += 1;
                let spec = p.spec.as_ref();
                r.ensure(
                    labels_match(spec.and_then(|s| s.selector.as_ref()), pod_labels),
                    "pdb",
                    "selector must select the server pods",
                );
                let min = match spec.and_then(|s| s.min_available.as_ref()) {
                    Some(IntOrString::Int(n)) => Some(*n),
                    _ => None,
                };
                r.ensure(
                    min.is_some_and(|m| m >= 1 && m < replicas),
                    "pdb",
                    format!("minAvailable must be in 1..{replicas}, is {min:?}"),
                );
            }
            Object::NetworkPolicy(n) => {
                *seen.entry("NetworkPolicy").or_default() += 1;
                check_network_policy(n, pod_labels, port, expect, &mut r);
            }
            Object::ServiceMonitor(m) => {
                *seen.entry("ServiceMonitor").or_default() += 1;
                r.ensure(
                    labels_match(Some(&m.spec.selector), pod_labels)
                        && m.spec.endpoints.len() == 1
                        && m.spec.endpoints[0].port == PORT_NAME
                        && m.spec.endpoints[0].path.as_deref() == Some("/metrics"),
                    "service-monitor",
                    "must scrape /metrics on the Service's http port",
                );
            }
            _ => {}
        }
    }
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

fn check_network_policy(
    n: &k8s_openapi::api::networking::v1::NetworkPolicy,
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
    let port_set = |ports: Option<&Vec<k8s_openapi::api::networking::v1::NetworkPolicyPort>>| {
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
    };
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

#[cfg(test)]
mod tests;
