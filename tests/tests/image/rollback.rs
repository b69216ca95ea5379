//! Rollbacks the refresher alone could not see: a tag moved back while
//! the server was down (the marks in the state dir judge the first
//! publication after a restart), and one image moved back beside another
//! moved forward (the refused one keeps its release, the other moves).

use crate::refresh::{rollbacks, wait_for_metrics, wait_for_ref, SWITCH_TIMEOUT};
use crate::support::*;
use oscontent_testkit::*;
use std::path::Path;

const MARKS: &str = "rollback-marks.json";

/// `oscontent_image_refusals_total` for `image` and `reason`.
fn image_refusals(server: &Server, image: &str, reason: &str) -> f64 {
    server
        .metrics()
        .unwrap()
        .get(
            "oscontent_image_refusals_total",
            &[("image", image), ("reason", reason)],
        )
        .unwrap_or(0.0)
}

/// The commit the state dir's marks hold for `name`.
fn marked(state: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(state.join(MARKS)).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["refs"][name]["commit"]
        .as_str()
        .unwrap_or_else(|| panic!("no mark for {name} in {text}"))
        .to_owned()
}

#[test]
fn a_tag_moved_back_while_the_server_was_down_is_refused_at_restart() {
    let (v1, v2) = (v1(), v2());
    let reg = Registry::start();
    let image = reg.image("os:stable");
    reg.push_release(v2, "os:stable", &[]);
    let state = tempdir();
    let mut first = ready(image_server(&reg, std::slice::from_ref(&image)).state_dir(state.path()));
    assert_eq!(served_ref(&first, fixture_ref()), v2.commit);
    first.stop(SWITCH_TIMEOUT).unwrap();

    // While it is down, the tag is moved back to the older release.
    reg.push_release(v1, "os:stable", &[]);
    let mut second = image_server(&reg, std::slice::from_ref(&image))
        .state_dir(state.path())
        .spawn()
        .unwrap();
    let errors = second
        .wait_stderr_lines("nothing to publish", 1, SWITCH_TIMEOUT)
        .unwrap();
    let refused = second.stderr_lines(" ERROR ");
    assert!(
        refused.iter().any(|l| l.contains(fixture_ref())
            && l.contains(&v1.commit)
            && l.contains(&v2.commit)
            && l.contains("is not served")),
        "the refusal names the ref, both commits and what it means: {refused:?} {errors:?}"
    );
    assert_eq!(second.get("/readyz").unwrap().status, 503);
    let r = second
        .get(&format!("/refs/heads/{}", fixture_ref()))
        .unwrap();
    assert_eq!(r.status, 503, "nothing served for the ref: not ready");
    assert_eq!(rollbacks(&second, "refused"), 1.0);
    assert_eq!(image_refusals(&second, &image, "rollback"), 1.0);
    // The refused digest is not fetched again at each retry.
    wait_for_metrics(&second, "a retry", |s| {
        s.stderr_lines("nothing to publish").len() >= 2
    });
    assert_eq!(rollbacks(&second, "refused"), 1.0);
    assert_eq!(
        marked(state.path(), fixture_ref()),
        v2.commit,
        "the mark stays"
    );
    second.stop(SWITCH_TIMEOUT).unwrap();

    // The operator means it: published, and the mark moves back with it.
    let mut third = ready(
        image_server(&reg, &[image])
            .state_dir(state.path())
            .arg("--allow-rollback"),
    );
    assert_eq!(served_ref(&third, fixture_ref()), v1.commit);
    assert_eq!(rollbacks(&third, "allowed"), 1.0);
    assert_eq!(marked(state.path(), fixture_ref()), v1.commit);
    pull_and_fsck(&third, fixture_ref(), &v1.commit);
    third.stop(SWITCH_TIMEOUT).unwrap();
}

#[test]
fn a_corrupt_marks_file_stops_the_server_naming_it() {
    let reg = Registry::start();
    let state = tempdir();
    std::fs::write(state.path().join(MARKS), b"{\"format\":1,").unwrap();
    let refusal = image_server(&reg, &[reg.image("os:stable")])
        .state_dir(state.path())
        .start_expect_failure()
        .unwrap();
    let e = refusal.error();
    assert!(e.contains(MARKS) && e.contains("corrupt"), "{e}");
    assert_eq!(
        std::fs::read(state.path().join(MARKS)).unwrap(),
        b"{\"format\":1,",
        "never reset"
    );
}

