//! A server's config must not be a way around RBAC: a read-only server serves safe methods only
//! (reads over POST only when the server opts in), and without authentication callers get the
//! lowest role. Observed over HTTP, with the real example service as the upstream, counting what
//! reaches it.

mod common;

use common::{Harness, Session};
use serde_json::{json, Value};
use toolgate_proxy::{start, StartOptions};

const TOOLS: &str = r#"
tools:
  - name: get_account
    inputSchema: {type: object, required: [id], properties: {id: {type: string}}}
    http: {method: GET, path: "/echo/accounts/{id}"}
  - name: search_accounts
    tier: read
    safety: read_only
    inputSchema: {type: object, properties: {query: {type: string}}}
    http: {method: POST, path: /echo/accounts/search}
  - name: close_account
    inputSchema: {type: object, required: [id], properties: {id: {type: string}}}
    http: {method: POST, path: "/echo/accounts/{id}/close"}
  - name: export_accounts
    tier: write
    inputSchema: {type: object}
    http: {method: GET, path: /echo/accounts/export}
  - name: reopen_account
    requiredRole: operator
    inputSchema: {type: object, required: [id], properties: {id: {type: string}}}
    http: {method: GET, path: "/echo/accounts/{id}/reopen"}
"#;

/// The proxy in front of a fresh example service, with `policy` (YAML lines under `policy:`).
async fn harness(policy: &str) -> Harness {
    let upstream = toolgate_example_service::spawn().await.unwrap();
    let text = format!(
        "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nserver: {{listen: '127.0.0.1:0', adminListen: '127.0.0.1:0', shutdownGraceSeconds: 5}}\nupstream: {{baseUrl: 'http://{upstream}', timeoutMs: 5000}}\npolicy:\n  auth: {{mode: none}}\n  audit: {{enabled: false}}\n  rateLimit: {{perIp: {{requests: 1000000}}, perIdentity: {{requests: 1000000}}}}\n{policy}{TOOLS}"
    );
    let cfg = toolgate_config::parse_yaml(&text).unwrap_or_else(|e| panic!("{e}"));
    let proxy = start(cfg, StartOptions::default()).await.unwrap();
    Harness {
        proxy,
        upstream,
        http: common::client(),
    }
}

async fn listed(s: &Session) -> Vec<String> {
    let v = s.request("tools/list", json!({})).await;
    v["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

/// Calls `tool` and checks that it is answered exactly like a tool that does not exist, and
/// that nothing reached the upstream.
async fn assert_hidden(h: &Harness, s: &Session, tool: &str, args: Value) {
    let before = h.upstream_requests().await;
    let hidden = s.call(tool, args).await;
    let unknown = s.call("no_such_tool", json!({})).await;
    assert_eq!(hidden["error"]["code"], -32602, "{tool}: {hidden}");
    assert_eq!(
        hidden["error"]["message"],
        format!("Unknown tool: `{tool}`"),
        "{tool}: answered like an unknown tool"
    );
    assert_eq!(hidden["error"]["data"], json!({"tool": tool}), "{tool}: {hidden}");
    assert_eq!(unknown["error"]["code"], hidden["error"]["code"]);
    assert_eq!(
        h.upstream_requests().await,
        before + 1,
        "{tool}: only the stats request itself reached the upstream"
    );
}

/// Calls `tool`, which must reach the upstream with `method` and succeed.
async fn assert_served(h: &Harness, s: &Session, tool: &str, args: Value, method: &str) {
    let before = h.upstream_requests().await;
    let (env, is_error) = s.envelope(tool, args).await;
    assert!(!is_error, "{tool}: {env}");
    assert_eq!(env["status"], "success", "{tool}: {env}");
    assert_eq!(env["data"]["method"], method, "{tool}: {env}");
    assert_eq!(
        h.upstream_requests().await,
        before + 2,
        "{tool}: the call and the stats request"
    );
}

#[tokio::test]
async fn a_read_only_server_neither_lists_nor_calls_a_read_over_post_by_default() {
    let h = harness("").await;
    let s = h.session("2025-06-18").await;
    assert_eq!(listed(&s).await, ["get_account"]);
    assert_hidden(&h, &s, "search_accounts", json!({"query": "ana"})).await;
    assert_hidden(&h, &s, "close_account", json!({"id": "42"})).await;
    assert_hidden(&h, &s, "export_accounts", json!({})).await;
    assert_served(&h, &s, "get_account", json!({"id": "42"}), "GET").await;
}

#[tokio::test]
async fn allow_read_over_post_serves_read_tier_posts_and_nothing_else() {
    let h = harness("  allowReadOverPost: true\n").await;
    let s = h.session("2025-06-18").await;
    assert_eq!(listed(&s).await, ["get_account", "search_accounts"]);
    assert_served(&h, &s, "search_accounts", json!({"query": "ana"}), "POST").await;
    assert_hidden(&h, &s, "close_account", json!({"id": "42"})).await;
    assert_hidden(&h, &s, "export_accounts", json!({})).await;
}

#[tokio::test]
async fn a_state_changing_method_cannot_be_declared_a_read() {
    for method in ["PUT", "PATCH", "DELETE"] {
        let text = format!(
            "apiVersion: toolgate.dev/v1alpha1\nkind: ProxyConfig\nupstream: {{baseUrl: 'http://127.0.0.1:9'}}\ntools:\n  - {{name: close, tier: read, safety: read_only, inputSchema: {{type: object}}, http: {{method: {method}, path: /accounts/42/close}}}}\n"
        );
        let e = toolgate_config::parse_yaml(&text).unwrap_err();
        assert!(
            e.errors
                .iter()
                .any(|e| e.path == "tools[0] (close).tier" && e.message.contains("can never be a read-tier tool")),
            "{method}: {e}"
        );
    }
}

#[tokio::test]
async fn without_authentication_role_gated_and_write_tools_are_hidden() {
    let h = harness("  readOnly: false\n").await;
    let s = h.session("2025-06-18").await;
    let names = listed(&s).await;
    assert!(!names.iter().any(|n| n == "reopen_account"), "{names:?}");
    // A write tool without requiredRole needs `operator`: the anonymous caller (the lowest
    // role) does not even see it, although the server is not read-only.
    assert!(!names.iter().any(|n| n == "close_account"), "{names:?}");
    assert_hidden(&h, &s, "reopen_account", json!({"id": "42"})).await;
    assert_hidden(&h, &s, "close_account", json!({"id": "42"})).await;
    // A session that never listed tools gets the same answer.
    let fresh = h.session("2025-06-18").await;
    assert_hidden(&h, &fresh, "reopen_account", json!({"id": "42"})).await;
    assert_hidden(&h, &fresh, "close_account", json!({"id": "42"})).await;
    assert_served(&h, &s, "get_account", json!({"id": "42"}), "GET").await;
    assert_served(&h, &s, "search_accounts", json!({"query": "ana"}), "POST").await;
}
