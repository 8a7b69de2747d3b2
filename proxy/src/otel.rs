//! OpenTelemetry traces over OTLP/HTTP (JSON encoding): one server span per JSON-RPC request
//! and a client span per upstream call. Configured by the standard variables
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_EXPORTER_OTLP_HEADERS`; off when no endpoint is set.
//! Spans go through a bounded queue to a background batcher, so a slow or absent collector
//! never slows a call: when the queue is full spans are dropped and counted. On shutdown the
//! queue is flushed (for up to 2 s).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::trace::to_hex;

/// Span kinds (OTLP enum values).
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A request the proxy serves.
    Server = 2,
    /// A request the proxy makes.
    Client = 3,
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct Span {
    /// Trace id.
    pub trace_id: [u8; 16],
    /// Span id.
    pub span_id: [u8; 8],
    /// Parent span id.
    pub parent: Option<[u8; 8]>,
    /// Name (`tools/call get_customer`, `GET`).
    pub name: String,
    /// Kind.
    pub kind: Kind,
    /// Start, nanoseconds since the epoch.
    pub start: u64,
    /// End, nanoseconds since the epoch.
    pub end: u64,
    /// Attributes.
    pub attributes: Vec<(&'static str, Value)>,
    /// Error description; the span status is ERROR when set.
    pub error: Option<String>,
}

/// Nanoseconds since the epoch.
pub fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

enum Msg {
    Span(Box<Span>),
    /// Export what is queued now, then answer.
    Flush(tokio::sync::oneshot::Sender<()>),
}

struct Exporter {
    tx: mpsc::Sender<Msg>,
    dropped: AtomicU64,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();
static SAMPLER: OnceLock<Sampler> = OnceLock::new();

/// `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sampler {
    /// Share of new (root) traces sampled.
    ratio: f64,
    /// Follow the client's sampled flag when it sends a `traceparent`.
    parent_based: bool,
}

impl Sampler {
    fn from_env() -> Self {
        let name = std::env::var("OTEL_TRACES_SAMPLER").unwrap_or_default();
        let arg = std::env::var("OTEL_TRACES_SAMPLER_ARG")
            .ok()
            .and_then(|a| a.trim().parse::<f64>().ok())
            .filter(|r| (0.0..=1.0).contains(r));
        let (ratio, parent_based) = match name.trim() {
            "always_on" => (1.0, false),
            "always_off" => (0.0, false),
            "traceidratio" => (arg.unwrap_or(1.0), false),
            "parentbased_always_off" => (0.0, true),
            "parentbased_traceidratio" => (arg.unwrap_or(1.0), true),
            "" | "parentbased_always_on" => (1.0, true),
            other => {
                tracing::warn!(
                    sampler = other,
                    "unknown OTEL_TRACES_SAMPLER; using parentbased_always_on"
                );
                (1.0, true)
            }
        };
        Self { ratio, parent_based }
    }

    /// Whether a trace with this id is sampled (deterministic in the id, as the spec's
    /// TraceIdRatioBased: the low 8 bytes against the ratio).
    fn by_ratio(&self, trace_id: &[u8; 16]) -> bool {
        if self.ratio >= 1.0 {
            return true;
        }
        let mut low = [0u8; 8];
        low.copy_from_slice(&trace_id[8..]);
        (u64::from_be_bytes(low) >> 1) < (self.ratio * (u64::MAX >> 1) as f64) as u64
    }
}

/// The sampled flag of a request's trace: the client's decision (`parent`, when it sent a
/// `traceparent`) under a parent-based sampler, else the ratio. Without an exporter every
/// trace stays sampled, as the client asked or as new traces always were.
pub fn sampled(trace_id: &[u8; 16], parent: Option<bool>) -> bool {
    let Some(sampler) = SAMPLER.get() else {
        return parent.unwrap_or(true);
    };
    match parent {
        Some(p) if sampler.parent_based => p,
        _ => sampler.by_ratio(trace_id),
    }
}

const QUEUE: usize = 4096;
const BATCH: usize = 512;
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Whether spans are exported.
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

/// Queues a finished span (dropped and counted when the queue is full).
pub fn record(span: Span) {
    if let Some(e) = EXPORTER.get() {
        if e.tx.try_send(Msg::Span(Box::new(span))).is_err() {
            e.dropped.fetch_add(1, Ordering::Relaxed);
            crate::metrics::METRICS.spans_dropped.inc();
        }
    }
}