#[test]
fn one_image_moved_back_does_not_hold_back_another_moved_forward() {
    const A: &str = "tiny/a/stable";
    const B: &str = "tiny/b/stable";
    // Made in this order: each stream's second release is the newer.
    let a_old = crafted_bound(1, A, |t| t);
    let b_old = crafted_bound(2, B, |t| t);
    let a_new = crafted_bound(3, A, |t| t);
    let b_new = crafted_bound(4, B, |t| t);
    let reg = Registry::start();
    let push = |c: &Crafted, name: &str| reg.push(&c.layout, &c.tag, name, &[]);
    push(&a_new, "a:stable");
    push(&b_old, "b:stable");
    let (a, b) = (reg.image("a:stable"), reg.image("b:stable"));
    let mut server = ready(image_server(&reg, &[a.clone(), b.clone()]));
    assert_eq!(served_ref(&server, A), a_new.commit);
    assert_eq!(served_ref(&server, B), b_old.commit);

    // A's tag goes back, B's forward, in the same check.
    push(&a_old, "a:stable");
    push(&b_new, "b:stable");
    server.sighup().unwrap();
    wait_for_ref(&server, B, &b_new.commit);
    assert_eq!(served_ref(&server, A), a_new.commit, "A stays");
    assert_eq!(rollbacks(&server, "refused"), 1.0, "one ref moved back");
    assert_eq!(image_refusals(&server, &a, "rollback"), 1.0);
    assert_eq!(image_refusals(&server, &b, "rollback"), 0.0);
    let errors = server.stderr_lines(" ERROR ");
    assert!(
        errors.iter().any(|l| l.contains(A)
            && l.contains(&a_old.commit)
            && l.contains(&format!(
                "{a} stays at its previous release {}",
                a_new.commit
            ))),
        "the refusal names the image, the ref and what stays: {errors:?}"
    );
    pull_and_fsck(&server, B, &b_new.commit);
    pull_and_fsck(&server, A, &a_new.commit);

    // Not fetched again: the next check finds nothing new.
    let unchanged = crate::refresh::checks(&server, "unchanged");
    server.sighup().unwrap();
    wait_for_metrics(&server, "an unchanged check", |s| {
        crate::refresh::checks(s, "unchanged") > unchanged
    });
    assert_eq!(image_refusals(&server, &a, "rollback"), 1.0);
    // A moving forward again is published.
    let a_newer = crafted_bound(5, A, |t| t);
    push(&a_newer, "a:stable");
    server.sighup().unwrap();
    wait_for_ref(&server, A, &a_newer.commit);
    assert_eq!(served_ref(&server, B), b_new.commit);

    // B's next release has an object tampered under its genuine commit
    // (publication refuses it); A moves on regardless.
    let (_work, layout, b_bad) = tampered(6, B);
    reg.push(&layout, "bad", "b:stable", &[]);
    let a_newest = crafted_bound(7, A, |t| t);
    push(&a_newest, "a:stable");
    server.sighup().unwrap();
    wait_for_ref(&server, A, &a_newest.commit);
    assert_eq!(served_ref(&server, B), b_new.commit, "B stays");
    assert!(image_refusals(&server, &b, "failed") >= 1.0);
    let bad = server.get(&object_url_path(&b_bad, "commit")).unwrap();
    assert_eq!(bad.status, 404, "nothing of the tampered release served");
    pull_and_fsck(&server, A, &a_newest.commit);
}

/// An image whose commit, bound to `bind_ref`, has its biggest content
/// object tampered with (one byte): the layer and its digests are
/// consistent, only publication's own verification can tell. Returns
/// the work dir, the OCI layout (tag `bad`) and the commit.
fn tampered(seed: u32, bind_ref: &str) -> (tempfile::TempDir, std::path::PathBuf, String) {
    let work = tempdir();
    let repo = work.path().join("repo");
    let version = format!("1.{seed}");
    let commit = tiny_commit(&repo, &version, Some(bind_ref), seed).unwrap();
    let (big, _) = largest_filez(&repo).unwrap();
    let path = object_path(&repo, &big, "filez");
    let len = std::fs::metadata(&path).unwrap().len();
    flip_byte(&path, len - 8);
    let tar = Tar::new().dir("srv").tree("srv/repo", &repo).finish();
    let layout = work.path().join("oci");
    write_layout(
        &layout,
        "bad",
        &[Layer::gz(tar)],
        &[(COMMIT_LABEL, &commit), ("version", &version)],
    );
    (work, layout, commit)
}

