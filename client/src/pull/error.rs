//! Pull and verify outcomes, and the exit codes they map to. Callers (the
//! CLI, the tests, an operator's script) branch on the kind, so it is an
//! enum; the payload is the full error chain for the message.

/// Exit codes of `oscontent pull` and `oscontent verify` (also in README.md
/// and `--help`).
pub mod exit {
    pub const OK: u8 = 0;
    /// Bad usage, or an unexpected failure.
    pub const USAGE: u8 = 1;
    /// The server or the network failed (after retries), or the remote is
    /// not an archive repo, or lacks the ref or an object.
    pub const NETWORK: u8 = 2;
    /// Something did not verify: an object checksum, a signature, the
    /// summary signature, the ref binding, a pinned checksum.
    pub const VERIFICATION: u8 = 3;
    /// The target is older than what the ref has (timestamp or version),
    /// and `--allow-downgrade` was not given.
    pub const DOWNGRADE: u8 = 4;
    /// The local repo could not be opened, read or written.
    pub const LOCAL_REPO: u8 = 5;
    /// SIGINT or SIGTERM stopped the pull (128 + SIGINT, as shells report
    /// it).
    pub const INTERRUPTED: u8 = 130;
}

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0:#}")]
    Usage(anyhow::Error),
    #[error("{0:#}")]
    Network(anyhow::Error),
    #[error("{0:#}")]
    Verification(anyhow::Error),
    #[error("{0:#}")]
    Downgrade(anyhow::Error),
    #[error("{0:#}")]
    LocalRepo(anyhow::Error),
    #[error("{0:#}")]
    Interrupted(anyhow::Error),
}

impl PullError {
    pub fn exit_code(&self) -> u8 {
        match self {
            PullError::Usage(_) => exit::USAGE,
            PullError::Network(_) => exit::NETWORK,
            PullError::Verification(_) => exit::VERIFICATION,
            PullError::Downgrade(_) => exit::DOWNGRADE,
            PullError::LocalRepo(_) => exit::LOCAL_REPO,
            PullError::Interrupted(_) => exit::INTERRUPTED,
        }
    }

    /// Short name for `--json` (`"kind"` of the error event).
    pub fn kind(&self) -> &'static str {
        match self {
            PullError::Usage(_) => "usage",
            PullError::Network(_) => "network",
            PullError::Verification(_) => "verification",
            PullError::Downgrade(_) => "downgrade",
            PullError::LocalRepo(_) => "local-repo",
            PullError::Interrupted(_) => "interrupted",
        }
    }
}

pub type PullResult<T> = Result<T, PullError>;

/// `.local()?`, `.net()?`, ... : tag an error with its kind.
pub trait Tag<T> {
    fn usage(self) -> PullResult<T>;
    fn net(self) -> PullResult<T>;
    fn verification(self) -> PullResult<T>;
    fn local(self) -> PullResult<T>;
}

impl<T, E: Into<anyhow::Error>> Tag<T> for Result<T, E> {
    fn usage(self) -> PullResult<T> {
        self.map_err(|e| PullError::Usage(e.into()))
    }
    fn net(self) -> PullResult<T> {
        self.map_err(|e| PullError::Network(e.into()))
    }
    fn verification(self) -> PullResult<T> {
        self.map_err(|e| PullError::Verification(e.into()))
    }
    fn local(self) -> PullResult<T> {
        self.map_err(|e| PullError::LocalRepo(e.into()))
    }
}
