//! The server container: its args, the port it listens on, and its probes'
//! meaning.

use super::contract::{Expect, HEALTH_PATH, PORT_NAME, READY_PATH};
use super::report::Report;
use super::values::{flag, server_flags};
use super::wiring;
use k8s_openapi::api::core::v1::{ConfigMap, Container, ContainerPort, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

/// The server container: args, probes, ports, and that every path it is
/// given is mounted (the root filesystem is read-only). Returns the
/// container port it listens on.
pub(super) fn check_server(
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
    let listen_port = check_listen(c, &flags, r);
    check_probes(c, listen_port, r);
    wiring::check_path_flags(c, pod, &flags, config_maps, r);
    wiring::check_required_flags(&flags, expect, r);
    listen_port
}

/// --listen and the named container port agree, and no port is a host
/// port. Returns the --listen port.
fn check_listen(c: &Container, flags: &[(String, String)], r: &mut Report<'_>) -> Option<i32> {
    let listen = flag(flags, "--listen");
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
    listen_port
}

/// Ready (and started) means verified content is published; alive means
/// the HTTP server answers. Each probe GETs its path, in plain HTTP, on
/// the --listen port.
fn check_probes(c: &Container, listen_port: Option<i32>, r: &mut Report<'_>) {
    let ports = c.ports.as_deref().unwrap_or(&[]);
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
                let port = container_port(ports, &h.port);
                r.ensure(
                    port.is_some() && port == listen_port,
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
}

/// The port number a probe names, by number or by container port name.
fn container_port(ports: &[ContainerPort], port: &IntOrString) -> Option<i32> {
    match port {
        IntOrString::Int(n) => Some(*n),
        IntOrString::String(s) => ports
            .iter()
            .find(|p| p.name.as_deref() == Some(s))
            .map(|p| p.container_port),
    }
}
