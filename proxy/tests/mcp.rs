//! The proxy on a loopback port in front of the real example service: every transport and
//! tool rule, observed over HTTP.

mod common;

use common::{base_headers, Harness};
use http::StatusCode;
use serde_json::{json, Value};

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"VERSION","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

fn init_body(version: &str) -> String {
    INIT.replace("VERSION", version)
}

fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

#[tokio::test]
async fn initialize_echoes_supported_versions_and_offers_the_latest_otherwise() {
    let h = Harness::start().await;
    for (asked, expected) in [
        ("2025-06-18", "2025-06-18"),
        ("2025-03-26", "2025-03-26"),
        ("2025-11-25", "2025-11-25"),
        ("2024-11-05", "2025-11-25"),
        ("2099-01-01", "2025-11-25"),
    ] {
        let (status, headers, body) = h.raw("POST", &base_headers(), init_body(asked)).await;
        assert_eq!(status, StatusCode::OK);
        let v = json_of(&body);
        assert_eq!(v["result"]["protocolVersion"], expected, "asked {asked}");
        assert_eq!(v["result"]["serverInfo"]["name"], "toolgate");
        assert!(v["result"]["capabilities"]["tools"].is_object());
        let sid = headers["mcp-session-id"].to_str().unwrap();
        assert_eq!(sid.len(), 64);
        assert!(sid.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}

#[tokio::test]
async fn sessions_are_required_checked_and_ended_by_delete() {
    let h = Harness::start().await;
    let list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#.to_vec();
    let (status, _, body) = h.raw("POST", &base_headers(), list.clone()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no session header");
    assert!(json_of(&body)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Mcp-Session-Id"));

    let mut hs = base_headers();
    hs.push(("mcp-session-id", "deadbeef"));
    let (status, _, _) = h.raw("POST", &hs, list.clone()).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "unknown session");

    let s = h.session("2025-06-18").await;
    assert!(s.request("tools/list", json!({})).await["result"]["tools"].is_array());
    let (status, _, _) = h.raw("DELETE", &[("mcp-session-id", &s.id)], Vec::new()).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = s.post(&json!({"jsonrpc": "2.0", "id": 9, "method": "ping"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "ended session");
    let (status, _, _) = h.raw("DELETE", &[("mcp-session-id", &s.id)], Vec::new()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = h.raw("DELETE", &[], Vec::new()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn idle_sessions_expire() {
    let h = Harness::start_with("  sessionTtlSeconds: 1\n").await;
    let s = h.session("2025-06-18").await;
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let (status, _, _) = s.post(&json!({"jsonrpc": "2.0", "id": 9, "method": "ping"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn notifications_and_responses_get_202_without_body() {
    let h = Harness::start().await;
    let s = h.session("2025-06-18").await;
    for msg in [
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}}),
        json!({"jsonrpc": "2.0", "id": 5, "result": {}}),
        json!({"jsonrpc": "2.0", "id": 6, "error": {"code": 1, "message": "x"}}),
    ] {
        let (status, _, body) = s.post(&msg).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{msg}");
        assert!(body.is_empty());
    }
}

#[tokio::test]
async fn get_is_405_and_unsupported_protocol_version_is_400() {
    let h = Harness::start().await;
    let (status, headers, _) = h.raw("GET", &[("accept", "text/event-stream")], Vec::new()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "POST, DELETE");

    let s = h.session("2025-06-18").await;
    let mut hs = base_headers();
    hs.push(("mcp-session-id", &s.id));
    hs.push(("mcp-protocol-version", "1999-01-01"));
    let (status, _, body) = h.raw("POST", &hs, r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let error = &json_of(&body)["error"];
    assert!(error["message"].as_str().unwrap().contains("MCP-Protocol-Version"));
    // The 2026-07-28 answer, which every era's client reads as "pick another version".
    assert_eq!(error["code"], -32022);
    assert_eq!(error["data"]["requested"], "1999-01-01");
}

#[tokio::test]
async fn foreign_origins_are_refused_loopback_and_allowlisted_ones_pass() {
    let h = Harness::start().await;
    let host = h.proxy.mcp_addr.to_string();
    let same = format!("http://{host}");
    let mut hs = base_headers();
    hs.push(("origin", "http://evil.example"));
    let (status, _, _) = h.raw("POST", &hs, init_body("2025-06-18")).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let mut hs = base_headers();
    hs.push(("origin", &same));
    let (status, headers, _) = h.raw("POST", &hs, init_body("2025-06-18")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["access-control-allow-origin"], same.as_str());

    let h = Harness::start_with("  allowedOrigins: ['https://app.example']\n").await;
    let mut hs = base_headers();
    hs.push(("origin", "https://app.example"));
    let (status, _, _) = h.raw("POST", &hs, init_body("2025-06-18")).await;
    assert_eq!(status, StatusCode::OK);
    let mut hs = base_headers();
    hs.push(("origin", "https://other.example"));
    assert_eq!(
        h.raw("POST", &hs, init_body("2025-06-18")).await.0,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn dns_rebinding_is_refused_on_a_loopback_listener() {
    let h = Harness::start().await;
    let port = h.proxy.mcp_addr.port();
    let evil = format!("evil.example:{port}");
    let evil_origin = format!("http://evil.example:{port}");
    for hs in [
        vec![("host", evil.as_str())],
        vec![("host", evil.as_str()), ("origin", evil_origin.as_str())],
    ] {
        let mut headers = base_headers();
        headers.extend(hs);
        let (status, headers, _) = h.raw("POST", &headers, init_body("2025-06-18")).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(headers.get("access-control-allow-origin").is_none());
        assert!(headers.get("mcp-session-id").is_none());
    }
    let localhost = format!("localhost:{port}");
    let mut headers = base_headers();
    headers.push(("host", localhost.as_str()));
    assert_eq!(h.raw("POST", &headers, init_body("2025-06-18")).await.0, StatusCode::OK);

    let h = Harness::start_with("  allowedHosts: [mcp.example]\n").await;
    let mut headers = base_headers();
    headers.push(("host", "mcp.example"));
    assert_eq!(h.raw("POST", &headers, init_body("2025-06-18")).await.0, StatusCode::OK);
    let mut headers = base_headers();
    headers.push(("host", "other.example"));
    assert_eq!(
        h.raw("POST", &headers, init_body("2025-06-18")).await.0,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn bodies_over_the_limit_get_413() {
    let h = Harness::start_with("  maxBodyBytes: 1024\n").await;
    let s = h.session("2025-06-18").await;
    let big = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "echo", "arguments": {"id": "x", "q": "a".repeat(4096)}}});
    let (status, _, body) = s.post(&big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(json_of(&body)["error"]["message"].as_str().unwrap().contains("1024"));
}

#[tokio::test]
async fn malformed_messages_get_json_rpc_errors() {
    let h = Harness::start().await;
    let s = h.session("2025-06-18").await;
    let mut hs = base_headers();
    hs.push(("mcp-session-id", &s.id));
    let cases: [(&str, StatusCode, i64, Value); 11] = [
        ("{not json", StatusCode::BAD_REQUEST, -32700, Value::Null),
        (
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            StatusCode::BAD_REQUEST,
            -32600,
            Value::Null,
        ),
        (r#"{"id":3,"method":"ping"}"#, StatusCode::BAD_REQUEST, -32600, json!(3)),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"resources/list"}"#,
            StatusCode::OK,
            -32601,
            json!(4),
        ),
        (
            r#"{"jsonrpc":"2.0","id":"s5","method":"tools/call","params":{"arguments":{}}}"#,
            StatusCode::OK,
            -32602,
            json!("s5"),
        ),
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":"{}"}}"#,
            StatusCode::OK,
            -32602,
            json!(6),
        ),
        ("42", StatusCode::BAD_REQUEST, -32600, Value::Null),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":5}"#,
            StatusCode::BAD_REQUEST,
            -32600,
            json!(7),
        ),
        (r#"{"jsonrpc":"2.0","id":8}"#, StatusCode::BAD_REQUEST, -32600, json!(8)),
        (
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            StatusCode::BAD_REQUEST,
            -32600,
            Value::Null,
        ),
        // A repeated member counts its last value, as a JSON object read into a map does.
        (
            r#"{"jsonrpc":"2.0","jsonrpc":"1.0","id":9,"method":"ping"}"#,
            StatusCode::BAD_REQUEST,
            -32600,
            json!(9),
        ),
    ];
    for (body, status, code, id) in cases {
        let (st, _, resp) = h.raw("POST", &hs, body).await;
        let v = json_of(&resp);
        assert_eq!(
            (st, v["error"]["code"].as_i64().unwrap()),
            (status, code),
            "{body} -> {v}"
        );
        assert_eq!(v["id"], id, "{body}");
    }
    let batch = h
        .raw("POST", &hs, r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#)
        .await;
    assert!(json_of(&batch.2)["error"]["message"]
        .as_str()
        .unwrap()
        .contains("batch"));
    for (body, says) in [
        ("42", "must be a JSON-RPC message object"),
        (r#"{"jsonrpc":"2.0","id":7,"method":5}"#, "`method` must be a string"),
        (r#"{"jsonrpc":"2.0","id":8}"#, "`method` is missing"),
        (
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            "`id` must be a string or a number",
        ),
        (
            r#"{"jsonrpc":"2.0","jsonrpc":"1.0","id":9,"method":"ping"}"#,
            "`jsonrpc` must be",
        ),
    ] {
        let (_, _, resp) = h.raw("POST", &hs, body).await;
        let v = json_of(&resp);
        assert!(v["error"]["message"].as_str().unwrap().contains(says), "{body} -> {v}");
    }
    let (_, _, resp) = h
        .raw(
            "POST",
            &hs,
            r#"{"jsonrpc":"1.0","id":10,"jsonrpc":"2.0","method":"ping"}"#,
        )
        .await;
    assert_eq!(json_of(&resp)["result"], json!({}), "the last `jsonrpc` counts");
    let (st, _, _) = h.raw("POST", &[("content-type", "text/plain")], "{}").await;
    assert_eq!(st, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(s.request("ping", json!({})).await["result"], json!({}));
}

#[tokio::test]
async fn tools_list_pages_with_cursors_and_rejects_bad_ones() {
    let h = Harness::start_with("  pageSize: 4\n").await;
    let s = h.session("2025-06-18").await;
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let params = cursor.as_ref().map_or(json!({}), |c| json!({"cursor": c}));
        let r = s.request("tools/list", params).await;
        let result = &r["result"];
        names.extend(
            result["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_string()),
        );
        pages += 1;
        match result["nextCursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names.len(), 10);
    assert_eq!(names[0], "get_customer");
    let bad = s.request("tools/list", json!({"cursor": "bogus"})).await;
    assert_eq!(bad["error"]["code"], -32602);
}

#[tokio::test]
async fn tools_list_publishes_contract_annotations_and_envelope_schema() {
    let h = Harness::start().await;
    let s = h.session("2025-06-18").await;
    let r = s.request("tools/list", json!({})).await;
    let tools = r["result"]["tools"].as_array().unwrap();
    let get = tools.iter().find(|t| t["name"] == "get_customer").unwrap();
    assert_eq!(
        get["description"],
        "Returns one customer.\n\nWhen to use:\nThe id is known."
    );
    assert_eq!(get["inputSchema"]["type"], "object");
    assert_eq!(get["annotations"]["readOnlyHint"], true);
    assert_eq!(get["annotations"]["idempotentHint"], true);
    assert_eq!(get["outputSchema"]["properties"]["toolName"]["const"], "get_customer");
    assert_eq!(
        get["outputSchema"]["then"]["properties"]["data"]["required"],
        json!(["id"])
    );
    let ticket = tools.iter().find(|t| t["name"] == "create_ticket").unwrap();
    assert_eq!(ticket["annotations"]["readOnlyHint"], false);
    assert_eq!(ticket["annotations"]["destructiveHint"], false);
}

#[tokio::test]
async fn a_successful_call_returns_the_envelope_with_redacted_data() {
    let h = Harness::start().await;
    let s = h.session("2025-06-18").await;
    let (env, is_error) = s.envelope("get_customer", json!({"customerId": "42"})).await;
    assert!(!is_error);
    assert_eq!(env["ok"], true);
    assert_eq!(env["status"], "success");
    assert_eq!(env["safety"], "read_only");
    assert_eq!(env["data"]["id"], "42");
    assert_eq!(env["data"]["name"], "Ana López");
    assert!(
        env["data"].get("internalNotes").is_none(),
        "redacted field leaked: {env}"
    );
    assert_eq!(env["errors"], json!([]));
    assert!(env["durationMs"].is_u64());
}

#[tokio::test]
async fn http_statuses_become_business_statuses() {
    let h = Harness::start().await;
    let s = h.session("2025-06-18").await;

    let (env, is_error) = s.envelope("get_customer", json!({"customerId": "404404"})).await;
    assert!(is_error);
    assert_eq!(env["status"], "needs_more_info");
    assert_eq!(env["nextQuestion"], "¿Me compartes tu número de cliente?");
    assert_eq!(env["errors"][0]["message_es"], "No encontré al cliente");

    let (env, is_error) = s
        .envelope("create_ticket", json!({"customerId": "42", "subject": "Router down"}))
        .await;
    assert!(!is_error, "{env}");
    assert!(env["data"]["ticketId"].as_str().unwrap().starts_with("T-"));

    let (env, is_error) = s.envelope("submit_payment", json!({})).await;
    assert!(!is_error);
    assert_eq!(
        (env["status"].as_str(), env["ok"].as_bool()),
        (Some("queued"), Some(true))
    );
    assert_eq!(env["safety"], "external_send");
    assert!(env["data"]["jobId"].is_string());

    let (env, is_error) = s.envelope("confirm", json!({})).await;
    assert!(is_error);
    assert_eq!(env["status"], "pending_confirmation");
    assert_eq!(env["data"]["candidates"].as_array().unwrap().len(), 2);

    for (code, retryable) in [(500, true), (503, true), (422, false), (429, true)] {
        let (env, is_error) = s.envelope("status", json!({"code": code})).await;
        assert!(is_error);
        assert_eq!(env["status"], "failed", "{code}");
        assert_eq!(env["errors"][0]["retryable"], retryable, "{code}: {env}");
        if code >= 500 {
            assert_eq!(env["data"], Value::Null, "5xx bodies are internals");
            assert!(!env.to_string().contains("internal.rs"), "{env}");
        }
    }
}

#[tokio::test]
async fn success_without_evidence_is_failed() {
    let h = Harness::start().await;
    let s = h.session("2025-06-18").await;
    let (env, is_error) = s
        .envelope("create_ticket_no_evidence", json!({"customerId": "42", "subject": "x"}))
        .await;
    assert!(is_error);
    assert_eq!(env["status"], "failed");
    assert_eq!(env["errors"][0]["code"], "missing_evidence");
}

#[tokio::test]
async fn upstream_failures_become_envelopes_not_protocol_errors() {
    let h = Harness::start().await;
    let s = h.session("2025-06-18").await;
    let (env, _) = s.envelope("slow", json!({"ms": 3000})).await;
    assert_eq!(
        (env["status"].as_str(), env["errors"][0]["code"].as_str()),
        (Some("failed"), Some("upstream_timeout"))
    );
    assert_eq!(env["errors"][0]["retryable"], true);
    assert!(env["durationMs"].as_u64().unwrap() < 2000);

    let (env, _) = s.envelope("text", json!({})).await;
    assert_eq!(env["errors"][0]["code"], "upstream_invalid_response");

    let (env, _) = s.envelope("get_customer", json!({"customerId": "7"})).await;
    assert_eq!(env["status"], "success");

    // An upstream that is down (its port held, so that no other test's listener takes it).
    let down = common::hold(0).unwrap();
    let dead = down.local_addr().unwrap();
    let cfg = toolgate_config::parse_yaml(&common::config_text(dead, "")).unwrap();
    let proxy = toolgate_proxy::start(cfg, Default::default()).await.unwrap();
    let s2 = common::Session::open(common::client(), format!("http://{}/mcp", proxy.mcp_addr), "2025-06-18").await;
    let (env, is_error) = s2.envelope("get_customer", json!({"customerId": "42"})).await;
    assert!(is_error);
    assert_eq!(env["errors"][0]["code"], "upstream_unavailable");
    assert_eq!(env["errors"][0]["retryable"], true);
}

#[tokio::test]
async fn oversized_upstream_responses_fail_cleanly() {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let text = common::config_text(upstream, "")
        .replace("  timeoutMs: 5000\n", "  timeoutMs: 5000\n  maxResponseBytes: 10000\n");
    let proxy = toolgate_proxy::start(toolgate_config::parse_yaml(&text).unwrap(), Default::default())
        .await
        .unwrap();
    let s = common::Session::open(common::client(), format!("http://{}/mcp", proxy.mcp_addr), "2025-06-18").await;
    let (env, _) = s.envelope("big", json!({"bytes": 50000})).await;
    assert_eq!(env["errors"][0]["code"], "upstream_response_too_large");
    let (env, _) = s.envelope("big", json!({"bytes": 100})).await;
    assert_eq!(env["status"], "success");
}

#[tokio::test]
async fn invalid_arguments_are_json_rpc_errors_up_to_2025_06_18_and_never_reach_upstream() {
    let h = Harness::start().await;
    for version in ["2025-03-26", "2025-06-18"] {
        let s = h.session(version).await;
        let before = h.upstream_requests().await;
        let r = s
            .call(
                "create_ticket",
                json!({"subject": 5, "metadata": "{\"a\": 1}", "extra": true}),
            )
            .await;
        let after = h.upstream_requests().await;
        assert_eq!(after - before, 1, "only the stats probe itself reached the upstream");
        let e = &r["error"];
        assert_eq!(e["code"], -32602, "{r}");
        let errors = e["data"]["errors"].as_array().unwrap();
        let fields: Vec<&str> = errors.iter().map(|e| e["field"].as_str().unwrap()).collect();
        for f in ["customerId", "subject", "metadata", "extra"] {
            assert!(fields.contains(&f), "{f} not reported: {fields:?}");
        }
        assert!(fields.contains(&e["data"]["field"].as_str().unwrap()));
        let meta = errors.iter().find(|e| e["field"] == "metadata").unwrap();
        assert!(
            meta["message"].as_str().unwrap().contains("string containing JSON"),
            "{meta}"
        );
    }
}

#[tokio::test]
async fn invalid_arguments_are_tool_results_from_2025_11_25() {
    let h = Harness::start().await;
    let s = h.session("2025-11-25").await;
    let before = h.upstream_requests().await;
    let (env, is_error) = s.envelope("get_customer", json!({})).await;
    assert_eq!(h.upstream_requests().await - before, 1);
    assert!(is_error);
    assert_eq!(env["status"], "needs_more_info");
    assert_eq!(env["errors"][0]["field"], "customerId");
    assert_eq!(env["errors"][0]["code"], "invalid_argument");
    assert_eq!(env["ok"], false);
    // The question names the field, as a client that relays nextQuestion to its user expects.
    assert_eq!(
        env["nextQuestion"],
        "Could you give me a valid `customerId`? `customerId` is required."
    );
}

#[tokio::test]
async fn unknown_tools_are_32602_in_every_version() {
    let h = Harness::start().await;
    for version in ["2025-03-26", "2025-06-18", "2025-11-25"] {
        let s = h.session(version).await;
        let r = s.call("no_such_tool", json!({})).await;
        assert_eq!(r["error"]["code"], -32602, "{version}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("no_such_tool"));
    }
}

#[tokio::test]
async fn path_query_headers_and_body_are_mapped_safely() {
    let h = Harness::start().await;
    let s = h.session("2025-06-18").await;
    let (env, _) = s
        .envelope(
            "echo",
            json!({"id": "a/admin?x=1", "q": "a b&c", "trace": "t-1", "note": {"k": [1, 2]}}),
        )
        .await;
    let d = &env["data"];
    assert_eq!(d["method"], "PATCH");
    assert_eq!(d["path"], "/echo/a%2Fadmin%3Fx%3D1");
    assert_eq!(d["query"], "q=a%20b%26c");
    assert_eq!(d["headers"]["x-trace"], "t-1");
    assert_eq!(d["body"], json!({"note": {"k": [1, 2]}}));

    let r = s.call("echo", json!({"id": "1", "trace": "a\r\nX-Injected: 1"})).await;
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(r["error"]["data"]["field"], "trace");
    // `..` as the value, or between slashes in it (an upstream that decodes `%2F` before it
    // resolves dot segments would climb), is refused.
    for id in ["..", "../../admin", "a/../../b"] {
        let r = s.call("echo", json!({"id": id})).await;
        assert_eq!(r["error"]["data"]["field"], "id", "{id}: {r}");
    }
}

#[tokio::test]
async fn notifications_cancelled_abandons_a_2025_read_call() {
    // The slow tool with a long timeout, so only the cancellation can end the call early.
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let text = common::config_text(upstream, "").replace("timeoutMs: 300}", "timeoutMs: 20000}");
    let cfg = toolgate_config::parse_yaml(&text).unwrap();
    let proxy = toolgate_proxy::start(cfg, toolgate_proxy::StartOptions::default())
        .await
        .unwrap();
    let h = common::Harness {
        proxy,
        upstream,
        http: common::client(),
    };
    let s = std::sync::Arc::new(h.session("2025-06-18").await);
    let call = tokio::spawn({
        let s = s.clone();
        async move {
            s.post(&json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call",
                "params": {"name": "slow", "arguments": {"ms": 15000}}}))
                .await
        }
    });
    let cancels = &h.proxy.shared.cancels;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cancels.is_empty() {
        assert!(std::time::Instant::now() < deadline, "the call never started");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 77, "reason": "the user moved on"}});
    // Another session cannot cancel it: ids are the session's own.
    let other = h.session("2025-06-18").await;
    let (status, _, _) = other.post(&cancel).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(cancels.len(), 1, "still running");
    // Nor does the right session naming another id ("77" is not 77).
    let (status, _, _) = s
        .post(&json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "77"}}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(cancels.len(), 1, "still running");
    let (status, _, body) = s.post(&cancel).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert!(body.is_empty());
    let (status, _, body) = tokio::time::timeout(std::time::Duration::from_secs(5), call)
        .await
        .expect("the cancelled call answers at once, not after the upstream's 15 s")
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let r: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(r["id"], 77);
    assert_eq!(r["error"]["code"], -32800, "{r}");
    assert!(cancels.is_empty(), "the entry is gone with the call");
}
