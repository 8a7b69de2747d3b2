//! MCP over Streamable HTTP: one JSON-RPC message per POST, JSON responses (no server stream),
//! sessions, version negotiation, Origin checks and the `tools/*` methods.

mod admit;
pub mod args;
pub mod body;
pub mod call;
pub mod cancel;
mod legacy;
pub mod modern;
pub mod peek;
mod refused;
pub mod sealed;
pub mod session;
pub mod subscriptions;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, HOST, ORIGIN};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use toolgate_config::BusinessStatus;

use crate::audit::Auditor;
use crate::envelope::{self, ErrorEntry, Outcome};
use crate::metrics;
use crate::otel;
use crate::policy::ratelimit::Limiter;
use crate::policy::{clientip, Identity};
use crate::runtime::{CompiledTool, Runtime};
use crate::trace::TraceContext;
use call::CallAudit;
use refused::{audit_unparsed, body_refusal, header_refusal, refuse_unread, throttled, BODY_TIMEOUT};
use session::{Session, Sessions};

pub use body::Body;

/// `Mcp-Session-Id`.
pub const SESSION_HEADER: &str = "mcp-session-id";
/// `MCP-Protocol-Version`.
pub const VERSION_HEADER: &str = "mcp-protocol-version";
/// The first version whose invalid-argument errors are tool results (SEP-1303).
const TOOL_ERROR_VERSION: &str = "2025-11-25";

/// JSON-RPC error codes.
pub mod code {
    /// Invalid JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// Not a valid JSON-RPC request (including batches).
    pub const INVALID_REQUEST: i64 = -32600;
    /// Unknown method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid params, unknown tool, invalid arguments (up to 2025-06-18).
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Unknown or expired session.
    pub const SESSION_NOT_FOUND: i64 = -32001;
    /// Authentication required or refused (with HTTP 401/403). Outside -32768..-32000, which
    /// JSON-RPC and MCP reserve (2026-07-28 forbids undefined codes in -32020..-32099 and retired
    /// -32002).
    pub const UNAUTHORIZED: i64 = -31001;
    /// Over a rate limit (with HTTP 429 and `Retry-After`).
    pub const RATE_LIMITED: i64 = -31029;
    /// A 2025-era read call its session cancelled with `notifications/cancelled` (the client
    /// ignores the answer; the code is LSP's, outside the reserved range).
    pub const REQUEST_CANCELLED: i64 = -32800;
}

/// State shared by every connection.
pub struct Shared {
    /// The live config generation.
    pub runtime: ArcSwap<Runtime>,
    /// In-memory MCP sessions (without `server.sessionKeyFile`).
    pub sessions: Sessions,
    /// Sealed sessions ended here (the shared store tells the other replicas).
    pub revoked: session::Revoked,
    /// The shared store, when configured (replaced when its settings change).
    pub store: arc_swap::ArcSwapOption<crate::store::Store>,
    /// Set on SIGTERM: readiness fails while in-flight calls drain.
    pub draining: AtomicBool,
    /// Rate limiters; their state survives reloads.
    pub limiters: Limiters,
    /// The audit pipeline (replaced when the audit settings change).
    pub auditor: ArcSwap<Auditor>,
    /// Upstream calls in flight (they outlive a client that goes away).
    pub in_flight: Arc<InFlight>,
    /// Slots for validating large argument objects off the runtime's workers (one per CPU, at
    /// most [`call::MAX_VALIDATION_SLOTS`]).
    pub validation_slots: Arc<tokio::sync::Semaphore>,
    /// Open `subscriptions/listen` streams, woken by reloads and ended on drain.
    pub subscriptions: subscriptions::Subscriptions,
    /// 2025-era read calls in flight that `notifications/cancelled` may abort.
    pub cancels: cancel::Cancels,
}

/// A count of running upstream calls, waited for on shutdown.
#[derive(Default)]
pub struct InFlight {
    count: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// Held while an upstream call runs.
pub struct InFlightGuard(Arc<InFlight>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl InFlight {
    /// Calls running now.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Counts one call until the returned guard drops.
    pub fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(Arc::clone(self))
    }

    /// Waits until no call is in flight, or `timeout`; whether it got there.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.count.load(Ordering::SeqCst) == 0;
            }
        }
    }
}

/// The three limiters.
pub struct Limiters {
    /// Per client IP, before authentication.
    pub ip: Limiter,
    /// Per identity (`tools/call`).
    pub identity: Limiter,
    /// Per identity and tool.
    pub tool: Limiter,
}

