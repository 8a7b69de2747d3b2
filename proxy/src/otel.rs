//! OpenTelemetry on the OpenTelemetry SDK: one SERVER span per MCP request and a CLIENT span per
//! upstream call, through the SDK's batch span processor, and the MCP duration histograms
//! (`mcp.server.operation.duration`, `mcp.server.session.duration`) through its periodic metric
//! reader, both exported over OTLP/HTTP (protobuf) by `opentelemetry-otlp`.
//!
//! The SDK reads the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or the per-signal
//! `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`), `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_BSP_*`, `OTEL_METRIC_EXPORT_INTERVAL`.
//! A signal is off unless an endpoint is set for it; `OTEL_SDK_DISABLED=true` or
//! `OTEL_{TRACES,METRICS}_EXPORTER=none` turn it off too.
//!
//! Three things are ours, each for a reason the SDK cannot cover:
//! - The exporter's HTTP client is the proxy's hyper client and rustls (the workspace's one
//!   HTTP and TLS stack, no reqwest). The SDK's processor and reader export from their own
//!   threads, so each request is spawned on the proxy's Tokio runtime and awaited from there.
//! - A request's ids are chosen when it arrives: the upstream receives its CLIENT span id in
//!   `traceparent`, and the audit record its trace id, before any span ends. Spans are built
//!   when the request ends, with those ids, through an [`IdGenerator`] that hands the SDK the
//!   ids the request already carries.
//! - A bounded queue in front of the batch processor counts the spans it drops
//!   (`toolgate_otel_spans_dropped_total`); the SDK only logs them.

use std::cell::Cell;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry::metrics::{Histogram, MeterProvider as _};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
pub use opentelemetry::KeyValue;
use opentelemetry::{Context, InstrumentationScope};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, SdkTracer,
    SdkTracerProvider, ShouldSample, SpanData, SpanExporter, SpanProcessor,
};
use opentelemetry_sdk::Resource;

/// Span kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A request the proxy serves.
    Server,
    /// A request the proxy makes.
    Client,
}

/// One finished span.
#[derive(Debug, Clone)]
pub struct Span {
    /// Trace id.
    pub trace_id: [u8; 16],
    /// Span id.
    pub span_id: [u8; 8],
    /// Parent span id: the client's span (SERVER spans) or the proxy's request span (CLIENT).
    pub parent: Option<[u8; 8]>,
    /// The client's `tracestate`, kept on the span.
    pub trace_state: Option<String>,
    /// Name (`tools/call get_customer`, `GET`).
    pub name: String,
    /// Kind.
    pub kind: Kind,
    /// Start, nanoseconds since the epoch.
    pub start: u64,
    /// End, nanoseconds since the epoch.
    pub end: u64,
    /// Attributes.
    pub attributes: Vec<KeyValue>,
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

fn time(nanos: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(nanos)
}

struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// The provider's sampler, asked when a request arrives (its decision travels upstream).
    sampler: Sampler,
}

struct Meters {
    provider: SdkMeterProvider,
    operation: Histogram<f64>,
    session: Histogram<f64>,
}

static TRACES: OnceLock<Traces> = OnceLock::new();
static METERS: OnceLock<Meters> = OnceLock::new();

/// Bucket boundaries the MCP conventions give both duration histograms (seconds).
pub const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// An export request gives up after this long (the spans or points of that batch are lost).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The SDK's default queue (`OTEL_BSP_MAX_QUEUE_SIZE`).
const DEFAULT_QUEUE: usize = 2048;

/// `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` as the SDK sampler. Unknown names fall back
/// to the specification's default, `parentbased_always_on`.
fn sampler(name: &str, arg: Option<&str>) -> Result<Sampler, String> {
    let ratio = || {
        arg.and_then(|a| a.trim().parse::<f64>().ok())
            .filter(|r| (0.0..=1.0).contains(r))
            .unwrap_or(1.0)
    };
    Ok(match name.trim() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio()),
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "parentbased_traceidratio" => Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio()))),
        "" | "parentbased_always_on" => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        other => return Err(other.to_string()),
    })
}

fn parent_context(trace_id: [u8; 16], parent: [u8; 8], sampled: bool, remote: bool, state: Option<&str>) -> Context {
    let flags = if sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let state = state.and_then(|s| s.parse::<TraceState>().ok()).unwrap_or_default();
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(trace_id),
        SpanId::from_bytes(parent),
        flags,
        remote,
        state,
    ))
}

