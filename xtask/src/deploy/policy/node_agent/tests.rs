//! Each node-agent invariant, broken one at a time on the rendered
//! base+node-agent, is reported under its rule.

use super::super::tests::{component_docs, violations, Case};
use serde_json::{json, Value};

/// The DaemonSet named `name`'s pod.
fn pod<'a>(docs: &'a mut [Value], name: &str) -> &'a mut Value {
    let d = docs
        .iter_mut()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no DaemonSet {name}"));
    &mut d["spec"]["template"]["spec"]
}

fn workers(docs: &mut [Value]) -> &mut Value {
    pod(docs, "oscontent-node-agent-workers")
}

fn agent(docs: &mut [Value]) -> &mut Value {
    &mut workers(docs)["containers"][0]
}

fn args(docs: &mut [Value]) -> &mut Vec<Value> {
    agent(docs)["args"].as_array_mut().unwrap()
}

fn agent_policy(docs: &mut [Value]) -> &mut Value {
    let n = docs
        .iter_mut()
        .find(|d| d["kind"] == "NetworkPolicy" && d["metadata"]["name"] == "oscontent-node-agent")
        .unwrap();
    &mut n["spec"]
}

fn drop_arg(docs: &mut [Value], prefix: &str) {
    args(docs).retain(|a| !a.as_str().unwrap().starts_with(prefix));
}

// long-fn: a table of broken manifests, one row an invariant
#[test]
fn each_broken_node_agent_invariant_is_reported() {
    let cases: &[Case] = &[
        ("the host's root", "host-path", |d| {
            workers(d)["volumes"][0]["hostPath"]["path"] = json!("/")
        }),
        ("a hostPath that may be created", "host-path", |d| {
            workers(d)["volumes"][0]["hostPath"]["type"] = json!("DirectoryOrCreate")
        }),
        ("SYS_ADMIN", "capabilities", |d| {
            agent(d)["securityContext"]["capabilities"]["add"]
                .as_array_mut()
                .unwrap()
                .push(json!("SYS_ADMIN"))
        }),
        ("capabilities kept", "capabilities", |d| {
            agent(d)["securityContext"]["capabilities"]["drop"] = json!([])
        }),
        ("privileged", "privileged", |d| {
            agent(d)["securityContext"]["privileged"] = json!(true)
        }),
        ("escalation", "privilege-escalation", |d| {
            agent(d)["securityContext"]["allowPrivilegeEscalation"] = json!(true)
        }),
        ("a writable root", "read-only-root", |d| {
            agent(d)["securityContext"]["readOnlyRootFilesystem"] = json!(false)
        }),
        ("no seccomp", "seccomp", |d| {
            agent(d)["securityContext"]
                .as_object_mut()
                .unwrap()
                .remove("seccompProfile");
            workers(d)["securityContext"]
                .as_object_mut()
                .unwrap()
                .remove("seccompProfile");
        }),
        ("host network", "host-namespaces", |d| {
            workers(d)["hostNetwork"] = json!(true)
        }),
        ("a token", "automount-token", |d| {
            workers(d)["automountServiceAccountToken"] = json!(true)
        }),
        ("no memory limit", "resources", |d| {
            agent(d)["resources"]["limits"]
                .as_object_mut()
                .unwrap()
                .remove("memory");
        }),
        ("no keys", "node-agent", |d| drop_arg(d, "--trusted-keys")),
        ("not following", "node-agent", |d| drop_arg(d, "--follow")),
        ("another repo", "node-agent", |d| {
            drop_arg(d, "--repo");
            args(d).push(json!("--repo=/var/tmp/repo"))
        }),
        ("a node name typed in", "node-agent", |d| {
            let env = agent(d)["env"].as_array_mut().unwrap();
            let i = env.iter().position(|e| e["name"] == "NODE_NAME").unwrap();
            env[i] = json!({"name": "NODE_NAME", "value": "worker-0"});
        }),
        ("metrics on an undeclared port", "node-agent", |d| {
            drop_arg(d, "--metrics-listen");
            args(d).push(json!("--metrics-listen=0.0.0.0:9999"))
        }),
        ("a worker as control plane", "node-agent", |d| {
            args(d).push(json!("--control-plane"))
        }),
        ("the control plane as a worker", "node-agent", |d| {
            let cp = pod(d, "oscontent-node-agent-control-plane");
            cp["containers"][0]["args"]
                .as_array_mut()
                .unwrap()
                .retain(|a| a != "--control-plane");
        }),
        ("the control plane in the foreground", "node-agent", |d| {
            let cp = pod(d, "oscontent-node-agent-control-plane");
            let a = cp["containers"][0]["args"].as_array_mut().unwrap();
            let i = a
                .iter()
                .position(|a| a == "--io-profile=background")
                .unwrap();
            a[i] = json!("--io-profile=foreground");
        }),
        ("agents open to any port", "node-agent-network", |d| {
            agent_policy(d)["ingress"] = json!([{}])
        }),
        ("agents reaching a registry", "node-agent-network", |d| {
            agent_policy(d)["egress"]
                .as_array_mut()
                .unwrap()
                .push(json!({"ports": [{"protocol": "TCP", "port": 443}]}))
        }),
        ("no policy for the agents", "node-agent-network", |d| {
            d.retain(|o| {
                !(o["kind"] == "NetworkPolicy" && o["metadata"]["name"] == "oscontent-node-agent")
            })
        }),
        ("one DaemonSet only", "node-agent", |d| {
            d.retain(|o| o["metadata"]["name"] != "oscontent-node-agent-control-plane")
        }),
    ];
    let (docs, expect) = component_docs("node-agent");
    for (name, rule, mutate) in cases {
        let mut docs = docs.clone();
        mutate(&mut docs);
        let v = violations(&docs, &expect);
        assert!(
            v.iter().any(|x| x.rule == *rule),
            "{name}: expected a {rule:?} violation, got {v:#?}"
        );
    }
    // The base alone must not grow an agent.
    let v = violations(&docs, &super::Expect::registry());
    assert!(v.iter().any(|x| x.rule == "node-agent"), "{v:#?}");
}
