//! Rendering servers and tools into a ProxyConfig, and the conditions it sets.

use super::*;
use crate::crd::{McpServer, McpTool};
use serde_json::json;
use toolgate_config::Method;

fn rejected(r: &Rendered, object: &str) -> (&'static str, String) {
    match &r.verdicts[object] {
        Verdict::Rejected { reason, message, .. } => (reason, message.clone()),
        v => panic!("{object} should be rejected, got {v:?}"),
    }
}

fn shop() -> McpServer {
    McpServer::test("shop").writable().with(json!({
        "auth": {"mode": "apiKey", "credentialsSecretRef": {"name": "shop-keys", "key": "credentials.yaml"}},
        "upstream": {"timeoutMs": 5000, "credential": {"header": "Authorization", "prefix": "Bearer ", "secretRef": {"name": "shop-upstream", "key": "token"}}},
        "rateLimit": {"perIdentity": {"requests": 30, "windowSeconds": 60}, "trustedProxies": ["10.0.0.0/8"],
                      "store": {"redis": {"url": "rediss://redis.shop.svc:6380/2", "passwordSecretRef": {"name": "shop-redis", "key": "password"}, "failurePolicy": "failClosed"}}},
        "sessions": {"ttlSeconds": 7200},
        "audit": {"failurePolicy": "failClosed", "redactArguments": ["/card"]}
    }))
}

fn create_ticket() -> McpTool {
    McpTool::test("create_ticket").method(Method::Post).with(json!({
        "http": {"path": "/tickets"},
        "inputSchema": {"type": "object", "properties": {"subject": {"type": "string"}}, "required": ["subject"]}
    }))
}

#[test]
fn rendered_config_matches_the_snapshot_and_loads_in_the_proxy() {
    let r = render(&shop(), &[create_ticket(), McpTool::test("get_customer")]);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/snapshots/shop.proxy.json");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(path, &r.text).unwrap();
    }
    let want = std::fs::read_to_string(path).expect("snapshot (UPDATE_SNAPSHOTS=1 writes it)");
    assert_eq!(r.text, want, "rendered config changed; review, then UPDATE_SNAPSHOTS=1");
    let loaded = toolgate_config::parse_text(&r.text).expect("the proxy loads it");
    loaded.validate().expect("and it validates");
    assert_eq!(loaded, r.config);
    let names: Vec<_> = loaded.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["create_ticket", "get_customer"]);
}

#[test]
fn the_config_text_is_json_with_one_line_per_tool_and_loads_with_no_tools_too() {
    for tools in [vec![], vec![create_ticket(), McpTool::test("get_customer")]] {
        let r = render(&shop(), &tools);
        let v: Value = serde_json::from_str(&r.text).expect("JSON");
        assert_eq!(v["tools"].as_array().map(Vec::len), Some(tools.len()));
        let lines = r.text.lines().filter(|l| l.starts_with("    {\"name\":")).count();
        assert_eq!(lines, tools.len(), "{}", r.text);
        assert_eq!(toolgate_config::parse_text(&r.text).expect("loads"), r.config);
    }
}

#[test]
fn secrets_are_mounted_by_reference_never_copied() {
    let r = render(&shop(), &[]);
    assert_eq!(
        r.mounts
            .iter()
            .map(|m| (m.volume, m.secret.as_str(), m.file()))
            .collect::<Vec<_>>(),
        [
            (
                "auth-credentials",
                "shop-keys",
                "/etc/toolgate/secrets/auth-credentials/credentials.yaml".to_string()
            ),
            (
                "session-keys",
                "shop-session-keys",
                "/etc/toolgate/secrets/session-keys/keys".to_string()
            ),
            (
                "store-password",
                "shop-redis",
                "/etc/toolgate/secrets/store-password/password".to_string()
            ),
            (
                "upstream-credential",
                "shop-upstream",
                "/etc/toolgate/secrets/upstream-credential/token".to_string()
            ),
        ]
    );
    assert_eq!(
        r.config.policy.auth.credentials_file.as_deref(),
        Some("/etc/toolgate/secrets/auth-credentials/credentials.yaml")
    );
    assert!(
        !r.text.contains("shop-keys") && !r.text.contains("shop-upstream"),
        "{}",
        r.text
    );
}

