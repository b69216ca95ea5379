//! End-to-end: the server started with exactly the container args and env
//! of the rendered deploy/base (`kubectl kustomize`), against a real TLS
//! `docker-registry` with basic auth on loopback, must answer its probes as
//! the manifest declares them and serve stock `ostree pull`.
//!
//! Only these are substituted, and the test asserts that nothing else is:
//! - each volumeMount's path, by a temporary directory holding what the
//!   volume would (rendered ConfigMap data verbatim; for the pull secret,
//!   the OpenShift-injected CA bundle and the trust material, fixture
//!   content of the shape the manifests expect);
//! - the registry host in the oscontainer image reference (the repository
//!   and tag are the manifest's);
//! - the listen address (127.0.0.1:0).
//!
//! Every flag is used verbatim, with a real signing key and bundle behind
//! `--trusted-keys` and `--signatures`.
//!
//! Build first: `cargo build --workspace --bins`; needs kubectl (kustomize
//! v5), docker-registry, skopeo, htpasswd, openssl and ostree.

#[path = "../image/support.rs"]
mod support;

use oscontent_testkit::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::{pull_and_fsck, Registry};
use xtask::deploy::decode::Object;
use xtask::deploy::policy::{self, SERVER_CONTAINER};

/// The env var holding the oscontainer reference (expanded into `--image`
/// by the kubelet's `$(VAR)` rule).
const IMAGE_ENV: &str = "OSCONTAINER_IMAGE";
/// Registry credentials the pull secret carries.
const USER: &str = "oscontent";
const PASS: &str = "pull-secret-password";
/// Bound on becoming ready once the signature bundle is in place: the
/// backoff (1 s doubling) after the refusals of the unsigned image, plus
/// `--signatures-poll`.
const SIGNED_READY_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the first fetch may take to fail (nothing pushed yet).
const FIRST_ERROR_TIMEOUT: Duration = Duration::from_secs(60);

/// The server's Deployment pod, its server container, and the ConfigMaps.
struct Manifest {
    pod: xtask::deploy::k8s_openapi::api::core::v1::PodSpec,
    server: xtask::deploy::k8s_openapi::api::core::v1::Container,
    config_maps: BTreeMap<String, xtask::deploy::k8s_openapi::api::core::v1::ConfigMap>,
}

fn manifest() -> Manifest {
    let r = xtask::deploy::render_base().unwrap_or_else(|e| panic!("{e:#}"));
    let mut config_maps = BTreeMap::new();
    let mut pod = None;
    for o in r.objects {
        match o {
            Object::ConfigMap(c) => {
                config_maps.insert(c.metadata.name.clone().unwrap(), c);
            }
            Object::Deployment(d) => pod = d.spec.and_then(|s| s.template.spec),
            _ => {}
        }
    }
    let pod = pod.expect("the base renders one Deployment with a pod spec");
    let server = pod
        .containers
        .iter()
        .find(|c| c.name == SERVER_CONTAINER)
        .expect("a server container")
        .clone();
    Manifest {
        pod,
        server,
        config_maps,
    }
}

/// The kubelet's `$(VAR)` expansion (`$$` escapes; unknown names stay).
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
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

/// The long flags `oscontent-server serve --help` lists.
fn supported_flags() -> BTreeSet<String> {
    let help = check_output(
        Command::new(server_bin()).args(["serve", "--help"]),
        Duration::from_secs(30),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    help.split_whitespace()
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| {
            let name: String = w
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            format!("--{name}")
        })
        .collect()
}

/// A throwaway CA and a registry certificate for 127.0.0.1 it signed.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let mut cmd = Command::new("openssl");
    cmd.current_dir(dir).args(args);
    check_output(&mut cmd, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("openssl (Debian package openssl): {e:#}"));
}

