//! Offline mirrors and chained servers, end to end, in network namespaces
//! the suite creates (root required: it fails, saying so, without it).
//!
//! - `airgap`: a hub (registry + oscontent server) and a disconnected site
//!   (no route to the hub's registry) that gets bundles through a shared
//!   directory, serves them, and a node in the site that updates with stock
//!   `ostree pull` verifying the original signer's signatures; plus a
//!   chained site server fed by the hub over the link.
//! - `layout`: image → OCI layout copies (digests, incremental, resume).
//! - `hostile_upstream`: a summary naming a collection `../..` writes
//!   nothing outside the state dir or bundle (`serve --upstream`, `mirror`).
//! - `faults`: an upstream failing for a while: `Retry-After`, cut bodies.

// Test code: outside #[test] functions too, a panic that names the value is
// the failure report (clippy.toml allows it inside them).
#![allow(clippy::unwrap_used)]

mod airgap;
mod faults;
mod hostile_upstream;
mod layout;
mod netns;
mod support;
