//! Pulling from the server under test with stock ostree.

use oscontent_testkit::*;

/// A fresh bare-user repo with the server as remote `os`; pulls `r` (a
/// ref bound into the commit), checks it resolves to `commit`, and fscks.
pub fn pull_and_fsck(server: &Server, r: &str, commit: &str) -> (tempfile::TempDir, Ostree) {
    let tmp = tempdir();
    let repo = Ostree::init(&tmp.path().join("repo"), "bare-user").unwrap();
    repo.remote_add("os", &server.url, &[]).unwrap();
    repo.pull(&["os", r]).unwrap_or_else(|e| {
        panic!(
            "stock ostree pull of {r}: {e:#}\nserver stderr:\n{}",
            server.stderr()
        )
    });
    assert_eq!(
        repo.rev_parse(&format!("os:{r}")).unwrap(),
        commit,
        "os:{r} points at the image's commit"
    );
    repo.fsck().unwrap();
    (tmp, repo)
}

/// `GET /refs/heads/NAME`: the commit it names (the server must be ready).
pub fn served_ref(server: &Server, name: &str) -> String {
    let r = server.get(&format!("/refs/heads/{name}")).unwrap();
    assert_eq!(r.status, 200, "/refs/heads/{name}");
    String::from_utf8(r.body).unwrap().trim().to_owned()
}

/// Starts (spawns) and waits for `/readyz`, with the stderr in the panic.
pub fn ready(b: ServerBuilder) -> Server {
    let mut s = b.spawn().unwrap_or_else(|e| panic!("{e:#}"));
    s.wait_ready(START_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e:#}"));
    s
}