#[test]
fn a_config_past_the_configmap_limit_is_said_to_be_too_large() {
    let tools = |n: usize| -> Vec<McpTool> {
        (0..n)
            .map(|i| McpTool::test(&format!("tool-{i}")).with(json!({"description": "x".repeat(4096)})))
            .collect()
    };
    let small = render(&McpServer::test("shop"), &tools(10));
    assert!(small.problems.is_empty(), "{:?}", small.problems);
    assert_eq!(small.too_large(), None);
    let big = render(&McpServer::test("shop"), &tools(300));
    assert_eq!(big.config.tools.len(), 300);
    assert!(big.text.len() > MAX_CONFIGMAP_DATA);
    let message = big.too_large().expect("too large");
    assert!(
        message.contains("300 tools") && message.contains("1048576"),
        "{message}"
    );
}

#[test]
fn one_bad_tool_is_rejected_and_the_others_are_served() {
    let bad = McpTool::test("broken").with_schema(json!({"type": "object", "properties": {"id": {"type": "strnig"}}}));
    let r = render(&McpServer::test("shop"), &[bad, McpTool::test("get_customer")]);
    let (reason, message) = rejected(&r, "broken");
    assert_eq!(reason, reason::INVALID_SCHEMA);
    assert!(message.starts_with("spec.inputSchema"), "{message}");
    assert_eq!(r.verdicts["get-customer"], Verdict::Accepted { tier: Tier::Read });
    assert_eq!(r.config.tools.len(), 1);
}

#[test]
fn a_read_over_post_is_served_read_only_only_when_the_server_allows_it() {
    let search = McpTool::test("search").method(Method::Post).with(json!({
        "http": {"path": "/search"}, "tier": "read", "safety": "read_only"}));
    let r = render(&McpServer::test("shop"), std::slice::from_ref(&search));
    assert_eq!(rejected(&r, "search").0, reason::READ_ONLY_SERVER);
    let allowing = McpServer::test("shop").with(json!({"allowReadOverPost": true}));
    let r = render(&allowing, &[search]);
    assert_eq!(r.verdicts["search"], Verdict::Accepted { tier: Tier::Read });
    assert!(r.config.policy.allow_read_over_post);
}

#[test]
fn serving_without_authentication_must_be_said() {
    let mut s = McpServer::test("shop");
    s.spec.auth = None;
    let r = render(&s, &[]);
    assert!(
        r.problems.iter().any(|p| p.starts_with("spec.auth: required")),
        "{:?}",
        r.problems
    );
    assert!(
        render(&McpServer::test("shop"), &[]).problems.is_empty(),
        "mode: none is said"
    );
}

#[test]
fn a_gateway_upstream_is_a_service_of_its_namespace_whatever_the_name_says() {
    let gw = |name: &str| {
        McpServer::test("shop").with(json!({"mode": "Gateway", "workloadRef": null,
            "upstream": {"port": null, "service": {"name": name, "port": 80}}}))
    };
    let r = render(&gw("api"), &[]);
    assert!(r.problems.is_empty(), "{:?}", r.problems);
    assert_eq!(r.config.upstream.base_url, "http://api.demo.svc:80");
    for hostile in [
        "127.0.0.1:38080/",
        "169.254.169.254:80/x",
        "vault.prod.svc.cluster.local:8200/",
        "a@b",
        "api.other",
    ] {
        let r = render(&gw(hostile), &[]);
        assert!(
            r.problems.iter().any(|p| p.starts_with("spec.upstream.service.name")),
            "{hostile}: {:?}",
            r.problems
        );
    }
}

#[test]
fn a_server_can_serve_only_the_tools_its_owner_lists() {
    let s = McpServer::test("shop").with(json!({"allowedTools": ["get-customer"]}));
    let r = render(&s, &[McpTool::test("get_customer"), McpTool::test("drop_tables")]);
    assert_eq!(r.verdicts["get-customer"], Verdict::Accepted { tier: Tier::Read });
    let (reason, message) = rejected(&r, "drop-tables");
    assert_eq!(reason, reason::NOT_ALLOWED);
    assert!(message.contains("spec.allowedTools"), "{message}");
    assert_eq!(r.config.tools.len(), 1);
}

