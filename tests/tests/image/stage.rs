//! `oscontent stage` against the real importer: a node that imported v1
//! from the registry stages v2 from the server streaming v2 from the same
//! registry, then ostree-ext's importer (what rpm-ostree and bootc run)
//! imports v2 and fetches no layer blob. Bad input from the server leaves
//! no ref behind.

use crate::support::*;
use oscontent_format::staging::{LayerKind, ObjectSet, StagedImage};
use oscontent_format::{build_summary, parse_summary, Checksum};
use oscontent_testkit::checkout::{assert_same_listing, checkout, listing};
use oscontent_testkit::encapsulate::import;
use oscontent_testkit::fixtures::{native_small, NativeFixtures, NativeRelease, DEFAULT_REF};
use oscontent_testkit::proxy::{only, Action};
use oscontent_testkit::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

/// Bound on one stage of the small fixture.
const STAGE_TIMEOUT: Duration = Duration::from_secs(300);

fn fixtures() -> NativeFixtures {
    native_small().unwrap_or_else(|e| panic!("{e:#}"))
}

fn client<S: AsRef<OsStr>>(args: &[S]) -> Command {
    let mut cmd = Command::new(client_bin());
    local_only(&mut cmd).args(args).env("RUST_BACKTRACE", "0");
    cmd
}

fn run<S: AsRef<OsStr>>(args: &[S]) -> Output {
    run_bounded(&mut client(args), STAGE_TIMEOUT).unwrap_or_else(|e| panic!("{e:#}"))
}

fn show(o: &Output) -> String {
    format!(
        "exit {:?}\nstderr:\n{}\nstdout:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    )
}

fn events(o: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn event<'a>(evs: &'a [Value], name: &str) -> &'a Value {
    let found: Vec<_> = evs.iter().filter(|e| e["event"] == name).collect();
    assert_eq!(found.len(), 1, "want one {name:?} event in {evs:#?}");
    found[0]
}

/// `stage --repo REPO --url URL --image REF@DIGEST --json EXTRA...`.
fn stage(repo: &Path, url: &str, image: &str, extra: &[&str]) -> Output {
    let mut a: Vec<String> = vec![
        "stage".into(),
        "--repo".into(),
        repo.display().to_string(),
        "--url".into(),
        url.into(),
        "--image".into(),
        image.into(),
        "--json".into(),
    ];
    a.extend(extra.iter().map(|s| s.to_string()));
    run(&a)
}

fn list(repo: &Path) -> Vec<Value> {
    let o = run(&[
        "stage",
        "--repo",
        &repo.display().to_string(),
        "--list",
        "--json",
    ]);
    assert!(o.status.success(), "--list: {}", show(&o));
    event(&events(&o), "staged-list")["staged"]
        .as_array()
        .unwrap()
        .clone()
}

/// The refs a stage may write: layer refs and its own.
fn stage_refs(node: &Ostree) -> BTreeSet<String> {
    node.refs()
        .unwrap()
        .into_iter()
        .filter(|r| r.starts_with("ostree/container/blob/") || r.starts_with("oscontent/staged/"))
        .collect()
}

/// `HOST:PORT/native:v2@sha256:…`: the pinned reference a node is given.
fn pinned(reg: &Registry, tag: &str, r: &NativeRelease) -> String {
    format!("{}/{tag}@{}", reg.host(), r.image_manifest)
}

/// A node of `mode` that imported v1 from `reg`, v2 pushed there too, and
/// the server streaming v2.
struct Node {
    _tmp: tempfile::TempDir,
    path: std::path::PathBuf,
    ostree: Ostree,
    image2: String,
    server: Server,
    reg: Registry,
}

fn node_with_v1(f: &NativeFixtures, mode: &str) -> Node {
    let (v1, v2) = (&f.releases[0], &f.releases[1]);
    let reg = Registry::start();
    let image1 = reg.push(&f.oci_layout, &v1.version, "native:v1", &[]);
    let tmp = tempdir();
    let path = tmp.path().join("node");
    let ostree = Ostree::init(&path, mode).unwrap();
    let imported = import(&path, &image1, true).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(imported.commit, v1.commit);
    let image2 = reg.push(&f.oci_layout, &v2.version, "native:v2", &[]);
    let server = ready(image_server(&reg, std::slice::from_ref(&image2)));
    Node {
        _tmp: tmp,
        path,
        ostree,
        image2,
        server,
        reg,
    }
}

