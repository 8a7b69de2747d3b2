//! MCP 2026-07-28, the main path, end to end on loopback in front of the real example service:
//! stateless requests, `server/discover`, the header validation ladder with each error code,
//! completed results, `subscriptions/listen`, and a 2025-06-18 client on the same endpoint.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{base_headers, client, config_with_policy, modern_meta, send, Modern, Session};
use http::StatusCode;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use toolgate_proxy::Running;

struct Setup {
    proxy: Running,
    dir: PathBuf,
    text: String,
    url: String,
}

const OPEN: &str = "policy:\n  readOnly: false\n  auth: {mode: none}\n  audit: {sink: file, path: '{dir}/audit.jsonl'}\n  rateLimit: {perIp: {requests: 1000000}, perIdentity: {requests: 1000000}}\n";

/// The proxy with `policy` (`{dir}` is a temp dir) and `server` lines, reloading its file.
async fn setup(name: &str, server: &str, policy: &str) -> Setup {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = std::env::temp_dir().join(format!("toolgate-modern-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("credentials.yaml"),
        "credentials:\n  - {id: reader, key: reader-secret-key-1, role: viewer}\n  - {id: admin, key: admin-secret-key-3, role: admin}\n",
    )
    .unwrap();
    let policy = policy.replace("{dir}", dir.to_str().unwrap());
    let text = config_with_policy(upstream, server, &policy);
    let proxy = common::start_watched(dir.join("proxy.yaml"), &text).await;
    let url = format!("http://{}/mcp", proxy.mcp_addr);
    Setup { proxy, dir, text, url }
}

impl Setup {
    fn modern(&self, auth: &[(&str, &str)]) -> Modern {
        Modern::new(client(), self.url.clone(), auth)
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Raw POST with exactly `headers` (plus content type and accept) and `msg`.
async fn raw(url: &str, headers: &[(&str, &str)], msg: &Value) -> (StatusCode, http::HeaderMap, Value) {
    let mut h = base_headers();
    h.extend_from_slice(headers);
    let (status, headers, body) = send(&client(), "POST", url, &h, Bytes::from(msg.to_string())).await;
    (status, headers, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn call_msg(name: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
           "params": {"name": name, "arguments": {"customerId": "42"}, "_meta": modern_meta()}})
}

#[tokio::test]
async fn discover_list_and_call_need_no_session_and_every_result_is_complete() {
    let s = setup("flow", "", OPEN).await;
    let m = s.modern(&[]);
    // server/discover, as the very first request, without any session.
    let (status, headers, body) = m.send("server/discover", json!({}), &[]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(headers.get("mcp-session-id").is_none(), "no session is issued");
    let d = &body["result"];
    assert_eq!(d["resultType"], "complete");
    assert_eq!(d["supportedVersions"][0], "2026-07-28");
    assert_eq!(
        d["supportedVersions"],
        json!(["2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26"])
    );
    assert_eq!(d["capabilities"]["tools"]["listChanged"], true);
    assert_eq!(d["_meta"]["io.modelcontextprotocol/serverInfo"]["name"], "toolgate");
    assert!(d["ttlMs"].as_u64().is_some() && d["cacheScope"] == "public", "{d}");

    // tools/list: complete, cacheable, public without auth, the same order every time.
    let first = m.result("tools/list", json!({})).await;
    assert_eq!(first["resultType"], "complete");
    assert_eq!(first["ttlMs"], 60_000);
    assert_eq!(first["cacheScope"], "public");
    let again = m.result("tools/list", json!({})).await;
    assert_eq!(first["tools"], again["tools"]);

    // tools/call: the envelope, completed; a stray Mcp-Session-Id is ignored.
    let (env, is_error) = m.envelope("get_customer", json!({"customerId": "42"})).await;
    assert!(!is_error, "{env}");
    assert_eq!(env["status"], "success");
    let (status, _, body) = m
        .send(
            "tools/call",
            json!({"name": "get_customer", "arguments": {"customerId": "42"}}),
            &[("mcp-session-id", "not-a-session")],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Invalid arguments are a tool result the model can read.
    let (env, is_error) = m.envelope("get_customer", json!({"customerId": 42})).await;
    assert!(is_error);
    assert_eq!(env["status"], "needs_more_info");
    // Unknown tools stay a JSON-RPC error.
    let (status, _, body) = m
        .send("tools/call", json!({"name": "nope", "arguments": {}}), &[])
        .await;
    assert_eq!((status, body["error"]["code"].as_i64()), (StatusCode::OK, Some(-32602)));

    // The audit record says which revision and which client, and has no session.
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.audit().len() < 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let records = s.audit();
    let r = &records[0];
    assert_eq!(r["protocolVersion"], "2026-07-28", "{r}");
    assert_eq!(r["client"]["name"], "harness-modern");
    assert_eq!(r["sessionId"], Value::Null);
}

#[tokio::test]
async fn each_broken_request_gets_the_revisions_error_and_status() {
    let s = setup("ladder", "", OPEN).await;
    let url = &s.url;
    let ok = [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "get_customer"),
    ];
    let (status, _, body) = raw(url, &ok, &call_msg("get_customer")).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let mismatch = |h: Vec<(&'static str, &'static str)>| h;
    for (label, headers, msg) in [
        ("no Mcp-Method", mismatch(vec![ok[0], ok[2]]), call_msg("get_customer")),
        ("no Mcp-Name", mismatch(vec![ok[0], ok[1]]), call_msg("get_customer")),
        (
            "other Mcp-Name",
            mismatch(vec![ok[0], ok[1], ("mcp-name", "create_ticket")]),
            call_msg("get_customer"),
        ),
        (
            "other Mcp-Method",
            mismatch(vec![ok[0], ("mcp-method", "tools/list"), ok[2]]),
            call_msg("get_customer"),
        ),
        (
            "a 2025 version beside modern _meta",
            mismatch(vec![("mcp-protocol-version", "2025-11-25"), ok[1], ok[2]]),
            call_msg("get_customer"),
        ),
    ] {
        let (status, _, body) = raw(url, &headers, &msg).await;
        // The 2025 header routes the request to the legacy path, which has no session for it.
        if label.starts_with("a 2025") {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{label}: {body}");
            continue;
        }
        assert_eq!(status, StatusCode::BAD_REQUEST, "{label}: {body}");
        assert_eq!(body["error"]["code"], -32020, "{label}: {body}");
        assert_eq!(body["id"], 9, "{label}");
    }
    // No MCP-Protocol-Version header although `_meta` declares one.
    let (status, _, body) = raw(url, &[ok[1], ok[2]], &call_msg("get_customer")).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (StatusCode::BAD_REQUEST, Some(-32020)),
        "{body}"
    );

    // The base64 sentinel carries a name a header cannot.
    let mut msg = call_msg("get_customer");
    let encoded = "=?base64?Z2V0X2N1c3RvbWVy?=";
    let (status, _, body) = raw(url, &[ok[0], ok[1], ("mcp-name", encoded)], &msg).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    msg["params"]["name"] = json!("get_customer ");
    let (status, _, body) = raw(url, &[ok[0], ok[1], ("mcp-name", encoded)], &msg).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (StatusCode::BAD_REQUEST, Some(-32020))
    );

    // Missing _meta fields: -32602 with 400.
    let mut msg = call_msg("get_customer");
    msg["params"]["_meta"]
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    let (status, _, body) = raw(url, &ok, &msg).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (StatusCode::BAD_REQUEST, Some(-32602)),
        "{body}"
    );

    // An unsupported version: -32022 with 400, naming what is supported.
    let mut msg = call_msg("get_customer");
    msg["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    let (status, _, body) = raw(url, &[("mcp-protocol-version", "2099-01-01"), ok[1], ok[2]], &msg).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], -32022);
    assert_eq!(body["error"]["data"]["requested"], "2099-01-01");
    assert_eq!(body["error"]["data"]["supported"][0], "2026-07-28");

    // Methods this revision removed or this server does not offer: 404, -32601.
    let m = s.modern(&[]);
    for method in [
        "ping",
        "initialize",
        "logging/setLevel",
        "prompts/list",
        "resources/list",
    ] {
        let (status, _, body) = m.send(method, json!({}), &[]).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method}: {body}");
        assert_eq!(body["error"]["code"], -32601, "{method}");
    }
    // Notifications are accepted and need no answer.
    let note = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1, "_meta": modern_meta()}});
    let (status, _, _) = raw(url, &[ok[0], ("mcp-method", "notifications/cancelled")], &note).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // No stream, no session to end.
    for method in ["GET", "DELETE"] {
        let (status, _, _) = send(
            &client(),
            method,
            url,
            &[("mcp-protocol-version", "2026-07-28")],
            Bytes::new(),
        )
        .await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
    }
}

