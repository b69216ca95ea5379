//! Invariant 1 on the HTTP surface: a generation serves the objects,
//! deltas and refs its publication verified, and a tampered object makes
//! publication fail, naming it, while the previous generation serves on.

use crate::support::{ostree, serving_v1, Fixture, Repo, Server, REF};

/// Object request paths of a repo with extension `ext`.
fn objects(repo: &Repo, ext: &str) -> Vec<String> {
    let suffix = format!(".{ext}");
    repo.files("objects")
        .into_iter()
        .filter(|f| f.ends_with(&suffix))
        .map(|f| format!("/{f}"))
        .collect()
}

/// The checksum an object path names.
fn checksum(path: &str) -> String {
    let rest = path.trim_start_matches("/objects/");
    let (name, _) = rest.split_once('.').unwrap();
    name.replace('/', "")
}

#[tokio::test]
async fn objects_no_published_commit_reaches_are_not_served() {
    let (fx, server) = serving_v1().await;
    let v2 = fx.release("2.0");
    let published = objects(&fx.v1, "filez");
    // Objects of another commit, copied into the served repo by another
    // tool after publication: present on disk, never verified.
    let mut planted = Vec::new();
    for ext in ["commit", "dirtree", "filez"] {
        let theirs = objects(&v2, ext);
        let ours = objects(&fx.v1, ext);
        let new = theirs.into_iter().find(|o| !ours.contains(o)).unwrap();
        let dest = fx.v1.dir.join(new.trim_start_matches('/'));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(&dest, v2.disk(&new)).unwrap();
        planted.push(new);
    }
    for p in &planted {
        assert_eq!(server.get(p).await.status, 404, "{p}");
    }
    // What the published commit reaches is served as before.
    for p in &published {
        assert_eq!(server.get(p).await.status, 200, "{p}");
    }
}

#[tokio::test]
async fn a_ref_another_tool_adds_waits_for_a_publication() {
    let fx = Fixture::new();
    ostree(&fx.v1.dir, &["refs", "--create=live/one", &fx.v1.commit]);
    let server = Server::new();
    server.publish(fx.publish(&fx.v1)).await;
    assert_eq!(server.get("/refs/heads/live/one").await.status, 200);
    // Another tool commits into the live repo and points a ref at it.
    let tree = fx.v1.dir.parent().unwrap().join("tree-live");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("new"), "new\n").unwrap();
    let new = ostree(
        &fx.v1.dir,
        &[
            "commit",
            "--branch=live/two",
            &format!("--tree=dir={}", tree.display()),
        ],
    );
    let new = new.trim();
    let commit = format!("/objects/{}/{}.commit", &new[..2], &new[2..]);
    assert_eq!(server.get("/refs/heads/live/two").await.status, 404);
    assert_eq!(server.get(&commit).await.status, 404);
    let summary = server.get("/summary").await.body;
    assert!(!summary.windows(8).any(|w| w == b"live/two"));
    // Served once a publication verified it.
    server.publish(fx.publish(&fx.v1)).await;
    assert_eq!(server.get("/refs/heads/live/two").await.status, 200);
    assert_eq!(server.get(&commit).await.status, 200);
    assert_eq!(server.get(&format!("/refs/heads/{REF}")).await.status, 404);
}

/// Publishing `repo` after `tamper` fails with an error naming `named`;
/// v1 stays served.
async fn refused(tamper: impl FnOnce(&Repo) -> String) {
    let (fx, server) = serving_v1().await;
    let v2 = fx.release("2.0");
    let named = tamper(&v2);
    let err = format!("{:#}", fx.try_publish(&v2).unwrap_err());
    assert!(err.contains(&named), "{named} not in: {err}");
    assert!(err.contains("corrupt"), "{err}");
    let served = server.get(&format!("/refs/heads/{REF}")).await;
    assert_eq!(served.status, 200);
    assert_eq!(String::from_utf8(served.body).unwrap().trim(), fx.v1.commit);
}

#[tokio::test]
async fn a_tampered_dirtree_fails_publication_naming_it() {
    refused(|v2| {
        // Every dirtree but the root one is reached only through another
        // dirtree; tamper the first listed: the walk reads all of them.
        let tree = objects(v2, "dirtree").into_iter().next().unwrap();
        let mut bytes = v2.disk(&tree);
        bytes.push(0);
        std::fs::write(v2.dir.join(tree.trim_start_matches('/')), bytes).unwrap();
        format!("dirtree {}", checksum(&tree))
    })
    .await;
}

#[tokio::test]
async fn a_tampered_content_object_fails_publication_naming_it() {
    refused(|v2| {
        // A genuine object's bytes under another object's name.
        let files = objects(v2, "filez");
        let (a, b) = (&files[0], &files[1]);
        std::fs::write(v2.dir.join(a.trim_start_matches('/')), v2.disk(b)).unwrap();
        format!("content object {}", checksum(a))
    })
    .await;
}

#[tokio::test]
async fn a_tampered_delta_part_fails_publication_naming_it() {
    refused(|v2| {
        let part = v2
            .files("deltas")
            .into_iter()
            .find(|f| f.ends_with("/0"))
            .unwrap();
        let mut bytes = v2.disk(&part);
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(v2.dir.join(&part), bytes).unwrap();
        "part 0".to_owned()
    })
    .await;
}
