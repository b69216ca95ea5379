//! The staging-slot routes (`crate::slots` is the table they ask):
//!
//! - `POST /oscontent/v1/stage/slots` with `{"node", "pool",
//!   "control_plane", "digest"}`: `200 {"lease", "ttl_secs", "pool"}`, or
//!   `429` with `Retry-After` and `{"error", "retry_after_secs", "pool",
//!   "in_use", "slots"}` (the counts of the cap that refused);
//! - `POST /oscontent/v1/stage/slots/<lease>/renew`: `200 {"ttl_secs"}`;
//! - `DELETE /oscontent/v1/stage/slots/<lease>`: `204`;
//!
//! a lease the table does not know is `404 {"error": "lease expired or
//! unknown"}`, a bad request `400 {"error"}` naming the field, a body
//! over 4 KiB `413` before it is read whole. The client address is the
//! connection's peer, as the access log has it. With `--stage-slots 0`
//! none of this is routed: every request is the unknown path's 404.

use crate::slots::request::{self, BadRequest, MAX_BODY};
use crate::slots::{Ask, LeaseId, Refusal, Report, Slots};
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::response::Response;
use axum::routing::{delete, post};
use axum::Router;
use http::header::{self, HeaderValue};
use http::StatusCode;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::json;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Where the routes live: every path under it is routed (`super::routed`),
/// never a repo answer.
pub const PATH: &str = "/oscontent/v1/stage/slots";

const UNKNOWN_LEASE: &str = "lease expired or unknown";

/// The lease table, shared by every request of the process.
#[derive(Debug)]
pub struct SlotTable(Mutex<Slots>);

impl SlotTable {
    pub fn new(slots: Slots) -> Self {
        Self(Mutex::new(slots))
    }

    /// The table; a panic elsewhere while it was held leaves counts that
    /// are still consistent (every change is made whole before it can
    /// panic), so a poisoned lock is taken as it is.
    pub fn lock(&self) -> MutexGuard<'_, Slots> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `f` with the table as it is now, under its lock: the metrics
    /// are set from it there, so that two scrapes at once do not both add
    /// the same difference to a counter.
    pub fn with_report(&self, f: impl FnOnce(&Report)) {
        let now = Instant::now();
        let mut slots = self.lock();
        log_expired(&mut slots, now);
        f(&slots.report(now));
    }
}

/// The slot routes, answered from `table`, for any router to merge.
pub fn routes<S: Clone + Send + Sync + 'static>(table: Arc<SlotTable>) -> Router<S> {
    Router::new()
        .route(PATH, post(grant))
        .route(&format!("{PATH}/{{lease}}"), delete(release))
        .route(&format!("{PATH}/{{lease}}/renew"), post(renew))
        .with_state(table)
}

