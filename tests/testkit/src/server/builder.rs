//! How a [`Server`] is started: its source, arguments and environment.

use anyhow::{ensure, Context, Result};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use super::launch::{announced_listening, ServerProcess};
use super::{Server, START_TIMEOUT};
use crate::fixtures::Release;
use crate::process::{local_only, run_bounded, strip_ansi};
use crate::tools::{server_bin, tempdir};

/// Arguments for [`Server`].
#[derive(Debug, Clone, Default)]
pub struct ServerBuilder {
    source: Vec<OsString>,
    extra: Vec<OsString>,
    state_dir: Option<PathBuf>,
    /// Environment changes: `Some` sets, `None` removes.
    env: Vec<(OsString, Option<OsString>)>,
    /// Run exactly `oscontent-server SOURCE...` in an empty environment
    /// plus `env` ([`Server::verbatim`]).
    verbatim: bool,
    /// `--listen`; `None`: a free loopback port.
    listen: Option<String>,
    /// A program and its arguments that run the server (a sandbox such
    /// as `bwrap ...`); empty: run it directly.
    wrapper: Vec<OsString>,
}

impl ServerBuilder {
    /// Adds one argument after the source.
    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.extra.push(a.as_ref().to_owned());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.extra
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Listens on `addr` instead of a free loopback port.
    pub fn listen(mut self, addr: impl ToString) -> Self {
        self.listen = Some(addr.to_string());
        self
    }

    /// Uses this state dir instead of a fresh temporary one.
    pub fn state_dir(mut self, d: &Path) -> Self {
        self.state_dir = Some(d.to_path_buf());
        self
    }

    /// Sets an environment variable for the server.
    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.env
            .push((k.as_ref().to_owned(), Some(v.as_ref().to_owned())));
        self
    }

    /// Removes an environment variable for the server.
    pub fn env_remove(mut self, k: impl AsRef<OsStr>) -> Self {
        self.env.push((k.as_ref().to_owned(), None));
        self
    }

    /// Runs the server through `wrapper` (a program and its arguments,
    /// the server's path and arguments appended), e.g. a sandbox.
    pub fn wrapped_in<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, wrapper: I) -> Self {
        self.wrapper = wrapper.into_iter().map(|a| a.as_ref().to_owned()).collect();
        self
    }

    fn new_command(&self) -> Command {
        match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(server_bin());
                cmd
            }
            None => Command::new(server_bin()),
        }
    }

    fn command(&self, tmp: &Path) -> (Command, PathBuf, PathBuf) {
        let state = self.state_dir.clone().unwrap_or_else(|| tmp.join("state"));
        let log = tmp.join("access.log");
        if self.verbatim {
            let mut cmd = self.new_command();
            cmd.env_clear().args(&self.source);
            for (k, v) in &self.env {
                if let Some(v) = v {
                    cmd.env(k, v);
                }
            }
            return (cmd, state, log);
        }
        let mut cmd = self.new_command();
        local_only(&mut cmd);
        cmd.arg("serve")
            .args(&self.source)
            .arg("--state-dir")
            .arg(&state)
            .arg("--listen")
            .arg(self.listen.as_deref().unwrap_or("127.0.0.1:0"))
            .arg("--access-log")
            .arg(&log)
            .args(&self.extra)
            .env("NO_COLOR", "1")
            .env_remove("OSCONTENT_STATE_DIR")
            .env_remove("OSCONTENT_LISTEN");
        for (k, v) in &self.env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        (cmd, state, log)
    }

    /// Starts the server and waits until `/readyz` answers 200.
    pub fn start(self) -> Result<Server> {
        let mut server = self.spawn()?;
        server.wait_ready(START_TIMEOUT)?;
        Ok(server)
    }

    /// Starts the server and waits only for its `listening on` line, not
    /// for `/readyz` (image sources are fetched after the server listens).
    pub fn spawn(self) -> Result<Server> {
        let tmp = tempdir();
        let (mut cmd, state_dir, access_log) = self.command(tmp.path());
        let proc = ServerProcess::spawn(&mut cmd, START_TIMEOUT)?;
        ensure!(
            proc.addr.ip().is_loopback(),
            "server listens on {}, not on loopback",
            proc.addr
        );
        Ok(Server {
            url: proc.url.clone(),
            addr: proc.addr,
            proc,
            status: None,
            state_dir,
            access_log,
            _tmp: tmp,
        })
    }

    /// Runs the server expecting it to refuse to start: returns its exit
    /// status and stderr. Fails if it starts serving instead.
    pub fn start_expect_failure(self) -> Result<Refusal> {
        let tmp = tempdir();
        let (mut cmd, _, _) = self.command(tmp.path());
        let what = format!("{cmd:?}");
        let o = run_bounded(&mut cmd, Duration::from_secs(60))
            .with_context(|| format!("{what} was expected to refuse to start"))?;
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        let stderr = strip_ansi(&String::from_utf8_lossy(&o.stderr));
        ensure!(
            !o.status.success(),
            "{what} exited successfully; expected a refusal.\nstderr:\n{stderr}"
        );
        ensure!(
            !announced_listening(&o.stdout),
            "{what} started listening: {stdout}"
        );
        Ok(Refusal {
            status: o.status,
            stderr,
        })
    }
}

