//! The hostile image: `serve --image` following a registry tag (a stock
//! docker-registry on loopback) that, once the genuine image is served,
//! is moved to a crafted one. Each row pushes its image under the tag and
//! sends SIGHUP; the server must refuse it (or, for the image's planted
//! repo metadata, publish only what it derives itself), keep serving the
//! genuine release (verified by a stock pull) and write nothing beside
//! its state dir.
//!
//! I11 (an object tampered under a genuine commit) is stopped since
//! publication verifies every object it serves (the `verify` branch).

use crate::peers::*;
use oscontent_testkit::oci::*;
use oscontent_testkit::registry::Registry;
use oscontent_testkit::*;
use std::io::Write;

/// What `--max-image-bytes` is set to: well above a tiny image.
const MAX_IMAGE_BYTES: u64 = 8 << 20;

/// What a row's image must lead to.
enum Expect {
    /// Refused, the log saying this.
    Refused(&'static str),
    /// Published, serving only refs the server derived from the commit.
    Derived,
}

/// The registry, the tag's genuine image, and an older one.
struct Lab {
    reg: Registry,
    genuine: Crafted,
    older: Crafted,
}

struct Attack {
    id: &'static str,
    what: &'static str,
    /// Pushes the hostile image as `tag` (the sentinel names where an
    /// escape would land).
    push: fn(&Lab, &Sentinel, &str),
    expect: Expect,
}

fn push(reg: &Registry, c: &Crafted, tag: &str) {
    reg.push(&c.layout, &c.tag, &format!("os:{tag}"), &[]);
}

/// A newer image than the genuine one, with `extra` after its repo.
fn push_crafted(l: &Lab, tag: &str, seed: u32, extra: impl FnOnce(Tar) -> Tar) {
    push(&l.reg, &crafted(seed, extra), tag);
}

fn attacks() -> Vec<Attack> {
    [entry_attacks(), image_attacks()]
        .into_iter()
        .flatten()
        .collect()
}

/// Unsafe layer entries.
fn entry_attacks() -> Vec<Attack> {
    use Expect::*;
    vec![
        Attack {
            id: "I1",
            what: "a layer entry climbing out with ../",
            push: |l, s, tag| {
                let name = format!("srv/repo/{}", s.traversal());
                push_crafted(l, tag, 31, |t| t.file(&name, b"escaped\n"));
            },
            expect: Refused("unsafe tar entry"),
        },
        Attack {
            id: "I2",
            what: "an absolute entry path",
            push: |l, s, tag| {
                let name = s.escaped().display().to_string();
                push_crafted(l, tag, 32, |t| t.file(&name, b"absolute\n"));
            },
            expect: Refused("unsafe tar entry"),
        },
        Attack {
            id: "I3",
            what: "a symlink out of the tree, then a file through it",
            push: |l, s, tag| {
                let target = s.escaped().display().to_string();
                push_crafted(l, tag, 33, |t| {
                    t.symlink("srv/repo/out", &target)
                        .file("srv/repo/out/pwned", b"through a symlink\n")
                });
            },
            expect: Refused("ERROR"),
        },
        Attack {
            id: "I4",
            what: "a hardlink to /etc/passwd",
            push: |l, _, tag| {
                push_crafted(l, tag, 34, |t| t.hardlink("srv/repo/passwd", "/etc/passwd"));
            },
            expect: Refused("srv/repo/passwd"),
        },
    ]
}

/// Oversized images, planted metadata, replays and lying digests or labels.
fn image_attacks() -> Vec<Attack> {
    use Expect::*;
    vec![
        Attack {
            id: "I5",
            what: "an image decompressing past --max-image-bytes",
            push: |l, _, tag| {
                let big = noise(2 * MAX_IMAGE_BYTES as usize, 35);
                push_crafted(l, tag, 35, |t| t.file("srv/repo/tmp/big", &big));
            },
            expect: Refused("decompressed size limit exceeded"),
        },
        Attack {
            id: "I6",
            what: "a gzip bomb (zeros at 1000:1)",
            push: |l, _, tag| push_bomb(l, tag),
            // Within --max-image-bytes, the size limit comes before the
            // ratio limit (which starts at 64 MiB).
            expect: Refused("decompressed size limit exceeded"),
        },
        Attack {
            id: "I7",
            what: "the image's own refs, summary and deltas planted (the ref at an older commit)",
            push: |l, _, tag| {
                let older = format!("{}\n", l.older.commit);
                push_crafted(l, tag, 37, |t| {
                    t.file("srv/repo/refs/heads/tiny/x86_64/stable", older.as_bytes())
                        .file("srv/repo/summary", b"planted summary")
                        .file("srv/repo/summary.sig", b"planted signature")
                        .file("srv/repo/deltas/aa/bbbb/superblock", b"planted delta")
                });
            },
            expect: Derived,
        },
        Attack {
            id: "I8",
            what: "the tag moved back to an older release",
            push: |l, _, tag| push(&l.reg, &l.older, tag),
            expect: Refused("would move back"),
        },
        Attack {
            id: "I9",
            what: "a layer blob whose bytes do not match its digest",
            push: |l, _, tag| {
                push_crafted(l, tag, 39, |t| t);
                let layer = l.reg.first_layer("os", tag);
                let data = l.reg.blob_data(&layer);
                let len = std::fs::metadata(&data).unwrap().len();
                flip(&data, len / 2);
            },
            expect: Refused("digest mismatch"),
        },
        Attack {
            id: "I10",
            what: "a commit label naming a commit the layer does not hold",
            push: |l, _, tag| {
                let c = crafted(40, |t| t);
                let layout = c.work.path().join("relabelled");
                let tar = Tar::new()
                    .dir("srv")
                    .tree("srv/repo", &c.work.path().join("repo"))
                    .finish();
                write_layout(
                    &layout,
                    "x",
                    &[Layer::gz(tar)],
                    &[(COMMIT_LABEL, &l.genuine.commit), ("version", "1.40")],
                );
                l.reg.push(&layout, "x", &format!("os:{tag}"), &[]);
            },
            expect: Refused("ERROR"),
        },
        Attack {
            id: "I11",
            what: "a content object tampered under the genuine, labelled commit",
            push: |l, _, tag| {
                let work = tempdir();
                let repo = work.path().join("repo");
                let commit = tiny_commit(&repo, "1.41", Some(TINY_REF), 41).unwrap();
                let (big, _) = largest_filez(&repo).unwrap();
                let path = object_path(&repo, &big, "filez");
                let len = std::fs::metadata(&path).unwrap().len();
                flip(&path, len - 8);
                let tar = Tar::new().dir("srv").tree("srv/repo", &repo).finish();
                let layout = work.path().join("oci");
                write_layout(
                    &layout,
                    "x",
                    &[Layer::gz(tar)],
                    &[(COMMIT_LABEL, &commit), ("version", "1.41")],
                );
                l.reg.push(&layout, "x", &format!("os:{tag}"), &[]);
            },
            expect: Refused("content object"),
        },
    ]
}

/// Flips one byte of a file in place.
fn flip(path: &std::path::Path, offset: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, offset).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], offset).unwrap();
}

