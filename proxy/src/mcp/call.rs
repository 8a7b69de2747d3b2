//! `tools/call`: authorization, per-identity and per-tool limits, the audit fail-closed check,
//! validation, mapping with provenance, the upstream call and shaping, with exactly one audit
//! record per call.

use std::sync::Arc;
use std::time::Instant;

use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Map, Value};
use toolgate_config::Tier;

use super::admit::Verdict;
use super::validation::{compile_off_worker, validate_bounded, VALIDATION_DEADLINE};
use super::{code, finish, invalid_arguments, rate_limited, Caller, Peer, Reply, Shared};
use crate::audit::{self, AuditRecord, Auditor, ClientInfo};
use crate::envelope::{ErrorEntry, Outcome};
use crate::metrics;
use crate::otel;
use crate::policy::{authorize, Denied};
use crate::runtime::Runtime;
use crate::upstream::{mapping, shape};

/// The audit record of one `tools/call`, sent exactly once: by `finish`, or on drop (a call
/// cancelled because the client went away) with decision `cancelled`.
pub struct CallAudit {
    rec: Option<AuditRecord>,
    auditor: Arc<Auditor>,
    started: Instant,
    authenticated: bool,
}

/// Largest argument object written into a record.
const MAX_RECORDED_ARGUMENTS: usize = 16 * 1024;

impl CallAudit {
    /// Starts the record of a call with JSON-RPC `id`.
    pub fn new(auditor: Arc<Auditor>, id: &Value, params: Option<&Value>) -> Self {
        let tool = params
            .and_then(|p| p.get("name"))
            .and_then(Value::as_str)
            .map(|s| super::prefix(s, 128).to_owned());
        // Without an audit sink the record only feeds the call's metrics (tool, tier, decision,
        // status): who called, from where and when are not worked out for nobody to read.
        let enabled = auditor.enabled();
        let rec = AuditRecord {
            time: if enabled { audit::now() } else { String::new() },
            request_id: String::new(),
            jsonrpc_id: id.clone(),
            session_id: None,
            protocol_version: None,
            client: ClientInfo::default(),
            subject: None,
            role: None,
            agent: None,
            client_ip: String::new(),
            tool,
            tier: None,
            safety: None,
            arguments_digest: None,
            arguments: None,
            arguments_bytes: None,
            decision: "cancelled",
            reason: "client_gone",
            status: None,
            upstream_status: None,
            duration_ms: 0,
            trace_id: String::new(),
        };
        Self {
            rec: Some(rec),
            auditor,
            started: Instant::now(),
            authenticated: false,
        }
    }

