//! The admin listener: `/healthz` (the process serves), `/readyz` (a config is loaded and the
//! proxy is not draining).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{Request, Response, StatusCode};
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

/// Serves one admin request.
pub async fn handle<B>(shared: Arc<Shared>, req: Request<B>) -> Response<Body> {
    match req.uri().path() {
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
            json!({"error": "not found", "endpoints": ["/healthz", "/readyz"]}),
        ),
    }
}
