//! Each invariant, broken one at a time on the real rendered base (and
//! overlays), must be reported under its rule; the untouched renderings
//! must be clean.

use super::*;
use crate::deploy::{self, decode};
use serde_json::{json, Value};
use std::sync::OnceLock;

fn rendered(dir: &str) -> Vec<Value> {
    deploy::require_kubectl().unwrap();
    let yaml = deploy::render(&deploy::deploy_dir().join(dir)).unwrap();
    decode::split_documents(&yaml).unwrap()
}

fn base_docs() -> &'static Vec<Value> {
    static B: OnceLock<Vec<Value>> = OnceLock::new();
    B.get_or_init(|| rendered("base"))
}

pub(super) fn violations(docs: &[Value], expect: &Expect) -> Vec<Violation> {
    let objs: Vec<Object> = docs
        .iter()
        .map(|d| decode::decode(d).unwrap_or_else(|e| panic!("{e:#}")))
        .collect();
    check(&objs, expect)
}

pub(super) fn kind_mut<'a>(docs: &'a mut [Value], kind: &str) -> &'a mut Value {
    docs.iter_mut()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

fn pod(docs: &mut [Value]) -> &mut Value {
    &mut kind_mut(docs, "Deployment")["spec"]["template"]["spec"]
}

fn server(docs: &mut [Value]) -> &mut Value {
    &mut pod(docs)["containers"][0]
}

fn set_arg(docs: &mut [Value], prefix: &str, to: Option<&str>) {
    let args = server(docs)["args"].as_array_mut().unwrap();
    let i = args
        .iter()
        .position(|a| a.as_str().unwrap().starts_with(prefix))
        .unwrap_or_else(|| panic!("no arg {prefix}"));
    match to {
        Some(t) => args[i] = json!(t),
        None => {
            args.remove(i);
        }
    }
}

/// The base plus one component, as check-deploy renders it, and what it
/// must be.
pub(super) fn component_docs(component: &str) -> (Vec<Value>, Expect) {
    deploy::require_kubectl().unwrap();
    let work = tempfile::tempdir().unwrap();
    let target = deploy::targets(&deploy::deploy_dir(), work.path())
        .unwrap()
        .into_iter()
        .find(|t| t.name == format!("base+{component}"))
        .unwrap_or_else(|| panic!("no target for component {component}"));
    let yaml = deploy::render(&target.dir).unwrap();
    (decode::split_documents(&yaml).unwrap(), target.expect)
}

pub(super) type Mutation = fn(&mut Vec<Value>);
/// (what is broken, the rule it must be reported under, how to break it).
pub(super) type Case = (&'static str, &'static str, Mutation);

#[test]
fn untouched_renderings_are_clean() {
    let v = violations(base_docs(), &Expect::registry());
    assert!(v.is_empty(), "base: {v:#?}");
    for name in ["image-volume", "init-copy", "control-plane", "disconnected"] {
        let docs = rendered(&format!("overlays/{name}"));
        let expect = deploy::overlay_expectations(name).unwrap();
        let v = violations(&docs, &expect);
        assert!(v.is_empty(), "{name}: {v:#?}");
    }
    for (component, _) in deploy::component_expectations() {
        let (docs, expect) = component_docs(component);
        let v = violations(&docs, &expect);
        assert!(v.is_empty(), "base+{component}: {v:#?}");
    }
}

/// Each case, applied alone to the base, is reported under its rule.
fn assert_each_reported(cases: &[Case]) {
    for (name, rule, mutate) in cases {
        let mut docs = base_docs().clone();
        mutate(&mut docs);
        let v = violations(&docs, &Expect::registry());
        assert!(
            v.iter().any(|x| x.rule == *rule),
            "{name}: expected a {rule:?} violation, got {v:#?}"
        );
    }
}