/// An image of a commit bound to [`TINY_REF`], at `version` and dated
/// `timestamp` (Unix seconds). Returns the work dir, the OCI layout (tag
/// `dated`) and the commit.
fn dated(
    seed: u32,
    version: &str,
    timestamp: u64,
) -> (tempfile::TempDir, std::path::PathBuf, String) {
    use oscontent_testkit::signing::commit_tree;
    let work = tempdir();
    let repo_dir = work.path().join("repo");
    let repo = Ostree::init(&repo_dir, "archive").unwrap();
    let tree = work.path().join("tree");
    std::fs::create_dir_all(tree.join("usr/bin")).unwrap();
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("usr/bin/hello"), format!("hello {seed}\n")).unwrap();
    std::fs::write(
        tree.join("etc/os-release"),
        format!("VERSION_ID={version}\n"),
    )
    .unwrap();
    let at = format!("@{timestamp}");
    let commit = commit_tree(&repo, &tree, TINY_REF, version, &at, None).unwrap();
    let tar = Tar::new().dir("srv").tree("srv/repo", &repo_dir).finish();
    let layout = work.path().join("oci");
    write_layout(
        &layout,
        "dated",
        &[Layer::gz(tar)],
        &[(COMMIT_LABEL, &commit), ("version", version)],
    );
    (work, layout, commit)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

const TEN_YEARS: u64 = 10 * 365 * 24 * 60 * 60;

/// A tag moved to a commit dated ten years ahead, nothing verifying it:
/// published, it would become the ref's mark and every honest release
/// of the next ten years would be refused as a rollback. It is refused
/// instead, naming the ref and the commit, never recorded; the next
/// honest release is published.
#[test]
fn a_far_future_timestamp_from_an_unverified_tag_does_not_freeze_later_releases() {
    let now = unix_now();
    let (_f, future_layout, future) = dated(1, "1.1", now + TEN_YEARS);
    let (_n, next_layout, next) = dated(2, "1.2", now);
    let reg = Registry::start();
    reg.push(&future_layout, "dated", "os:stable", &[]);
    let image = reg.image("os:stable");
    let state = tempdir();
    let mut server = image_server(&reg, std::slice::from_ref(&image))
        .state_dir(state.path())
        .spawn()
        .unwrap();
    let says = server
        .wait_stderr_lines("ahead of the local clock", 1, SWITCH_TIMEOUT)
        .unwrap();
    assert!(
        says.iter()
            .any(|l| l.contains(TINY_REF) && l.contains(&future) && l.contains("--trusted-keys")),
        "the refusal names the ref, the commit and the way out: {says:?}"
    );
    assert_eq!(server.get("/readyz").unwrap().status, 503, "nothing served");
    assert!(rollbacks(&server, "future") >= 1.0, "counted");
    let marks = std::fs::read_to_string(state.path().join(MARKS)).unwrap_or_default();
    assert!(!marks.contains(&future), "recorded as the mark: {marks}");

    // The next honest release, older than the forged date, is published.
    reg.push(&next_layout, "dated", "os:stable", &[]);
    server.sighup().unwrap();
    wait_for_ref(&server, TINY_REF, &next);
    assert_eq!(marked(state.path(), TINY_REF), next);
    assert_eq!(rollbacks(&server, "refused"), 0.0);
    pull_and_fsck(&server, TINY_REF, &next);
}

/// The same far-future commit, pinned by the operator (an image digest):
/// their choice, published as it is.
#[test]
fn a_far_future_timestamp_pinned_by_digest_is_published() {
    let (_f, layout, future) = dated(1, "1.1", unix_now() + TEN_YEARS);
    let reg = Registry::start();
    reg.push(&layout, "dated", "os:stable", &[]);
    let pinned = reg.image(&format!("os@{}", reg.digest("os:stable")));
    let state = tempdir();
    let server = ready(image_server(&reg, &[pinned]).state_dir(state.path()));
    assert_eq!(served_ref(&server, TINY_REF), future);
    assert_eq!(marked(state.path(), TINY_REF), future);
}
