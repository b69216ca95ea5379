//! Pulling from the server under test with stock ostree.

use oscontent_testkit::*;

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
