//! The 2026-07-28 revision, the main path: stateless requests. Each request carries its
//! protocol version, capabilities and client info in `params._meta`, and mirrors its version,
//! method and (for `tools/call`) tool name in the `MCP-Protocol-Version`, `Mcp-Method` and
//! `Mcp-Name` headers, which must agree with the body. No `initialize`, no `Mcp-Session-Id`:
//! nothing a request needs lives in one replica's memory.
//!
//! This module recognises such a request, runs the transport's validation ladder over it, and
//! completes every result (`resultType`, the server's identity in `_meta`).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use http::{HeaderMap, HeaderName, StatusCode};
use serde_json::{json, Value};
use toolgate_config::{LEGACY_PROTOCOL_VERSIONS, SUPPORTED_PROTOCOL_VERSIONS};

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::Response;

use super::message::{RequestMeta, Text};
use super::{
    call, code as rpc, empty, rpc_error, subscriptions, tools_list, Body, Caller, Incoming, Peer, Reply, RequestInfo,
    Shared,
};
use crate::audit::ClientInfo;
use crate::metrics;
use crate::runtime::Runtime;
use crate::trace::TraceContext;

/// `_meta` key: the request's protocol version (required).
pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client's capabilities (required; `{}` for none).
pub const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// `_meta` key: the client's name and version (optional).
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// Result `_meta` key: the server's identity.
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// Notification `_meta` key: the `subscriptions/listen` request a notification belongs to.
pub const META_SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
/// `Mcp-Method`: the JSON-RPC method, on every request.
pub const METHOD_HEADER: HeaderName = HeaderName::from_static("mcp-method");
/// `Mcp-Name`: the tool name of a `tools/call`.
pub const NAME_HEADER: HeaderName = HeaderName::from_static("mcp-name");

/// JSON-RPC codes of this revision.
pub mod code {
    /// A request metadata header is missing, invalid, or disagrees with the body.
    pub const HEADER_MISMATCH: i64 = -32020;
    /// The protocol version is not one this server speaks (`data: {supported, requested}`).
    pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;
}

/// What a validated 2026-07-28 request says about its client.
#[derive(Debug, Clone)]
pub struct Modern {
    /// The request's protocol version.
    pub version: &'static str,
    /// `_meta` clientInfo, for the audit record (never for decisions).
    pub client: ClientInfo,
    /// W3C trace context from `_meta` (`traceparent`, `tracestate`), when valid.
    pub trace: Option<(TraceContext, Option<String>)>,
}

/// A request the ladder refused: its HTTP status, JSON-RPC error and audit reason.
#[derive(Debug)]
pub struct Rejection {
    /// 400 for every rung.
    pub status: StatusCode,
    /// JSON-RPC code.
    pub code: i64,
    /// What is wrong.
    pub message: String,
    /// `error.data`.
    pub data: Option<Value>,
    /// Audit reason.
    pub reason: &'static str,
}

fn reject(code: i64, reason: &'static str, message: impl Into<String>) -> Box<Rejection> {
    Box::new(Rejection {
        status: StatusCode::BAD_REQUEST,
        code,
        message: message.into(),
        data: None,
        reason,
    })
}

/// The `-32022` refusal of `requested`, naming every version this server speaks.
pub fn unsupported_version(requested: &str) -> Box<Rejection> {
    Box::new(Rejection {
        data: Some(json!({"supported": SUPPORTED_PROTOCOL_VERSIONS, "requested": requested})),
        ..*reject(
            code::UNSUPPORTED_PROTOCOL_VERSION,
            "unsupported_protocol_version",
            format!(
                "Unsupported protocol version: MCP-Protocol-Version `{}` is not served here (supported: {})",
                requested.chars().take(64).collect::<String>(),
                SUPPORTED_PROTOCOL_VERSIONS.join(", ")
            ),
        )
    })
}

/// Whether a request (its `method` and `params._meta`) is served as a 2026-07-28 request: its `MCP-Protocol-Version` header names a
/// version that is not a 2025 revision (an unknown one too, so that the client is told what this
/// server speaks), or it has no such header but declares a version in `_meta` (a modern client
/// that forgot the header, which the ladder then refuses). Everything else is a 2025 request.
pub(crate) fn is_modern(headers: &HeaderMap, method: Option<&str>, meta: Option<&RequestMeta>) -> bool {
    match headers.get(&super::VERSION_HEADER) {
        Some(v) => !v.to_str().is_ok_and(|v| LEGACY_PROTOCOL_VERSIONS.contains(&v)),
        None => method != Some("initialize") && meta.is_some_and(|m| m.version.is_some()),
    }
}