    /// Records the digest and size of the arguments, and (for an authenticated caller) the
    /// arguments themselves with the configured fields redacted.
    pub fn set_arguments(&mut self, params: Option<&Value>, authenticated: bool) {
        self.authenticated = authenticated;
        if !self.auditor.enabled() {
            return;
        }
        let Some(r) = self.rec.as_mut() else { return };
        let Some(args) = params.and_then(|p| p.get("arguments")) else {
            return;
        };
        let (digest, bytes) = audit::canonical_digest_and_len(args);
        r.arguments_digest = Some(digest);
        r.arguments_bytes = Some(bytes);
        r.arguments = authenticated.then(|| {
            if bytes > MAX_RECORDED_ARGUMENTS {
                format!(r#"{{"omitted":"too_large","bytes":{bytes}}}"#)
            } else {
                audit::redacted_json(args, &self.auditor.redact)
            }
        });
    }

    /// The record being written, when there is an audit sink to write it to.
    fn written(&mut self) -> Option<&mut AuditRecord> {
        self.rec.as_mut().filter(|_| self.auditor.enabled())
    }

    /// The client address.
    pub fn set_ip(&mut self, ip: std::net::IpAddr) {
        if let Some(r) = self.written() {
            r.client_ip = crate::policy::clientip::to_text(ip);
        }
    }

    /// Who called (the client address is [`Self::set_ip`]'s).
    pub(crate) fn set_caller(&mut self, c: &Caller) {
        if let Some(r) = self.written() {
            r.subject = Some(c.identity.subject.clone());
            r.role = Some(c.identity.role.clone());
            r.agent = c.identity.agent.clone();
            r.request_id = c.request_id.clone();
            r.trace_id = c.trace.trace_id_hex();
        }
    }

    pub(crate) fn set_peer(&mut self, p: &Peer) {
        if let Some(r) = self.written() {
            r.session_id = p.session.map(|s| s.handle.to_string());
            r.client = p.client.clone();
            r.protocol_version = Some(p.version);
        }
    }

    fn set_tool(&mut self, tier: Tier, safety: &'static str) {
        if let Some(r) = self.rec.as_mut() {
            r.tier = Some(tier.as_str());
            r.safety = Some(safety);
        }
    }

    /// Sends the record.
    pub fn finish(mut self, decision: &'static str, reason: &'static str, outcome: Option<&Outcome>) {
        if let Some(mut r) = self.rec.take() {
            r.decision = decision;
            r.reason = reason;
            r.status = outcome.map(|o| o.status.as_str());
            r.upstream_status = outcome.and_then(|o| o.upstream_status);
            r.duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.observe(&r);
            self.send(&r);
        }
    }

    /// The call's metrics. The tool label is the name only for a tool of the config (the tier
    /// is set then); anything a client made up is `unknown`.
    fn observe(&self, r: &AuditRecord) {
        let m = &metrics::METRICS;
        let tool = match (r.tier, r.tool.as_deref()) {
            (Some(_), Some(t)) => t,
            _ => metrics::UNKNOWN,
        };
        // A refusal is labelled by its decision even when it carries an outcome (a role too low).
        let status = match (r.decision, r.status) {
            ("allowed", Some(s)) => s,
            (decision, _) => decision,
        };
        m.tool_call(tool, status, r.tier.unwrap_or(metrics::UNKNOWN), self.started.elapsed());
        if matches!(r.reason, "invalid_arguments" | "arguments_not_object") {
            m.validation_failures.with_label_values(&[tool]).inc();
        }
    }

    fn send(&self, r: &AuditRecord) {
        if self.authenticated {
            self.auditor.record(r);
        } else {
            self.auditor.record_unauthenticated(r);
        }
    }
}

impl Drop for CallAudit {
    fn drop(&mut self) {
        if let Some(mut r) = self.rec.take() {
            r.duration_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
            self.observe(&r);
            self.send(&r);
        }
    }
}

fn unknown_tool(name: &str) -> Reply {
    Reply::Error {
        code: code::INVALID_PARAMS,
        message: format!("Unknown tool: `{name}`"),
        data: Some(json!({"tool": name})),
    }
}

/// The reason label of an outcome, for the audit record.
fn outcome_reason(o: &Outcome) -> &'static str {
    match o.errors.first().map(|e| e.code.as_str()) {
        None => "ok",
        Some("upstream_timeout") => "upstream_timeout",
        Some("upstream_unavailable") => "upstream_unavailable",
        Some("missing_evidence") => "missing_evidence",
        Some("upstream_contract_violation") => "upstream_contract_violation",
        Some("upstream_invalid_response") => "upstream_invalid_response",
        Some("upstream_response_too_large") => "upstream_response_too_large",
        Some(_) => "upstream_status",
    }
}

fn header_value(s: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(s).ok()
}

/// The 404 of a session that no longer exists.
fn session_gone(id: &Value) -> http::Response<super::Body> {
    super::rpc_error(
        StatusCode::NOT_FOUND,
        Some(id),
        code::SESSION_NOT_FOUND,
        "Session not found or expired: send initialize again",
        None,
    )
}

