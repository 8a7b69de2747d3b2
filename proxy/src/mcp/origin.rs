//! DNS-rebinding and cross-site protection: which `Host` and `Origin` a request may carry,
//! and the CORS preflight answer.

use http::header::{HeaderValue, HOST};
use http::{HeaderMap, Response, StatusCode};

use super::{empty, Body};
use crate::runtime::Runtime;

pub(crate) fn preflight() -> Response<Body> {
    let mut r = empty(StatusCode::NO_CONTENT);
    let h = r.headers_mut();
    h.insert(
        http::header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("POST, DELETE"),
    );
    h.insert(
        http::header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "content-type, accept, authorization, x-api-key, mcp-session-id, mcp-protocol-version, last-event-id",
        ),
    );
    h.insert(http::header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    r
}

/// The host part of a `Host` header or an origin's authority, lower-cased, without the port.
fn host_name(authority: &str) -> String {
    let a = authority.trim().to_ascii_lowercase();
    if a.starts_with('[') {
        return a.split_inclusive(']').next().unwrap_or("").to_string();
    }
    match a.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h.to_string(),
        _ => a,
    }
}

fn is_loopback_name(host: &str) -> bool {
    host == "localhost" || host == "[::1]" || host.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
}

/// DNS-rebinding protection, part one: the request must be addressed to a host we serve.
pub(crate) fn host_allowed(rt: &Runtime, headers: &HeaderMap) -> bool {
    let Some(allowed) = &rt.allowed_hosts else { return true };
    let Some(host) = headers.get(HOST).and_then(|h| h.to_str().ok()).map(host_name) else {
        return false;
    };
    allowed.contains(&host) || (rt.config.server.allowed_hosts.is_empty() && is_loopback_name(&host))
}

/// DNS-rebinding protection, part two: a browser Origin must be allowlisted, or be a loopback
/// origin when no allowlist is configured.
pub(crate) fn origin_allowed(rt: &Runtime, origin: &HeaderValue, _headers: &HeaderMap) -> bool {
    let Ok(origin) = origin.to_str() else { return false };
    let origin = origin.to_ascii_lowercase();
    if !rt.allowed_origins.is_empty() {
        return rt.allowed_origins.iter().any(|a| a == "*" || *a == origin);
    }
    match origin.split_once("://") {
        Some(("http" | "https", authority)) => is_loopback_name(&host_name(authority.trim_end_matches('/'))),
        _ => false,
    }
}
