//! Path traversal: encoded and dot-dot request targets sent raw (so no
//! client normalises them), and symlinks planted inside a served repo copy.
//! Every one gets a 404 with an empty body and never leaks a byte.

use oscontent_format::{Checksum, Commit};
use oscontent_testkit::*;
use std::os::unix::fs::symlink;
use std::path::Path;

fn assert_404_no_leak(server: &Server, target: &str) {
    let r = server
        .raw("GET", target, &[])
        .unwrap_or_else(|e| panic!("GET {target}: {e:#}"));
    assert!(
        !leaks_secret(&r.raw),
        "GET {target} leaked a secret:\n{}",
        String::from_utf8_lossy(&r.raw)
    );
    assert_eq!(r.status, 404, "GET {target}: {}", r.status_line);
    assert!(
        r.body.is_empty(),
        "GET {target}: 404 with a body {:?}",
        String::from_utf8_lossy(&r.body)
    );
    let h = server.raw("HEAD", target, &[]).unwrap();
    assert_eq!(h.status, 404, "HEAD {target}");
    assert!(!leaks_secret(&h.raw), "HEAD {target} leaked");
}

#[test]
fn encoded_and_dot_dot_targets_are_404_and_leak_nothing() {
    let v1 = v1();
    let server = Server::release(v1);
    let abs_config = format!("/{}/config", v1.repo.display());
    let targets = [
        "/../../etc/passwd",
        "/refs/heads/../../config",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/objects/..%2f..%2fetc%2fpasswd",
        "//etc/passwd",
        "///etc/passwd",
        "/etc/passwd",
        "/refs/heads/%2e%2e%2f%2e%2e%2fconfig",
        "/refs/heads/%2e%2e/%2e%2e/config",
        "/refs/heads/../../../../../../../../etc/passwd",
        "/refs/heads/fedora/x86_64/coreos/stable/../../../../../../../etc/passwd",
        "/objects/../config",
        "/objects/../../../../../../etc/passwd",
        "/objects/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/./config",
        "/summary/../../etc/passwd",
        "/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/..%2f..%2f..%2fetc%2fpasswd",
        "/..%252f..%252fetc%252fpasswd",
        "/.%2e/.%2e/etc/passwd",
        "/%c0%ae%c0%ae/%c0%ae%c0%ae/etc/passwd",
        "/refs/heads/..%5c..%5cconfig",
        "/refs/heads/..;/..;/config",
        "/deltas/../../../etc/passwd",
        "/delta-indexes/../../etc/passwd",
        "/config%00",
        "/config%00.txt",
        "/refs/heads/%00",
        "//config",
        "/proc/self/environ",
        "/objects/../../../../proc/self/cwd/config",
        abs_config.as_str(),
    ];
    for t in targets {
        assert_404_no_leak(&server, t);
    }
    // Targets a strict parser may reject outright: any 4xx, never content.
    for t in [
        "../../etc/passwd",
        "http://127.0.0.1/../../etc/passwd",
        "/refs\\heads\\..\\..\\config",
    ] {
        let r = server.raw("GET", t, &[]).unwrap();
        assert!(!leaks_secret(&r.raw), "GET {t} leaked");
        assert!((400..500).contains(&r.status), "GET {t}: {}", r.status_line);
        assert!(r.body.is_empty(), "GET {t}: error with a body");
    }
}

