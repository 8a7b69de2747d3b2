//! Requests refused before their body is parsed (over the per-IP throttle, the wrong media type
//! or protocol version, too large, too slow, not JSON): the refusals, and the one audit record a
//! refused `tools/call` still leaves, from what the start of its body says (see `peek`).

use std::time::Duration;

use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Response, StatusCode};
use serde_json::{json, Value};
use toolgate_config::SUPPORTED_PROTOCOL_VERSIONS;

use super::call::CallAudit;
use super::{code, header_str, modern, peek, rate_limited, rpc_error, Body, RequestInfo, Shared, VERSION_HEADER};
use crate::metrics;

/// How long a request body may take to arrive.
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// How much of a refused request's body is read to find out whether it is a `tools/call` (and
/// how long that may take): enough for `method` and `params.name` in the order the SDKs send
/// them. The TypeScript SDK puts `id` last, so a large refused call of its may be recorded
/// without its `jsonrpcId`.
const REFUSED_PEEK_BYTES: usize = 64 * 1024;
const REFUSED_PEEK_TIMEOUT: Duration = Duration::from_secs(2);

/// The refusal of a body that did not arrive whole, and its audit reason.
pub(super) fn body_refusal(end: peek::BodyEnd, limit: u64) -> (Response<Body>, &'static str) {
    match end {
        peek::BodyEnd::TimedOut => (
            rpc_error(
                StatusCode::REQUEST_TIMEOUT,
                None,
                code::INVALID_REQUEST,
                format!(
                    "Request Timeout: the body did not arrive within {} s",
                    BODY_TIMEOUT.as_secs()
                ),
                None,
            ),
            "body_timeout",
        ),
        peek::BodyEnd::TooLarge => (too_large(limit), "payload_too_large"),
        peek::BodyEnd::Failed | peek::BodyEnd::Complete => (
            rpc_error(
                StatusCode::BAD_REQUEST,
                None,
                code::PARSE_ERROR,
                "Parse error: the request body could not be read",
                None,
            ),
            "unreadable_body",
        ),
    }
}

fn too_large(limit: u64) -> Response<Body> {
    rpc_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        None,
        code::INVALID_REQUEST,
        format!("Payload Too Large: the limit is {limit} bytes"),
        None,
    )
}

/// A request refused on its headers alone: reads the start of its body so that a refused
/// `tools/call` still leaves its audit record; returns the JSON-RPC id it carried.
pub(super) async fn refuse_unread(
    shared: &Shared,
    body: hyper::body::Incoming,
    ip: std::net::IpAddr,
    decision: &'static str,
    reason: &'static str,
    info: &mut RequestInfo,
) -> Option<Value> {
    let (bytes, end) = peek::read(body, REFUSED_PEEK_BYTES, REFUSED_PEEK_TIMEOUT).await;
    audit_unparsed(
        shared,
        &bytes,
        end == peek::BodyEnd::Complete,
        ip,
        decision,
        reason,
        info,
    )
}

/// Leaves the audit record of a request refused before its body was parsed, when the body says
/// it is a `tools/call` (with what it says: id, tool, and the arguments' digest when the body is
/// whole); returns the JSON-RPC id it carried.
pub(super) fn audit_unparsed(
    shared: &Shared,
    body: &[u8],
    complete: bool,
    ip: std::net::IpAddr,
    decision: &'static str,
    reason: &'static str,
    info: &mut RequestInfo,
) -> Option<Value> {
    let record = |id: Option<&Value>, params: Option<&Value>, digest: bool| {
        let mut a = CallAudit::new(shared.auditor.load_full(), id.unwrap_or(&Value::Null), params);
        a.set_ip(ip);
        if digest {
            a.set_arguments(params, false);
        }
        a.finish(decision, reason, None);
    };
    let whole = (complete && body.len() <= REFUSED_PEEK_BYTES)
        .then(|| serde_json::from_slice::<Value>(body).ok())
        .flatten();
    if let Some(Value::Object(msg)) = &whole {
        let method = msg.get("method").and_then(Value::as_str);
        if let Some(m) = method {
            info.method = metrics::method_label(m);
        }
        let id = msg.get("id").filter(|i| i.is_string() || i.is_number());
        if method == Some("tools/call") {
            record(id, msg.get("params"), true);
        }
        return id.cloned();
    }
    let found = peek::scan(body);
    if let Some(m) = &found.method {
        info.method = metrics::method_label(m);
    }
    if found.method.as_deref() == Some("tools/call") {
        let params = found.tool.as_ref().map(|t| json!({"name": t}));
        record(found.id.as_ref(), params.as_ref(), false);
    }
    found.id
}

