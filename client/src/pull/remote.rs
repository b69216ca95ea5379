//! Step 1 of a pull: the remote, and the commit it names. `--url` or
//! `--remote` resolves to a URL and to what the remote must prove
//! ([`resolve_source`]); the summary, its signature checked before it is
//! parsed, and the ref then name the target ([`resolve_target`]).

use super::error::{PullError, PullResult, Tag};
use super::fetch::{FetchError, Fetcher};
use super::options::{PullOptions, Remote, Source, Trust};
use super::store::Store;
use super::verify::{self, Keyring};
use anyhow::{anyhow, Context};
use oscontent_format::gpgsigs::MAX_DETACHED_METADATA_SIZE;
use oscontent_format::summary::MAX_SUMMARY_SIZE;
use oscontent_format::{parse_summary, Checksum, Summary};
use std::path::PathBuf;

/// `refs/heads/REF` bodies: a checksum and a newline.
const MAX_REF_FILE_SIZE: usize = 1024;

/// Resolves `--url` or `--remote`: a URL verifies what `--trusted-keys`
/// asks for (everything, or nothing); a configured remote, see
/// [`remote_trust`].
pub fn resolve_source(opts: &PullOptions, store: &Store) -> PullResult<Remote> {
    let explicit = opts
        .trusted_keys
        .as_deref()
        .map(Keyring::load)
        .transpose()?;
    match &opts.source {
        Source::Url(u) => {
            let on = explicit.is_some();
            Ok(Remote {
                url: u.clone(),
                content_url: None,
                name: None,
                trust: Trust {
                    keyring: explicit,
                    commits: on,
                    summary: on,
                },
                collection_id: None,
            })
        }
        Source::Remote(name) => {
            let url = store.remote_url(name).usage()?;
            let trust = remote_trust(store, name, explicit)?;
            let collection_id = store.remote_option(name, "collection-id").usage()?;
            let content_url = store
                .remote_option(name, "contenturl")
                .usage()?
                .filter(|c| !c.is_empty() && c.trim_end_matches('/') != url.trim_end_matches('/'));
            Ok(Remote {
                url,
                content_url,
                name: Some(name.clone()),
                trust,
                collection_id: collection_id.filter(|c| !c.is_empty()),
            })
        }
    }
}

/// What a configured remote must prove: everything against `--trusted-keys`
/// when given, else what its `gpg-verify` and `gpg-verify-summary` say,
/// against its own keys ([`remote_keyring`]).
fn remote_trust(store: &Store, name: &str, explicit: Option<Keyring>) -> PullResult<Trust> {
    let (gpg_commits, gpg_summary) = store.remote_gpg_verify(name).usage()?;
    if let Some(k) = explicit {
        return Ok(Trust {
            keyring: Some(k),
            commits: true,
            summary: true,
        });
    }
    if !gpg_commits && !gpg_summary {
        return Ok(Trust {
            keyring: None,
            commits: false,
            summary: false,
        });
    }
    let keyring = remote_keyring(store, name)?.ok_or_else(|| {
        PullError::Usage(anyhow!(
            "remote {name:?} requires GPG verification but has no keyring oscontent can read \
             (gpgkeypath, or {name}.trustedkeys.gpg in the repo); pass --trusted-keys FILE"
        ))
    })?;
    Ok(Trust {
        keyring: Some(keyring),
        commits: gpg_commits,
        summary: gpg_summary,
    })
}

/// A remote's keys: its `gpgkeypath` files, else the keyring
/// `ostree remote gpg-import` wrote (`REPO/NAME.trustedkeys.gpg`).
fn remote_keyring(store: &Store, name: &str) -> PullResult<Option<Keyring>> {
    if let Some(p) = store.remote_option(name, "gpgkeypath").usage()? {
        let paths: Vec<PathBuf> = p
            .split([';', ','])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
            .collect();
        if !paths.is_empty() {
            return Keyring::load_all(&paths).map(Some);
        }
    }
    let imported = store.path.join(format!("{name}.trustedkeys.gpg"));
    if imported.is_file() {
        return Keyring::load(&imported).map(Some);
    }
    Ok(None)
}

