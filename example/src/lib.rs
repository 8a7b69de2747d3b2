//! A small, real REST service that the Toolgate quickstart, tests and benchmarks put the
//! proxy in front of: customers, tickets and payments, plus a few endpoints that misbehave on
//! purpose (slow, arbitrary status, non-JSON, echo) so failure handling can be exercised.

#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;

#[derive(Default)]
struct State {
    next_ticket: AtomicU64,
    next_job: AtomicU64,
    requests: AtomicU64,
}

/// Binds `addr` and serves until SIGTERM or Ctrl-C, then drains in-flight requests. Says
/// `example-service listening on http://ADDR` on stderr, with the port bound (`--listen
/// 127.0.0.1:0` picks a free one), once SIGTERM is handled: a signal sent after that line
/// drains, never kills.
pub async fn run(addr: SocketAddr) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let listener = TcpListener::bind(addr).await?;
    eprintln!("example-service listening on http://{}", listener.local_addr()?);
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    serve_until(listener, shutdown).await
}

/// Starts the service on an ephemeral loopback port in the background; returns its address.
pub async fn spawn() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = serve(listener).await;
    });
    Ok(addr)
}

/// Serves HTTP/1.1 on `listener` until the task ends.
pub async fn serve(listener: TcpListener) -> anyhow::Result<()> {
    serve_until(listener, std::future::pending()).await
}

/// How long in-flight requests may take to finish after the shutdown signal.
const DRAIN: Duration = Duration::from_secs(10);

/// Serves HTTP/1.1 on `listener` until `shutdown` completes; then stops accepting, lets open
/// connections finish their request (keep-alive ones are closed after it) for up to [`DRAIN`],
/// and returns. As PID 1 in a container nothing else handles SIGTERM, so without this every
/// rollout would wait out the pod's whole grace period.
pub async fn serve_until(listener: TcpListener, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    let state = Arc::new(State {
        next_ticket: AtomicU64::new(1000),
        ..State::default()
    });
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let svc = service_fn(move |req| handle(state.clone(), req));
        let conn = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
            .http1_only()
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        eprintln!("example-service: connections still open after {DRAIN:?}; exiting");
    }
    Ok(())
}

fn reply(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_default()
}

