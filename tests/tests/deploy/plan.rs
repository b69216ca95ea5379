//! From the rendered manifest to a local run: the volumes materialized as
//! directories, the args and env with only the intended substitutions,
//! and the probes resolved to paths on the listen port.

use crate::manifest::{key_path, Manifest, Volume};
use oscontent_testkit::deploy::server_flags;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The env var holding the oscontainer reference (expanded into `--image`
/// by the kubelet's `$(VAR)` rule).
pub const IMAGE_ENV: &str = "OSCONTAINER_IMAGE";

/// The kubelet's `$(VAR)` expansion (`$$` escapes; unknown names stay).
pub fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail.strip_prefix("$$") {
            out.push('$');
            rest = t;
        } else if let Some((name, after)) = tail
            .strip_prefix("$(")
            .and_then(|t| t.split_once(')'))
            .filter(|(n, _)| env.contains_key(*n))
        {
            out.push_str(&env[name]);
            rest = after;
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn kubelet_expansion() {
    let env = BTreeMap::from([("A".to_owned(), "x".to_owned())]);
    for (arg, want) in [
        ("--i=docker://$(A)", "--i=docker://x"),
        ("$$(A)", "$(A)"),
        ("$(B)", "$(B)"),
        ("$(A)$(A)", "xx"),
        ("a$", "a$"),
    ] {
        assert_eq!(expand(arg, &env), want, "{arg}");
    }
}

/// What the test puts where the cluster would: files by (volume source
/// name, key). Anything a mounted ConfigMap renders is used as rendered.
pub struct Provided {
    pub files: BTreeMap<(String, String), Vec<u8>>,
}

/// One file of a mount: (source name, key, path in the mount, rendered
/// content if any).
type MountFile = (String, String, String, Option<Vec<u8>>);

/// The files a volume projects: a ConfigMap's rendered keys and the
/// provided ones; a Secret's provided keys; nothing for an emptyDir.
fn volume_files(m: &Manifest, provided: &Provided, vol_name: &str) -> Vec<MountFile> {
    let vol = m
        .volume(vol_name)
        .unwrap_or_else(|| panic!("mount {vol_name} has no volume"));
    let mut files: Vec<MountFile> = Vec::new();
    match vol {
        Volume::ConfigMap { name, items } => {
            let rendered = m
                .config_maps
                .get(&name)
                .unwrap_or_else(|| panic!("ConfigMap {name} is not rendered"));
            for (k, v) in rendered {
                if let Some(p) = key_path(&items, k) {
                    files.push((name.clone(), k.clone(), p, Some(v.clone().into_bytes())));
                }
            }
            for (src, k) in provided.files.keys() {
                if *src == name && !files.iter().any(|f| &f.1 == k) {
                    let p = key_path(&items, k).unwrap();
                    files.push((src.clone(), k.clone(), p, None));
                }
            }
        }
        Volume::Secret { name, items } => {
            for (src, k) in provided.files.keys() {
                if *src == name {
                    let p = key_path(&items, k)
                        .unwrap_or_else(|| panic!("Secret {name} key {k} is not in items"));
                    files.push((name.clone(), k.clone(), p, None));
                }
            }
        }
        Volume::EmptyDir => {}
        Volume::Other => {
            panic!("volume {vol_name} is neither ConfigMap, Secret nor emptyDir")
        }
    }
    files
}

/// Materializes each of the server's volumeMounts as a directory under
/// `root`, returning mountPath -> directory.
pub fn materialize(m: &Manifest, provided: &Provided, root: &Path) -> BTreeMap<String, PathBuf> {
    let mut map = BTreeMap::new();
    let mut used = BTreeSet::new();
    for vm in m.volume_mounts() {
        let dir = root.join(&vm.name);
        std::fs::create_dir_all(&dir).unwrap();
        for (src, key, path, rendered) in volume_files(m, provided, &vm.name) {
            // Fixture content replaces a rendered placeholder (the trusted
            // keys); otherwise the rendered bytes are used.
            let bytes = match provided.files.get(&(src.clone(), key.clone())) {
                Some(b) => {
                    used.insert((src.clone(), key.clone()));
                    b.clone()
                }
                None => rendered.unwrap(),
            };
            let dest = dir.join(&path);
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            std::fs::write(&dest, bytes).unwrap();
        }
        map.insert(vm.mount_path.clone(), dir);
    }
    let unused: Vec<_> = provided
        .files
        .keys()
        .filter(|k| !used.contains(*k))
        .collect();
    assert!(
        unused.is_empty(),
        "provided content no mount took: {unused:?}"
    );
    map
}

/// One applied substitution, for the audit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subst {
    MountPath(String),
    Listen,
    RegistryHost,
}

pub struct Plan {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub applied: BTreeSet<Subst>,
    /// The image reference's `repository:tag` (what to push).
    pub image_name: String,
    /// The rendered --listen port (what the probes name).
    pub listen_port: i64,
}

/// The env: verbatim, except the registry host of the image reference.
/// Returns it, and the reference's `repository:tag`.
fn plan_env(
    m: &Manifest,
    registry_host: &str,
    applied: &mut BTreeSet<Subst>,
) -> (BTreeMap<String, String>, String) {
    let mut env = BTreeMap::new();
    let mut image_name = None;
    for e in m.env() {
        assert!(!e.value_from, "env {} uses valueFrom", e.name);
        let mut v = e.value.clone().unwrap_or_default();
        if e.name == IMAGE_ENV {
            let (host, name) = v.split_once('/').expect("HOST/REPO:TAG");
            assert!(host.contains('.'), "{v}: the reference names its registry");
            image_name = Some(name.to_owned());
            v = format!("{registry_host}/{name}");
            applied.insert(Subst::RegistryHost);
        }
        env.insert(e.name.clone(), v);
    }
    (
        env,
        image_name.expect("the manifest sets OSCONTAINER_IMAGE"),
    )
}

pub fn plan(
    m: &Manifest,
    mounts: &BTreeMap<String, PathBuf>,
    registry_host: &str,
    supported: &BTreeSet<String>,
) -> Plan {
    let mut applied = BTreeSet::new();
    let (env, image_name) = plan_env(m, registry_host, &mut applied);
    let rendered_args = m.args();
    let flags = server_flags(&rendered_args).unwrap();
    let mut listen_port = None;
    let mut args = vec![rendered_args[0].clone()];
    for (k, v) in flags {
        assert!(
            supported.contains(&k),
            "the manifest passes {k}, which the server does not know"
        );
        let v = expand(&v, &env);
        let value = if k == "--listen" {
            listen_port = v.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
            applied.insert(Subst::Listen);
            "127.0.0.1:0".to_owned()
        } else if let Some((mp, dir)) = mounts
            .iter()
            .filter(|(mp, _)| v == **mp || v.starts_with(&format!("{mp}/")))
            .max_by_key(|(mp, _)| mp.len())
        {
            applied.insert(Subst::MountPath(mp.clone()));
            format!("{}{}", dir.display(), &v[mp.len()..])
        } else {
            assert!(!v.starts_with('/'), "{k}={v} is a path outside every mount");
            v
        };
        args.push(format!("{k}={value}"));
    }
    Plan {
        args,
        env: env.into_iter().collect(),
        applied,
        image_name,
        listen_port: listen_port.expect("--listen=ADDR:PORT"),
    }
}

/// A probe from the manifest, resolved.
pub struct ProbeCheck {
    pub what: &'static str,
    pub path: String,
    /// Succeeds only once verified content is published.
    pub means_ready: bool,
}

pub fn probes(m: &Manifest, listen_port: i64) -> Vec<ProbeCheck> {
    let mut out = Vec::new();
    for (what, means_ready) in [
        ("startupProbe", true),
        ("readinessProbe", true),
        ("livenessProbe", false),
    ] {
        let h = m
            .http_probe(what)
            .unwrap_or_else(|| panic!("{what} is not an httpGet"));
        let port = match &h.port {
            serde_json::Value::String(name) => m
                .port_named(name)
                .unwrap_or_else(|| panic!("{what}: no port named {name}")),
            p => p
                .as_i64()
                .unwrap_or_else(|| panic!("{what}: port {p} is neither a number nor a name")),
        };
        assert_eq!(
            port, listen_port,
            "{what} probes port {port}, the server listens on {listen_port}"
        );
        assert_eq!(h.scheme.as_deref().unwrap_or("HTTP"), "HTTP", "{what}");
        out.push(ProbeCheck {
            what,
            path: h.path.clone().unwrap_or_else(|| "/".into()),
            means_ready,
        });
    }
    out
}