/// A header value as sent, or decoded from the `=?base64?…?=` sentinel (standard alphabet,
/// canonical padding, UTF-8); `None` when it is neither valid visible ASCII nor a valid sentinel.
pub fn decode_header_value(raw: &[u8]) -> Option<Cow<'_, str>> {
    let text = std::str::from_utf8(raw).ok()?;
    if let Some(payload) = text.strip_prefix("=?base64?").and_then(|t| t.strip_suffix("?=")) {
        let bytes = STANDARD.decode(payload).ok()?;
        // Only the canonical encoding: one value, one spelling.
        if STANDARD.encode(&bytes) != payload {
            return None;
        }
        return String::from_utf8(bytes).ok().map(Cow::Owned);
    }
    text.bytes()
        .all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
        .then_some(Cow::Borrowed(text))
}

/// The single value of header `name` (a repeated one is refused: two values cannot both
/// agree with the body).
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a [u8]>, Box<Rejection>> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(reject(
            code::HEADER_MISMATCH,
            "header_mismatch",
            format!("Header mismatch: `{name}` is sent more than once"),
        ));
    }
    Ok(first.map(|v| v.as_bytes()))
}

/// The transport's validation ladder ("Server Validation"), first failure wins:
/// `_meta` carries the required protocol version and client capabilities (-32602);
/// `MCP-Protocol-Version` equals `_meta`'s version, `Mcp-Method` the method and, on a
/// `tools/call`, `Mcp-Name` the tool name, after decoding (-32020); the version is one this
/// server speaks (-32022). Every refusal is HTTP 400 with a JSON-RPC error body, which is what a
/// dual-era client reads to stay on this revision instead of falling back to `initialize`.
pub(crate) fn validate(
    headers: &HeaderMap,
    method: Option<&str>,
    params: Option<&Value>,
    meta: Option<&RequestMeta>,
) -> Result<Modern, Box<Rejection>> {
    let invalid = |m: String| reject(super::code::INVALID_PARAMS, "missing_request_meta", m);
    let Some(m) = meta else {
        return Err(invalid(format!(
            "Invalid params: `params._meta` must be an object carrying `{META_VERSION}` and `{META_CAPABILITIES}`"
        )));
    };
    let missing: Vec<&str> = [
        (META_VERSION, m.version.is_some()),
        (META_CAPABILITIES, m.capabilities.is_some()),
    ]
    .into_iter()
    .filter_map(|(k, present)| (!present).then_some(k))
    .collect();
    if !missing.is_empty() {
        return Err(invalid(format!(
            "Invalid params: `params._meta` is missing {}",
            missing.join(" and ")
        )));
    }
    if m.capabilities != Some(true) {
        return Err(invalid(format!(
            "Invalid params: `_meta.{META_CAPABILITIES}` must be an object"
        )));
    }
    let mismatch = |m: String| reject(code::HEADER_MISMATCH, "header_mismatch", m);
    let Some(declared) = m.version.as_ref().and_then(Text::as_str) else {
        return Err(invalid(format!(
            "Invalid params: `_meta.{META_VERSION}` must be a string"
        )));
    };
    match single(headers, &super::VERSION_HEADER)? {
        None => {
            return Err(mismatch(
                "Header mismatch: MCP-Protocol-Version is required and must equal `_meta` protocolVersion".into(),
            ))
        }
        Some(h) if h != declared.as_bytes() => {
            return Err(mismatch(format!(
                "Header mismatch: MCP-Protocol-Version `{}` does not match `_meta` protocolVersion `{}`",
                String::from_utf8_lossy(h).chars().take(64).collect::<String>(),
                declared.chars().take(64).collect::<String>()
            )))
        }
        Some(_) => {}
    }
    let method = method.unwrap_or("");
    match single(headers, &METHOD_HEADER)? {
        Some(h) if h == method.as_bytes() => {}
        Some(h) => {
            return Err(mismatch(format!(
                "Header mismatch: Mcp-Method `{}` does not match the body's method `{}`",
                String::from_utf8_lossy(h).chars().take(64).collect::<String>(),
                method.chars().take(64).collect::<String>()
            )))
        }
        None => {
            return Err(mismatch(format!(
                "Header mismatch: Mcp-Method is required (the body's method is `{}`)",
                method.chars().take(64).collect::<String>()
            )))
        }
    }
    if method == "tools/call" {
        let body_name = params.and_then(|p| p.get("name")).and_then(Value::as_str);
        if let Some(name) = body_name {
            match single(headers, &NAME_HEADER)? {
                None => return Err(mismatch("Header mismatch: Mcp-Name is required on tools/call".into())),
                Some(raw) => match decode_header_value(raw) {
                    None => {
                        return Err(mismatch(
                            "Header mismatch: Mcp-Name is neither visible ASCII nor a valid `=?base64?…?=` value"
                                .into(),
                        ))
                    }
                    Some(h) if h != name => {
                        return Err(mismatch(format!(
                            "Header mismatch: Mcp-Name `{}` does not match the body's tool name `{}`",
                            h.chars().take(128).collect::<String>(),
                            name.chars().take(128).collect::<String>()
                        )))
                    }
                    Some(_) => {}
                },
            }
        }
    }
    let Some(version) = SUPPORTED_PROTOCOL_VERSIONS
        .iter()
        .copied()
        .find(|v| *v == declared && !LEGACY_PROTOCOL_VERSIONS.contains(v))
    else {
        return Err(unsupported_version(declared));
    };
    let field = |t: &Option<Text>| {
        t.as_ref()
            .and_then(Text::as_str)
            .map(|s| super::prefix(s, 128).to_owned())
    };
    let trace = m
        .traceparent
        .as_ref()
        .and_then(Text::as_str)
        .and_then(TraceContext::continuing)
        .map(|t| {
            let state = m
                .tracestate
                .as_ref()
                .and_then(Text::as_str)
                .filter(|s| !s.is_empty() && s.len() <= 512 && s.bytes().all(|b| (0x20..0x7f).contains(&b)))
                .map(str::to_string);
            (t, state)
        });
    Ok(Modern {
        version,
        client: ClientInfo {
            name: field(&m.client_info.name),
            version: field(&m.client_info.version),
        },
        trace,
    })
}

