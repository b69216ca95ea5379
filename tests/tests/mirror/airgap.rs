//! The air gap, end to end.
//!
//! ```text
//!  hub netns                         site netns (no route to the registry)
//!  registry 127.0.0.1:5000           site server 10.77.0.2:8080 (--bundle USB)
//!  hub server 10.77.0.1:8080 ──veth── chained server 10.77.0.2:8082 (--upstream)
//!        │                           node: stock ostree pull, gpg-verify(-summary)
//!        └── mirror ──► USB (a shared directory) ──► site
//! ```

use crate::netns::{link, suite_ns, NetNs, Proc, SuiteNs};
use crate::support::*;
use oscontent_testkit::signing::keygen;
use oscontent_testkit::signing::Key;
use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const HUB_IP: &str = "10.77.0.1";
const SITE_IP: &str = "10.77.0.2";

/// The two namespaces, linked; the work dir; the USB stick and the bundle
/// on it. Held for the whole test: the namespaces are dropped after every
/// process in them (each step's servers are locals of the test).
struct Gap {
    hub: NetNs,
    site: NetNs,
    _t: tempfile::TempDir,
    work: PathBuf,
    usb: PathBuf,
    bundle: PathBuf,
    bundle_arg: String,
}

fn gap() -> Gap {
    let hub = suite_ns("hub");
    let site = suite_ns("site");
    link(
        &hub,
        &format!("{HUB_IP}/24"),
        &site,
        &format!("{SITE_IP}/24"),
    )
    .unwrap();
    let (_t, work) = dir();
    let usb = work.join("usb");
    std::fs::create_dir_all(&usb).unwrap();
    let bundle = usb.join("os");
    let bundle_arg = format!("bundle:{}", bundle.display());
    Gap {
        hub,
        site,
        _t,
        work,
        usb,
        bundle,
        bundle_arg,
    }
}

/// The hub's side: a registry only it can reach, both releases pushed and
/// signed with the release key.
struct Hub {
    _registry: Registry,
    img1: String,
    img2: String,
    key: Key,
    trusted: String,
    sig1: PathBuf,
    sig2: PathBuf,
}

