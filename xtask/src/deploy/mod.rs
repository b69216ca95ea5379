//! `cargo xtask check-deploy`: renders deploy/ (the base, every overlay, and
//! the base with each optional component) with `kubectl
//! kustomize`, decodes every object strictly into its Kubernetes API type
//! ([`decode`]), checks the invariants ([`policy`]) and the server image's
//! Containerfile against them, then runs checkov once over everything.
//!
//! The rendering and the checks are a library so that the end-to-end test
//! in tests/ starts the server from exactly the rendered args.

pub use k8s_openapi;

pub mod checkov;
pub mod decode;
pub mod policy;

use crate::fixtures::workspace_root;
use anyhow::{bail, ensure, Context, Result};
use decode::Object;
use policy::{Expect, Source};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// deploy/ under the workspace root.
pub fn deploy_dir() -> PathBuf {
    workspace_root().join("deploy")
}

/// Where check-deploy writes (under target/).
pub fn work_dir() -> PathBuf {
    crate::cargo::target_dir().join("check-deploy")
}

/// Bound on one `kubectl kustomize`.
pub const RENDER_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on what one rendering may print.
const MAX_RENDER_BYTES: u64 = 8 << 20;
/// `kubectl kustomize` must embed kustomize v5 or newer (components,
/// `patches` with regex targets, `labels`).
const MIN_KUSTOMIZE_MAJOR: u32 = 5;
/// The optional components under deploy/components, each rendered on top of
/// the base, and what the base plus it must be.
pub fn component_expectations() -> [(&'static str, Expect); 3] {
    [
        (
            "servicemonitor",
            Expect {
                service_monitor: true,
                ..Expect::registry()
            },
        ),
        (
            "scale-out",
            Expect {
                autoscaled: true,
                ..Expect::registry()
            },
        ),
        (
            "node-agent",
            Expect {
                node_agent: true,
                ..Expect::registry()
            },
        ),
    ]
}

/// One thing to render, and what it must be.
#[derive(Debug, Clone)]
pub struct Target {
    /// `base`, an overlay's directory name, or `base+COMPONENT`.
    pub name: String,
    /// The kustomization directory.
    pub dir: PathBuf,
    pub expect: Expect,
}

/// What each overlay is for; an overlay missing here is an error, so a new
/// one cannot skip its checks.
pub fn overlay_expectations(name: &str) -> Option<Expect> {
    let registry = Expect::registry();
    Some(match name {
        "image-volume" => Expect {
            source: Source::ImageVolume,
            ..registry
        },
        "init-copy" => Expect {
            source: Source::InitCopy,
            ..registry
        },
        "control-plane" => Expect {
            control_plane: true,
            ..registry
        },
        "disconnected" => Expect {
            mirror: true,
            ..registry
        },
        _ => return None,
    })
}

/// The base, every overlay under deploy/overlays (sorted), and the base
/// with each component.
pub fn targets(deploy: &Path, work: &Path) -> Result<Vec<Target>> {
    let mut out = vec![Target {
        name: "base".into(),
        dir: deploy.join("base"),
        expect: Expect::registry(),
    }];
    let overlays = deploy.join("overlays");
    let mut names: Vec<String> = std::fs::read_dir(&overlays)
        .with_context(|| format!("listing {}", overlays.display()))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("listing {}", overlays.display()))?;
    names.sort();
    for name in names {
        let expect = overlay_expectations(&name).with_context(|| {
            format!("deploy/overlays/{name} has no expectations: add it to overlay_expectations in xtask/src/deploy/mod.rs")
        })?;
        out.push(Target {
            dir: overlays.join(&name),
            name,
            expect,
        });
    }
    for (component, expect) in component_expectations() {
        out.push(component_target(deploy, work, component, expect)?);
    }
    Ok(out)
}

/// The base plus one component, through a kustomization written under
/// `work` (kustomize refuses absolute paths).
fn component_target(deploy: &Path, work: &Path, component: &str, expect: Expect) -> Result<Target> {
    let dir = work.join(component);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let rel = relative_to(deploy, &dir)?;
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "# Written by cargo xtask check-deploy: the base plus an optional component.\n\
             apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {rel}/base\ncomponents:\n  - {rel}/components/{component}\n"
        ),
    )
    .with_context(|| format!("writing {}", dir.display()))?;
    Ok(Target {
        name: format!("base+{component}"),
        dir,
        expect,
    })
}

