//! What the fuzz targets share: splitting one input into the parts a
//! target feeds its parser, and the grammar checks the invariants use.

/// The parts of an input separated by NUL bytes (no JSON or header text
/// holds a raw NUL, so a seed stays readable).
pub fn parts(data: &[u8]) -> Vec<&[u8]> {
    data.split(|&b| b == 0).collect()
}

/// Whether `c` is a path component that cannot move a path anywhere:
/// non-empty, not `.` or `..`, without `/` or NUL.
pub fn plain_component(c: &[u8]) -> bool {
    !c.is_empty() && c != b"." && c != b".." && !c.contains(&b'/') && !c.contains(&0)
}

/// Whether a relative `/`-separated path has only plain components.
pub fn plain_path(p: &str) -> bool {
    p.split('/').all(|c| plain_component(c.as_bytes()))
}