fn hub(g: &Gap) -> Hub {
    let registry = ns_registry(&g.hub);
    let img1 = push_release(&registry, v1());
    let img2 = push_release(&registry, v2());
    let o = run_bounded(
        g.site
            .exec("curl")
            .args(["-sS", "--max-time", "3"])
            .arg(format!("http://{HUB_IP}:5000/v2/")),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(
        !o.status.success(),
        "the site reached the hub's registry: the air gap is not one"
    );
    let key = keygen(&g.work.join("keys"), "release", &[]).unwrap();
    let trusted = key.public.to_str().unwrap().to_owned();
    let sign = |image: &str, out: &Path| {
        ok(server(&g.hub)
            .args(["sign", "--image", image, "--insecure-registry", REGISTRY])
            .arg("--key")
            .arg(&key.secret)
            .arg("--out")
            .arg(out));
    };
    let (sig1, sig2) = (g.work.join("sig1"), g.work.join("sig2"));
    // `sign` takes only pinned images: each release by digest.
    let pinned = |r: &Release| {
        let digest = registry.digest(&format!("os:{}", r.version));
        registry.image(&format!("os@{digest}"))
    };
    sign(&pinned(v1()), &sig1);
    sign(&pinned(v2()), &sig2);
    Hub {
        _registry: registry,
        img1,
        img2,
        key,
        trusted,
        sig1,
        sig2,
    }
}

/// The hub server for one release, verified against the release key.
fn hub_server(g: &Gap, h: &Hub, image: &str, sigs: &Path) -> NsServer {
    NsServer::ready(
        &g.hub,
        &format!("{HUB_IP}:8080"),
        &[
            "--image",
            image,
            "--insecure-registry",
            REGISTRY,
            "--signatures",
            sigs.to_str().unwrap(),
            "--trusted-keys",
            &h.trusted,
        ],
    )
}

/// A chained site server fed by the hub over the link (release N).
fn chained_server(g: &Gap, h: &Hub, hub_n: &NsServer) -> NsServer {
    let chained = NsServer::ready(
        &g.site,
        &format!("{SITE_IP}:8082"),
        &[
            "--upstream",
            &hub_n.url,
            "--trusted-keys",
            &h.trusted,
            "--keep",
            "1",
        ],
    );
    assert_eq!(
        g.site
            .http_get(&format!("{}/summary", chained.url))
            .unwrap(),
        g.site.http_get(&format!("{}/summary", hub_n.url)).unwrap(),
        "the chained server republishes the hub's summary byte for byte"
    );
    chained
}

/// Release N: straight from the image into the bundle, verified. Returns
/// the bundle's summary.
fn mirror_release_n(g: &Gap, h: &Hub, hub_n: &NsServer) -> Vec<u8> {
    let m1 = mirror(
        &g.hub,
        &h.img1,
        &g.bundle_arg,
        &[
            "--insecure-registry",
            REGISTRY,
            "--signatures",
            h.sig1.to_str().unwrap(),
            "--trusted-keys",
            &h.trusted,
        ],
    );
    assert_eq!(m1["summary_verified"], true, "{m1}");
    assert_eq!(u64_of(&m1, "commits_verified"), 1, "{m1}");
    let v1_summary = std::fs::read(g.bundle.join("summary")).unwrap();
    // The hub's summary and signature are refused under another key, and
    // the refusal leaves the complete bundle as it was.
    let stranger = keygen(&g.work.join("keys"), "stranger", &[]).unwrap();
    let before = std::fs::read(g.bundle.join("oscontent-bundle.json")).unwrap();
    let err = mirror_fails(
        &g.hub,
        &hub_n.url,
        &g.bundle_arg,
        &["--trusted-keys", stranger.public.to_str().unwrap()],
    );
    assert!(err.contains("not in the trusted keyring"), "{err}");
    assert_eq!(
        std::fs::read(g.bundle.join("oscontent-bundle.json")).unwrap(),
        before
    );
    v1_summary
}

/// A node at the site: its repo, with the site server as its remote.
struct Node {
    _t: tempfile::TempDir,
    dir: PathBuf,
    repo: Ostree,
}

/// The site: serve the bundle, verified; a node pulls with the original
/// key.
fn site_serves_n(g: &Gap, h: &Hub, v1_summary: &[u8]) -> (NsServer, Node) {
    let site_server = NsServer::ready(
        &g.site,
        &format!("{SITE_IP}:8080"),
        &[
            "--bundle",
            g.bundle.to_str().unwrap(),
            "--trusted-keys",
            &h.trusted,
            "--keep",
            "1",
        ],
    );
    assert_eq!(
        g.site
            .http_get(&format!("{}/summary", site_server.url))
            .unwrap(),
        v1_summary,
        "the site serves the signed summary byte for byte"
    );
    let (_t, dir) = dir();
    let repo = node_repo(&dir, &site_server.url, &h.key.public);
    node_pull(&g.site, &dir, fixture_ref()).unwrap_or_else(|e| panic!("node pull of N: {e}"));
    assert_eq!(repo.rev_parse(fixture_ref()).unwrap(), v1().commit);
    (site_server, Node { _t, dir, repo })
}

/// What release N+1 moved: the new objects and their bytes, and the
/// bundle's manifest after.
struct Moved {
    objects: u64,
    bytes: u64,
    manifest: serde_json::Value,
}

/// Release N+1, through the hub server: only the new objects move.
fn mirror_release_n1(g: &Gap, h: &Hub, hub_n1: &NsServer) -> Moved {
    let v2 = v2();
    let m2 = mirror(
        &g.hub,
        &hub_n1.url,
        &g.bundle_arg,
        &["--trusted-keys", &h.trusted],
    );
    let (new_objects, new_bytes) = new_objects(&v1().repo, &v2.repo);
    let copied = u64_of(&m2, "bytes_copied");
    // Straight to stderr, past the harness's capture: CI logs show it.
    let tally = format!(
        "mirror: release N+1 into the bundle: {} objects, {copied} bytes copied; the image is {} bytes ({:.1}%); the release is {} bytes in the bundle\n",
        u64_of(&m2, "objects_copied"),
        v2.image_bytes,
        100.0 * copied as f64 / v2.image_bytes as f64,
        u64_of(&m2, "release_bytes"),
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), tally.as_bytes());
    assert_eq!(
        (u64_of(&m2, "objects_copied"), copied),
        (new_objects, new_bytes),
        "N+1 copies exactly the objects N does not have: {m2}"
    );
    assert!(
        copied * 4 < v2.image_bytes,
        "{copied} vs {}",
        v2.image_bytes
    );
    assert_eq!(m2["summary_verified"], true);
    Moved {
        objects: new_objects,
        bytes: new_bytes,
        manifest: manifest(&g.bundle),
    }
}