/// The server's identity, as `_meta` serverInfo (and discover's `serverInfo`).
pub fn server_info(rt: &Runtime) -> Value {
    json!({"name": rt.config.server.name, "title": "Toolgate", "version": env!("CARGO_PKG_VERSION")})
}

/// The `server/discover` result.
pub fn discover(rt: &Runtime) -> Value {
    let mut result = json!({
        "supportedVersions": SUPPORTED_PROTOCOL_VERSIONS,
        "capabilities": {"tools": {"listChanged": true}},
        // Drafts of the revision put serverInfo here; the schema puts it in `_meta` (both sent).
        "serverInfo": server_info(rt),
        "ttlMs": rt.config.server.list_ttl_ms,
        "cacheScope": "public",
    });
    if let Some(i) = &rt.config.server.instructions {
        result["instructions"] = json!(i);
    }
    result
}

/// Adds `resultType: complete` and the server's identity to a result object.
pub fn complete(result: &mut Value, rt: &Runtime) {
    if let Value::Object(m) = result {
        m.insert("resultType".into(), "complete".into());
        let meta = m.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(meta) = meta {
            meta.insert(META_SERVER_INFO.into(), server_info(rt));
        }
    }
}

/// The members [`complete_raw`] puts first in a result, as JSON text without the closing brace:
/// built once per config generation, not per call.
pub fn result_head(server_name: &str) -> String {
    let info = json!({"name": server_name, "title": "Toolgate", "version": env!("CARGO_PKG_VERSION")});
    let mut head = json!({"resultType": "complete", "_meta": {META_SERVER_INFO: info}}).to_string();
    head.pop();
    head
}

