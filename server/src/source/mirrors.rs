//! Mirrors for disconnected sites, from a `registries.conf`: the format,
//! its parser and the endpoint order are `oscontent_parse::source::mirrors`
//! (what the fuzz targets build); this reads the file.

pub use oscontent_parse::source::mirrors::{Endpoint, RegistriesConf, MAX_REGISTRIES_CONF_BYTES};
use std::io::Read;
use std::path::Path;

/// Reads and parses the registries.conf at `path` (at most
/// [`MAX_REGISTRIES_CONF_BYTES`]).
pub fn load(path: &Path) -> Result<RegistriesConf, String> {
    let f = std::fs::File::open(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut buf = String::new();
    f.take(MAX_REGISTRIES_CONF_BYTES + 1)
        .read_to_string(&mut buf)
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    if buf.len() as u64 > MAX_REGISTRIES_CONF_BYTES {
        return Err(format!(
            "{} is larger than {MAX_REGISTRIES_CONF_BYTES} bytes",
            path.display()
        ));
    }
    RegistriesConf::parse(&buf).map_err(|e| format!("{}: {e}", path.display()))
}