/// The hardened pod and its containers.
const POD_SECURITY: &[Case] = &[
    ("token automount", "automount-token", |d| {
        pod(d)["automountServiceAccountToken"] = json!(true)
    }),
    ("token automount unset", "automount-token", |d| {
        pod(d)
            .as_object_mut()
            .unwrap()
            .remove("automountServiceAccountToken");
    }),
    ("hostNetwork", "host-namespaces", |d| {
        pod(d)["hostNetwork"] = json!(true)
    }),
    ("hostPID", "host-namespaces", |d| {
        pod(d)["hostPID"] = json!(true)
    }),
    ("hostPort", "host-namespaces", |d| {
        server(d)["ports"][0]["hostPort"] = json!(8080)
    }),
    ("hostPath volume", "host-path", |d| {
        pod(d)["volumes"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "h", "hostPath": {"path": "/"}}))
    }),
    ("root allowed", "run-as-non-root", |d| {
        pod(d)["securityContext"]["runAsNonRoot"] = json!(false);
        server(d)["securityContext"]
            .as_object_mut()
            .unwrap()
            .remove("runAsNonRoot");
    }),
    ("uid 0", "run-as-non-root", |d| {
        server(d)["securityContext"]["runAsUser"] = json!(0)
    }),
    ("seccomp unconfined", "seccomp", |d| {
        server(d)["securityContext"]["seccompProfile"]["type"] = json!("Unconfined")
    }),
    ("privilege escalation", "privilege-escalation", |d| {
        server(d)["securityContext"]["allowPrivilegeEscalation"] = json!(true)
    }),
    ("writable root", "read-only-root", |d| {
        server(d)["securityContext"]["readOnlyRootFilesystem"] = json!(false)
    }),
    ("privileged", "privileged", |d| {
        server(d)["securityContext"]["privileged"] = json!(true)
    }),
    ("caps not dropped", "capabilities", |d| {
        server(d)["securityContext"]["capabilities"]["drop"] = json!(["NET_RAW"])
    }),
    ("caps added", "capabilities", |d| {
        server(d)["securityContext"]["capabilities"]["add"] = json!(["NET_ADMIN"])
    }),
    ("no cpu limit", "resources", |d| {
        server(d)["resources"]["limits"]
            .as_object_mut()
            .unwrap()
            .remove("cpu");
    }),
    ("no memory request", "resources", |d| {
        server(d)["resources"]["requests"]
            .as_object_mut()
            .unwrap()
            .remove("memory");
    }),
    ("latest tag", "image-pinned", |d| {
        server(d)["image"] = json!("quay.io/x/y:latest")
    }),
    ("untagged", "image-pinned", |d| {
        server(d)["image"] = json!("registry:5000/x/y")
    }),
    ("emptyDir unbounded", "empty-dir-size", |d| {
        pod(d)["volumes"][0]["emptyDir"] = json!({})
    }),
    ("emptyDir beyond the storage limit", "empty-dir-size", |d| {
        pod(d)["volumes"][0]["emptyDir"]["sizeLimit"] = json!("7Gi")
    }),
    ("no storage limit", "empty-dir-size", |d| {
        server(d)["resources"]["limits"]
            .as_object_mut()
            .unwrap()
            .remove("ephemeral-storage");
    }),
    ("no topology spread", "topology-spread", |d| {
        pod(d)
            .as_object_mut()
            .unwrap()
            .remove("topologySpreadConstraints");
    }),
];