/// Picks object prefix directories that hold nothing publication needs.
fn spare_prefixes(repo: &Path, avoid: &[String], n: usize) -> Vec<String> {
    let mut dirs: Vec<String> = std::fs::read_dir(repo.join("objects"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|d| d.len() == 2 && !avoid.iter().any(|a| a.starts_with(d.as_str())))
        .collect();
    dirs.sort();
    assert!(dirs.len() >= n, "fixture has too few object directories");
    dirs.truncate(n);
    dirs
}

#[test]
fn symlinks_planted_in_the_repo_are_never_followed() {
    let v1 = v1();
    let tmp = tempdir();
    let copy = tmp.path().join("repo");
    copy_dir(&v1.repo, &copy).unwrap();
    let outside = tmp.path().join("outside");
    let moved = tmp.path().join("moved");
    std::fs::create_dir_all(&moved).unwrap();
    let secret = outside.join("secret.txt");
    plant_secret(&secret).unwrap();
    let commit =
        Commit::parse(&std::fs::read(object_path(&copy, &v1.commit, "commit")).unwrap()).unwrap();

    let mut targets = plant_ref_links(&copy, &outside, &secret, v1);
    targets.extend(plant_delta_links(&copy, &outside, &secret, v1, &commit));
    // summary.sig and config linking out.
    symlink("/etc/passwd", copy.join("summary.sig")).unwrap();
    std::fs::remove_file(copy.join("config")).unwrap();
    symlink(&secret, copy.join("config")).unwrap();
    targets.push("/summary.sig".into());

    let server = Server::repo(&copy).start().unwrap();
    // Object directories and objects replaced by links once published
    // (before, the commit would be incomplete and refused): even a
    // verified object's name is never followed out of the repo.
    targets.extend(plant_object_links(
        &copy, &outside, &moved, &secret, v1, &commit,
    ));
    let before = snapshot(&copy).unwrap();
    for t in &targets {
        assert_404_no_leak(&server, t);
    }
    // The config link is not followed: whatever /config serves is not the
    // secret (the server may serve its own generated config instead).
    let cfg = server.raw("GET", "/config", &[]).unwrap();
    assert!(!leaks_secret(&cfg.raw), "/config followed a symlink");

    // Nothing behind a link makes it into the summary.
    let sum_raw = server.summary_bytes().unwrap();
    assert!(!leaks_secret(&sum_raw));
    let sum = oscontent_format::parse_summary(&sum_raw).unwrap();
    let names: Vec<&str> = sum.refs.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, [fixture_ref()], "symlinked refs are not published");
    assert!(
        sum.collection_map.is_empty(),
        "symlinked mirror refs are not published: {:?}",
        sum.collection_map
    );
    assert!(
        sum.deltas.is_empty(),
        "symlinked deltas are not advertised: {:?}",
        sum.deltas
    );
    let node = Ostree::init(&tmp.path().join("node"), "bare-user").unwrap();
    node.remote_add("os", &server.url, &[]).unwrap();
    let refs = node.run(["remote", "refs", "os"]).unwrap();
    assert_eq!(
        refs.trim(),
        format!("os:{}", fixture_ref()),
        "ostree sees only the real ref"
    );
    // Regular objects are still served.
    let ok = server.get(&object_url_path(&v1.commit, "commit")).unwrap();
    assert_eq!(ok.status, 200);

    assert_unchanged(&copy, &before, "serving a repo with planted symlinks");

    // A summary linking out, planted while serving: never followed.
    symlink(&secret, copy.join("summary")).unwrap();
    let s = server.raw("GET", "/summary", &[]).unwrap();
    assert!(!leaks_secret(&s.raw), "/summary followed a symlink");
    // A real summary next to a linked summary.sig: the link still 404s.
    std::fs::remove_file(copy.join("summary")).unwrap();
    std::fs::write(copy.join("summary"), &sum_raw).unwrap();
    let s = server.get("/summary").unwrap();
    assert_eq!(s.body, sum_raw, "the repo's own summary is served");
    assert_404_no_leak(&server, "/summary.sig");
    std::fs::remove_file(copy.join("summary")).unwrap();
    let before = snapshot(&copy).unwrap();
    assert_404_no_leak(&server, "/summary.sig");
    assert_404_no_leak(&server, "/refs/heads/stolen");
    assert_eq!(server.summary().unwrap().refs.len(), 1);
    drop(server);
    assert_unchanged(&copy, &before, "serving a repo with planted symlinks");
}

/// Object prefixes and objects linking out of the repo; returns the URL
/// paths that must 404.
fn plant_object_links(
    copy: &Path,
    outside: &Path,
    moved: &Path,
    secret: &Path,
    v1: &Release,
    commit: &Commit,
) -> Vec<String> {
    let avoid = [
        v1.commit.clone(),
        commit.root_tree.to_hex(),
        commit.root_meta.to_hex(),
    ];
    let [xx, yy, zz]: [String; 3] = spare_prefixes(copy, &avoid, 3).try_into().unwrap();
    let fake_tail = "e".repeat(62);

    // objects/XX -> a directory outside holding a well-named "object".
    std::fs::rename(copy.join("objects").join(&xx), moved.join(&xx)).unwrap();
    let objdir = outside.join("objdir");
    plant_secret(&objdir.join(format!("{fake_tail}.filez"))).unwrap();
    plant_secret(&objdir.join(format!("{fake_tail}.commit"))).unwrap();
    symlink(&objdir, copy.join("objects").join(&xx)).unwrap();
    // objects/YY -> /etc
    std::fs::rename(copy.join("objects").join(&yy), moved.join(&yy)).unwrap();
    symlink("/etc", copy.join("objects").join(&yy)).unwrap();
    // A real object replaced by a symlink, and a new name linking out.
    let zz_dir = copy.join("objects").join(&zz);
    let real = std::fs::read_dir(&zz_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(".filez"))
        .expect("a content object under the third prefix");
    std::fs::remove_file(zz_dir.join(&real)).unwrap();
    symlink(secret, zz_dir.join(&real)).unwrap();
    symlink("/etc/passwd", zz_dir.join(format!("{fake_tail}.filez"))).unwrap();
    vec![
        format!("/objects/{xx}/{fake_tail}.filez"),
        format!("/objects/{xx}/{fake_tail}.commit"),
        format!("/objects/{yy}/{fake_tail}.filez"),
        format!("/objects/{zz}/{real}"),
        format!("/objects/{zz}/{fake_tail}.filez"),
    ]
}