/// The remote's metadata that decides the target.
pub struct RemoteView {
    pub summary: Option<Summary>,
    pub target: Checksum,
    /// How the target was found.
    pub resolved_by: &'static str,
    pub summary_sig: Option<serde_json::Value>,
}

/// Fetches the summary and finds the target: `--commit`, else the
/// summary's ref, else `refs/heads/REF`.
pub async fn resolve_target(
    fetcher: &Fetcher,
    ref_name: Option<&str>,
    pinned: Option<Checksum>,
    trust: &Trust,
) -> PullResult<RemoteView> {
    let (summary, summary_sig) = fetch_summary(fetcher, trust).await?;
    let (target, resolved_by) = match (pinned, ref_name) {
        (Some(c), _) => (c, "pinned"),
        (None, Some(r)) => {
            match summary
                .as_ref()
                .and_then(|s| s.refs.iter().find(|e| e.name == r))
            {
                Some(e) => (e.commit, "summary"),
                None => {
                    let signed = summary.is_some() && trust.summary;
                    (ref_file(fetcher, r, signed).await?, "ref-file")
                }
            }
        }
        (None, None) => unreachable!("checked by the caller"),
    };
    Ok(RemoteView {
        summary,
        target,
        resolved_by,
        summary_sig,
    })
}

/// The remote's summary, if it has one, and the description of its
/// signature when the summary must be signed.
pub(crate) async fn fetch_summary(
    fetcher: &Fetcher,
    trust: &Trust,
) -> PullResult<(Option<Summary>, Option<serde_json::Value>)> {
    let summary_bytes = fetcher
        .get_bytes("summary", MAX_SUMMARY_SIZE)
        .await
        .map_err(FetchError::into_pull)?;
    // Hiding the summary must not switch its verification off: stock
    // ostree refuses the same way ("GPG verification enabled, but no
    // summary found").
    if summary_bytes.is_none() && trust.summary {
        return Err(no_summary(&fetcher.url("summary")));
    }
    // The signature first: bytes a hostile server made up are reported as
    // what they are (a summary that does not verify), not as a server that
    // cannot write GVariant, and are never parsed.
    let mut summary_sig = None;
    if let (Some(bytes), true) = (&summary_bytes, trust.summary) {
        let sig = fetcher
            .get_bytes("summary.sig", MAX_DETACHED_METADATA_SIZE)
            .await
            .map_err(FetchError::into_pull)?;
        let v = verify::verify_summary(trust.keyring(), bytes, sig.as_deref())?;
        summary_sig = Some(verify::describe(&v));
    }
    let summary = summary_bytes
        .as_deref()
        .map(parse_summary)
        .transpose()
        .with_context(|| format!("parsing {}", fetcher.url("summary")))
        .net()?;
    Ok((summary, summary_sig))
}

/// A missing summary where its signature is required: a verification
/// failure, never a reason to go on unverified.
pub fn no_summary(url: &str) -> PullError {
    PullError::Verification(anyhow!(
        "{url}: no summary found, but summary verification is enabled \
         (gpg-verify-summary or --trusted-keys); refusing to go on without it"
    ))
}

/// The target from `refs/heads/REF`, for a ref the summary does not list.
/// When the summary is signed (`signed_summary`), such a ref is refused: it
/// carries no signature.
async fn ref_file(fetcher: &Fetcher, r: &str, signed_summary: bool) -> PullResult<Checksum> {
    let path = format!("refs/heads/{r}");
    let body = fetcher
        .get_bytes(&path, MAX_REF_FILE_SIZE)
        .await
        .map_err(FetchError::into_pull)?
        .ok_or_else(|| {
            PullError::Network(anyhow!(
                "the remote has no ref {r:?} (not in its summary, and {} is not found)",
                fetcher.url(&path)
            ))
        })?;
    if signed_summary {
        return Err(PullError::Verification(anyhow!(
            "ref {r:?} is not in the signed summary"
        )));
    }
    let text = String::from_utf8_lossy(&body);
    Checksum::from_hex(text.trim())
        .with_context(|| fetcher.url(&path))
        .net()
}