/// [`complete`] for a result already serialized as a JSON object (a tool result).
pub fn complete_raw(result: &[u8], rt: &Runtime) -> Vec<u8> {
    let Some(rest) = result.strip_prefix(b"{") else {
        return result.to_vec();
    };
    let head = rt.modern_result_head.as_bytes();
    let mut out = Vec::with_capacity(head.len() + result.len() + 1);
    out.extend_from_slice(head);
    if rest.trim_ascii_start() != b"}" {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    out
}

/// The 2026-07-28 methods. Results are completed with `resultType` and the server's identity;
/// methods this revision removed (`initialize`, `ping`, `logging/setLevel`) or this server does
/// not offer are 404 with -32601, as the transport requires.
pub(crate) async fn serve(
    shared: &Arc<Shared>,
    rt: &Arc<Runtime>,
    caller: &Caller,
    m: Modern,
    req: Incoming<'_>,
    info: &mut RequestInfo,
) -> Response<Body> {
    metrics::METRICS.protocol(m.version);
    info.version = Some(m.version);
    // Notifications (cancellation is closing the stream) and responses: nothing to answer.
    let (Some(method), Some(id)) = (req.method, req.id) else {
        return empty(StatusCode::ACCEPTED);
    };
    let peer = Peer {
        version: m.version,
        session: None,
        client: m.client,
    };
    let mut reply = match method {
        "server/discover" => Reply::Result(discover(rt)),
        "tools/list" => tools_list(rt, &peer, &caller.identity, req.params),
        "tools/call" => match req.audit {
            Some(mut a) => {
                a.set_peer(&peer);
                call::tools_call(shared, rt, &peer, caller, id, req.params, a).await
            }
            None => Reply::error(rpc::INTERNAL_ERROR, "Internal error"),
        },
        "subscriptions/listen" => {
            if shared.draining.load(Ordering::Relaxed) {
                return rpc_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Some(id),
                    rpc::INTERNAL_ERROR,
                    "Service Unavailable: this replica is shutting down; listen again",
                    None,
                );
            }
            return subscriptions::listen(shared, rt, caller, req.headers, id, req.params);
        }
        _ => {
            info.method_name = None;
            return rpc_error(
                StatusCode::NOT_FOUND,
                Some(id),
                rpc::METHOD_NOT_FOUND,
                format!(
                    "Method not found: `{}` is not a {} method this server offers",
                    method.chars().take(64).collect::<String>(),
                    m.version
                ),
                None,
            );
        }
    };
    match &mut reply {
        Reply::Result(v) => complete(v, rt),
        Reply::RawResult { json, .. } => *json = complete_raw(json, rt),
        Reply::Http(_) | Reply::Error { .. } => {}
    }
    reply.into_response(id)
}