/// The sampled flag of a request's trace, decided by the provider's sampler: under a
/// parent-based one the client's flag (`parent`: its span and flag, when it sent a
/// `traceparent`), else the trace id against the ratio. Without an exporter every trace stays
/// sampled, as the client asked or as new traces always are.
pub fn sampled(trace_id: &[u8; 16], parent: Option<([u8; 8], bool)>) -> bool {
    let Some(t) = TRACES.get() else {
        return parent.is_none_or(|(_, s)| s);
    };
    let cx = match parent {
        Some((span, sampled)) => parent_context(*trace_id, span, sampled, true, None),
        None => Context::new(),
    };
    let result = t.sampler.should_sample(
        Some(&cx),
        TraceId::from_bytes(*trace_id),
        "",
        &SpanKind::Server,
        &[],
        &[],
    );
    result.decision == SamplingDecision::RecordAndSample
}

/// Whether spans are exported.
pub fn enabled() -> bool {
    TRACES.get().is_some()
}

/// Whether the MCP duration histograms are exported over OTLP.
pub fn metrics_enabled() -> bool {
    METERS.get().is_some()
}

thread_local! {
    /// The ids of the span being built on this thread (see [`Preset`]).
    static NEXT_IDS: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// Hands the SDK the ids a request already carries while its span is built; random ids
/// otherwise (spans the proxy does not build itself never reach here today).
#[derive(Debug, Default)]
struct Preset(RandomIdGenerator);

impl IdGenerator for Preset {
    fn new_trace_id(&self) -> TraceId {
        NEXT_IDS
            .with(Cell::get)
            .map_or_else(|| self.0.new_trace_id(), |(t, _)| t)
    }

    fn new_span_id(&self) -> SpanId {
        NEXT_IDS
            .with(Cell::get)
            .map_or_else(|| self.0.new_span_id(), |(_, s)| s)
    }
}

/// Hands a finished span to the batch processor (dropped and counted when its queue is full).
pub fn record(span: Span) {
    if let Some(t) = TRACES.get() {
        build(&t.tracer, span);
    }
}

fn build(tracer: &SdkTracer, span: Span) {
    let (kind, remote) = match span.kind {
        Kind::Server => (SpanKind::Server, true),
        Kind::Client => (SpanKind::Client, false),
    };
    let parent = match span.parent {
        Some(p) => parent_context(span.trace_id, p, true, remote, span.trace_state.as_deref()),
        None => Context::new(),
    };
    let builder = tracer
        .span_builder(span.name)
        .with_kind(kind)
        .with_start_time(time(span.start))
        .with_attributes(span.attributes);
    NEXT_IDS.with(|n| {
        n.set(Some((
            TraceId::from_bytes(span.trace_id),
            SpanId::from_bytes(span.span_id),
        )))
    });
    let mut built = tracer.build_with_context(builder, &parent);
    NEXT_IDS.with(|n| n.set(None));
    if let Some(message) = span.error {
        built.set_status(Status::error(message));
    }
    built.end_with_timestamp(time(span.end));
}

/// Records one MCP operation in `mcp.server.operation.duration` (OTLP; `/metrics` has its own
/// histogram, see `metrics.rs`).
pub fn operation_duration(seconds: f64, attributes: &[KeyValue]) {
    if let Some(m) = METERS.get() {
        m.operation.record(seconds, attributes);
    }
}

/// Records one ended MCP session in `mcp.server.session.duration` (OTLP).
pub fn session_duration(seconds: f64, attributes: &[KeyValue]) {
    if let Some(m) = METERS.get() {
        m.session.record(seconds, attributes);
    }
}

/// Exports what is queued and stops both providers (on SIGTERM, after the in-flight calls
/// drained); gives up after `timeout`.
pub async fn shutdown(timeout: Duration) {
    let traces = TRACES.get().map(|t| t.provider.clone());
    let meters = METERS.get().map(|m| m.provider.clone());
    if traces.is_none() && meters.is_none() {
        return;
    }
    // The SDK blocks the calling thread while its own threads export through this runtime; the
    // two run side by side, so each has the whole `timeout`.
    let traces = tokio::task::spawn_blocking(move || {
        if let Some(p) = traces {
            let _ = p.shutdown_with_timeout(timeout);
        }
    });
    let meters = tokio::task::spawn_blocking(move || {
        if let Some(m) = meters {
            let _ = m.shutdown_with_timeout(timeout);
        }
    });
    let _ = tokio::time::timeout(timeout + Duration::from_millis(200), async {
        let _ = tokio::join!(traces, meters);
    })
    .await;
}

/// A bounded queue in front of the SDK's batch processor. `pending` counts the spans handed to
/// it that no export has taken yet, which is at least what its channel holds, so the processor
/// itself never drops one: every drop happens here, and is counted.
#[derive(Debug)]
struct Bounded<P> {
    inner: P,
    pending: Arc<AtomicUsize>,
    capacity: usize,
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.pending.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            crate::metrics::METRICS.spans_dropped.inc();
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The OTLP exporter, releasing [`Bounded`]'s count as batches leave and logging the first
/// failure of a streak (the SDK's own logs are off).
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    pending: Arc<AtomicUsize>,
    failures: AtomicU32,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        self.pending.fetch_sub(batch.len(), Ordering::AcqRel);
        let export = self.inner.export(batch);
        async move {
            let result = export.await;
            match &result {
                Ok(()) => self.failures.store(0, Ordering::Relaxed),
                Err(e) => {
                    if self.failures.fetch_add(1, Ordering::Relaxed) == 0 {
                        tracing::warn!(error = %e, "OTLP span export failed; the spans of this batch are lost");
                    }
                }
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

type HyperClient = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// The exporters' HTTP client: the proxy's hyper client with rustls, on the proxy's runtime.
#[derive(Debug, Clone)]
struct Transport {
    client: HyperClient,
    runtime: tokio::runtime::Handle,
}

impl Transport {
    fn new() -> Result<Self, String> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .map_err(|e| format!("no TLS roots for the OTLP endpoint: {e}"))?
            .https_or_http()
            .enable_http1()
            .build();
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(https);
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| e.to_string())?;
        Ok(Self { client, runtime })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Transport {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, Full::new(body));
        let task = self.runtime.spawn(async move {
            let exchange = async {
                let resp = client.request(request).await?;
                let (parts, body) = resp.into_parts();
                // A collector answers with a small status message; more is not read.
                let body = Limited::new(body, 1 << 20).collect().await?.to_bytes();
                Ok::<_, opentelemetry_http::HttpError>(http::Response::from_parts(parts, body))
            };
            match tokio::time::timeout(EXPORT_TIMEOUT, exchange).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer from the OTLP endpoint in {EXPORT_TIMEOUT:?}").into()),
            }
        });
        task.await?
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Whether a signal (`TRACES`, `METRICS`) has an endpoint and is not turned off.
fn signal_on(signal: &str) -> bool {
    let exporter = env(&format!("OTEL_{signal}_EXPORTER")).unwrap_or_default();
    if exporter.eq_ignore_ascii_case("none") {
        return false;
    }
    env(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")).is_some() || env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some()
}

/// The resource: what the SDK reads (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
/// `telemetry.sdk.*`), `toolgate-proxy` as the service name when neither names one, and the
/// version.
fn resource() -> Resource {
    let named = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|p| p.split_once('=').is_some_and(|(k, _)| k.trim() == "service.name"))
        });
    let mut builder = Resource::builder();
    if !named {
        builder = builder.with_service_name("toolgate-proxy");
    }
    builder
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build()
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder("toolgate-proxy")
        .with_version(env!("CARGO_PKG_VERSION"))
        .build()
}

/// Starts the exporters the environment asks for; call once inside the runtime.
pub fn init_from_env() {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return;
    }
    let (traces, metrics) = (signal_on("TRACES"), signal_on("METRICS"));
    if !traces && !metrics {
        return;
    }
    for var in [
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
    ] {
        if let Some(p) = env(var).filter(|p| p != "http/protobuf") {
            tracing::warn!(variable = var, protocol = %p, "only http/protobuf is supported; exporting over http/protobuf");
        }
    }
    let transport = match Transport::new() {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "telemetry export is off");
            return;
        }
    };
    let resource = resource();
    if traces {
        match init_traces(&transport, resource.clone()) {
            Ok(t) => {
                let _ = TRACES.set(t);
                tracing::info!("exporting traces over OTLP/HTTP");
            }
            Err(e) => tracing::error!(error = %e, "traces are off"),
        }
    }
    if metrics {
        match init_metrics(&transport, resource) {
            Ok(m) => {
                let _ = METERS.set(m);
                tracing::info!("exporting MCP metrics over OTLP/HTTP");
            }
            Err(e) => tracing::error!(error = %e, "OTLP metrics are off"),
        }
    }
}

