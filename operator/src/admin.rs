//! Admin port: `/healthz` (the process runs), `/readyz` (watches started, or standing by
//! for the lease), `/metrics` (Prometheus text format), `/loglevel` (GET shows the log
//! filter; PUT with a filter such as `debug` replaces it).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tracing::warn;

use crate::metrics::Metrics;

/// Shared state of the admin endpoints.
pub struct Admin {
    /// Metrics to serve.
    pub metrics: Arc<Metrics>,
    /// Set once the process is ready.
    pub ready: AtomicBool,
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("response")
}

/// Answers one admin request.
pub async fn handle(admin: &Admin, req: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.uri().path() == "/loglevel" && req.method() == Method::PUT {
        // An operator action: from the pod itself (port-forward), not from the network.
        if !peer.ip().is_loopback() {
            return reply(
                StatusCode::FORBIDDEN,
                TEXT,
                "PUT /loglevel is accepted from loopback only\n".into(),
            );
        }
        let body = match Limited::new(req.into_body(), 4096).collect().await {
            Ok(b) => String::from_utf8_lossy(&b.to_bytes()).into_owned(),
            Err(_) => {
                return reply(
                    StatusCode::BAD_REQUEST,
                    TEXT,
                    "unreadable body (at most 4 KiB)\n".into(),
                )
            }
        };
        if body.trim().is_empty() {
            return reply(
                StatusCode::BAD_REQUEST,
                TEXT,
                "send a filter, for example `info` or `debug`\n".into(),
            );
        }
        return match toolgate_telemetry::log::set(&body) {
            Ok(()) => reply(
                StatusCode::OK,
                TEXT,
                format!("{}\n", toolgate_telemetry::log::current()),
            ),
            Err(e) => reply(StatusCode::BAD_REQUEST, TEXT, format!("{e}\n")),
        };
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            TEXT,
            "GET only (PUT for /loglevel)\n".into(),
        );
    }
    match req.uri().path() {
        "/loglevel" => reply(
            StatusCode::OK,
            TEXT,
            format!("{}\n", toolgate_telemetry::log::current()),
        ),
        "/healthz" => reply(StatusCode::OK, TEXT, "ok\n".into()),
        "/readyz" if admin.ready.load(Ordering::Relaxed) => reply(StatusCode::OK, TEXT, "ready\n".into()),
        "/readyz" => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "starting\n".into()),
        "/metrics" => reply(
            StatusCode::OK,
            toolgate_telemetry::METRICS_CONTENT_TYPE,
            admin.metrics.render(),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            TEXT,
            "not found: try /healthz, /readyz, /metrics or /loglevel\n".into(),
        ),
    }
}

/// Binds `addr` (fails fast when it cannot) and serves in the background.
pub async fn serve(addr: SocketAddr, admin: Arc<Admin>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let admin = admin.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let admin = admin.clone();
                    async move { Ok::<_, Infallible>(handle(&admin, req, peer).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(local)
}