/// The site takes N+1 at SIGHUP, prunes N (--keep 1), the node updates.
fn site_takes_n1(g: &Gap, site_server: &NsServer, node: &Node) {
    let v2 = v2();
    site_server
        .proc
        .signal(rustix::process::Signal::HUP)
        .unwrap();
    site_server
        .proc
        .wait_stderr(&["published", &v2.commit], READY_TIMEOUT)
        .unwrap();
    let pruned = site_server
        .proc
        .wait_stderr(&["pruned", "releases=1"], READY_TIMEOUT)
        .unwrap();
    eprintln!("site: {pruned}");
    node_pull(&g.site, &node.dir, fixture_ref())
        .unwrap_or_else(|e| panic!("node pull of N+1: {e}"));
    assert_eq!(node.repo.rev_parse(fixture_ref()).unwrap(), v2.commit);
    node.repo.fsck().unwrap();
}

/// The chained server follows the hub at SIGHUP: only N+1's new objects
/// cross the link, and a node pulls through it.
fn chained_follows(g: &Gap, h: &Hub, chained: &NsServer, moved: &Moved) {
    let (new_objects, new_bytes) = (moved.objects, moved.bytes);
    chained.proc.signal(rustix::process::Signal::HUP).unwrap();
    chained
        .proc
        .wait_stderr(&["published", &v2().commit], READY_TIMEOUT)
        .unwrap();
    let line = chained
        .proc
        .wait_stderr(
            &[
                "mirrored and verified",
                "summary_verified=true",
                &format!("fetched={new_objects} fetched_bytes={new_bytes}"),
            ],
            Duration::from_secs(10),
        )
        .unwrap();
    assert!(
        line.ends_with(&format!("fetched_bytes={new_bytes}")),
        "{line}"
    );
    eprintln!("chained: {line}");
    let (_c, chained_node_dir) = dir();
    let chained_node = node_repo(&chained_node_dir, &chained.url, &h.key.public);
    node_pull(&g.site, &chained_node_dir, fixture_ref())
        .unwrap_or_else(|e| panic!("pull via chain: {e}"));
    assert_eq!(chained_node.rev_parse(fixture_ref()).unwrap(), v2().commit);
}

/// `serve FLAG BUNDLE` at the site must refuse to start, saying `want`.
/// (`--repo` on a bundle is `--bundle`: the same checks.)
fn refuse(g: &Gap, h: &Hub, flag: &str, b: &Path, what: &str, want: &str) {
    let (_s, state) = dir();
    let o = run_bounded(
        server(&g.site)
            .args(["serve", flag, b.to_str().unwrap()])
            .args([
                "--trusted-keys",
                &h.trusted,
                "--listen",
                &format!("{SITE_IP}:8090"),
            ])
            .arg("--state-dir")
            .arg(&state),
        TOOL_TIMEOUT,
    )
    .unwrap();
    let stderr = strip_ansi(&String::from_utf8_lossy(&o.stderr));
    assert!(
        !o.status.success(),
        "{what}: the site served a tampered bundle"
    );
    assert!(!announced_listening(&o.stdout), "{what}: the site listened");
    assert!(stderr.contains(want), "{what}: want {want:?} in:\n{stderr}");
    eprintln!("{what}: refused: {}", stderr.lines().last().unwrap_or(""));
}

