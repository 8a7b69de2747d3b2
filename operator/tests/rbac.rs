//! An McpServer or McpTool is not a way around RBAC: a user who may create McpServers and
//! McpTools, but may not edit Deployments or read Secrets, gets nothing from the operator that
//! the owner of the target did not agree to. Against a real kube-apiserver, the user
//! impersonated with only the rights of the `mcp-author` Role.

mod common;

use common::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};
use toolgate_operator::crd::{McpServer, McpTool};

/// Creates the Role a namespace admin would give an MCP author (McpServers and McpTools, and
/// nothing else) and binds it to `user`.
async fn grant_mcp_author(admin: &Client, ns: &str, user: &str) {
    let role: Role = serde_json::from_value(json!({"metadata": {"name": "mcp-author"}, "rules": [
        {"apiGroups": ["toolgate.dev"], "resources": ["mcpservers", "mcptools"], "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
        {"apiGroups": ["toolgate.dev"], "resources": ["mcpservers/status", "mcptools/status"], "verbs": ["get"]}
    ]}))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "mcp-author"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mcp-author"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

async fn pod_spec(c: &Client, ns: &str, name: &str) -> Value {
    template(c, ns, name).await["spec"].clone()
}

async fn service_exists(c: &Client, ns: &str, name: &str) -> bool {
    Api::<Service>::namespaced(c.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .is_some()
}

#[tokio::test]
async fn an_mcp_author_gets_no_sidecar_image_secret_or_upstream_the_owners_did_not_agree_to() {
    let admin = client().await;
    let ns = namespace(&admin, "rbac").await;
    grant_mcp_author(&admin, &ns, "alice").await;
    let alice = client_as("alice").await;

    // The targets, as their owners have them.
    let _: Deployment = apply(&admin, &ns, plain_deployment("payments")).await;
    let _: Deployment = apply(&admin, &ns, deployment("shop")).await;
    let _: Deployment = apply(&admin, &ns, deployment("img")).await;
    let _: Deployment = apply(&admin, &ns, deployment("sec")).await;
    let token: Secret = serde_json::from_value(json!({"metadata": {"name": "payments-token"},
        "stringData": {"token": "payments-upstream-token-not-for-alice"}}))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &token)
        .await
        .unwrap();
    let payments_before = pod_spec(&admin, &ns, "payments").await;

    // Alice's own rights: she can neither edit a Deployment nor read a Secret.
    let patch = json!({"spec": {"replicas": 3}});
    let e = Api::<Deployment>::namespaced(alice.clone(), &ns)
        .patch("payments", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 403);
    let e = Api::<Secret>::namespaced(alice.clone(), &ns)
        .get("payments-token")
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 403);

    let op = Operator::start(&ns, "toolgate", &[]);

    // A Deployment that has not opted in gets no sidecar and no Service.
    let _: McpServer = apply(
        &alice,
        &ns,
        server(
            "payments",
            json!({"workloadRef": {"name": "payments"}, "upstream": {"port": 8080}}),
        ),
    )
    .await;
    let m = wait_condition(
        &alice,
        &ns,
        "McpServer",
        "payments",
        "SidecarInjected",
        "False",
        "WorkloadNotOptedIn",
    )
    .await;
    assert!(m.contains("toolgate.dev/allow-mcp-server: payments"), "{m}");
    // Serving without authentication was said, and the status warns about it.
    let s = get_server(&alice, &ns, "payments").await;
    assert_eq!(
        condition(&s, "Unauthenticated"),
        Some((
            "True".into(),
            "AuthModeNone".into(),
            condition(&s, "Unauthenticated").unwrap().2
        ))
    );

    // An image outside the allowlist is not run.
    let _: McpServer = apply(
        &alice,
        &ns,
        server(
            "img",
            json!({"workloadRef": {"name": "img"}, "upstream": {"port": 8080}, "image": "busybox:1.36"}),
        ),
    )
    .await;
    let m = wait_condition(
        &alice,
        &ns,
        "McpServer",
        "img",
        "SidecarInjected",
        "False",
        "ImageNotAllowed",
    )
    .await;
    assert!(m.contains("busybox:1.36"), "{m}");

    // A Secret that has not opted in is not mounted, even into an opted-in workload.
    let _: McpServer = apply(
        &alice,
        &ns,
        server(
            "sec",
            json!({"workloadRef": {"name": "sec"}, "upstream": {"port": 8080, "credential":
                {"header": "Authorization", "prefix": "Bearer ", "secretRef": {"name": "payments-token", "key": "token"}}}}),
        ),
    )
    .await;
    let m = wait_condition(
        &alice,
        &ns,
        "McpServer",
        "sec",
        "SidecarInjected",
        "False",
        "SecretNotAllowed",
    )
    .await;
    assert!(m.contains("payments-token"), "{m}");

    // A gateway cannot be pointed anywhere but a Service of its namespace: refused at apply.
    for hostile in [
        "127.0.0.1:38080/",
        "169.254.169.254:80/latest",
        "vault.prod.svc.cluster.local:8200/",
        "api.other-team",
        "API",
    ] {
        let doc = server(
            "gw",
            json!({"mode": "Gateway", "upstream": {"service": {"name": hostile, "port": 80}}}),
        );
        let e = Api::<McpServer>::namespaced(alice.clone(), &ns)
            .patch("gw", &PatchParams::apply("alice").force(), &Patch::Apply(&doc))
            .await
            .unwrap_err();
        let (code, message) = api_error(e);
        assert_eq!(code, 422, "{hostile}: {message}");
        assert!(message.contains("DNS-1035"), "{hostile}: {message}");
    }
    // A gateway in front of a Service that has not opted in creates no Deployment.
    let _: Service = apply(&admin, &ns, upstream_service("payments-api", None)).await;
    let _: McpServer = apply(
        &alice,
        &ns,
        server(
            "gw-payments",
            json!({"mode": "Gateway", "upstream": {"service": {"name": "payments-api", "port": 80}}}),
        ),
    )
    .await;
    let m = wait_condition(
        &alice,
        &ns,
        "McpServer",
        "gw-payments",
        "GatewayAvailable",
        "False",
        "UpstreamNotOptedIn",
    )
    .await;
    assert!(m.contains("toolgate.dev/allow-mcp-server: gw-payments"), "{m}");
    // A gateway with an image outside the allowlist creates no Deployment, even in front of a
    // Service that agreed.
    let _: Service = apply(&admin, &ns, upstream_service("api", Some("gw"))).await;
    let _: McpServer = apply(
        &alice,
        &ns,
        server(
            "gw",
            json!({"mode": "Gateway", "upstream": {"service": {"name": "api", "port": 80}}, "image": "evil.example/proxy:1"}),
        ),
    )
    .await;
    wait_condition(
        &alice,
        &ns,
        "McpServer",
        "gw",
        "GatewayAvailable",
        "False",
        "ImageNotAllowed",
    )
    .await;

    // A PUT tool declared `tier: read` is not a read tool.
    let _: McpTool = apply(
        &alice,
        &ns,
        json!({"apiVersion": "toolgate.dev/v1alpha1", "kind": "McpTool", "metadata": {"name": "close-account"},
            "spec": {"serverRef": {"name": "shop"}, "name": "close_account", "description": "Closes an account",
                     "tier": "read", "safety": "read_only",
                     "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
                     "http": {"method": "PUT", "path": "/accounts/{id}/close"}}}),
    )
    .await;

    // With the opt-in in place, the same user gets a working sidecar and its Service.
    let _: McpServer = apply(
        &alice,
        &ns,
        server(
            "shop",
            json!({"workloadRef": {"name": "shop"}, "upstream": {"port": 8080}}),
        ),
    )
    .await;
    wait_condition(&alice, &ns, "McpServer", "shop", "Ready", "True", "Ready").await;
    let m = wait_condition(
        &alice,
        &ns,
        "McpTool",
        "close-account",
        "Accepted",
        "False",
        "InvalidMapping",
    )
    .await;
    assert!(m.contains("spec.tier"), "{m}");
    assert!(pod_spec(&admin, &ns, "shop").await["initContainers"][0]["name"] == "toolgate-proxy");
    assert!(service_exists(&admin, &ns, "shop-mcp").await);
    let svc = Api::<Service>::namespaced(admin.clone(), &ns)
        .get("shop-mcp")
        .await
        .unwrap();
    assert_eq!(
        serde_json::to_value(&svc.spec.unwrap().ports.unwrap()[0].target_port).unwrap(),
        json!("toolgate-mcp"),
        "the Service targets the proxy's named port, never an application port"
    );

    // Nothing of the refused servers reached their targets.
    assert_eq!(pod_spec(&admin, &ns, "payments").await, payments_before);
    for d in ["img", "sec"] {
        assert!(pod_spec(&admin, &ns, d).await.get("initContainers").is_none(), "{d}");
    }
    for svc in ["payments-mcp", "img-mcp", "sec-mcp", "gw-mcp", "gw-payments-mcp"] {
        assert!(
            !service_exists(&admin, &ns, svc).await,
            "{svc} exists without a proxy behind it"
        );
    }
    for gw in ["gw-gateway", "gw-payments-gateway"] {
        assert!(Api::<Deployment>::namespaced(admin.clone(), &ns)
            .get_opt(gw)
            .await
            .unwrap()
            .is_none());
    }

    // The owner withdraws the opt-in: the sidecar and the Service go.
    Api::<Deployment>::namespaced(admin.clone(), &ns)
        .patch(
            "shop",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"toolgate.dev/allow-mcp-server": null}}})),
        )
        .await
        .unwrap();
    wait_condition(
        &alice,
        &ns,
        "McpServer",
        "shop",
        "SidecarInjected",
        "False",
        "WorkloadNotOptedIn",
    )
    .await;
    eventually("the sidecar and the Service removed", WAIT, || async {
        let gone = pod_spec(&admin, &ns, "shop").await.get("initContainers").is_none()
            && !service_exists(&admin, &ns, "shop-mcp").await;
        gone.then_some(())
    })
    .await;
    drop(op);
}

#[tokio::test]
async fn the_operators_own_namespace_is_never_a_target() {
    let admin = client().await;
    let ns = namespace(&admin, "operator-home").await;
    let _: Deployment = apply(&admin, &ns, deployment("toolgate-operator")).await;
    let _: McpServer = apply(
        &admin,
        &ns,
        server(
            "toolgate-operator",
            json!({"workloadRef": {"name": "toolgate-operator"}, "upstream": {"port": 8080}}),
        ),
    )
    .await;
    let _op = Operator::start(&ns, "toolgate", &["--protected-namespace", &ns]);
    let m = wait_condition(
        &admin,
        &ns,
        "McpServer",
        "toolgate-operator",
        "SidecarInjected",
        "False",
        "ProtectedNamespace",
    )
    .await;
    assert!(m.contains("the operator's own"), "{m}");
    assert!(pod_spec(&admin, &ns, "toolgate-operator")
        .await
        .get("initContainers")
        .is_none());
}