/// `to` relative to `from_dir` (both absolute), as `../..`-style path.
fn relative_to(to: &Path, from_dir: &Path) -> Result<String> {
    let to = to
        .canonicalize()
        .with_context(|| format!("resolving {}", to.display()))?;
    let from = from_dir
        .canonicalize()
        .with_context(|| format!("resolving {}", from_dir.display()))?;
    let common = to
        .components()
        .zip(from.components())
        .take_while(|(a, b)| a == b)
        .count();
    let ups = from.components().count() - common;
    let mut parts: Vec<String> = std::iter::repeat_n("..".to_owned(), ups).collect();
    parts.extend(
        to.components()
            .skip(common)
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    Ok(parts.join("/"))
}

/// Runs `cmd` with stdout captured (at most `max` bytes), failing on a
/// non-zero exit or after `timeout`, with its stderr in the error.
pub fn output_bounded(cmd: &mut Command, timeout: Duration, max: u64) -> Result<String> {
    let what = format!("{cmd:?}");
    let o = oscontent_testkit::run_capped(cmd, timeout, max, 1 << 20)?;
    ensure!(
        o.status.success(),
        "{what} failed ({}):\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr).trim()
    );
    String::from_utf8(o.stdout).with_context(|| format!("{what} printed non-UTF-8"))
}

/// Checks that `kubectl` is there and embeds a recent enough kustomize.
pub fn require_kubectl() -> Result<()> {
    let out = output_bounded(
        Command::new("kubectl").args(["version", "--client"]),
        RENDER_TIMEOUT,
        1 << 16,
    )
    .context(
        "check-deploy needs kubectl (with kustomize v5+) on PATH; Debian 12's \
         kubernetes-client (1.20) is too old: install a current kubectl",
    )?;
    let major = kustomize_major(&out).with_context(|| {
        format!("no `Kustomize Version: vN` in `kubectl version --client`:\n{out}")
    })?;
    ensure!(
        major >= MIN_KUSTOMIZE_MAJOR,
        "kubectl embeds kustomize v{major}; check-deploy needs v{MIN_KUSTOMIZE_MAJOR} or newer"
    );
    Ok(())
}

fn kustomize_major(version_output: &str) -> Option<u32> {
    version_output
        .lines()
        .find_map(|l| l.trim().strip_prefix("Kustomize Version: v"))
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
}

/// `kubectl kustomize DIR`.
pub fn render(dir: &Path) -> Result<String> {
    output_bounded(
        Command::new("kubectl").arg("kustomize").arg(dir),
        RENDER_TIMEOUT,
        MAX_RENDER_BYTES,
    )
    .with_context(|| format!("rendering {}", dir.display()))
}

/// One rendered and decoded target.
#[derive(Debug)]
pub struct Rendered {
    pub target: Target,
    pub yaml: String,
    pub objects: Vec<Object>,
}

/// Renders and strictly decodes one target.
pub fn render_target(t: &Target) -> Result<Rendered> {
    let yaml = render(&t.dir)?;
    let objects = decode::decode_all(&yaml).with_context(|| format!("decoding {}", t.name))?;
    Ok(Rendered {
        target: t.clone(),
        yaml,
        objects,
    })
}

/// Renders and decodes the base alone (for the end-to-end test).
pub fn render_base() -> Result<Rendered> {
    require_kubectl()?;
    render_target(&Target {
        name: "base".into(),
        dir: deploy_dir().join("base"),
        expect: Expect::registry(),
    })
}

/// What deploy/Containerfile promises the manifests: a numeric non-root
/// USER, the EXPOSEd port, and the server as ENTRYPOINT.
#[derive(Debug, PartialEq, Eq)]
pub struct ImageFacts {
    pub user: u32,
    pub expose: Vec<u16>,
    pub entrypoint: Vec<String>,
}

/// Parses the final stage of a Containerfile (JSON-form ENTRYPOINT only).
pub fn parse_containerfile(text: &str) -> Result<ImageFacts> {
    let mut user = None;
    let mut expose = Vec::new();
    let mut entrypoint = None;
    for line in text.lines().map(str::trim) {
        let (instr, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        let rest = rest.trim();
        match instr.to_ascii_uppercase().as_str() {
            // A new stage: only the last one is the image.
            "FROM" => {
                user = None;
                expose.clear();
                entrypoint = None;
            }
            "USER" => {
                let uid = rest.split(':').next().unwrap_or("");
                user = Some(uid.parse::<u32>().with_context(|| {
                    format!(
                        "USER {rest:?} must be numeric, so the kubelet can enforce runAsNonRoot"
                    )
                })?);
            }
            "EXPOSE" => {
                for p in rest.split_whitespace() {
                    let n = p.split('/').next().unwrap_or("");
                    expose.push(n.parse().with_context(|| format!("EXPOSE {p:?}"))?);
                }
            }
            "ENTRYPOINT" => {
                entrypoint =
                    Some(serde_json::from_str::<Vec<String>>(rest).with_context(|| {
                        format!("ENTRYPOINT {rest:?} must be JSON (exec form)")
                    })?);
            }
            _ => {}
        }
    }
    Ok(ImageFacts {
        user: user.context("no USER in the final stage")?,
        expose,
        entrypoint: entrypoint.context("no ENTRYPOINT in the final stage")?,
    })
}

/// The server image against a rendering's server container.
pub fn check_image(facts: &ImageFacts, r: &Rendered) -> Vec<String> {
    let mut out = Vec::new();
    if facts.user == 0 {
        out.push("Containerfile USER is root".to_owned());
    }
    if facts.entrypoint.first().map(String::as_str) != Some("/usr/bin/oscontent-server") {
        out.push(format!(
            "ENTRYPOINT {:?} must be /usr/bin/oscontent-server (the manifests pass only args)",
            facts.entrypoint
        ));
    }
    for o in &r.objects {
        let Object::Deployment(d) = o else { continue };
        let Some(pod) = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()) else {
            continue;
        };
        let uid = pod.security_context.as_ref().and_then(|s| s.run_as_user);
        if uid.is_some_and(|u| i64::from(facts.user) != u) {
            out.push(format!(
                "{}: runAsUser {uid:?} differs from the image's USER {}",
                r.target.name, facts.user
            ));
        }
        for c in pod
            .containers
            .iter()
            .filter(|c| c.name == policy::SERVER_CONTAINER)
        {
            for p in c.ports.iter().flatten() {
                if !facts
                    .expose
                    .iter()
                    .any(|e| i32::from(*e) == p.container_port)
                {
                    out.push(format!(
                        "{}: port {} is not EXPOSEd by the Containerfile",
                        r.target.name, p.container_port
                    ));
                }
            }
        }
    }
    out
}

/// The whole check: render, decode, invariants, image, checkov.
pub fn check_deploy() -> Result<()> {
    let started = Instant::now();
    require_kubectl()?;
    let deploy = deploy_dir();
    let work = work_dir();
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let facts = {
        let p = deploy.join("Containerfile");
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        parse_containerfile(&text).with_context(|| format!("{}", p.display()))?
    };
    let mut problems = Vec::new();
    let mut rendered = Vec::new();
    for t in targets(&deploy, &work)? {
        let r = render_target(&t)?;
        for v in policy::check(&r.objects, &t.expect) {
            problems.push(format!("{}: {v}", t.name));
        }
        for p in check_image(&facts, &r) {
            problems.push(p);
        }
        eprintln!(
            "xtask: check-deploy: {} renders {} objects",
            t.name,
            r.objects.len()
        );
        rendered.push(r);
    }
    if !problems.is_empty() {
        bail!(
            "deploy/ breaks {} invariant(s):\n  {}",
            problems.len(),
            problems.join("\n  ")
        );
    }
    let summary = checkov::scan(&work, &rendered)?;
    eprintln!(
        "xtask: check-deploy: {} renderings decoded strictly, invariants hold; checkov {}: {} passed, 0 failed, {} skipped with reasons ({:.0?})",
        rendered.len(),
        checkov::VERSION,
        summary.passed,
        summary.skipped.len(),
        started.elapsed()
    );
    for s in &summary.skipped {
        eprintln!("xtask: check-deploy:   skipped {s}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerfile_facts() {
        let text = "FROM a AS build\nUSER 0\nEXPOSE 1\nENTRYPOINT [\"x\"]\n\
                    FROM b\nUSER 65532:65532\nEXPOSE 8080/tcp\nENTRYPOINT [\"/usr/bin/oscontent-server\"]\n";
        assert_eq!(
            parse_containerfile(text).unwrap(),
            ImageFacts {
                user: 65532,
                expose: vec![8080],
                entrypoint: vec!["/usr/bin/oscontent-server".into()],
            }
        );
        let cases = [
            ("FROM b\nUSER nobody\nENTRYPOINT [\"x\"]\n", "numeric"),
            ("FROM b\nUSER 1\nENTRYPOINT x\n", "exec form"),
            ("FROM b\nENTRYPOINT [\"x\"]\n", "no USER"),
            ("FROM a\nUSER 1\nENTRYPOINT [\"x\"]\nFROM b\n", "no USER"),
        ];
        for (text, frag) in cases {
            let e = format!("{:#}", parse_containerfile(text).unwrap_err());
            assert!(e.contains(frag), "{text:?}: {e}");
        }
    }

    #[test]
    fn the_shipped_containerfile() {
        let text = std::fs::read_to_string(deploy_dir().join("Containerfile")).unwrap();
        let f = parse_containerfile(&text).unwrap();
        assert_ne!(f.user, 0);
        assert_eq!(f.expose, [8080]);
        assert_eq!(f.entrypoint, ["/usr/bin/oscontent-server"]);
    }

    #[test]
    fn kustomize_versions() {
        let cases = [
            (
                "Client Version: v1.32.4\nKustomize Version: v5.5.0\n",
                Some(5),
            ),
            (
                "Client Version: v1.20.2\nKustomize Version: v2.0.3\n",
                Some(2),
            ),
            ("Client Version: v1.20.2\n", None),
        ];
        for (text, want) in cases {
            assert_eq!(kustomize_major(text), want, "{text}");
        }
    }

    #[test]
    fn relative_paths() {
        let root = tempfile::tempdir().unwrap();
        let a = root.path().join("deploy");
        let b = root.path().join("target/check-deploy/sm");
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        assert_eq!(relative_to(&a, &b).unwrap(), "../../../deploy");
    }

    #[test]
    fn every_overlay_has_expectations() {
        for e in std::fs::read_dir(deploy_dir().join("overlays")).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            assert!(overlay_expectations(&name).is_some(), "{name}");
        }
    }
}