impl Shared {
    /// Shared state serving `runtime` (starts the audit writer: call inside a Tokio runtime).
    pub fn new(runtime: Runtime) -> Self {
        let max = runtime.limits.max_keys;
        let auditor = Auditor::start(&runtime.config.policy.audit);
        let shared = Self {
            runtime: ArcSwap::from_pointee(runtime),
            sessions: Sessions::default(),
            revoked: session::Revoked::default(),
            store: arc_swap::ArcSwapOption::empty(),
            draining: AtomicBool::new(false),
            limiters: Limiters {
                ip: Limiter::new(max),
                identity: Limiter::new(max),
                tool: Limiter::new(max),
            },
            auditor: ArcSwap::from_pointee(auditor),
            in_flight: Arc::default(),
            validation_slots: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism()
                    .map_or(1, usize::from)
                    .min(call::MAX_VALIDATION_SLOTS),
            )),
            subscriptions: subscriptions::Subscriptions::default(),
            cancels: cancel::Cancels::default(),
        };
        shared.adopt_store(&shared.runtime.load());
        shared
    }

    /// Applies the settings of a new generation that live outside it (limiter caps, audit
    /// sink, shared store).
    pub fn adopt(&self, rt: &Runtime) {
        for l in [&self.limiters.ip, &self.limiters.identity, &self.limiters.tool] {
            l.set_max_keys(rt.limits.max_keys);
        }
        if self.auditor.load().config != rt.config.policy.audit {
            self.auditor.store(Arc::new(Auditor::start(&rt.config.policy.audit)));
        }
        self.adopt_store(rt);
    }

    /// Connects to the generation's shared store unless already connected with its settings.
    fn adopt_store(&self, rt: &Runtime) {
        let current = self.store.load();
        if current.as_ref().map(|s| &s.settings) == rt.store.as_ref() {
            return;
        }
        match &rt.store {
            None => {
                crate::metrics::METRICS.store_up.set(0);
                self.store.store(None);
            }
            Some(settings) => match crate::store::Store::connect(settings.clone()) {
                Ok(s) => self.store.store(Some(Arc::new(s))),
                Err(e) => {
                    // The URL was checked when the generation compiled; keep the old store.
                    tracing::error!(error = %e, "the shared store cannot be used; the previous settings stay");
                }
            },
        }
    }
}

fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut resp = Response::new(Body::new(Bytes::from(serde_json::to_vec(body).unwrap_or_default())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

fn rpc_error(
    status: StatusCode,
    id: Option<&Value>,
    code: i64,
    message: impl Into<String>,
    data: Option<Value>,
) -> Response<Body> {
    let mut error = json!({"code": code, "message": message.into()});
    if let Some(d) = data {
        error["data"] = d;
    }
    let mut resp = json_response(
        status,
        &json!({"jsonrpc": "2.0", "id": id.cloned().unwrap_or(Value::Null), "error": error}),
    );
    resp.extensions_mut().insert(RpcCode(code));
    resp
}

/// The JSON-RPC error code of a response, for the requests metric.
#[derive(Clone, Copy)]
struct RpcCode(i64);

fn empty(status: StatusCode) -> Response<Body> {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = status;
    resp
}

/// Result of a JSON-RPC request handler.
pub(crate) enum Reply {
    Result(Value),
    /// A result already serialized as JSON text; `tool_error` when it is a tool result with
    /// `isError: true`.
    RawResult {
        json: String,
        tool_error: bool,
    },
    /// A complete HTTP response (rate limiting).
    Http(Response<Body>),
    Error {
        code: i64,
        message: String,
        data: Option<Value>,
    },
}

impl Reply {
    fn error(code: i64, message: impl Into<String>) -> Self {
        Reply::Error {
            code,
            message: message.into(),
            data: None,
        }
    }

    fn into_response(self, id: &Value) -> Response<Body> {
        match self {
            Reply::Result(result) => {
                json_response(StatusCode::OK, &json!({"jsonrpc": "2.0", "id": id, "result": result}))
            }
            Reply::RawResult {
                json: result,
                tool_error,
            } => {
                let id = serde_json::to_string(id).unwrap_or_else(|_| "null".into());
                let mut body = String::with_capacity(result.len() + id.len() + 32);
                body.push_str(r#"{"jsonrpc":"2.0","id":"#);
                body.push_str(&id);
                body.push_str(r#","result":"#);
                body.push_str(&result);
                body.push('}');
                let mut resp = Response::new(Body::new(Bytes::from(body)));
                resp.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if tool_error {
                    resp.extensions_mut().insert(ToolError);
                }
                resp
            }
            Reply::Error { code, message, data } => rpc_error(StatusCode::OK, Some(id), code, message, data),
            Reply::Http(resp) => resp,
        }
    }
}

/// Serves one HTTP request on the MCP listener.
pub async fn handle(shared: Arc<Shared>, req: Request<hyper::body::Incoming>, peer: SocketAddr) -> Response<Body> {
    let mut record = RequestRecord {
        start: otel::now_nanos(),
        info: RequestInfo {
            method: "unknown",
            method_name: None,
            trace: TraceContext::from_header(header_str(req.headers(), "traceparent")),
            trace_state: None,
            rpc_id: None,
            tool: None,
            session: header_str(req.headers(), SESSION_HEADER).map(|s| s.chars().take(128).collect()),
            version: None,
            http_version: match req.version() {
                http::Version::HTTP_10 => "1.0",
                http::Version::HTTP_2 => "2",
                _ => "1.1",
            },
            client: peer,
        },
        done: false,
    };
    if otel::enabled() {
        record.info.trace_state = header_str(req.headers(), "tracestate").map(|s| s.chars().take(512).collect());
    }
    let resp = serve(shared, req, peer, &mut record.info).await;
    let tool_error = resp.extensions().get::<ToolError>().is_some();
    record.finish(
        resp.status(),
        resp.extensions().get::<RpcCode>().map(|c| c.0),
        tool_error,
    );
    resp
}

/// Marks a tools/call response whose result has `isError: true`.
#[derive(Clone, Copy)]
struct ToolError;

/// Counts the request, records its duration and ends its span exactly once: when the response
/// is ready, or (the client went away and the handler was dropped) on drop, as `client_gone`.
struct RequestRecord {
    start: u64,
    info: RequestInfo,
    done: bool,
}

/// How a request ended, in the MCP conventions' terms.
struct Ending {
    status: Option<StatusCode>,
    rpc_code: Option<i64>,
    /// `None` when the operation succeeded.
    error: Option<Failure>,
}

/// Why an operation failed (`error.type`).
#[derive(Clone, Copy)]
enum Failure {
    /// A JSON-RPC error response.
    Rpc(i64),
    /// An HTTP refusal.
    Http(StatusCode),
    /// A tool result with `isError: true`.
    Tool,
    /// The client went away before the response.
    ClientGone,
}

impl Failure {
    /// The `error.type` value (bounded: codes and statuses come from the proxy).
    fn kind(self) -> std::borrow::Cow<'static, str> {
        match self {
            Failure::Rpc(c) => metrics::rpc_code_label(c).into(),
            Failure::Http(s) => s.as_u16().to_string().into(),
            Failure::Tool => "tool_error".into(),
            Failure::ClientGone => "client_gone".into(),
        }
    }

    /// The span status description.
    fn message(self) -> String {
        match self {
            Failure::Rpc(c) => format!("JSON-RPC error {c}"),
            Failure::Http(s) => format!("HTTP {s}"),
            Failure::Tool => "the tool result has isError: true".into(),
            Failure::ClientGone => "the client went away before the response".into(),
        }
    }
}

impl RequestRecord {
    fn finish(&mut self, status: StatusCode, rpc_code: Option<i64>, tool_error: bool) {
        self.done = true;
        // Refusals are labelled by their HTTP status; JSON-RPC errors in a 200 by their code.
        let code = match rpc_code {
            _ if status != StatusCode::OK && status != StatusCode::ACCEPTED => status.as_str(),
            Some(c) => metrics::rpc_code_label(c),
            None => "ok",
        };
        metrics::METRICS
            .requests
            .with_label_values(&[self.info.method, code])
            .inc();
        let error = match rpc_code {
            Some(c) => Some(Failure::Rpc(c)),
            None if !status.is_success() => Some(Failure::Http(status)),
            None if tool_error => Some(Failure::Tool),
            None => None,
        };
        self.end(Ending {
            status: Some(status),
            rpc_code,
            error,
        });
    }

    fn end(&self, ending: Ending) {
        operation_metrics(&self.info, self.start, &ending);
        if otel::enabled() && self.info.trace.sampled() {
            server_span(&self.info, self.start, ending);
        }
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        metrics::METRICS
            .requests
            .with_label_values(&[self.info.method, "client_gone"])
            .inc();
        self.end(Ending {
            status: None,
            rpc_code: None,
            error: Some(Failure::ClientGone),
        });
    }
}

/// What a request turned out to be, for its metrics and its span.
pub(crate) struct RequestInfo {
    /// Bounded label value.
    method: &'static str,
    /// The method as sent (for the span attribute), when it is a string.
    method_name: Option<String>,
    trace: TraceContext,
    /// The client's `tracestate` (only while spans are exported).
    trace_state: Option<String>,
    rpc_id: Option<String>,
    tool: Option<String>,
    session: Option<String>,
    /// The protocol version the request was served under, once known.
    pub(crate) version: Option<&'static str>,
    /// `network.protocol.version`.
    http_version: &'static str,
    /// The TCP peer (`client.address`, `client.port`).
    client: SocketAddr,
}

/// `mcp.server.operation.duration`, on `/metrics` and (when exported) over OTLP. A request
/// that never named a method (unparseable, refused before its body was read) or a `DELETE`
/// (the transport's, not a JSON-RPC method) is no MCP operation and is not recorded here;
/// `toolgate_mcp_requests_total` counts it.
fn operation_metrics(info: &RequestInfo, start: u64, ending: &Ending) {
    if info.method == "unknown" || info.method == "DELETE" {
        return;
    }
    let seconds = otel::now_nanos().saturating_sub(start) as f64 / 1e9;
    let tool = info.tool.as_deref().filter(|_| info.method == "tools/call");
    let kind = ending.error.map(Failure::kind);
    let error = kind.as_deref();
    let rpc_code = ending.rpc_code.map(metrics::rpc_code_label);
    metrics::METRICS
        .mcp_operation_duration
        .with_label_values(&[
            info.method,
            tool.unwrap_or(""),
            if tool.is_some() { "execute_tool" } else { "" },
            error.unwrap_or(""),
            rpc_code.unwrap_or(""),
            info.version.unwrap_or(""),
        ])
        .observe(seconds);
    if otel::metrics_enabled() {
        let mut attributes = vec![
            otel::KeyValue::new("mcp.method.name", info.method),
            otel::KeyValue::new("network.transport", "tcp"),
            otel::KeyValue::new("network.protocol.name", "http"),
            otel::KeyValue::new("network.protocol.version", info.http_version),
        ];
        if let Some(tool) = tool {
            attributes.push(otel::KeyValue::new("gen_ai.tool.name", tool.to_string()));
            attributes.push(otel::KeyValue::new("gen_ai.operation.name", "execute_tool"));
        }
        if let Some(e) = error {
            attributes.push(otel::KeyValue::new("error.type", e.to_string()));
        }
        if let Some(c) = rpc_code {
            attributes.push(otel::KeyValue::new("rpc.response.status_code", c));
        }
        if let Some(v) = info.version {
            attributes.push(otel::KeyValue::new("mcp.protocol.version", v));
        }
        otel::operation_duration(seconds, &attributes);
    }
}

/// The request's span, following OpenTelemetry's MCP conventions: named
/// `{mcp.method.name} {gen_ai.tool.name}` (the method as the bounded metric label, so a
/// client cannot mint span names), with their required and recommended attributes.
fn server_span(info: &RequestInfo, start: u64, ending: Ending) {
    use otel::KeyValue;
    let method = info.method_name.as_deref().unwrap_or(info.method);
    let mut attributes = vec![
        KeyValue::new("mcp.method.name", method.to_string()),
        KeyValue::new("network.transport", "tcp"),
        KeyValue::new("network.protocol.name", "http"),
        KeyValue::new("network.protocol.version", info.http_version),
        KeyValue::new("client.address", info.client.ip().to_string()),
        KeyValue::new("client.port", i64::from(info.client.port())),
    ];
    if let Some(status) = ending.status {
        attributes.push(KeyValue::new("http.response.status_code", i64::from(status.as_u16())));
    }
    let mut name = info.method.to_string();
    if let Some(tool) = &info.tool {
        attributes.push(KeyValue::new("gen_ai.tool.name", tool.clone()));
        attributes.push(KeyValue::new("gen_ai.operation.name", "execute_tool"));
        name = format!("{name} {tool}");
    }
    if let Some(id) = &info.rpc_id {
        attributes.push(KeyValue::new("jsonrpc.request.id", id.clone()));
    }
    if let Some(sid) = &info.session {
        attributes.push(KeyValue::new("mcp.session.id", sid.clone()));
    }
    if let Some(v) = info.version {
        attributes.push(KeyValue::new("mcp.protocol.version", v));
    }
    if let Some(c) = ending.rpc_code {
        attributes.push(KeyValue::new("rpc.response.status_code", c.to_string()));
    }
    let error = ending.error.map(|f| {
        attributes.push(KeyValue::new("error.type", f.kind()));
        f.message()
    });
    otel::record(otel::Span {
        trace_id: info.trace.trace_id,
        span_id: info.trace.span_id,
        parent: info.trace.parent_id,
        trace_state: info.trace_state.clone(),
        name,
        kind: otel::Kind::Server,
        start,
        end: otel::now_nanos(),
        attributes,
        error,
    });
}

async fn serve(
    shared: Arc<Shared>,
    req: Request<hyper::body::Incoming>,
    peer: SocketAddr,
    info: &mut RequestInfo,
) -> Response<Body> {
    let rt = shared.runtime.load_full();
    if let Some((doc, paths)) = rt.auth.resource_metadata() {
        if req.method() == Method::GET && paths.contains(&req.uri().path()) {
            return json_response(StatusCode::OK, &doc);
        }
    }
    if req.uri().path() != rt.config.server.path {
        return json_response(
            StatusCode::NOT_FOUND,
            &json!({"error": format!("not found: the MCP endpoint is {}", rt.config.server.path)}),
        );
    }
    // DNS-rebinding and cross-site refusals. A refused POST may be a tools/call (the attack
    // case): the start of its body is read so that it leaves its audit record.
    let origin = req.headers().get(ORIGIN).cloned();
    let refusal = if !host_allowed(&rt, req.headers()) {
        Some((
            "host_not_allowed",
            "Forbidden: this Host is not served here (DNS-rebinding protection; see server.allowedHosts)",
        ))
    } else if origin.as_ref().is_some_and(|o| !origin_allowed(&rt, o, req.headers())) {
        Some(("origin_not_allowed", "Forbidden: this Origin is not allowed"))
    } else {
        None
    };
    if let Some((reason, message)) = refusal {
        if req.method() == Method::POST {
            let (parts, body) = req.into_parts();
            let ip = client_ip(&rt, &parts, peer);
            refuse_unread(&shared, body, ip, "denied", reason, info).await;
        }
        return rpc_error(StatusCode::FORBIDDEN, None, code::INVALID_REQUEST, message, None);
    }
    let mut resp = match *req.method() {
        Method::POST => post(&shared, &rt, req, peer, info).await,
        Method::DELETE => {
            info.method = "DELETE";
            legacy::delete(&shared, &rt, req, peer, info.trace).await
        }
        Method::OPTIONS if origin.is_some() => preflight(),
        _ => {
            let mut r = rpc_error(
                StatusCode::METHOD_NOT_ALLOWED,
                None,
                code::INVALID_REQUEST,
                "Method not allowed: POST JSON-RPC messages; this server offers no SSE stream",
                None,
            );
            r.headers_mut()
                .insert(http::header::ALLOW, HeaderValue::from_static("POST, DELETE"));
            r
        }
    };
    if let Some(o) = origin {
        let h = resp.headers_mut();
        h.insert(http::header::ACCESS_CONTROL_ALLOW_ORIGIN, o);
        h.insert(
            http::header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("mcp-session-id, mcp-protocol-version"),
        );
        h.insert(http::header::VARY, HeaderValue::from_static("Origin"));
    }
    resp
}

fn preflight() -> Response<Body> {
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
fn host_allowed(rt: &Runtime, headers: &HeaderMap) -> bool {
    let Some(allowed) = &rt.allowed_hosts else { return true };
    let Some(host) = headers.get(HOST).and_then(|h| h.to_str().ok()).map(host_name) else {
        return false;
    };
    allowed.contains(&host) || (rt.config.server.allowed_hosts.is_empty() && is_loopback_name(&host))
}

/// DNS-rebinding protection, part two: a browser Origin must be allowlisted, or be a loopback
/// origin when no allowlist is configured.
fn origin_allowed(rt: &Runtime, origin: &HeaderValue, _headers: &HeaderMap) -> bool {
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

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A unique id for each HTTP request: a random process prefix and a counter.
fn next_request_id() -> String {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| session::new_id()[..12].to_string());
    format!("{prefix}-{}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// An authenticated caller.
pub(crate) struct Caller {
    pub identity: Identity,
    pub ip: std::net::IpAddr,
    pub trace: TraceContext,
    /// The client's W3C `tracestate`, forwarded unchanged (at most 512 bytes, as the spec allows
    /// a receiver to truncate).
    pub tracestate: Option<String>,
    pub request_id: String,
    /// Size of the request body (large argument objects are validated off the workers).
    pub body_bytes: usize,
}

/// A request refused before it reached a method.
struct Refusal {
    response: Response<Body>,
    decision: &'static str,
    reason: &'static str,
}

fn rate_limited(id: Option<&Value>, scope: &'static str, retry: Duration) -> Response<Body> {
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

/// The address the per-IP limiter counts: IPv4 as is, IPv6 by its /64 (one host usually has a
/// whole /64, so counting single addresses would be no limit at all).
fn limiter_key(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let s = v6.segments();
            format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
        }
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or_else(|| v6.to_string(), |v4| v4.to_string()),
        v4 => v4.to_string(),
    }
}

/// The client's address (trusted proxies decide) for a request from `peer`.
fn client_ip(rt: &Runtime, parts: &http::request::Parts, peer: SocketAddr) -> std::net::IpAddr {
    let forwarded = parts
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>();
    clientip::client_ip(peer.ip(), forwarded.into_iter(), &rt.trusted_proxies)
}

/// Credentials in the query, then authentication (the per-IP throttle already ran).
async fn gate(
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
                    .map(|s| s.chars().take(200).collect());
            }
        }
    }
    Ok(Caller {
        identity,
        ip,
        trace,
        tracestate: header_str(&parts.headers, "tracestate")
            .filter(|v| !v.is_empty() && v.len() <= 512)
            .map(str::to_string),
        request_id: next_request_id(),
        body_bytes: 0,
    })
}

async fn post(
    shared: &Arc<Shared>,
    rt: &Arc<Runtime>,
    req: Request<hyper::body::Incoming>,
    peer: SocketAddr,
    info: &mut RequestInfo,
) -> Response<Body> {
    let server = &rt.config.server;
    let (parts, body) = req.into_parts();
    let headers = &parts.headers;
    // The pre-auth throttle comes first: a client over its limit gets nothing but the start of
    // its body read, to audit a throttled `tools/call`.
    let ip = client_ip(rt, &parts, peer);
    if let Err(retry) = shared.limiters.ip.check(&limiter_key(ip), rt.limits.per_ip) {
        return throttled(shared, body, ip, retry, info).await;
    }
    if let Some((resp, reason)) = header_refusal(headers, server.max_body_bytes) {
        refuse_unread(shared, body, ip, "invalid", reason, info).await;
        return resp;
    }
    let limit = server.max_body_bytes;
    let (body, end) = peek::read(body, usize::try_from(limit).unwrap_or(usize::MAX), BODY_TIMEOUT).await;
    if end != peek::BodyEnd::Complete {
        let (resp, reason) = body_refusal(end, limit);
        audit_unparsed(shared, &body, false, ip, "invalid", reason, info);
        return resp;
    }
    let msg: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            audit_unparsed(shared, &body, false, ip, "invalid", "parse_error", info);
            return rpc_error(
                StatusCode::BAD_REQUEST,
                None,
                code::PARSE_ERROR,
                format!("Parse error: {e}"),
                None,
            );
        }
    };
    let Value::Object(msg) = msg else {
        // A batch is refused whole; each tools/call in it still leaves its record.
        for m in msg.as_array().into_iter().flatten().filter_map(Value::as_object) {
            if m.get("method").and_then(Value::as_str) == Some("tools/call") {
                let params = m.get("params");
                let mut a = CallAudit::new(shared.auditor.load_full(), m.get("id").unwrap_or(&Value::Null), params);
                a.set_ip(ip);
                a.set_arguments(params, false);
                a.finish("invalid", "batch", None);
            }
        }
        let message = if msg.is_array() {
            "Invalid Request: JSON-RPC batches are not supported; send one message per request"
        } else {
            "Invalid Request: the body must be a JSON-RPC message object"
        };
        return rpc_error(StatusCode::BAD_REQUEST, None, code::INVALID_REQUEST, message, None);
    };
    let id = msg.get("id");
    let params = msg.get("params");
    if otel::enabled() {
        // Not for a null id (the conventions leave it out then).
        info.rpc_id = id.filter(|i| !i.is_null()).map(|i| match i {
            Value::String(s) => s.chars().take(128).collect(),
            other => other.to_string(),
        });
    }
    if msg.get("method").and_then(Value::as_str) == Some("tools/call") {
        // Only a tool of the config names a span or a metric series; anything else a client
        // sends does not.
        info.tool = params
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .filter(|n| rt.tool_index(n).is_some())
            .map(str::to_string);
    }
    // From here on a tools/call leaves exactly one audit record, whatever happens.
    let mut audit = (msg.get("method").and_then(Value::as_str) == Some("tools/call"))
        .then(|| CallAudit::new(shared.auditor.load_full(), id.unwrap_or(&Value::Null), params));
    if let Some(a) = audit.as_mut() {
        a.set_ip(ip);
    }
    let refuse = |audit, reason, resp| refuse_call(audit, params, reason, resp);
    let valid_id = matches!(id, None | Some(Value::String(_)) | Some(Value::Number(_)));
    let reply_id = id.filter(|_| valid_id);
    if msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        let r = rpc_error(
            StatusCode::BAD_REQUEST,
            reply_id,
            code::INVALID_REQUEST,
            "Invalid Request: `jsonrpc` must be \"2.0\"",
            None,
        );
        return refuse(audit, "invalid_request", r);
    }
    if !valid_id {
        let r = rpc_error(
            StatusCode::BAD_REQUEST,
            None,
            code::INVALID_REQUEST,
            "Invalid Request: `id` must be a string or a number",
            None,
        );
        return refuse(audit, "invalid_request", r);
    }
    let method = match msg.get("method") {
        Some(Value::String(m)) => {
            info.method = metrics::method_label(m);
            if otel::enabled() {
                info.method_name = Some(m.chars().take(64).collect());
            }
            Some(m.as_str())
        }
        Some(_) => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                reply_id,
                code::INVALID_REQUEST,
                "Invalid Request: `method` must be a string",
                None,
            )
        }
        None if msg.contains_key("result") || msg.contains_key("error") => None,
        None => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                reply_id,
                code::INVALID_REQUEST,
                "Invalid Request: `method` is missing",
                None,
            )
        }
    };

    // A tools/call without an id is a notification: nothing may answer it, so nothing runs; its
    // record says so (rather than that the client went away).
    if method == Some("tools/call") && id.is_none() {
        return refuse(audit, "notification", empty(StatusCode::ACCEPTED));
    }

    // A 2026-07-28 request is checked against its own headers before anything else decides on
    // it; its `_meta` trace context continues the client's trace.
    let modern = if modern::is_modern(headers, &msg) {
        match modern::validate(headers, &msg) {
            Ok(m) => {
                if let Some((t, state)) = &m.trace {
                    info.trace = *t;
                    if otel::enabled() {
                        info.trace_state = state.clone();
                    }
                }
                info.session = None;
                Some(m)
            }
            Err(rej) => {
                let rej = *rej;
                let r = rpc_error(rej.status, reply_id, rej.code, rej.message, rej.data);
                return refuse(audit, rej.reason, r);
            }
        }
    } else {
        None
    };
    let mut caller = match gate(rt, &parts, peer, ip, reply_id, info.trace).await {
        Ok(c) => c,
        Err(r) => {
            if let Some(mut a) = audit {
                a.set_arguments(params, false);
                a.finish(r.decision, r.reason, None);
            }
            return r.response;
        }
    };
    caller.body_bytes = body.len();
    // A `_meta` trace context replaces the header's, `tracestate` included (it belongs to it).
    if let Some((_, state)) = modern.as_ref().and_then(|m| m.trace.as_ref()) {
        caller.tracestate = state.clone();
    }
    if let Some(a) = audit.as_mut() {
        a.set_caller(&caller);
        a.set_arguments(params, true);
    }
    if params.is_some_and(|p| !p.is_object() && !p.is_null()) {
        return match id {
            Some(id) => refuse(
                audit,
                "invalid_params",
                Reply::error(code::INVALID_PARAMS, "Invalid params: `params` must be an object").into_response(id),
            ),
            None => empty(StatusCode::ACCEPTED),
        };
    }
    let request = Incoming {
        headers,
        method,
        id,
        params,
        audit,
    };
    match modern {
        Some(m) => modern::serve(shared, rt, &caller, m, request, info).await,
        None => legacy::serve(shared, rt, &caller, request, info).await,
    }
}

