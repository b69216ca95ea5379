//! What deploy/ and the server agree on (names, paths, ports), and what
//! each rendering is for beyond the common invariants.

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
    /// A HorizontalPodAutoscaler on CPU owns the replica count.
    pub autoscaled: bool,
    /// The node agent's two DaemonSets (`components/node-agent`).
    pub node_agent: bool,
}

impl Expect {
    pub const fn registry() -> Self {
        Expect {
            source: Source::Registry,
            control_plane: false,
            mirror: false,
            service_monitor: false,
            autoscaled: false,
            node_agent: false,
        }
    }
}