pub(crate) async fn tools_call(
    shared: &Shared,
    rt: &Arc<Runtime>,
    peer: &Peer<'_>,
    caller: &Caller,
    id: &Value,
    params: Option<&Value>,
    mut audit: CallAudit,
) -> Reply {
    let started = Instant::now();
    let policy = &rt.config.policy;
    let who = &caller.identity;
    // A session ended on another replica gets 404 whatever it asks. A call that gets as far as
    // its limits learns that in the same store round trip; one refused before them asks here.
    let name = params.and_then(|p| p.get("name")).and_then(Value::as_str);
    if let Some(s) = peer.session.filter(|s| s.expires.is_some()) {
        let reaches_limits = name
            .and_then(|n| rt.tool(n))
            .is_some_and(|t| authorize(policy, who, &t.config).is_ok());
        if !reaches_limits && super::admit::session_revoked(shared, s).await {
            audit.finish("invalid", "unknown_session", None);
            return Reply::Http(session_gone(id));
        }
    }
    let Some(name) = name else {
        audit.finish("invalid", "missing_tool_name", None);
        return Reply::error(
            code::INVALID_PARAMS,
            "Invalid params: `name` (the tool to call) is required",
        );
    };
    let Some(index) = rt.tool_index(name) else {
        audit.finish("invalid", "unknown_tool", None);
        return unknown_tool(name);
    };
    let tool = &rt.tools[index];
    match authorize(policy, who, &tool.config) {
        Ok(()) => {}
        // Hidden tools answer exactly like unknown ones: no existence leak.
        Err(d) if d.hides() => {
            audit.finish("denied", d.reason(), None);
            return unknown_tool(name);
        }
        // The role is too low. A tool this session was never shown is answered like an
        // unknown one (no existence leak); one it was shown (its role was lowered since, or it
        // listed tools under a higher role) gets a clear forbidden error.
        Err(d) if !peer.was_shown_rank(required_rank(rt, &tool.config)) => {
            audit.finish("denied", d.reason(), None);
            return unknown_tool(name);
        }
        Err(_) => {
            audit.set_tool(tool.tier, tool.safety.as_str());
            let need = rt.config.policy.required_role(&tool.config).unwrap_or("");
            let outcome = Outcome::failed(ErrorEntry::new(
                "forbidden",
                format!(
                    "Your role `{}` cannot call `{name}`: it needs `{need}` or higher",
                    who.role
                ),
                format!(
                    "Tu rol `{}` no puede usar `{name}`: requiere `{need}` o superior",
                    who.role
                ),
                false,
            ));
            audit.finish("denied", Denied::Role.reason(), Some(&outcome));
            return finish(tool, &outcome, started);
        }
    }
    audit.set_tool(tool.tier, tool.safety.as_str());
    match super::admit::admit(shared, rt, who, tool, peer.session).await {
        Verdict::Admitted => {}
        Verdict::Limited(scope, retry) => {
            audit.finish("rate_limited", scope, None);
            return Reply::Http(rate_limited(Some(id), scope, retry));
        }
        Verdict::Revoked => {
            audit.finish("invalid", "unknown_session", None);
            return Reply::Http(session_gone(id));
        }
        Verdict::Unavailable => {
            let outcome = Outcome::failed(ErrorEntry::new(
                "rate_limit_unavailable",
                "Write actions are paused because the shared rate-limit store does not answer; try again shortly",
                "Las acciones de escritura están pausadas porque el almacén compartido de límites no responde; intenta en un momento",
                true,
            ));
            audit.finish("denied", "store_unavailable", Some(&outcome));
            return finish(tool, &outcome, started);
        }
    }
    let auditor = shared.auditor.load();
    if tool.tier == Tier::Write && auditor.refuses_writes() {
        let outcome = Outcome::failed(ErrorEntry::new(
            "audit_unavailable",
            "Write actions are paused because audit records cannot be written; try again shortly",
            "Las acciones de escritura están pausadas porque no se puede registrar la auditoría; intenta en un momento",
            true,
        ));
        audit.finish("denied", "audit_unavailable", Some(&outcome));
        return finish(tool, &outcome, started);
    }

    let empty_args = Value::Object(Map::new());
    let args = match params.and_then(|p| p.get("arguments")) {
        None | Some(Value::Null) => &empty_args,
        Some(v @ Value::Object(_)) => v,
        Some(_) => {
            audit.finish("invalid", "arguments_not_object", None);
            return Reply::error(code::INVALID_PARAMS, "Invalid params: `arguments` must be an object");
        }
    };
    let problems = match validate_bounded(shared, rt, index, args, caller.body_bytes).await {
        Some(p) => p,
        None => {
            let outcome = Outcome::failed(ErrorEntry::new(
                "validation_timeout",
                "The arguments could not be checked in time: they are too large or too complex; send fewer or smaller values",
                "No se pudieron verificar los argumentos a tiempo: son demasiado grandes o complejos; envía menos valores o más pequeños",
                false,
            ));
            audit.finish("invalid", "validation_timeout", Some(&outcome));
            return finish(tool, &outcome, started);
        }
    };
    if !problems.is_empty() {
        audit.finish("invalid", "invalid_arguments", None);
        return invalid_arguments(tool, peer.version, problems, started);
    }
    let Value::Object(arg_map) = args else {
        unreachable!("checked above")
    };

    let pv = &rt.provenance;
    let mut extra: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(6);
    extra.extend(header_value(&caller.trace.traceparent()).map(|v| (HeaderName::from_static("traceparent"), v)));
    extra.extend(
        caller
            .tracestate
            .as_deref()
            .and_then(header_value)
            .map(|v| (HeaderName::from_static("tracestate"), v)),
    );
    extra.extend(header_value(&who.subject).map(|v| (pv.subject.clone(), v)));
    extra.extend(
        who.agent
            .as_deref()
            .and_then(header_value)
            .map(|v| (pv.agent.clone(), v)),
    );
    extra.extend(header_value(name).map(|v| (pv.tool.clone(), v)));
    extra.extend(
        // The handle: a sealed id is the client's to hold, not the upstream's.
        peer.session
            .and_then(|s| header_value(&s.handle))
            .map(|v| (pv.session.clone(), v)),
    );
    extra.extend(header_value(&caller.request_id).map(|v| (HeaderName::from_static("x-request-id"), v)));
    if let Some((h, v)) = &rt.upstream_credential {
        extra.push((h.clone(), v.clone()));
    }
    let request = match mapping::build(tool, arg_map, &rt.upstream, &extra) {
        Ok(r) => r,
        Err(problem) => {
            audit.finish("invalid", "invalid_arguments", None);
            return invalid_arguments(tool, peer.version, vec![problem], started);
        }
    };
    // The upstream call runs in its own task: if the client goes away mid-call, the action still
    // completes and its audit record says how it went (never "cancelled" for a call that ran).
    let rt_call = Arc::clone(rt);
    let guard = shared.in_flight.enter();
    let compile_slots = Arc::clone(&shared.compile_slots);
    let trace = caller.trace;
    // Formatted only if the call fails (the log line names it).
    let rpc_id = id.clone();
    // A 2026-07-28 client that closes the response stream cancels the request. A read is then
    // aborted (nothing happened upstream that matters); a write may already have had its effect,
    // so it runs to its end and its record says how it went. 2025 clients' calls always finish.
    let finish_if_dropped = peer.session.is_some() || tool.tier == Tier::Write;
    // A 2025-era read can be cancelled by its session's `notifications/cancelled`: the upstream
    // call is then abandoned. A write runs to its end whatever the client says.
    let (_cancel_entry, cancelled) = match peer.session {
        Some(s) if tool.tier == Tier::Read => {
            let (entry, rx) = shared.cancels.register(&s.handle, id);
            (Some(entry), Some(rx))
        }
        _ => (None, None),
    };
    let mut call = FinishOnDrop::new(finish_if_dropped, async move {
        let _guard = guard;
        let tool = &rt_call.tools[index];
        let sent = Instant::now();
        let span_start = otel::now_nanos();
        let cancelled = async move {
            // A sender dropped without cancelling (the call ended) is no cancellation.
            let asked = match cancelled {
                Some(rx) => rx.await.is_ok(),
                None => false,
            };
            if !asked {
                std::future::pending::<()>().await;
            }
        };
        let result = tokio::select! {
            r = rt_call.upstream.send(request, tool.timeout) => r,
            () = cancelled => {
                audit.finish("cancelled", "client_cancelled", None);
                return None;
            }
        };
        let code = match &result {
            Ok(resp) => metrics::status_label(resp.status),
            Err(e) => e.kind(),
        };
        if otel::enabled() && trace.sampled() {
            upstream_span(&trace, tool, &result, span_start);
        }
        metrics::METRICS
            .upstream_duration
            .with_label_values(&[tool.config.name.as_str(), code])
            .observe(sent.elapsed().as_secs_f64());
        // The first answer checked against the tool's `outputSchema` compiles it off the
        // worker too. Only if that cannot end in time (a compile slot stuck) does the check
        // below compile it in place: the answer of a call that ran is never dropped for it.
        if let (Ok(_), Some(output)) = (&result, &tool.output) {
            let deadline = tokio::time::Instant::now() + VALIDATION_DEADLINE;
            let _ = compile_off_worker(&compile_slots, output, deadline).await;
        }
        let outcome = match result {
            Ok(resp) => shape::response(tool, &resp),
            Err(e) => {
                tracing::warn!(tool = %tool.config.name, rpc_id = %rpc_id, error = e.kind(), trace_id = %trace.trace_id_hex(), "upstream call failed");
                shape::call_error(&e)
            }
        };
        audit.finish("allowed", outcome_reason(&outcome), Some(&outcome));
        Some(outcome)
    });
    let Some(outcome) = call.run().await else {
        tracing::debug!(tool = %name, trace_id = %caller.trace.trace_id_hex(), "tools/call cancelled by the client");
        return Reply::error(code::REQUEST_CANCELLED, "Request cancelled");
    };
    tracing::debug!(
        tool = %name,
        trace_id = %caller.trace.trace_id_hex(),
        status = outcome.status.as_str(),
        upstream_status = outcome.upstream_status,
        duration_ms = started.elapsed().as_millis() as u64,
        "tools/call"
    );
    finish(tool, &outcome, started)
}