/// 128 MiB of zeros in `srv/repo/tmp`, gzipped to about 128 KiB.
fn push_bomb(l: &Lab, tag: &str) {
    const ZEROS: u64 = 128 << 20;
    let c = crafted(36, |t| t);
    let mut head = Tar::new()
        .dir("srv")
        .tree("srv/repo", &c.work.path().join("repo"))
        .finish();
    head.truncate(head.len() - 1024);
    let (tx, rx) = std::sync::mpsc::channel();
    let blob = gzip_with(move |w| {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        let mut put = |w: &mut dyn Write, b: &[u8]| -> std::io::Result<()> {
            h.update(b);
            w.write_all(b)
        };
        put(w, &head)?;
        let header = tar_header("srv/repo/tmp/zeros", EntryType::Regular, ZEROS, "", 0o644);
        put(w, header.as_bytes())?;
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..(ZEROS >> 20) {
            put(w, &zeros)?;
        }
        put(w, &vec![0u8; tar_padding(ZEROS) + 1024])?;
        let _ = tx.send(format!("sha256:{}", hex::encode(h.finalize())));
        Ok(())
    });
    let diff_id = rx.recv().unwrap();
    let layout = c.work.path().join("bomb");
    write_layout(
        &layout,
        "bomb",
        &[Layer {
            blob,
            media_type: GZIP,
            diff_id,
        }],
        &[(COMMIT_LABEL, &c.commit), ("version", &c.version)],
    );
    l.reg.push(&layout, "bomb", &format!("os:{tag}"), &[]);
}

