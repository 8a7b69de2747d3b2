//! Telemetry shared by both binaries: Linux process metrics for a `prometheus` registry, the
//! text exposition, and a log filter that can be changed while the process runs.
#![forbid(unsafe_code)]

pub mod log;
pub mod process;

use prometheus::{Encoder, Registry, TextEncoder};

/// Content type of the Prometheus text format.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The text exposition of every metric in `registry`.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut buf) {
        tracing::warn!(error = %e, "metrics encoding failed");
    }
    String::from_utf8(buf).unwrap_or_default()
}

/// The metric family names of `collectors`, also those with no sample yet, plus the
/// `process_*` names: what a dashboard or an alert may query.
pub fn names(collectors: &[&dyn prometheus::core::Collector]) -> Vec<String> {
    let mut names: Vec<String> = collectors
        .iter()
        .flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()))
        .collect();
    names.extend(process::NAMES.iter().map(|n| n.to_string()));
    names
}