async fn grant(State(table): State<Arc<SlotTable>>, req: Request) -> Response {
    let address = peer(&req);
    let body = match read_body(req).await {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let asked = match request::parse(&body) {
        Ok(a) => a,
        Err(e) => return bad_request(&e),
    };
    let ask = Ask {
        node: &asked.node,
        pool: &asked.pool,
        control_plane: asked.control_plane,
        address,
    };
    let now = Instant::now();
    let outcome = {
        let mut slots = table.lock();
        log_expired(&mut slots, now);
        slots.grant(&ask, now, rand::random::<[u8; 16]>, rand::random())
    };
    match outcome {
        Ok(g) => {
            tracing::info!(
                node = ask.node,
                pool = g.pool.as_str(),
                control_plane = ask.control_plane,
                digest = asked.digest.as_str(),
                client = %address,
                again = g.renewed,
                "staging slot granted"
            );
            let body = json!({
                "lease": g.lease.to_string(),
                "ttl_secs": g.ttl.as_secs(),
                "pool": g.pool,
            });
            json_response(StatusCode::OK, &body)
        }
        Err(r) => {
            tracing::debug!(
                node = ask.node,
                pool = ask.pool,
                digest = asked.digest.as_str(),
                client = %address,
                reason = r.reason().label(),
                "staging slot refused: {r}"
            );
            refused(ask.pool, &r)
        }
    }
}

async fn renew(State(table): State<Arc<SlotTable>>, Path(lease): Path<String>) -> Response {
    on_lease(&table, &lease, Slots::renew, |ttl| {
        json_response(StatusCode::OK, &json!({ "ttl_secs": ttl.as_secs() }))
    })
}

async fn release(State(table): State<Arc<SlotTable>>, Path(lease): Path<String>) -> Response {
    on_lease(&table, &lease, Slots::release, |l| {
        tracing::info!(
            node = l.node.as_str(),
            pool = l.pool.as_str(),
            "staging slot released"
        );
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::NO_CONTENT;
        r
    })
}

/// `act` on the lease the path names, once what is due has expired;
/// `answer` for what it returned, 404 if the table does not know the
/// lease, 400 if the path does not name one.
fn on_lease<T>(
    table: &SlotTable,
    lease: &str,
    act: impl FnOnce(&mut Slots, LeaseId, Instant) -> Option<T>,
    answer: impl FnOnce(T) -> Response,
) -> Response {
    let Some(id) = LeaseId::parse(lease) else {
        return malformed_lease();
    };
    let now = Instant::now();
    let done = {
        let mut slots = table.lock();
        log_expired(&mut slots, now);
        act(&mut slots, id, now)
    };
    done.map_or_else(unknown_lease, answer)
}

/// Expires what is due now, saying whose: a node that stopped renewing
/// (it died, or lost the server) is worth a line.
fn log_expired(slots: &mut Slots, now: Instant) {
    for e in slots.expire(now) {
        tracing::info!(
            node = e.node.as_str(),
            pool = e.pool.as_str(),
            "staging slot expired: not renewed within its TTL"
        );
    }
}

/// The connection's peer (in-process callers have none).
fn peer(req: &Request) -> IpAddr {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}

/// The body, if it is JSON and at most [`MAX_BODY`] bytes: a declared
/// length over it is refused before anything is read, and a chunked body
/// is read no further than one byte past it.
async fn read_body(req: Request) -> Result<bytes::Bytes, Box<Response>> {
    let err = |status, msg: &str| Box::new(json_response(status, &json!({ "error": msg })));
    let ctype = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim);
    if !ctype.is_some_and(|t| t.eq_ignore_ascii_case("application/json")) {
        let msg = "Content-Type: not application/json";
        return Err(err(StatusCode::BAD_REQUEST, msg));
    }
    let too_large = format!("body: larger than {MAX_BODY} bytes");
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return Err(err(StatusCode::PAYLOAD_TOO_LARGE, &too_large));
    }
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(err(StatusCode::PAYLOAD_TOO_LARGE, &too_large))
        }
        Err(e) => Err(err(
            StatusCode::BAD_REQUEST,
            &format!("body: not read whole: {e}"),
        )),
    }
}

fn bad_request(e: &BadRequest) -> Response {
    json_response(StatusCode::BAD_REQUEST, &json!({ "error": e.to_string() }))
}

fn malformed_lease() -> Response {
    let msg = "lease: not 32 lowercase hex digits";
    json_response(StatusCode::BAD_REQUEST, &json!({ "error": msg }))
}

fn unknown_lease() -> Response {
    json_response(StatusCode::NOT_FOUND, &json!({ "error": UNKNOWN_LEASE }))
}

/// A 429: when to come back, in the header and the body alike.
fn refused(pool: &str, r: &Refusal) -> Response {
    let secs = r.retry_after().as_secs();
    let held = r.held();
    let body = json!({
        "error": r.to_string(),
        "retry_after_secs": secs,
        "pool": pool,
        "in_use": held.in_use,
        "slots": held.cap,
    });
    let mut resp = json_response(StatusCode::TOO_MANY_REQUESTS, &body);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    resp
}

fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
