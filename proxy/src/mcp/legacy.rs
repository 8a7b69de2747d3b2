//! The 2025 revisions (2025-03-26, 2025-06-18 — what Whaapy sends — and 2025-11-25), kept for
//! clients of that era on the same endpoint: `initialize` negotiates a version and issues an
//! `Mcp-Session-Id`; every later request names its session, which belongs to the subject that
//! opened it; `DELETE` ends it; `ping` answers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use serde_json::{json, Value};
use toolgate_config::LEGACY_PROTOCOL_VERSIONS;

use super::{
    call, client_ip, code, empty, gate, header_str, rate_limited, refuse_call, rpc_error, tools_list, Body, Caller,
    Incoming, Peer, Reply, Shared, SESSION_HEADER,
};
use super::{sealed, session, session::Session};
use crate::policy::{clientip, Identity};
use crate::runtime::Runtime;
use crate::trace::TraceContext;

/// Serves a 2025-era request of an authenticated caller.
pub(crate) async fn serve(
    shared: &Arc<Shared>,
    rt: &Arc<Runtime>,
    caller: &Caller,
    req: Incoming<'_>,
    info: &mut super::RequestInfo,
) -> Response<Body> {
    let Incoming {
        headers,
        method,
        id,
        params,
        audit,
    } = req;
    if method == Some("initialize") {
        let Some(id) = id else {
            return empty(StatusCode::ACCEPTED);
        };
        return initialize(shared, rt, caller, id, params);
    }
    let session = match header_str(headers, &SESSION_HEADER) {
        None => Err((
            StatusCode::BAD_REQUEST,
            code::INVALID_REQUEST,
            "Bad Request: Mcp-Session-Id header is required (send initialize first)",
            "missing_session",
        )),
        // A session belongs to the subject that opened it; to anyone else it does not exist.
        Some(sid) => match find(shared, rt, sid, &caller.identity) {
            // A tools/call checks the revocation in the same store round trip as its limits.
            Some(s) if method == Some("tools/call") || !super::admit::session_revoked(shared, &s).await => Ok(s),
            _ => Err((
                StatusCode::NOT_FOUND,
                code::SESSION_NOT_FOUND,
                "Session not found or expired: send initialize again",
                "unknown_session",
            )),
        },
    };
    let session = match session {
        Ok(s) => s,
        Err((status, code, message, reason)) => {
            return refuse_call(audit, params, reason, rpc_error(status, id, code, message, None));
        }
    };
    info.session = Some(super::prefix(&session.handle, 128).to_owned());
    // A supported MCP-Protocol-Version that differs from the negotiated one is tolerated (the
    // specification refuses only invalid or unsupported ones, and the conformance suite sends
    // such requests); the session's negotiated version decides the error semantics.
    crate::metrics::METRICS.protocol(session.version);
    info.version = Some(session.version);

    // The session cancels one of its calls: a read still running here is abandoned.
    if method == Some("notifications/cancelled") && id.is_none() {
        if let Some(rid) = params.and_then(|p| p.get("requestId")) {
            if shared.cancels.cancel(&session.handle, rid) {
                tracing::debug!(request_id = %rid, "notifications/cancelled: the call is abandoned");
            }
        }
        return empty(StatusCode::ACCEPTED);
    }
    // Responses and notifications: accepted, nothing to answer.
    let (Some(method), Some(id)) = (method, id) else {
        return empty(StatusCode::ACCEPTED);
    };
    let peer = Peer {
        version: session.version,
        session: Some(&session),
        client: crate::audit::ClientInfo {
            name: session.client_name.clone(),
            version: session.client_version.clone(),
        },
    };
    let reply = match method {
        "ping" => Reply::Result(json!({})),
        "tools/list" => tools_list(rt, &peer, &caller.identity, params),
        "tools/call" => match audit {
            Some(mut a) => {
                a.set_peer(&peer);
                call::tools_call(shared, rt, &peer, caller, id, params, a).await
            }
            None => Reply::error(code::INTERNAL_ERROR, "Internal error"),
        },
        _ => Reply::error(code::METHOD_NOT_FOUND, format!("Method not found: `{method}`")),
    };
    reply.into_response(id)
}

fn initialize(shared: &Shared, rt: &Runtime, caller: &Caller, id: &Value, params: Option<&Value>) -> Response<Body> {
    let server = &rt.config.server;
    let Some(requested) = params.and_then(|p| p.get("protocolVersion")).and_then(Value::as_str) else {
        return Reply::error(code::INVALID_PARAMS, "Invalid params: `protocolVersion` is required").into_response(id);
    };
    // A version this era does not know is offered the newest 2025 revision (the lifecycle's
    // negotiation); a 2026-07-28 client does not send initialize.
    let version = LEGACY_PROTOCOL_VERSIONS
        .iter()
        .copied()
        .find(|v| *v == requested)
        .unwrap_or(LEGACY_PROTOCOL_VERSIONS[0]);
    let info = params.and_then(|p| p.get("clientInfo"));
    // At most 128 bytes, no control characters: what a sealed id carries stays well inside the
    // length every replica opens.
    let field = |k: &str| {
        info.and_then(|i| i.get(k)).and_then(Value::as_str).map(|s| {
            let mut out = String::new();
            for c in s.chars().filter(|c| !c.is_control()) {
                if out.len() + c.len_utf8() > 128 {
                    break;
                }
                out.push(c);
            }
            out
        })
    };
    let ttl = Duration::from_secs(server.session_ttl_seconds);
    let who = &caller.identity;
    let session = match &rt.session_keys {
        Some(keys) => session::seal(
            keys,
            version,
            field("name"),
            field("version"),
            &who.subject,
            who.rank,
            ttl,
        ),
        None => shared.sessions.create(
            version,
            field("name"),
            field("version"),
            &who.subject,
            who.rank,
            ttl,
            server.max_sessions,
        ),
    };
    // listChanged is false: a 2025 session has no server stream to send it on.
    let mut result = json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": server.name, "title": "Toolgate", "version": env!("CARGO_PKG_VERSION")},
    });
    if let Some(i) = &server.instructions {
        result["instructions"] = json!(i);
    }
    tracing::debug!(version, client = ?session.client_name, subject = %caller.identity.subject, "session started");
    let mut resp = Reply::Result(result).into_response(id);
    if let Ok(v) = HeaderValue::from_str(&session.id) {
        resp.headers_mut().insert(SESSION_HEADER, v);
    }
    resp
}

