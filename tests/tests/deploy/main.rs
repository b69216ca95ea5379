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
//! v5), docker-registry, skopeo, htpasswd, openssl, ostree, umoci and
//! bubblewrap (`sandbox.rs`).

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod cache;
mod manifest;
mod plan;
mod sandbox;

use manifest::{Manifest, INJECTED_CA_KEY};
use oscontent_testkit::registry::{write_authfile, Pki, Registry};
use oscontent_testkit::*;
use plan::{materialize, plan, probes, Plan, ProbeCheck, Provided, Subst, IMAGE_ENV};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Registry credentials the pull secret carries.
const USER: &str = "oscontent";
const PASS: &str = "pull-secret-password";
/// Bound on becoming ready once the signature bundle is in place: the
/// backoff (1 s doubling) after the refusals of the unsigned image, plus
/// `--signatures-poll`.
const SIGNED_READY_TIMEOUT: Duration = Duration::from_secs(240);
/// How long the first fetch may take to fail (nothing pushed yet).
const FIRST_ERROR_TIMEOUT: Duration = Duration::from_secs(60);

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

/// The first ConfigMap whose (hashed) name starts with `prefix`.
fn config_map(m: &Manifest, prefix: &str) -> String {
    m.config_maps
        .keys()
        .find(|n| n.starts_with(prefix))
        .unwrap_or_else(|| panic!("no ConfigMap {prefix}-*"))
        .clone()
}

/// What the cluster would put in the volumes the manifest mounts: the
/// pull secret, the CA bundle OpenShift injects into the labelled
/// ConfigMap, and the trusted keys.
fn provided(m: &Manifest, auth: &Path, pki: &Pki, trust: Option<&Trust>) -> Provided {
    let mut files = BTreeMap::from([
        (
            (
                "oscontent-pull-secret".to_owned(),
                ".dockerconfigjson".to_owned(),
            ),
            std::fs::read(auth).unwrap(),
        ),
        (
            (
                config_map(m, "oscontent-ca-bundle"),
                INJECTED_CA_KEY.to_owned(),
            ),
            std::fs::read(&pki.ca).unwrap(),
        ),
    ]);
    if let Some(t) = trust {
        files.insert(
            (
                config_map(m, "oscontent-trusted-keys"),
                "trusted-keys.asc".into(),
            ),
            t.public.clone(),
        );
    }
    Provided { files }
}

/// Nothing but the intended substitutions: undoing them must give back
/// every rendered arg as the kubelet would expand it, byte for byte, and
/// every env value.
fn audit(
    m: &Manifest,
    plan: &Plan,
    mounts: &BTreeMap<String, PathBuf>,
    supported: &BTreeSet<String>,
    registry_host: &str,
) {
    let mount_paths: BTreeSet<String> = mounts.keys().cloned().collect();
    for s in &plan.applied {
        match s {
            Subst::MountPath(p) => assert!(mount_paths.contains(p), "{p}"),
            Subst::Listen | Subst::RegistryHost => {}
        }
    }
    assert!(plan.applied.contains(&Subst::Listen) && plan.applied.contains(&Subst::RegistryHost));
    let rendered_args = m.args();
    assert_eq!(
        plan.args.len(),
        rendered_args.len(),
        "every rendered arg is used"
    );
    let manifest_env: BTreeMap<String, String> = m
        .env()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
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
        let mut back = f.replace(registry_host, &manifest_host);
        for (mp, dir) in mounts {
            back = back.replace(&*dir.to_string_lossy(), mp);
        }
        if back.starts_with("--listen=") {
            assert_eq!(back, "--listen=127.0.0.1:0");
            assert!(r.starts_with("--listen="), "{r}");
            continue;
        }
        assert_eq!(
            back,
            plan::expand(r, &manifest_env),
            "{f} is not {r} with only the intended substitutions"
        );
    }
    for (k, v) in &plan.env {
        let want = &manifest_env[k];
        if k == IMAGE_ENV {
            assert_eq!(v.replacen(registry_host, &manifest_host, 1), *want);
        } else {
            assert_eq!(v, want, "env {k}");
        }
    }
    assert_eq!(plan.env.len(), manifest_env.len());
}

/// The mount directory `--state-dir` names.
fn state_dir(plan: &Plan, mounts: &BTreeMap<String, PathBuf>) -> PathBuf {
    mounts
        .iter()
        .find(|(mp, _)| {
            plan.args
                .iter()
                .any(|a| a == &format!("--state-dir={}", mounts[*mp].display()))
        })
        .map(|(_, d)| d.clone())
        .expect("--state-dir is a mount")
}

/// Starts the server before the image exists: the fetch fails, nothing
/// is ready (503), and liveness holds.
fn start_unready(plan: &Plan, state: &Path, probes: &[ProbeCheck]) -> Server {
    let mut s = Server::verbatim(&plan.args, &plan.env)
        .state_dir(state)
        .spawn()
        .unwrap_or_else(|e| panic!("{e:#}"));
    s.wait_stderr_lines("\"level\":\"ERROR\"", 1, FIRST_ERROR_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    for p in probes {
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
    s
}

/// The node side as deploy/README.md configures it: gpg-verify and
/// gpg-verify-summary with the release key imported.
fn verified_pull(s: &Server, key: &Path) {
    let node = tempdir();
    let repo = Ostree::init(&node.path().join("repo"), "bare-user").unwrap();
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

#[test]
fn base_args_serve_probes_and_ostree_pull() {
    require_ostree();
    let m = manifest::manifest();
    let supported = supported_flags();
    let signing = supported.contains("--trusted-keys") && supported.contains("--signatures");
    assert!(
        signing,
        "the server must take --trusted-keys and --signatures, as the manifests pass them"
    );
    let tmp = tempdir();
    let pki = Pki::generate(&tmp.path().join("pki")).unwrap_or_else(|e| panic!("{e:#}"));
    let reg = Registry::builder()
        .tls(&pki.cert, &pki.key)
        .auth(USER, PASS)
        .start()
        .unwrap_or_else(|e| panic!("{e:#}"));
    let trust = signing.then(|| keygen(tmp.path()));

    let auth = tmp.path().join("auth.json");
    write_authfile(&auth, &reg.host(), USER, PASS);
    let provided = provided(&m, &auth, &pki, trust.as_ref());
    let mounts = materialize(&m, &provided, &tmp.path().join("mounts"));
    let plan = plan(&m, &mounts, &reg.host(), &supported);
    audit(&m, &plan, &mounts, &supported, &reg.host());
    let probes = probes(&m, plan.listen_port);

    let mut s = start_unready(&plan, &state_dir(&plan, &mounts), &probes);
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
        verified_pull(&s, &tmp.path().join("sign.pub"));
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
    // `sign` takes only a pinned image: the one pushed, by digest.
    let repository = plan.image_name.split(':').next().unwrap();
    let digest = reg.digest(&plan.image_name);
    let image = format!("docker://{}/{repository}@{digest}", reg.host());
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
