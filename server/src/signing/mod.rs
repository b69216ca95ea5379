//! Signatures on the server side (ARCHITECTURE.md, "Trust model").
//!
//! Three roles share this module:
//! - the **signer** (`oscontent-server sign`, run where the private key
//!   lives) publishes the sources exactly as `serve` would, into a scratch
//!   state dir, and signs the exact commit objects and the exact summary
//!   bytes that publication produces, writing a [`SignatureBundle`];
//! - the **server** (`serve --signatures DIR`) installs a bundle's
//!   signatures into each generation it publishes, next to what the source
//!   repo already carries, and serves a bundle's `summary.sig` only when it
//!   signs the very summary the server generated (by SHA-256). It never
//!   needs a private key;
//! - the **gate** (`serve --trusted-keys FILE`) verifies every published
//!   commit and the summary before a generation becomes visible, and
//!   refuses it otherwise, naming the ref, the commit and the reason.
//!
//! `serve --sign-key FILE` is the trusted control-plane mode: the server
//! signs at publish time, into its state dir only.
//!
//! Agreement on bytes rests on one fact: the summary is a pure function of
//! the published refs, their commits, the deltas and the collection ID
//! (`served.rs`), and publication is deterministic (`publish.rs`). Both
//! sides run that same code on the same sources.
//!
//! Layout: `keys.rs` (secret and trusted keys, `keygen`, key lifetimes),
//! `bundle.rs` (the bundle on disk, and `sign_generation`, which makes one),
//! `apply.rs` (what publication does: install, sign, verify), `pin.rs`
//! (what a private key may sign: only what the operator pinned), `watch.rs`
//! (when to publish again), `error.rs` (the refusals callers branch on).
//! This file only re-exports: the children import each other, never it,
//! so the module graph has no loop.

mod apply;
mod bundle;
mod error;
mod keys;
mod pin;
mod watch;

pub use apply::{apply, refuse_unpinned, SignatureOptions};
pub use bundle::{
    bundle_identity, bundle_root, load_bundle, sign_generation, write_bundle, SignatureBundle,
    SignatureManifest, BUNDLE_FORMAT, BUNDLE_KIND, BUNDLE_MANIFEST, BUNDLE_SUMMARY_SIG,
    COMMITMETA_SUFFIX, KUBE_DATA_LINK, MAX_BUNDLE_COMMITS,
};
pub use error::{is_signature_error, SignatureError};
pub use keys::{
    keygen, load_secret_key_env, load_secret_key_file, load_trusted_keys, parse_validity,
    KeygenRequest,
};
pub use pin::{decide, Named, Signer, Unpinned};
pub use watch::SignatureWatch;
// The report is data a generation carries, so it lives with `Generation`;
// named here too, where publication makes it.
pub use crate::served::SignatureReport;
