//! Nothing is served before it is verified, against the
//! binary: a `--repo` whose new release carries a tampered object (under a
//! genuine commit) is refused at SIGHUP, naming the object, while the
//! verified generation serves on; one of the objects that generation
//! serves, replaced, withdraws it until the source verifies again; at
//! start a tampered repo is refused outright.

use oscontent_testkit::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A copy of v1's repo with its ref, as another tool would keep it.
fn live_repo(tmp: &Path) -> PathBuf {
    let v1 = v1();
    let copy = tmp.join("repo");
    copy_dir(&v1.repo, &copy).unwrap();
    Ostree::at(&copy)
        .run(["refs", &format!("--create={}", fixture_ref()), &v1.commit])
        .unwrap();
    copy
}

/// Another tool pulls v2 into the repo and moves the ref; one of v2's new
/// content objects is then overwritten with another object's bytes (the
/// commit stays genuine). Returns that object's checksum.
fn tampered_update(copy: &Path) -> String {
    let (v1, v2) = (v1(), v2());
    let cli = Ostree::at(copy);
    cli.run(["pull-local", v2.repo.to_str().unwrap(), &v2.commit])
        .unwrap();
    cli.run([
        "refs",
        "--force",
        &format!("--create={}", fixture_ref()),
        &v2.commit,
    ])
    .unwrap();
    let old = list_objects(&v1.repo).unwrap().get(CONTENT);
    let new: Vec<String> = list_objects(copy)
        .unwrap()
        .get(CONTENT)
        .difference(&old)
        .cloned()
        .collect();
    let (victim, donor) = (&new[0], &new[1]);
    let bytes = std::fs::read(object_path(copy, donor, "filez")).unwrap();
    // A new file, never a write through: `pull-local` hardlinks the shared
    // fixture's objects.
    let path = object_path(copy, victim, "filez");
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, bytes).unwrap();
    victim.clone()
}

/// SIGHUPs the server and waits for the error line with `needle`, which
/// must name `victim` as corrupt.
fn refused_at_sighup(server: &mut Server, needle: &str, victim: &str) {
    server.sighup().unwrap();
    let errors = server
        .wait_stderr_lines(needle, 1, Duration::from_secs(60))
        .unwrap();
    assert!(
        errors
            .iter()
            .any(|l| l.contains(&format!("content object {victim} is corrupt"))),
        "the error names the object: {errors:?}"
    );
}

#[test]
fn a_tampered_object_is_refused_and_the_verified_generation_serves_on() {
    let v1 = v1();
    let tmp = tempdir();
    let copy = live_repo(tmp.path());
    let mut server = Server::repo(&copy).start().unwrap();
    let victim = tampered_update(&copy);
    refused_at_sighup(&mut server, " ERROR ", &victim);
    assert_eq!(server.get("/readyz").unwrap().status, 200);
    let r = server
        .get(&format!("/refs/heads/{}", fixture_ref()))
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.body).trim(), v1.commit);
    for (c, ext) in [(&v2().commit, "commit"), (&victim, "filez")] {
        let p = object_url_path(c, ext);
        assert_eq!(server.get(&p).unwrap().status, 404, "{p}");
    }
    pull_and_fsck(&server, fixture_ref(), &v1.commit);
}

/// A content object v1 serves, replaced in the live repo with another
/// object's bytes, as [`tampered_update`] does. Returns its checksum, its
/// path and its genuine bytes.
fn tamper_a_served_object(copy: &Path) -> (String, PathBuf, Vec<u8>) {
    let objects: Vec<String> = list_objects(copy)
        .unwrap()
        .get(CONTENT)
        .iter()
        .cloned()
        .collect();
    let (victim, donor) = (&objects[0], &objects[1]);
    let path = object_path(copy, victim, "filez");
    let genuine = std::fs::read(&path).unwrap();
    let bytes = std::fs::read(object_path(copy, donor, "filez")).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, bytes).unwrap();
    (victim.clone(), path, genuine)
}

#[test]
fn a_served_object_found_tampered_withdraws_the_generation_until_it_verifies() {
    let v1 = v1();
    let tmp = tempdir();
    let copy = live_repo(tmp.path());
    let mut server = Server::repo(&copy).start().unwrap();
    let (victim, path, genuine) = tamper_a_served_object(&copy);
    let url_path = object_url_path(&victim, "filez");
    refused_at_sighup(&mut server, "withdrawn", &victim);
    // Serving on would serve the bytes that did not verify.
    assert_eq!(server.get("/readyz").unwrap().status, 503);
    assert_eq!(server.get(&url_path).unwrap().status, 503);
    let refs = format!("/refs/heads/{}", fixture_ref());
    assert_eq!(server.get(&refs).unwrap().status, 503);

    // Put right, it is published again at the next SIGHUP.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, genuine).unwrap();
    server.sighup().unwrap();
    let ready = poll(Duration::from_secs(60), || {
        anyhow::Ok(Some(server.get("/readyz")?.status).filter(|s| *s == 200))
    })
    .unwrap();
    assert_eq!(ready, Some(200), "ready again once the source verifies");
    pull_and_fsck(&server, fixture_ref(), &v1.commit);
}

#[test]
fn a_repo_with_a_tampered_object_is_refused_at_start() {
    let tmp = tempdir();
    let copy = live_repo(tmp.path());
    let victim = tampered_update(&copy);
    let refusal = Server::repo(&copy).start_expect_failure().unwrap();
    assert!(
        refusal
            .stderr
            .contains(&format!("content object {victim} is corrupt")),
        "{}",
        refusal.stderr
    );
}
