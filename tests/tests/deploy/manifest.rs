//! The rendered deploy/base, read as untyped documents: `kubectl kustomize`
//! emits multi-document YAML, walked here as `serde_json::Value` with
//! small typed views of what the test reads (the server container's args,
//! env, mounts, ports and probes; the pod's volumes; the ConfigMaps).
//! Strict decoding against the Kubernetes API is `cargo xtask
//! check-deploy`'s job, not this suite's.

use anyhow::{Context, Result};
use oscontent_testkit::check_output;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The container that runs `oscontent-server` (xtask's
/// `deploy::policy::SERVER_CONTAINER`).
pub const SERVER_CONTAINER: &str = "server";
/// The key OpenShift injects the cluster CA bundle under, in a ConfigMap
/// labelled for it (xtask's `deploy::policy::INJECTED_CA_KEY`).
pub const INJECTED_CA_KEY: &str = "ca-bundle.crt";
/// Bound on one `kubectl kustomize`.
const RENDER_TIMEOUT: Duration = Duration::from_secs(120);

/// The server's Deployment pod, its server container, and the ConfigMaps'
/// data by name.
pub struct Manifest {
    pub pod: Value,
    pub server: Value,
    pub config_maps: BTreeMap<String, BTreeMap<String, String>>,
}

/// `kubectl kustomize deploy/base`.
fn render_base() -> Result<String> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/base");
    check_output(
        Command::new("kubectl").arg("kustomize").arg(&dir),
        RENDER_TIMEOUT,
    )
    .with_context(|| {
        format!(
            "rendering {} (needs kubectl with kustomize v5)",
            dir.display()
        )
    })
}

/// Every document of a multi-document YAML stream.
fn documents(yaml: &str) -> Result<Vec<Value>> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).context("parsing the rendered YAML"))
        .filter(|v| !matches!(v, Ok(Value::Null)))
        .collect()
}

/// A string field, or "".
fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

/// An array field (none if absent).
fn items<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v[key].as_array().into_iter().flatten()
}

/// Renders the base and picks out the Deployment and ConfigMaps.
pub fn manifest() -> Manifest {
    let yaml = render_base().unwrap_or_else(|e| panic!("{e:#}"));
    let docs = documents(&yaml).unwrap_or_else(|e| panic!("{e:#}"));
    let mut config_maps = BTreeMap::new();
    let mut pod = None;
    for d in docs {
        match text(&d, "kind") {
            "ConfigMap" => {
                let data = serde_json::from_value(d["data"].clone()).unwrap_or_default();
                config_maps.insert(text(&d["metadata"], "name").to_owned(), data);
            }
            "Deployment" => pod = Some(d["spec"]["template"]["spec"].clone()),
            _ => {}
        }
    }
    let pod = pod.expect("the base renders one Deployment with a pod spec");
    let server = items(&pod, "containers")
        .find(|c| text(c, "name") == SERVER_CONTAINER)
        .expect("a server container")
        .clone();
    Manifest {
        pod,
        server,
        config_maps,
    }
}

/// One `env` entry of the server container.
pub struct EnvVar {
    pub name: String,
    pub value: Option<String>,
    pub value_from: bool,
}

/// A `volumeMounts` entry.
pub struct Mount {
    pub name: String,
    pub mount_path: String,
}

/// What a ConfigMap or Secret volume projects: all keys (`None`), or the
/// listed key -> path.
pub type KeyPaths = Option<BTreeMap<String, String>>;

/// A pod volume, as far as the test cares.
pub enum Volume {
    ConfigMap { name: String, items: KeyPaths },
    Secret { name: String, items: KeyPaths },
    EmptyDir,
    Other,
}

/// Where a key of a projected volume lands: its own name without `items`,
/// else only if listed.
pub fn key_path(items: &KeyPaths, key: &str) -> Option<String> {
    match items {
        None => Some(key.to_owned()),
        Some(m) => m.get(key).cloned(),
    }
}

/// An `httpGet` probe.
pub struct HttpGet {
    /// A number, or the name of a container port.
    pub port: Value,
    pub scheme: Option<String>,
    pub path: Option<String>,
}

fn key_paths(source: &Value) -> KeyPaths {
    source["items"].as_array().map(|a| {
        a.iter()
            .map(|i| (text(i, "key").to_owned(), text(i, "path").to_owned()))
            .collect()
    })
}

impl Manifest {
    /// The server container's args.
    pub fn args(&self) -> Vec<String> {
        items(&self.server, "args")
            .map(|a| a.as_str().expect("args are strings").to_owned())
            .collect()
    }

    pub fn env(&self) -> Vec<EnvVar> {
        items(&self.server, "env")
            .map(|e| EnvVar {
                name: text(e, "name").to_owned(),
                value: e["value"].as_str().map(str::to_owned),
                value_from: !e["valueFrom"].is_null(),
            })
            .collect()
    }

    pub fn volume_mounts(&self) -> Vec<Mount> {
        items(&self.server, "volumeMounts")
            .map(|m| Mount {
                name: text(m, "name").to_owned(),
                mount_path: text(m, "mountPath").to_owned(),
            })
            .collect()
    }

    /// The pod volume `name`, if declared.
    pub fn volume(&self, name: &str) -> Option<Volume> {
        let v = items(&self.pod, "volumes").find(|v| text(v, "name") == name)?;
        Some(if v["configMap"].is_object() {
            Volume::ConfigMap {
                name: text(&v["configMap"], "name").to_owned(),
                items: key_paths(&v["configMap"]),
            }
        } else if v["secret"].is_object() {
            Volume::Secret {
                name: text(&v["secret"], "secretName").to_owned(),
                items: key_paths(&v["secret"]),
            }
        } else if v["emptyDir"].is_object() {
            Volume::EmptyDir
        } else {
            Volume::Other
        })
    }

    /// The container port named `name`.
    pub fn port_named(&self, name: &str) -> Option<i64> {
        items(&self.server, "ports")
            .find(|p| text(p, "name") == name)
            .and_then(|p| p["containerPort"].as_i64())
    }

    /// The `httpGet` of probe `what` (`startupProbe`, ...), if it is one.
    pub fn http_probe(&self, what: &str) -> Option<HttpGet> {
        let h = &self.server[what]["httpGet"];
        h.is_object().then(|| HttpGet {
            port: h["port"].clone(),
            scheme: h["scheme"].as_str().map(str::to_owned),
            path: h["path"].as_str().map(str::to_owned),
        })
    }
}