/// A future that is driven in place, and if it is dropped before it finished (the client went
/// away), is handed to the runtime to finish: no per-call task spawn on the normal path.
/// With `finish` false, a dropped call is dropped with it (its audit record then says
/// `cancelled`, `client_gone`).
struct FinishOnDrop<T: Send + 'static> {
    finish: bool,
    future: Option<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>>,
}

impl<T: Send + 'static> FinishOnDrop<T> {
    fn new(finish: bool, f: impl std::future::Future<Output = T> + Send + 'static) -> Self {
        Self {
            finish,
            future: Some(Box::pin(f)),
        }
    }

    async fn run(&mut self) -> T {
        let f = self.future.as_mut().expect("run is called once");
        let out = f.await;
        self.future = None;
        out
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        if let Some(f) = self.future.take().filter(|_| self.finish) {
            tokio::spawn(async move {
                let _ = f.await;
            });
        }
    }
}

/// Rank of the role `tool` requires (0 when it requires none).
fn required_rank(rt: &Runtime, tool: &toolgate_config::ToolConfig) -> usize {
    rt.config.policy.required_rank(tool)
}

/// The upstream call's span: a child of the request span, and the parent the upstream sees in
/// `traceparent`. The path template is recorded, never the argument values in the URL.
fn upstream_span(
    trace: &crate::trace::TraceContext,
    tool: &crate::runtime::CompiledTool,
    result: &Result<crate::upstream::UpstreamResponse, crate::upstream::CallError>,
    start: u64,
) {
    let method = tool.config.http.method.as_str();
    use otel::KeyValue;
    let mut attributes = vec![
        KeyValue::new("http.request.method", method.to_string()),
        KeyValue::new("url.template", tool.config.http.path.clone()),
        KeyValue::new("gen_ai.tool.name", tool.config.name.clone()),
    ];
    let error = match result {
        Ok(resp) => {
            attributes.push(KeyValue::new("http.response.status_code", i64::from(resp.status)));
            if resp.status >= 500 {
                attributes.push(KeyValue::new("error.type", resp.status.to_string()));
            }
            (resp.status >= 500).then(|| format!("HTTP {}", resp.status))
        }
        Err(e) => {
            attributes.push(KeyValue::new("error.type", e.kind()));
            Some(e.kind().to_string())
        }
    };
    otel::record(otel::Span {
        trace_id: trace.trace_id,
        span_id: trace.upstream_span_id,
        parent: Some(trace.span_id),
        trace_state: None,
        name: method.to_string(),
        kind: otel::Kind::Client,
        start,
        end: otel::now_nanos(),
        attributes,
        error,
    });
}
