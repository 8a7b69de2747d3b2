//! The proxy under hostile input: schemas whose patterns would backtrack, argument objects built
//! to make validation expensive, and refused or throttled `tools/call`s sent chunked, large or
//! malformed, each of which must still leave exactly one audit record.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{base_headers, client, send, Session};
use http::StatusCode;
use serde_json::{json, Value};
use toolgate_proxy::{start, Running, StartOptions};

const TOOLS: &str = r#"
tools:
  - name: get_customer
    inputSchema: {type: object, required: [customerId], properties: {customerId: {type: string}}}
    http: {method: GET, path: "/customers/{customerId}"}
  - name: tag_items
    inputSchema:
      type: object
      properties:
        items: {type: array, items: {type: string, pattern: "^(a|b)*a(a|b){12}c$"}}
    http: {method: GET, path: /customers/42}
"#;

struct Setup {
    proxy: Running,
    dir: PathBuf,
    url: String,
}

/// The proxy in front of the example service, auditing to a file, with `policy` lines added and
/// requests up to `max_body` bytes.
async fn setup(name: &str, max_body: usize, policy: &str) -> Setup {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = std::env::temp_dir().join(format!("toolgate-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let text = format!(
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nserver: {{listen: '127.0.0.1:0', adminListen: '127.0.0.1:0', maxBodyBytes: {max_body}}}\nupstream: {{baseUrl: 'http://{upstream}'}}\npolicy:\n  audit: {{sink: file, path: '{}/audit.jsonl'}}\n{policy}{TOOLS}",
        dir.display()
    );
    let cfg = toolgate_config::parse_yaml(&text).unwrap_or_else(|e| panic!("{e}"));
    let proxy = start(cfg, StartOptions::default()).await.unwrap();
    let url = format!("http://{}/mcp", proxy.mcp_addr);
    Setup { proxy, dir, url }
}

impl Setup {
    /// The audit records once there are at least `n` (or after 5 s), then 200 ms more to catch
    /// any extra record that should not be there.
    async fn audit(&self, n: usize) -> Vec<Value> {
        let read = || {
            std::fs::read_to_string(self.dir.join("audit.jsonl"))
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<Value>>()
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while read().len() < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        read()
    }
}

/// Each record's JSON-RPC id, decision and reason.
fn outcomes(records: &[Value]) -> Vec<(Value, &str, &str)> {
    records
        .iter()
        .map(|r| {
            (
                r["jsonrpcId"].clone(),
                r["decision"].as_str().unwrap(),
                r["reason"].as_str().unwrap(),
            )
        })
        .collect()
}

/// Sends `chunks` as one chunked POST over a raw connection (off the test's runtime, which also
/// runs the proxy); returns the status and body.
async fn post_chunked(addr: SocketAddr, headers: &[(&str, &str)], chunks: &[&[u8]]) -> (u16, String) {
    let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let chunks: Vec<Vec<u8>> = chunks.iter().map(|c| c.to_vec()).collect();
    tokio::task::spawn_blocking(move || post_chunked_blocking(addr, &headers, &chunks))
        .await
        .unwrap()
}

fn post_chunked_blocking(addr: SocketAddr, headers: &[(String, String)], chunks: &[Vec<u8>]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req =
        String::from("POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    for c in chunks {
        // The peer may answer and close before the last chunk: what it does then is the test.
        if s.write_all(format!("{:x}\r\n", c.len()).as_bytes()).is_err()
            || s.write_all(c).is_err()
            || s.write_all(b"\r\n").is_err()
        {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

const JSON: (&str, &str) = ("content-type", "application/json");

fn call(id: u64, tool: &str, args: &Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": tool, "arguments": args}}).to_string()
}

#[test]
fn a_pattern_that_needs_backtracking_is_refused_when_the_config_loads() {
    let text = "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {baseUrl: 'http://127.0.0.1:8080'}\ntools:\n  - name: redos\n    inputSchema: {type: object, properties: {items: {type: array, items: {type: string, pattern: '^(a*)*\\1b'}}}}\n    http: {method: GET, path: /x}\n";
    let err = toolgate_config::parse_yaml(text).unwrap_err().to_string();
    assert!(err.contains("tools[0] (redos).inputSchema"), "{err}");
    assert!(
        err.contains(r#""^(a*)*\\1b" needs a backtracking regex engine"#),
        "{err}"
    );
}

// The proxy runs on the test's runtime: two workers, as in a pod on two cores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_hostile_arguments_are_answered_while_the_probes_stay_responsive() {
    let s = setup(
        "heavy",
        1 << 20,
        "  rateLimit: {perIp: {requests: 1000000}, perIdentity: {requests: 1000000}}\n",
    )
    .await;
    // About 900 KiB of strings that drive the pattern's automaton through its worst states.
    let item = format!("{}b", "ab".repeat(60));
    let args = json!({"items": vec![item; 7400]});
    let body = call(1, "tag_items", &args);
    assert!(body.len() > 800 * 1024, "{}", body.len());
    let session = Session::open(client(), s.url.clone(), "2025-11-25").await;
    let calls: Vec<_> = (0..2)
        .map(|_| {
            let (http, url, sid, body) = (client(), s.url.clone(), session.id.clone(), body.clone());
            tokio::spawn(async move {
                let mut h = base_headers();
                h.push(("mcp-session-id", &sid));
                let started = Instant::now();
                let (status, _, resp) = send(&http, "POST", &url, &h, Bytes::from(body)).await;
                (
                    status,
                    serde_json::from_slice::<Value>(&resp).unwrap(),
                    started.elapsed(),
                )
            })
        })
        .collect();
    // The probes answer while both calls validate.
    let health = format!("http://{}/healthz", s.proxy.admin_addr);
    let http = client();
    let mut slowest = Duration::ZERO;
    while !calls.iter().all(|c| c.is_finished()) {
        let t = Instant::now();
        let probe = tokio::time::timeout(Duration::from_secs(5), send(&http, "GET", &health, &[], Bytes::new()));
        let (status, _, _) = probe.await.expect("/healthz answered");
        assert_eq!(status, 200);
        slowest = slowest.max(t.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        slowest < Duration::from_secs(1),
        "/healthz took {slowest:?} under two hostile calls"
    );
    for c in calls {
        let (status, resp, took) = c.await.unwrap();
        assert_eq!(status, 200, "{resp}");
        let env: Value = serde_json::from_str(resp["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(resp["result"]["isError"], true, "{env}");
        let code = env["errors"][0]["code"].as_str().unwrap();
        assert!(["invalid_argument", "validation_timeout"].contains(&code), "{env}");
        // Bounded by the validation deadline (2 s) whatever the schema.
        assert!(took < Duration::from_secs(6), "the call took {took:?}");
        // At most 50 violations are listed, then one entry counting the rest.
        assert!(
            env["errors"].as_array().unwrap().len() <= 51,
            "{}",
            env["errors"].as_array().unwrap().len()
        );
    }
}

#[tokio::test]
async fn throttled_calls_sent_chunked_or_large_are_audited_once_each() {
    let s = setup(
        "throttled",
        1 << 20,
        "  rateLimit: {perIp: {requests: 1, windowSeconds: 60}}\n",
    )
    .await;
    let addr = s.proxy.mcp_addr;
    // Spend the one allowed request on something that is not a call.
    let (status, _, _) = send(&client(), "POST", &s.url, &base_headers(), Bytes::from("{}")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // A throttled tools/call sent chunked, in small pieces.
    let small = call(11, "get_customer", &json!({"customerId": "42"}));
    let pieces: Vec<&[u8]> = small.as_bytes().chunks(7).collect();
    let (status, body) = post_chunked(addr, &[JSON], &pieces).await;
    assert_eq!(status, 429, "{body}");
    // A throttled tools/call of 200 KiB, chunked, with the tool named before the arguments.
    let large = call(
        12,
        "get_customer",
        &json!({"customerId": "42", "pad": "x".repeat(200 * 1024)}),
    );
    let pieces: Vec<&[u8]> = large.as_bytes().chunks(16 * 1024).collect();
    let (status, _) = post_chunked(addr, &[JSON], &pieces).await;
    assert_eq!(status, 429);
    // A throttled tools/list leaves no call record.
    let list = r#"{"jsonrpc":"2.0","id":13,"method":"tools/list"}"#;
    let (status, _) = post_chunked(addr, &[JSON], &[list.as_bytes()]).await;
    assert_eq!(status, 429);

    let records = s.audit(2).await;
    assert_eq!(records.len(), 2, "{records:#?}");
    for (r, id) in records.iter().zip([11, 12]) {
        assert_eq!(r["jsonrpcId"], id, "{r}");
        assert_eq!(
            (r["decision"].as_str(), r["reason"].as_str()),
            (Some("rate_limited"), Some("ip"))
        );
        assert_eq!(r["tool"], "get_customer");
        assert_eq!(
            r.get("arguments"),
            Some(&Value::Null),
            "nothing but the digest before authentication"
        );
    }
    assert!(
        records[0]["argumentsDigest"].is_string(),
        "a whole small body is digested"
    );
}

#[tokio::test]
async fn calls_refused_before_their_body_is_parsed_are_audited_once_each() {
    let s = setup("unparsed", 64 * 1024, "  rateLimit: {perIp: {requests: 1000000}}\n").await;
    let addr = s.proxy.mcp_addr;
    // Over maxBodyBytes (64 KiB), chunked: 413.
    let huge = call(21, "get_customer", &json!({"pad": "x".repeat(100 * 1024)}));
    let pieces: Vec<&[u8]> = huge.as_bytes().chunks(16 * 1024).collect();
    let (status, _) = post_chunked(addr, &[JSON], &pieces).await;
    assert_eq!(status, 413);
    // Cut short inside the arguments: not JSON, but id, method and tool came before the cut.
    let whole = call(22, "get_customer", &json!({"customerId": "42"}));
    let cut = &whole[..whole.len() - 6];
    let (status, _, _) = send(&client(), "POST", &s.url, &base_headers(), Bytes::from(cut.to_string())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // The wrong media type.
    let whole = call(23, "get_customer", &json!({"customerId": "42"}));
    let (status, _, _) = send(
        &client(),
        "POST",
        &s.url,
        &[("content-type", "text/plain")],
        Bytes::from(whole),
    )
    .await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let records = s.audit(3).await;
    assert_eq!(records.len(), 3, "{records:#?}");
    let got = outcomes(&records);
    assert_eq!(
        got,
        vec![
            (json!(21), "invalid", "payload_too_large"),
            (json!(22), "invalid", "parse_error"),
            (json!(23), "invalid", "unsupported_media_type"),
        ]
    );
    assert!(records.iter().all(|r| r["tool"] == "get_customer"), "{records:#?}");
}

#[tokio::test]
async fn host_refusals_batches_and_call_notifications_are_audited_once_each() {
    let s = setup("edges", 64 * 1024, "  rateLimit: {perIp: {requests: 1000000}}\n").await;
    let call_for = |id: u64| call(id, "get_customer", &json!({"customerId": "42"}));
    // A DNS-rebinding request: refused before anything else, still recorded.
    let mut h = base_headers();
    h.push(("host", "evil.example"));
    let (status, _, _) = send(&client(), "POST", &s.url, &h, Bytes::from(call_for(31))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // A batch holding two calls: refused whole, each recorded.
    let batch = format!("[{},{}]", call_for(32), call_for(33));
    let (status, _, _) = send(&client(), "POST", &s.url, &base_headers(), Bytes::from(batch)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // A call without an id is a notification: 202, not run, recorded as such.
    let note = json!({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "get_customer", "arguments": {"customerId": "42"}}});
    let (status, _, _) = send(
        &client(),
        "POST",
        &s.url,
        &base_headers(),
        Bytes::from(note.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);

    let records = s.audit(4).await;
    let got = outcomes(&records);
    assert_eq!(
        got,
        vec![
            (json!(31), "denied", "host_not_allowed"),
            (json!(32), "invalid", "batch"),
            (json!(33), "invalid", "batch"),
            (Value::Null, "invalid", "notification"),
        ]
    );
}

/// An idle TCP connection to `addr` from `source` (a loopback address of the test's choosing).
async fn idle_from(source: &str, addr: SocketAddr) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(format!("{source}:0").parse().unwrap()).unwrap();
    sock.connect(addr).await.unwrap()
}

/// Whether the proxy closed `conn` (EOF or reset) within `wait`.
async fn closed_within(conn: &mut tokio::net::TcpStream, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, conn.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test]
async fn idle_connections_cannot_lock_a_client_out() {
    let h = common::Harness::start_with("  maxConnections: 8\n  maxConnectionsPerIp: 4\n").await;
    let addr = h.proxy.mcp_addr;
    // One address gets its share and no more: the fifth connection is closed at once.
    let mut first = Vec::new();
    for _ in 0..4 {
        first.push(idle_from("127.0.0.2", addr).await);
    }
    let mut fifth = idle_from("127.0.0.2", addr).await;
    assert!(
        closed_within(&mut fifth, Duration::from_secs(2)).await,
        "over the per-address limit"
    );
    // Other addresses fill the rest of the limit with connections that never send a request.
    for _ in 0..4 {
        first.push(idle_from("127.0.0.3", addr).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A well-behaved client still gets in: the oldest unused connection makes room.
    let s = common::Session::open(h.http.clone(), h.url(), "2025-06-18").await;
    let (env, is_error) = s.envelope("get_customer", json!({"customerId": "42"})).await;
    assert!(!is_error, "{env}");
    assert!(
        closed_within(&mut first[0], Duration::from_secs(2)).await,
        "the oldest idle connection was closed"
    );
    let m = toolgate_proxy::metrics::METRICS.render();
    assert!(
        m.contains(r#"toolgate_connections_refused_total{limit="per_ip"} "#),
        "{m}"
    );
    let evicted = m
        .lines()
        .find(|l| l.starts_with(r#"toolgate_connections_refused_total{limit="evicted_unused"}"#))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(evicted >= 1.0, "{m}");
    // A connection that has served a request is never the one closed: it keeps working while
    // idle ones come and go.
    drop(s);
    let mut kept = idle_from("127.0.0.5", addr).await;
    assert_eq!(exchange_on(&mut kept).await, 400);
    for _ in 0..6 {
        first.push(idle_from("127.0.0.4", addr).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(exchange_on(&mut kept).await, 400, "the used connection still serves");
}

/// One request (`{}`: refused with 400) on a kept-alive raw connection; the status.
async fn exchange_on(conn: &mut tokio::net::TcpStream) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    conn.write_all(b"POST /mcp HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut chunk))
            .await
            .expect("an answer")
            .unwrap();
        assert!(n > 0, "the connection was closed");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if body.len() >= len {
                return head[9..12].parse().unwrap();
            }
        }
    }
}
