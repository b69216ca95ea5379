//! `--repo` with `--trusted-keys`: what another tool
//! adds to the live repo is served only once a publication verified it,
//! so a new commit without a trusted signature is never served.

use crate::support::*;
use oscontent_testkit::signing::*;
use oscontent_testkit::*;
use std::path::Path;

#[test]
fn an_unsigned_commit_added_to_a_live_repo_is_never_served() {
    let tmp = tempdir();
    let k = keys();
    let s = |p: &Path| p.display().to_string();
    let live = tmp.path().join("live");
    let (r, first) = live_repo(&live, 51);
    let bundle = tmp.path().join("bundle");
    let source = [
        "--repo".to_owned(),
        s(&live),
        "--commit".into(),
        first.clone(),
    ];
    sign(&source, &k.trusted, &bundle).unwrap();
    let mut server = Server::repo(&live)
        .args(["--signatures", &s(&bundle), "--trusted-keys"])
        .args([s(&k.trusted.public)])
        .args(["--signatures-poll", POLL])
        .start()
        .unwrap();
    assert_eq!(readyz(&server), 200);

    // Another tool commits (unsigned) and moves the ref.
    let second = move_to_second(&r, tmp.path(), &first);
    let served = |server: &Server| {
        let r = server.get(&format!("/refs/heads/{TINY_REF}")).unwrap();
        assert_eq!(String::from_utf8_lossy(&r.body).trim(), first);
        let c = server.get(&format!("/{}", object_rel(&second, "commit")));
        assert_eq!(c.unwrap().status, 404);
        assert_eq!(readyz(server), 200);
    };
    served(&server);
    // A publication (SIGHUP) refuses it: still not served.
    server.sighup().unwrap();
    server
        .wait_stderr_lines("refusing to publish", 1, NOTICE_TIMEOUT)
        .unwrap();
    // The refusal lists its problems on the lines after it.
    let refused = server.stderr();
    assert!(
        refused.contains(&second) && refused.contains("no signatures"),
        "{refused}"
    );
    served(&server);
    // Stock ostree, verifying with the trusted key, gets the first commit.
    let node = Ostree::init(&tmp.path().join("node"), "archive").unwrap();
    add_signed_remote(&node, "origin", &server.url, &k.trusted.public, true).unwrap();
    node.run(["pull", "--disable-fsync", "origin", TINY_REF])
        .unwrap();
    assert_eq!(
        node.rev_parse(&format!("origin:{TINY_REF}")).unwrap(),
        first
    );
}