/// An OTLP/HTTP exporter builder on `transport`, protobuf, with the export timeout.
fn over<B: WithExportConfig + WithHttpConfig>(builder: B, transport: &Transport) -> B {
    builder
        .with_http_client(transport.clone())
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_timeout(EXPORT_TIMEOUT)
}

fn init_traces(transport: &Transport, resource: Resource) -> Result<Traces, String> {
    let name = env("OTEL_TRACES_SAMPLER").unwrap_or_default();
    let sampler = sampler(&name, env("OTEL_TRACES_SAMPLER_ARG").as_deref()).unwrap_or_else(|other| {
        tracing::warn!(sampler = %other, "unknown OTEL_TRACES_SAMPLER; using parentbased_always_on");
        Sampler::ParentBased(Box::new(Sampler::AlwaysOn))
    });
    let exporter = over(opentelemetry_otlp::SpanExporter::builder().with_http(), transport)
        .build()
        .map_err(|e| e.to_string())?;
    let capacity = env("OTEL_BSP_MAX_QUEUE_SIZE")
        .and_then(|q| q.parse::<usize>().ok())
        .filter(|q| *q > 0)
        .unwrap_or(DEFAULT_QUEUE);
    let pending = Arc::new(AtomicUsize::new(0));
    let exporter = Counted {
        inner: exporter,
        pending: pending.clone(),
        failures: AtomicU32::new(0),
    };
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(BatchConfigBuilder::default().with_max_queue_size(capacity).build())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Bounded {
            inner: batch,
            pending,
            capacity,
        })
        .with_sampler(sampler.clone())
        .with_id_generator(Preset::default())
        .with_resource(resource)
        .build();
    let tracer = provider.tracer_with_scope(scope());
    Ok(Traces {
        provider,
        tracer,
        sampler,
    })
}