/// Answers a request refused before its method ran with `resp`; a `tools/call` among them
/// leaves its audit record (decision `invalid`, `reason`).
pub(crate) fn refuse_call(
    audit: Option<CallAudit>,
    params: Option<&Value>,
    reason: &'static str,
    resp: Response<Body>,
) -> Response<Body> {
    if let Some(mut a) = audit {
        a.set_arguments(params, false);
        a.finish("invalid", reason, None);
    }
    resp
}

/// A parsed JSON-RPC message, authenticated, on its way to a method.
pub(crate) struct Incoming<'a> {
    pub headers: &'a HeaderMap,
    /// `None` for a response the client sent.
    pub method: Option<&'a str>,
    /// `None` for a notification.
    pub id: Option<&'a Value>,
    pub params: Option<&'a Value>,
    /// The record of a `tools/call`.
    pub audit: Option<CallAudit>,
}

/// Who is on the other end, as far as the methods both eras share need to know.
pub(crate) struct Peer<'a> {
    /// The protocol version the request is served under.
    pub version: &'static str,
    /// The 2025-era session (none on 2026-07-28).
    pub session: Option<&'a Session>,
    /// `clientInfo`, from the session's initialize or the request's `_meta`.
    pub client: crate::audit::ClientInfo,
}

impl Peer<'_> {
    /// Whether the tools of role rank `rank` were in this caller's view: its session was
    /// opened at that rank or higher (only a session remembers; to a stateless caller a tool
    /// above its role stays hidden).
    pub fn was_shown_rank(&self, rank: usize) -> bool {
        self.session.is_some_and(|s| s.rank >= rank)
    }
}