#[cfg(test)]
mod tests {
    use super::super::message::{parse, Message, Parsed};
    use super::*;
    use http::HeaderValue;
    use serde_json::Map;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn call(name: &str) -> Map<String, Value> {
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": {},
            "_meta": {META_VERSION: "2026-07-28", META_CAPABILITIES: {}, META_CLIENT_INFO: {"name": "c", "version": "1"}}}})
        .as_object()
        .unwrap()
        .clone()
    }

    fn good(name: &str) -> Vec<(&'static str, String)> {
        vec![
            ("mcp-protocol-version", "2026-07-28".into()),
            ("mcp-method", "tools/call".into()),
            ("mcp-name", name.into()),
        ]
    }

    /// `msg` as the endpoint reads it from a body.
    fn read<Out>(msg: &Map<String, Value>, f: impl FnOnce(&Message) -> Out) -> Out {
        let body = serde_json::to_vec(msg).unwrap();
        let Ok(Parsed::Message(m)) = parse(&body) else {
            panic!("a message")
        };
        f(&m)
    }

    fn run(h: &[(&'static str, String)], msg: &Map<String, Value>) -> Result<Modern, Box<Rejection>> {
        let pairs: Vec<(&'static str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        read(msg, |m| {
            validate(&headers(&pairs), m.method_str(), m.params.as_ref(), m.meta.as_ref())
        })
    }

    #[test]
    fn a_request_whose_headers_agree_with_its_body_passes() {
        let m = run(&good("get_x"), &call("get_x")).unwrap();
        assert_eq!(m.version, "2026-07-28");
        assert_eq!(m.client.name.as_deref(), Some("c"));
    }

    #[test]
    fn each_disagreement_is_a_header_mismatch() {
        let msg = call("get_x");
        let mut cases: Vec<Vec<(&'static str, String)>> = Vec::new();
        for drop in 0..3 {
            let mut h = good("get_x");
            h.remove(drop);
            cases.push(h);
        }
        for (i, v) in [(0, "2025-11-25"), (1, "tools/list"), (2, "get_y"), (2, "GET_X")] {
            let mut h = good("get_x");
            h[i].1 = v.into();
            cases.push(h);
        }
        let mut twice = good("get_x");
        twice.push(("mcp-name", "get_x".into()));
        cases.push(twice);
        for h in cases {
            let r = run(&h, &msg).unwrap_err();
            assert_eq!(
                (r.status, r.code),
                (StatusCode::BAD_REQUEST, -32020),
                "{h:?}: {}",
                r.message
            );
        }
    }

    #[test]
    fn the_base64_sentinel_is_decoded_before_comparing() {
        let name = "café tool";
        let encoded = format!("=?base64?{}?=", STANDARD.encode(name));
        assert!(run(&good(&encoded), &call(name)).is_ok());
        // Not canonical, not base64, not UTF-8, or the markers in the wrong case: refused.
        for bad in [
            "=?base64?Y2FmZQ?=",
            "=?base64?***?=",
            "=?base64?/w==?=",
            "=?BASE64?Z2V0X3g=?=",
        ] {
            let r = run(&good(bad), &call("get_x")).unwrap_err();
            assert_eq!(r.code, -32020, "{bad}");
        }
        assert_eq!(decode_header_value(b"=?base64?Z2V0X3g=?=").as_deref(), Some("get_x"));
    }

    #[test]
    fn missing_meta_is_invalid_params_and_an_unknown_version_names_the_supported_ones() {
        let mut msg = call("get_x");
        msg["params"]["_meta"]
            .as_object_mut()
            .unwrap()
            .remove(META_CAPABILITIES);
        let r = run(&good("get_x"), &msg).unwrap_err();
        assert_eq!((r.status, r.code), (StatusCode::BAD_REQUEST, -32602));
        let mut msg = call("get_x");
        msg["params"]["_meta"][META_VERSION] = json!("2027-01-01");
        let mut h = good("get_x");
        h[0].1 = "2027-01-01".into();
        let r = run(&h, &msg).unwrap_err();
        assert_eq!((r.status, r.code), (StatusCode::BAD_REQUEST, -32022));
        assert_eq!(r.data.unwrap()["requested"], "2027-01-01");
    }

    fn is_modern_msg(h: &HeaderMap, msg: &Map<String, Value>) -> bool {
        read(msg, |m| is_modern(h, m.method_str(), m.meta.as_ref()))
    }

    #[test]
    fn legacy_requests_stay_legacy_and_modern_ones_are_recognised() {
        let init = json!({"method": "initialize", "params": {"protocolVersion": "2025-06-18"}});
        assert!(!is_modern_msg(&HeaderMap::new(), init.as_object().unwrap()));
        assert!(!is_modern_msg(
            &headers(&[("mcp-protocol-version", "2025-06-18")]),
            &call("x")
        ));
        assert!(is_modern_msg(
            &headers(&[("mcp-protocol-version", "2026-07-28")]),
            &call("x")
        ));
        assert!(is_modern_msg(
            &headers(&[("mcp-protocol-version", "2099-01-01")]),
            &call("x")
        ));
        assert!(
            is_modern_msg(&HeaderMap::new(), &call("x")),
            "a modern body without its header"
        );
    }

    #[test]
    fn results_are_completed_in_place_or_as_text() {
        let config = toolgate_config::parse_yaml(
            "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://127.0.0.1:1'}\ntools: []\n",
        )
        .unwrap();
        let rt = Runtime::compile(config, 1).unwrap();
        let raw = complete_raw(br#"{"content":[],"isError":false}"#, &rt);
        let v: Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!(v["resultType"], "complete");
        assert_eq!(v["_meta"][META_SERVER_INFO]["name"], "toolgate");
        assert_eq!(v["isError"], false);
        let v: Value = serde_json::from_slice(&complete_raw(b"{}", &rt)).unwrap();
        assert_eq!(v["resultType"], "complete");
        let mut r = json!({"tools": []});
        complete(&mut r, &rt);
        assert_eq!(r["resultType"], "complete");
    }
}
