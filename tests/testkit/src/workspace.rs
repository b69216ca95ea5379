//! Where this workspace and its build outputs are, for everything that
//! runs or builds a binary of it (the fixtures, the encapsulator, xtask).

use std::path::{Path, PathBuf};

/// Workspace root, from where xtask was compiled.
pub fn workspace_root() -> PathBuf {
    // This crate is tests/testkit: the workspace is two levels up.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .unwrap_or(manifest)
        .to_path_buf()
}

/// Where cargo puts this workspace's build outputs: `$CARGO_TARGET_DIR`,
/// else `<workspace>/target`. xtask's builds and the encapsulator's own
/// (`encapsulate.rs`) both use it, and must agree.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}