#[tokio::test]
async fn the_list_is_private_whenever_it_depends_on_who_asks() {
    let policy = "policy:\n  readOnly: false\n  auth: {mode: apiKey, credentialsFile: '{dir}/credentials.yaml'}\n  audit: {enabled: false}\n";
    let s = setup("private", "  pageSize: 2\n", policy).await;
    let m = s.modern(&[("x-api-key", "admin-secret-key-3")]);
    let page = m.result("tools/list", json!({})).await;
    assert_eq!(page["cacheScope"], "private");
    assert_eq!(page["tools"].as_array().unwrap().len(), 2);
    // Paging is stateless: the cursor alone says where to go on, on any replica.
    let cursor = page["nextCursor"].as_str().unwrap().to_string();
    let next = m.result("tools/list", json!({"cursor": cursor})).await;
    assert_eq!(next["cacheScope"], "private");
    assert_ne!(next["tools"][0], page["tools"][0]);
    // Without credentials: 401, as in every era.
    let (status, headers, _) = s.modern(&[]).send("tools/list", json!({}), &[]).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers.get("www-authenticate").is_some());
}

#[tokio::test]
async fn a_2025_and_a_2026_client_share_the_endpoint() {
    let s = setup("both", "", OPEN).await;
    let legacy = Session::open(client(), s.url.clone(), "2025-06-18").await;
    let modern = s.modern(&[]);
    let (a, b) = tokio::join!(
        legacy.call("get_customer", json!({"customerId": 42})),
        modern.envelope("get_customer", json!({"customerId": 42})),
    );
    // 2025-06-18: invalid arguments are -32602 with the field; 2026-07-28: an isError result.
    assert_eq!(a["error"]["code"], -32602, "{a}");
    assert_eq!(a["error"]["data"]["field"], "customerId");
    assert!(b.1);
    assert_eq!(b.0["errors"][0]["field"], "customerId");
    // The legacy session still works after the modern calls, and its results stay 2025-shaped.
    let list = legacy.request("tools/list", json!({})).await;
    assert!(list["result"].get("resultType").is_none(), "{list}");
    assert!(list["result"].get("ttlMs").is_none());
}

