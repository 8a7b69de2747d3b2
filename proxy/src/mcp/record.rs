//! Each request's telemetry: the `toolgate_mcp_requests_total` count, the
//! `mcp.server.operation.duration` histogram and the server span, recorded exactly once.

use std::net::SocketAddr;

use http::StatusCode;

use crate::metrics;
use crate::otel;
use crate::trace::TraceContext;

/// Marks a tools/call response whose result has `isError: true`.
#[derive(Clone, Copy)]
pub(crate) struct ToolError;

/// Counts the request, records its duration and ends its span exactly once: when the response
/// is ready, or (the client went away and the handler was dropped) on drop, as `client_gone`.
pub(crate) struct RequestRecord {
    pub(crate) start: u64,
    pub(crate) info: RequestInfo,
    pub(crate) done: bool,
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
    pub(crate) fn finish(&mut self, status: StatusCode, rpc_code: Option<i64>, tool_error: bool) {
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
    pub(crate) method: &'static str,
    /// The method as sent (for the span attribute), when it is a string.
    pub(crate) method_name: Option<String>,
    pub(crate) trace: TraceContext,
    /// The client's `tracestate` (only while spans are exported).
    pub(crate) trace_state: Option<String>,
    pub(crate) rpc_id: Option<String>,
    pub(crate) tool: Option<String>,
    pub(crate) session: Option<String>,
    /// The protocol version the request was served under, once known.
    pub(crate) version: Option<&'static str>,
    /// `network.protocol.version`.
    pub(crate) http_version: &'static str,
    /// The TCP peer (`client.address`, `client.port`).
    pub(crate) client: SocketAddr,
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