/// A request over the per-IP limit: refused before any credential is looked at. The start of its
/// body is still read so that a throttled `tools/call` (chunked or large ones included) leaves
/// its audit record.
pub(super) async fn throttled(
    shared: &Shared,
    body: hyper::body::Incoming,
    ip: std::net::IpAddr,
    retry: Duration,
    info: &mut RequestInfo,
) -> Response<Body> {
    let id = refuse_unread(shared, body, ip, "rate_limited", "ip", info).await;
    rate_limited(id.as_ref(), "ip", retry)
}

/// Whether `hay` holds `needle`, ASCII letters compared without case.
fn contains_ignoring_case(hay: &str, needle: &str) -> bool {
    hay.as_bytes()
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle.as_bytes()))
}

/// A request refused on its headers (media type, accepted types, protocol version, declared
/// size), and its audit reason.
pub(super) fn header_refusal(headers: &HeaderMap, limit: u64) -> Option<(Response<Body>, &'static str)> {
    let ct = header_str(headers, CONTENT_TYPE).unwrap_or("");
    if !ct.get(..16).is_some_and(|t| t.eq_ignore_ascii_case("application/json")) {
        let r = rpc_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            None,
            code::INVALID_REQUEST,
            "Unsupported Media Type: Content-Type must be application/json",
            None,
        );
        return Some((r, "unsupported_media_type"));
    }
    if let Some(a) = header_str(headers, ACCEPT) {
        if !["application/json", "*/*", "application/*"]
            .iter()
            .any(|t| contains_ignoring_case(a, t))
        {
            let r = rpc_error(
                StatusCode::NOT_ACCEPTABLE,
                None,
                code::INVALID_REQUEST,
                "Not Acceptable: the client must accept application/json",
                None,
            );
            return Some((r, "not_acceptable"));
        }
    }
    if let Some(v) = headers.get(&VERSION_HEADER) {
        if !v.to_str().is_ok_and(|v| SUPPORTED_PROTOCOL_VERSIONS.contains(&v)) {
            // The 2026-07-28 answer (400, -32022 naming the versions served), which every era's
            // client understands as "pick another version".
            let rej = *modern::unsupported_version(&String::from_utf8_lossy(v.as_bytes()));
            let r = rpc_error(rej.status, None, rej.code, rej.message, rej.data);
            return Some((r, "unsupported_protocol_version"));
        }
    }
    if header_str(headers, CONTENT_LENGTH)
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|n| n > limit)
    {
        return Some((too_large(limit), "payload_too_large"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(content_type: &str, accept: Option<&str>) -> Option<&'static str> {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, content_type.parse().unwrap());
        if let Some(a) = accept {
            h.insert(ACCEPT, a.parse().unwrap());
        }
        header_refusal(&h, 1024).map(|(_, reason)| reason)
    }

    #[test]
    fn media_types_are_matched_without_case() {
        assert_eq!(refusal("Application/JSON; charset=utf-8", None), None);
        assert_eq!(
            refusal("application/json", Some("TEXT/EVENT-STREAM, Application/Json")),
            None
        );
        assert_eq!(refusal("application/json", Some("text/html;q=0.9, */*;q=0.1")), None);
        assert_eq!(refusal("application/json", Some("application/*")), None);
        assert_eq!(refusal("text/plain", None), Some("unsupported_media_type"));
        assert_eq!(refusal("application/jso", None), Some("unsupported_media_type"));
        assert_eq!(
            refusal("application/json", Some("text/event-stream")),
            Some("not_acceptable")
        );
        assert_eq!(refusal("application/json", Some("*")), Some("not_acceptable"));
    }
}
