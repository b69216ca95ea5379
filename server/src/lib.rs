//! oscontent-server: publishes an oscontainer's ostree repo as a complete
//! ostree remote over HTTP. See ARCHITECTURE.md for the code map.

pub mod ages;
pub mod cache;
pub mod cli;
pub mod clients;
/// The Range and conditional request headers (in `oscontent-parse`, which
/// the fuzz targets build).
pub use oscontent_parse::conditional;
pub mod deltas;
pub mod fsutil;
pub mod http;
pub mod images;
pub mod listen;
pub mod metrics;
pub mod mirror;
pub mod prepared;
pub mod publish;
pub mod redact;
pub mod redirect;
pub mod refresh;
pub mod request;
pub mod serve;
pub mod served;
pub mod signing;
pub mod sink;
pub mod slots;
pub mod source;
pub mod state;
pub mod treewalk;
pub mod verify;

pub use http::{app, AppState, HttpConfig};
