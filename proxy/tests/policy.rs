//! Policy layers end to end: the proxy on loopback in front of the real example service, with
//! credentials from a file, OAuth tokens signed in the test, and audit records read back.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{base_headers, send, Session};
use http::StatusCode;
use serde_json::{json, Value};
use toolgate_proxy::policy::jwt::testing::{unsigned, EcKey};
use toolgate_proxy::{start, Running, StartOptions};

const TOOLS: &str = r#"
tools:
  - name: get_customer
    inputSchema: {type: object, additionalProperties: false, required: [customerId], properties: {customerId: {type: string}, note: {type: string}}}
    http: {method: GET, path: "/customers/{customerId}"}
  - name: create_ticket
    requiredRole: operator
    inputSchema: {type: object, properties: {customerId: {type: string}, subject: {type: string}, cardNumber: {type: string}}}
    http: {method: POST, path: /tickets}
  - name: echo_read
    inputSchema: {type: object, required: [id], properties: {id: {type: string}}}
    http: {method: GET, path: "/echo/{id}"}
  - name: fail_read
    inputSchema: {type: object}
    http: {method: GET, path: /status/500}
  - name: slow_read
    inputSchema: {type: object}
    http: {method: GET, path: /slow, query: {ms: "600"}}
"#;

const CREDENTIALS: &str = "credentials:
  - {id: reader, key: reader-secret-key-1, role: viewer}
  - {id: operator-a, key: operator-secret-key-2, role: operator, tools: ['get_*', 'echo_*']}
  - {id: admin, key: admin-secret-key-3, role: admin}
  - {id: retired, key: expired-secret-key-4, role: admin, expiresAt: '2020-01-01T00:00:00Z'}
";

