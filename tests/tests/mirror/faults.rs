//! An upstream that fails for a while. `mirror` waits as long as each
//! `Retry-After` asks, past the five attempts a failing upstream gets; one
//! asking for longer than it waits fails the mirror at once, saying so;
//! a body cut mid-transfer is fetched again.

use crate::support::TOOL_TIMEOUT;
use oscontent_testkit::proxy::{Action, Faults, Proxy};
use oscontent_testkit::*;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Commits `files` (path under the tree, bytes) to `os/stable` of the
/// archive repo `repo`, staged in `tree`, and updates its summary.
fn commit_files(repo: &Ostree, tree: &Path, files: &[(&str, &[u8])]) {
    for (rel, bytes) in files {
        let p = tree.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    let tree_arg = format!("--tree=dir={}", tree.display());
    repo.run(["commit", "-b", "os/stable", "--no-xattrs", &tree_arg])
        .unwrap();
    repo.run(["summary", "-u"]).unwrap();
}

#[test]
fn mirror_retries_what_may_pass_and_says_what_will_not() {
    require_ostree();
    let t = tempdir();
    let upstream = t.path().join("upstream");
    let repo = Ostree::init(&upstream, "archive").unwrap();
    // Incompressible, so that its `.filez` is large enough to be cut after
    // its response head has gone out.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let blob: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    commit_files(
        &repo,
        &t.path().join("tree"),
        &[("usr/lib/README", b"small\n"), ("usr/lib/blob", &blob)],
    );
    // Served by URL, so that the fault proxy in front can cut bodies.
    let origin = Proxy::serve_dir(&upstream, Arc::new(|_: &str| None)).unwrap();
    // The blob's, cut half-way: long after its head has gone out. (Cutting
    // every other object instead, a small one's cut could close the
    // connection before its head was flushed, which the client sees as a
    // failed request, not a broken body: CI saw it so under load.)
    let (blob_object, _) = largest_filez(&upstream).unwrap();

    let later = |fail_first, after: &str| Faults {
        fail_first,
        retry_after: Some(after.into()),
        ..Default::default()
    };
    // (faults, 503s sent, the mirror's stderr must say this, or it must
    // fail saying this)
    let table: [(Faults, usize, Result<&str, &str>); 3] = [
        (later(6, "1"), 6, Ok("retrying")),
        (later(usize::MAX, "3600"), 1, Err("retry after 3600 s")),
        (
            Faults {
                prefix: object_url_path(&blob_object, "filez"),
                reset_first: 1,
                ..Default::default()
            },
            0,
            Ok("transfer failed, retrying"),
        ),
    ];
    for (i, (faults, sent, want)) in table.into_iter().enumerate() {
        let plan = format!("{faults:?}");
        let (proxy, stats) = faults.clone().start(&origin.url).unwrap();
        let bundle = t.path().join(format!("bundle-{i}"));
        let (o, err) = mirror_to_bundle(&proxy.url, &bundle, TOOL_TIMEOUT);
        let injected = stats.injected_503.load(Ordering::SeqCst);
        assert_eq!(injected, sent, "{plan}: {err}");
        match want {
            Ok(says) => {
                assert!(o.status.success(), "{plan}: {err}");
                assert!(err.contains(says), "{plan}: {err}");
                // Each fault retried once, no more.
                let faults = injected + proxy.cuts();
                assert!(faults >= 1, "{plan}: nothing injected");
                assert_eq!(err.matches("retrying").count(), faults, "{plan}: {err}");
                Ostree::at(&bundle).fsck().unwrap();
            }
            Err(says) => {
                assert!(!o.status.success(), "{plan}: succeeded");
                assert!(
                    err.contains("HTTP 503") && err.contains(says),
                    "{plan}: {err}"
                );
            }
        }
    }
}

/// An update of a complete bundle that fails while adding objects (its
/// upstream says "come back in an hour" for every tree and file) leaves the
/// bundle complete as it was: the manifest back in place, the summary and
/// refs untouched, so `serve --bundle` still serves the last release.
#[test]
fn a_failed_update_leaves_the_bundle_as_it_was() {
    require_ostree();
    let t = tempdir();
    let upstream = t.path().join("upstream");
    let repo = Ostree::init(&upstream, "archive").unwrap();
    let commit = |n: u32| {
        let release = format!("release {n}\n");
        let tree = t.path().join(format!("tree-{n}"));
        commit_files(&repo, &tree, &[("usr/lib/release", release.as_bytes())]);
    };
    commit(1);
    let later: oscontent_testkit::proxy::Rule = Arc::new(|path: &str| {
        (path.ends_with(".dirtree") || path.ends_with(".filez")).then(|| Action::Later {
            status: 503,
            retry_after: "3600".into(),
        })
    });
    let origin = Proxy::serve_dir(&upstream, Arc::new(|_: &str| None)).unwrap();
    let refusing = Proxy::serve_dir(&upstream, later).unwrap();
    let bundle = t.path().join("bundle");
    let (o, err) = mirror_to_bundle(&origin.url, &bundle, TOOL_TIMEOUT);
    assert!(o.status.success(), "first mirror: {err}");
    let read = |name: &str| std::fs::read(bundle.join(name)).unwrap();
    let before = (read("oscontent-bundle.json"), read("summary"));

    commit(2);
    let (o, err) = mirror_to_bundle(&refusing.url, &bundle, TOOL_TIMEOUT);
    assert!(!o.status.success(), "the update succeeded: {err}");
    assert!(err.contains("retry after 3600 s"), "{err}");
    assert!(err.contains("left as it was"), "{err}");
    assert!(
        (read("oscontent-bundle.json"), read("summary")) == before,
        "the bundle changed: {err}"
    );
    // What the refs name is whole (the new release's commit object, fetched
    // to verify it, stays beside it unreferenced for the next run).
    let node = Ostree::init(&t.path().join("node"), "bare-user").unwrap();
    let b = bundle.display().to_string();
    node.run(["pull-local", b.as_str(), "os/stable"]).unwrap();
    node.fsck().unwrap();

    // The next run completes it.
    let (o, err) = mirror_to_bundle(&origin.url, &bundle, TOOL_TIMEOUT);
    assert!(o.status.success(), "second mirror: {err}");
    assert_ne!(read("summary"), before.1);
}
