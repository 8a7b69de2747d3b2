//! example/k8s/ (Deployment, McpServer, McpTools) renders the same tools and policy as the
//! hand-written example/proxy.yaml, so the two quickstarts describe one service.

use serde_json::Value;
use toolgate_operator::crd::{McpServer, McpTool};
use toolgate_operator::render::render;

fn docs(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

#[test]
fn example_manifests_render_the_tools_of_example_proxy_yaml() {
    let mut server = None;
    let mut tools = Vec::new();
    for d in docs("example/k8s/shop.yaml")
        .into_iter()
        .chain(docs("example/k8s/tools.yaml"))
    {
        match d["kind"].as_str() {
            Some("McpServer") => server = Some(serde_json::from_value::<McpServer>(d).expect("McpServer")),
            Some("McpTool") => tools.push(serde_json::from_value::<McpTool>(d).expect("McpTool")),
            _ => {}
        }
    }
    let server = server.expect("an McpServer in example/k8s/shop.yaml");
    let rendered = render(&server, &tools);
    assert!(rendered.problems.is_empty(), "{:?}", rendered.problems);
    assert!(
        rendered
            .verdicts
            .values()
            .all(|v| matches!(v, toolgate_operator::render::Verdict::Accepted { .. })),
        "{:?}",
        rendered.verdicts
    );

    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../example/proxy.yaml"))
        .unwrap();
    let mut by_hand = toolgate_config::parse_yaml(&text).unwrap();
    by_hand.tools.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(rendered.config.tools, by_hand.tools);
    assert_eq!(rendered.config.policy.read_only, by_hand.policy.read_only);
    assert_eq!(rendered.config.policy.rate_limit, by_hand.policy.rate_limit);
    assert_eq!(rendered.config.upstream.timeout_ms, by_hand.upstream.timeout_ms);
}