fn run(l: &Lab, a: &Attack, tag: &str) -> Result<(), String> {
    let sentinel = Sentinel::new();
    push(&l.reg, &l.genuine, tag);
    let mut server = Server::images([l.reg.image(&format!("os:{tag}"))])
        .args(["--insecure-registry", &l.reg.host(), "--max-backoff", "1"])
        .args(["--max-image-bytes", &MAX_IMAGE_BYTES.to_string()])
        .state_dir(&sentinel.state())
        .start()
        .map_err(|e| format!("the genuine image: {e:#}"))?;
    let genuine = served_refs(&server)?;
    if !genuine.contains(&(TINY_REF.to_owned(), l.genuine.commit.clone())) {
        return Err(format!("before the attack: serves {genuine:?}"));
    }
    let before = refusals(&server);
    let published = |s: &Server| {
        s.metrics()
            .ok()
            .and_then(|m| m.get("oscontent_generation", &[]))
            .unwrap_or(0.0)
    };
    let generation = published(&server);
    (a.push)(l, &sentinel, tag);
    server.sighup().map_err(|e| format!("{e:#}"))?;
    match a.expect {
        Expect::Refused(says) => {
            wait_refused(&server, before, says)?;
            let want: Vec<(&str, &str)> = genuine
                .iter()
                .map(|(r, c)| (r.as_str(), c.as_str()))
                .collect();
            serves_only(&server, &want)?;
        }
        Expect::Derived => {
            let moved = poll(REFUSAL_TIMEOUT, || -> anyhow::Result<Option<()>> {
                Ok((published(&server) > generation).then_some(()))
            })
            .map_err(|e| format!("{e:#}"))?;
            moved.ok_or_else(|| format!("never published:\n{}", server.stderr()))?;
            let refs = served_refs(&server)?;
            // Every served ref is derived from the new commit: none is the
            // planted one, and the planted summary is not what is served.
            let commits: Vec<&str> = refs.iter().map(|(_, c)| c.as_str()).collect();
            if commits.contains(&l.older.commit.as_str()) {
                return Err(format!("a planted ref is served: {refs:?}"));
            }
            let (r, c) = refs
                .iter()
                .find(|(r, _)| r == TINY_REF)
                .ok_or_else(|| format!("{TINY_REF} not served: {refs:?}"))?;
            stock_pull(&server, r, c)?;
            for p in ["/summary.sig", "/deltas/aa/bbbb/superblock"] {
                let status = server.get(p).map_err(|e| format!("{e:#}"))?.status;
                if status != 404 {
                    return Err(format!("{p}: {status}, the planted file is served"));
                }
            }
        }
    }
    nothing_outside(&sentinel)
}

#[test]
fn hostile_image() {
    let reg = Registry::start();
    // Made in this order, the older one is older by timestamp too.
    let older = crafted(1, |t| t);
    let genuine = crafted(2, |t| t);
    let l = Lab {
        reg,
        genuine,
        older,
    };
    try_each(
        "hostile image",
        &attacks(),
        |a| (a.id, a.what),
        |i, a| run(&l, a, &format!("row{i}")),
    );
}
