//! MCP over Streamable HTTP: one JSON-RPC message per POST, JSON responses (no server stream),
//! sessions, version negotiation, Origin checks and the `tools/*` methods.

mod admit;
pub mod args;
pub mod body;
pub mod call;
pub mod cancel;
mod gate;
mod legacy;
pub mod message;
pub mod modern;
mod origin;
pub mod peek;
mod record;
mod refused;
mod reply;
pub mod sealed;
pub mod session;
pub mod subscriptions;
mod tools;
pub mod validation;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::header::{HeaderName, HeaderValue, ORIGIN};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::audit::Auditor;
use crate::metrics;
use crate::otel;
use crate::policy::clientip;
use crate::policy::ratelimit::Limiter;
use crate::runtime::Runtime;
use crate::trace::TraceContext;
use call::CallAudit;
use refused::{audit_unparsed, body_refusal, header_refusal, refuse_unread, throttled, BODY_TIMEOUT};
use session::{Session, Sessions};

pub use body::Body;
use gate::{client_ip, gate};
pub(crate) use gate::{rate_limited, Caller};
use origin::{host_allowed, origin_allowed, preflight};
pub(crate) use record::RequestInfo;
use record::{RequestRecord, ToolError};
pub(crate) use reply::Reply;
use reply::{empty, json_response, rpc_error, RpcCode};
pub(crate) use tools::{finish, invalid_arguments, tools_list, visible};