/// v1 imported, v2 staged, v2 imported: the importer fetched no layer, the
/// tree is v2's commit exactly, fsck is clean, and the stage is dropped
/// once the importer's image ref for its digest exists.
fn stage_then_import(mode: &str) {
    let f = fixtures();
    let v2 = &f.releases[1];
    let n = node_with_v1(&f, mode);
    let image = pinned(&n.reg, "native:v2", v2);
    let o = stage(&n.path, &n.server.url, &image, &[]);
    assert!(o.status.success(), "stage: {}", show(&o));
    let evs = events(&o);
    let staged = event(&evs, "staged");
    assert_eq!(staged["commit"], v2.commit.as_str());
    assert_eq!(staged["digest"], v2.image_manifest.as_str());
    assert_eq!(staged["layers"], v2.layers.len());
    assert_eq!(
        n.ostree
            .rev_parse(&format!("oscontent/staged/{}", &v2.image_manifest[7..]))
            .unwrap()
            .len(),
        64
    );
    let listed = list(&n.path);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["layers_present"], listed[0]["layer_refs"]);
    assert_eq!(listed[0]["imported"], false);
    n.ostree.fsck().unwrap();

    let imported = import(&n.path, &n.image2, true).unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(imported.commit, v2.commit);
    assert_eq!(imported.manifest_digest, v2.image_manifest);
    assert!(
        imported.fetched.is_empty(),
        "the importer fetched layers after the stage: {:?}",
        imported.fetched
    );
    assert_eq!(imported.fetched_bytes, 0);
    n.ostree.fsck().unwrap();
    let tmp = tempdir();
    let source = tmp.path().join("source-repo");
    copy_dir(&f.repo, &source).unwrap();
    checkout(&n.ostree, &v2.commit, &tmp.path().join("imported")).unwrap();
    checkout(
        &Ostree::at(&source),
        &v2.commit,
        &tmp.path().join("committed"),
    )
    .unwrap();
    assert_same_listing(
        &listing(&tmp.path().join("imported")).unwrap(),
        &listing(&tmp.path().join("committed")).unwrap(),
        "imported after the stage",
        "ostree commit",
    );
    let listed = list(&n.path);
    assert_eq!(listed[0]["imported"], true, "{listed:?}");
    // The next stage run drops the stage the importer has taken over; the
    // layer refs stay, they are the importer's now.
    let o = stage(&n.path, &n.server.url, &image, &[]);
    assert!(o.status.success(), "stage again: {}", show(&o));
    assert!(list(&n.path).is_empty());
    assert!(n
        .ostree
        .refs()
        .unwrap()
        .iter()
        .any(|r| r.starts_with("ostree/container/blob/")));
}

#[test]
fn a_bare_user_node_that_staged_v2_imports_it_without_a_layer_download() {
    stage_then_import("bare-user");
}

#[test]
fn a_bare_node_that_staged_v2_imports_it_without_a_layer_download() {
    stage_then_import("bare");
}

/// An archive repo stages too (the importer does not import into one; the
/// refs and objects are what it would find), and a rerun, by the ref the
/// server publishes the image at, fetches nothing and writes the same refs.
#[test]
fn an_archive_repo_stages_v2_and_a_rerun_fetches_nothing() {
    let f = fixtures();
    let v2 = &f.releases[1];
    let reg = Registry::start();
    let image2 = reg.push(&f.oci_layout, &v2.version, "native:v2", &[]);
    let server = ready(image_server(&reg, std::slice::from_ref(&image2)));
    let tmp = tempdir();
    let path = tmp.path().join("node");
    let node = Ostree::init(&path, "archive").unwrap();
    let image = pinned(&reg, "native:v2", v2);
    let o = stage(&path, &server.url, &image, &[]);
    assert!(o.status.success(), "stage: {}", show(&o));
    node.fsck().unwrap();
    let first = stage_refs(&node);
    assert_eq!(first.len(), v2.layers.len() + 1, "{first:?}");
    // The rerun names the image by the ref the server publishes it at.
    let o = run(&[
        "stage",
        "--repo",
        &path.display().to_string(),
        "--url",
        &server.url,
        "--ref",
        DEFAULT_REF,
        "--json",
    ]);
    assert!(o.status.success(), "rerun: {}", show(&o));
    let evs = events(&o);
    assert_eq!(event(&evs, "staged")["digest"], v2.image_manifest.as_str());
    let done = event(&evs, "done");
    assert_eq!(done["objects_written"], 0, "{done}");
    assert_eq!(event(&evs, "staged")["object_sets_written"], 0);
    assert_eq!(stage_refs(&node), first);
}

