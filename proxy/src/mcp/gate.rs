//! Before a method runs: who the caller is (client address, credentials, authentication,
//! the trusted agent header) and the answer to one over its rate limit.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::header::HeaderValue;
use http::{Response, StatusCode};
use serde_json::{json, Value};

use super::{code, header_str, rpc_error, session, Body};
use crate::metrics;
use crate::policy::{clientip, Identity};
use crate::runtime::Runtime;
use crate::trace::TraceContext;

/// A unique id for each HTTP request: a random process prefix and a counter.
fn next_request_id() -> String {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| session::new_id()[..12].to_string());
    let mut n = itoa::Buffer::new();
    let n = n.format(COUNTER.fetch_add(1, Ordering::Relaxed));
    let mut id = String::with_capacity(prefix.len() + 1 + n.len());
    id.push_str(prefix);
    id.push('-');
    id.push_str(n);
    id
}

/// An authenticated caller.
pub(crate) struct Caller {
    pub identity: Identity,
    pub trace: TraceContext,
    /// The client's W3C `tracestate`, forwarded unchanged (at most 512 bytes, as the spec allows
    /// a receiver to truncate).
    pub tracestate: Option<String>,
    pub request_id: String,
    /// Size of the request body (large argument objects are validated off the workers).
    pub body_bytes: usize,
}

/// A request refused before it reached a method.
pub(crate) struct Refusal {
    pub(crate) response: Response<Body>,
    pub(crate) decision: &'static str,
    pub(crate) reason: &'static str,
}

pub(crate) fn rate_limited(id: Option<&Value>, scope: &'static str, retry: Duration) -> Response<Body> {
    metrics::METRICS.rate_limited.with_label_values(&[scope]).inc();
    let ms = u64::try_from(retry.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut r = rpc_error(
        StatusCode::TOO_MANY_REQUESTS,
        id,
        code::RATE_LIMITED,
        format!("Rate limit exceeded ({scope}); retry in {:.1} s", ms as f64 / 1000.0),
        Some(json!({"scope": scope, "retryAfterMs": ms})),
    );
    r.headers_mut()
        .insert(http::header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000)));
    r
}

/// The client's address (trusted proxies decide) for a request from `peer`.
pub(crate) fn client_ip(rt: &Runtime, parts: &http::request::Parts, peer: SocketAddr) -> std::net::IpAddr {
    let forwarded = parts
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>();
    clientip::client_ip(peer.ip(), forwarded.into_iter(), &rt.trusted_proxies)
}

/// Credentials in the query, then authentication (the per-IP throttle already ran).
pub(crate) async fn gate(
    rt: &Runtime,
    parts: &http::request::Parts,
    peer: SocketAddr,
    ip: std::net::IpAddr,
    id: Option<&Value>,
    trace: TraceContext,
) -> Result<Caller, Refusal> {
    if parts.uri.query().is_some_and(crate::policy::auth::credential_in_query) {
        metrics::METRICS
            .auth_failures
            .with_label_values(&["credentials_in_query"])
            .inc();
        return Err(Refusal {
            response: rpc_error(
                StatusCode::BAD_REQUEST,
                id,
                code::INVALID_REQUEST,
                "Bad Request: credentials in the query string are refused; send them in a header",
                None,
            ),
            decision: "denied",
            reason: "credentials_in_query",
        });
    }
    let mut identity = match rt.auth.authenticate(&parts.headers).await {
        Ok(i) => i,
        Err(e) => {
            metrics::METRICS.auth_failures.with_label_values(&[e.reason()]).inc();
            let mut r = rpc_error(
                e.status(),
                id,
                code::UNAUTHORIZED,
                format!("Unauthorized: {e}"),
                Some(json!({"reason": e.reason()})),
            );
            if let Some(c) = rt.auth.challenge(&e) {
                r.headers_mut().insert(http::header::WWW_AUTHENTICATE, c);
            }
            tracing::debug!(reason = e.reason(), client_ip = %ip, "authentication refused");
            return Err(Refusal {
                response: r,
                decision: "denied",
                reason: e.reason(),
            });
        }
    };
    if identity.agent.is_none() {
        if let Some(h) = &rt.provenance.trusted_agent {
            if rt.trusted_proxies.iter().any(|c| c.contains(peer.ip())) {
                identity.agent = parts
                    .headers
                    .get(h)
                    .and_then(|v| v.to_str().ok())
                    .map(|s| super::prefix(s, 200).to_owned());
            }
        }
    }
    Ok(Caller {
        identity,
        trace,
        tracestate: header_str(&parts.headers, &super::TRACESTATE)
            .filter(|v| !v.is_empty() && v.len() <= 512)
            .map(str::to_string),
        request_id: next_request_id(),
        body_bytes: 0,
    })
}