/// How a server refused to start.
#[derive(Debug)]
pub struct Refusal {
    pub status: ExitStatus,
    pub stderr: String,
}

impl Refusal {
    /// The `error: ...` lines.
    pub fn error(&self) -> String {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("error"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Server {
    /// `serve --oscontainer DIR`.
    pub fn oscontainer(dir: &Path) -> ServerBuilder {
        Self::source(vec!["--oscontainer".into(), dir.into()])
    }

    /// `serve --repo DIR`.
    pub fn repo(dir: &Path) -> ServerBuilder {
        Self::source(vec!["--repo".into(), dir.into()])
    }

    /// `serve --upstream URL`.
    pub fn upstream(url: &str) -> ServerBuilder {
        Self::source(vec!["--upstream".into(), url.into()])
    }

    /// `serve --bundle DIR`.
    pub fn bundle(dir: &Path) -> ServerBuilder {
        Self::source(vec!["--bundle".into(), dir.into()])
    }

    fn source(source: Vec<OsString>) -> ServerBuilder {
        ServerBuilder {
            source,
            ..Default::default()
        }
    }

    /// `serve --image REF [--image REF]...`. `REGISTRY_AUTH_FILE` is
    /// removed from the environment (set it with [`ServerBuilder::env`]).
    pub fn images<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(refs: I) -> ServerBuilder {
        let mut source = Vec::new();
        for r in refs {
            source.push(OsString::from("--image"));
            source.push(r.as_ref().to_owned());
        }
        ServerBuilder {
            source,
            env: vec![("REGISTRY_AUTH_FILE".into(), None)],
            ..Default::default()
        }
    }

    /// `oscontent-server ARGS...` exactly (the first is the subcommand): no
    /// state dir, listen address or access log is added, and the
    /// environment is only `env`. ARGS must make it listen on loopback
    /// port 0 and print its address; [`ServerBuilder::state_dir`] only
    /// tells the harness where the state dir is.
    pub fn verbatim<I, S>(args: I, env: &[(String, String)]) -> ServerBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        ServerBuilder {
            source: args.into_iter().map(|a| a.as_ref().to_owned()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (OsString::from(k), Some(OsString::from(v))))
                .collect(),
            verbatim: true,
            ..Default::default()
        }
    }

    /// Serves a fixture release's oscontainer with default settings.
    pub fn release(r: &Release) -> Server {
        Self::oscontainer(&r.oscontainer)
            .start()
            .unwrap_or_else(|e| panic!("starting the server: {e:#}"))
    }
}