/// Tampering in transit is refused at the site, and nothing served.
fn tampering_refused(g: &Gap, h: &Hub, v1_summary: &[u8]) {
    let v2_only: Vec<String> = {
        let old = object_files(&v1().repo);
        object_files(&v2().repo)
            .into_keys()
            .filter(|p| !old.contains_key(p) && p.ends_with(".filez"))
            .collect()
    };
    let flipped = g.work.join("flipped");
    copy_bundle(&g.bundle, &flipped);
    flip_byte(&flipped.join(&v2_only[0]));
    refuse(
        g,
        h,
        "--bundle",
        &flipped,
        "a flipped byte in an object",
        &v2_only[0],
    );
    let swapped = g.work.join("swapped");
    copy_bundle(&g.bundle, &swapped);
    std::fs::write(swapped.join("summary"), v1_summary).unwrap();
    refuse(
        g,
        h,
        "--repo",
        &swapped,
        "a swapped summary",
        "summary: SHA-256",
    );
    // The same swap with a manifest rewritten to match: the summary
    // signature, by the original key, still refuses it.
    let forged = g.work.join("forged");
    copy_bundle(&g.bundle, &forged);
    forge_summary(&forged, v1_summary);
    refuse(
        g,
        h,
        "--bundle",
        &forged,
        "a swapped summary with a forged manifest",
        "summary signature",
    );
}

/// The same forgery delivered to the running site: refused at SIGHUP,
/// the verified N+1 stays served.
fn forgery_refused_live(g: &Gap, site_server: &NsServer, node: &Node, v1_summary: &[u8]) {
    let served_before = g
        .site
        .http_get(&format!("{}/summary", site_server.url))
        .unwrap();
    forge_summary(&g.bundle, v1_summary);
    site_server
        .proc
        .signal(rustix::process::Signal::HUP)
        .unwrap();
    site_server
        .proc
        .wait_stderr(
            &["summary signature", "still serving the previous generation"],
            READY_TIMEOUT,
        )
        .unwrap();
    assert_eq!(
        g.site
            .http_get(&format!("{}/summary", site_server.url))
            .unwrap(),
        served_before
    );
    node_pull(&g.site, &node.dir, fixture_ref())
        .unwrap_or_else(|e| panic!("pull after refusal: {e}"));
    assert_eq!(node.repo.rev_parse(fixture_ref()).unwrap(), v2().commit);
}