/// Refs: files and directories linking out, one with valid ref content;
/// returns the URL paths that must 404.
fn plant_ref_links(copy: &Path, outside: &Path, secret: &Path, v1: &Release) -> Vec<String> {
    let heads = copy.join("refs/heads");
    std::fs::create_dir_all(&heads).unwrap();
    symlink("/etc/passwd", heads.join("evil")).unwrap();
    symlink(secret, heads.join("evil2")).unwrap();
    std::fs::write(outside.join("stolen-ref"), format!("{}\n", v1.commit)).unwrap();
    symlink(outside.join("stolen-ref"), heads.join("stolen")).unwrap();
    std::fs::create_dir_all(outside.join("refsdir")).unwrap();
    std::fs::write(outside.join("refsdir/x"), format!("{}\n", v1.commit)).unwrap();
    symlink(outside.join("refsdir"), heads.join("evildir")).unwrap();
    let mirrors = copy.join("refs/mirrors");
    std::fs::create_dir_all(&mirrors).unwrap();
    std::fs::create_dir_all(outside.join("mirror/os")).unwrap();
    std::fs::write(outside.join("mirror/os/stable"), format!("{}\n", v1.commit)).unwrap();
    symlink(outside.join("mirror"), mirrors.join("org.example.Evil")).unwrap();
    vec![
        "/refs/heads/evil".into(),
        "/refs/heads/evil2".into(),
        "/refs/heads/stolen".into(),
        "/refs/heads/evildir/x".into(),
        "/refs/mirrors/org.example.Evil/os/stable".into(),
    ]
}

/// Deltas and delta indexes: a linked prefix dir, a linked delta dir and a
/// linked superblock, all with valid names; returns the URL paths that
/// must 404.
fn plant_delta_links(
    copy: &Path,
    outside: &Path,
    secret: &Path,
    v1: &Release,
    commit: &Commit,
) -> Vec<String> {
    let m = Checksum::from_hex(&v1.commit).unwrap().to_mbase64();
    let (p, rest) = m.split_at(2);
    let deltas = copy.join("deltas");
    std::fs::create_dir_all(&deltas).unwrap();
    plant_secret(&outside.join("deltas").join(rest).join("superblock")).unwrap();
    plant_secret(&outside.join("deltas").join(rest).join("0")).unwrap();
    symlink(outside.join("deltas"), deltas.join(p)).unwrap();
    let m2 = Checksum::from_hex(&commit.root_tree.to_hex())
        .unwrap()
        .to_mbase64();
    let (p2, rest2) = m2.split_at(2);
    std::fs::create_dir_all(deltas.join(p2)).unwrap();
    symlink(
        outside.join("deltas").join(rest),
        deltas.join(p2).join(rest2),
    )
    .unwrap();
    let m3 = Checksum::from_hex(&commit.root_meta.to_hex())
        .unwrap()
        .to_mbase64();
    let (p3, rest3) = m3.split_at(2);
    std::fs::create_dir_all(deltas.join(p3).join(rest3)).unwrap();
    symlink(secret, deltas.join(p3).join(rest3).join("superblock")).unwrap();
    let indexes = copy.join("delta-indexes");
    std::fs::create_dir_all(&indexes).unwrap();
    plant_secret(&outside.join("indexes").join(format!("{rest}.index"))).unwrap();
    symlink(outside.join("indexes"), indexes.join(p)).unwrap();
    vec![
        format!("/deltas/{p}/{rest}/superblock"),
        format!("/deltas/{p}/{rest}/0"),
        format!("/deltas/{p2}/{rest2}/superblock"),
        format!("/deltas/{p2}/{rest2}/0"),
        format!("/deltas/{p3}/{rest3}/superblock"),
        format!("/delta-indexes/{p}/{rest}.index"),
    ]
}
