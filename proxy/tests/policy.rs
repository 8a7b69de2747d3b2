//! Policy layers end to end: the proxy on loopback in front of the real example service, with
//! API keys from a file, limits, provenance and audit records read back (OAuth and JWKS:
//! tests/oauth.rs; the harness: tests/common/policy.rs).

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::policy::*;
use common::{base_headers, send, Session};
use http::StatusCode;
use serde_json::{json, Value};

#[tokio::test]
async fn every_request_needs_a_valid_unexpired_key() {
    let s = setup("keys", API_KEYS).await;
    let (status, headers, body) = s.raw(&[], INIT).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers["www-authenticate"].to_str().unwrap().contains("X-API-Key"));
    assert_eq!(body["error"]["data"]["reason"], "missing_credentials");
    let (status, _, body) = s.raw(&[("x-api-key", "nope")], INIT).await;
    assert_eq!(
        (status, body["error"]["data"]["reason"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("invalid_credentials"))
    );
    let (status, _, body) = s.raw(&[("x-api-key", "expired-secret-key-4")], INIT).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body["error"]["message"].as_str().unwrap().contains("expired"), "{body}");
    let (status, _, _) = s.raw(&[("x-api-key", "admin-secret-key-3")], INIT).await;
    assert_eq!(status, StatusCode::OK);

    // The session id alone is not a credential, and a session belongs to its key.
    let admin = s.session("admin-secret-key-3").await;
    let mut hs = vec![("mcp-session-id", admin.id.as_str())];
    let (status, _, _) = s.raw(&hs, r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    hs.push(("x-api-key", "reader-secret-key-1"));
    let (status, _, _) = s.raw(&hs, r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another key cannot use the session");

    let (status, _, _) = send(
        &common::client(),
        "POST",
        &format!("{}?api_key=admin-secret-key-3", s.url),
        &base_headers(),
        Bytes::from(INIT),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "credentials in the query string are refused"
    );
}

#[tokio::test]
async fn a_key_scoped_to_some_tools_cannot_see_or_call_the_others() {
    let s = setup("scope", API_KEYS).await;
    let op = s.session("operator-secret-key-2").await;
    assert_eq!(
        names(&op.request("tools/list", json!({})).await),
        ["get_customer", "echo_read"]
    );
    let hidden = op
        .call("create_ticket", json!({"customerId": "42", "subject": "x"}))
        .await;
    let unknown = op.call("no_such_tool", json!({})).await;
    assert_eq!(hidden["error"]["code"], unknown["error"]["code"]);
    assert_eq!(
        hidden["error"]["message"], "Unknown tool: `create_ticket`",
        "answered exactly like an unknown tool"
    );
    let (env, is_error) = op.envelope("get_customer", json!({"customerId": "42"})).await;
    assert!(!is_error, "{env}");
}

#[tokio::test]
async fn read_only_mode_hides_write_tools_from_everyone() {
    let s = setup("readonly", &API_KEYS.replace("readOnly: false", "readOnly: true")).await;
    let admin = s.session("admin-secret-key-3").await;
    assert_eq!(
        names(&admin.request("tools/list", json!({})).await),
        ["get_customer", "echo_read", "fail_read", "slow_read"]
    );
    let r = admin
        .call("create_ticket", json!({"customerId": "42", "subject": "x"}))
        .await;
    assert_eq!(r["error"]["message"], "Unknown tool: `create_ticket`");
}

#[tokio::test]
async fn a_role_too_low_is_forbidden_only_for_tools_the_session_was_shown() {
    let s = setup("role", API_KEYS).await;
    // A viewer never sees create_ticket: calling it answers like an unknown tool.
    let reader = s.session("reader-secret-key-1").await;
    assert!(!names(&reader.request("tools/list", json!({})).await).contains(&"create_ticket".to_string()));
    let r = reader
        .call("create_ticket", json!({"customerId": "42", "subject": "x"}))
        .await;
    assert_eq!(
        r["error"]["message"], "Unknown tool: `create_ticket`",
        "no existence leak: {r}"
    );

    // A key that listed tools as admin and was then lowered to viewer gets a clear refusal.
    std::fs::write(
        s.dir.join("credentials.yaml"),
        format!("{CREDENTIALS}  - {{id: shifty, key: shifty-key-7, role: admin}}\n"),
    )
    .unwrap();
    s.wait_accepted(&[("x-api-key", "shifty-key-7")]).await;
    let shifty = s.session("shifty-key-7").await;
    assert!(names(&shifty.request("tools/list", json!({})).await).contains(&"create_ticket".to_string()));
    std::fs::write(
        s.dir.join("credentials.yaml"),
        format!("{CREDENTIALS}  - {{id: shifty, key: shifty-key-7, role: viewer}}\n"),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (env, is_error) = shifty
            .envelope("create_ticket", json!({"customerId": "42", "subject": "x"}))
            .await;
        if is_error && env["errors"][0]["code"] == "forbidden" {
            assert!(
                env["errors"][0]["message"]
                    .as_str()
                    .unwrap()
                    .contains("needs `operator`"),
                "{env}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the lowered role never took effect: {env}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let admin = s.session("admin-secret-key-3").await;
    let (env, is_error) = admin
        .envelope("create_ticket", json!({"customerId": "42", "subject": "Router"}))
        .await;
    assert!(!is_error, "{env}");
}

#[tokio::test]
async fn bearer_tokens_and_custom_header_sets_authenticate() {
    let s = setup("bearer", &API_KEYS.replace("mode: apiKey", "mode: bearer")).await;
    assert_eq!(
        s.raw(&[("x-api-key", "admin-secret-key-3")], INIT).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (status, headers, _) = s.raw(&[("authorization", "Bearer nope")], INIT).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers["www-authenticate"].to_str().unwrap().starts_with("Bearer"));
    assert_eq!(
        s.raw(&[("authorization", "Bearer admin-secret-key-3")], INIT).await.0,
        StatusCode::OK
    );

    let policy = "  auth: {mode: customHeaders, customHeaders: [X-Tenant, X-Signature], credentialsFile: '{dir}/headers.yaml'}\n  audit: {enabled: false}\n";
    let s = setup(
        "headers",
        &policy.replace("{dir}/headers.yaml", "{dir}/credentials.yaml"),
    )
    .await;
    std::fs::write(
        s.dir.join("credentials.yaml"),
        "credentials:\n  - {id: partner, headers: {X-Tenant: acme, X-Signature: s3cr3t}}\n",
    )
    .unwrap();
    s.wait_accepted(&[("x-tenant", "acme"), ("x-signature", "s3cr3t")])
        .await;
    assert_eq!(
        s.raw(&[("x-tenant", "acme"), ("x-signature", "wrong")], INIT).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(s.raw(&[("x-tenant", "acme")], INIT).await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let limited =
        "  auth: {mode: none}\n  audit: {enabled: false}\n  rateLimit: {perIp: {requests: 3, windowSeconds: 60}}\n";
    let s = setup("xff", limited).await;
    for i in 0..3 {
        let spoof = format!("198.51.100.{i}");
        assert_eq!(s.raw(&[("x-forwarded-for", &spoof)], INIT).await.0, StatusCode::OK);
    }
    let (status, headers, body) = s.raw(&[("x-forwarded-for", "198.51.100.99")], INIT).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    assert_eq!(body["error"]["data"]["scope"], "ip");
    assert!(body["error"]["data"]["retryAfterMs"].as_u64().unwrap() > 0);

    // Behind a trusted proxy the right-most untrusted hop is the client.
    let s = setup(
        "xff-trusted",
        &limited.replace(
            "windowSeconds: 60}",
            "windowSeconds: 60}, trustedProxies: ['127.0.0.1/32']",
        ),
    )
    .await;
    for i in 0..6 {
        let hop = format!("6.6.6.6, 198.51.100.{i}");
        assert_eq!(
            s.raw(&[("x-forwarded-for", &hop)], INIT).await.0,
            StatusCode::OK,
            "distinct clients"
        );
    }
    for _ in 0..3 {
        s.raw(&[("x-forwarded-for", "9.9.9.9, 203.0.113.7")], INIT).await;
    }
    assert_eq!(
        s.raw(&[("x-forwarded-for", "1.1.1.1, 203.0.113.7")], INIT).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn the_ip_throttle_runs_before_any_credential_check_and_audits_throttled_calls() {
    let policy = API_KEYS.replace(
        "  audit:",
        "  rateLimit: {perIp: {requests: 2, windowSeconds: 60}}\n  audit:",
    );
    let s = setup("ip-first", &policy).await;
    for _ in 0..2 {
        assert_eq!(s.raw(&[("x-api-key", "wrong")], INIT).await.0, StatusCode::UNAUTHORIZED);
    }
    // Over the limit: 429, even with a bad key, a bad body, or a good key.
    assert_eq!(
        s.raw(&[("x-api-key", "wrong")], INIT).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(s.raw(&[], "{not json").await.0, StatusCode::TOO_MANY_REQUESTS);
    let call = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"get_customer","arguments":{"customerId":"42"}}}"#;
    let (status, _, body) = s.raw(&[("x-api-key", "admin-secret-key-3")], call).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["id"], 5);
    let records = s.audit(1).await;
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(
        (records[0]["decision"].as_str(), records[0]["reason"].as_str()),
        (Some("rate_limited"), Some("ip"))
    );
    assert_eq!(
        records[0].get("arguments"),
        Some(&Value::Null),
        "nothing but the digest before authentication"
    );
    assert!(records[0]["argumentsDigest"].as_str().is_some());
}

#[tokio::test]
async fn per_tool_limits_answer_429_for_that_tool_only() {
    let s = setup(
        "per-tool",
        &format!("{API_KEYS}  rateLimit: {{perTool: {{echo_read: {{requests: 1, windowSeconds: 60}}}}}}\n"),
    )
    .await;
    let admin = s.session("admin-secret-key-3").await;
    assert!(admin.call("echo_read", json!({"id": "1"})).await["result"].is_object());
    let (status, _, body) = admin
        .post(&json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "echo_read", "arguments": {"id": "1"}}}))
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["error"]["data"]["scope"],
        "tool"
    );
    assert!(
        admin.call("get_customer", json!({"customerId": "42"})).await["result"].is_object(),
        "other tools are not limited"
    );
    // A supported protocol version header that differs from the negotiated one is served.
    let (status, _, _) = s
        .raw(
            &[
                ("x-api-key", "admin-secret-key-3"),
                ("mcp-session-id", &admin.id),
                ("mcp-protocol-version", "2025-03-26"),
            ],
            r#"{"jsonrpc":"2.0","id":4,"method":"ping"}"#,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn per_identity_limits_answer_429_with_retry_after() {
    let s = setup(
        "identity",
        &format!("{API_KEYS}  rateLimit: {{perIdentity: {{requests: 2, windowSeconds: 60}}}}\n"),
    )
    .await;
    let admin = s.session("admin-secret-key-3").await;
    for _ in 0..2 {
        assert!(admin.call("get_customer", json!({"customerId": "42"})).await["result"].is_object());
    }
    let (status, headers, body) = admin
        .post(&json!({"jsonrpc": "2.0", "id": 77, "method": "tools/call", "params": {"name": "get_customer", "arguments": {"customerId": "42"}}}))
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.contains_key("retry-after"));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["id"], 77);
    assert_eq!(body["error"]["data"]["scope"], "identity");
    // Another identity has its own budget.
    let reader = s.session("reader-secret-key-1").await;
    assert!(reader.call("get_customer", json!({"customerId": "42"})).await["result"].is_object());
}

#[tokio::test]
async fn every_call_path_leaves_exactly_one_audit_record_without_secrets() {
    let s = setup(
        "audit",
        &format!("{API_KEYS}  rateLimit: {{perIdentity: {{requests: 4, windowSeconds: 60}}}}\n"),
    )
    .await;
    let admin = s.session("admin-secret-key-3").await;
    let reader = s.session("reader-secret-key-1").await;
    let op = s.session("operator-secret-key-2").await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let admin_tp = Session::open_with(
        common::client(),
        s.url.clone(),
        "2025-06-18",
        &[("x-api-key", "admin-secret-key-3"), ("traceparent", tp)],
    )
    .await;

    // allowed + success (with a redacted argument), allowed + upstream failure, invalid
    // arguments, unknown tool, hidden tool, role too low, unauthenticated, rate limited.
    admin_tp
        .call(
            "create_ticket",
            json!({"customerId": "42", "subject": "Router", "cardNumber": "4111111111111111"}),
        )
        .await;
    admin.call("fail_read", json!({})).await;
    admin.call("get_customer", json!({"customerId": 42})).await;
    admin.call("no_such_tool", json!({"x": 1})).await;
    op.call("create_ticket", json!({"customerId": "42"})).await;
    reader.call("create_ticket", json!({"customerId": "42"})).await;
    let (status, _, _) = s
        .raw(&[("mcp-session-id", &admin.id)], r#"{"jsonrpc":"2.0","id":"u1","method":"tools/call","params":{"name":"get_customer","arguments":{"customerId":"42"}}}"#)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    admin.call("get_customer", json!({"customerId": "42"})).await; // 4th of admin's 4
    let (status, _, _) = admin
        .post(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "get_customer", "arguments": {"customerId": "7"}}}))
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // Requests that are not tools/call leave no record.
    admin.request("tools/list", json!({})).await;

    let records = s.audit(9).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let records_after = s.audit(9).await;
    assert_eq!(records.len(), 9, "{records:#?}");
    assert_eq!(records_after.len(), 9, "no extra records");
    let summary: Vec<(String, String, String)> = records
        .iter()
        .map(|r| {
            (
                r["tool"].as_str().unwrap_or("").into(),
                r["decision"].as_str().unwrap().into(),
                r["reason"].as_str().unwrap().into(),
            )
        })
        .collect();
    let expect = [
        ("create_ticket", "allowed", "ok"),
        ("fail_read", "allowed", "upstream_status"),
        ("get_customer", "invalid", "invalid_arguments"),
        ("no_such_tool", "invalid", "unknown_tool"),
        ("create_ticket", "denied", "not_in_allowlist"),
        ("create_ticket", "denied", "role_too_low"),
        ("get_customer", "denied", "missing_credentials"),
        ("get_customer", "allowed", "ok"),
        ("get_customer", "rate_limited", "identity"),
    ];
    for (i, (tool, decision, reason)) in expect.iter().enumerate() {
        assert_eq!(
            summary[i],
            (tool.to_string(), decision.to_string(), reason.to_string()),
            "record {i}: {:#}",
            records[i]
        );
    }
    let first = &records[0];
    assert_eq!(first["subject"], "admin");
    assert_eq!(first["role"], "admin");
    assert_eq!(first["client"]["name"], "harness");
    assert_eq!(first["clientIp"], "127.0.0.1");
    assert_eq!(first["tier"], "write");
    assert_eq!(first["safety"], "mutation");
    assert_eq!(first["status"], "success");
    assert_eq!(first["upstreamStatus"], 201);
    assert_eq!(first["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(first["sessionId"], admin_tp.id.as_str());
    assert_eq!(first["arguments"]["cardNumber"], "[REDACTED]");
    assert_eq!(first["arguments"]["subject"], "Router");
    assert!(first["argumentsDigest"].as_str().unwrap().starts_with("sha256:"));
    assert!(first["requestId"].as_str().is_some_and(|r| !r.is_empty()));
    assert_eq!(records[1]["status"], "failed");
    assert_eq!(records[1]["upstreamStatus"], 500);
    assert_eq!(records[6]["subject"], Value::Null, "unauthenticated: no subject");
    assert_eq!(records[8]["jsonrpcId"], 99);
    let text = std::fs::read_to_string(s.dir.join("audit.jsonl")).unwrap();
    for secret in [
        "admin-secret-key-3",
        "reader-secret-key-1",
        "operator-secret-key-2",
        "4111111111111111",
        "upstream-token-5",
    ] {
        assert!(!text.contains(secret), "{secret} leaked into the audit log");
    }
}

#[tokio::test]
async fn provenance_reaches_the_upstream_and_spoofed_headers_do_not() {
    let s = setup("provenance", API_KEYS).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let spoofed = [
        ("x-api-key", "admin-secret-key-3"),
        ("x-toolgate-subject", "root"),
        ("x-toolgate-agent", "evil-agent"),
        ("x-toolgate-tool", "other"),
        ("traceparent", tp),
    ];
    let admin = Session::open_with(common::client(), s.url.clone(), "2025-06-18", &spoofed).await;
    let (env, _) = admin.envelope("echo_read", json!({"id": "1"})).await;
    let h = &env["data"]["headers"];
    assert_eq!(h["x-toolgate-subject"], "admin");
    assert_eq!(h["x-toolgate-tool"], "echo_read");
    assert_eq!(h["x-toolgate-session"], admin.id.as_str());
    assert!(
        h.get("x-toolgate-agent").is_none(),
        "no agent is known, and the client's claim is not believed: {h}"
    );
    assert!(h["traceparent"]
        .as_str()
        .unwrap()
        .starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
    assert_eq!(
        h["traceparent"], tp,
        "no spans are exported here, so the client's span stays the parent (tests/otel.rs covers the exported case)"
    );
    assert!(
        h.get("x-api-key").is_none(),
        "the client's credential is never forwarded"
    );
    assert_eq!(
        h["authorization"], "Bearer upstream-token-5",
        "the upstream credential comes from its own file"
    );
}

#[tokio::test]
async fn fail_closed_refuses_writes_while_audit_records_cannot_be_written() {
    let policy = API_KEYS.replace(
        "path: '{dir}/audit.jsonl'",
        "path: '{dir}/missing-dir/audit.jsonl', failurePolicy: failClosed",
    );
    let s = setup("failclosed", &policy).await;
    let admin = s.session("admin-secret-key-3").await;
    let (env, is_error) = admin.envelope("get_customer", json!({"customerId": "42"})).await;
    assert!(!is_error, "{env}");
    let readyz = || async {
        let url = format!("http://{}/readyz", s.proxy.admin_addr);
        let (_, _, body) = send(&common::client(), "GET", &url, &[], Bytes::new()).await;
        serde_json::from_slice::<Value>(&body).unwrap()
    };
    let healthy = || async { readyz().await["audit"]["healthy"] == true };
    let deadline = Instant::now() + Duration::from_secs(10);
    while healthy().await {
        assert!(Instant::now() < deadline, "the record never failed to write");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (env, is_error) = admin
        .envelope("create_ticket", json!({"customerId": "42", "subject": "Router"}))
        .await;
    assert!(is_error);
    assert_eq!(env["errors"][0]["code"], "audit_unavailable");
    assert_eq!(env["errors"][0]["retryable"], true);
    let (env, is_error) = admin.envelope("get_customer", json!({"customerId": "42"})).await;
    assert!(!is_error, "reads keep working: {env}");
    let ready = readyz().await;
    assert_eq!(ready["audit"]["healthy"], false);
    assert!(ready["audit"]["writeFailures"].as_u64().unwrap() >= 1);
    // Once the directory exists, records flow again and writes resume.
    std::fs::create_dir_all(s.dir.join("missing-dir")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        admin.envelope("get_customer", json!({"customerId": "42"})).await;
        if healthy().await {
            break;
        }
        assert!(Instant::now() < deadline, "records never flowed again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (env, is_error) = admin
        .envelope("create_ticket", json!({"customerId": "42", "subject": "Router"}))
        .await;
    assert!(!is_error, "{env}");
}

#[tokio::test]
async fn a_changed_credentials_file_is_picked_up_without_a_restart() {
    let s = setup("rotate", API_KEYS).await;
    let (status, _, _) = s.raw(&[("x-api-key", "new-key-6")], INIT).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    std::fs::write(
        s.dir.join("credentials.yaml"),
        format!("{CREDENTIALS}  - {{id: newcomer, key: new-key-6}}\n"),
    )
    .unwrap();
    s.wait_accepted(&[("x-api-key", "new-key-6")]).await;
    // A broken file is refused and the previous credentials keep working.
    std::fs::write(s.dir.join("credentials.yaml"), "credentials: [{id: x}]").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.raw(&[("x-api-key", "new-key-6")], INIT).await.0, StatusCode::OK);
}

#[tokio::test]
async fn an_agent_header_is_believed_only_from_a_trusted_proxy() {
    let base = "  auth: {mode: none}\n  audit: {enabled: false}\n  provenance: {trustedAgentHeader: X-Agent-Id}\n";
    for (trusted, expected) in [(false, None), (true, Some("whaapy-agent-9"))] {
        let policy = if trusted {
            format!("{base}  rateLimit: {{trustedProxies: ['127.0.0.1/32']}}\n")
        } else {
            base.to_string()
        };
        let s = setup(if trusted { "agent-trusted" } else { "agent-untrusted" }, &policy).await;
        let session = Session::open_with(
            common::client(),
            s.url.clone(),
            "2025-06-18",
            &[("x-agent-id", "whaapy-agent-9")],
        )
        .await;
        let (env, _) = session.envelope("echo_read", json!({"id": "1"})).await;
        assert_eq!(
            env["data"]["headers"]["x-toolgate-agent"].as_str(),
            expected,
            "trusted={trusted}"
        );
    }
}

#[tokio::test]
async fn a_call_whose_client_goes_away_still_completes_and_is_audited() {
    let s = setup("gone", API_KEYS).await;
    let admin = s.session("admin-secret-key-3").await;
    // The example service's /slow answers after 600 ms; the client gives up after 150 ms.
    let body =
        json!({"jsonrpc": "2.0", "id": 43, "method": "tools/call", "params": {"name": "slow_read", "arguments": {}}});
    let gave_up = tokio::time::timeout(Duration::from_millis(150), admin.post(&body)).await;
    assert!(gave_up.is_err(), "the client should have given up first");
    let records = s.audit(1).await;
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(records[0]["jsonrpcId"], 43);
    assert_eq!(
        records[0]["decision"], "allowed",
        "the upstream call ran to completion: {:#}",
        records[0]
    );
    assert_eq!(records[0]["status"], "success");
    assert_eq!(records[0]["upstreamStatus"], 200);
}
