//! The admin listener: `/healthz` (the process serves), `/readyz` (a config is loaded and the
//! proxy is not draining), `/metrics` (Prometheus text format; on its own listener when
//! `server.metricsListen` is set) and `/loglevel` (GET shows the log filter; PUT with a filter
//! such as `debug` or `info,toolgate_proxy=debug` and the admin token replaces it).

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

/// Which admin listener a request arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// `server.adminListen`; `metrics` says whether it serves `/metrics` too.
    Admin {
        /// `/metrics` is served here (no `server.metricsListen`).
        metrics: bool,
    },
    /// `server.metricsListen`: `/metrics` only.
    Metrics,
}

/// A scrape. Rendered off the workers: with a thousand called tools it is megabytes of text, and
/// a proxy with one worker would stop answering calls while it is written.
async fn metrics(shared: &Shared) -> Response<Body> {
    let m = &crate::metrics::METRICS;
    m.sessions_active
        .set(i64::try_from(shared.sessions.len()).unwrap_or(i64::MAX));
    m.upstream_in_flight
        .set(i64::try_from(shared.in_flight.count()).unwrap_or(i64::MAX));
    match tokio::task::spawn_blocking(|| crate::metrics::METRICS.render()).await {
        Ok(body) => text(StatusCode::OK, toolgate_telemetry::METRICS_CONTENT_TYPE, body),
        Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"error": "the metrics could not be rendered"}),
        ),
    }
}

/// Whether `headers` carry the admin token (`Authorization: Bearer <token>`).
fn has_admin_token(shared: &Shared, headers: &http::HeaderMap) -> bool {
    let Some(want) = shared.runtime.load().admin_token else {
        return false;
    };
    crate::policy::auth::bearer(headers).is_some_and(|t| crate::policy::credentials::digest(t.as_bytes()) == want)
}

/// Serves one admin request.
pub async fn handle<B>(shared: Arc<Shared>, req: Request<B>, listener: Listener) -> Response<Body>
where
    B: hyper::body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if listener == Listener::Metrics {
        return match req.uri().path() {
            "/metrics" => metrics(&shared).await,
            _ => reply(
                StatusCode::NOT_FOUND,
                json!({"error": "not found", "endpoints": ["/metrics"]}),
            ),
        };
    }
    match req.uri().path() {
        "/metrics" if listener == (Listener::Admin { metrics: true }) => metrics(&shared).await,
        "/loglevel" if req.method() == Method::PUT => {
            // Changing the log level is an operator action. Coming from loopback proves nothing
            // in a pod (every container shares it), so the request must carry the admin token.
            if shared.runtime.load().admin_token.is_none() {
                return reply(
                    StatusCode::FORBIDDEN,
                    json!({"error": "PUT /loglevel is disabled: set server.adminTokenFile (a mounted Secret) to enable it"}),
                );
            }
            if !has_admin_token(&shared, req.headers()) {
                let mut r = reply(
                    StatusCode::UNAUTHORIZED,
                    json!({"error": "PUT /loglevel needs `Authorization: Bearer <token>` with the token of server.adminTokenFile"}),
                );
                r.headers_mut()
                    .insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static("Bearer"));
                return r;
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
                Ok(()) => {
                    tracing::info!(filter = %toolgate_telemetry::log::current(), "log filter replaced through PUT /loglevel");
                    reply(StatusCode::OK, json!({"filter": toolgate_telemetry::log::current()}))
                }
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
                        // Stale OAuth keys are reported, not failed on: failing readiness during an
                        // identity provider's outage would take every replica out at once.
                        "jwks": rt.auth.jwks_status(),
                        // The shared store, likewise: `failurePolicy` says what calls get meanwhile.
                        "store": shared.store.load().as_ref().map(|s| s.status()),
                    }),
                )
            }
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            json!({"error": "not found", "endpoints": if listener == (Listener::Admin { metrics: true }) {
                json!(["/healthz", "/readyz", "/metrics", "/loglevel"])
            } else {
                json!(["/healthz", "/readyz", "/loglevel"])
            }}),
        ),
    }
}