/// `DELETE` ends a 2025 session. A 2026-07-28 client has none: 405, as the transport says.
pub(crate) async fn delete(
    shared: &Shared,
    rt: &Runtime,
    req: Request<hyper::body::Incoming>,
    peer: SocketAddr,
    trace: TraceContext,
) -> Response<Body> {
    let (parts, _) = req.into_parts();
    let modern =
        header_str(&parts.headers, &super::VERSION_HEADER).is_some_and(|v| !LEGACY_PROTOCOL_VERSIONS.contains(&v));
    if modern {
        let mut r = rpc_error(
            StatusCode::METHOD_NOT_ALLOWED,
            None,
            code::INVALID_REQUEST,
            "Method not allowed: 2026-07-28 has no sessions to end",
            None,
        );
        r.headers_mut()
            .insert(http::header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    let ip = client_ip(rt, &parts, peer);
    if let Err(retry) = shared.limiters.ip.check(&clientip::counting_key(ip), rt.limits.per_ip) {
        return rate_limited(None, "ip", retry);
    }
    let caller = match gate(rt, &parts, peer, ip, None, trace).await {
        Ok(c) => c,
        Err(r) => return r.response,
    };
    let Some(sid) = header_str(&parts.headers, &SESSION_HEADER) else {
        return rpc_error(
            StatusCode::BAD_REQUEST,
            None,
            code::INVALID_REQUEST,
            "Bad Request: Mcp-Session-Id header is required",
            None,
        );
    };
    let not_found = || {
        rpc_error(
            StatusCode::NOT_FOUND,
            None,
            code::SESSION_NOT_FOUND,
            "Session not found",
            None,
        )
    };
    // Not `find`: a DELETE retried after a 503 must reach the store again, though this replica
    // already counts the session as ended.
    let Some(session) = open_session(shared, rt, sid, &caller.identity) else {
        return not_found();
    };
    let Some(remaining) = session.remaining() else {
        // In memory: ending it here ends it.
        return if shared.sessions.remove(sid) {
            empty(StatusCode::NO_CONTENT)
        } else {
            not_found()
        };
    };
    let Some(store) = shared.store.load_full() else {
        // Without a shared store only this replica knows (documented): the id keeps opening on
        // the others until it expires.
        if shared.revoked.contains(&session) {
            return not_found();
        }
        shared.revoked.insert(&session, rt.config.server.max_sessions);
        session::ended(&session, session::End::Deleted);
        return empty(StatusCode::NO_CONTENT);
    };
    if store.is_revoked(&session.subject, &session.handle).await == Ok(true) {
        return not_found();
    }
    shared.revoked.insert(&session, rt.config.server.max_sessions);
    // Replicas' clocks differ: the entry outlives the id by a margin.
    match store
        .revoke(&session.subject, &session.handle, remaining + REVOCATION_MARGIN)
        .await
    {
        Ok(()) => {
            session::ended(&session, session::End::Deleted);
            empty(StatusCode::NO_CONTENT)
        }
        // Not ended everywhere: say so, rather than a 204 other replicas would contradict.
        Err(e) => {
            tracing::warn!(error = ?e, "DELETE could not record the revocation in the shared store");
            rpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                None,
                code::INTERNAL_ERROR,
                "Service unavailable: the session ended on this replica only; try DELETE again",
                None,
            )
        }
    }
}

/// How much longer a revocation entry lives than the id it ends (clock skew between replicas).
const REVOCATION_MARGIN: Duration = Duration::from_secs(300);

/// The session `id` of `subject`, whether or not it was ended here: sealed when it carries
/// the sealed prefix and this server has keys, from the in-memory table otherwise; `None` if
/// unknown, expired or another subject's.
fn open_session(shared: &Shared, rt: &Runtime, id: &str, who: &Identity) -> Option<Arc<Session>> {
    let ttl = Duration::from_secs(rt.config.server.session_ttl_seconds);
    let session = match &rt.session_keys {
        Some(keys) if id.starts_with(sealed::PREFIX) => session::open(keys, id, ttl)?,
        _ => shared.sessions.get(id, ttl)?,
    };
    session.belongs_to(who).then_some(session)
}

/// The live session `id` of `subject`; `None` also when it was ended here.
fn find(shared: &Shared, rt: &Runtime, id: &str, who: &Identity) -> Option<Arc<Session>> {
    open_session(shared, rt, id, who).filter(|s| !shared.revoked.contains(s))
}