/// `--forget` drops the stage and the layer refs no imported image names;
/// v1's own layer refs stay.
#[test]
fn forget_drops_the_stage_and_only_its_own_layer_refs() {
    let f = fixtures();
    let v2 = &f.releases[1];
    let n = node_with_v1(&f, "bare-user");
    let before = stage_refs(&n.ostree);
    let image = pinned(&n.reg, "native:v2", v2);
    let o = stage(&n.path, &n.server.url, &image, &[]);
    assert!(o.status.success(), "stage: {}", show(&o));
    assert!(stage_refs(&n.ostree).len() > before.len());
    let o = run(&[
        "stage",
        "--repo",
        &n.path.display().to_string(),
        "--forget",
        &v2.image_manifest,
        "--json",
    ]);
    assert!(o.status.success(), "forget: {}", show(&o));
    assert_eq!(stage_refs(&n.ostree), before);
    assert!(list(&n.path).is_empty());
    let o = run(&[
        "stage",
        "--repo",
        &n.path.display().to_string(),
        "--forget",
        &v2.image_manifest,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", show(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("is not staged"));
}

/// A failed stage: the documented exit code, an error that says what was
/// wrong, and no ref a stage writes (v1's layer refs as they were).
fn assert_refused(n: &Node, url: &str, image: &str, code: i32, says: &str) {
    let before = stage_refs(&n.ostree);
    let o = stage(&n.path, url, image, &[]);
    assert_eq!(o.status.code(), Some(code), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(says),
        "want {says:?} in the error: {}",
        show(&o)
    );
    let evs = events(&o);
    assert_eq!(event(&evs, "error")["exit_code"], code);
    assert_eq!(stage_refs(&n.ostree), before, "a failed stage wrote refs");
    assert!(list(&n.path).is_empty());
    n.ostree.fsck().unwrap();
}

fn blob_path(digest: &str) -> String {
    format!("/blobs/sha256/{}", &digest[7..])
}

#[test]
fn a_manifest_that_does_not_match_the_pinned_digest_is_refused() {
    let f = fixtures();
    let (v1, v2) = (&f.releases[0], &f.releases[1]);
    let n = node_with_v1(&f, "bare-user");
    // v1's genuine manifest, served where v2's should be.
    let (v1_manifest, _) = n.reg.manifest("native", "v1");
    assert_eq!(sha256_hex(&v1_manifest), v1.image_manifest[7..]);
    let proxy = Proxy::start(
        &n.server.url,
        only(
            &blob_path(&v2.image_manifest),
            Action::Bytes(v1_manifest.into()),
        ),
    )
    .unwrap();
    let image = pinned(&n.reg, "native:v2", v2);
    assert_refused(&n, &proxy.url, &image, 3, "it is not the pinned image");
}

#[test]
fn a_server_that_claims_an_image_it_does_not_serve_is_refused() {
    let f = fixtures();
    let v2 = &f.releases[1];
    let n = node_with_v1(&f, "bare-user");
    let proxy = Proxy::start(
        &n.server.url,
        only(&blob_path(&v2.image_manifest), Action::Status(404)),
    )
    .unwrap();
    let image = pinned(&n.reg, "native:v2", v2);
    assert_refused(&n, &proxy.url, &image, 2, "does not serve it");
    // An image the server does not stage at all.
    let other = format!("{}/native:v9@sha256:{}", n.reg.host(), "ab".repeat(32));
    assert_refused(&n, &n.server.url, &other, 2, "does not stage image");
}

/// A content object v2 adds, forged (one byte flipped) or cut short: the
/// pull path refuses it, and no ref appears.
#[test]
fn a_forged_or_truncated_object_is_refused() {
    let f = fixtures();
    let (v1, v2) = (&f.releases[0], &f.releases[1]);
    let n = node_with_v1(&f, "bare-user");
    let new = new_content_object(&f, &v1.commit, &v2.commit);
    let genuine = n.server.get(&new).unwrap().body;
    let mut forged = genuine.clone();
    let last = forged.len() - 1;
    forged[last] ^= 0x55;
    let image = pinned(&n.reg, "native:v2", v2);
    let proxy = Proxy::start(&n.server.url, only(&new, Action::Bytes(forged.into()))).unwrap();
    assert_refused(&n, &proxy.url, &image, 3, "content object");
    let cut = Proxy::start(
        &n.server.url,
        only(
            &new,
            Action::Bytes(genuine[..genuine.len() / 2].to_vec().into()),
        ),
    )
    .unwrap();
    assert_refused(&n, &cut.url, &image, 3, "content object");
}

/// The path of a content object `new` has and `old` lacks.
fn new_content_object(f: &NativeFixtures, old: &str, new: &str) -> String {
    let c = content_only_in(f, old, new);
    format!("/objects/{}/{}.filez", &c[..2], &c[2..])
}

/// A content object `new` has and `old` lacks.
fn content_only_in(f: &NativeFixtures, old: &str, new: &str) -> String {
    use oscontent_testkit::checkout::{commit_closure, object_difference};
    let tmp = tempdir();
    let source = tmp.path().join("source");
    copy_dir(&f.repo, &source).unwrap();
    let source = Ostree::at(&source);
    let added = object_difference(
        &commit_closure(&source, new).unwrap(),
        &commit_closure(&source, old).unwrap(),
    );
    let c = added
        .get(objects::CONTENT)
        .into_iter()
        .next()
        .expect("the commits differ in content");
    c.clone()
}

fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

/// Killed (SIGKILL) while its objects stream in, a stage leaves no ref; the
/// rerun resumes and completes, and the importer then fetches no layer.
#[test]
fn a_stage_killed_mid_fetch_leaves_nothing_and_a_rerun_completes() {
    let f = fixtures();
    let v2 = &f.releases[1];
    let n = node_with_v1(&f, "bare-user");
    let before = stage_refs(&n.ostree);
    let proxy = Proxy::builder(&n.server.url)
        .stall_after(64 << 10)
        .start()
        .unwrap();
    let image = pinned(&n.reg, "native:v2", v2);
    let path = n.path.display().to_string();
    let mut child = client(&[
        "stage", "--repo", &path, "--url", &proxy.url, "--image", &image, "--json",
    ])
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + STAGE_TIMEOUT;
    while !proxy.stalled() {
        assert!(
            std::time::Instant::now() < deadline,
            "the stage never reached the stall"
        );
        assert!(child.try_wait().unwrap().is_none(), "the stage ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(stage_refs(&n.ostree), before, "a killed stage wrote refs");
    let o = stage(&n.path, &n.server.url, &image, &[]);
    assert!(o.status.success(), "rerun: {}", show(&o));
    let evs = events(&o);
    event(&evs, "staged");
    let imported = import(&n.path, &n.image2, true).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(imported.fetched.is_empty(), "{:?}", imported.fetched);
    n.ostree.fsck().unwrap();
}

/// The server's genuine summary with its staging index edited by `edit`,
/// and other paths answered by `extra`, through a proxy.
fn forged_index(
    n: &Node,
    edit: impl FnOnce(&mut StagedImage),
    extra: Vec<(String, Vec<u8>)>,
) -> Proxy {
    let genuine = n.server.get("/summary").unwrap().body;
    let mut summary = parse_summary(&genuine).unwrap();
    let index = summary
        .staging
        .as_mut()
        .expect("the server publishes a staging index");
    assert_eq!(index.images.len(), 1, "{index:?}");
    edit(&mut index.images[0]);
    let forged = build_summary(&summary).unwrap();
    let mut answers: Vec<(String, Vec<u8>)> = vec![("/summary".into(), forged)];
    answers.extend(extra);
    let rule: oscontent_testkit::proxy::Rule = std::sync::Arc::new(move |p: &str| {
        answers
            .iter()
            .find(|(path, _)| path == p)
            .map(|(_, b)| Action::Bytes(b.clone().into()))
    });
    Proxy::start(&n.server.url, rule).unwrap()
}

#[test]
fn a_config_naming_another_commit_is_refused() {
    let f = fixtures();
    let (v1, v2) = (&f.releases[0], &f.releases[1]);
    let n = node_with_v1(&f, "bare-user");
    // The index stages v1's commit (which the node has) under v2's digest.
    let v1_commit = Checksum::from_hex(&v1.commit).unwrap();
    let proxy = forged_index(&n, |i| i.commit = v1_commit, vec![]);
    let image = pinned(&n.reg, "native:v2", v2);
    assert_refused(&n, &proxy.url, &image, 3, "the config names commit");
}

#[test]
fn a_ref_for_a_layer_the_manifest_lacks_is_refused() {
    let f = fixtures();
    let v2 = &f.releases[1];
    let n = node_with_v1(&f, "bare-user");
    let proxy = forged_index(
        &n,
        |i| {
            let l = i.layers.len() - 1;
            i.layers[l].digest = Checksum::from_bytes(&[7; 32]).unwrap();
        },
        vec![],
    );
    let image = pinned(&n.reg, "native:v2", v2);
    assert_refused(&n, &proxy.url, &image, 3, "which the manifest lacks");
}

/// An object set that lists, besides its own objects, a content object
/// v1 has and v2 lacks (already on the node, so nothing would fetch it):
/// a layer ref naming it would make the importer take an old file for
/// part of v2. Its commit and dirtree are served genuinely hashed.
#[test]
fn an_object_set_listing_an_object_outside_the_closure_is_refused() {
    let f = fixtures();
    let (v1, v2) = (&f.releases[0], &f.releases[1]);
    let n = node_with_v1(&f, "bare-user");
    let old = content_only_in(&f, &v2.commit, &v1.commit);
    let genuine = parse_summary(&n.server.get("/summary").unwrap().body).unwrap();
    let image = &genuine.staging.as_ref().unwrap().images[0];
    let (at, set_id) = image
        .layers
        .iter()
        .enumerate()
        .find_map(|(i, l)| match l.kind {
            LayerKind::ObjectSet(c) => Some((i, c)),
            _ => None,
        })
        .expect("v2 has chunk layers");
    let tree_of = |c: &Checksum| {
        let commit = n.server.get(&object_path(c, "commit")).unwrap().body;
        let root = oscontent_format::Commit::parse(&commit).unwrap().root_tree;
        n.server.get(&object_path(&root, "dirtree")).unwrap().body
    };
    let mut objects: Vec<Checksum> = ObjectSet::from_dirtree(&tree_of(&set_id))
        .unwrap()
        .iter()
        .copied()
        .collect();
    objects.push(Checksum::from_hex(&old).unwrap());
    let forged = ObjectSet::new(objects).unwrap().build();
    let id = forged.commit.checksum;
    let proxy = forged_index(
        &n,
        |i| i.layers[at].kind = LayerKind::ObjectSet(id),
        vec![
            (object_path(&id, "commit"), forged.commit.bytes),
            (
                object_path(&forged.dirtree.checksum, "dirtree"),
                forged.dirtree.bytes,
            ),
        ],
    );
    let pinned = pinned(&n.reg, "native:v2", v2);
    assert_refused(
        &n,
        &proxy.url,
        &pinned,
        3,
        &format!("lists {old}, which is not a content object of commit"),
    );
}

fn object_path(c: &Checksum, ext: &str) -> String {
    let h = c.to_hex();
    format!("/objects/{}/{}.{ext}", &h[..2], &h[2..])
}

/// While a stage runs it holds the repo's shared lock as libostree takes
/// it, so `ostree prune` (which takes it exclusive) waits rather than
/// deleting objects the stage is about to name; once the stage ends,
/// prune runs, and the staged record keeps v2's objects.
#[test]
fn prune_waits_for_a_running_stage_and_keeps_what_it_staged() {
    let f = fixtures();
    let v2 = &f.releases[1];
    let n = node_with_v1(&f, "bare-user");
    n.ostree
        .run(["config", "set", "core.lock-timeout-secs", "1"])
        .unwrap();
    let proxy = Proxy::builder(&n.server.url)
        .stall_after(64 << 10)
        .start()
        .unwrap();
    let image = pinned(&n.reg, "native:v2", v2);
    let path = n.path.display().to_string();
    let mut child = client(&[
        "stage", "--repo", &path, "--url", &proxy.url, "--image", &image, "--json",
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + STAGE_TIMEOUT;
    while !proxy.stalled() {
        assert!(std::time::Instant::now() < deadline, "never stalled");
        assert!(child.try_wait().unwrap().is_none(), "the stage ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pruned = n.ostree.output(["prune", "--refs-only"]).unwrap();
    assert!(
        !pruned.status.success(),
        "prune ran beside a stage holding the lock: {}",
        String::from_utf8_lossy(&pruned.stdout)
    );
    assert!(
        String::from_utf8_lossy(&pruned.stderr).contains("ock"),
        "{}",
        String::from_utf8_lossy(&pruned.stderr)
    );
    proxy.unthrottle();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "stage: {}", show(&o));
    // The layer refs gone (as ostree-ext's layer GC would drop unused
    // ones), prune keeps the staged commit's tree through the record.
    for r in stage_refs(&n.ostree) {
        if r.starts_with("ostree/container/blob/") {
            n.ostree.run(["refs", "--delete", &r]).unwrap();
        }
    }
    n.ostree.run(["prune", "--refs-only", "--depth=0"]).unwrap();
    n.ostree.fsck().unwrap();
    let tmp = tempdir();
    let staged_ref = format!("oscontent/staged/{}", &v2.image_manifest[7..]);
    checkout(&n.ostree, &staged_ref, &tmp.path().join("out")).unwrap();
}