/// A mirror killed midway leaves an incomplete bundle, which the site
/// refuses. Returns the bundle's path and `bundle:` argument.
fn killed_mirror(g: &Gap, h: &Hub, hub_n1: &NsServer) -> (PathBuf, String) {
    let killed = g.usb.join("killed");
    let killed_arg = format!("bundle:{}", killed.display());
    let run = Proc::spawn(
        server(&g.hub)
            .args(["mirror", &hub_n1.url, &killed_arg])
            .args(["--trusted-keys", &h.trusted, "--max-rate", "2M"]),
    )
    .unwrap();
    let progress = run.wait_stderr(&["mirror progress"], TOOL_TIMEOUT).unwrap();
    run.signal(rustix::process::Signal::KILL).unwrap();
    drop(run);
    eprintln!("killed the mirror after: {progress}");
    assert!(
        !killed.join("oscontent-bundle.json").exists(),
        "a killed mirror left a bundle that looks complete"
    );
    let (_k, kstate) = dir();
    let o = run_bounded(
        server(&g.site)
            .args(["serve", "--bundle", killed.to_str().unwrap()])
            .args(["--listen", &format!("{SITE_IP}:8091")])
            .arg("--state-dir")
            .arg(&kstate),
        TOOL_TIMEOUT,
    )
    .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("incomplete bundle"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    (killed, killed_arg)
}

/// The killed mirror resumes and completes: N+1's objects (and its
/// signatures), the same bytes as in the bundle that was never
/// interrupted.
fn resumes(g: &Gap, h: &Hub, hub_n1: &NsServer, moved: &Moved) -> PathBuf {
    let (killed, killed_arg) = killed_mirror(g, h, hub_n1);
    let m3 = mirror(
        &g.hub,
        &hub_n1.url,
        &killed_arg,
        &["--trusted-keys", &h.trusted],
    );
    let (objects, reverified, fetched) = (
        u64_of(&m3, "objects"),
        u64_of(&m3, "objects_reverified"),
        u64_of(&m3, "objects_copied"),
    );
    eprintln!("resumed: {reverified} objects verified in place, {fetched} fetched, of {objects}");
    assert!(reverified > 0, "{m3}");
    assert_eq!(reverified + fetched, objects, "{m3}");
    let resumed = manifest(&killed);
    let objects: Vec<(&String, &serde_json::Value)> = resumed["files"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(p, _)| p.starts_with("objects/"))
        .collect();
    assert_eq!(
        objects.len(),
        object_files(&v2().repo).len() + 1,
        "objects + commitmeta"
    );
    for (path, entry) in objects {
        assert_eq!(moved.manifest["files"].get(path), Some(entry), "{path}");
    }
    killed
}

/// Any web server serves a bundle, and stock `ostree pull --mirror` takes
/// it, verifying the original signatures.
fn stock_mirror_of(bundle: &Path, h: &Hub) {
    let r = fixture_ref();
    let web = StaticServer::start(bundle);
    let (_m, mirror_dir) = dir();
    let copy = Ostree::init(&mirror_dir, "archive").unwrap();
    oscontent_testkit::signing::add_signed_remote(&copy, "web", &web.url, &h.key.public, true)
        .unwrap();
    // (The bound ref: the `version/` refs of an image publication need
    // --disable-verify-bindings with stock ostree, see publish.rs.)
    copy.pull(&["--mirror", "web", r]).unwrap();
    assert_eq!(copy.rev_parse(r).unwrap(), v2().commit);
    copy.fsck().unwrap();
}

#[test]
fn release_crosses_the_air_gap_verified_end_to_end() {
    require_ostree();
    // Declared first: dropped last, after every process in it.
    let g = gap();
    let h = hub(&g);
    let mut hub_n = hub_server(&g, &h, &h.img1, &h.sig1);
    let chained = chained_server(&g, &h, &hub_n);
    let v1_summary = mirror_release_n(&g, &h, &hub_n);
    let (site_server, node) = site_serves_n(&g, &h, &v1_summary);

    hub_n.proc.stop();
    let hub_n1 = hub_server(&g, &h, &h.img2, &h.sig2);
    let moved = mirror_release_n1(&g, &h, &hub_n1);
    site_takes_n1(&g, &site_server, &node);
    chained_follows(&g, &h, &chained, &moved);

    tampering_refused(&g, &h, &v1_summary);
    forgery_refused_live(&g, &site_server, &node, &v1_summary);

    let resumed = resumes(&g, &h, &hub_n1, &moved);
    stock_mirror_of(&resumed, &h);
}

/// Replaces a bundle's summary and rewrites its manifest to match, as an
/// attacker who understands the format would.
fn forge_summary(bundle: &std::path::Path, summary: &[u8]) {
    use sha2::Digest;
    std::fs::write(bundle.join("summary"), summary).unwrap();
    let mut m = manifest(bundle);
    let sha = hex::encode(sha2::Sha256::digest(summary));
    m["summary_sha256"] = sha.clone().into();
    m["files"]["summary"] = serde_json::json!({"sha256": sha, "size": summary.len()});
    std::fs::write(
        bundle.join("oscontent-bundle.json"),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
}
