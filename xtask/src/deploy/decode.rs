//! Rendered manifests to typed objects, strictly: every document must be a
//! kind we ship, decode into its k8s-openapi type, have no field the type
//! lacks (k8s-openapi's `Deserialize` skips those silently; `serde_ignored`
//! reports them) and survive a round trip unchanged (which also catches
//! explicit `null`s and anything else the typed view would drop).

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Bound on documents in one rendered target (ours have about ten).
pub const MAX_DOCUMENTS: usize = 200;

/// One decoded object. (A rendering holds a few dozen: their size does
/// not matter.)
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Object {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ConfigMap(ConfigMap),
    Secret(Secret),
    Service(Service),
    Deployment(Deployment),
    DaemonSet(DaemonSet),
    PodDisruptionBudget(PodDisruptionBudget),
    NetworkPolicy(NetworkPolicy),
    HorizontalPodAutoscaler(HorizontalPodAutoscaler),
    ServiceMonitor(ServiceMonitor),
}

impl Object {
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Namespace(_) => "Namespace",
            Object::ServiceAccount(_) => "ServiceAccount",
            Object::ConfigMap(_) => "ConfigMap",
            Object::Secret(_) => "Secret",
            Object::Service(_) => "Service",
            Object::Deployment(_) => "Deployment",
            Object::DaemonSet(_) => "DaemonSet",
            Object::PodDisruptionBudget(_) => "PodDisruptionBudget",
            Object::NetworkPolicy(_) => "NetworkPolicy",
            Object::HorizontalPodAutoscaler(_) => "HorizontalPodAutoscaler",
            Object::ServiceMonitor(_) => "ServiceMonitor",
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Object::Namespace(o) => &o.metadata,
            Object::ServiceAccount(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::Deployment(o) => &o.metadata,
            Object::DaemonSet(o) => &o.metadata,
            Object::PodDisruptionBudget(o) => &o.metadata,
            Object::NetworkPolicy(o) => &o.metadata,
            Object::HorizontalPodAutoscaler(o) => &o.metadata,
            Object::ServiceMonitor(o) => &o.metadata,
        }
    }

    /// `Kind/name`, for messages.
    pub fn id(&self) -> String {
        format!(
            "{}/{}",
            self.kind(),
            self.metadata().name.as_deref().unwrap_or("<unnamed>")
        )
    }
}

/// The Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1), only
/// the fields we use; anything else is refused.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitor {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ServiceMonitorSpec,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    pub selector: LabelSelector,
    pub endpoints: Vec<ServiceMonitorEndpoint>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_label: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitorEndpoint {
    /// The Service's port name.
    pub port: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scrape_timeout: Option<String>,
}

const SERVICE_MONITOR_API_VERSION: &str = "monitoring.coreos.com/v1";

/// Splits kubectl's multi-document YAML into JSON values (empty documents
/// are skipped).
pub fn split_documents(yaml: &str) -> Result<Vec<serde_json::Value>> {
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(yaml).enumerate() {
        ensure!(
            i < MAX_DOCUMENTS,
            "more than {MAX_DOCUMENTS} YAML documents"
        );
        let v = serde_json::Value::deserialize(doc)
            .with_context(|| format!("YAML document {}", i + 1))?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

/// Decodes `v` as `T`, refusing fields `T` does not have and anything a
/// round trip through `T` does not reproduce.
pub fn strict<T: DeserializeOwned + Serialize>(v: &serde_json::Value) -> Result<T> {
    let mut unknown = Vec::new();
    let typed: T = serde_ignored::deserialize(v.clone(), |path| unknown.push(dotted(&path)))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if !unknown.is_empty() {
        bail!("unknown field(s): {}", unknown.join(", "));
    }
    let back = serde_json::to_value(&typed).context("re-encoding")?;
    if let Some(diff) = first_difference(v, &back, "") {
        bail!("does not survive a typed round trip: {diff}");
    }
    Ok(typed)
}

/// `spec.template.spec.containers[0].name` for a serde_ignored path
/// (which also shows Option and newtype layers).
fn dotted(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", dotted(parent)),
        Path::Map { parent, key } => {
            let p = dotted(parent);
            if p.is_empty() {
                key.clone()
            } else {
                format!("{p}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => dotted(parent),
    }
}

/// Where `a` (what was rendered) and `b` (its typed round trip) first
/// differ, as a JSON path.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value, path: &str) -> Option<String> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                let p = format!("{path}.{k}");
                match y.get(k) {
                    Some(vb) => {
                        if let Some(d) = first_difference(va, vb, &p) {
                            return Some(d);
                        }
                    }
                    None => return Some(format!("{p} ({va}) is dropped")),
                }
            }
            y.keys()
                .find(|k| !x.contains_key(*k))
                .map(|k| format!("{path}.{k} appears"))
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Some(format!("{path} has {} items, then {}", x.len(), y.len()));
            }
            x.iter()
                .zip(y)
                .enumerate()
                .find_map(|(i, (va, vb))| first_difference(va, vb, &format!("{path}[{i}]")))
        }
        _ if a == b => None,
        _ => Some(format!("{path}: {a} became {b}")),
    }
}