#[test]
fn a_pattern_that_would_backtrack_is_an_invalid_schema() {
    let redos = McpTool::test("redos").with_schema(json!({"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "string", "pattern": "^(a*)*\\1b"}}}}));
    let r = render(&McpServer::test("shop"), &[redos]);
    let (reason, message) = rejected(&r, "redos");
    assert_eq!(reason, reason::INVALID_SCHEMA);
    assert!(message.contains("needs a backtracking regex engine"), "{message}");
    assert!(r.config.tools.is_empty());
}

#[test]
fn a_placeholder_missing_from_the_schema_is_an_invalid_mapping() {
    let t = McpTool::test("get_order").with(json!({"http": {"path": "/orders/{orderId}"}}));
    let (reason, message) = rejected(&render(&McpServer::test("shop"), &[t]), "get-order");
    assert_eq!(reason, reason::INVALID_MAPPING);
    assert!(
        message.contains("spec.http.path") && message.contains("orderId"),
        "{message}"
    );
}

#[test]
fn the_oldest_tool_keeps_a_contested_name() {
    let older = McpTool::test("lookup").object("lookup-b").created(100);
    let newer = McpTool::test("lookup").object("lookup-a").created(200);
    let r = render(&McpServer::test("shop"), &[newer, older]);
    assert_eq!(r.verdicts["lookup-b"], Verdict::Accepted { tier: Tier::Read });
    let (reason, message) = rejected(&r, "lookup-a");
    assert_eq!(reason, reason::NAME_CONFLICT);
    assert!(message.contains("lookup-b"), "{message}");
}

#[test]
fn write_tools_are_not_served_by_a_read_only_server() {
    let r = render(&McpServer::test("shop"), &[create_ticket()]);
    let (reason, message) = rejected(&r, "create-ticket");
    assert_eq!(reason, reason::READ_ONLY_SERVER);
    assert!(message.contains("readOnly: false"), "{message}");
    assert!(r.config.tools.is_empty());
}

#[test]
fn an_unknown_required_role_is_reported() {
    let t = McpTool::test("get_customer").with(json!({"requiredRole": "root"}));
    let (reason, message) = rejected(&render(&McpServer::test("shop"), &[t]), "get-customer");
    assert_eq!(reason, reason::UNKNOWN_ROLE);
    assert!(message.contains("spec.requiredRole"), "{message}");
}

#[test]
fn gateway_mode_calls_the_service_by_its_cluster_name() {
    let s = McpServer::test("shop").with(json!({"mode": "Gateway", "workloadRef": null, "upstream": {"port": null, "service": {"name": "shop-api", "port": 80}}}));
    let r = render(&s, &[]);
    assert_eq!(r.config.upstream.base_url, "http://shop-api.demo.svc:80");
    assert_eq!(endpoint(&s), "http://shop-mcp.demo.svc:8931/mcp");
}

#[test]
fn a_gateway_keeps_serving_while_its_pod_leaves_the_service_and_a_sidecar_does_not_wait() {
    let gateway = McpServer::test("shop").with(json!({"mode": "Gateway", "workloadRef": null, "upstream": {"port": null, "service": {"name": "shop-api", "port": 80}}}));
    let r = render(&gateway, &[]);
    assert_eq!(r.config.server.shutdown_delay_seconds, 5);
    // The whole shutdown fits in the pod's termination grace: the delay, one grace for
    // connections and calls in flight, the audit flush (5 s) and the span export (2 s).
    let deployment = crate::objects::gateway(&gateway, &r, &crate::inject::ProxyDefaults::default());
    let termination = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    let server = &r.config.server;
    assert!(server.shutdown_delay_seconds + server.shutdown_grace_seconds + 5 + 2 < termination);
    assert_eq!(termination, 40);
    let sidecar = render(&McpServer::test("shop"), &[]);
    assert_eq!(sidecar.config.server.shutdown_delay_seconds, 0);
}

#[test]
fn bad_server_settings_are_problems_not_a_config() {
    let s = McpServer::test("shop").with(json!({"rateLimit": {"trustedProxies": ["not-a-cidr"]}}));
    let r = render(&s, &[]);
    assert!(
        r.problems
            .iter()
            .any(|p| p.starts_with("spec.rateLimit.trustedProxies")),
        "{:?}",
        r.problems
    );
}

#[test]
fn the_hash_follows_the_content() {
    let a = render(&McpServer::test("shop"), &[McpTool::test("get_customer")]);
    let b = render(&McpServer::test("shop"), &[McpTool::test("get_customer")]);
    let c = render(
        &McpServer::test("shop"),
        &[McpTool::test("get_customer").with(json!({"description": "changed"}))],
    );
    assert_eq!(a.hash, b.hash);
    assert_ne!(a.hash, c.hash);
    assert_eq!(a.hash.len(), 64);
}
