//! Small signed sources shared by the signing tests.

use oscontent_testkit::registry::Registry;
use oscontent_testkit::signing::*;
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The ref tiny commits are bound to.
/// How often servers under test look for new signatures.
pub const POLL: &str = "1";
/// Bound on waiting for a server to notice new signatures.
pub const NOTICE_TIMEOUT: Duration = Duration::from_secs(30);

/// An oscontainer root holding a one-commit archive repo at `srv/repo`.
pub struct Tiny {
    pub root: PathBuf,
    pub repo: PathBuf,
    pub commit: String,
    pub version: String,
}

pub fn tiny_oscontainer(dir: &Path, seed: u32) -> Tiny {
    let root = dir.to_path_buf();
    let repo = root.join("srv/repo");
    std::fs::create_dir_all(&repo).unwrap();
    let version = format!("1.{seed}");
    let commit = tiny_commit(&repo, &version, Some(TINY_REF), seed).unwrap();
    Tiny {
        root,
        repo,
        commit,
        version,
    }
}

/// A live archive repo at `dir` whose ref `TINY_REF` names one tiny
/// commit (`seed` picks its content): the repo and the commit.
pub fn live_repo(dir: &Path, seed: u32) -> (Ostree, String) {
    let first = tiny_commit(dir, "1", Some(TINY_REF), seed).unwrap();
    let r = Ostree::at(dir);
    r.run(["refs", &format!("--create={TINY_REF}"), &first])
        .unwrap();
    (r, first)
}

/// As another tool would: commits version 2 (unsigned) on top of `first`
/// and moves `TINY_REF` to it; the new commit. `scratch` holds its tree.
pub fn move_to_second(r: &Ostree, scratch: &Path, first: &str) -> String {
    let tree = scratch.join("tree2");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/os-release"), "VERSION_ID=2\n").unwrap();
    let second = commit_tree(r, &tree, TINY_REF, "2", "2030-01-01T00:00:00Z", Some(first)).unwrap();
    r.run(["refs", "--force", &format!("--create={TINY_REF}"), &second])
        .unwrap();
    second
}

/// `--oscontainer DIR --commit CHECKSUM` as arguments: what a signer
/// needs, the commit pinned.
pub fn oscontainer_args(tiny: &Tiny) -> Vec<String> {
    vec![
        "--oscontainer".into(),
        tiny.root.display().to_string(),
        "--commit".into(),
        tiny.commit.clone(),
    ]
}

/// The object's path in an archive repo (`objects/XX/REST.EXT`).
pub fn object_rel(checksum: &str, ext: &str) -> String {
    format!("objects/{}/{}.{ext}", &checksum[..2], &checksum[2..])
}

/// GET that must answer 200; the body.
pub fn get_ok(server: &Server, path: &str) -> Vec<u8> {
    let r = server.get(path).unwrap();
    assert_eq!(r.status, 200, "GET {path}");
    r.body
}

/// `/readyz` status.
pub fn readyz(server: &Server) -> u16 {
    server.get("/readyz").map(|r| r.status).unwrap_or(0)
}

/// Number of OpenPGP signatures in served detached metadata or summary.sig.
pub fn sig_count(bytes: &[u8]) -> usize {
    oscontent_format::parse_gpgsigs(bytes).unwrap().len()
}

/// A bundle laid out as kubelet lays out a ConfigMap volume: files in a
/// `..<timestamp>` directory, `..data` pointing at it, and one symlink per
/// key. Swapping `..data` is the update.
pub struct ConfigMapDir {
    pub dir: PathBuf,
    generation: u32,
}

impl ConfigMapDir {
    pub fn new(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        Self {
            dir: dir.to_path_buf(),
            generation: 0,
        }
    }

    /// Publishes the files of `bundle` as the new content, atomically.
    pub fn update(&mut self, bundle: &Path) {
        self.generation += 1;
        let ts = format!("..2025_01_01_00_00_00.{:09}", self.generation);
        let data = self.dir.join(&ts);
        std::fs::create_dir(&data).unwrap();
        let mut names = Vec::new();
        for e in std::fs::read_dir(bundle).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), data.join(e.file_name())).unwrap();
            names.push(e.file_name());
        }
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&ts, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        for n in names {
            let link = self.dir.join(&n);
            if link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(&n), &link).unwrap();
            }
        }
    }
}

/// Keys every test may share: made once per test process.
pub struct Keys {
    _dir: tempfile::TempDir,
    pub trusted: Key,
    pub other: Key,
}

pub fn keys() -> &'static Keys {
    static K: std::sync::OnceLock<Keys> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        let dir = tempdir();
        let trusted = keygen(dir.path(), "trusted", &[]).unwrap();
        let other = keygen(dir.path(), "other", &[]).unwrap();
        Keys {
            _dir: dir,
            trusted,
            other,
        }
    })
}

/// A server over the same source arguments `sign` takes.
pub fn builder(source: &[String]) -> ServerBuilder {
    match source.first().map(String::as_str) {
        Some("--oscontainer") => Server::oscontainer(Path::new(&source[1])).args(&source[2..]),
        Some("--repo") => Server::repo(Path::new(&source[1])).args(&source[2..]),
        Some("--image") => Server::images(Vec::<String>::new()).args(source),
        other => panic!("unknown source {other:?}"),
    }
}

/// An OCI layout holding each tiny oscontainer as the image `layout:tag`,
/// labelled with its commit, built with umoci. Returns `oci:` references.
pub fn oci_layout(layout: &Path, images: &[(&Tiny, &str)]) -> Vec<String> {
    let umoci = |args: &[&str]| {
        let mut cmd = std::process::Command::new("umoci");
        check_output(local_only(&mut cmd).args(args), TOOL_TIMEOUT)
            .unwrap_or_else(|e| panic!("umoci (package umoci) is required: {e:#}"));
    };
    umoci(&["init", &format!("--layout={}", layout.display())]);
    let mut refs = Vec::new();
    for (tiny, tag) in images {
        let image = format!("{}:{tag}", layout.display());
        umoci(&["new", &format!("--image={image}")]);
        umoci(&[
            "insert",
            &format!("--image={image}"),
            tiny.root.join("srv").to_str().unwrap(),
            "/srv",
        ]);
        umoci(&[
            "config",
            &format!("--image={image}"),
            &format!("--config.label=com.coreos.ostree-commit={}", tiny.commit),
            &format!("--config.label=version={}", tiny.version),
        ]);
        refs.push(format!("oci:{image}"));
    }
    refs
}

/// Each image of `layout` (`oci_layout`'s tags) pushed to `reg` as
/// `tiny:TAG`, as `serve` and `sign` take it pinned: `--image
/// docker://HOST/tiny@sha256:DIGEST --insecure-registry HOST`.
pub fn pinned_images(reg: &Registry, layout: &Path, tags: &[&str]) -> Vec<String> {
    let mut args = Vec::new();
    for tag in tags {
        let name = format!("tiny:{tag}");
        reg.push(layout, tag, &name, &[]);
        let digest = reg.digest(&name);
        args.push("--image".to_owned());
        args.push(reg.image(&format!("tiny@{digest}")));
    }
    args.extend(["--insecure-registry".to_owned(), reg.host()]);
    args
}