/// Exports every span queued so far (on shutdown); gives up after `timeout`.
pub async fn flush(timeout: Duration) {
    let Some(e) = EXPORTER.get() else { return };
    let (done, wait) = tokio::sync::oneshot::channel();
    let flushed = async {
        if e.tx.send(Msg::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    };
    let _ = tokio::time::timeout(timeout, flushed).await;
}

/// Spans dropped because the queue was full.
pub fn dropped() -> u64 {
    EXPORTER.get().map_or(0, |e| e.dropped.load(Ordering::Relaxed))
}

/// The traces URL from the environment: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as is, or
/// `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces`.
fn endpoint_from_env() -> Option<String> {
    let var = |k: &str| {
        std::env::var(k)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(t) = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Some(t);
    }
    var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|b| format!("{}/v1/traces", b.trim_end_matches('/')))
}

/// `k=v,k=v` lists (`OTEL_RESOURCE_ATTRIBUTES`, `OTEL_EXPORTER_OTLP_HEADERS`), values
/// percent-decoded.
fn pairs(var: &str) -> Vec<(String, String)> {
    std::env::var(var)
        .unwrap_or_default()
        .split(',')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| {
            let v = percent_encoding::percent_decode_str(v.trim())
                .decode_utf8_lossy()
                .into_owned();
            (k.trim().to_string(), v)
        })
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// Starts the exporter when an OTLP endpoint is configured; call once inside the runtime.
pub fn init_from_env() {
    let Some(url) = endpoint_from_env() else { return };
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => {
            tracing::error!(endpoint = %url, error = %e, "OTLP endpoint is not a URL; traces are off");
            return;
        }
    };
    let service = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "toolgate-proxy".into());
    let mut resource = vec![
        json!({"key": "service.name", "value": {"stringValue": service}}),
        json!({"key": "service.version", "value": {"stringValue": env!("CARGO_PKG_VERSION")}}),
        json!({"key": "telemetry.sdk.name", "value": {"stringValue": "toolgate"}}),
        json!({"key": "telemetry.sdk.language", "value": {"stringValue": "rust"}}),
    ];
    for (k, v) in pairs("OTEL_RESOURCE_ATTRIBUTES") {
        if k != "service.name" {
            resource.push(json!({"key": k, "value": {"stringValue": v}}));
        }
    }
    let headers = pairs("OTEL_EXPORTER_OTLP_HEADERS");
    let _ = SAMPLER.set(Sampler::from_env());
    let (tx, rx) = mpsc::channel(QUEUE);
    if EXPORTER
        .set(Exporter {
            tx,
            dropped: AtomicU64::new(0),
        })
        .is_err()
    {
        return;
    }
    tracing::info!(endpoint = %url, "exporting traces over OTLP/HTTP");
    tokio::spawn(run(uri, headers, Value::Array(resource), rx));
}

async fn run(uri: http::Uri, headers: Vec<(String, String)>, resource: Value, mut rx: mpsc::Receiver<Msg>) {
    let https = match hyper_rustls::HttpsConnectorBuilder::new().with_native_roots() {
        Ok(b) => b.https_or_http().enable_http1().build(),
        Err(e) => {
            tracing::error!(error = %e, "no TLS roots for the OTLP endpoint; traces are off");
            return;
        }
    };
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
    let mut batch = Vec::with_capacity(BATCH);
    let mut failures = 0u32;
    loop {
        let deadline = tokio::time::sleep(FLUSH_EVERY);
        tokio::pin!(deadline);
        let mut flushed = None;
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(Msg::Span(s)) => {
                        batch.push(*s);
                        if batch.len() >= BATCH {
                            break;
                        }
                    }
                    Some(Msg::Flush(done)) => {
                        flushed = Some(done);
                        break;
                    }
                    None => break,
                },
                _ = &mut deadline => break,
            }
        }
        if !batch.is_empty() {
            export(&client, &uri, &headers, &resource, &batch, &mut failures).await;
            batch.clear();
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
        if rx.is_closed() && rx.is_empty() {
            return;
        }
    }
}

