//! The slot routes over HTTP: ask, renew, release. Each request ends within
//! [`REQUEST_TIMEOUT`] and reads at most [`wire::MAX_ANSWER_SIZE`] of body;
//! what the answers mean is `wire.rs`'s.

use super::wire::{self, Lease, SlotAnswer, SlotRequest};
use crate::pull::fetch;
use crate::pull::origin;
use anyhow::{anyhow, Context, Result};
use std::time::{Duration, SystemTime};

/// One slot request, renewal or release, connection included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct SlotClient {
    client: reqwest::Client,
    /// `BASE/oscontent/v1/stage/slots`.
    url: String,
    /// The same, credentials hidden, for messages.
    shown: String,
}

impl SlotClient {
    pub fn new(base: &str) -> Result<Self> {
        let url = format!("{}/{}", base.trim_end_matches('/'), wire::SLOTS_PATH);
        let client = fetch::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .context("starting the slot client")?;
        Ok(Self {
            client,
            shown: origin::redact(&url),
            url,
        })
    }

    /// `POST …/stage/slots`.
    pub async fn ask(&self, req: &SlotRequest<'_>) -> Result<SlotAnswer> {
        let resp = self
            .client
            .post(&self.url)
            .json(req)
            .send()
            .await
            .map_err(reqwest::Error::without_url)
            .with_context(|| format!("asking {} for a slot", self.shown))?;
        let status = resp.status().as_u16();
        let retry_after = oscontent_format::response_retry_after(
            status,
            resp.headers()
                .get(reqwest::header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            resp.headers()
                .get(reqwest::header::DATE)
                .map(|v| v.as_bytes()),
            SystemTime::now(),
        );
        let body = bounded_body(resp).await?;
        wire::slot_answer(status, retry_after, &body).with_context(|| self.shown.clone())
    }

    /// `POST …/stage/slots/LEASE/renew`: the new TTL, `None` if the lease
    /// is gone.
    pub async fn renew(&self, lease: &Lease) -> Result<Option<Duration>> {
        let url = format!("{}/{}/renew", self.url, lease.as_str());
        let resp = self
            .client
            .post(&url)
            .send()
            .await
            .map_err(reqwest::Error::without_url)
            .with_context(|| format!("renewing the slot at {}", self.shown))?;
        let status = resp.status().as_u16();
        let body = bounded_body(resp).await?;
        wire::renew_answer(status, &body).with_context(|| self.shown.clone())
    }

    /// `DELETE …/stage/slots/LEASE`: `false` if the server no longer had it.
    pub async fn release(&self, lease: &Lease) -> Result<bool> {
        let url = format!("{}/{}", self.url, lease.as_str());
        let resp = self
            .client
            .delete(&url)
            .send()
            .await
            .map_err(reqwest::Error::without_url)
            .with_context(|| format!("releasing the slot at {}", self.shown))?;
        match resp.status().as_u16() {
            204 | 200 => Ok(true),
            404 => Ok(false),
            s => Err(anyhow!("releasing the slot at {}: HTTP {s}", self.shown)),
        }
    }
}

/// The body, refused past [`wire::MAX_ANSWER_SIZE`] before more is held.
async fn bounded_body(mut resp: reqwest::Response) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(reqwest::Error::without_url)
        .context("reading the slot answer")?
    {
        if body.len() + chunk.len() > wire::MAX_ANSWER_SIZE {
            return Err(anyhow!(
                "the slot answer is longer than {} bytes",
                wire::MAX_ANSWER_SIZE
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
