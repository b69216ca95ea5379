//! The server's JSON access log.

use anyhow::{Context, Result};
use std::path::Path;

/// One access-log line.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct AccessEntry {
    pub ts: String,
    /// The client's IP address (absent in-process, where there is no peer).
    #[serde(default)]
    pub client: Option<String>,
    pub method: String,
    pub path: String,
    pub status: u16,
    pub bytes: u64,
    pub kind: String,
    pub version: String,
    pub duration_ms: f64,
}

impl AccessEntry {
    /// For object paths: (checksum, extension).
    pub fn object(&self) -> Option<(String, String)> {
        let rest = self.path.strip_prefix("/objects/")?;
        let (prefix, file) = rest.split_once('/')?;
        let (tail, ext) = file.split_once('.')?;
        (prefix.len() == 2 && tail.len() == 62).then(|| (format!("{prefix}{tail}"), ext.to_owned()))
    }
}

/// Parses an access log file.
pub fn read_access_log(path: &Path) -> Result<Vec<AccessEntry>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| {
                format!("{}:{}: not an access-log entry: {l}", path.display(), i + 1)
            })
        })
        .collect()
}

/// The path kinds the server may log.
pub const KINDS: &[&str] = &[
    "config",
    "summary",
    "summary_sig",
    "ref",
    "commit",
    "dirtree",
    "dirmeta",
    "filez",
    "commitmeta",
    "delta",
    "delta_index",
    "blob",
    "health",
    "metrics",
    "other",
];