/// The server container: probes, ports, flags and what they are wired to.
const SERVER: &[Case] = &[
    ("readiness on healthz", "probes", |d| {
        server(d)["readinessProbe"]["httpGet"]["path"] = json!("/healthz")
    }),
    ("startup on healthz", "probes", |d| {
        server(d)["startupProbe"]["httpGet"]["path"] = json!("/healthz")
    }),
    ("liveness on readyz", "probes", |d| {
        server(d)["livenessProbe"]["httpGet"]["path"] = json!("/readyz")
    }),
    ("no liveness", "probes", |d| {
        server(d).as_object_mut().unwrap().remove("livenessProbe");
    }),
    ("probe on another port", "probe-port", |d| {
        server(d)["readinessProbe"]["httpGet"]["port"] = json!(9090)
    }),
    ("probe on unknown port name", "probe-port", |d| {
        server(d)["livenessProbe"]["httpGet"]["port"] = json!("metrics")
    }),
    ("listen elsewhere", "ports", |d| {
        set_arg(d, "--listen=", Some("--listen=0.0.0.0:9090"))
    }),
    ("flag not in = form", "flag-form", |d| {
        set_arg(d, "--listen=", Some("--listen"))
    }),
    ("path on the root fs", "flag-path-mounted", |d| {
        set_arg(d, "--ca=", Some("--ca=/usr/local/share/ca.crt"))
    }),
    ("config key missing", "config-key", |d| {
        set_arg(
            d,
            "--registries-conf=",
            Some("--registries-conf=/etc/oscontent/registries/mirrors.conf"),
        )
    }),
    ("state dir read-only", "state-dir-writable", |d| {
        set_arg(
            d,
            "--state-dir=",
            Some("--state-dir=/etc/oscontent/signatures"),
        )
    }),
    ("no trusted keys", "wiring", |d| {
        set_arg(d, "--trusted-keys=", None)
    }),
    ("sign key on workers", "sign-key", |d| {
        server(d)["args"]
            .as_array_mut()
            .unwrap()
            .push(json!("--sign-key=/etc/oscontent/signatures/k"))
    }),
    ("two sources", "source", |d| {
        server(d)["args"]
            .as_array_mut()
            .unwrap()
            .push(json!("--oscontainer=/var/lib/oscontent"))
    }),
    ("exec probe", "probes", |d| {
        server(d)["livenessProbe"] = json!({"exec": {"command": ["true"]}})
    }),
];

/// The rollout, and scheduling on the worker (base) rendering.
const ROLLOUT: &[Case] = &[
    ("surge without zero unavailable", "rollout", |d| {
        kind_mut(d, "Deployment")["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] = json!(1)
    }),
    ("recreate", "rollout", |d| {
        kind_mut(d, "Deployment")["spec"]["strategy"] = json!({"type": "Recreate"})
    }),
    ("rollout deadline shorter than startup", "rollout", |d| {
        kind_mut(d, "Deployment")["spec"]["progressDeadlineSeconds"] = json!(600)
    }),
    ("one replica", "replicas", |d| {
        kind_mut(d, "Deployment")["spec"]["replicas"] = json!(1)
    }),
    (
        "control-plane scheduling on a worker overlay",
        "control-plane",
        |d| {
            pod(d)["tolerations"] = json!([{"key": "node-role.kubernetes.io/master",
                "operator": "Exists", "effect": "NoSchedule"}])
        },
    ),
];

/// The objects around the Deployment, and what holds for every object.
const OBJECTS: &[Case] = &[
    ("service port", "service", |d| {
        kind_mut(d, "Service")["spec"]["ports"][0]["port"] = json!(8080)
    }),
    ("service port name", "service", |d| {
        kind_mut(d, "Service")["spec"]["ports"][0]["name"] = json!("web")
    }),
    ("service target", "service", |d| {
        kind_mut(d, "Service")["spec"]["ports"][0]["targetPort"] = json!(9090)
    }),
    ("service type", "service", |d| {
        kind_mut(d, "Service")["spec"]["type"] = json!("NodePort")
    }),
    ("pdb blocks drains", "pdb", |d| {
        kind_mut(d, "PodDisruptionBudget")["spec"]["minAvailable"] = json!(2)
    }),
    ("netpol ingress wide", "network-policy", |d| {
        kind_mut(d, "NetworkPolicy")["spec"]["ingress"] = json!([{}])
    }),
    ("netpol egress wide", "network-policy", |d| {
        kind_mut(d, "NetworkPolicy")["spec"]["egress"]
            .as_array_mut()
            .unwrap()
            .push(json!({"ports": [{"protocol": "TCP", "port": 22}]}))
    }),
    ("netpol ingress only", "network-policy", |d| {
        kind_mut(d, "NetworkPolicy")["spec"]["policyTypes"] = json!(["Ingress"])
    }),
    ("service account token", "service-account", |d| {
        kind_mut(d, "ServiceAccount")["automountServiceAccountToken"] = json!(true)
    }),
    ("default namespace", "namespace", |d| {
        kind_mut(d, "Service")["metadata"]["namespace"] = json!("default")
    }),
    ("secret in git", "no-secret-data", |d| {
        d.push(json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "oscontent-pull-secret", "namespace": "oscontent"},
                "data": {".dockerconfigjson": "e30="}}))
    }),
    (
        "a ServiceMonitor outside its component",
        "companions",
        |d| {
            d.push(
                json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
                "metadata": {"name": "m", "namespace": "oscontent"},
                "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "oscontent"}},
                         "endpoints": [{"port": "http", "path": "/metrics"}]}}),
            )
        },
    ),
];

