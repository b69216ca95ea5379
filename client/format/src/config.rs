//! The repository `config` file a remote serves (`[core] mode=`,
//! `collection-id=`), read with glib's `GKeyFile`, the parser libostree
//! itself uses, so that we accept and refuse what ostree does.

use crate::error::FormatError;
use glib::{KeyFile, KeyFileFlags};

/// The repository mode string a summary advertises; ostree's archive mode is
/// still called `archive-z2` on the wire.
pub const ARCHIVE_MODE: &str = "archive-z2";

/// The `config` a server serves for an archive repo that has none.
pub const ARCHIVE_CONFIG: &[u8] = b"[core]\nrepo_version=1\nmode=archive-z2\n";

/// A repo `config` is a few lines; anything larger is refused unparsed.
pub const MAX_CONFIG_SIZE: usize = 1 << 20;

/// What oscontent reads from a repo's `config`: its `[core]` group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepoConfig {
    /// `core.mode`, as written (`None` when absent; ostree then means `bare`).
    pub mode: Option<String>,
    /// `core.collection-id`, as written (not validated: see
    /// [`crate::validate_collection_id`]).
    pub collection_id: Option<String>,
}

impl RepoConfig {
    /// Parses untrusted config bytes, at most [`MAX_CONFIG_SIZE`] of them.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() > MAX_CONFIG_SIZE {
            return Err(FormatError::Config(format!(
                "{} bytes exceeds the {MAX_CONFIG_SIZE} byte limit",
                bytes.len()
            )));
        }
        let text = std::str::from_utf8(bytes)
            .map_err(|e| FormatError::Config(format!("not UTF-8: {e}")))?;
        // glib's bindings panic on a NUL inside the string they hand to C
        // (found by the `config` fuzz target); a key file never has one.
        if let Some(at) = text.find('\0') {
            return Err(FormatError::Config(format!("NUL byte at offset {at}")));
        }
        let kf = KeyFile::new();
        kf.load_from_data(text, KeyFileFlags::NONE)
            .map_err(|e| FormatError::Config(e.message().to_owned()))?;
        // A missing group or key is simply unset; ostree reads them the same way.
        let core = |key: &str| kf.string("core", key).ok().map(|v| v.to_string());
        Ok(Self {
            mode: core("mode"),
            collection_id: core("collection-id"),
        })
    }

    /// Whether the repo is archive-mode, the only mode served over HTTP
    /// (`archive`, or its old name `archive-z2`).
    pub fn is_archive(&self) -> bool {
        matches!(self.mode.as_deref(), Some("archive" | ARCHIVE_MODE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_core_keys() {
        // (config, mode, collection-id, archive)
        let cases: &[(&str, Option<&str>, Option<&str>, bool)] = &[
            (
                "[core]\nrepo_version=1\nmode=archive-z2\n",
                Some("archive-z2"),
                None,
                true,
            ),
            ("[core]\nmode=archive\n", Some("archive"), None, true),
            ("[core]\nmode=bare\n", Some("bare"), None, false),
            ("[core]\nrepo_version=1\n", None, None, false),
            (
                "[core]\nrepo_version=1\nmode = archive-z2\n\n[remote \"x\"]\nmode=bare\n",
                Some("archive-z2"),
                None,
                true,
            ),
            (
                "# comment\n[core]\nmode=archive-z2\ncollection-id=org.example.Os\n",
                Some("archive-z2"),
                Some("org.example.Os"),
                true,
            ),
            ("[remote \"x\"]\nmode=archive-z2\n", None, None, false),
            ("", None, None, false),
        ];
        for (text, mode, cid, archive) in cases {
            let c = RepoConfig::parse(text.as_bytes()).unwrap();
            assert_eq!(c.mode.as_deref(), *mode, "{text:?}");
            assert_eq!(c.collection_id.as_deref(), *cid, "{text:?}");
            assert_eq!(c.is_archive(), *archive, "{text:?}");
        }
    }

    #[test]
    fn the_generated_config_is_archive() {
        let c = RepoConfig::parse(ARCHIVE_CONFIG).unwrap();
        assert!(c.is_archive() && c.collection_id.is_none());
    }

    #[test]
    fn refuses_what_is_not_a_key_file() {
        let too_big = vec![b'#'; MAX_CONFIG_SIZE + 1];
        // (config, a word the error must contain)
        let cases: &[(&[u8], &str)] = &[
            (b"garbage", "garbage"),
            (b"mode=archive-z2\n", "group"),
            (b"[core]\nmode=\xff\n", "UTF-8"),
            // tests/fuzz/corpus/config/regression-nul
            (
                b"[core]\nmode=archive\0\0tas=true\n",
                "NUL byte at offset 19",
            ),
            (&too_big, "byte limit"),
        ];
        for (bytes, word) in cases {
            let e = RepoConfig::parse(bytes).unwrap_err().to_string();
            assert!(e.starts_with("invalid repo config: "), "{e}");
            assert!(e.contains(word), "{e} (want {word:?})");
        }
    }
}