/// Decodes one document by its `apiVersion` and `kind`.
pub fn decode(v: &serde_json::Value) -> Result<Object> {
    let api_version = v.get("apiVersion").and_then(|x| x.as_str()).unwrap_or("");
    let kind = v.get("kind").and_then(|x| x.as_str()).unwrap_or("");
    let name = v
        .pointer("/metadata/name")
        .and_then(|x| x.as_str())
        .unwrap_or("<unnamed>");
    let what = format!("{kind}/{name} ({api_version})");
    let obj = match (api_version, kind) {
        ("v1", "Namespace") => strict(v).map(Object::Namespace),
        ("v1", "ServiceAccount") => strict(v).map(Object::ServiceAccount),
        ("v1", "ConfigMap") => strict(v).map(Object::ConfigMap),
        ("v1", "Secret") => strict(v).map(Object::Secret),
        ("v1", "Service") => strict(v).map(Object::Service),
        ("apps/v1", "Deployment") => strict(v).map(Object::Deployment),
        ("apps/v1", "DaemonSet") => strict(v).map(Object::DaemonSet),
        ("policy/v1", "PodDisruptionBudget") => strict(v).map(Object::PodDisruptionBudget),
        ("networking.k8s.io/v1", "NetworkPolicy") => strict(v).map(Object::NetworkPolicy),
        ("autoscaling/v2", "HorizontalPodAutoscaler") => {
            strict(v).map(Object::HorizontalPodAutoscaler)
        }
        (SERVICE_MONITOR_API_VERSION, "ServiceMonitor") => {
            strict::<ServiceMonitor>(v).map(Object::ServiceMonitor)
        }
        _ => bail!("{what}: not a kind deploy/ is expected to contain"),
    };
    obj.with_context(|| what)
}

/// Splits and decodes a whole rendering.
pub fn decode_all(yaml: &str) -> Result<Vec<Object>> {
    split_documents(yaml)?.iter().map(decode).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD_DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: d
spec:
  replicas: 2
  selector:
    matchLabels: {app: x}
  template:
    metadata:
      labels: {app: x}
    spec:
      containers:
        - name: c
          image: example.com/c:1
          resources:
            limits: {cpu: "1", memory: 1Gi}
      volumes:
        - name: v
          image: {reference: "example.com/os:1", pullPolicy: IfNotPresent}
"#;

    const GOOD_MONITOR: &str = r#"
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: m, namespace: n}
spec:
  selector: {matchLabels: {app: x}}
  endpoints: [{port: http, path: /metrics, interval: 30s}]
"#;

    fn one(yaml: &str) -> Result<Object> {
        let docs = split_documents(yaml)?;
        assert_eq!(docs.len(), 1);
        decode(&docs[0])
    }

    /// Each case: a document, and either the kind it decodes to or a
    /// fragment of the error.
    #[test]
    fn strict_decoding() {
        let cases: &[(&str, String, Result<&str, &str>)] = &[
            ("deployment", GOOD_DEPLOYMENT.into(), Ok("Deployment")),
            (
                "unknown field deep inside",
                GOOD_DEPLOYMENT.replace(
                    "          resources:",
                    "          resourcez: {}\n          resources:",
                ),
                Err("unknown field(s): spec.template.spec.containers[0].resourcez"),
            ),
            (
                "unknown top-level field",
                format!("{GOOD_DEPLOYMENT}extra: 1\n"),
                Err("unknown field(s): extra"),
            ),
            (
                "wrong type",
                GOOD_DEPLOYMENT.replace("replicas: 2", "replicas: two"),
                Err("invalid type"),
            ),
            (
                "wrong type in a list",
                GOOD_DEPLOYMENT.replace("image: example.com/c:1", "image: [a, b]"),
                Err("invalid type"),
            ),
            (
                "explicit null",
                GOOD_DEPLOYMENT.replace("replicas: 2", "replicas: null"),
                Err("round trip"),
            ),
            (
                "kind not shipped",
                "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\n".into(),
                Err("not a kind"),
            ),
            (
                "apiVersion of another group",
                GOOD_DEPLOYMENT.replace("apps/v1", "extensions/v1beta1"),
                Err("not a kind"),
            ),
            ("service monitor", GOOD_MONITOR.into(), Ok("ServiceMonitor")),
            (
                "service monitor unknown field",
                GOOD_MONITOR.replace("interval: 30s", "interval: 30s, honorLabels: true"),
                Err("honorLabels"),
            ),
            (
                "service monitor wrong type",
                GOOD_MONITOR.replace("port: http", "port: [80]"),
                Err("invalid type"),
            ),
            (
                "service monitor unknown metadata field",
                GOOD_MONITOR.replace("metadata: {name: m", "metadata: {nmae: x, name: m"),
                Err("metadata.nmae"),
            ),
        ];
        for (name, doc, want) in cases {
            let got = one(doc);
            match (want, got) {
                (Ok(kind), Ok(o)) => assert_eq!(o.kind(), *kind, "{name}"),
                (Err(frag), Err(e)) => {
                    let msg = format!("{e:#}");
                    assert!(msg.contains(frag), "{name}: error {msg:?} lacks {frag:?}");
                }
                (Ok(_), Err(e)) => panic!("{name}: unexpected error {e:#}"),
                (Err(frag), Ok(o)) => panic!("{name}: decoded {} despite {frag:?}", o.id()),
            }
        }
    }

    #[test]
    fn splits_documents() {
        let yaml = format!("---\n{GOOD_DEPLOYMENT}---\n---\n{GOOD_MONITOR}");
        let objs = decode_all(&yaml).unwrap();
        let kinds: Vec<_> = objs.iter().map(Object::kind).collect();
        assert_eq!(kinds, ["Deployment", "ServiceMonitor"]);
        assert!(split_documents("a: [").is_err());
    }
}