#[test]
fn each_broken_pod_security_invariant_is_reported() {
    assert_each_reported(POD_SECURITY);
}

#[test]
fn each_broken_server_invariant_is_reported() {
    assert_each_reported(SERVER);
}

#[test]
fn each_broken_rollout_invariant_is_reported() {
    assert_each_reported(ROLLOUT);
}

#[test]
fn each_broken_object_invariant_is_reported() {
    assert_each_reported(OBJECTS);
}

/// The overlay-specific expectations, each broken.
#[test]
fn overlay_expectations_are_enforced() {
    let cases: &[(&str, &str, Mutation)] = &[
        ("image-volume", "source", |d| {
            // The volume is no longer an image volume.
            let vols = pod(d)["volumes"].as_array_mut().unwrap();
            let v = vols
                .iter_mut()
                .find(|v| v["name"] == "oscontainer")
                .unwrap();
            *v = json!({"name": "oscontainer", "emptyDir": {"sizeLimit": "1Gi"}});
        }),
        ("image-volume", "image-pinned", |d| {
            let vols = pod(d)["volumes"].as_array_mut().unwrap();
            let v = vols
                .iter_mut()
                .find(|v| v["name"] == "oscontainer")
                .unwrap();
            v["image"]["reference"] = json!("registry.example.com/os/oscontainer");
        }),
        ("image-volume", "network-policy", |d| {
            kind_mut(d, "NetworkPolicy")["spec"]["egress"] =
                json!([{"ports": [{"protocol": "TCP", "port": 443}]}])
        }),
        ("init-copy", "source", |d| {
            pod(d).as_object_mut().unwrap().remove("initContainers");
        }),
        ("init-copy", "read-only-root", |d| {
            pod(d)["initContainers"][0]["securityContext"]["readOnlyRootFilesystem"] = json!(false)
        }),
        ("init-copy", "resources", |d| {
            pod(d)["initContainers"][0]
                .as_object_mut()
                .unwrap()
                .remove("resources");
        }),
        ("control-plane", "control-plane", |d| {
            pod(d).as_object_mut().unwrap().remove("tolerations");
        }),
        ("control-plane", "control-plane", |d| {
            pod(d).as_object_mut().unwrap().remove("affinity");
        }),
        ("control-plane", "sign-key", |d| {
            set_arg(d, "--sign-key=", None)
        }),
        ("control-plane", "sign-pinned", |d| {
            for e in server(d)["env"].as_array_mut().unwrap() {
                if e["name"] == "OSCONTAINER_IMAGE" {
                    e["value"] = json!("registry.example.com/os/oscontainer:1.0.0");
                }
            }
        }),
        ("control-plane", "sign-pinned", |d| {
            set_arg(d, "--image=", Some("--image=oci:/srv/layout:1.0.0"))
        }),
        ("disconnected", "mirror", |d| {
            for doc in d.iter_mut().filter(|x| x["kind"] == "ConfigMap") {
                if let Some(data) = doc.get_mut("data").and_then(Value::as_object_mut) {
                    if let Some(c) = data.get_mut("registries.conf") {
                        *c = json!("# no mirrors\n");
                    }
                }
            }
        }),
    ];
    for (overlay, rule, mutate) in cases {
        let mut docs = rendered(&format!("overlays/{overlay}"));
        mutate(&mut docs);
        let expect = deploy::overlay_expectations(overlay).unwrap();
        let v = violations(&docs, &expect);
        assert!(
            v.iter().any(|x| x.rule == *rule),
            "{overlay}: expected a {rule:?} violation, got {v:#?}"
        );
    }
}

fn hpa(d: &mut [Value]) -> &mut Value {
    &mut kind_mut(d, "HorizontalPodAutoscaler")["spec"]
}

