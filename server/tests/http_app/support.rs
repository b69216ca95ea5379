//! Fixtures (archive repos made with the `ostree` CLI, published with the
//! server's own publication code) and the server under test.

use axum::body::Body;
use http::{Request, StatusCode};
use oscontent_server::publish;
use oscontent_server::request::{PublishRequest, Source};
use oscontent_server::served::Generation;
use oscontent_server::sink::Sink;
use oscontent_server::state::StateDir;
use oscontent_server::{app, AppState, HttpConfig};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;
use tower::ServiceExt;

pub const IMMUTABLE: &str = "public, max-age=31536000, immutable";
/// `HttpConfig::default().metadata_max_age`.
pub const SHORT_LIVED: &str = "public, max-age=30";
/// The ref every fixture commit binds.
pub const REF: &str = "test/os/stable";
/// A checksum no fixture holds.
pub const ABSENT: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

pub fn ostree(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("ostree")
        .arg(format!("--repo={}", repo.display()))
        .args(args)
        .output()
        .expect("running ostree");
    assert!(
        out.status.success(),
        "ostree {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// An archive repo holding one orphan commit bound to [`REF`], with
/// detached metadata, a from-empty static delta and its index (or, made
/// by [`Fixture::child`], a copy of one with a commit on top).
pub struct Repo {
    pub dir: PathBuf,
    pub commit: String,
    /// The directory committed.
    pub tree: PathBuf,
}

impl Repo {
    pub fn build(work: &Path, version: &str) -> Self {
        let dir = work.join(format!("repo-{version}"));
        let tree = work.join(format!("tree-{version}"));
        std::fs::create_dir_all(tree.join("usr/bin")).unwrap();
        std::fs::write(tree.join("usr/bin/hello"), format!("hello {version}\n")).unwrap();
        let seed = version.bytes().fold(7u64, |a, b| a * 31 + u64::from(b));
        std::fs::write(
            tree.join("usr/big"),
            oscontent_testkit::files::noise(200_000, seed),
        )
        .unwrap();
        ostree(&dir, &["init", "--mode=archive"]);
        let commit = ostree(
            &dir,
            &[
                "commit",
                "--orphan",
                &format!("--bind-ref={REF}"),
                &format!("--add-metadata-string=version={version}"),
                &format!("--add-detached-metadata-string=note={version}"),
                &format!("--tree=dir={}", tree.display()),
            ],
        )
        .trim()
        .to_owned();
        ostree(
            &dir,
            &[
                "static-delta",
                "generate",
                "--empty",
                &format!("--to={commit}"),
            ],
        );
        ostree(&dir, &["static-delta", "reindex"]);
        Self { dir, commit, tree }
    }

    /// Every file under `sub`, relative to the repo, sorted.
    pub fn files(&self, sub: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![self.dir.join(sub)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let rel = p.strip_prefix(&self.dir).unwrap();
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
        }
        out.sort();
        out
    }

    /// The largest object file with extension `ext`, as a request path.
    pub fn object(&self, ext: &str) -> String {
        let suffix = format!(".{ext}");
        let rel = self
            .files("objects")
            .into_iter()
            .filter(|f| f.ends_with(&suffix))
            .max_by_key(|f| std::fs::metadata(self.dir.join(f)).unwrap().len())
            .unwrap_or_else(|| panic!("no .{ext} object"));
        format!("/{rel}")
    }

    pub fn disk(&self, path: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(path.trim_start_matches('/'))).unwrap()
    }
}

/// A release (v1) and a state dir to publish releases into.
pub struct Fixture {
    work: tempfile::TempDir,
    state: StateDir,
    pub v1: Repo,
}

impl Fixture {
    pub fn new() -> Self {
        Self::in_dir(tempfile::tempdir().unwrap())
    }

    /// In the target dir's scratch space, which is on disk where the
    /// default temporary dir may be a tmpfs (as the test runner makes it):
    /// tmpfs keeps no negative dentries, so a path found after a miss in
    /// the overlay is never resolved from the dentry cache alone there.
    pub fn on_disk() -> Self {
        Self::in_dir(tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap())
    }

    fn in_dir(work: tempfile::TempDir) -> Self {
        let v1 = Repo::build(work.path(), "1.0");
        let state =
            StateDir::open(&work.path().join("state"), std::slice::from_ref(&v1.dir)).unwrap();
        Self { work, state, v1 }
    }

    /// Another release next to v1 (only the tests that switch need one).
    pub fn release(&self, version: &str) -> Repo {
        Repo::build(self.work.path(), version)
    }

    /// The next release on top of `parent`, in a copy of its repo (so the
    /// parent commit is served with it): its tree with `usr/bin/hello`
    /// changed, `usr/big` kept, and `usr/lib/new/` added, holding `files`
    /// new files of 3,000 bytes and one of 300,000.
    pub fn child(&self, parent: &Repo, version: &str, files: usize) -> Repo {
        let dir = self.work.path().join(format!("repo-{version}"));
        let tree = self.work.path().join(format!("tree-{version}"));
        for (from, to) in [(&parent.dir, &dir), (&parent.tree, &tree)] {
            let st = Command::new("cp").arg("-a").arg(from).arg(to).status();
            assert!(st.unwrap().success(), "cp -a {}", from.display());
        }
        std::fs::write(tree.join("usr/bin/hello"), format!("hello {version}\n")).unwrap();
        let new = tree.join("usr/lib/new");
        std::fs::create_dir_all(&new).unwrap();
        let seed = version.bytes().fold(11u64, |a, b| a * 37 + u64::from(b));
        for i in 0..files as u64 {
            let bytes = oscontent_testkit::files::noise(3000, seed + 2 * i);
            std::fs::write(new.join(format!("f{i}")), bytes).unwrap();
        }
        let big = oscontent_testkit::files::noise(300_000, seed + 2001);
        std::fs::write(new.join("big"), big).unwrap();
        let commit = ostree(
            &dir,
            &[
                "commit",
                "--orphan",
                &format!("--parent={}", parent.commit),
                &format!("--bind-ref={REF}"),
                &format!("--add-metadata-string=version={version}"),
                &format!("--tree=dir={}", tree.display()),
            ],
        )
        .trim()
        .to_owned();
        Repo { dir, commit, tree }
    }

    pub fn publish(&self, repo: &Repo) -> Generation {
        self.try_publish(repo).unwrap()
    }

    /// `repo` published with `--commit` its newest commit (a repo made by
    /// [`Fixture::child`] holds two).
    pub fn publish_newest(&self, repo: &Repo) -> Generation {
        let req = PublishRequest {
            source: Source::Repo(repo.dir.clone()),
            commit: Some(repo.commit.parse().unwrap()),
            refs: Vec::new(),
        };
        publish::publish(&req, &self.state).unwrap()
    }

    /// `repo` published as an image's staged repo is (`--image`): a
    /// release, with its ref from the commit's binding.
    pub fn publish_release(&self, repo: &Repo) -> Generation {
        let release = publish::Release {
            image: format!("oci:{}", repo.dir.display()),
            repo: repo.dir.clone(),
            commit: repo.commit.parse().unwrap(),
            version: None,
            preverified: false,
            staging: None,
        };
        publish::publish_releases(&[release], &self.state).unwrap()
    }

    pub fn try_publish(&self, repo: &Repo) -> anyhow::Result<Generation> {
        let req = PublishRequest {
            source: Source::Repo(repo.dir.clone()),
            commit: None,
            refs: Vec::new(),
        };
        publish::publish(&req, &self.state)
    }
}

/// An access log the test can read back.
#[derive(Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The router over an `AppState`. Building the state and storing a
/// generation in it happen only here, so a change to how `AppState` gets
/// its generation is a change to these two functions.
pub struct Server {
    pub state: AppState,
    sink: Arc<Sink>,
    log: LogBuffer,
}

impl Server {
    pub fn new() -> Self {
        Self::with_config(HttpConfig::default())
    }

    pub fn with_config(config: HttpConfig) -> Self {
        let log = LogBuffer::default();
        let sink = Arc::new(Sink::default());
        let state = AppState::new(config, sink.clone(), Some(Box::new(log.clone()))).unwrap();
        Self { state, sink, log }
    }

    /// Publishes as the refresher does: the object cache is warmed first.
    pub async fn publish(&self, generation: Generation) {
        self.sink.publish(generation).await;
    }

    /// The generation served now.
    pub fn current(&self) -> Arc<Generation> {
        self.sink.current().expect("a generation is served")
    }

    /// The overlay of the generation served now: where its refs live.
    pub fn overlay(&self) -> PathBuf {
        self.current().overlay.clone()
    }

    /// An HTTP/1.1 request, with a Host as a client sends one unless
    /// `headers` has its own (see [`Self::send_as`]).
    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
        let mut with_host = headers.to_vec();
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            with_host.push(("host", "oscontent.test"));
        }
        self.send_as(http::Version::HTTP_11, method, path, &with_host)
            .await
    }

    /// A request of `version` with exactly these headers.
    pub async fn send_as(
        &self,
        version: http::Version,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Reply {
        let mut req = Request::builder().version(version).method(method).uri(path);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Body::empty()).unwrap();
        let resp = app(self.state.clone()).oneshot(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.to_vec(),
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send("GET", path, &[]).await
    }

    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send("GET", path, headers).await
    }

    /// One sample of the `/metrics` text.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let text = String::from_utf8(self.get("/metrics").await.body).unwrap();
        text.lines().find_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            let have: BTreeMap<&str, &str> = rest
                .trim_end_matches('}')
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .collect();
            let want: BTreeMap<&str, &str> = labels.iter().copied().collect();
            (n == name && have == want).then(|| value.parse().unwrap())
        })
    }

    /// `oscontent_http_requests_total` for one kind and status.
    pub async fn requests(&self, kind: &str, status: &str) -> Option<f64> {
        self.metric(
            "oscontent_http_requests_total",
            &[("kind", kind), ("status", status)],
        )
        .await
    }

    pub fn access_log(&self) -> Vec<serde_json::Value> {
        // Lines wait for an idle worker, which a router called directly has not.
        assert!(self.state.sync_access_log(), "access log writer stuck");
        let bytes = self.log.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A response, body collected.
pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// A fixture with v1 published.
pub async fn serving_v1() -> (Fixture, Server) {
    let fx = Fixture::new();
    let server = Server::new();
    server.publish(fx.publish(&fx.v1)).await;
    (fx, server)
}

pub fn date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}
