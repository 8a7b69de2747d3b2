//! Prometheus metrics of the proxy: one registry per process, served at `/metrics` on the
//! admin listener. Label values are bounded: tool names come from the loaded config (anything
//! else is `unknown`), methods from a fixed list, codes, reasons and scopes from constants.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

/// The process-wide metrics.
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The labels of `mcp_server_operation_duration_seconds`: the attributes of OpenTelemetry's
/// `mcp.server.operation.duration` that vary, under Prometheus names (dots become
/// underscores). An attribute that does not apply is an empty label, which Prometheus reads as
/// absent. The constant ones (`network.transport=tcp`, `network.protocol.name=http`) are on
/// the OTLP points only.
pub const OPERATION_LABELS: [&str; 6] = [
    "mcp_method_name",
    "gen_ai_tool_name",
    "gen_ai_operation_name",
    "error_type",
    "rpc_response_status_code",
    "mcp_protocol_version",
];

/// The labels of `mcp_server_session_duration_seconds`.
pub const SESSION_LABELS: [&str; 2] = ["mcp_protocol_version", "error_type"];

fn mcp_histogram(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(crate::otel::DURATION_BUCKETS.to_vec()),
        labels,
    )
    .expect("metric");
    registry.register(Box::new(h.clone())).expect("unique metric");
    h
}

/// Label for a tool the config does not define.
pub const UNKNOWN: &str = "unknown";

/// Every metric of the proxy.
pub struct Metrics {
    registry: Registry,
    /// `toolgate_mcp_requests_total{method,code}`.
    pub requests: IntCounterVec,
    /// `toolgate_tool_calls_total{tool,status,tier}`.
    pub tool_calls: IntCounterVec,
    /// `toolgate_tool_call_duration_seconds{tool}`.
    pub tool_duration: HistogramVec,
    /// `toolgate_upstream_request_duration_seconds{tool,code}`.
    pub upstream_duration: HistogramVec,
    /// `toolgate_validation_failures_total{tool}`.
    pub validation_failures: IntCounterVec,
    /// `toolgate_auth_failures_total{reason}`.
    pub auth_failures: IntCounterVec,
    /// `toolgate_rate_limited_total{scope}`.
    pub rate_limited: IntCounterVec,
    /// `toolgate_audit_records_total{decision}`.
    pub audit_records: IntCounterVec,
    /// `toolgate_audit_dropped_total`.
    pub audit_dropped: IntCounter,
    /// `toolgate_audit_dropped_unauthenticated_total`: records of requests refused before
    /// authentication, dropped (an anonymous flood must not page as lost audit).
    pub audit_dropped_unauthenticated: IntCounter,
    /// `toolgate_otel_spans_dropped_total`.
    pub spans_dropped: IntCounter,
    /// `toolgate_connections_refused_total{limit}`: MCP connections closed at accept.
    pub connections_refused: IntCounterVec,
    /// `mcp_server_operation_duration_seconds{...}`: OpenTelemetry's
    /// `mcp.server.operation.duration` under its Prometheus name (see [`OPERATION_LABELS`]).
    pub mcp_operation_duration: HistogramVec,
    /// `mcp_server_session_duration_seconds{mcp_protocol_version,error_type}`.
    pub mcp_session_duration: HistogramVec,
    /// `toolgate_config_reloads_total{result}`.
    pub config_reloads: IntCounterVec,
    /// `toolgate_config_generation`.
    pub config_generation: IntGauge,
    /// `toolgate_sessions_active` (set at scrape time).
    pub sessions_active: IntGauge,
    /// `toolgate_upstream_in_flight` (set at scrape time).
    pub upstream_in_flight: IntGauge,
    /// `toolgate_jwks_last_success_timestamp_seconds`: when OAuth signing keys were last
    /// fetched from `jwksUrl` (0: never).
    pub jwks_last_success: IntGauge,
    /// `toolgate_jwks_fetch_failures_total{reason}`.
    pub jwks_fetch_failures: IntCounterVec,
    /// `toolgate_protocol_requests_total{version}`.
    pub protocol_requests: IntCounterVec,
    /// `toolgate_listen_streams_open`.
    pub listeners: IntGauge,
    /// `toolgate_store_operations_total{op,result}`.
    pub store_operations: IntCounterVec,
    /// `toolgate_store_operation_duration_seconds{op}`.
    pub store_duration: HistogramVec,
    /// `toolgate_store_up`.
    pub store_up: IntGauge,
    /// `toolgate_store_fallbacks_total{decision}`.
    pub store_fallbacks: IntCounterVec,
}

/// `op` values of the store metrics.
pub const STORE_OPS: [&str; 3] = ["admit", "revoke", "check_session"];
/// `result` values of `toolgate_store_operations_total`.
pub const STORE_RESULTS: [&str; 4] = ["ok", "error", "timeout", "skipped"];

/// Reasons of `toolgate_jwks_fetch_failures_total`.
pub const JWKS_FAILURE_REASONS: [&str; 5] = ["timeout", "transport", "status", "too_large", "invalid"];