async fn export<C>(
    client: &hyper_util::client::legacy::Client<C, Full<Bytes>>,
    uri: &http::Uri,
    headers: &[(String, String)],
    resource: &Value,
    batch: &[Span],
    failures: &mut u32,
) where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let body = encode(resource, batch);
    let mut req = http::Request::post(uri.clone()).header(http::header::CONTENT_TYPE, "application/json");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let Ok(req) = req.body(Full::new(Bytes::from(body))) else {
        tracing::warn!("OTEL_EXPORTER_OTLP_HEADERS holds an invalid header; spans are not exported");
        return;
    };
    match tokio::time::timeout(Duration::from_secs(10), client.request(req)).await {
        Ok(Ok(resp)) if resp.status().is_success() => *failures = 0,
        outcome => {
            *failures += 1;
            // One line per failure streak, not per batch.
            if *failures == 1 {
                let why = match outcome {
                    Ok(Ok(r)) => format!("HTTP {}", r.status()),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "timed out".into(),
                };
                tracing::warn!(endpoint = %uri, error = %why, "OTLP export failed; spans of this batch are lost");
            }
        }
    }
}

fn attribute(key: &str, v: &Value) -> Value {
    let value = match v {
        Value::Bool(b) => json!({"boolValue": b}),
        Value::Number(n) if n.is_i64() || n.is_u64() => json!({"intValue": n.to_string()}),
        Value::Number(n) => json!({"doubleValue": n.as_f64()}),
        Value::String(s) => json!({"stringValue": s}),
        other => json!({"stringValue": other.to_string()}),
    };
    json!({"key": key, "value": value})
}

/// The OTLP/JSON `ExportTraceServiceRequest` of `spans`.
pub fn encode(resource: &Value, spans: &[Span]) -> Vec<u8> {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let mut v = json!({
                "traceId": to_hex(&s.trace_id),
                "spanId": to_hex(&s.span_id),
                "name": s.name,
                "kind": s.kind as i32,
                "startTimeUnixNano": s.start.to_string(),
                "endTimeUnixNano": s.end.to_string(),
                "attributes": s.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
                "status": match &s.error {
                    Some(m) => json!({"code": 2, "message": m}),
                    None => json!({"code": 0}),
                },
            });
            if let Some(p) = s.parent {
                v["parentSpanId"] = to_hex(&p).into();
            }
            v
        })
        .collect();
    serde_json::to_vec(&json!({"resourceSpans": [{
        "resource": {"attributes": resource},
        "scopeSpans": [{"scope": {"name": "toolgate-proxy", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}]
    }]}))
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_sampling_is_deterministic_and_close_to_the_ratio() {
        let s = Sampler {
            ratio: 0.25,
            parent_based: true,
        };
        let mut hits = 0;
        for i in 0u64..4000 {
            let mut id = [0u8; 16];
            id[8..].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
            assert_eq!(s.by_ratio(&id), s.by_ratio(&id));
            hits += usize::from(s.by_ratio(&id));
        }
        assert!((800..1200).contains(&hits), "{hits} of 4000 at 25%");
        assert!(Sampler {
            ratio: 1.0,
            parent_based: false
        }
        .by_ratio(&[0xff; 16]));
        assert!(!Sampler {
            ratio: 0.0,
            parent_based: false
        }
        .by_ratio(&[0; 16]));
    }

    #[test]
    fn spans_encode_as_otlp_json_with_hex_ids_and_string_nanos() {
        let span = Span {
            trace_id: [0xab; 16],
            span_id: [1; 8],
            parent: Some([2; 8]),
            name: "tools/call get_customer".into(),
            kind: Kind::Server,
            start: 1,
            end: 2,
            attributes: vec![
                ("gen_ai.tool.name", json!("get_customer")),
                ("http.response.status_code", json!(200)),
            ],
            error: None,
        };
        let v: Value = serde_json::from_slice(&encode(&json!([]), &[span])).unwrap();
        let s = &v["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "abababababababababababababababab");
        assert_eq!(s["spanId"], "0101010101010101");
        assert_eq!(s["parentSpanId"], "0202020202020202");
        assert_eq!(s["kind"], 2);
        assert_eq!(s["startTimeUnixNano"], "1");
        assert_eq!(
            s["attributes"][1],
            json!({"key": "http.response.status_code", "value": {"intValue": "200"}})
        );
    }
}