struct Setup {
    proxy: Running,
    dir: PathBuf,
    url: String,
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("toolgate-policy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the proxy with `policy` (YAML lines under `policy:`; `{dir}` is replaced by a temp
/// dir holding `credentials.yaml`) and `mcp_port` (0: any).
async fn setup_on(name: &str, policy: &str, mcp_port: u16) -> Setup {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let dir = temp_dir(name);
    std::fs::write(dir.join("credentials.yaml"), CREDENTIALS).unwrap();
    std::fs::write(dir.join("upstream-token"), "upstream-token-5\n").unwrap();
    let policy = policy.replace("{dir}", dir.to_str().unwrap());
    let text = format!(
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nserver: {{listen: '127.0.0.1:{mcp_port}', adminListen: '127.0.0.1:0'}}\nupstream:\n  baseUrl: http://{upstream}\n  credential: {{header: Authorization, file: '{}/upstream-token', prefix: 'Bearer '}}\npolicy:\n{policy}{TOOLS}",
        dir.to_str().unwrap()
    );
    let path = dir.join("proxy.yaml");
    std::fs::write(&path, &text).unwrap();
    let cfg = toolgate_config::parse_yaml(&text).unwrap_or_else(|e| panic!("{e}"));
    let proxy = start(
        cfg,
        StartOptions {
            config_path: Some(path),
            reload_interval: Duration::from_millis(50),
            ..StartOptions::default()
        },
    )
    .await
    .unwrap();
    let url = format!("http://{}/mcp", proxy.mcp_addr);
    Setup { proxy, dir, url }
}

async fn setup(name: &str, policy: &str) -> Setup {
    setup_on(name, policy, 0).await
}

const API_KEYS: &str = "  readOnly: false\n  auth: {mode: apiKey, credentialsFile: '{dir}/credentials.yaml'}\n  audit: {sink: file, path: '{dir}/audit.jsonl', redactArguments: [/cardNumber]}\n";

impl Setup {
    async fn session(&self, key: &str) -> Session {
        Session::open_with(common::client(), self.url.clone(), "2025-06-18", &[("x-api-key", key)]).await
    }

    async fn raw(&self, headers: &[(&str, &str)], body: &str) -> (StatusCode, http::HeaderMap, Value) {
        let mut hs = base_headers();
        hs.extend_from_slice(headers);
        let (status, h, b) = send(&common::client(), "POST", &self.url, &hs, Bytes::from(body.to_string())).await;
        (status, h, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// Waits until `headers` authenticate (a changed credentials file was reloaded). Polls
    /// slowly enough to stay under the per-IP limit.
    async fn wait_accepted(&self, headers: &[(&str, &str)]) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.raw(headers, INIT).await.0 != StatusCode::OK {
            assert!(Instant::now() < deadline, "{headers:?} were never accepted");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The audit records written so far, once there are at least `n`.
    async fn audit(&self, n: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = std::fs::read_to_string(self.dir.join("audit.jsonl")).unwrap_or_default();
            let records: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
            if records.len() >= n || Instant::now() > deadline {
                return records;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

fn names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

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
        records[0]["arguments"],
        Value::Null,
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
    tokio::time::sleep(Duration::from_millis(200)).await; // the record fails to write
    let (env, is_error) = admin
        .envelope("create_ticket", json!({"customerId": "42", "subject": "Router"}))
        .await;
    assert!(is_error);
    assert_eq!(env["errors"][0]["code"], "audit_unavailable");
    assert_eq!(env["errors"][0]["retryable"], true);
    let (env, is_error) = admin.envelope("get_customer", json!({"customerId": "42"})).await;
    assert!(!is_error, "reads keep working: {env}");
    let (_, _, body) = send(
        &common::client(),
        "GET",
        &format!("http://{}/readyz", s.proxy.admin_addr),
        &[],
        Bytes::new(),
    )
    .await;
    let ready: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(ready["audit"]["healthy"], false);
    assert!(ready["audit"]["writeFailures"].as_u64().unwrap() >= 1);
    // Once the directory exists, records flow again and writes resume.
    std::fs::create_dir_all(s.dir.join("missing-dir")).unwrap();
    admin.envelope("get_customer", json!({"customerId": "42"})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
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

fn claims(resource: &str) -> Value {
    let now = toolgate_proxy::policy::time::now_unix();
    json!({"iss": "https://issuer.test", "aud": resource, "sub": "user-1", "exp": now + 300, "iat": now,
           "scope": "mcp:write", "azp": "whaapy-agent"})
}

fn oauth_policy(jwks: &str) -> String {
    format!(
        "  readOnly: false\n  audit: {{enabled: false}}\n  auth:\n    mode: oauth\n    oauth:\n      issuer: https://issuer.test\n      resource: RESOURCE\n      {jwks}\n      algorithms: [ES256]\n      jwksRefreshSeconds: 1\n      scopeRoles: {{'mcp:read': viewer, 'mcp:write': operator}}\n"
    )
}

#[tokio::test]
async fn oauth_tokens_are_verified_and_refusals_point_to_the_resource_metadata() {
    let key = EcKey::generate("k1");
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let dir = temp_dir("oauth-keys");
    std::fs::write(dir.join("jwks.json"), json!({"keys": [key.jwk()]}).to_string()).unwrap();
    let policy =
        oauth_policy(&format!("jwksFile: '{}/jwks.json'", dir.to_str().unwrap())).replace("RESOURCE", &resource);
    let s = setup_on("oauth", &policy, port).await;
    let metadata_url = format!("http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp");

    let (status, headers, _) = s.raw(&[], INIT).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        headers["www-authenticate"],
        format!("Bearer resource_metadata=\"{metadata_url}\"").as_str()
    );
    let (status, _, body) = send(&common::client(), "GET", &metadata_url, &[], Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    let meta: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(meta["resource"], resource.as_str());
    assert_eq!(meta["authorization_servers"], json!(["https://issuer.test"]));

    let good = key.sign(&claims(&resource));
    let bearer = format!("Bearer {good}");
    let session = Session::open_with(
        common::client(),
        s.url.clone(),
        "2025-06-18",
        &[("authorization", &bearer)],
    )
    .await;
    let (env, is_error) = session.envelope("echo_read", json!({"id": "1"})).await;
    assert!(!is_error, "{env}");
    assert_eq!(env["data"]["headers"]["x-toolgate-subject"], "user-1");
    assert_eq!(env["data"]["headers"]["x-toolgate-agent"], "whaapy-agent");
    assert!(env["data"]["headers"]
        .get("authorization")
        .is_none_or(|a| !a.as_str().unwrap().contains(&good)));

    let mut bad: Vec<(&str, String)> = Vec::new();
    let mut c = claims(&resource);
    c["exp"] = json!(toolgate_proxy::policy::time::now_unix() - 3600);
    bad.push(("expired_token", key.sign(&c)));
    let mut c = claims(&resource);
    c["aud"] = json!("http://127.0.0.1:1/other");
    bad.push(("wrong_audience", key.sign(&c)));
    let mut c = claims(&resource);
    c["iss"] = json!("https://evil.test");
    bad.push(("wrong_issuer", key.sign(&c)));
    bad.push(("bad_algorithm", unsigned(&claims(&resource))));
    let (h, rest) = good.split_once('.').unwrap();
    let (_, sig) = rest.split_once('.').unwrap();
    let mut c = claims(&resource);
    c["scope"] = json!("mcp:write mcp:admin");
    c["sub"] = json!("admin");
    use base64::Engine;
    bad.push((
        "bad_signature",
        format!(
            "{h}.{}.{sig}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(c.to_string())
        ),
    ));
    bad.push(("bad_signature", EcKey::generate("k1").sign(&claims(&resource))));
    for (reason, token) in bad {
        let auth = format!("Bearer {token}");
        let (status, headers, body) = s.raw(&[("authorization", &auth)], INIT).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{reason}");
        assert_eq!(body["error"]["data"]["reason"], reason);
        let challenge = headers["www-authenticate"].to_str().unwrap();
        assert!(
            challenge.contains(&format!("resource_metadata=\"{metadata_url}\"")) && challenge.contains("invalid_token"),
            "{challenge}"
        );
    }
    let mut c = claims(&resource);
    c["scope"] = json!("profile");
    let auth = format!("Bearer {}", key.sign(&c));
    let (status, headers, _) = s.raw(&[("authorization", &auth)], INIT).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(headers["www-authenticate"]
        .to_str()
        .unwrap()
        .contains("insufficient_scope"));
}

/// A JWKS endpoint on loopback whose document can be swapped.
async fn jwks_server(doc: Arc<Mutex<String>>) -> SocketAddr {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let doc = doc.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    let body = doc.lock().unwrap().clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(http_body_util::Full::new(Bytes::from(
                            body,
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn keys_from_a_jwks_url_are_fetched_and_rotated() {
    let (k1, k2) = (EcKey::generate("k1"), EcKey::generate("k2"));
    let doc = Arc::new(Mutex::new(json!({"keys": [k1.jwk()]}).to_string()));
    let jwks = jwks_server(doc.clone()).await;
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let policy = oauth_policy(&format!("jwksUrl: 'http://{jwks}/jwks.json'")).replace("RESOURCE", &resource);
    let s = setup_on("jwks-url", &policy, port).await;
    let with = |t: String| format!("Bearer {t}");
    assert_eq!(
        s.raw(&[("authorization", &with(k1.sign(&claims(&resource))))], INIT)
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        s.raw(&[("authorization", &with(k2.sign(&claims(&resource))))], INIT)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    *doc.lock().unwrap() = json!({"keys": [k1.jwk(), k2.jwk()]}).to_string();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        s.raw(&[("authorization", &with(k2.sign(&claims(&resource))))], INIT)
            .await
            .0,
        StatusCode::OK,
        "rotated key"
    );
}

#[tokio::test]
async fn a_reload_keeps_the_fetched_keys_while_the_issuer_is_down() {
    let key = EcKey::generate("k1");
    let doc = Arc::new(Mutex::new(json!({"keys": [key.jwk()]}).to_string()));
    let jwks = jwks_server(doc.clone()).await;
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    // A refresh interval far longer than the test: only a reload could make the proxy refetch.
    let policy = oauth_policy(&format!("jwksUrl: 'http://{jwks}/jwks.json'"))
        .replace("RESOURCE", &resource)
        .replace("jwksRefreshSeconds: 1", "jwksRefreshSeconds: 3600");
    let s = setup_on("jwks-reload", &policy, port).await;
    let bearer = format!("Bearer {}", key.sign(&claims(&resource)));
    assert_eq!(s.raw(&[("authorization", &bearer)], INIT).await.0, StatusCode::OK);
    // The issuer now serves garbage, and a tool edit reloads the config.
    *doc.lock().unwrap() = "not a JWKS".into();
    let path = s.dir.join("proxy.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("ms: \"600\"", "ms: \"601\"")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.proxy.shared.runtime.load().generation < 2 {
        assert!(Instant::now() < deadline, "the edit was never applied");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        s.raw(&[("authorization", &bearer)], INIT).await.0,
        StatusCode::OK,
        "the keys fetched before the reload still verify tokens"
    );
}

/// A JWKS endpoint on loopback speaking HTTP/1.1 by hand. It serves `doc` until `stall` is
/// set; then it answers with headers promising a body far longer than what it sends and goes
/// silent, keeping the connection open. It counts the requests it receives.
struct JwksStub {
    addr: SocketAddr,
    doc: Arc<Mutex<String>>,
    stall: Arc<AtomicBool>,
    requests: Arc<AtomicUsize>,
    stalled: Arc<AtomicUsize>,
}

impl JwksStub {
    async fn start(doc: String) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stub = Self {
            addr: listener.local_addr().unwrap(),
            doc: Arc::new(Mutex::new(doc)),
            stall: Arc::new(AtomicBool::new(false)),
            requests: Arc::new(AtomicUsize::new(0)),
            stalled: Arc::new(AtomicUsize::new(0)),
        };
        let (doc, stall, requests, stalled) = (
            stub.doc.clone(),
            stub.stall.clone(),
            stub.requests.clone(),
            stub.stalled.clone(),
        );
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (doc, stall, requests, stalled) = (doc.clone(), stall.clone(), requests.clone(), stalled.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    requests.fetch_add(1, Ordering::SeqCst);
                    if stall.load(Ordering::SeqCst) {
                        stalled.fetch_add(1, Ordering::SeqCst);
                        let _ = stream
                            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{\"keys\": [")
                            .await;
                        let _ = stream.flush().await;
                        tokio::time::sleep(Duration::from_secs(120)).await;
                        drop(stream);
                    } else {
                        let body = doc.lock().unwrap().clone();
                        let reply = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = stream.write_all(reply.as_bytes()).await;
                    }
                });
            }
        });
        stub
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn jwks_status(s: &Setup) -> toolgate_proxy::policy::jwks::JwksStatus {
    s.proxy
        .shared
        .runtime
        .load()
        .auth
        .jwks_status()
        .expect("keys come from a URL")
}

#[tokio::test]
async fn a_stalled_jwks_response_holds_up_no_token_whose_key_is_cached() {
    let k1 = EcKey::generate("k1");
    let jwks = JwksStub::start(json!({"keys": [k1.jwk()]}).to_string()).await;
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    // jwksRefreshSeconds: 1, so the cached keys are soon due for a (background) refresh.
    let policy = oauth_policy(&format!("jwksUrl: 'http://{}/jwks.json'", jwks.addr)).replace("RESOURCE", &resource);
    let s = setup_on("jwks-stall", &policy, port).await;
    let good = format!("Bearer {}", k1.sign(&claims(&resource)));
    assert_eq!(s.raw(&[("authorization", &good)], INIT).await.0, StatusCode::OK);
    assert_eq!(jwks.requests(), 1);
    let status = jwks_status(&s);
    assert_eq!((status.keys, status.last_error, status.refreshing), (1, None, false));
    assert!(status.last_success_unix.is_some());
    assert!(toolgate_proxy::metrics::METRICS.jwks_last_success.get() > 0);

    // From now on the JWKS server sends headers, then nothing.
    jwks.stall.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // (a) The refresh these requests start stalls; each is answered from the cached keys,
    // without waiting for it (the fetch deadline is 5 s; each request gets 3 s).
    for i in 0..5 {
        let (status, _, body) = tokio::time::timeout(Duration::from_secs(3), s.raw(&[("authorization", &good)], INIT))
            .await
            .unwrap_or_else(|_| panic!("request {i} with a cached kid waited for the stalled JWKS fetch"));
        assert_eq!(status, StatusCode::OK, "request {i}: {body}");
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while jwks.stalled.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "no refresh was attempted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(jwks.requests(), 2, "one refresh at a time");
    assert!(jwks_status(&s).refreshing);

    // (b) A token naming a kid the cache lacks waits for the one fetch in flight, bounded by
    // its deadline, and is refused clearly.
    let k9 = EcKey::generate("k9");
    let unknown = format!("Bearer {}", k9.sign(&claims(&resource)));
    let bound = toolgate_proxy::policy::jwks::JWKS_FETCH_DEADLINE + Duration::from_secs(2);
    let (status, headers, body) = tokio::time::timeout(bound, s.raw(&[("authorization", &unknown)], INIT))
        .await
        .expect("an unknown kid waited beyond the JWKS fetch deadline");
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["data"]["reason"], "invalid_token");
    let challenge = headers["www-authenticate"].to_str().unwrap();
    assert!(
        challenge.contains("error=\"invalid_token\"") && challenge.contains("no key of the issuer matches"),
        "{challenge}"
    );
    assert_eq!(jwks.requests(), 2, "the unknown kid joined the fetch in flight");
    let status = jwks_status(&s);
    assert_eq!(
        (
            status.keys,
            status.last_error,
            status.consecutive_failures,
            status.refreshing
        ),
        (1, Some("timeout"), 1, false)
    );
    assert!(
        toolgate_proxy::metrics::METRICS
            .jwks_fetch_failures
            .with_label_values(&["timeout"])
            .get()
            >= 1
    );
    // After the failure: the cached key still works at once, and the unknown kid is refused at
    // once (backoff) instead of starting another fetch.
    for auth in [&good, &unknown] {
        let (status, _, _) = tokio::time::timeout(Duration::from_secs(2), s.raw(&[("authorization", auth)], INIT))
            .await
            .expect("answered without waiting");
        let want = if auth == &good {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        };
        assert_eq!(status, want);
    }
    assert_eq!(jwks.requests(), 2);
}

#[tokio::test]
async fn unknown_kids_cause_at_most_one_jwks_fetch_per_interval() {
    let k1 = EcKey::generate("k1");
    let jwks = JwksStub::start(json!({"keys": [k1.jwk()]}).to_string()).await;
    let port = free_port();
    let resource = format!("http://127.0.0.1:{port}/mcp");
    let policy = oauth_policy(&format!("jwksUrl: 'http://{}/jwks.json'", jwks.addr))
        .replace("RESOURCE", &resource)
        .replace("jwksRefreshSeconds: 1", "jwksRefreshSeconds: 60");
    let s = setup_on("jwks-kids", &policy, port).await;
    let good = format!("Bearer {}", k1.sign(&claims(&resource)));
    assert_eq!(s.raw(&[("authorization", &good)], INIT).await.0, StatusCode::OK);
    assert_eq!(jwks.requests(), 1);

    let k9 = EcKey::generate("k9");
    let unknown = format!("Bearer {}", k9.sign(&claims(&resource)));
    // Ten at once: the first starts a refetch, the others join it.
    let burst: Vec<_> = (0..10)
        .map(|_| {
            let (url, auth) = (s.url.clone(), unknown.clone());
            tokio::spawn(async move {
                let mut hs = base_headers();
                hs.push(("authorization", &auth));
                send(&common::client(), "POST", &url, &hs, Bytes::from(INIT)).await.0
            })
        })
        .collect();
    for r in burst {
        assert_eq!(r.await.unwrap(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(jwks.requests(), 2, "one refetch for the burst");
    // The same kid again, and other unknown kids: nothing more within the interval.
    for i in 0..10 {
        assert_eq!(
            s.raw(&[("authorization", &unknown)], INIT).await.0,
            StatusCode::UNAUTHORIZED
        );
        let other = format!(
            "Bearer {}",
            EcKey::generate(&format!("other-{i}")).sign(&claims(&resource))
        );
        assert_eq!(
            s.raw(&[("authorization", &other)], INIT).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(jwks.requests(), 2, "unknown kids refetch at most once per interval");
    assert_eq!(s.raw(&[("authorization", &good)], INIT).await.0, StatusCode::OK);
    assert_eq!(jwks.requests(), 2);
}

#[tokio::test]
async fn access_tokens_must_have_an_accepted_typ_and_no_crit() {
    let key = EcKey::generate("k1");
    let dir = temp_dir("oauth-typ");
    std::fs::write(dir.join("jwks.json"), json!({"keys": [key.jwk()]}).to_string()).unwrap();
    let jwks = format!("jwksFile: '{}/jwks.json'", dir.to_str().unwrap());
    let cases = [
        (
            "",
            [
                (Some("at+jwt"), true),
                (Some("application/AT+JWT"), true),
                (Some("JWT"), false),
                (None, false),
            ],
        ),
        (
            "      tokenTypes: [at+jwt, JWT]\n",
            [
                (Some("at+jwt"), true),
                (Some("application/AT+JWT"), true),
                (Some("JWT"), true),
                (None, false),
            ],
        ),
        (
            "      tokenTypes: [JWT, '']\n",
            [
                (Some("at+jwt"), false),
                (Some("jwt"), true),
                (Some("JWT"), true),
                (None, true),
            ],
        ),
    ];
    for (i, (extra, expect)) in cases.into_iter().enumerate() {
        let port = free_port();
        let resource = format!("http://127.0.0.1:{port}/mcp");
        let bearer = |header: Value| format!("Bearer {}", key.sign_with_header(&header, &claims(&resource)));
        let policy = format!("{}{extra}", oauth_policy(&jwks).replace("RESOURCE", &resource));
        let s = setup_on(&format!("oauth-typ-{i}"), &policy, port).await;
        for (typ, ok) in expect {
            let mut h = json!({"alg": "ES256", "kid": "k1"});
            if let Some(t) = typ {
                h["typ"] = json!(t);
            }
            let (status, headers, body) = s.raw(&[("authorization", &bearer(h))], INIT).await;
            if ok {
                assert_eq!(status, StatusCode::OK, "tokenTypes {extra:?}, typ {typ:?}: {body}");
            } else {
                assert_eq!(
                    status,
                    StatusCode::UNAUTHORIZED,
                    "tokenTypes {extra:?}, typ {typ:?}: {body}"
                );
                let challenge = headers["www-authenticate"].to_str().unwrap();
                assert!(
                    challenge.contains("typ is not an accepted access token type"),
                    "{challenge}"
                );
            }
        }
        let crit = bearer(json!({"alg": "ES256", "kid": "k1", "typ": "JWT", "crit": ["exp"]}));
        let (status, headers, _) = s.raw(&[("authorization", &crit)], INIT).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let challenge = headers["www-authenticate"].to_str().unwrap();
        assert!(challenge.contains("critical header parameters"), "{challenge}");
        s.proxy.shutdown().await;
    }
}

#[test]
fn a_jwks_url_over_plain_http_to_another_host_is_refused_when_the_config_loads() {
    let policy =
        oauth_policy("jwksUrl: 'http://issuer.example.com/jwks.json'").replace("RESOURCE", "http://127.0.0.1:1/mcp");
    let text = format!(
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nserver: {{listen: '127.0.0.1:0', adminListen: '127.0.0.1:0'}}\nupstream:\n  baseUrl: http://127.0.0.1:1\npolicy:\n{policy}{TOOLS}"
    );
    // Refused by validation, so `toolgate-proxy check`, a reload and the start all agree.
    let err = toolgate_config::parse_yaml(&text).unwrap_err().to_string();
    assert!(
        err.contains("policy.auth.oauth.jwksUrl") && err.contains("https://"),
        "{err}"
    );
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
