//! The air gap, end to end.
//!
//! ```text
//!  hub netns                         site netns (no route to the registry)
//!  registry 127.0.0.1:5000           site server 10.77.0.2:8080 (--bundle USB)
//!  hub server 10.77.0.1:8080 ──veth── chained server 10.77.0.2:8082 (--upstream)
//!        │                           node: stock ostree pull, gpg-verify(-summary)
//!        └── mirror ──► USB (a shared directory) ──► site
//! ```

use crate::netns::{link, NetNs, Proc};
use crate::support::*;
use oscontent_testkit::signing::keygen;
use oscontent_testkit::*;
use std::time::Duration;

const HUB_IP: &str = "10.77.0.1";
const SITE_IP: &str = "10.77.0.2";

#[test]
fn release_crosses_the_air_gap_verified_end_to_end() {
    require_ostree();
    let (v1, v2, r) = (v1(), v2(), fixture_ref());
    // Declared first: dropped last, after every process in them.
    let hub = NetNs::create("hub");
    let site = NetNs::create("site");
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

    // --- The hub: a registry only it can reach, releases, a signing key.
    let registry = ns_registry(&hub);
    let img1 = push_release(&registry, v1);
    let img2 = push_release(&registry, v2);
    let o = run_bounded(
        site.exec("curl")
            .args(["-sS", "--max-time", "3"])
            .arg(format!("http://{HUB_IP}:5000/v2/")),
        Duration::from_secs(10),
    )
    .unwrap();
    assert!(
        !o.status.success(),
        "the site reached the hub's registry: the air gap is not one"
    );
    let key = keygen(&work.join("keys"), "release", &[]).unwrap();
    let trusted = key.public.to_str().unwrap().to_owned();
    let sign = |image: &str, out: &std::path::Path| {
        ok(server(&hub)
            .args(["sign", "--image", image, "--insecure-registry", REGISTRY])
            .arg("--key")
            .arg(&key.secret)
            .arg("--out")
            .arg(out));
    };
    let (sig1, sig2) = (work.join("sig1"), work.join("sig2"));
    sign(&img1, &sig1);
    sign(&img2, &sig2);
    let hub_listen = format!("{HUB_IP}:8080");
    let hub_server = |image: &str, sigs: &std::path::Path| {
        NsServer::ready(
            &hub,
            &hub_listen,
            &[
                "--image",
                image,
                "--insecure-registry",
                REGISTRY,
                "--signatures",
                sigs.to_str().unwrap(),
                "--trusted-keys",
                &trusted,
            ],
        )
    };
    let mut hub_n = hub_server(&img1, &sig1);

    // A chained site server fed by the hub over the link (release N).
    let chained = NsServer::ready(
        &site,
        &format!("{SITE_IP}:8082"),
        &[
            "--upstream",
            &hub_n.url,
            "--trusted-keys",
            &trusted,
            "--keep",
            "1",
        ],
    );
    assert_eq!(
        site.http_get(&format!("{}/summary", chained.url)).unwrap(),
        site.http_get(&format!("{}/summary", hub_n.url)).unwrap(),
        "the chained server republishes the hub's summary byte for byte"
    );

    // --- Release N: straight from the image into the bundle, verified.
    let m1 = mirror(
        &hub,
        &img1,
        &bundle_arg,
        &[
            "--insecure-registry",
            REGISTRY,
            "--signatures",
            sig1.to_str().unwrap(),
            "--trusted-keys",
            &trusted,
        ],
    );
    assert_eq!(m1["summary_verified"], true, "{m1}");
    assert_eq!(u64_of(&m1, "commits_verified"), 1, "{m1}");
    let v1_summary = std::fs::read(bundle.join("summary")).unwrap();
    // The hub's summary and signature are refused under another key, and
    // the refusal leaves the complete bundle as it was.
    let stranger = keygen(&work.join("keys"), "stranger", &[]).unwrap();
    let before = std::fs::read(bundle.join("oscontent-bundle.json")).unwrap();
    let err = mirror_fails(
        &hub,
        &hub_n.url,
        &bundle_arg,
        &["--trusted-keys", stranger.public.to_str().unwrap()],
    );
    assert!(err.contains("not in the trusted keyring"), "{err}");
    assert_eq!(
        std::fs::read(bundle.join("oscontent-bundle.json")).unwrap(),
        before
    );

    // --- The site: serve the bundle, verified; a node pulls with the
    // original key.
    let site_listen = format!("{SITE_IP}:8080");
    let site_server = NsServer::ready(
        &site,
        &site_listen,
        &[
            "--bundle",
            bundle.to_str().unwrap(),
            "--trusted-keys",
            &trusted,
            "--keep",
            "1",
        ],
    );
    assert_eq!(
        site.http_get(&format!("{}/summary", site_server.url))
            .unwrap(),
        v1_summary,
        "the site serves the signed summary byte for byte"
    );
    let (_n, node_dir) = dir();
    let node = node_repo(&node_dir, &site_server.url, &key.public);
    node_pull(&site, &node_dir, r).unwrap_or_else(|e| panic!("node pull of N: {e}"));
    assert_eq!(node.rev_parse(r).unwrap(), v1.commit);

    // --- Release N+1, through the hub server: only the new objects move.
    hub_n.proc.stop();
    let hub_n1 = hub_server(&img2, &sig2);
    let m2 = mirror(
        &hub,
        &hub_n1.url,
        &bundle_arg,
        &["--trusted-keys", &trusted],
    );
    let (new_objects, new_bytes) = new_objects(&v1.repo, &v2.repo);
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
    let manifest2 = manifest(&bundle);

    // The site takes N+1 at SIGHUP, prunes N (--keep 1), the node updates.
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
    node_pull(&site, &node_dir, r).unwrap_or_else(|e| panic!("node pull of N+1: {e}"));
    assert_eq!(node.rev_parse(r).unwrap(), v2.commit);
    node.fsck().unwrap();

    // The chained server follows the hub at SIGHUP: only new objects.
    chained.proc.signal(rustix::process::Signal::HUP).unwrap();
    chained
        .proc
        .wait_stderr(&["published", &v2.commit], READY_TIMEOUT)
        .unwrap();
    // Only N+1's new objects crossed the link.
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
    let chained_node = node_repo(&chained_node_dir, &chained.url, &key.public);
    node_pull(&site, &chained_node_dir, r).unwrap_or_else(|e| panic!("pull via chain: {e}"));
    assert_eq!(chained_node.rev_parse(r).unwrap(), v2.commit);

    // --- Tampering in transit is refused at the site, and nothing served.
    let v2_only: Vec<String> = {
        let old = object_files(&v1.repo);
        object_files(&v2.repo)
            .into_keys()
            .filter(|p| !old.contains_key(p) && p.ends_with(".filez"))
            .collect()
    };
    // `--repo` on a bundle is `--bundle`: the same checks.
    let refuse = |flag: &str, b: &std::path::Path, what: &str, want: &str| {
        let (_s, state) = dir();
        let o = run_bounded(
            server(&site)
                .args(["serve", flag, b.to_str().unwrap()])
                .args([
                    "--trusted-keys",
                    &trusted,
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
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("listening on"),
            "{what}: the site listened"
        );
        assert!(stderr.contains(want), "{what}: want {want:?} in:\n{stderr}");
        eprintln!("{what}: refused: {}", stderr.lines().last().unwrap_or(""));
    };
    let flipped = work.join("flipped");
    copy_bundle(&bundle, &flipped);
    flip_byte(&flipped.join(&v2_only[0]));
    refuse(
        "--bundle",
        &flipped,
        "a flipped byte in an object",
        &v2_only[0],
    );
    let swapped = work.join("swapped");
    copy_bundle(&bundle, &swapped);
    std::fs::write(swapped.join("summary"), &v1_summary).unwrap();
    refuse("--repo", &swapped, "a swapped summary", "summary: SHA-256");
    // The same swap with a manifest rewritten to match: the summary
    // signature, by the original key, still refuses it.
    let forged = work.join("forged");
    copy_bundle(&bundle, &forged);
    forge_summary(&forged, &v1_summary);
    refuse(
        "--bundle",
        &forged,
        "a swapped summary with a forged manifest",
        "summary signature",
    );

    // The same forgery delivered to the running site: refused at SIGHUP,
    // the verified N+1 stays served.
    let served_before = site
        .http_get(&format!("{}/summary", site_server.url))
        .unwrap();
    forge_summary(&bundle, &v1_summary);
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
        site.http_get(&format!("{}/summary", site_server.url))
            .unwrap(),
        served_before
    );
    node_pull(&site, &node_dir, r).unwrap_or_else(|e| panic!("pull after refusal: {e}"));
    assert_eq!(node.rev_parse(r).unwrap(), v2.commit);

    // --- A mirror killed midway resumes and completes.
    let killed = usb.join("killed");
    let killed_arg = format!("bundle:{}", killed.display());
    let run = Proc::spawn(
        server(&hub)
            .args(["mirror", &hub_n1.url, &killed_arg])
            .args(["--trusted-keys", &trusted, "--max-rate", "2M"]),
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
        server(&site)
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
    let m3 = mirror(
        &hub,
        &hub_n1.url,
        &killed_arg,
        &["--trusted-keys", &trusted],
    );
    let (objects, reverified, fetched) = (
        u64_of(&m3, "objects"),
        u64_of(&m3, "objects_reverified"),
        u64_of(&m3, "objects_copied"),
    );
    eprintln!("resumed: {reverified} objects verified in place, {fetched} fetched, of {objects}");
    assert!(reverified > 0, "{m3}");
    assert_eq!(reverified + fetched, objects, "{m3}");
    // Complete: N+1's objects (and its signatures), the same bytes as in
    // the bundle that was never interrupted.
    let resumed = manifest(&killed);
    let objects: Vec<(&String, &serde_json::Value)> = resumed["files"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(p, _)| p.starts_with("objects/"))
        .collect();
    assert_eq!(
        objects.len(),
        object_files(&v2.repo).len() + 1,
        "objects + commitmeta"
    );
    for (path, entry) in objects {
        assert_eq!(manifest2["files"].get(path), Some(entry), "{path}");
    }

    // Any web server serves a bundle, and stock `ostree pull --mirror`
    // takes it, verifying the original signatures.
    let web = StaticServer::start(&killed);
    let (_m, mirror_dir) = dir();
    let copy = Ostree::init(&mirror_dir, "archive").unwrap();
    oscontent_testkit::signing::add_signed_remote(&copy, "web", &web.url, &key.public, true)
        .unwrap();
    // (The bound ref: the `version/` refs of an image publication need
    // --disable-verify-bindings with stock ostree, see README.)
    copy.pull(&["--mirror", "web", r]).unwrap();
    assert_eq!(copy.rev_parse(r).unwrap(), v2.commit);
    copy.fsck().unwrap();
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