fn init_metrics(transport: &Transport, resource: Resource) -> Result<Meters, String> {
    let exporter = over(opentelemetry_otlp::MetricExporter::builder().with_http(), transport)
        .build()
        .map_err(|e| e.to_string())?;
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter).build())
        .with_resource(resource)
        .build();
    let meter = provider.meter_with_scope(scope());
    let operation = meter
        .f64_histogram("mcp.server.operation.duration")
        .with_unit("s")
        .with_description(
            "MCP request or notification duration as observed on the receiver from the time it was received until the result or ack is sent.",
        )
        .with_boundaries(DURATION_BUCKETS.to_vec())
        .build();
    let session = meter
        .f64_histogram("mcp.server.session.duration")
        .with_unit("s")
        .with_description("The duration of the MCP session as observed on the MCP server.")
        .with_boundaries(DURATION_BUCKETS.to_vec())
        .build();
    Ok(Meters {
        provider,
        operation,
        session,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(s: &Sampler, trace_id: [u8; 16], parent: Option<bool>) -> bool {
        let cx = match parent {
            Some(p) => parent_context(trace_id, [7; 8], p, true, None),
            None => Context::new(),
        };
        s.should_sample(
            Some(&cx),
            TraceId::from_bytes(trace_id),
            "",
            &SpanKind::Server,
            &[],
            &[],
        )
        .decision
            == SamplingDecision::RecordAndSample
    }

    #[test]
    fn samplers_follow_the_environment_names() {
        let ids: Vec<[u8; 16]> = (0u64..4000)
            .map(|i| {
                let mut id = [0u8; 16];
                id[8..].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
                id
            })
            .collect();
        let quarter = sampler("parentbased_traceidratio", Some("0.25")).unwrap();
        let hits = ids.iter().filter(|id| decide(&quarter, **id, None)).count();
        assert!((800..1200).contains(&hits), "{hits} of 4000 new traces at 25%");
        assert!(ids
            .iter()
            .all(|id| decide(&quarter, *id, None) == decide(&quarter, *id, None)));
        assert!(decide(&quarter, ids[0], Some(true)), "a sampled parent is followed");
        assert!(
            !decide(&quarter, ids[0], Some(false)),
            "an unsampled parent is followed"
        );

        let default = sampler("", None).unwrap();
        assert!(decide(&default, ids[1], None));
        assert!(!decide(&default, ids[1], Some(false)));
        let on = sampler("always_on", None).unwrap();
        assert!(decide(&on, ids[1], Some(false)), "always_on ignores the parent");
        let off = sampler("parentbased_always_off", None).unwrap();
        assert!(!decide(&off, ids[1], None));
        assert!(decide(&off, ids[1], Some(true)));
        assert!(!decide(
            &sampler("traceidratio", Some("0")).unwrap(),
            ids[2],
            Some(true)
        ));
        assert_eq!(sampler("nonsense", None).unwrap_err(), "nonsense");
    }

    /// A processor that keeps what it gets, and an exporter that counts.
    #[derive(Debug, Default, Clone)]
    struct Keep(Arc<std::sync::Mutex<Vec<SpanData>>>);

    impl SpanProcessor for Keep {
        fn on_start(&self, _: &mut opentelemetry_sdk::trace::Span, _: &Context) {}
        fn on_end(&self, span: SpanData) {
            self.0.lock().unwrap().push(span);
        }
        fn force_flush(&self) -> OTelSdkResult {
            Ok(())
        }
        fn shutdown_with_timeout(&self, _: Duration) -> OTelSdkResult {
            Ok(())
        }
    }

    #[derive(Debug, Default)]
    struct Count(AtomicUsize);

    impl SpanExporter for Count {
        fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
            self.0.fetch_add(batch.len(), Ordering::Relaxed);
            async { Ok(()) }
        }
    }

    /// Builds `spans` as `record` does, on a provider of the test's own; what it exported.
    fn built(spans: Vec<Span>) -> Vec<SpanData> {
        let keep = Keep::default();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(keep.clone())
            .with_id_generator(Preset::default())
            .build();
        let tracer = provider.tracer("test");
        for s in spans {
            build(&tracer, s);
        }
        let out = keep.0.lock().unwrap().clone();
        out
    }

    fn span(kind: Kind, parent: Option<[u8; 8]>, state: Option<&str>) -> Span {
        Span {
            trace_id: [0xab; 16],
            span_id: [1; 8],
            parent,
            trace_state: state.map(str::to_string),
            name: "tools/call get_customer".into(),
            kind,
            start: 1_000,
            end: 2_000,
            attributes: vec![KeyValue::new("gen_ai.tool.name", "get_customer")],
            error: Some("JSON-RPC error -32602".into()),
        }
    }

    #[test]
    fn spans_keep_the_ids_the_request_carries_and_the_clients_tracestate() {
        let spans = built(vec![
            span(Kind::Server, Some([2; 8]), Some("vendor=abc,other=x")),
            span(Kind::Client, None, None),
        ]);
        let server = &spans[0];
        assert_eq!(server.span_context.trace_id(), TraceId::from_bytes([0xab; 16]));
        assert_eq!(server.span_context.span_id(), SpanId::from_bytes([1; 8]));
        assert_eq!(server.parent_span_id, SpanId::from_bytes([2; 8]));
        assert_eq!(server.span_kind, SpanKind::Server);
        assert_eq!(server.span_context.trace_state().header(), "vendor=abc,other=x");
        assert_eq!(server.start_time, time(1_000));
        assert_eq!(server.end_time, time(2_000));
        assert!(matches!(&server.status, Status::Error { description } if description == "JSON-RPC error -32602"));
        let root = &spans[1];
        assert_eq!(
            root.span_context.trace_id(),
            TraceId::from_bytes([0xab; 16]),
            "a new trace keeps its id too"
        );
        assert_eq!(root.parent_span_id, SpanId::INVALID);
        // Outside `build`, ids are random.
        let g = Preset::default();
        assert_ne!(g.new_span_id(), SpanId::from_bytes([1; 8]));
        assert_ne!(g.new_span_id(), SpanId::INVALID);
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_and_an_export_frees_room() {
        let sample = built(vec![span(Kind::Server, None, None)]).remove(0);
        let pending = Arc::new(AtomicUsize::new(0));
        let bounded = Bounded {
            inner: Keep::default(),
            pending: pending.clone(),
            capacity: 3,
        };
        let before = crate::metrics::METRICS.spans_dropped.get();
        for _ in 0..5 {
            bounded.on_end(sample.clone());
        }
        assert_eq!(bounded.inner.0.lock().unwrap().len(), 3, "the queue holds 3");
        assert!(
            crate::metrics::METRICS.spans_dropped.get() >= before + 2,
            "2 counted as dropped"
        );
        assert_eq!(pending.load(Ordering::Relaxed), 3);
        let exporter = Counted {
            inner: Count::default(),
            pending: pending.clone(),
            failures: AtomicU32::new(0),
        };
        let batch: Vec<SpanData> = bounded.inner.0.lock().unwrap().drain(..).collect();
        exporter.export(batch).await.unwrap();
        assert_eq!(exporter.inner.0.load(Ordering::Relaxed), 3);
        assert_eq!(pending.load(Ordering::Relaxed), 0, "an export frees the queue");
        bounded.on_end(sample);
        assert_eq!(bounded.inner.0.lock().unwrap().len(), 1);
    }
}