fn pki(dir: &Path) -> Pki {
    std::fs::create_dir_all(dir).unwrap();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-days",
        "2",
        "-subj",
        "/CN=oscontent e2e CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "reg.key",
        "-out",
        "reg.csr",
    ]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "reg.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "reg.crt",
        ],
    );
    Pki {
        ca: dir.join("ca.crt"),
        cert: dir.join("reg.crt"),
        key: dir.join("reg.key"),
    }
}

/// What the test puts where the cluster would: files by (volume source
/// name, key). Anything a mounted ConfigMap renders is used as rendered.
struct Provided {
    files: BTreeMap<(String, String), Vec<u8>>,
}

/// Materializes each of the server's volumeMounts as a directory under
/// `root`, returning mountPath -> directory.
fn materialize(m: &Manifest, provided: &Provided, root: &Path) -> BTreeMap<String, PathBuf> {
    let mut map = BTreeMap::new();
    let mut used = BTreeSet::new();
    for vm in m.server.volume_mounts.iter().flatten() {
        let dir = root.join(&vm.name);
        std::fs::create_dir_all(&dir).unwrap();
        let vol = m
            .pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == vm.name)
            .unwrap_or_else(|| panic!("mount {} has no volume", vm.name));
        // (source name, key, path in the mount, rendered content if any)
        let mut files: Vec<(String, String, String, Option<Vec<u8>>)> = Vec::new();
        let items_path =
            |items: &Option<Vec<xtask::deploy::k8s_openapi::api::core::v1::KeyToPath>>,
             key: &str|
             -> Option<String> {
                match items {
                    None => Some(key.to_owned()),
                    Some(items) => items.iter().find(|i| i.key == key).map(|i| i.path.clone()),
                }
            };
        if let Some(cm) = &vol.config_map {
            let rendered = m
                .config_maps
                .get(&cm.name)
                .unwrap_or_else(|| panic!("ConfigMap {} is not rendered", cm.name));
            for (k, v) in rendered.data.iter().flatten() {
                if let Some(p) = items_path(&cm.items, k) {
                    files.push((cm.name.clone(), k.clone(), p, Some(v.clone().into_bytes())));
                }
            }
            for ((src, k), _) in provided.files.iter() {
                if *src == cm.name && !files.iter().any(|f| &f.1 == k) {
                    let p = items_path(&cm.items, k).unwrap();
                    files.push((src.clone(), k.clone(), p, None));
                }
            }
        } else if let Some(s) = &vol.secret {
            let name = s.secret_name.clone().unwrap();
            for ((src, k), _) in provided.files.iter() {
                if *src == name {
                    let p = items_path(&s.items, k)
                        .unwrap_or_else(|| panic!("Secret {name} key {k} is not in items"));
                    files.push((name.clone(), k.clone(), p, None));
                }
            }
        } else {
            assert!(
                vol.empty_dir.is_some(),
                "volume {} is neither ConfigMap, Secret nor emptyDir",
                vol.name
            );
        }
        for (src, key, path, rendered) in files {
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
enum Subst {
    MountPath(String),
    Listen,
    RegistryHost,
}

struct Plan {
    args: Vec<String>,
    env: Vec<(String, String)>,
    applied: BTreeSet<Subst>,
    /// The image reference's `repository:tag` (what to push).
    image_name: String,
    /// The rendered --listen port (what the probes name).
    listen_port: i32,
}

fn plan(
    m: &Manifest,
    mounts: &BTreeMap<String, PathBuf>,
    registry_host: &str,
    supported: &BTreeSet<String>,
) -> Plan {
    let mut applied = BTreeSet::new();
    // Env: verbatim, except the registry host of the image reference.
    let mut env = BTreeMap::new();
    let mut image_name = None;
    for e in m.server.env.iter().flatten() {
        assert!(e.value_from.is_none(), "env {} uses valueFrom", e.name);
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
    let rendered_args = m.server.args.clone().unwrap_or_default();
    let flags = policy::server_flags(&rendered_args).unwrap();
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
        image_name: image_name.expect("the manifest sets OSCONTAINER_IMAGE"),
        listen_port: listen_port.expect("--listen=ADDR:PORT"),
    }
}

/// A probe from the manifest, resolved.
struct ProbeCheck {
    what: &'static str,
    path: String,
    /// Succeeds only once verified content is published.
    means_ready: bool,
}

fn probes(m: &Manifest, listen_port: i32) -> Vec<ProbeCheck> {
    let ports = m.server.ports.clone().unwrap_or_default();
    let mut out = Vec::new();
    for (what, p, means_ready) in [
        ("startupProbe", &m.server.startup_probe, true),
        ("readinessProbe", &m.server.readiness_probe, true),
        ("livenessProbe", &m.server.liveness_probe, false),
    ] {
        let h = p
            .as_ref()
            .and_then(|p| p.http_get.clone())
            .unwrap_or_else(|| panic!("{what} is not an httpGet"));
        use xtask::deploy::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let port = match &h.port {
            IntOrString::Int(n) => *n,
            IntOrString::String(name) => {
                ports
                    .iter()
                    .find(|p| p.name.as_deref() == Some(name))
                    .unwrap_or_else(|| panic!("{what}: no port named {name}"))
                    .container_port
            }
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

/// The kubelet's verdict: HTTP 200-399 succeeds.
fn probe_ok(s: &Server, path: &str) -> (bool, u16) {
    let r = s.get(path).unwrap_or_else(|e| panic!("GET {path}: {e:#}"));
    ((200..400).contains(&r.status), r.status)
}

/// With the signature flags in the server: a fresh key, its public half as
/// the trusted keys; the bundle is made later, once the image is pushed.
struct Trust {
    secret: PathBuf,
    public: Vec<u8>,
}

fn keygen(dir: &Path) -> Trust {
    let secret = dir.join("sign.key");
    let public = dir.join("sign.pub");
    check_output(
        Command::new(server_bin())
            .arg("keygen")
            .args(["--uid", "oscontent deploy e2e <e2e@example.com>"])
            .arg("--out-secret")
            .arg(&secret)
            .arg("--out-public")
            .arg(&public),
        Duration::from_secs(60),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    Trust {
        public: std::fs::read(&public).unwrap(),
        secret,
    }
}

#[test]
fn base_args_serve_probes_and_ostree_pull() {
    require_ostree();
    let m = manifest();
    let supported = supported_flags();
    let signing = supported.contains("--trusted-keys") && supported.contains("--signatures");
    assert!(
        signing,
        "the server must take --trusted-keys and --signatures, as the manifests pass them"
    );
    let tmp = tempdir();
    let pki = pki(&tmp.path().join("pki"));
    let reg = Registry::start_tls(&pki.cert, &pki.key, Some((USER, PASS)));
    let trust = signing.then(|| keygen(tmp.path()));

    // What the cluster would put in the volumes the manifest mounts.
    let auth = tmp.path().join("auth.json");
    support::write_authfile(&auth, &reg.host(), USER, PASS);
    let ca_bundle = m
        .config_maps
        .keys()
        .find(|n| n.starts_with("oscontent-ca-bundle"))
        .expect("the CA bundle ConfigMap")
        .clone();
    let trusted_keys = m
        .config_maps
        .keys()
        .find(|n| n.starts_with("oscontent-trusted-keys"))
        .expect("the trusted keys ConfigMap")
        .clone();
    let mut files = BTreeMap::from([
        (
            (
                "oscontent-pull-secret".to_owned(),
                ".dockerconfigjson".to_owned(),
            ),
            std::fs::read(&auth).unwrap(),
        ),
        // What OpenShift injects into the labelled ConfigMap.
        (
            (ca_bundle, policy::INJECTED_CA_KEY.to_owned()),
            std::fs::read(&pki.ca).unwrap(),
        ),
    ]);
    if let Some(t) = &trust {
        files.insert((trusted_keys, "trusted-keys.asc".into()), t.public.clone());
    }
    let mounts = materialize(&m, &Provided { files }, &tmp.path().join("mounts"));
    let plan = plan(&m, &mounts, &reg.host(), &supported);

    // Nothing but the intended substitutions.
    let mount_paths: BTreeSet<String> = mounts.keys().cloned().collect();
    for s in &plan.applied {
        match s {
            Subst::MountPath(p) => assert!(mount_paths.contains(p), "{p}"),
            Subst::Listen | Subst::RegistryHost => {}
        }
    }
    assert!(plan.applied.contains(&Subst::Listen) && plan.applied.contains(&Subst::RegistryHost));
    let rendered_args = m.server.args.clone().unwrap();
    assert_eq!(
        plan.args.len(),
        rendered_args.len(),
        "every rendered arg is used"
    );
    // Undo exactly the intended substitutions: what remains must be the
    // rendered arg as the kubelet would expand it, byte for byte.
    let manifest_env: BTreeMap<String, String> = m
        .server
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    let manifest_host = manifest_env[IMAGE_ENV]
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let kept_rendered: Vec<&String> = std::iter::once(&rendered_args[0])
        .chain(rendered_args[1..].iter().filter(|a| {
            let name = a.split('=').next().unwrap();
            supported.contains(name)
        }))
        .collect();
    for (r, f) in kept_rendered.iter().zip(&plan.args) {
        let mut back = f.replace(&reg.host(), &manifest_host);
        for (mp, dir) in &mounts {
            back = back.replace(&*dir.to_string_lossy(), mp);
        }
        if back.starts_with("--listen=") {
            assert_eq!(back, "--listen=127.0.0.1:0");
            assert!(r.starts_with("--listen="), "{r}");
            continue;
        }
        assert_eq!(
            back,
            expand(r, &manifest_env),
            "{f} is not {r} with only the intended substitutions"
        );
    }
    for (k, v) in &plan.env {
        let want = &manifest_env[k];
        if k == IMAGE_ENV {
            assert_eq!(v.replacen(&reg.host(), &manifest_host, 1), *want);
        } else {
            assert_eq!(v, want, "env {k}");
        }
    }
    assert_eq!(plan.env.len(), manifest_env.len());
    let probes = probes(&m, plan.listen_port);
    let state = mounts
        .iter()
        .find(|(mp, _)| {
            plan.args
                .iter()
                .any(|a| a == &format!("--state-dir={}", mounts[*mp].display()))
        })
        .map(|(_, d)| d.clone())
        .expect("--state-dir is a mount");

    // Start before the image exists: the fetch fails, nothing is ready.
    let mut s = Server::verbatim(&plan.args, &plan.env)
        .state_dir(&state)
        .spawn()
        .unwrap_or_else(|e| panic!("{e:#}"));
    s.wait_stderr_lines("\"level\":\"ERROR\"", 1, FIRST_ERROR_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    for p in &probes {
        let (ok, status) = probe_ok(&s, &p.path);
        assert_eq!(
            ok, !p.means_ready,
            "{} ({}) before content is published: HTTP {status}",
            p.what, p.path
        );
        if p.means_ready {
            assert_eq!(status, 503, "{}", p.what);
        }
    }

    reg.push_release(v1(), &plan.image_name, &[]);
    if let Some(t) = &trust {
        sign_into_bundle(
            &reg,
            &plan,
            &mounts,
            &pki,
            &auth,
            t,
            &mut s,
            &probes,
            tmp.path(),
        );
    }
    // Signed, readiness waits for the next retry after the bundle lands,
    // and the fetch backoff has doubled a few times by then.
    let ready_within = if signing {
        SIGNED_READY_TIMEOUT
    } else {
        START_TIMEOUT
    };
    s.wait_ready(ready_within)
        .unwrap_or_else(|e| panic!("{e:#}"));
    for p in &probes {
        let (ok, status) = probe_ok(&s, &p.path);
        assert!(ok, "{} ({}) once published: HTTP {status}", p.what, p.path);
    }
    let (_node, repo) = pull_and_fsck(&s, fixture_ref(), &v1().commit);
    assert_eq!(
        repo.rev_parse(&format!("os:{}", fixture_ref())).unwrap(),
        v1().commit
    );
    if signing {
        // The node side as deploy/README.md configures it: gpg-verify and
        // gpg-verify-summary with the release key imported.
        let node = tempdir();
        let repo = Ostree::init(&node.path().join("repo"), "bare-user").unwrap();
        let key = tmp.path().join("sign.pub");
        let import = format!("--gpg-import={}", key.display());
        repo.run([
            "remote",
            "add",
            "--set=gpg-verify=true",
            "--set=gpg-verify-summary=true",
            import.as_str(),
            "os",
            s.url.as_str(),
        ])
        .unwrap();
        repo.pull(&["os", fixture_ref()])
            .unwrap_or_else(|e| panic!("verified pull: {e:#}\n{}", s.stderr()));
    }
    s.stop(Duration::from_secs(60)).unwrap();
}

/// Signed mode: the pushed but unsigned image must not make the server
/// ready; a bundle from `oscontent-server sign` for the same image,
/// written into the signatures mount the way the kubelet updates a
/// ConfigMap volume (a `..data` symlink swap), must.
#[allow(clippy::too_many_arguments)]
fn sign_into_bundle(
    reg: &Registry,
    plan: &Plan,
    mounts: &BTreeMap<String, PathBuf>,
    pki: &Pki,
    auth: &Path,
    trust: &Trust,
    s: &mut Server,
    probes: &[ProbeCheck],
    tmp: &Path,
) {
    // The fetch of the unsigned image is refused: an error, still 503.
    let before = s.stderr_lines("\"level\":\"ERROR\"").len();
    s.wait_stderr_lines("\"level\":\"ERROR\"", before + 1, FIRST_ERROR_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    for p in probes.iter().filter(|p| p.means_ready) {
        let (ok, status) = probe_ok(s, &p.path);
        assert!(!ok, "{} with unsigned content: HTTP {status}", p.what);
    }
    let bundle = tmp.join("bundle");
    std::fs::create_dir_all(tmp.join("sign-work")).unwrap();
    let image = format!("docker://{}/{}", reg.host(), plan.image_name);
    check_output(
        Command::new(server_bin())
            .args(["sign", "--image", &image])
            .arg("--authfile")
            .arg(auth)
            .arg("--ca")
            .arg(&pki.ca)
            .arg("--key")
            .arg(&trust.secret)
            .arg("--out")
            .arg(&bundle)
            .arg("--work-dir")
            .arg(tmp.join("sign-work")),
        Duration::from_secs(300),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let sigs = plan
        .args
        .iter()
        .find_map(|a| a.strip_prefix("--signatures="))
        .map(PathBuf::from)
        .expect("--signatures");
    assert!(mounts.values().any(|d| *d == sigs));
    // The kubelet's atomic writer: a timestamped dir, `..data` pointing at
    // it, and each key a symlink through `..data`.
    let ts = sigs.join("..2025_01_01_00_00_00.000000001");
    copy_dir(&bundle, &ts).unwrap();
    std::os::unix::fs::symlink(ts.file_name().unwrap(), sigs.join("..data.tmp")).unwrap();
    std::fs::rename(sigs.join("..data.tmp"), sigs.join("..data")).unwrap();
    for e in std::fs::read_dir(&ts).unwrap() {
        let name = e.unwrap().file_name();
        std::os::unix::fs::symlink(Path::new("..data").join(&name), sigs.join(&name)).unwrap();
    }
}