fn plain(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("metric");
    registry.register(Box::new(c.clone())).expect("unique metric");
    c
}

const STORE_BUCKETS: [f64; 10] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1];

const CALL_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(CALL_BUCKETS.to_vec()), labels)
                .expect("metric");
            registry.register(Box::new(h.clone())).expect("unique metric");
            h
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("metric");
            registry.register(Box::new(g.clone())).expect("unique metric");
            g
        };
        let m = Self {
            requests: counter(
                "toolgate_mcp_requests_total",
                "MCP HTTP requests, by JSON-RPC method and outcome code (ok, a JSON-RPC error code, or the HTTP status of a refusal).",
                &["method", "code"],
            ),
            tool_calls: counter(
                "toolgate_tool_calls_total",
                "tools/call requests, by tool, result status (success, failed, needs_more_info, pending_confirmation, queued, or the refusal: denied, invalid, rate_limited, cancelled) and tier.",
                &["tool", "status", "tier"],
            ),
            tool_duration: histogram("toolgate_tool_call_duration_seconds", "Time from a tools/call arriving to its result, by tool.", &["tool"]),
            upstream_duration: histogram(
                "toolgate_upstream_request_duration_seconds",
                "Time of the upstream HTTP request of a tools/call, by tool and HTTP status (or timeout, connect, transport, too_large).",
                &["tool", "code"],
            ),
            validation_failures: counter(
                "toolgate_validation_failures_total",
                "tools/call arguments refused by the tool's input schema, by tool.",
                &["tool"],
            ),
            auth_failures: counter("toolgate_auth_failures_total", "Requests refused by authentication, by reason.", &["reason"]),
            rate_limited: counter("toolgate_rate_limited_total", "Requests refused by a rate limit, by scope (ip, identity, tool).", &["scope"]),
            audit_records: counter("toolgate_audit_records_total", "Audit records queued for writing, by decision.", &["decision"]),
            audit_dropped: plain(&registry, "toolgate_audit_dropped_total", "Audit records of authenticated requests lost: buffer full or write failed."),
            audit_dropped_unauthenticated: plain(
                &registry,
                "toolgate_audit_dropped_unauthenticated_total",
                "Audit records of requests refused before authentication, dropped because the buffer was full.",
            ),
            spans_dropped: plain(&registry, "toolgate_otel_spans_dropped_total", "Trace spans dropped because the export queue was full."),
            connections_refused: counter(
                "toolgate_connections_refused_total",
                "MCP client connections closed by a connection limit: total (a new one, at server.maxConnections), per_ip (a new one, at server.maxConnectionsPerIp), evicted_unused (the oldest one that had sent no request, closed to make room at server.maxConnections).",
                &["limit"],
            ),
            mcp_operation_duration: mcp_histogram(
                &registry,
                "mcp_server_operation_duration_seconds",
                "MCP request or notification duration as observed on the receiver from the time it was received until the result or ack is sent (OpenTelemetry mcp.server.operation.duration).",
                &OPERATION_LABELS,
            ),
            mcp_session_duration: mcp_histogram(
                &registry,
                "mcp_server_session_duration_seconds",
                "The duration of the MCP session as observed on the MCP server (OpenTelemetry mcp.server.session.duration).",
                &SESSION_LABELS,
            ),
            config_reloads: counter(
                "toolgate_config_reloads_total",
                "Config reloads, by result (applied; refused: invalid, the old config keeps serving; unreadable: the file cannot be read).",
                &["result"],
            ),
            config_generation: gauge("toolgate_config_generation", "Generation of the config being served (1 at start, +1 per applied reload)."),
            sessions_active: gauge("toolgate_sessions_active", "Open MCP sessions."),
            upstream_in_flight: gauge("toolgate_upstream_in_flight", "Upstream requests in flight."),
            jwks_last_success: gauge(
                "toolgate_jwks_last_success_timestamp_seconds",
                "Unix time of the last successful fetch of the OAuth signing keys from jwksUrl (0: never fetched).",
            ),
            jwks_fetch_failures: counter(
                "toolgate_jwks_fetch_failures_total",
                "Failed fetches of the OAuth signing keys from jwksUrl, by reason (timeout, transport, status, too_large, invalid); the previous keys keep being used.",
                &["reason"],
            ),
            protocol_requests: counter(
                "toolgate_protocol_requests_total",
                "MCP requests served, by the protocol version they were served under (2026-07-28, or the 2025 revision a session negotiated).",
                &["version"],
            ),
            listeners: gauge("toolgate_listen_streams_open", "Open 2026-07-28 subscriptions/listen streams."),
            store_operations: counter(
                "toolgate_store_operations_total",
                "Operations on the shared store (policy.rateLimit.store), by op (admit, revoke, check_session) and result (ok; error, timeout; skipped: the store was marked down and not asked).",
                &["op", "result"],
            ),
            store_duration: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "toolgate_store_operation_duration_seconds",
                        "Time of one shared-store round trip that was attempted, by op.",
                    )
                    .buckets(STORE_BUCKETS.to_vec()),
                    &["op"],
                )
                .expect("metric");
                registry.register(Box::new(h.clone())).expect("unique metric");
                h
            },
            store_up: gauge(
                "toolgate_store_up",
                "1 while the shared store answers, 0 while it is marked down (0 also when none is configured).",
            ),
            store_fallbacks: counter(
                "toolgate_store_fallbacks_total",
                "Calls decided without the shared store because it could not answer, by decision (local: counted on this replica's limiter; refused: a write-tier call under failClosed; unchecked: a session accepted without its revocation check).",
                &["decision"],
            ),
            registry,
        };
        m.registry
            .register(Box::new(toolgate_telemetry::process::ProcessCollector::new()))
            .expect("process metrics");
        // Every bounded label value starts at 0, so the first increment is a visible change
        // (increase() over a series that appears at 1 reads 0).
        for r in ["applied", "refused", "unreadable"] {
            m.config_reloads.with_label_values(&[r]);
        }
        for s in ["ip", "identity", "tool"] {
            m.rate_limited.with_label_values(&[s]);
        }
        for l in ["total", "per_ip", "evicted_unused"] {
            m.connections_refused.with_label_values(&[l]);
        }
        for d in ["allowed", "denied", "invalid", "rate_limited", "cancelled"] {
            m.audit_records.with_label_values(&[d]);
        }
        for r in JWKS_FAILURE_REASONS {
            m.jwks_fetch_failures.with_label_values(&[r]);
        }
        for op in STORE_OPS {
            for r in STORE_RESULTS {
                m.store_operations.with_label_values(&[op, r]);
            }
        }
        for d in ["local", "refused", "unchecked"] {
            m.store_fallbacks.with_label_values(&[d]);
        }
        for v in toolgate_config::SUPPORTED_PROTOCOL_VERSIONS {
            m.protocol_requests.with_label_values(&[v]);
        }
        m
    }

    /// The name of every metric family this registry can export (also those with no sample
    /// yet); dashboards and alerts are checked against it.
    pub fn names(&self) -> Vec<String> {
        use prometheus::core::Collector;
        let collectors: [&dyn Collector; 26] = [
            &self.requests,
            &self.tool_calls,
            &self.tool_duration,
            &self.upstream_duration,
            &self.validation_failures,
            &self.auth_failures,
            &self.rate_limited,
            &self.audit_records,
            &self.audit_dropped,
            &self.audit_dropped_unauthenticated,
            &self.spans_dropped,
            &self.connections_refused,
            &self.mcp_operation_duration,
            &self.mcp_session_duration,
            &self.config_reloads,
            &self.config_generation,
            &self.sessions_active,
            &self.upstream_in_flight,
            &self.jwks_last_success,
            &self.jwks_fetch_failures,
            &self.protocol_requests,
            &self.listeners,
            &self.store_operations,
            &self.store_duration,
            &self.store_up,
            &self.store_fallbacks,
        ];
        toolgate_telemetry::names(&collectors)
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        toolgate_telemetry::render(&self.registry)
    }

    /// One request served under protocol `version` (a supported version: bounded).
    pub fn protocol(&self, version: &'static str) {
        self.protocol_requests.with_label_values(&[version]).inc();
    }

    /// One finished tools/call.
    pub fn tool_call(&self, tool: &str, status: &str, tier: &str, elapsed: Duration) {
        self.tool_calls.with_label_values(&[tool, status, tier]).inc();
        self.tool_duration
            .with_label_values(&[tool])
            .observe(elapsed.as_secs_f64());
    }
}

