//! The transport floor under a Toolgate call, measured beside the proxy by
//! `bench/proxy-vs-direct.sh`: the proxy's HTTP server settings and its upstream client
//! (`toolgate_proxy::upstream::Upstream`, the same pooled connections) with nothing between
//! them. Each POST is read whole and answered with the body of `GET {UPSTREAM}{PATH}`: no
//! JSON-RPC, no validation, mapping, shaping or envelope, no metrics. What the proxy costs over
//! this is what its MCP work costs; what this costs over the direct request is the price of a
//! second HTTP exchange on this machine. It runs on the proxy's runtime
//! (`toolgate_proxy::server::tokio_runtime`), so `TOOLGATE_WORKER_THREADS` sets both.
//!
//!   cargo run --release -p toolgate-proxy --example passthrough -- 127.0.0.1:9000 http://127.0.0.1:8080 /customers/42

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use toolgate_proxy::upstream::Upstream;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    // The proxy's runtime too (TOOLGATE_WORKER_THREADS, current-thread with one worker).
    toolgate_proxy::server::tokio_runtime()?.block_on(serve())
}

async fn serve() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(base), Some(path)) = (args.next(), args.next(), args.next()) else {
        anyhow::bail!("usage: passthrough LISTEN UPSTREAM_BASE_URL PATH");
    };
    let cfg: toolgate_config::UpstreamConfig = serde_json::from_value(serde_json::json!({"baseUrl": base}))?;
    let upstream = Arc::new(Upstream::new(&cfg)?);
    let path: Arc<str> = path.into();
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    // The proxy's server settings (proxy/src/server.rs).
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .keep_alive(true);
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (upstream, path) = (upstream.clone(), path.clone());
        let svc = service_fn(move |req| forward(upstream.clone(), path.clone(), req));
        let conn = http.serve_connection(TokioIo::new(stream), svc);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

async fn forward(
    upstream: Arc<Upstream>,
    path: Arc<str>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    // The request body is read whole, as the proxy reads a JSON-RPC message.
    if Limited::new(req.into_body(), 1 << 20).collect().await.is_err() {
        return Ok(status(StatusCode::BAD_REQUEST));
    }
    let Ok(uri) = upstream.uri(&path) else {
        return Ok(status(StatusCode::INTERNAL_SERVER_ERROR));
    };
    let Ok(call) = Request::get(uri).body(Full::new(Bytes::new())) else {
        return Ok(status(StatusCode::INTERNAL_SERVER_ERROR));
    };
    Ok(match upstream.send(call, Duration::from_secs(25)).await {
        Ok(r) => {
            let mut resp = Response::new(Full::new(r.body));
            resp.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(_) => status(StatusCode::BAD_GATEWAY),
    })
}

fn status(code: StatusCode) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = code;
    resp
}