/// An open SSE stream: yields whole events (a `data:` JSON message, or a comment).
struct Stream {
    body: hyper::body::Incoming,
    buf: String,
}

impl Stream {
    async fn open(url: &str, id: u64, filter: Value, auth: &[(&str, &str)]) -> (StatusCode, http::HeaderMap, Stream) {
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen",
            "params": {"notifications": filter, "_meta": modern_meta()}});
        let mut req = http::Request::post(url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "subscriptions/listen");
        for (k, v) in auth {
            req = req.header(*k, *v);
        }
        let resp = client()
            .request(
                req.body(http_body_util::Full::new(Bytes::from(msg.to_string())))
                    .unwrap(),
            )
            .await
            .unwrap();
        let (parts, body) = resp.into_parts();
        (
            parts.status,
            parts.headers,
            Stream {
                body,
                buf: String::new(),
            },
        )
    }

    /// The next event within `within`; `None` when the stream ended.
    async fn next(&mut self, within: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let e = self.buf[..i].to_string();
                self.buf.drain(..i + 2);
                return Some(e);
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .expect("an event in time")?;
            if let Ok(data) = frame.ok()?.into_data() {
                self.buf.push_str(&String::from_utf8_lossy(&data));
            }
        }
    }

    /// The next JSON-RPC message, skipping keep-alive comments.
    async fn message(&mut self, within: Duration) -> Option<Value> {
        loop {
            let e = self.next(within).await?;
            if let Some(data) = e.lines().find_map(|l| l.strip_prefix("data: ")) {
                return Some(serde_json::from_str(data).unwrap());
            }
        }
    }
}

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_listener_hears_of_tool_changes_keeps_alive_and_ends_cleanly_on_drain() {
    let s = setup(
        "listen",
        "  listenKeepAliveSeconds: 1\n  maxListenersPerIdentity: 1\n",
        OPEN,
    )
    .await;
    let (status, headers, mut stream) = Stream::open(
        &s.url,
        77,
        json!({"toolsListChanged": true, "promptsListChanged": true}),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["x-accel-buffering"], "no");
    // First the acknowledgement, with only what the server honours.
    let ack = stream.message(WAIT).await.unwrap();
    assert_eq!(ack["method"], "notifications/subscriptions/acknowledged");
    assert_eq!(ack["params"]["notifications"], json!({"toolsListChanged": true}));
    assert_eq!(ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 77);
    // Keep-alive comments.
    let e = stream.next(WAIT).await.unwrap();
    assert!(e.starts_with(':'), "{e:?}");
    // One stream per identity here: a second is refused with 429 and a JSON-RPC error.
    let (status, _, second) = Stream::open(&s.url, 78, json!({"toolsListChanged": true}), &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let refused: Value = serde_json::from_slice(&second.body.collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(refused["id"], 78);
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("subscriptions/listen streams"),
        "{refused}"
    );

    // A config edit that changes the tools reaches the listener as list_changed.
    let edited = s.text.replace("  - name: text\n", "  - name: text_renamed\n");
    assert_ne!(edited, s.text);
    std::fs::write(s.dir.join("proxy.yaml"), &edited).unwrap();
    let note = stream.message(WAIT).await.unwrap();
    assert_eq!(note["method"], "notifications/tools/list_changed", "{note}");
    assert_eq!(note["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 77);

    // SIGTERM's drain ends the stream with a final result, then closes it.
    let proxy = s.proxy;
    let drain = tokio::spawn(proxy.shutdown());
    let last = stream.message(WAIT).await.unwrap();
    assert_eq!(last["id"], 77, "{last}");
    assert_eq!(last["result"]["resultType"], "complete");
    assert_eq!(last["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"], 77);
    assert!(stream.next(WAIT).await.is_none(), "the stream ends");
    tokio::time::timeout(WAIT, drain).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_listener_whose_credential_is_revoked_is_told_and_closed() {
    let policy =
        "policy:\n  auth: {mode: apiKey, credentialsFile: '{dir}/credentials.yaml'}\n  audit: {enabled: false}\n";
    let s = setup("revoked", "  listenKeepAliveSeconds: 1\n", policy).await;
    let key = [("x-api-key", "reader-secret-key-1")];
    let (status, _, mut stream) = Stream::open(&s.url, 5, json!({"toolsListChanged": true}), &key).await;
    assert_eq!(status, StatusCode::OK);
    stream.message(WAIT).await.unwrap();
    std::fs::write(
        s.dir.join("credentials.yaml"),
        "credentials:\n  - {id: admin, key: admin-secret-key-3, role: admin}\n",
    )
    .unwrap();
    let ended = stream.message(WAIT).await.unwrap();
    assert_eq!(ended["id"], 5, "{ended}");
    assert_eq!(ended["error"]["data"]["reason"], "credentials_rejected");
    assert!(stream.next(WAIT).await.is_none());
}

#[tokio::test]
async fn a_read_call_is_aborted_when_its_2026_client_goes_away() {
    let s = setup("cancel", "", OPEN).await;
    let msg = json!({"jsonrpc": "2.0", "id": 31, "method": "tools/call",
        "params": {"name": "slow", "arguments": {"ms": 3000}, "_meta": modern_meta()}});
    let mut h = base_headers();
    h.extend([
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "slow"),
    ]);
    let gone = tokio::time::timeout(
        Duration::from_millis(200),
        send(&client(), "POST", &s.url, &h, Bytes::from(msg.to_string())),
    )
    .await;
    assert!(gone.is_err(), "the client gave up first");
    let deadline = Instant::now() + Duration::from_secs(5);
    let record = loop {
        if let Some(r) = s.audit().into_iter().find(|r| r["jsonrpcId"] == 31) {
            break r;
        }
        assert!(Instant::now() < deadline, "no audit record");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (record["decision"].as_str(), record["reason"].as_str()),
        (Some("cancelled"), Some("client_gone"))
    );
    assert!(
        record["durationMs"].as_u64().unwrap() < 2500,
        "aborted, not run to its end: {record}"
    );
}

#[tokio::test]
async fn trace_context_in_meta_continues_the_clients_trace_upstream() {
    let s = setup("trace", "", OPEN).await;
    let m = s.modern(&[]);
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut meta = modern_meta();
    meta["traceparent"] = json!(format!("00-{trace_id}-00f067aa0ba902b7-01"));
    meta["tracestate"] = json!("vendor=meta");
    let params = json!({"name": "echo", "arguments": {"id": "a1"}, "_meta": meta});
    // The `_meta` context wins over a different one in the HTTP headers.
    let other = "00-11111111111111111111111111111111-2222222222222222-01";
    let (status, _, body) = m
        .send(
            "tools/call",
            params,
            &[("traceparent", other), ("tracestate", "vendor=header")],
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let env: Value = serde_json::from_str(body["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    let upstream = env["data"]["headers"]["traceparent"].as_str().unwrap();
    assert!(upstream.starts_with(&format!("00-{trace_id}-")), "{upstream}");
    assert_eq!(env["data"]["headers"]["tracestate"], "vendor=meta");
}