/// A JSON-RPC method as a bounded label value.
pub fn method_label(method: &str) -> &'static str {
    match method {
        "initialize" => "initialize",
        "notifications/initialized" => "notifications/initialized",
        "notifications/cancelled" => "notifications/cancelled",
        "ping" => "ping",
        "tools/list" => "tools/list",
        "tools/call" => "tools/call",
        "server/discover" => "server/discover",
        "subscriptions/listen" => "subscriptions/listen",
        _ => "other",
    }
}

/// A JSON-RPC error code as a label value.
pub fn rpc_code_label(code: i64) -> &'static str {
    match code {
        -32700 => "-32700",
        -32600 => "-32600",
        -32601 => "-32601",
        -32602 => "-32602",
        -32603 => "-32603",
        -32001 => "-32001",
        -32002 => "-32002",
        -32003 => "-32003",
        -32020 => "-32020",
        -32022 => "-32022",
        -31001 => "-31001",
        -31029 => "-31029",
        _ => "other",
    }
}

/// An upstream HTTP status as a label value (the class for anything unusual).
pub fn status_label(status: u16) -> &'static str {
    const COMMON: [(u16, &str); 15] = [
        (200, "200"),
        (201, "201"),
        (202, "202"),
        (204, "204"),
        (400, "400"),
        (401, "401"),
        (403, "403"),
        (404, "404"),
        (409, "409"),
        (422, "422"),
        (429, "429"),
        (500, "500"),
        (502, "502"),
        (503, "503"),
        (504, "504"),
    ];
    if let Some((_, label)) = COMMON.iter().find(|(code, _)| *code == status) {
        return label;
    }
    match status / 100 {
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    }
}