/// The scale-out component's invariants, each broken on base+scale-out.
#[test]
fn scale_out_expectations_are_enforced() {
    let cases: &[Case] = &[
        ("a fixed count beside the autoscaler", "autoscaling", |d| {
            kind_mut(d, "Deployment")["spec"]["replicas"] = json!(3)
        }),
        ("a floor of one", "replicas", |d| {
            hpa(d)["minReplicas"] = json!(1)
        }),
        ("a ceiling at the floor", "autoscaling", |d| {
            hpa(d)["maxReplicas"] = json!(2)
        }),
        ("scaling on memory", "autoscaling", |d| {
            hpa(d)["metrics"][0]["resource"]["name"] = json!("memory")
        }),
        ("a target of 100%", "autoscaling", |d| {
            hpa(d)["metrics"][0]["resource"]["target"]["averageUtilization"] = json!(100)
        }),
        ("aimed at another Deployment", "autoscaling", |d| {
            hpa(d)["scaleTargetRef"]["name"] = json!("other")
        }),
        ("a token CPU request", "autoscaling", |d| {
            server(d)["resources"]["requests"]["cpu"] = json!("100m")
        }),
        ("replicas stacked on one node", "autoscaling", |d| {
            pod(d).as_object_mut().unwrap().remove("affinity");
        }),
        ("two autoscalers", "autoscaling", |d| {
            let second = kind_mut(d, "HorizontalPodAutoscaler").clone();
            d.push(second)
        }),
    ];
    let (docs, expect) = component_docs("scale-out");
    for (name, rule, mutate) in cases {
        let mut docs = docs.clone();
        mutate(&mut docs);
        let v = violations(&docs, &expect);
        assert!(
            v.iter().any(|x| x.rule == *rule),
            "{name}: expected a {rule:?} violation, got {v:#?}"
        );
    }
    // The other way round: the base alone must not grow an autoscaler, and
    // without one it must state its count.
    let (scaled, _) = component_docs("scale-out");
    let mut docs = base_docs().clone();
    docs.push(
        scaled
            .iter()
            .find(|d| d["kind"] == "HorizontalPodAutoscaler")
            .unwrap()
            .clone(),
    );
    let v = violations(&docs, &Expect::registry());
    assert!(v.iter().any(|x| x.rule == "autoscaling"), "{v:#?}");
    let mut docs = base_docs().clone();
    kind_mut(&mut docs, "Deployment")["spec"]
        .as_object_mut()
        .unwrap()
        .remove("replicas");
    let v = violations(&docs, &Expect::registry());
    assert!(v.iter().any(|x| x.rule == "replicas"), "{v:#?}");
}

#[test]
fn quantities() {
    let cases = [
        ("64Mi", Some(64 << 20)),
        ("5Gi", Some(5 << 30)),
        ("1G", Some(1_000_000_000)),
        ("1000", Some(1000)),
        ("1.5Gi", None),
        ("Gi", None),
        ("5Xi", None),
    ];
    for (q, want) in cases {
        assert_eq!(quantity_bytes(q), want, "{q}");
    }
}

#[test]
fn image_pins() {
    let cases = [
        ("quay.io/a/b:1.0", true),
        ("quay.io/a/b@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", true),
        ("quay.io/a/b:1.0@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", true),
        ("localhost:5000/a/b:2", true),
        ("quay.io/a/b:latest", false),
        ("localhost:5000/a/b", false),
        ("quay.io/a/b", false),
        ("quay.io/a/b@sha256:abc", false),
        ("", false),
    ];
    for (image, ok) in cases {
        assert_eq!(pinned(image).is_ok(), ok, "{image}");
    }
}

#[test]
fn flag_forms() {
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        server_flags(&s(&["serve", "--a=1", "--b=x=y"])).unwrap(),
        [("--a".into(), "1".into()), ("--b".into(), "x=y".into())]
    );
    for bad in [
        &["--a=1"][..],
        &["serve", "--a", "1"],
        &["serve", "-a=1"],
        &[],
    ] {
        assert!(server_flags(&s(bad)).is_err(), "{bad:?}");
    }
}
