//! The admin listener: `/healthz` (the process serves), `/readyz` (a config is loaded and the
//! proxy is not draining), `/metrics` (Prometheus text format) and `/loglevel` (GET shows the
//! log filter, PUT with a filter such as `debug` or `info,toolgate_proxy=debug` replaces it).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::json;

use crate::mcp::{Body, Shared};

fn reply(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Body::new(body.to_string().into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut r = Response::new(Body::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    r
}

/// Serves one admin request.
pub async fn handle<B>(shared: Arc<Shared>, req: Request<B>, peer: std::net::SocketAddr) -> Response<Body>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match req.uri().path() {
        "/metrics" => {
            let m = &crate::metrics::METRICS;
            m.sessions_active
                .set(i64::try_from(shared.sessions.len()).unwrap_or(i64::MAX));
            m.upstream_in_flight
                .set(i64::try_from(shared.in_flight.count()).unwrap_or(i64::MAX));
            text(StatusCode::OK, toolgate_telemetry::METRICS_CONTENT_TYPE, m.render())
        }
        "/loglevel" if req.method() == Method::PUT => {
            // Changing the log level is an operator action: from the pod itself (kubectl exec or
            // port-forward), not from anyone who can reach the admin port over the network.
            if !peer.ip().is_loopback() {
                return reply(
                    StatusCode::FORBIDDEN,
                    json!({"error": "PUT /loglevel is accepted from loopback only (kubectl port-forward)"}),
                );
            }
            let body = match http_body_util::Limited::new(req.into_body(), 4096).collect().await {
                Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
                Err(_) => {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        json!({"error": "unreadable body (at most 4 KiB)"}),
                    )
                }
            };
            if body.trim().is_empty() {
                return reply(
                    StatusCode::BAD_REQUEST,
                    json!({"error": "send a filter, for example `info` or `info,toolgate_proxy=debug`"}),
                );
            }
            match toolgate_telemetry::log::set(&body) {
                Ok(()) => reply(StatusCode::OK, json!({"filter": toolgate_telemetry::log::current()})),
                Err(e) => reply(StatusCode::BAD_REQUEST, json!({"error": e})),
            }
        }
        "/loglevel" => reply(StatusCode::OK, json!({"filter": toolgate_telemetry::log::current()})),
        "/healthz" => reply(StatusCode::OK, json!({"status": "ok"})),
        "/readyz" => {
            let rt = shared.runtime.load();
            if shared.draining.load(Ordering::Relaxed) {
                reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({"ready": false, "reason": "draining"}),
                )
            } else {
                let audit = shared.auditor.load();
                let stats = &audit.stats;
                let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
                reply(
                    StatusCode::OK,
                    json!({
                        "ready": true,
                        "generation": rt.generation,
                        "tools": rt.tools.len(),
                        "sessions": shared.sessions.len(),
                        "audit": {"healthy": audit.healthy(), "written": load(&stats.written),
                                  "dropped": load(&stats.dropped), "writeFailures": load(&stats.write_failures)},
                    }),
                )
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({"error": "not found", "endpoints": ["/healthz", "/readyz", "/metrics", "/loglevel"]}),
        ),
    }
}