fn customer(id: &str) -> Option<Value> {
    match id {
        "42" => Some(json!({
            "id": "42", "name": "Ana López", "email": "ana@example.test", "phone": "+5215550000042",
            "balance": 1250.5, "plan": "fiber-300", "internalNotes": "VIP; never call before 10am"
        })),
        "7" => Some(json!({
            "id": "7", "name": "Bruno Díaz", "email": "bruno@example.test", "phone": "+5215550000007",
            "balance": 0.0, "plan": "fiber-100", "internalNotes": "disputed invoice 2026-10"
        })),
        _ => None,
    }
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    state.requests.fetch_add(1, Ordering::Relaxed);
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers: serde_json::Map<String, Value> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                Value::String(v.to_str().unwrap_or("<binary>").to_string()),
            )
        })
        .collect();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(reply(StatusCode::BAD_REQUEST, &json!({"error": "unreadable body"}))),
    };
    let parsed: Option<Value> = if body.is_empty() {
        None
    } else {
        serde_json::from_slice(&body).ok()
    };
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();

    let resp = match (method.as_str(), segments.as_slice()) {
        ("GET", ["health"]) => reply(StatusCode::OK, &json!({"status": "ok"})),
        ("GET", ["customers", id]) => match customer(&percent_decode(id)) {
            Some(c) => reply(StatusCode::OK, &c),
            None => reply(StatusCode::NOT_FOUND, &json!({"error": "customer not found"})),
        },
        ("GET", ["customers"]) => {
            let q = query_param(&query, "query").unwrap_or_default().to_lowercase();
            let limit = query_param(&query, "limit")
                .and_then(|l| l.parse::<usize>().ok())
                .unwrap_or(10);
            let matches: Vec<Value> = ["42", "7"]
                .iter()
                .filter_map(|id| customer(id))
                .filter(|c| {
                    q.is_empty()
                        || c["name"].as_str().unwrap_or("").to_lowercase().contains(&q)
                        || c["phone"].as_str().unwrap_or("").contains(&q)
                        || c["id"] == q.as_str()
                })
                .take(limit)
                .map(|c| json!({"id": c["id"], "name": c["name"], "phone": c["phone"]}))
                .collect();
            reply(StatusCode::OK, &json!({"matches": matches, "count": matches.len()}))
        }
        ("POST", ["tickets"]) => {
            let Some(Value::Object(b)) = parsed else {
                return Ok(reply(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": "JSON object body required"}),
                ));
            };
            let customer_id = b.get("customerId").and_then(Value::as_str).unwrap_or("");
            if customer(customer_id).is_none() {
                reply(StatusCode::NOT_FOUND, &json!({"error": "customer not found"}))
            } else if b.get("subject").and_then(Value::as_str).is_none_or(str::is_empty) {
                reply(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &json!({"error": "subject is required"}),
                )
            } else {
                let n = state.next_ticket.fetch_add(1, Ordering::Relaxed);
                reply(
                    StatusCode::CREATED,
                    &json!({"ticketId": format!("T-{n}"), "ticketUrl": format!("/tickets/T-{n}"), "status": "created",
                            "customerId": customer_id, "priority": b.get("priority").cloned().unwrap_or(json!("normal"))}),
                )
            }
        }
        ("DELETE", ["tickets", id]) => reply(
            StatusCode::OK,
            &json!({"ticketId": percent_decode(id), "status": "deleted"}),
        ),
        ("POST", ["payments"]) => {
            let n = state.next_job.fetch_add(1, Ordering::Relaxed);
            reply(
                StatusCode::ACCEPTED,
                &json!({"jobId": format!("job-{n}"), "queuedAt": "2026-01-01T00:00:00Z"}),
            )
        }
        ("POST", ["confirmations"]) => reply(
            StatusCode::CONFLICT,
            &json!({"candidates": [{"id": "42", "name": "Ana López"}, {"id": "7", "name": "Bruno Díaz"}]}),
        ),
        ("GET", ["slow"]) => {
            let ms = query_param(&query, "ms")
                .and_then(|m| m.parse::<u64>().ok())
                .unwrap_or(1000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            reply(StatusCode::OK, &json!({"slept": ms}))
        }
        ("GET", ["status", code]) => {
            let code = code
                .parse::<u16>()
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::BAD_REQUEST);
            reply(
                code,
                &json!({"code": code.as_u16(), "error": "as requested", "trace": "at Service.handle (internal.rs:42)"}),
            )
        }
        ("GET", ["text"]) => Response::builder()
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from_static(b"plain text, not JSON")))
            .unwrap_or_default(),
        ("GET", ["array"]) => reply(StatusCode::OK, &json!([{"id": 1}, {"id": 2}])),
        ("GET", ["big"]) => {
            let n = query_param(&query, "bytes")
                .and_then(|m| m.parse::<usize>().ok())
                .unwrap_or(1 << 20);
            reply(StatusCode::OK, &json!({"blob": "x".repeat(n)}))
        }
        ("GET", ["stats"]) => reply(
            StatusCode::OK,
            &json!({"requests": state.requests.load(Ordering::Relaxed)}),
        ),
        (_, ["echo", ..]) => reply(
            StatusCode::OK,
            &json!({
                "method": method.as_str(), "path": path, "query": query, "headers": headers,
                "body": parsed.clone().unwrap_or(Value::Null),
                "rawBody": if parsed.is_none() { Value::String(String::from_utf8_lossy(&body).into_owned()) } else { Value::Null },
            }),
        ),
        _ => reply(StatusCode::NOT_FOUND, &json!({"error": "no such route"})),
    };
    Ok(resp)
}