// Header names as `HeaderName`s, not text: a lookup by text parses the name first, on every
// request.
/// `Mcp-Session-Id`.
pub const SESSION_HEADER: HeaderName = HeaderName::from_static("mcp-session-id");
/// `MCP-Protocol-Version`.
pub const VERSION_HEADER: HeaderName = HeaderName::from_static("mcp-protocol-version");
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub(crate) const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");
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
    /// most [`validation::MAX_VALIDATION_SLOTS`]).
    pub validation_slots: Arc<tokio::sync::Semaphore>,
    /// Slots for compiling a tool's schemas on its first call, off the runtime's workers (as
    /// many as validation slots, apart from them: a compile, bounded work on a schema the config
    /// holds, never waits behind a client's large validation).
    pub compile_slots: Arc<tokio::sync::Semaphore>,
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
    /// Per client IP (IPv6 by its /64, [`clientip::counting_key`]), before authentication.
    pub ip: Limiter<std::net::IpAddr>,
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
            validation_slots: Arc::new(tokio::sync::Semaphore::new(validation::validation_slots())),
            compile_slots: Arc::new(tokio::sync::Semaphore::new(validation::validation_slots())),
            subscriptions: subscriptions::Subscriptions::default(),
            cancels: cancel::Cancels::default(),
        };
        shared.adopt_store(&shared.runtime.load());
        shared
    }

    /// Applies the settings of a new generation that live outside it (limiter caps, audit
    /// sink, shared store).
    pub fn adopt(&self, rt: &Runtime) {
        self.limiters.ip.set_max_keys(rt.limits.max_keys);
        for l in [&self.limiters.identity, &self.limiters.tool] {
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

/// Serves one HTTP request on the MCP listener.
pub async fn handle(shared: Arc<Shared>, req: Request<hyper::body::Incoming>, peer: SocketAddr) -> Response<Body> {
    let mut record = RequestRecord {
        start: otel::now_nanos(),
        info: RequestInfo {
            method: "unknown",
            method_name: None,
            trace: TraceContext::from_header(header_str(req.headers(), &TRACEPARENT)),
            trace_state: None,
            rpc_id: None,
            tool: None,
            session: header_str(req.headers(), &SESSION_HEADER).map(|s| prefix(s, 128).to_owned()),
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
        record.info.trace_state = header_str(req.headers(), &TRACESTATE).map(|s| prefix(s, 512).to_owned());
    }
    let mut resp = serve(&shared, req, peer, &mut record.info).await;
    // Read when the response is ready, not when the request came, so that a call in flight
    // at SIGTERM also sends its client away.
    if shared.draining.load(Ordering::Relaxed) {
        // Shutting down (the shutdown delay): the client's next request opens a new
        // connection, which the Service sends to a replica that stays, rather than reusing
        // this one until the listener closes under it.
        resp.headers_mut()
            .insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    let tool_error = resp.extensions().get::<ToolError>().is_some();
    record.finish(
        resp.status(),
        resp.extensions().get::<RpcCode>().map(|c| c.0),
        tool_error,
    );
    resp
}

async fn serve(
    shared: &Arc<Shared>,
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
            refuse_unread(shared, body, ip, "denied", reason, info).await;
        }
        return rpc_error(StatusCode::FORBIDDEN, None, code::INVALID_REQUEST, message, None);
    }
    let mut resp = match *req.method() {
        Method::POST => post(shared, &rt, req, peer, info).await,
        Method::DELETE => {
            info.method = "DELETE";
            legacy::delete(shared, &rt, req, peer, info.trace).await
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

/// The first `chars` characters of `s` (all of it when shorter), without copying: what a
/// client-supplied name or id is cut to before it is recorded.
pub(crate) fn prefix(s: &str, chars: usize) -> &str {
    if s.len() <= chars {
        // No more bytes than that, so no more characters either.
        return s;
    }
    s.char_indices().nth(chars).map_or(s, |(end, _)| &s[..end])
}

/// A header's value as text. With a [`http::HeaderName`] (rather than a `&str`) the name is not
/// parsed again on each request.
fn header_str<K: http::header::AsHeaderName>(headers: &HeaderMap, name: K) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
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
    if let Err(retry) = shared.limiters.ip.check(&clientip::counting_key(ip), rt.limits.per_ip) {
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
    let msg = match message::parse(&body) {
        Ok(message::Parsed::Message(m)) => m,
        Ok(other) => {
            // A batch is refused whole; each tools/call in it still leaves its record.
            let message = match other {
                message::Parsed::Batch(items) => {
                    for m in items.iter().filter_map(Value::as_object) {
                        if m.get("method").and_then(Value::as_str) == Some("tools/call") {
                            let params = m.get("params");
                            let mut a =
                                CallAudit::new(shared.auditor.load_full(), m.get("id").unwrap_or(&Value::Null), params);
                            a.set_ip(ip);
                            a.set_arguments(params, false);
                            a.finish("invalid", "batch", None);
                        }
                    }
                    "Invalid Request: JSON-RPC batches are not supported; send one message per request"
                }
                _ => "Invalid Request: the body must be a JSON-RPC message object",
            };
            return rpc_error(StatusCode::BAD_REQUEST, None, code::INVALID_REQUEST, message, None);
        }
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
    let id = msg.id.as_ref();
    let params = msg.params.as_ref();
    let is_call = msg.method_str() == Some("tools/call");
    if otel::enabled() {
        // Not for a null id (the conventions leave it out then).
        info.rpc_id = id.filter(|i| !i.is_null()).map(|i| match i {
            Value::String(s) => prefix(s, 128).to_owned(),
            other => other.to_string(),
        });
    }
    if is_call {
        // Only a tool of the config names a span or a metric series; anything else a client
        // sends does not.
        info.tool = params
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .filter(|n| rt.tool_index(n).is_some())
            .map(str::to_string);
    }
    // From here on a tools/call leaves exactly one audit record, whatever happens.
    let mut audit = is_call.then(|| CallAudit::new(shared.auditor.load_full(), id.unwrap_or(&Value::Null), params));
    if let Some(a) = audit.as_mut() {
        a.set_ip(ip);
    }
    let refuse = |audit, reason, resp| refuse_call(audit, params, reason, resp);
    let valid_id = matches!(id, None | Some(Value::String(_)) | Some(Value::Number(_)));
    let reply_id = id.filter(|_| valid_id);
    if !msg.jsonrpc_2 {
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
    let method = match &msg.method {
        Some(message::Text::Str(m)) => {
            info.method = metrics::method_label(m);
            if otel::enabled() {
                info.method_name = Some(prefix(m, 64).to_owned());
            }
            Some(m.as_ref())
        }
        Some(message::Text::NotString) => {
            return rpc_error(
                StatusCode::BAD_REQUEST,
                reply_id,
                code::INVALID_REQUEST,
                "Invalid Request: `method` must be a string",
                None,
            )
        }
        None if msg.is_response => None,
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
    let meta = msg.meta.as_ref();
    let modern = if modern::is_modern(headers, method, meta) {
        match modern::validate(headers, method, params, meta) {
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