/// The tools `who` may call, in config order.
pub(crate) fn visible<'a>(rt: &'a Runtime, who: &'a Identity) -> impl Iterator<Item = &'a CompiledTool> {
    let p = &rt.config.policy;
    rt.tools
        .iter()
        .filter(move |t| crate::policy::authorize(p, who, &t.config).is_ok())
}

pub(crate) fn tools_list(rt: &Runtime, peer: &Peer, who: &Identity, params: Option<&Value>) -> Reply {
    let page = rt.config.server.page_size;
    let tools: Vec<&CompiledTool> = visible(rt, who).collect();
    let start = match params.and_then(|p| p.get("cursor")) {
        None | Some(Value::Null) => 0,
        Some(Value::String(c)) => match c.strip_prefix("tg:").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if n > 0 && n < tools.len() => n,
            _ => {
                return Reply::error(
                    code::INVALID_PARAMS,
                    "Invalid params: unknown or stale `cursor`; list again from the start",
                )
            }
        },
        Some(_) => return Reply::error(code::INVALID_PARAMS, "Invalid params: `cursor` must be a string"),
    };
    let end = (start + page).min(tools.len());
    // The page is written as text from each tool's listing text.
    let page: &[&CompiledTool] = &tools[start..end];
    let mut out = String::with_capacity(page.iter().map(|t| t.listing.text_len() + 1).sum::<usize>() + 96);
    out.push_str(r#"{"tools":["#);
    for (i, t) in page.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        t.listing.write(&mut out);
    }
    out.push(']');
    if end < tools.len() {
        out.push_str(&format!(r#","nextCursor":"tg:{end}""#));
    }
    if peer.session.is_none() {
        // Every page carries the same hint. The list is the same for every caller only when
        // nobody authenticates (all are anonymous); otherwise it depends on who asks.
        let public = rt.config.policy.auth.mode == toolgate_config::AuthMode::None;
        out.push_str(&format!(
            r#","ttlMs":{},"cacheScope":"{}""#,
            rt.config.server.list_ttl_ms,
            if public { "public" } else { "private" }
        ));
    }
    out.push('}');
    Reply::RawResult {
        json: out,
        tool_error: false,
    }
}

fn finish(tool: &CompiledTool, outcome: &Outcome, started: Instant) -> Reply {
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let env = outcome.envelope_json(&tool.config.name, tool.safety.as_str(), ms);
    Reply::RawResult {
        json: envelope::call_result_json(&env, outcome.is_error()),
        tool_error: outcome.is_error(),
    }
}

/// The question an agent can put to its user when arguments are wrong: it names the fields
/// (at most three, in the order found) and says what is wrong with each.
fn correction_question(problems: &[ErrorEntry]) -> String {
    let mut fields: Vec<&str> = Vec::new();
    for f in problems
        .iter()
        .filter_map(|p| p.field.as_deref())
        .filter(|f| !f.is_empty())
    {
        if !fields.contains(&f) {
            fields.push(f);
        }
    }
    let what = problems
        .iter()
        .take(3)
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let named = |fs: &[&str]| fs.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>();
    match fields.as_slice() {
        [] => format!("Could you send the details again? {what}."),
        [one] => format!("Could you give me a valid {}? {what}.", named(&[one])[0]),
        many => {
            let mut names = named(&many[..many.len().min(3)]);
            let last = names.pop().unwrap_or_default();
            let more = if many.len() > 3 { ", among others" } else { "" };
            format!(
                "Could you give me valid values for {} and {last}{more}? {what}.",
                names.join(", ")
            )
        }
    }
}

/// Invalid arguments: a JSON-RPC -32602 up to 2025-06-18, a `needs_more_info` tool result from
/// 2025-11-25 on (SEP-1303), so the model sees the errors and can correct itself.
fn invalid_arguments(tool: &CompiledTool, version: &str, problems: Vec<ErrorEntry>, started: Instant) -> Reply {
    if version >= TOOL_ERROR_VERSION {
        let outcome = Outcome {
            status: BusinessStatus::NeedsMoreInfo,
            data: None,
            next_question: Some(correction_question(&problems)),
            errors: problems,
            upstream_status: None,
        };
        return finish(tool, &outcome, started);
    }
    let first = problems.first().and_then(|p| p.field.clone()).unwrap_or_default();
    let summary = problems
        .iter()
        .map(|p| p.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    Reply::Error {
        code: code::INVALID_PARAMS,
        message: format!("Invalid arguments for tool `{}`: {summary}", tool.config.name),
        data: Some(json!({"field": first, "errors": problems})),
    }
}

#[cfg(test)]
mod correction_question_tests {
    use super::*;

    fn problem(field: Option<&str>, message: &str) -> ErrorEntry {
        let e = ErrorEntry::new("invalid_argument", message, message, false);
        match field {
            Some(f) => e.with_field(f),
            None => e,
        }
    }

    #[test]
    fn it_names_the_fields_and_what_is_wrong() {
        let q = correction_question(&[
            problem(Some("customerId"), "`customerId` is required"),
            problem(Some("priority"), "`priority` must be one of low, high"),
            problem(Some("customerId"), "`customerId` must be a string"),
        ]);
        assert_eq!(
            q,
            "Could you give me valid values for `customerId` and `priority`? `customerId` is required; \
             `priority` must be one of low, high; `customerId` must be a string."
        );
        let many: Vec<_> = ["a", "b", "c", "d"]
            .iter()
            .map(|f| problem(Some(f), &format!("`{f}` is required")))
            .collect();
        let q = correction_question(&many);
        assert!(
            q.starts_with("Could you give me valid values for `a`, `b` and `c`, among others?"),
            "{q}"
        );
        assert!(!q.contains("`d` is required"), "at most three reasons: {q}");
        assert_eq!(
            correction_question(&[problem(None, "arguments must be an object")]),
            "Could you send the details again? arguments must be an object."
        );
    }
}
